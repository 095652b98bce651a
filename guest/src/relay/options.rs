//! The relay's command line, parsed by hand: the guest binary stays small and its flags few.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::Duration;

/// Where the gateway listens when `--connect` is not given: the host (CID 2), port 5002.
pub const DEFAULT_TARGET: Target = Target::Vsock { cid: 2, port: 5002 };
/// How long stdin EOF waits for pending replies (`--drain-timeout SECS`).
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest `--drain-timeout`: a day, so a deadline never overflows.
pub const MAX_DRAIN_TIMEOUT_SECS: u64 = 24 * 60 * 60;
/// Requests in flight before the relay stops reading stdin (`--max-pending N`).
pub const DEFAULT_MAX_PENDING: usize = 256;
/// Largest `--max-pending`.
pub const MAX_MAX_PENDING: usize = 65_536;

pub const USAGE: &str = "\
Usage: toolwall-relay [OPTIONS]

Relays MCP JSON-RPC lines between stdin/stdout and one framed toolwall connection.

Options:
  --connect TARGET       vsock:CID:PORT or unix:PATH (default vsock:2:5002)
  --name NAME            process name sent to the gateway (default: the parent's)
  --drain-timeout SECS   on stdin EOF, wait this long for pending replies (default 30)
  --max-pending N        requests in flight before stdin is paused (default 256)
  -h, --help             print this help
  -V, --version          print the version
";

/// The gateway's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Vsock { cid: u32, port: u32 },
    Unix(PathBuf),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Vsock { cid, port } => write!(f, "vsock:{cid}:{port}"),
            Target::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// Settings of one relay run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub target: Target,
    /// `--name` as given, not yet sanitised.
    pub name: Option<String>,
    pub drain_timeout: Duration,
    pub max_pending: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            target: DEFAULT_TARGET,
            name: None,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            max_pending: DEFAULT_MAX_PENDING,
        }
    }
}

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    Run(Options),
    Help,
    Version,
}

/// A command-line mistake; the message names the bad input.
#[derive(Debug, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Parse the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Command, UsageError> {
    let mut options = Options::default();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let bytes = arg.as_bytes();
        // `--flag=value` and `--flag value` are both accepted.
        let (flag, inline) = match bytes.iter().position(|&b| b == b'=') {
            Some(eq) if bytes.starts_with(b"--") => (
                &bytes[..eq],
                Some(OsStr::from_bytes(&bytes[eq + 1..]).to_os_string()),
            ),
            _ => (bytes, None),
        };
        let mut value = |flag: &[u8]| -> Result<OsString, UsageError> {
            inline.clone().or_else(|| args.next()).ok_or_else(|| {
                UsageError(format!("{} needs a value", String::from_utf8_lossy(flag)))
            })
        };
        match flag {
            b"-h" | b"--help" => return Ok(Command::Help),
            b"-V" | b"--version" => return Ok(Command::Version),
            b"--connect" => options.target = parse_target(&value(flag)?)?,
            b"--name" => {
                let name = value(flag)?;
                let name = name.to_str().ok_or_else(|| {
                    UsageError(format!("--name {:?}: not UTF-8", name.to_string_lossy()))
                })?;
                options.name = Some(name.to_owned());
            }
            b"--drain-timeout" => {
                let secs = parse_number("--drain-timeout", &value(flag)?, MAX_DRAIN_TIMEOUT_SECS)?;
                options.drain_timeout = Duration::from_secs(secs);
            }
            b"--max-pending" => {
                let n = parse_number("--max-pending", &value(flag)?, MAX_MAX_PENDING as u64)?;
                if n == 0 {
                    return Err(UsageError("--max-pending 0: must be at least 1".into()));
                }
                options.max_pending = n as usize;
            }
            _ => {
                return Err(UsageError(format!(
                    "unknown argument {:?} (see --help)",
                    arg.to_string_lossy()
                )));
            }
        }
    }
    Ok(Command::Run(options))
}

