//! `sd_notify` without libsystemd: one datagram per notification to the socket systemd names
//! in `NOTIFY_SOCKET` (a path, or `@name` for the abstract namespace).

use std::ffi::OsStr;
use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

use super::env::unset_if_single_threaded;
use super::status::sanitize_status;

/// Largest notification sent. systemd reads one datagram into a buffer of this size and
/// drops anything longer whole.
pub const MAX_NOTIFY_BYTES: usize = 4096;

const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// A handle on the service manager's notification socket.
#[derive(Debug)]
pub struct Notifier {
    socket: UnixDatagram,
    target: SocketAddr,
    address: String,
}

impl Notifier {
    /// The notifier `NOTIFY_SOCKET` names, or `None` when it is unset or empty (not started
    /// by systemd with `Type=notify`). The variable is removed from the environment when the
    /// process has one thread (call this before starting any). A variable that is set but
    /// unusable is an error naming it.
    pub fn from_env() -> io::Result<Option<Notifier>> {
        let value = match std::env::var_os(NOTIFY_SOCKET) {
            Some(v) if !v.is_empty() => v,
            _ => return Ok(None),
        };
        unset_if_single_threaded(&[NOTIFY_SOCKET]);
        Notifier::new(&value)
            .map(Some)
            .map_err(|e| io::Error::new(e.kind(), format!("{NOTIFY_SOCKET}: {e}")))
    }

    /// A notifier sending to `address`: an absolute path, or `@name` for an abstract socket.
    pub fn new(address: &OsStr) -> io::Result<Notifier> {
        let bytes = address.as_bytes();
        let shown = String::from_utf8_lossy(bytes).into_owned();
        let target = match bytes.first() {
            Some(b'@') => SocketAddr::from_abstract_name(&bytes[1..])?,
            Some(b'/') => SocketAddr::from_pathname(address)?,
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{shown:?} is neither an absolute path nor an @abstract name"),
                ));
            }
        };
        // std creates it close-on-exec, so no child inherits it.
        let socket = UnixDatagram::unbound()?;
        socket.set_nonblocking(true)?;
        Ok(Notifier {
            socket,
            target,
            address: shown,
        })
    }

    /// Where notifications go, for log lines.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Sends `state` (newline-separated `KEY=VALUE` assignments) as one datagram. Never
    /// blocks: a full socket queue is `WouldBlock`.
    pub fn notify(&self, state: &str) -> io::Result<()> {
        if state.is_empty() || state.len() > MAX_NOTIFY_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "notification of {} bytes (must be 1 to {MAX_NOTIFY_BYTES})",
                    state.len()
                ),
            ));
        }
        let sent = self.socket.send_to_addr(state.as_bytes(), &self.target)?;
        if sent != state.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("notification cut to {sent} of {} bytes", state.len()),
            ));
        }
        Ok(())
    }

    /// `READY=1`: startup finished, or a reload finished.
    pub fn ready(&self) -> io::Result<()> {
        self.notify("READY=1")
    }

    /// `READY=1` and a status line in one datagram.
    pub fn ready_with_status(&self, line: &str) -> io::Result<()> {
        self.notify(&format!("READY=1\nSTATUS={}", sanitize_status(line)))
    }

    /// `RELOADING=1` with the `MONOTONIC_USEC=` stamp newer systemd versions require.
    /// Follow it with [`Notifier::ready`] when the reload is done, whatever its outcome.
    pub fn reloading(&self) -> io::Result<()> {
        self.notify(&format!("RELOADING=1\nMONOTONIC_USEC={}", monotonic_usec()))
    }

    /// `STOPPING=1`: shutdown began.
    pub fn stopping(&self) -> io::Result<()> {
        self.notify("STOPPING=1")
    }

    /// `STATUS=line`: one line for `systemctl status`. Control characters become spaces
    /// (a newline would start another assignment) and the line is cut to
    /// [`super::MAX_STATUS_BYTES`].
    pub fn status(&self, line: &str) -> io::Result<()> {
        self.notify(&format!("STATUS={}", sanitize_status(line)))
    }

    /// `WATCHDOG=1`: the loop is alive.
    pub fn watchdog(&self) -> io::Result<()> {
        self.notify("WATCHDOG=1")
    }

    /// `EXTEND_TIMEOUT_USEC=`: asks for `by` more time from now for the start, reload or stop
    /// in progress (e.g. a drain longer than `TimeoutStopSec=`).
    pub fn extend_timeout(&self, by: Duration) -> io::Result<()> {
        let usec = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        self.notify(&format!("EXTEND_TIMEOUT_USEC={usec}"))
    }
}

