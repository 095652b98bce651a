//! After confinement, the worker tries each forbidden thing and records how it was refused.
//!
//! Every probe is built so that, should it NOT be refused, it does no lasting harm: a
//! created file is removed, a forked child exits at once and is reaped, `execve` is given
//! an unreadable argument vector (a kernel that lets it through answers EFAULT instead of
//! replacing the worker), `clone3` is given a size the kernel rejects. Nothing is left open.
//! An answer that does not prove a refusal (a missing directory, a refused connection)
//! counts as not denied: the verdict fails closed.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::{Probe, Role, RoleGrant};

/// The probes every report must carry, each denied, for a worker to get work in enforce mode.
pub const REQUIRED_PROBES: &[&str] = &[
    "create_file_tmp",
    "create_file_probe_dir",
    "read_probe_dir",
    "fork",
    "posix_spawn",
    "clone3",
    "exec",
    "connect_ungranted_port",
    "bind_tcp",
    "unix_socket",
    "signal_parent",
    "tcp_fast_open",
    "gain_capabilities",
];

/// The probes a role's report must carry (by the role's name as the report spells it).
/// Probes of [`probes_allowed_by_design`] must be present but may succeed; every other one
/// must be denied.
pub fn required_probes(role: &str) -> &'static [&'static str] {
    if role == Role::Workspace.as_str() || role == Role::StdioServer.as_str() {
        super::workspace_probes::WORKSPACE_PROBES
    } else {
        REQUIRED_PROBES
    }
}

/// Probes whose success a role needs to do its job: the workspace runs programs, so its
/// fork, spawn and exec probes succeed (their detail says so). Empty for other roles.
pub fn probes_allowed_by_design(role: &str) -> &'static [&'static str] {
    if role == Role::Workspace.as_str() || role == Role::StdioServer.as_str() {
        super::workspace_probes::ALLOWED_BY_DESIGN
    } else {
        &[]
    }
}

/// Runs every probe of [`REQUIRED_PROBES`] and returns the results (put them in the
/// report's `probes`). Run it right after [`super::confine`], before serving; it is safe
/// with threads running too.
pub fn attest(grant: &RoleGrant) -> Vec<Probe> {
    let mut probes = vec![
        probe_create_file("create_file_tmp", Path::new("/tmp")),
        probe_create_file("create_file_probe_dir", &grant.forbidden_probe_dir),
        probe_read_dir(&grant.forbidden_probe_dir),
        probe_fork(),
        probe_posix_spawn(),
        probe_clone3(),
        probe_exec(),
        probe_connect(grant),
        probe_bind(),
        probe_unix_socket(),
        probe_signal_parent(),
        probe_tcp_fast_open(grant),
        probe_gain_capabilities(),
    ];
    probes.extend(super::secrets::probe_secrets(&grant.secrets));
    probes
}

pub(super) fn denied(name: &str, errno: i32) -> Probe {
    Probe {
        name: name.to_string(),
        denied: true,
        detail: format!("denied: {} ({})", errno_text(errno), layer_of(name, errno)),
    }
}

pub(crate) fn allowed(name: &str, detail: String) -> Probe {
    Probe {
        name: name.to_string(),
        denied: false,
        detail,
    }
}

/// Which layer an errno points to for a probe (EACCES: Landlock; EPERM: seccomp, except
/// for signals, where it is Landlock's scope; ENOSYS: the seccomp clone3 filter).
fn layer_of(name: &str, errno: i32) -> &'static str {
    match (name, errno) {
        ("signal_parent", libc::EPERM) => "landlock scope",
        (_, libc::EACCES) => "landlock",
        (_, libc::EPERM) | (_, libc::ENOSYS) => "seccomp",
        _ => "unknown layer",
    }
}

pub(crate) fn errno_text(errno: i32) -> String {
    let name = match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EEXIST => "EEXIST",
        libc::EINVAL => "EINVAL",
        libc::EROFS => "EROFS",
        libc::ENOSYS => "ENOSYS",
        libc::EAFNOSUPPORT => "EAFNOSUPPORT",
        libc::EADDRINUSE => "EADDRINUSE",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ENETUNREACH => "ENETUNREACH",
        _ => "errno",
    };
    format!("{name} {}", io::Error::from_raw_os_error(errno))
}

