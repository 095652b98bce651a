//! The agent doors' listening sockets, and who a peer is once accepted.

use mio::net::{UnixListener, UnixStream};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A listening socket the loop polls.
pub enum Listener {
    Unix {
        socket: UnixListener,
        path: PathBuf,
        owned: bool,
    },
    Vsock {
        socket: vsock::VsockListener,
        port: u32,
    },
    /// The Streamable HTTP door (TLS when a certificate is configured).
    Http {
        socket: mio::net::TcpListener,
        addr: std::net::SocketAddr,
        tls: bool,
    },
}

impl Listener {
    pub fn describe(&self) -> String {
        match self {
            Listener::Unix { path, .. } => format!("unix:{} (framed)", path.display()),
            Listener::Vsock { port, .. } => format!("vsock:any:{port} (framed)"),
            Listener::Http { addr, tls, .. } => {
                format!(
                    "{}://{addr}/mcp (Streamable HTTP)",
                    if *tls { "https" } else { "http" }
                )
            }
        }
    }

    /// Remove the socket file we created (at shutdown).
    pub fn cleanup(&self) {
        if let Listener::Unix {
            path, owned: true, ..
        } = self
        {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Bind a unix socket with `mode`, replacing a stale socket file safely: an existing path is
/// removed only when it is a socket nobody accepts on; a live socket or any other file is an
/// error that names the path.
pub fn bind_unix(path: &Path, mode: u32) -> io::Result<UnixListener> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        create_private_dir(dir, 0o750)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            match std::os::unix::net::UnixStream::connect(path) {
                Ok(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!("{} is in use by a running process", path.display()),
                    ));
                }
                Err(_) => std::fs::remove_file(path)?,
            }
        }
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{} exists and is not a socket; not replacing it",
                    path.display()
                ),
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    // The socket is created with the umask applied; tighten it before anyone can connect.
    // SAFETY: umask(2) has no memory effects; the gateway is single-threaded here.
    let old = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let listener =
        bound.map_err(|e| io::Error::new(e.kind(), format!("bind {}: {e}", path.display())))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(listener)
}

/// Create a directory (and parents) readable only as `mode` says, if missing.
pub fn create_private_dir(dir: &Path, mode: u32) -> io::Result<()> {
    if dir.exists() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
}

use std::os::unix::fs::DirBuilderExt;

pub fn bind_vsock(port: u32) -> io::Result<vsock::VsockListener> {
    let addr = vsock::VsockAddr::new(vsock::VMADDR_CID_ANY, port);
    let listener = vsock::VsockListener::bind(&addr)
        .map_err(|e| io::Error::new(e.kind(), format!("bind vsock port {port}: {e}")))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// The uid and pid of a unix peer (SO_PEERCRED).
pub fn unix_peer(stream: &UnixStream) -> Option<(u32, i32)> {
    let fd = stream.as_raw_fd();
    let mut cred: libc::ucred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    (rc == 0).then_some((cred.uid, cred.pid))
}

/// A process's command name from `/proc/PID/comm`, sanitised.
pub fn process_name(pid: i32) -> Option<String> {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    Some(crate::transport::framed::sanitize_name(
        comm.trim_end_matches('\n'),
    ))
}

/// Bind the HTTP door's TCP listener, non-blocking.
pub fn bind_tcp(addr: std::net::SocketAddr) -> io::Result<mio::net::TcpListener> {
    mio::net::TcpListener::bind(addr)
        .map_err(|e| io::Error::new(e.kind(), format!("bind {addr}: {e}")))
}

/// Descriptors the gateway keeps besides its doors' connections: listeners, the ledger and
/// its WAL, worker sockets and pipes, the signal and poll descriptors, with room to spare.
pub const DESCRIPTORS_BESIDES_CONNECTIONS: u64 = 256;

/// Raise the soft limit on open descriptors towards `wanted` (never above the hard limit),
/// so every seat the doors' budgets grant can be accepted. Returns the soft limit now in
/// force; below `wanted`, accepts fail once it is reached (and are retried), so the caller
/// says which keys to lower.
pub fn raise_descriptor_limit(wanted: u64) -> io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into `limit`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if limit.rlim_cur >= wanted {
        return Ok(limit.rlim_cur);
    }
    let raised = libc::rlimit {
        rlim_cur: wanted.min(limit.rlim_max),
        rlim_max: limit.rlim_max,
    };
    // SAFETY: setrlimit reads one rlimit; lowering nothing but the soft limit's gap.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(raised.rlim_cur)
}
