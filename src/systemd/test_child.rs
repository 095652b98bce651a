//! Test support: run one test of this test binary as a child process, the way systemd starts
//! a service (variables naming the child's own pid, sockets at fd 3..), and collect what it
//! reports on stdout.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

/// Set in a child's environment: the child test runs its body only when it is set.
pub const CHILD_FLAG: &str = "TOOLWALL_TEST_SYSTEMD_CHILD";

/// Prefix of the lines a child reports.
pub const REPORT: &str = "REPORT ";

/// Whether this test runs as a child started by [`run`].
pub fn is_child() -> bool {
    std::env::var_os(CHILD_FLAG).is_some()
}

/// How [`run`] starts the child.
pub struct ChildSpec<'a> {
    /// The full path of the child test (`systemd::...::tests::name`).
    pub test: &'a str,
    pub env: Vec<(&'a str, String)>,
    /// Variables set to the child's own pid (systemd sets them after fork).
    pub pid_vars: &'a [&'a str],
    /// Placed at fd 3, 4, ... without close-on-exec.
    pub fds: &'a [&'a dyn AsFd],
}

/// The command line that runs `test` alone in this test binary.
pub fn command_for(test: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_FLAG, "1");
    cmd
}

/// Runs the child and returns its report lines (without the prefix).
pub fn run(spec: ChildSpec<'_>) -> Vec<String> {
    // Move the sources out of the way first, so placing them at 3.. cannot overwrite one
    // that sits there already. F_DUPFD_CLOEXEC: these copies vanish at exec.
    let high: Vec<OwnedFd> = spec
        .fds
        .iter()
        .map(|s| {
            // SAFETY: duplicating an open fd; the result is a new fd nobody else owns.
            let fd = unsafe { libc::fcntl(s.as_fd().as_raw_fd(), libc::F_DUPFD_CLOEXEC, 100) };
            assert!(fd >= 100, "{}", io::Error::last_os_error());
            // SAFETY: fd is a fresh duplicate owned by nobody else.
            unsafe { OwnedFd::from_raw_fd(fd) }
        })
        .collect();
    let raw: Vec<RawFd> = high.iter().map(|f| f.as_raw_fd()).collect();
    let inner = command_for(spec.test);
    // A shell sets the pid variables to its own pid and execs the test binary in place.
    let mut script = String::new();
    for var in spec.pid_vars {
        script.push_str(&format!("{var}=$$; export {var}; "));
    }
    script.push_str("exec \"$0\" \"$@\"");
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(script)
        .arg(inner.get_program())
        .args(inner.get_args())
        .env(CHILD_FLAG, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for var in [
        "LISTEN_PID",
        "LISTEN_FDS",
        "LISTEN_FDNAMES",
        "NOTIFY_SOCKET",
        "WATCHDOG_USEC",
        "WATCHDOG_PID",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in &spec.env {
        cmd.env(k, v);
    }
    // SAFETY: the closure only calls dup2, which is async-signal-safe; dup2 clears
    // close-on-exec on the target, as systemd leaves passed fds.
    unsafe {
        cmd.pre_exec(move || {
            for (i, fd) in raw.iter().enumerate() {
                if libc::dup2(*fd, 3 + i as RawFd) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    drop(high);
    assert!(out.status.success(), "child {} failed", spec.test);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(report_line)
        .collect()
}

/// The report in a line of libtest output, which may start with the test's name
/// (`test NAME ... REPORT ...`).
pub fn report_line(line: &str) -> Option<String> {
    line.find(REPORT)
        .map(|at| line[at + REPORT.len()..].trim_end().to_string())
}

/// Prints one report line (in the child).
pub fn report(line: impl std::fmt::Display) {
    println!("{REPORT}{line}");
}