pub(crate) fn last_errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A path as a C string; None when it holds a NUL byte.
pub fn c_path(path: &Path) -> Option<CString> {
    CString::new(path.as_os_str().as_bytes()).ok()
}

pub(super) fn probe_create_file(name: &str, dir: &Path) -> Probe {
    let path = dir.join(format!(".toolwall-probe-{}", std::process::id()));
    let Some(c) = c_path(&path) else {
        return allowed(
            name,
            format!("cannot probe: path {path:?} holds a NUL byte"),
        );
    };
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC;
    // SAFETY: valid C string; the fd is closed below.
    let fd = unsafe { libc::open(c.as_ptr(), flags, 0o600 as libc::c_uint) };
    if fd >= 0 {
        // SAFETY: closing the fd just opened, removing the file just created.
        unsafe {
            libc::close(fd);
            libc::unlink(c.as_ptr());
        }
        return allowed(name, format!("created {} (removed again)", path.display()));
    }
    match last_errno() {
        e @ (libc::EACCES | libc::EPERM) => denied(name, e),
        // A read-only mount (systemd's ProtectSystem=strict) refuses before Landlock is
        // asked: a wall at least as strong.
        libc::EROFS => Probe {
            name: name.to_string(),
            denied: true,
            detail: format!(
                "denied: {} (a read-only mount) for {}",
                errno_text(libc::EROFS),
                path.display()
            ),
        },
        e => allowed(
            name,
            format!("not proven: {} for {}", errno_text(e), path.display()),
        ),
    }
}

pub(super) fn probe_read_dir(dir: &Path) -> Probe {
    let name = "read_probe_dir";
    let Some(c) = c_path(dir) else {
        return allowed(name, format!("cannot probe: path {dir:?} holds a NUL byte"));
    };
    if dir.as_os_str().is_empty() {
        return allowed(name, "not proven: no probe directory given".to_string());
    }
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
    // SAFETY: valid C string; the fd is closed below.
    let fd = unsafe { libc::open(c.as_ptr(), flags) };
    if fd >= 0 {
        // SAFETY: closing the fd just opened.
        unsafe { libc::close(fd) };
        return allowed(name, format!("opened {} for reading", dir.display()));
    }
    match last_errno() {
        e @ (libc::EACCES | libc::EPERM) => denied(name, e),
        e => allowed(
            name,
            format!("not proven: {} for {}", errno_text(e), dir.display()),
        ),
    }
}

/// Waits for a child a probe could not prevent, so none is left behind.
pub(super) fn reap(pid: libc::pid_t) -> String {
    let mut status = 0;
    // SAFETY: waiting for our own child.
    let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
    if rc == pid {
        "reaped".to_string()
    } else {
        format!("could not be reaped: {}", errno_text(last_errno()))
    }
}

pub(super) fn probe_fork() -> Probe {
    let name = "fork";
    // SAFETY: the child only calls _exit, which is async-signal-safe.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: leaving the forked child at once, without running any Rust code.
        unsafe { libc::_exit(0) };
    }
    if pid > 0 {
        return allowed(name, format!("forked child {pid}, {}", reap(pid)));
    }
    match last_errno() {
        e @ (libc::EACCES | libc::EPERM | libc::ENOSYS) => denied(name, e),
        e => allowed(name, format!("not proven: {}", errno_text(e))),
    }
}

pub(super) fn probe_posix_spawn() -> Probe {
    let name = "posix_spawn";
    let path = c"/bin/true";
    let argv = [path.as_ptr() as *mut libc::c_char, std::ptr::null_mut()];
    let envp = [std::ptr::null_mut::<libc::c_char>()];
    let mut pid: libc::pid_t = 0;
    // SAFETY: NULL-terminated argv/envp that outlive the call; no file actions/attributes.
    let rc = unsafe {
        libc::posix_spawn(
            &mut pid,
            path.as_ptr(),
            std::ptr::null(),
            std::ptr::null(),
            argv.as_ptr(),
            envp.as_ptr(),
        )
    };
    if rc == 0 {
        return allowed(name, format!("spawned /bin/true as {pid}, {}", reap(pid)));
    }
    match rc {
        e @ (libc::EACCES | libc::EPERM | libc::ENOSYS) => denied(name, e),
        e => allowed(name, format!("not proven: {}", errno_text(e))),
    }
}

