//! The attestation of a workspace worker. It must be able to run programs, so `fork`,
//! `posix_spawn` and `exec` succeed by design (and say so); everything else a workspace
//! program must never do is tried here, some of it from a forked child to prove that the
//! programs it runs inherit the confinement.

use std::path::Path;

use super::attest::{
    allowed, errno_text, last_errno, probe_bind, probe_clone3, probe_create_file, probe_exec,
    probe_fork, probe_posix_spawn, probe_read_dir, probe_signal_parent, probe_unix_socket, reap,
    ungranted_port,
};
use super::{Probe, RoleGrant};

/// Probes every workspace report must carry. Those in [`ALLOWED_BY_DESIGN`] may succeed;
/// every other one must be denied.
pub const WORKSPACE_PROBES: &[&str] = &[
    "create_file_tmp",
    "create_file_probe_dir",
    "create_file_outside_root",
    "read_probe_dir",
    "fork",
    "posix_spawn",
    "clone3",
    "exec",
    "connect_ungranted_port",
    "bind_tcp",
    "unix_socket",
    "signal_parent",
    "child_create_file_tmp",
    "child_signal_gateway",
    "child_new_user_namespace",
    "run_as_gateway_user",
    "chmod_toolwall_files",
    "setuid_file",
    "sysv_shm",
    "listen_unbound",
    "inotify",
    "gain_capabilities",
    "x32_syscall",
];

/// What a workspace is for: running programs.
pub const ALLOWED_BY_DESIGN: &[&str] = &["fork", "posix_spawn", "exec"];

/// Runs the workspace probes. `grant.write_paths[0]` is the workspace root; `gateway_uid`
/// the uid toolwall runs as. Also emits `read_hidden_paths` when a hidden path exists,
/// `read_root_only_files` when `/etc` holds files only their owner may read, `udp_socket`
/// when the workspace has no network, and one `read_secret:*` per secret; when present
/// those must be denied too.
pub fn attest_workspace(grant: &RoleGrant, context: &WorkspaceProbeContext) -> Vec<Probe> {
    let gateway_uid = context.gateway_uid;
    let offline = grant.tcp_connect_ports.is_empty();
    let mut probes = vec![
        probe_create_file("create_file_tmp", Path::new("/tmp")),
        probe_create_file("create_file_probe_dir", &grant.forbidden_probe_dir),
        probe_outside_root(grant),
        probe_read_dir(&grant.forbidden_probe_dir),
        by_design(probe_fork()),
        by_design(probe_posix_spawn()),
        probe_clone3(),
        by_design(probe_exec()),
        probe_connect(grant),
        probe_bind(),
        probe_unix_socket(),
        probe_signal_parent(),
        probe_in_child("child_create_file_tmp", ChildProbe::CreateInTmp),
        probe_in_child("child_signal_gateway", ChildProbe::SignalGateway),
        probe_in_child("child_new_user_namespace", ChildProbe::NewUserNamespace),
        probe_run_as_gateway_user(gateway_uid),
        probe_chmod_toolwall_files(&grant.forbidden_probe_dir),
        probe_setuid_file(grant),
        probe_sysv_shm(),
        probe_listen_unbound(),
        probe_inotify(),
        super::attest::probe_gain_capabilities(),
        probe_in_child("x32_syscall", ChildProbe::X32Syscall),
    ];
    if let Some(p) = probe_read_hidden(grant) {
        probes.push(p);
    }
    if let Some(p) = probe_read_root_only_files(&context.root_only_files) {
        probes.push(p);
    }
    probes.extend(super::secrets::probe_secrets(&grant.secrets));
    if offline {
        probes.push(probe_udp("seccomp offline filter"));
    } else if context.udp_refused_with_ports {
        probes.push(probe_udp("seccomp: no IP datagram sockets"));
    }
    probes
}

fn by_design(mut probe: Probe) -> Probe {
    if !probe.denied {
        probe.detail = format!(
            "allowed by design (the workspace runs programs): {}",
            probe.detail
        );
    }
    probe
}

fn denied_by(name: &str, errno: i32, layer: &str) -> Probe {
    Probe {
        name: name.to_string(),
        denied: true,
        detail: format!("denied: {} ({layer})", errno_text(errno)),
    }
}

