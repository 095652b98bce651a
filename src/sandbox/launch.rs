//! The parent's half of starting a worker: what runs between fork and exec.

use nix::errno::Errno;
use nix::sys::resource::{Resource, getrlimit, rlim_t, setrlimit};
use std::io;
use std::os::fd::RawFd;

use super::SandboxConfig;
use super::inherited_fds::RPC_FD;

/// Smallest RLIMIT_NOFILE a worker gets, whatever the config says: below it the worker
/// could not open its own poll fd, eventfd and a few connections.
pub const MIN_OPEN_FILES: u64 = 16;

/// Builds the closure for `Command::pre_exec` that prepares a worker between fork and exec:
/// a new session (no controlling terminal, out of the gateway's process group), the
/// parent-death signal (SIGKILL), the RPC socket moved to fd 3 without close-on-exec, and
/// rlimits (open files, core size 0, address space when configured).
///
/// Everything is computed here, in the parent; the closure itself only makes
/// async-signal-safe system calls and never allocates. The parent-death signal follows the
/// thread that forks, so spawn workers from a thread that lives as long as the gateway (the
/// gateway's one loop thread).
///
/// ```ignore
/// let mut cmd = std::process::Command::new("/proc/self/exe");
/// cmd.arg("worker").arg("builtin").env_clear();
/// // SAFETY: the closure is async-signal-safe (see child_pre_exec).
/// unsafe { cmd.pre_exec(child_pre_exec(worker_end.as_raw_fd(), &cfg.sandbox)) };
/// ```
pub fn child_pre_exec(
    rpc_fd: RawFd,
    cfg: &SandboxConfig,
) -> impl FnMut() -> io::Result<()> + Send + Sync + 'static {
    let parent_pid = std::process::id() as libc::pid_t;
    let open_files = cfg.max_open_files.max(MIN_OPEN_FILES);
    let address_space = cfg.max_address_space_bytes;
    move || {
        // SAFETY: runs in the forked child before exec; it only makes system calls on
        // values computed before the fork.
        unsafe { prepare_child(rpc_fd, parent_pid, open_files, address_space) }
    }
}

/// # Safety
/// Only between fork and exec; async-signal-safe (no allocation, no locks).
unsafe fn prepare_child(
    rpc_fd: RawFd,
    parent_pid: libc::pid_t,
    open_files: u64,
    address_space: Option<u64>,
) -> io::Result<()> {
    // SAFETY (whole body): plain system calls with valid arguments.
    unsafe {
        if libc::setsid() < 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        ) != 0
        {
            return Err(io::Error::last_os_error());
        }
        // The gateway may have died between fork and the prctl: then nobody would kill us.
        if libc::getppid() != parent_pid {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        if rpc_fd < 0 {
            return Err(io::Error::from_raw_os_error(libc::EBADF));
        }
        if rpc_fd == RPC_FD {
            // dup2 onto itself would keep close-on-exec set.
            if libc::fcntl(RPC_FD, libc::F_SETFD, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
        } else if libc::dup2(rpc_fd, RPC_FD) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    set_limit(Resource::RLIMIT_CORE, 0)?;
    set_limit(Resource::RLIMIT_NOFILE, open_files)?;
    if let Some(bytes) = address_space {
        set_limit(Resource::RLIMIT_AS, bytes)?;
    }
    Ok(())
}

/// Sets soft and hard limit to `value`; an unprivileged parent cannot raise the hard
/// limit, so the value is then lowered to the current hard limit.
/// Async-signal-safe: only getrlimit/setrlimit.
fn set_limit(resource: Resource, value: u64) -> io::Result<()> {
    let value = value as rlim_t;
    match setrlimit(resource, value, value) {
        Ok(()) => return Ok(()),
        Err(Errno::EPERM) => {}
        Err(e) => return Err(io::Error::from_raw_os_error(e as i32)),
    }
    let (_, hard) = getrlimit(resource).map_err(|e| io::Error::from_raw_os_error(e as i32))?;
    let capped = value.min(hard);
    setrlimit(resource, capped, capped).map_err(|e| io::Error::from_raw_os_error(e as i32))
}
