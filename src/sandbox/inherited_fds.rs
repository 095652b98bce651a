//! The worker's first act: keep only stdio and the RPC socket.

use std::io;
use std::os::fd::RawFd;

/// Where the RPC socketpair end sits in a worker.
pub const RPC_FD: RawFd = 3;

/// In the worker, first thing: closes every fd except 0, 1, 2 and the RPC socket (3),
/// checks that fd 3 is a socket, and checks that the parent-death signal is armed. The
/// signal survives exec and was armed while the gateway was alive (see `child_pre_exec`),
/// so a worker that gets past this check has a living gateway that will take it down with
/// it.
pub fn scrub_inherited_fds() -> io::Result<()> {
    close_fds_above_rpc()?;
    // SAFETY: fstat on an fd number with a valid out-pointer.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(RPC_FD, &mut stat) } != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("RPC fd {RPC_FD}: {e}")));
    }
    if stat.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("fd {RPC_FD} is not a socket; a worker is started only by the gateway"),
        ));
    }
    // The worker never executes anything; close-on-exec is one more guarantee of it.
    // SAFETY: fcntl on an open fd.
    if unsafe { libc::fcntl(RPC_FD, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut signal: libc::c_int = 0;
    // SAFETY: PR_GET_PDEATHSIG writes one int through the pointer.
    if unsafe {
        libc::prctl(
            libc::PR_GET_PDEATHSIG,
            &mut signal as *mut libc::c_int,
            0,
            0,
            0,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    if signal != libc::SIGKILL {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "parent-death signal is {signal}, not SIGKILL; a worker is started only by the gateway"
            ),
        ));
    }
    Ok(())
}

fn close_fds_above_rpc() -> io::Result<()> {
    let first = (RPC_FD + 1) as libc::c_uint;
    // SAFETY: close_range takes plain integers; closing fds nobody in this fresh process
    // owns yet (the worker calls this before creating any).
    let rc = unsafe { libc::syscall(libc::SYS_close_range, first, libc::c_uint::MAX, 0) };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::ENOSYS) {
        return Err(err);
    }
    // Kernels before 5.9: list the fds, then close them.
    let mut open = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd")? {
        let name = entry?.file_name();
        if let Some(fd) = name.to_str().and_then(|s| s.parse::<RawFd>().ok())
            && fd > RPC_FD
        {
            open.push(fd);
        }
    }
    for fd in open {
        // SAFETY: see above; EBADF (the listing's own fd, already closed) is harmless.
        unsafe { libc::close(fd) };
    }
    Ok(())
}