fn probe_outside_root(grant: &RoleGrant) -> Probe {
    let name = "create_file_outside_root";
    match grant.write_paths.first().and_then(|root| root.parent()) {
        Some(parent) => probe_create_file(name, parent),
        None => allowed(
            name,
            "not proven: no workspace root with a parent".to_string(),
        ),
    }
}

fn probe_read_hidden(grant: &RoleGrant) -> Option<Probe> {
    let name = "read_hidden_paths";
    let existing: Vec<&Path> = grant
        .hidden_paths
        .iter()
        .map(|p| p.as_path())
        .filter(|p| std::fs::symlink_metadata(p).is_ok())
        .collect();
    if existing.is_empty() {
        return None;
    }
    for path in &existing {
        let Some(c) = super::attest::c_path(path) else {
            return Some(allowed(name, format!("cannot probe {path:?}: NUL byte")));
        };
        // O_RDONLY opens a directory too; O_NOFOLLOW keeps a link from standing in.
        // SAFETY: valid C string; the fd is closed below.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd >= 0 {
            // SAFETY: closing the fd just opened.
            unsafe { libc::close(fd) };
            return Some(allowed(
                name,
                format!("opened {} for reading", path.display()),
            ));
        }
        match last_errno() {
            libc::EACCES | libc::EPERM => {}
            e => {
                return Some(allowed(
                    name,
                    format!("not proven: {} for {}", errno_text(e), path.display()),
                ));
            }
        }
    }
    let mut p = denied_by(name, libc::EACCES, "landlock");
    p.detail
        .push_str(&format!(" for {} hidden paths", existing.len()));
    Some(p)
}

/// TCP connect to a port the grant lacks. Offline, the socket itself is refused (seccomp
/// offline filter); with ports granted, Landlock refuses the connect.
fn probe_connect(grant: &RoleGrant) -> Probe {
    let name = "connect_ungranted_port";
    let Some(port) = ungranted_port(grant) else {
        return allowed(name, "every port is granted".to_string());
    };
    // SAFETY: plain socket call; the fd is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return match last_errno() {
            libc::EPERM => denied_by(name, libc::EPERM, "seccomp: no sockets offline"),
            e => allowed(name, format!("not proven: socket: {}", errno_text(e))),
        };
    }
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_be_bytes([127, 0, 0, 1]).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: a valid sockaddr_in of the size given; the fd is ours.
    let rc = unsafe {
        libc::connect(
            fd,
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    let errno = last_errno();
    // SAFETY: closing the fd just created.
    unsafe { libc::close(fd) };
    if rc == 0 {
        return allowed(name, format!("connected to 127.0.0.1:{port}"));
    }
    match errno {
        libc::EACCES => {
            let mut p = denied_by(name, libc::EACCES, "landlock");
            p.detail.push_str(&format!(" for 127.0.0.1:{port}"));
            p
        }
        e => allowed(
            name,
            format!(
                "not denied by the sandbox: {} for 127.0.0.1:{port}",
                errno_text(e)
            ),
        ),
    }
}

fn probe_udp(layer: &str) -> Probe {
    let name = "udp_socket";
    // SAFETY: plain socket call; the fd is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd >= 0 {
        // SAFETY: closing the fd just created.
        unsafe { libc::close(fd) };
        return allowed(
            name,
            "created a UDP socket (Landlock does not govern UDP)".to_string(),
        );
    }
    match last_errno() {
        libc::EPERM => denied_by(name, libc::EPERM, layer),
        e => allowed(name, format!("not proven: {}", errno_text(e))),
    }
}

/// Agent programs never run as root or as toolwall's own user: plain Unix permissions
/// then keep them from toolwall's files. (The gateway checks the uid is the agent user's.)
fn probe_run_as_gateway_user(gateway_uid: u32) -> Probe {
    let name = "run_as_gateway_user";
    let (uid, gid) = super::confine::own_ids();
    if uid == 0 {
        return allowed(name, "runs as root (uid 0)".to_string());
    }
    if uid == gateway_uid {
        return allowed(name, format!("runs as toolwall's own uid {uid}"));
    }
    Probe {
        name: name.to_string(),
        denied: true,
        detail: format!(
            "denied: runs as uid {uid} gid {gid}, not as root or toolwall's uid {gateway_uid}"
        ),
    }
}