/// CLOCK_MONOTONIC in microseconds, the clock systemd compares `MONOTONIC_USEC` with.
pub fn monotonic_usec() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer; CLOCK_MONOTONIC
    // always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    let secs = u64::try_from(now.tv_sec).unwrap_or(0);
    let micros = u64::try_from(now.tv_nsec).unwrap_or(0) / 1000;
    secs.saturating_mul(1_000_000).saturating_add(micros)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::systemd::test_child::{self, ChildSpec};
    use std::os::unix::ffi::OsStrExt;

    fn receiver() -> (tempfile::TempDir, std::path::PathBuf, UnixDatagram) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let socket = UnixDatagram::bind(&path).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        (dir, path, socket)
    }

    fn recv(socket: &UnixDatagram) -> String {
        let mut buf = vec![0u8; MAX_NOTIFY_BYTES + 1];
        let n = socket.recv(&mut buf).unwrap();
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }

    #[test]
    fn each_notification_arrives_as_one_datagram() {
        let (_dir, path, socket) = receiver();
        let n = Notifier::new(path.as_os_str()).unwrap();
        n.ready().unwrap();
        assert_eq!(recv(&socket), "READY=1");
        n.status("serving: 3 calls\nREADY=1").unwrap();
        assert_eq!(recv(&socket), "STATUS=serving: 3 calls READY=1");
        n.watchdog().unwrap();
        assert_eq!(recv(&socket), "WATCHDOG=1");
        n.stopping().unwrap();
        assert_eq!(recv(&socket), "STOPPING=1");
        n.extend_timeout(Duration::from_secs(35)).unwrap();
        assert_eq!(recv(&socket), "EXTEND_TIMEOUT_USEC=35000000");
        n.ready_with_status("ready").unwrap();
        assert_eq!(recv(&socket), "READY=1\nSTATUS=ready");
    }

    #[test]
    fn reloading_carries_a_current_monotonic_stamp() {
        let (_dir, path, socket) = receiver();
        let n = Notifier::new(path.as_os_str()).unwrap();
        let before = monotonic_usec();
        n.reloading().unwrap();
        let after = monotonic_usec();
        let msg = recv(&socket);
        let mut lines = msg.lines();
        assert_eq!(lines.next(), Some("RELOADING=1"));
        let stamp: u64 = lines
            .next()
            .and_then(|l| l.strip_prefix("MONOTONIC_USEC="))
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            before <= stamp && stamp <= after,
            "{before} {stamp} {after}"
        );
        assert_eq!(lines.next(), None);
    }

    #[test]
    fn abstract_address() {
        let name = format!("toolwall-notify-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let socket = UnixDatagram::bind_addr(&addr).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let n = Notifier::new(OsStr::new(&format!("@{name}"))).unwrap();
        n.ready().unwrap();
        assert_eq!(recv(&socket), "READY=1");
    }

    #[test]
    fn never_blocks_on_a_full_queue() {
        let (_dir, path, _socket) = receiver();
        let n = Notifier::new(path.as_os_str()).unwrap();
        // Nobody reads: the receive queue fills, and then sends fail instead of waiting.
        let mut refused = None;
        for _ in 0..100_000 {
            if let Err(e) = n.watchdog() {
                refused = Some(e);
                break;
            }
        }
        let e = refused.expect("a queue that is never read must fill");
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "{e}");
    }

    #[test]
    fn missing_socket_is_an_error_not_a_hang() {
        let dir = tempfile::tempdir().unwrap();
        let n = Notifier::new(dir.path().join("gone.sock").as_os_str()).unwrap();
        assert!(n.ready().is_err());
    }

    #[test]
    fn bad_addresses_are_refused() {
        for bad in ["relative/path", "", "x"] {
            assert!(Notifier::new(OsStr::new(bad)).is_err(), "{bad:?}");
        }
        let long = format!("/{}", "a".repeat(200));
        assert!(Notifier::new(OsStr::new(&long)).is_err());
        assert!(Notifier::new(OsStr::from_bytes(b"/tmp/a\0b")).is_err());
    }

    #[test]
    fn oversized_notification_is_refused() {
        let (_dir, path, _socket) = receiver();
        let n = Notifier::new(path.as_os_str()).unwrap();
        let big = "X".repeat(MAX_NOTIFY_BYTES + 1);
        assert_eq!(
            n.notify(&big).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert!(n.notify("").is_err());
        // A long status is cut, not refused.
        n.status(&"y".repeat(MAX_NOTIFY_BYTES * 2)).unwrap();
    }

    const ENV_CHILD: &str = "systemd::notify::tests::child_uses_the_environment";

    /// In a child started by the test below: read the environment as `serve` does, notify,
    /// and report. In a normal test run it does nothing.
    #[test]
    fn child_uses_the_environment() {
        if !test_child::is_child() {
            return;
        }
        test_child::report(format!(
            "watchdog={:?}",
            crate::systemd::watchdog_interval()
        ));
        match Notifier::from_env() {
            Ok(Some(n)) => {
                let sent = [n.ready(), n.status("up"), n.watchdog()];
                test_child::report(format!(
                    "sent={} left_in_env={}",
                    sent.iter().all(Result::is_ok),
                    std::env::var_os(NOTIFY_SOCKET).is_some()
                ));
            }
            Ok(None) => test_child::report("no notifier"),
            Err(e) => test_child::report(format!("ERROR {e}")),
        }
    }

    fn run_env_child(env: Vec<(&str, String)>, pid_vars: &[&str]) -> Vec<String> {
        test_child::run(ChildSpec {
            test: ENV_CHILD,
            env,
            pid_vars,
            fds: &[],
        })
    }

    #[test]
    fn a_service_started_with_notify_socket_and_watchdog() {
        let (_dir, path, socket) = receiver();
        let lines = run_env_child(
            vec![
                (NOTIFY_SOCKET, path.display().to_string()),
                ("WATCHDOG_USEC", "30000000".into()),
            ],
            &["WATCHDOG_PID"],
        );
        // The test harness runs a second thread, so the variable stays (see env.rs); in
        // `serve` it is removed.
        assert_eq!(
            lines,
            vec!["watchdog=Some(15s)", "sent=true left_in_env=true"]
        );
        assert_eq!(recv(&socket), "READY=1");
        assert_eq!(recv(&socket), "STATUS=up");
        assert_eq!(recv(&socket), "WATCHDOG=1");
    }

    #[test]
    fn without_systemd_nothing_is_asked() {
        assert_eq!(
            run_env_child(Vec::new(), &[]),
            vec!["watchdog=None", "no notifier"]
        );
        // A watchdog meant for another process (pid 1) is not ours.
        assert_eq!(
            run_env_child(
                vec![
                    ("WATCHDOG_USEC", "30000000".into()),
                    ("WATCHDOG_PID", "1".into())
                ],
                &[]
            ),
            vec!["watchdog=None", "no notifier"]
        );
    }

    #[test]
    fn an_unusable_notify_socket_is_an_error() {
        let lines = run_env_child(vec![(NOTIFY_SOCKET, "relative.sock".into())], &[]);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[1].starts_with("ERROR NOTIFY_SOCKET:"), "{lines:?}");
    }
}
