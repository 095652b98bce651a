//! The launcher's child: between `clone(CLONE_PARENT)` and `exec` of `toolwall worker
//! ROLE`, it becomes a worker of the gateway running as the agent user.
//!
//! `CLONE_PARENT` makes the gateway its parent: the gateway gets its SIGCHLD, reaps it,
//! may signal it by pid (no reuse before the gateway reaps it), and the worker's
//! parent-death signal fires when the gateway dies, exactly as for the workers the gateway
//! starts itself. The launcher is single-threaded, but this code still only makes system
//! calls on values prepared before the clone.

use std::ffi::CString;
use std::os::fd::RawFd;

use crate::sandbox::RPC_FD;
use crate::sandbox::capabilities;

/// Which step failed, for the launcher's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Step {
    Session = 1,
    ParentDeath = 2,
    Fds = 3,
    Rlimit = 4,
    Groups = 5,
    Gid = 6,
    Uid = 7,
    Capabilities = 8,
    NoNewPrivs = 9,
    Verify = 10,
    Exec = 11,
    Cgroup = 12,
}

impl Step {
    pub fn from_byte(b: u8) -> Option<Step> {
        Some(match b {
            1 => Step::Session,
            2 => Step::ParentDeath,
            3 => Step::Fds,
            4 => Step::Rlimit,
            5 => Step::Groups,
            6 => Step::Gid,
            7 => Step::Uid,
            8 => Step::Capabilities,
            9 => Step::NoNewPrivs,
            10 => Step::Verify,
            11 => Step::Exec,
            12 => Step::Cgroup,
            _ => return None,
        })
    }

    pub fn describe(self) -> &'static str {
        match self {
            Step::Session => "creating a session",
            Step::ParentDeath => "arming the parent-death signal (the gateway is gone)",
            Step::Fds => "placing the worker's file descriptors",
            Step::Rlimit => "setting the worker's resource limits",
            Step::Groups => "setting the supplementary groups",
            Step::Gid => "switching to the agent user's group",
            Step::Uid => "switching to the agent user",
            Step::Capabilities => "dropping capabilities",
            Step::NoNewPrivs => "setting no_new_privs",
            Step::Verify => "checking the new identity",
            Step::Exec => "executing the toolwall binary as the agent user",
            Step::Cgroup => "entering the workspace's cgroup",
        }
    }
}

/// Everything the child needs, prepared in the launcher.
pub struct ChildPlan {
    pub gateway_pid: libc::pid_t,
    pub rpc: RawFd,
    pub stdin: RawFd,
    pub devnull: RawFd,
    /// The directory of the cgroup the worker runs in (cgroups in force).
    pub cgroup: Option<RawFd>,
    /// Write end of the launcher's close-on-exec error pipe.
    pub error: RawFd,
    pub uid: libc::uid_t,
    pub gid: libc::gid_t,
    pub open_files: u64,
    pub address_space: Option<u64>,
    pub exe: CString,
    pub argv: Vec<CString>,
}

/// Where the error pipe sits in the child until exec closes it.
const FD_ERROR: RawFd = 4;

