//! Socket activation: the listening sockets systemd passes at fd 3 and up, described by
//! `LISTEN_PID`, `LISTEN_FDS` and `LISTEN_FDNAMES`.

use nix::sys::socket::{AddressFamily, SockType, SockaddrLike, SockaddrStorage, getsockname};
use nix::sys::socket::{getsockopt, sockopt};
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

use super::env::unset_if_single_threaded;

/// The first passed fd; the others follow without gaps.
pub const LISTEN_FDS_START: RawFd = 3;
/// Most sockets taken from `LISTEN_FDS`; toolwall has three doors, so more is a mistake.
pub const MAX_LISTEN_FDS: usize = 64;
/// Longest `FileDescriptorName=` systemd allows.
pub const MAX_FD_NAME_BYTES: usize = 255;
/// The name systemd gives a passed fd when none was configured and `LISTEN_FDNAMES` is unset.
const UNNAMED: &str = "unknown";

const LISTEN_PID: &str = "LISTEN_PID";
const LISTEN_FDS: &str = "LISTEN_FDS";
const LISTEN_FDNAMES: &str = "LISTEN_FDNAMES";

/// What an inherited socket is, as the kernel reports it (never as its name claims).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SocketKind {
    /// A listening unix stream socket bound to a path.
    Unix { path: PathBuf },
    /// A listening vsock stream socket.
    Vsock { cid: u32, port: u32 },
    /// A listening TCP socket (IPv4 or IPv6).
    Tcp { addr: SocketAddr },
    /// Anything toolwall cannot serve on: a datagram socket, a socket that is not
    /// listening, an abstract or unnamed unix socket, another family, or no socket at all.
    Other { what: String },
}

impl std::fmt::Display for SocketKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SocketKind::Unix { path } => write!(f, "unix:{}", path.display()),
            SocketKind::Vsock { cid, port } if *cid == u32::MAX => write!(f, "vsock:any:{port}"),
            SocketKind::Vsock { cid, port } => write!(f, "vsock:{cid}:{port}"),
            SocketKind::Tcp { addr } => write!(f, "tcp:{addr}"),
            SocketKind::Other { what } => f.write_str(what),
        }
    }
}

/// One socket passed by systemd, owned by this process from now on.
#[derive(Debug)]
pub struct InheritedSocket {
    pub fd: OwnedFd,
    /// Its `FileDescriptorName=` ("unknown" when systemd passed no names).
    pub name: String,
    pub kind: SocketKind,
}

impl InheritedSocket {
    /// `fd 3 "mcp-unix" unix:/run/toolwall/mcp.sock`, for log lines.
    pub fn describe(&self) -> String {
        format!("fd {} {:?} {}", self.fd.as_raw_fd(), self.name, self.kind)
    }

    /// The socket as the unix door's non-blocking listener.
    pub fn into_unix_listener(self) -> io::Result<mio::net::UnixListener> {
        self.expect(matches!(self.kind, SocketKind::Unix { .. }), "unix")?;
        let listener = std::os::unix::net::UnixListener::from(self.fd);
        listener.set_nonblocking(true)?;
        Ok(mio::net::UnixListener::from_std(listener))
    }

    /// The socket as the vsock door's non-blocking listener.
    pub fn into_vsock_listener(self) -> io::Result<vsock::VsockListener> {
        self.expect(matches!(self.kind, SocketKind::Vsock { .. }), "vsock")?;
        let listener = vsock::VsockListener::from(self.fd);
        listener.set_nonblocking(true)?;
        Ok(listener)
    }

    /// The socket as the HTTP door's non-blocking listener.
    pub fn into_tcp_listener(self) -> io::Result<std::net::TcpListener> {
        self.expect(matches!(self.kind, SocketKind::Tcp { .. }), "TCP")?;
        let listener = std::net::TcpListener::from(self.fd);
        listener.set_nonblocking(true)?;
        Ok(listener)
    }

    fn expect(&self, holds: bool, wanted: &str) -> io::Result<()> {
        if holds {
            return Ok(());
        }
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is not a listening {wanted} stream socket",
                self.describe()
            ),
        ))
    }
}

/// The three variables as found in the environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListenEnv {
    pub pid: Option<String>,
    pub fds: Option<String>,
    pub names: Option<String>,
}

impl ListenEnv {
    pub fn from_env() -> ListenEnv {
        ListenEnv {
            pid: std::env::var(LISTEN_PID).ok(),
            fds: std::env::var(LISTEN_FDS).ok(),
            names: std::env::var(LISTEN_FDNAMES).ok(),
        }
    }