/// Landlock does not cover chmod: only the file's owner (or root) may change its mode.
/// Tried on the ledger's directory with its current mode, so a success changes nothing.
fn probe_chmod_toolwall_files(dir: &Path) -> Probe {
    let name = "chmod_toolwall_files";
    let Some(c) = super::attest::c_path(dir) else {
        return allowed(name, format!("cannot probe {dir:?}: NUL byte"));
    };
    if dir.as_os_str().is_empty() {
        return allowed(name, "not proven: no probe directory given".to_string());
    }
    let mode = std::fs::metadata(dir)
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777)
        .unwrap_or(0o700);
    // SAFETY: a valid C string.
    let rc = unsafe { libc::chmod(c.as_ptr(), mode as libc::mode_t) };
    if rc == 0 {
        return allowed(
            name,
            format!(
                "changed the mode of {} (to the same {mode:o})",
                dir.display()
            ),
        );
    }
    match last_errno() {
        e @ (libc::EPERM | libc::EACCES) => {
            denied_by(name, e, &format!("file owner check, for {}", dir.display()))
        }
        e => allowed(
            name,
            format!("not proven: {} for {}", errno_text(e), dir.display()),
        ),
    }
}

/// A set-user-ID file made inside the root would let any local user run it as the agent
/// user: seccomp refuses the mode bits (chmod and creation alike).
fn probe_setuid_file(grant: &RoleGrant) -> Probe {
    let name = "setuid_file";
    let Some(root) = grant.write_paths.first() else {
        return allowed(name, "not proven: no workspace root".to_string());
    };
    let path = root.join(format!(".toolwall-probe-setuid-{}", std::process::id()));
    let Some(c) = super::attest::c_path(&path) else {
        return allowed(name, format!("cannot probe {path:?}: NUL byte"));
    };
    // SAFETY: valid C strings; the fd is closed and the file removed below.
    unsafe {
        let created = libc::open(
            c.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
            0o4755 as libc::c_uint,
        );
        let create_errno = last_errno();
        if created >= 0 {
            libc::close(created);
            libc::unlink(c.as_ptr());
            return allowed(name, format!("created {} with mode 4755", path.display()));
        }
        if create_errno != libc::EPERM {
            return allowed(
                name,
                format!("not proven: creating: {}", errno_text(create_errno)),
            );
        }
        let fd = libc::open(
            c.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
            0o755 as libc::c_uint,
        );
        if fd < 0 {
            return allowed(
                name,
                format!(
                    "not proven: creating a plain file: {}",
                    errno_text(last_errno())
                ),
            );
        }
        libc::close(fd);
        let rc = libc::chmod(c.as_ptr(), 0o4755);
        let chmod_errno = last_errno();
        libc::unlink(c.as_ptr());
        if rc == 0 {
            return allowed(name, format!("chmod 4755 {} succeeded", path.display()));
        }
        if chmod_errno == libc::EPERM {
            return denied_by(
                name,
                libc::EPERM,
                "seccomp, for creating with mode 4755 and for chmod 4755",
            );
        }
        allowed(
            name,
            format!("not proven: chmod: {}", errno_text(chmod_errno)),
        )
    }
}

fn probe_sysv_shm() -> Probe {
    let name = "sysv_shm";
    // SAFETY: a private segment; removed at once should it be created.
    let id = unsafe { libc::shmget(libc::IPC_PRIVATE, 4096, libc::IPC_CREAT | 0o600) };
    if id >= 0 {
        // SAFETY: removing the segment just created.
        unsafe { libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) };
        return allowed(name, "created a System V shared memory segment".to_string());
    }
    match last_errno() {
        libc::EPERM => denied_by(name, libc::EPERM, "seccomp"),
        e => allowed(name, format!("not proven: {}", errno_text(e))),
    }
}

