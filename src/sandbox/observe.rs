//! The gateway's outside view of a worker, from /proc: what the kernel says, not what the
//! worker claims.

use serde::Serialize;
use std::io;
use std::path::PathBuf;

/// Largest /proc file read here; status and environ of a worker are far smaller.
const MAX_PROC_FILE_BYTES: u64 = 64 * 1024;

#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct ObservedProcess {
    /// `Seccomp:` of /proc/PID/status: 0 none, 1 strict, 2 filter.
    pub seccomp_mode: Option<u8>,
    /// `NoNewPrivs:` of /proc/PID/status.
    pub no_new_privs: Option<bool>,
    /// Open fd numbers, ascending.
    pub open_fds: Vec<i32>,
    /// Names (not values) of the environment variables the process started with.
    pub environment_names: Vec<String>,
}

/// Reads the confinement facts of a process the caller may inspect (its own child).
pub fn observe_process(pid: u32) -> io::Result<ObservedProcess> {
    let dir = PathBuf::from(format!("/proc/{pid}"));
    let status = read_capped(&dir.join("status"))?;
    let status = String::from_utf8_lossy(&status);
    let field = |key: &str| {
        status.lines().find_map(|line| {
            line.strip_prefix(key)
                .and_then(|rest| rest.strip_prefix(':'))
                .map(|v| v.trim().to_string())
        })
    };
    let seccomp_mode = field("Seccomp").and_then(|v| v.parse().ok());
    let no_new_privs = field("NoNewPrivs").and_then(|v| match v.as_str() {
        "0" => Some(false),
        "1" => Some(true),
        _ => None,
    });

    let mut open_fds = Vec::new();
    for entry in std::fs::read_dir(dir.join("fd"))? {
        if let Some(fd) = entry?.file_name().to_str().and_then(|s| s.parse().ok()) {
            open_fds.push(fd);
        }
    }
    open_fds.sort_unstable();

    let environ = read_capped(&dir.join("environ"))?;
    let environment_names = environ
        .split(|b| *b == 0)
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
            let name = entry.split(|b| *b == b'=').next().unwrap_or_default();
            String::from_utf8_lossy(name).into_owned()
        })
        .collect();

    Ok(ObservedProcess {
        seccomp_mode,
        no_new_privs,
        open_fds,
        environment_names,
    })
}

fn read_capped(path: &std::path::Path) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut buf = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_PROC_FILE_BYTES)
        .read_to_end(&mut buf)?;
    Ok(buf)
}