    /// The names of the fds passed to the process `our_pid`, one per fd from
    /// [`LISTEN_FDS_START`]; empty when nothing was passed to it (no `LISTEN_PID`, or the
    /// variables were meant for another process). Malformed or inconsistent values are an
    /// error naming the variable.
    pub fn parse(&self, our_pid: u32) -> Result<Vec<String>, String> {
        let Some(pid) = &self.pid else {
            return Ok(Vec::new());
        };
        let pid: u32 = pid
            .parse()
            .map_err(|_| format!("{LISTEN_PID}={pid:?} is not a process id"))?;
        if pid != our_pid {
            return Ok(Vec::new());
        }
        let fds = self
            .fds
            .as_deref()
            .ok_or_else(|| format!("{LISTEN_PID} names this process but {LISTEN_FDS} is unset"))?;
        let count: usize = fds
            .parse()
            .map_err(|_| format!("{LISTEN_FDS}={fds:?} is not a number"))?;
        if count > MAX_LISTEN_FDS {
            return Err(format!(
                "{LISTEN_FDS}={count}: more than the {MAX_LISTEN_FDS} sockets toolwall takes"
            ));
        }
        let names: Vec<String> = match &self.names {
            None => vec![UNNAMED.to_string(); count],
            Some(_) if count == 0 => Vec::new(),
            Some(list) => list.split(':').map(str::to_string).collect(),
        };
        if names.len() != count {
            return Err(format!(
                "{LISTEN_FDNAMES} has {} names for {count} sockets ({:?})",
                names.len(),
                self.names.as_deref().unwrap_or_default()
            ));
        }
        for name in &names {
            if name.is_empty()
                || name.len() > MAX_FD_NAME_BYTES
                || !name.bytes().all(|b| b.is_ascii() && !b.is_ascii_control())
            {
                return Err(format!(
                    "{LISTEN_FDNAMES}: {name:?} is not a valid name (1 to {MAX_FD_NAME_BYTES} printable ASCII characters)"
                ));
            }
        }
        Ok(names)
    }
}

/// Takes the sockets systemd passed to this process: ownership of fds 3.. (`LISTEN_FDS` of
/// them, when `LISTEN_PID` is this process), each marked close-on-exec so no worker inherits
/// it, named from `LISTEN_FDNAMES` and described by the kernel (`getsockname`). The three
/// variables are removed from the environment.
///
/// **Call it first in `serve`**, before anything opens a file, spawns a worker or starts a
/// thread: until then nothing else may own or close fds 3.., a worker spawned earlier would
/// inherit the listening sockets, and removing variables is only sound while the process
/// has one thread. (A worker's own fd 3 is its RPC socket, placed there in the child after
/// fork; that does not touch the gateway's fds.)
///
/// Returns an empty list when systemd passed nothing. An error (malformed variables, a
/// passed fd that is not open) names the cause; the fds already taken are closed.
pub fn listen_fds() -> Result<Vec<InheritedSocket>, String> {
    let env = ListenEnv::from_env();
    if env == ListenEnv::default() {
        return Ok(Vec::new());
    }
    unset_if_single_threaded(&[LISTEN_PID, LISTEN_FDS, LISTEN_FDNAMES]);
    let names = env.parse(std::process::id())?;
    // SAFETY: LISTEN_PID names this process, so systemd placed these fds here for it, and
    // `listen_fds` runs before anything else in the process could have taken them.
    unsafe { take_listen_fds(names) }
}

/// Takes fds `LISTEN_FDS_START..` (one per name) as [`InheritedSocket`]s.
///
/// # Safety
/// Nothing else in the process may own those fds (no `File`, socket or `OwnedFd` wraps
/// them, and nothing will close them).
pub(crate) unsafe fn take_listen_fds(names: Vec<String>) -> Result<Vec<InheritedSocket>, String> {
    let mut taken = Vec::with_capacity(names.len());
    for (offset, name) in names.into_iter().enumerate() {
        let fd = LISTEN_FDS_START + offset as RawFd;
        // SAFETY: F_GETFD reads the flags of an fd number; it touches no memory.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        if flags < 0 {
            return Err(format!(
                "socket {name:?} should be at fd {fd}, but that fd is not open: {}",
                io::Error::last_os_error()
            ));
        }
        // SAFETY: as above; setting FD_CLOEXEC on an open fd.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) } < 0 {
            return Err(format!(
                "fd {fd} ({name:?}): setting close-on-exec: {}",
                io::Error::last_os_error()
            ));
        }
        // SAFETY: the fd is open (checked) and, by this function's contract, owned by nobody
        // else; from here the OwnedFd closes it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let kind = classify(&fd);
        taken.push(InheritedSocket { fd, name, kind });
    }
    Ok(taken)
}

