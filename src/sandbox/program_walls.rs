//! The walls an untrusted program gets on top of the confinement of the worker that hosts
//! it (which it inherits: Landlock, the role's seccomp filters, no_new_privs, the agent
//! uid). Applied in the program's own process tree between fork and exec, by a process
//! that then runs nothing but the program:
//!
//! - the role's programs filter (`programs_enosys_list` in the role's seccomp profile):
//!   what programs may not do but the host needs (the workspace's file tools use
//!   `openat2`, whose mode seccomp cannot read);
//! - resource limits (CPU seconds, processes, file size), only ever lowered;
//! - a cgroup of its own, where the gateway has a delegated cgroup (see
//!   [`super::cgroup`]).
//!
//! Everything is prepared in [`ProgramWalls::new`]; [`ProgramWalls::apply`] only makes
//! system calls on what was prepared, so it is async-signal-safe and may run in a child
//! forked from a threaded process. The workspace's task leader uses it; so can any other
//! host of untrusted programs (local MCP servers).

use seccompiler::{BpfProgram, sock_filter};

use super::Role;

/// Resource limits of a program and everything it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgramRlimits {
    /// RLIMIT_CPU (soft; the hard limit is [`CPU_HARD_EXTRA_SECS`] more, SIGKILL).
    pub cpu_secs: u64,
    /// RLIMIT_NPROC: processes of the agent user, counted by the kernel per user.
    pub max_processes: u64,
    /// RLIMIT_FSIZE: largest file written (SIGXFSZ beyond).
    pub max_file_size_bytes: u64,
}

/// Grace between SIGXCPU (soft limit) and SIGKILL (hard limit) for CPU time.
pub const CPU_HARD_EXTRA_SECS: u64 = 5;

/// Which step of [`ProgramWalls::apply`] failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WallStep {
    Rlimit,
    Seccomp,
    Cgroup,
}

impl WallStep {
    /// A static message for a process that can no longer allocate.
    pub fn message(self) -> &'static [u8] {
        match self {
            WallStep::Rlimit => b"toolwall: cannot set the program's resource limits\n",
            WallStep::Seccomp => b"toolwall: cannot install the program's seccomp filter\n",
            WallStep::Cgroup => b"toolwall: cannot enter the program's cgroup\n",
        }
    }
}

/// Everything prepared; see the module documentation.
pub struct ProgramWalls {
    filter: BpfProgram,
    /// (resource, soft, hard)
    rlimits: Vec<(libc::__rlimit_resource_t, u64, u64)>,
}

#[repr(C)]
struct SockFprog {
    len: libc::c_ushort,
    filter: *const sock_filter,
}

impl ProgramWalls {
    /// The walls of a program hosted by a worker of `role`.
    pub fn new(role: Role, limits: ProgramRlimits) -> Result<ProgramWalls, String> {
        let filter = super::seccomp_filter::programs_filter(role)?;
        if filter.is_empty() || filter.len() > usize::from(u16::MAX) {
            return Err(format!(
                "the {role} programs filter has {} instructions",
                filter.len()
            ));
        }
        Ok(ProgramWalls {
            filter,
            rlimits: vec![
                (
                    libc::RLIMIT_CPU,
                    limits.cpu_secs,
                    limits.cpu_secs.saturating_add(CPU_HARD_EXTRA_SECS),
                ),
                (
                    libc::RLIMIT_NPROC,
                    limits.max_processes,
                    limits.max_processes,
                ),
                (
                    libc::RLIMIT_FSIZE,
                    limits.max_file_size_bytes,
                    limits.max_file_size_bytes,
                ),
            ],
        })
    }

    /// Applies the walls to the calling process (inherited by everything it starts):
    /// limits first (only lowered: an unprivileged process cannot raise a hard limit), then
    /// the programs filter (no_new_privs is already set by the host's confinement).
    ///
    /// # Safety
    /// Only in a child between fork and exec, or in a single-threaded process: it makes
    /// only async-signal-safe system calls and never allocates.
    pub unsafe fn apply(&self) -> Result<(), (WallStep, i32)> {
        // SAFETY (whole body): system calls on values prepared in `new`.
        unsafe {
            for &(resource, soft, hard) in &self.rlimits {
                let mut current: libc::rlimit = std::mem::zeroed();
                if libc::getrlimit(resource, &mut current) != 0 {
                    return Err((WallStep::Rlimit, *libc::__errno_location()));
                }
                let hard = (hard as libc::rlim_t).min(current.rlim_max);
                let soft = (soft as libc::rlim_t).min(hard);
                let limit = libc::rlimit {
                    rlim_cur: soft,
                    rlim_max: hard,
                };
                if libc::setrlimit(resource, &limit) != 0 {
                    return Err((WallStep::Rlimit, *libc::__errno_location()));
                }
            }
            let prog = SockFprog {
                len: self.filter.len() as libc::c_ushort,
                filter: self.filter.as_ptr(),
            };
            const SECCOMP_SET_MODE_FILTER: libc::c_uint = 1;
            if libc::syscall(
                libc::SYS_seccomp,
                SECCOMP_SET_MODE_FILTER,
                0 as libc::c_uint,
                &prog as *const SockFprog,
            ) != 0
            {
                return Err((WallStep::Seccomp, *libc::__errno_location()));
            }
        }
        Ok(())
    }
}