/// Runs in the child; never returns.
///
/// # Safety
/// Only in the child of `clone`, before exec: makes only system calls.
pub unsafe fn run(plan: &ChildPlan, argv: &[*const libc::c_char]) -> ! {
    // SAFETY: see the function's contract.
    let failed = unsafe { prepare(plan) };
    let (step, errno) = match failed {
        Ok(()) => {
            let envp: [*const libc::c_char; 1] = [std::ptr::null()];
            // SAFETY: NULL-terminated argv and envp prepared before the clone.
            unsafe { libc::execve(plan.exe.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
            // SAFETY: reading errno.
            (Step::Exec, unsafe { *libc::__errno_location() })
        }
        Err(e) => e,
    };
    let mut report = [0u8; 5];
    report[0] = step as u8;
    report[1..].copy_from_slice(&errno.to_ne_bytes());
    // SAFETY: writing to our own pipe, then leaving without running any Rust code.
    unsafe {
        libc::write(FD_ERROR, report.as_ptr().cast(), report.len());
        libc::_exit(127)
    }
}

/// # Safety
/// As [`run`].
unsafe fn prepare(plan: &ChildPlan) -> Result<(), (Step, i32)> {
    // SAFETY (whole body): system calls on values prepared before the clone.
    unsafe {
        let errno = || *libc::__errno_location();
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        if libc::setsid() < 0 {
            return Err((Step::Session, errno()));
        }
        // Into the workspace's cgroup while still toolwall's user (who owns it): "0" moves
        // the writer.
        if let Some(dir) = plan.cgroup {
            let procs = libc::openat(
                dir,
                c"cgroup.procs".as_ptr(),
                libc::O_WRONLY | libc::O_CLOEXEC,
            );
            if procs < 0 {
                return Err((Step::Cgroup, errno()));
            }
            let n = libc::write(procs, b"0".as_ptr().cast(), 1);
            let e = errno();
            libc::close(procs);
            if n != 1 {
                return Err((Step::Cgroup, e));
            }
        }
        // Fds: 0 the settings pipe, 1 /dev/null, 2 kept (the gateway's stderr), 3 the RPC
        // socket, 4 the error pipe (close-on-exec). Copy the sources above the range first
        // so no dup2 overwrites one still needed.
        let sources = [plan.stdin, plan.devnull, plan.rpc, plan.error];
        let mut high = [0; 4];
        for (i, fd) in sources.iter().enumerate() {
            high[i] = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 16);
            if high[i] < 0 {
                return Err((Step::Fds, errno()));
            }
        }
        for (target, fd) in [(0, high[0]), (1, high[1]), (RPC_FD, high[2])] {
            if libc::dup2(fd, target) < 0 {
                return Err((Step::Fds, errno()));
            }
        }
        if libc::dup3(high[3], FD_ERROR, libc::O_CLOEXEC) < 0 {
            return Err((Step::Fds, errno()));
        }
        if libc::syscall(libc::SYS_close_range, (FD_ERROR + 1) as u32, u32::MAX, 0u32) != 0 {
            for fd in (FD_ERROR + 1)..65536 {
                libc::close(fd);
            }
        }
        let limits = [
            (libc::RLIMIT_CORE, Some(0)),
            (libc::RLIMIT_NOFILE, Some(plan.open_files)),
            (libc::RLIMIT_AS, plan.address_space),
        ];
        for (resource, value) in limits {
            let Some(value) = value else { continue };
            let mut current: libc::rlimit = std::mem::zeroed();
            if libc::getrlimit(resource, &mut current) != 0 {
                return Err((Step::Rlimit, errno()));
            }
            let v = (value as libc::rlim_t).min(current.rlim_max);
            let limit = libc::rlimit {
                rlim_cur: v,
                rlim_max: v,
            };
            if libc::setrlimit(resource, &limit) != 0 {
                return Err((Step::Rlimit, errno()));
            }
        }
        // The bounding set goes while CAP_SETPCAP is still ours; without it the worker's
        // attestation reports the set, and no_new_privs keeps it from being used.
        let _ = capabilities::drop_bounding_set();
        let groups = [plan.gid];
        if libc::setgroups(1, groups.as_ptr()) != 0 {
            return Err((Step::Groups, errno()));
        }
        if libc::setresgid(plan.gid, plan.gid, plan.gid) != 0 {
            return Err((Step::Gid, errno()));
        }
        if libc::setresuid(plan.uid, plan.uid, plan.uid) != 0 {
            return Err((Step::Uid, errno()));
        }
        // The kernel clears the parent-death signal when the credentials change, so it is
        // armed after the switch.
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        ) != 0
        {
            return Err((Step::ParentDeath, errno()));
        }
        // CLONE_PARENT: our parent is the gateway. It may have died before the prctl.
        if libc::getppid() != plan.gateway_pid {
            return Err((Step::ParentDeath, libc::ESRCH));
        }
        // From root, the uid change cleared every capability; from a non-root launcher
        // holding CAP_SETUID the sets survive it, so they are emptied here.
        if capabilities::clear_held().is_err() {
            return Err((Step::Capabilities, errno()));
        }
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err((Step::NoNewPrivs, errno()));
        }
        let (mut r, mut e, mut s) = (0, 0, 0);
        if libc::getresuid(&mut r, &mut e, &mut s) != 0
            || [r, e, s] != [plan.uid; 3]
            || libc::getresgid(&mut r, &mut e, &mut s) != 0
            || [r, e, s] != [plan.gid; 3]
        {
            return Err((Step::Verify, libc::EPERM));
        }
        if libc::chdir(c"/".as_ptr()) != 0 {
            return Err((Step::Exec, errno()));
        }
    }
    Ok(())
}