/// The IP address in `addr` (nix reads these only with its `net` feature, which toolwall
/// does not build).
fn inet_address(addr: &SockaddrStorage) -> Option<SocketAddr> {
    let len = addr.len() as usize;
    match addr.family()? {
        AddressFamily::Inet if len >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family is AF_INET and the kernel filled at least a sockaddr_in into
            // the storage, which is large and aligned enough for any address.
            let sin: libc::sockaddr_in = unsafe { std::ptr::read_unaligned(addr.as_ptr().cast()) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                u16::from_be(sin.sin_port),
            )))
        }
        AddressFamily::Inet6 if len >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for AF_INET6 and sockaddr_in6.
            let sin6: libc::sockaddr_in6 =
                unsafe { std::ptr::read_unaligned(addr.as_ptr().cast()) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                u32::from_be(sin6.sin6_flowinfo),
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// What the kernel says the socket is.
fn classify(fd: &OwnedFd) -> SocketKind {
    let other = |what: String| SocketKind::Other { what };
    let addr = match getsockname::<SockaddrStorage>(fd.as_raw_fd()) {
        Ok(addr) => addr,
        Err(nix::errno::Errno::ENOTSOCK) => return other("not a socket".into()),
        Err(e) => return other(format!("a socket whose address cannot be read ({e})")),
    };
    let kind = match addr.family() {
        Some(AddressFamily::Unix) => match addr.as_unix_addr() {
            Some(unix) => match (unix.path(), unix.as_abstract()) {
                (Some(path), _) => SocketKind::Unix {
                    path: path.to_path_buf(),
                },
                (None, Some(name)) => {
                    return other(format!(
                        "unix socket with the abstract name @{}",
                        String::from_utf8_lossy(name)
                    ));
                }
                _ => return other("unnamed unix socket".into()),
            },
            None => return other("unix socket with an unreadable address".into()),
        },
        Some(AddressFamily::Inet | AddressFamily::Inet6) => match inet_address(&addr) {
            Some(addr) => SocketKind::Tcp { addr },
            None => return other("IP socket with an unreadable address".into()),
        },
        Some(AddressFamily::Vsock) => match addr.as_vsock_addr() {
            Some(v) => SocketKind::Vsock {
                cid: v.cid(),
                port: v.port(),
            },
            None => return other("vsock socket with an unreadable address".into()),
        },
        family => return other(format!("socket of family {family:?}")),
    };
    match getsockopt(fd, sockopt::SockType) {
        Ok(SockType::Stream) => {}
        Ok(t) => return other(format!("{t:?} socket on {kind}, not a stream socket")),
        Err(e) => return other(format!("socket on {kind} of unreadable type ({e})")),
    }
    match getsockopt(fd, sockopt::AcceptConn) {
        Ok(true) => kind,
        Ok(false) => other(format!("stream socket on {kind} that is not listening")),
        Err(e) => other(format!("socket on {kind} of unreadable state ({e})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::systemd::test_child::{self, ChildSpec};
    use crate::systemd::{DOOR_HTTP, DOOR_UNIX, DOOR_VSOCK};
    use std::io::Read;
    use std::os::fd::AsFd;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    fn env(pid: Option<&str>, fds: Option<&str>, names: Option<&str>) -> ListenEnv {
        ListenEnv {
            pid: pid.map(str::to_string),
            fds: fds.map(str::to_string),
            names: names.map(str::to_string),
        }
    }

    #[test]
    fn parse_names_for_us() {
        let e = env(Some("42"), Some("3"), Some("mcp-unix:mcp-vsock:mcp-http"));
        assert_eq!(
            e.parse(42).unwrap(),
            vec!["mcp-unix", "mcp-vsock", "mcp-http"]
        );
        assert_eq!(
            env(Some("42"), Some("2"), None).parse(42).unwrap(),
            vec!["unknown", "unknown"]
        );
        assert!(
            env(Some("42"), Some("0"), Some(""))
                .parse(42)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn parse_not_for_us() {
        assert!(ListenEnv::default().parse(42).unwrap().is_empty());
        assert!(
            env(Some("41"), Some("3"), Some("a:b:c"))
                .parse(42)
                .unwrap()
                .is_empty()
        );
        assert!(env(None, Some("3"), None).parse(42).unwrap().is_empty());
    }

    #[test]
    fn parse_refuses_malformed_values() {
        let cases = [
            (env(Some("x"), Some("1"), None), "LISTEN_PID"),
            (env(Some("42"), None, None), "LISTEN_FDS"),
            (env(Some("42"), Some("-1"), None), "LISTEN_FDS"),
            (env(Some("42"), Some("65"), None), "LISTEN_FDS"),
            (
                env(Some("42"), Some("18446744073709551616"), None),
                "LISTEN_FDS",
            ),
            (env(Some("42"), Some("2"), Some("a")), "LISTEN_FDNAMES"),
            (env(Some("42"), Some("1"), Some("a:b")), "LISTEN_FDNAMES"),
            (env(Some("42"), Some("2"), Some("a:")), "LISTEN_FDNAMES"),
            (env(Some("42"), Some("1"), Some("a\tb")), "LISTEN_FDNAMES"),
            (env(Some("42"), Some("1"), Some("é")), "LISTEN_FDNAMES"),
            (
                env(Some("42"), Some("1"), Some(&"n".repeat(256))),
                "LISTEN_FDNAMES",
            ),
        ];
        for (e, var) in cases {
            let err = e.parse(42).unwrap_err();
            assert!(err.contains(var), "{e:?}: {err}");
        }
    }

    // ---- real sockets, passed to a child process at fd 3.. -------------------------------

    const CHILD_TEST: &str = "systemd::listen_fds::tests::child_reports_inherited_sockets";

    /// In a child started by the tests below: take the sockets and report each. In a normal
    /// test run it does nothing.
    #[test]
    fn child_reports_inherited_sockets() {
        if !test_child::is_child() {
            return;
        }
        let sockets = match listen_fds() {
            Ok(sockets) => sockets,
            Err(e) => return test_child::report(format!("ERROR {e}")),
        };
        for s in &sockets {
            // SAFETY: F_GETFD on an fd we own.
            let flags = unsafe { libc::fcntl(s.fd.as_raw_fd(), libc::F_GETFD) };
            test_child::report(format!(
                "fd={} cloexec={} name={} kind={}",
                s.fd.as_raw_fd(),
                flags & libc::FD_CLOEXEC != 0,
                s.name,
                s.kind
            ));
        }
        // Each is usable as its door's listener, and only as that.
        for s in sockets {
            let usable = match &s.kind {
                SocketKind::Unix { .. } => s.into_unix_listener().map(|_| ()),
                SocketKind::Vsock { .. } => s.into_vsock_listener().map(|_| ()),
                SocketKind::Tcp { .. } => s.into_tcp_listener().map(|_| ()),
                SocketKind::Other { .. } => s.into_unix_listener().map(|_| ()),
            };
            test_child::report(format!("usable={}", usable.is_ok()));
        }
    }

    fn run_child(fds: &[&dyn AsFd], count: &str, names: Option<&str>) -> Vec<String> {
        let mut env = vec![(LISTEN_FDS, count.to_string())];
        if let Some(names) = names {
            env.push((LISTEN_FDNAMES, names.to_string()));
        }
        test_child::run(ChildSpec {
            test: CHILD_TEST,
            env,
            pid_vars: &[LISTEN_PID],
            fds,
        })
    }

    #[test]
    fn real_sockets_are_taken_named_and_described() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mcp.sock");
        let unix = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let tcp_addr = tcp.local_addr().unwrap();
        let tcp6 = std::net::TcpListener::bind("[::1]:0");
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let udp_addr = udp.local_addr().unwrap();
        let mut fds: Vec<&dyn AsFd> = vec![&unix, &tcp, &udp];
        let mut names = "mcp-unix:mcp-http:stray".to_string();
        let mut expected = vec![
            format!(
                "fd=3 cloexec=true name=mcp-unix kind=unix:{}",
                path.display()
            ),
            format!("fd=4 cloexec=true name=mcp-http kind=tcp:{tcp_addr}"),
            format!(
                "fd=5 cloexec=true name=stray kind=Datagram socket on tcp:{udp_addr}, not a stream socket"
            ),
        ];
        // IPv6 where the machine has it.
        if let Ok(tcp6) = &tcp6 {
            fds.push(tcp6);
            names.push_str(":v6");
            expected.push(format!(
                "fd=6 cloexec=true name=v6 kind=tcp:{}",
                tcp6.local_addr().unwrap()
            ));
        }
        let usable = [true, true, false, true];
        expected.extend(usable[..fds.len()].iter().map(|u| format!("usable={u}")));
        let count = fds.len().to_string();
        assert_eq!(run_child(&fds, &count, Some(&names)), expected);
    }

    #[test]
    fn unnamed_and_not_listening_sockets() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let client = std::os::unix::net::UnixStream::connect(&path).unwrap();
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let tcp_client = std::net::TcpStream::connect(tcp.local_addr().unwrap()).unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        let lines = run_child(&[&client, &tcp_client, &file], "3", None);
        let local = tcp_client.local_addr().unwrap();
        assert_eq!(
            lines,
            vec![
                "fd=3 cloexec=true name=unknown kind=unnamed unix socket".to_string(),
                format!(
                    "fd=4 cloexec=true name=unknown kind=stream socket on tcp:{local} that is not listening"
                ),
                "fd=5 cloexec=true name=unknown kind=not a socket".to_string(),
                "usable=false".to_string(),
                "usable=false".to_string(),
                "usable=false".to_string(),
            ]
        );
    }

    #[test]
    fn an_fd_that_is_not_open_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let unix = std::os::unix::net::UnixListener::bind(dir.path().join("b.sock")).unwrap();
        // One socket passed, two announced.
        let lines = run_child(&[&unix], "2", Some("mcp-unix:mcp-http"));
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with("ERROR ") && lines[0].contains("fd 4"),
            "{lines:?}"
        );
    }

    #[test]
    fn names_that_do_not_fit_the_count_are_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let unix = std::os::unix::net::UnixListener::bind(dir.path().join("c.sock")).unwrap();
        let lines = run_child(&[&unix], "1", Some("mcp-unix:mcp-http"));
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].contains("LISTEN_FDNAMES has 2 names for 1 sockets"),
            "{lines:?}"
        );
    }

    // ---- the same through systemd's own launcher ------------------------------------------

    fn free_tcp_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// A vsock port nobody listens on, when this machine can bind vsock at all.
    fn free_vsock_port() -> Option<u32> {
        let listener = vsock::VsockListener::bind_with_cid_port(vsock::VMADDR_CID_ANY, u32::MAX);
        match listener.and_then(|l| l.local_addr()) {
            Ok(addr) => Some(addr.port()),
            Err(e) => {
                eprintln!("vsock cannot be bound here ({e}); testing unix and TCP only");
                None
            }
        }
    }

    /// `systemd-socket-activate` (package `systemd`) binds, waits for the first connection,
    /// then starts the child with `LISTEN_*` set exactly as the service manager does.
    #[test]
    fn through_systemd_socket_activate() {
        let launcher = "systemd-socket-activate";
        let found = Command::new(launcher)
            .arg("--version")
            .stdout(Stdio::null())
            .status();
        assert!(
            found.is_ok_and(|s| s.success()),
            "{launcher} not found: install the systemd package (apt-get install -y systemd)"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mcp.sock");
        let port = free_tcp_port();
        let vsock_port = free_vsock_port();
        let child_cmd = test_child::command_for(CHILD_TEST);
        let mut cmd = Command::new(launcher);
        cmd.arg(format!("--listen={}", path.display()))
            .arg(format!("--listen=127.0.0.1:{port}"));
        let mut names = vec![DOOR_UNIX, DOOR_HTTP];
        if let Some(vport) = vsock_port {
            cmd.arg(format!("--listen=vsock::{vport}"));
            names.push(DOOR_VSOCK);
        }
        let mut child = cmd
            .arg(format!("--fdname={}", names.join(":")))
            .arg(format!("--setenv={}=1", test_child::CHILD_FLAG))
            .arg(child_cmd.get_program())
            .args(child_cmd.get_args())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // The child starts on the first connection.
        let deadline = Instant::now() + Duration::from_secs(20);
        let _conn = loop {
            match std::os::unix::net::UnixStream::connect(&path) {
                Ok(c) => break c,
                Err(e) => {
                    if let Ok(Some(status)) = child.try_wait() {
                        panic!("{launcher} exited early ({status}): {e}");
                    }
                    assert!(Instant::now() < deadline, "no socket at {path:?}: {e}");
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        };
        let mut stdout = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut stdout)
            .unwrap();
        let status = child.wait().unwrap();
        assert!(status.success(), "{status}");
        let lines: Vec<String> = stdout.lines().filter_map(test_child::report_line).collect();
        let mut expected = vec![
            format!(
                "fd=3 cloexec=true name=mcp-unix kind=unix:{}",
                path.display()
            ),
            format!("fd=4 cloexec=true name=mcp-http kind=tcp:127.0.0.1:{port}"),
        ];
        if let Some(vport) = vsock_port {
            expected.push(format!(
                "fd=5 cloexec=true name=mcp-vsock kind=vsock:any:{vport}"
            ));
        }
        expected.extend(names.iter().map(|_| "usable=true".to_string()));
        assert_eq!(lines, expected);
    }
}