/// `listen()` on an unbound TCP socket binds an ephemeral port without Landlock's bind
/// check: seccomp refuses `listen`.
fn probe_listen_unbound() -> Probe {
    let name = "listen_unbound";
    // SAFETY: plain socket call; the fd is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return match last_errno() {
            libc::EPERM => denied_by(name, libc::EPERM, "seccomp: no sockets offline"),
            e => allowed(name, format!("not proven: socket: {}", errno_text(e))),
        };
    }
    // SAFETY: listen on our own socket; closed right after.
    let rc = unsafe { libc::listen(fd, 1) };
    let errno = last_errno();
    // SAFETY: closing the fd just created.
    unsafe { libc::close(fd) };
    if rc == 0 {
        return allowed(name, "listened on an unbound TCP socket".to_string());
    }
    match errno {
        libc::EPERM => denied_by(name, libc::EPERM, "seccomp"),
        e => allowed(name, format!("not proven: {}", errno_text(e))),
    }
}

fn probe_inotify() -> Probe {
    let name = "inotify";
    // SAFETY: plain call; the fd is closed below.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
    if fd >= 0 {
        // SAFETY: closing the fd just created.
        unsafe { libc::close(fd) };
        return allowed(name, "created an inotify instance".to_string());
    }
    match last_errno() {
        libc::EPERM => denied_by(name, libc::EPERM, "seccomp"),
        e => allowed(name, format!("not proven: {}", errno_text(e))),
    }
}

/// Most root-only files in `/etc` tried at once: the point is the uid, not each file.
const MAX_ROOT_ONLY_FILES: usize = 64;

/// What the workspace probes need from before confinement (Landlock then refuses to list
/// `/etc` itself).
#[derive(Debug, Clone, Default)]
pub struct WorkspaceProbeContext {
    /// The uid toolwall runs as.
    pub gateway_uid: u32,
    /// Files in `/etc` (and one level below) that neither group nor others may read.
    pub root_only_files: Vec<std::path::PathBuf>,
    /// The role's seccomp profile refuses IP datagram sockets even with TCP ports granted
    /// (a local server: Landlock's port rules cover TCP only), so `udp_socket` is probed
    /// then too.
    pub udp_refused_with_ports: bool,
}

impl WorkspaceProbeContext {
    /// Gathers the context; call before confinement.
    pub fn gather(gateway_uid: u32) -> WorkspaceProbeContext {
        use std::os::unix::fs::MetadataExt;
        let mut candidates = Vec::new();
        let mut dirs = vec![std::path::PathBuf::from("/etc")];
        let mut depth = 0;
        while depth < 2 && !dirs.is_empty() && candidates.len() < MAX_ROOT_ONLY_FILES {
            let mut next = Vec::new();
            for dir in dirs {
                let Ok(entries) = std::fs::read_dir(&dir) else {
                    continue;
                };
                for entry in entries.flatten() {
                    let path = entry.path();
                    let Ok(meta) = std::fs::symlink_metadata(&path) else {
                        continue;
                    };
                    if meta.is_dir() {
                        next.push(path);
                    } else if meta.is_file()
                        && meta.mode() & 0o044 == 0
                        && candidates.len() < MAX_ROOT_ONLY_FILES
                    {
                        candidates.push(path);
                    }
                }
            }
            dirs = next;
            depth += 1;
        }
        candidates.sort();
        WorkspaceProbeContext {
            gateway_uid,
            root_only_files: candidates,
            udp_refused_with_ports: false,
        }
    }
}