fn parse_number(flag: &str, value: &OsStr, max: u64) -> Result<u64, UsageError> {
    let text = value.to_string_lossy();
    match text.parse::<u64>() {
        Ok(n) if n <= max => Ok(n),
        Ok(_) => Err(UsageError(format!("{flag} {text}: at most {max}"))),
        Err(_) => Err(UsageError(format!("{flag} {text:?}: not a whole number"))),
    }
}

/// `vsock:CID:PORT` or `unix:PATH`.
pub fn parse_target(value: &OsStr) -> Result<Target, UsageError> {
    let bytes = value.as_bytes();
    let bad = |why: &str| UsageError(format!("--connect {:?}: {why}", value.to_string_lossy()));
    if let Some(path) = bytes.strip_prefix(b"unix:") {
        if path.is_empty() {
            return Err(bad("empty socket path"));
        }
        return Ok(Target::Unix(PathBuf::from(OsStr::from_bytes(path))));
    }
    if let Some(rest) = bytes.strip_prefix(b"vsock:") {
        let rest = std::str::from_utf8(rest).map_err(|_| bad("expected vsock:CID:PORT"))?;
        let (cid, port) = rest
            .split_once(':')
            .ok_or_else(|| bad("expected vsock:CID:PORT"))?;
        let cid = cid
            .parse::<u32>()
            .map_err(|_| bad("CID is not a number from 0 to 4294967295"))?;
        let port = port
            .parse::<u32>()
            .map_err(|_| bad("PORT is not a number from 0 to 4294967295"))?;
        return Ok(Target::Vsock { cid, port });
    }
    Err(bad("expected vsock:CID:PORT or unix:PATH"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Command, UsageError> {
        parse(args.iter().map(OsString::from))
    }

    #[test]
    fn defaults() {
        assert_eq!(run(&[]), Ok(Command::Run(Options::default())));
        assert_eq!(DEFAULT_TARGET.to_string(), "vsock:2:5002");
    }

    #[test]
    fn all_flags_both_spellings() {
        let expected = Options {
            target: Target::Unix("/run/tw.sock".into()),
            name: Some("a b".into()),
            drain_timeout: Duration::from_secs(5),
            max_pending: 9,
        };
        let spaced = [
            "--connect",
            "unix:/run/tw.sock",
            "--name",
            "a b",
            "--drain-timeout",
            "5",
            "--max-pending",
            "9",
        ];
        assert_eq!(run(&spaced), Ok(Command::Run(expected.clone())));
        let joined = [
            "--connect=unix:/run/tw.sock",
            "--name=a b",
            "--drain-timeout=5",
            "--max-pending=9",
        ];
        assert_eq!(run(&joined), Ok(Command::Run(expected)));
    }

    #[test]
    fn vsock_target() {
        assert_eq!(
            parse_target(OsStr::new("vsock:3:1234")),
            Ok(Target::Vsock { cid: 3, port: 1234 })
        );
    }

    #[test]
    fn errors_name_the_input() {
        for (args, needle) in [
            (&["--connect", "tcp:1:2"][..], "tcp:1:2"),
            (&["--connect", "vsock:x:2"], "vsock:x:2"),
            (&["--connect", "vsock:2"], "vsock:2"),
            (&["--connect", "unix:"], "unix:"),
            (&["--drain-timeout", "soon"], "soon"),
            (&["--drain-timeout", "999999999"], "999999999"),
            (&["--max-pending", "0"], "0"),
            (&["--bogus"], "--bogus"),
            (&["--name"], "--name"),
        ] {
            let err = run(args).unwrap_err();
            assert!(err.0.contains(needle), "{args:?}: {err}");
        }
    }

    #[test]
    fn help_and_version() {
        assert_eq!(run(&["--help"]), Ok(Command::Help));
        assert_eq!(run(&["-V"]), Ok(Command::Version));
    }
}
