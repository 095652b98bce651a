//! stdout carries protocol only, one whole line per message, from any thread.

use std::io::Write;

use super::diag;

/// Exit status when stdout is gone: the agent can no longer hear us.
pub const EXIT_STDOUT_GONE: i32 = 1;

/// Write `line` and a newline under the stdout lock, so lines never interleave.
pub fn write(line: &[u8]) {
    let mut out = std::io::stdout().lock();
    let written = out
        .write_all(line)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    if let Err(e) = written {
        diag::warn(format_args!("writing stdout: {e}; exiting"));
        std::process::exit(EXIT_STDOUT_GONE);
    }
}
