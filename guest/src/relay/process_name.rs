//! The name the relay reports for its client: the parent process, which is the agent.

use std::fs::File;
use std::io::Read;

use toolwall_relay::frame::MAX_NAME;

/// Bytes of `/proc/PID/cmdline` read to find the program name.
const MAX_CMDLINE_READ: u64 = 4096;
/// Reported when the parent cannot be read.
const UNKNOWN: &str = "unknown";

/// Control characters and whitespace become `_` (the name travels in a line and in logs);
/// the result is cut to [`MAX_NAME`] bytes on a character boundary.
pub fn sanitise(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len().min(MAX_NAME));
    for c in raw.chars() {
        let c = if c.is_control() || c.is_whitespace() {
            '_'
        } else {
            c
        };
        if out.len() + c.len_utf8() > MAX_NAME {
            break;
        }
        out.push(c);
    }
    out
}

/// The parent's `comm`, else the base name of its command line, sanitised.
pub fn parent_name() -> String {
    let ppid = std::os::unix::process::parent_id();
    let raw = comm(ppid).or_else(|| cmdline_base_name(ppid));
    sanitise(raw.as_deref().unwrap_or(UNKNOWN))
}

fn read_bounded(path: &str) -> Option<Vec<u8>> {
    let mut bytes = Vec::new();
    File::open(path)
        .ok()?
        .take(MAX_CMDLINE_READ)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(bytes)
}

fn comm(pid: u32) -> Option<String> {
    let bytes = read_bounded(&format!("/proc/{pid}/comm"))?;
    let bytes = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
    (!bytes.is_empty()).then(|| String::from_utf8_lossy(bytes).into_owned())
}

fn cmdline_base_name(pid: u32) -> Option<String> {
    let bytes = read_bounded(&format!("/proc/{pid}/cmdline"))?;
    let program = bytes.split(|&b| b == 0).next()?;
    let base = program.rsplit(|&b| b == b'/').next()?;
    (!base.is_empty()).then(|| String::from_utf8_lossy(base).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_spaces_become_underscores() {
        assert_eq!(
            sanitise("claude code\t\n\u{7f}x\u{a0}y"),
            "claude_code___x_y"
        );
    }

    #[test]
    fn cut_on_char_boundary() {
        let name = sanitise(&"é".repeat(100));
        assert_eq!(name.len(), MAX_NAME);
        let odd = sanitise(&format!("a{}", "é".repeat(100)));
        assert_eq!(odd.len(), MAX_NAME - 1);
        assert!(odd.ends_with('é'));
    }

    #[test]
    fn own_process_names_resolve() {
        let me = std::process::id();
        assert!(comm(me).is_some_and(|c| !c.is_empty() && !c.contains('\n')));
        assert!(cmdline_base_name(me).is_some_and(|c| !c.contains('/')));
        assert!(!parent_name().is_empty());
    }
}