pub(super) fn probe_clone3() -> Probe {
    let name = "clone3";
    // A size below the first version of struct clone_args: a kernel that sees the call
    // answers EINVAL and creates nothing.
    let args = [0u64; 11];
    // SAFETY: the pointer is valid for the (zero) size given.
    let rc = unsafe { libc::syscall(libc::SYS_clone3, args.as_ptr(), 0usize) };
    if rc >= 0 {
        if rc == 0 {
            // SAFETY: we are an unexpected child: leave at once.
            unsafe { libc::_exit(0) };
        }
        return allowed(
            name,
            format!("clone3 created {rc}, {}", reap(rc as libc::pid_t)),
        );
    }
    match last_errno() {
        e @ (libc::ENOSYS | libc::EPERM) => denied(name, e),
        e => allowed(name, format!("reached the kernel: {}", errno_text(e))),
    }
}

pub(super) fn probe_exec() -> Probe {
    let name = "exec";
    // An unreadable argv (an address in the never-mapped first page): past the permission
    // checks the kernel answers EFAULT, so the worker is never replaced even when exec is
    // allowed.
    let bad_vector = std::ptr::dangling::<*const libc::c_char>();
    // SAFETY: the kernel validates every pointer; a valid C string for the path.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_execve,
            c"/bin/true".as_ptr(),
            bad_vector,
            bad_vector,
        )
    };
    if rc == 0 {
        return allowed(name, "execve returned 0".to_string());
    }
    match last_errno() {
        e @ (libc::EACCES | libc::EPERM) => denied(name, e),
        libc::EFAULT => allowed(
            name,
            "execve of /bin/true passed the permission checks (EFAULT on the argument vector)"
                .to_string(),
        ),
        e => allowed(name, format!("not proven: {}", errno_text(e))),
    }
}

/// A port the grant does not hold (1 unless granted).
pub(super) fn ungranted_port(grant: &RoleGrant) -> Option<u16> {
    // A table, not a search of the list per port: a grant may hold every port.
    let mut granted = vec![false; usize::from(u16::MAX) + 1];
    for &p in &grant.tcp_connect_ports {
        granted[usize::from(p)] = true;
    }
    (1..=u16::MAX).find(|p| !granted[usize::from(*p)])
}

fn probe_connect(grant: &RoleGrant) -> Probe {
    let name = "connect_ungranted_port";
    let Some(port) = ungranted_port(grant) else {
        return allowed(name, "every port is granted".to_string());
    };
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    match std::net::TcpStream::connect(addr) {
        Ok(_) => allowed(name, format!("connected to {addr}")),
        // Only Landlock answers EACCES to a connect; EPERM may be a local firewall and
        // ECONNREFUSED is the network, neither proves the sandbox.
        Err(e) => match e.raw_os_error() {
            Some(libc::EACCES) => {
                let mut p = denied(name, libc::EACCES);
                p.detail.push_str(&format!(" for {addr}"));
                p
            }
            Some(errno) => allowed(
                name,
                format!(
                    "not denied by the sandbox: {} for {addr}",
                    errno_text(errno)
                ),
            ),
            None => allowed(name, format!("not proven: {e} for {addr}")),
        },
    }
}