/// The files of [`WorkspaceProbeContext::root_only_files`] (`/etc/security/opasswd` and
/// the like, not hidden by Landlock): the agent user must read none. None when there are
/// none.
fn probe_read_root_only_files(candidates: &[std::path::PathBuf]) -> Option<Probe> {
    let name = "read_root_only_files";
    if candidates.is_empty() {
        return None;
    }
    for path in candidates {
        let Some(c) = super::attest::c_path(path) else {
            continue;
        };
        // SAFETY: a valid C string; the fd is closed below.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY,
            )
        };
        if fd >= 0 {
            // SAFETY: closing the fd just opened.
            unsafe { libc::close(fd) };
            return Some(allowed(
                name,
                format!("opened {} for reading", path.display()),
            ));
        }
        match last_errno() {
            libc::EACCES | libc::EPERM | libc::ENOENT => {}
            e => {
                return Some(allowed(
                    name,
                    format!("not proven: {} for {}", errno_text(e), path.display()),
                ));
            }
        }
    }
    let mut p = denied_by(name, libc::EACCES, "file permissions or landlock");
    p.detail.push_str(&format!(
        " for {} files only their owner may read (such as {})",
        candidates.len(),
        candidates[0].display()
    ));
    Some(p)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum ChildProbe {
    CreateInTmp,
    SignalGateway,
    NewUserNamespace,
    /// `getpid` with the x32 bit: EPERM is the ABI guard; ENOSYS would mean it passed the
    /// filters to a kernel without x32. In a child, because a filter above toolwall's
    /// (systemd's `SystemCallArchitectures=native`) kills the caller instead.
    X32Syscall,
}

/// Forks a child that tries one forbidden thing and exits with the errno it got (0 when it
/// succeeded). The child makes only async-signal-safe calls: threads may be running.
fn probe_in_child(name: &str, what: ChildProbe) -> Probe {
    // SAFETY: getppid cannot fail.
    let gateway = unsafe { libc::getppid() };
    let tmp_path = c"/tmp/.toolwall-child-probe";
    // SAFETY: the child only makes system calls and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: system calls on valid arguments, then _exit; no Rust runtime use.
        unsafe {
            let code = match what {
                ChildProbe::CreateInTmp => {
                    let fd = libc::open(
                        tmp_path.as_ptr(),
                        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                        0o600 as libc::c_uint,
                    );
                    if fd >= 0 {
                        libc::close(fd);
                        libc::unlink(tmp_path.as_ptr());
                        0
                    } else {
                        *libc::__errno_location()
                    }
                }
                ChildProbe::SignalGateway => {
                    if libc::syscall(libc::SYS_tgkill, gateway, gateway, 0) == 0 {
                        0
                    } else {
                        *libc::__errno_location()
                    }
                }
                ChildProbe::NewUserNamespace => {
                    // In the child only: should it succeed, the namespace dies with it.
                    if libc::unshare(libc::CLONE_NEWUSER) == 0 {
                        0
                    } else {
                        *libc::__errno_location()
                    }
                }
                ChildProbe::X32Syscall => {
                    if libc::syscall(super::attest::X32_SYSCALL_BIT | libc::SYS_getpid) >= 0 {
                        0
                    } else {
                        *libc::__errno_location()
                    }
                }
            };
            libc::_exit(code.clamp(0, 255));
        }
    }
    if pid < 0 {
        return allowed(
            name,
            format!("not proven: fork: {}", errno_text(last_errno())),
        );
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
    if rc == pid
        && what == ChildProbe::X32Syscall
        && libc::WIFSIGNALED(status)
        && libc::WTERMSIG(status) == libc::SIGSYS
    {
        return denied_by(
            name,
            libc::EPERM,
            "killed by SIGSYS: a seccomp filter above toolwall's, such as systemd's SystemCallArchitectures=native",
        );
    }
    if rc != pid || !libc::WIFEXITED(status) {
        return allowed(
            name,
            format!("not proven: child {pid} {}", reap_note(rc, pid)),
        );
    }
    let errno = libc::WEXITSTATUS(status);
    let layer = match (what, errno) {
        (ChildProbe::X32Syscall, libc::EPERM) => "seccomp ABI guard, inherited by the child",
        (ChildProbe::X32Syscall, _) => "",
        (_, libc::EACCES) => "landlock, inherited by the child",
        (ChildProbe::SignalGateway, libc::EPERM) => "landlock scope, inherited by the child",
        (_, libc::EPERM) => "seccomp, inherited by the child",
        _ => "",
    };
    if layer.is_empty() {
        let what = if errno == 0 {
            "the child succeeded".to_string()
        } else {
            format!("not proven: the child got {}", errno_text(errno))
        };
        return allowed(name, what);
    }
    denied_by(name, errno, layer)
}

fn reap_note(rc: libc::pid_t, pid: libc::pid_t) -> String {
    if rc == pid {
        "did not exit normally".to_string()
    } else {
        reap(pid)
    }
}