/// TCP Fast Open connects inside `sendto`/`sendmsg`, where Landlock's connect check does
/// not run: seccomp must refuse the flag (and `TCP_FASTOPEN_CONNECT`).
fn probe_tcp_fast_open(grant: &RoleGrant) -> Probe {
    let name = "tcp_fast_open";
    let Some(port) = ungranted_port(grant) else {
        return allowed(name, "every port is granted".to_string());
    };
    // SAFETY: plain socket call; the fd is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        return allowed(
            name,
            format!("not proven: no TCP socket ({})", errno_text(errno)),
        );
    }
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes([127, 0, 0, 1]),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: a one-byte buffer and a sockaddr_in of the size given.
    let rc = unsafe {
        libc::sendto(
            fd,
            b"x".as_ptr().cast(),
            1,
            libc::MSG_FASTOPEN | libc::MSG_DONTWAIT,
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    // SAFETY: closing the fd opened above.
    unsafe { libc::close(fd) };
    match (rc, errno) {
        (-1, libc::EPERM | libc::EACCES) => denied(name, errno),
        (-1, errno) => allowed(
            name,
            format!(
                "not denied by the sandbox: {} for 127.0.0.1:{port}",
                errno_text(errno)
            ),
        ),
        _ => allowed(name, format!("sent to 127.0.0.1:{port}")),
    }
}

pub(super) fn probe_bind() -> Probe {
    let name = "bind_tcp";
    match std::net::TcpListener::bind(("127.0.0.1", 0)) {
        Ok(listener) => allowed(
            name,
            format!(
                "bound {}",
                listener
                    .local_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_default()
            ),
        ),
        Err(e) => match e.raw_os_error() {
            Some(errno @ (libc::EACCES | libc::EPERM)) => denied(name, errno),
            Some(errno) => allowed(name, format!("not proven: {}", errno_text(errno))),
            None => allowed(name, format!("not proven: {e}")),
        },
    }
}

pub(super) fn probe_unix_socket() -> Probe {
    let name = "unix_socket";
    // Landlock before ABI 9 does not cover connecting to pathname unix sockets, so the
    // worker must not be able to create one at all.
    // SAFETY: plain socket call; the fd is closed below.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd >= 0 {
        // SAFETY: closing the fd just created.
        unsafe { libc::close(fd) };
        return allowed(name, "created an AF_UNIX socket".to_string());
    }
    match last_errno() {
        e @ (libc::EACCES | libc::EPERM) => denied(name, e),
        e => allowed(name, format!("not proven: {}", errno_text(e))),
    }
}

pub(super) fn probe_signal_parent() -> Probe {
    let name = "signal_parent";
    // SAFETY: getppid cannot fail; signal 0 only checks permission, it delivers nothing.
    let rc = unsafe {
        let parent = libc::getppid();
        libc::syscall(libc::SYS_tgkill, parent, parent, 0)
    };
    if rc == 0 {
        return allowed(name, "signal 0 reached the parent".to_string());
    }
    match last_errno() {
        e @ (libc::EACCES | libc::EPERM) => denied(name, e),
        e => allowed(name, format!("not proven: {}", errno_text(e))),
    }
}

/// No capability held, none ambient or inheritable, and none that execve could grant: the
/// bounding set is empty, or no_new_privs keeps file capabilities and set-user-ID root
/// programs from granting any.
pub(super) fn probe_gain_capabilities() -> Probe {
    let name = "gain_capabilities";
    let sets = match super::capabilities::CapabilitySets::current() {
        Ok(s) => s,
        Err(e) => {
            return allowed(
                name,
                format!("not proven: reading the capability sets: {e}"),
            );
        }
    };
    // SAFETY: prctl with integer arguments.
    let no_new_privs = unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) } == 1;
    if !sets.holds_none() {
        return allowed(name, format!("capabilities held: {}", sets.describe()));
    }
    if sets.bounding == 0 {
        return Probe {
            name: name.to_string(),
            denied: true,
            detail: "denied: no capability held and the bounding set is empty".to_string(),
        };
    }
    if no_new_privs {
        return Probe {
            name: name.to_string(),
            denied: true,
            detail: format!(
                "denied: no capability held; the bounding set still names {} (toolwall had no CAP_SETPCAP to drop them) and no_new_privs keeps execve from granting any",
                sets.bounding.count_ones()
            ),
        };
    }
    allowed(
        name,
        format!(
            "no capability held, but {} in the bounding set and no no_new_privs",
            sets.bounding.count_ones()
        ),
    )
}

/// The x32 bit of x86_64 system call numbers (`__X32_SYSCALL_BIT`).
pub const X32_SYSCALL_BIT: libc::c_long = 0x4000_0000;

#[cfg(test)]
mod tests {
    use super::*;

    /// The probe can fail: outside any sandbox, TCP Fast Open is not refused.
    #[test]
    fn tcp_fast_open_probe_is_not_denied_without_the_sandbox() {
        let grant = RoleGrant {
            tcp_connect_ports: vec![80, 443],
            ..RoleGrant::default()
        };
        let probe = probe_tcp_fast_open(&grant);
        assert!(!probe.denied, "{probe:?}");
    }
}
