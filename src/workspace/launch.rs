//! Starting a command as a task: a small leader process per task, then the shell under it.
//!
//! The worker forks the **leader** (no exec: it runs the few system calls below and
//! nothing else, so forking from the threaded worker is safe: no allocation, no lock).
//! The leader
//! 1. moves its pipes to fds 0-4 and closes every other fd (the worker's RPC socket above
//!    all);
//! 2. becomes a child subreaper, so every process the task starts stays its descendant,
//!    even one that double-forks or calls `setsid`;
//! 3. enters a new Landlock domain that only scopes signals: from there `kill(-1, sig)`
//!    reaches exactly the processes of this task, and nothing else (not the worker, not
//!    other tasks, not the gateway);
//! 4. applies the program walls ([`ProgramWalls`]: the task's rlimits, the programs'
//!    seccomp filter) and forks the shell, which joins a process group of its own,
//!    enters one more scoped domain (so the task cannot signal its leader), and execs
//!    `/bin/sh -c COMMAND` in the workspace root with the configured environment;
//! 5. waits: a byte `T` on its control pipe sends SIGTERM to every process of the task, `K`
//!    sends SIGKILL, end of file (the worker died) sends SIGKILL (after SIGTERM and the
//!    spec's `eof_grace`, when it has one). When the shell exits, it kills what the task
//!    left behind, reaps all of it, writes the shell's wait status on its status pipe and
//!    exits.
//!
//! A local MCP server (`crate::stdio_server`) is started the same way, with its program
//! executed directly ([`LaunchSpec::program`]) and a pipe of its host as its stdin.
//!
//! The status pipe carries the shell's pid (4 bytes) as soon as it runs, then its wait
//! status (4 bytes), native byte order. When the second number arrives, every process of
//! the task is gone.
//!
//! Without Landlock signal scoping (kernel before 6.12, warn mode), `kill(-1)` would reach
//! every process of the user, so the leader then signals the shell's process group only.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::sandbox::ProgramWalls;

/// The shell every command runs in.
pub const SHELL: &str = "/bin/sh";

/// A command ready to start: everything the leader needs, prepared before the fork.
pub struct LaunchSpec<'w> {
    /// The task's `cgroup.procs`, when it has a cgroup of its own: the leader moves
    /// itself there first.
    pub cgroup_procs: Option<OwnedFd>,
    /// On end of file of the control pipe: SIGTERM, then SIGKILL this much later (zero:
    /// SIGKILL at once).
    pub eof_grace: std::time::Duration,
    shell: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
    cwd: CString,
    walls: &'w ProgramWalls,
}

impl<'w> LaunchSpec<'w> {
    /// `env`: `NAME=value` entries. Fails on a NUL byte anywhere.
    pub fn new(
        command: &str,
        cwd: &Path,
        env: &[String],
        walls: &'w ProgramWalls,
    ) -> Result<LaunchSpec<'w>, String> {
        let c =
            |s: &[u8], what: &str| CString::new(s).map_err(|_| format!("{what} holds a NUL byte"));
        Ok(LaunchSpec {
            shell: c(SHELL.as_bytes(), "shell")?,
            argv: vec![
                c(b"sh", "argv")?,
                c(b"-c", "argv")?,
                c(command.as_bytes(), "the command")?,
            ],
            envp: env
                .iter()
                .map(|e| c(e.as_bytes(), "the environment"))
                .collect::<Result<_, _>>()?,
            cwd: c(cwd.as_os_str().as_bytes(), "the root")?,
            walls,
            cgroup_procs: None,
            eof_grace: std::time::Duration::ZERO,
        })
    }

    /// `program` (a path) executed directly with `argv` (its first entry is the name it
    /// is called by), in `cwd`, with exactly `env` (`NAME=value`).
    pub fn program(
        program: &Path,
        argv: &[String],
        cwd: &Path,
        env: &[String],
        walls: &'w ProgramWalls,
    ) -> Result<LaunchSpec<'w>, String> {
        let c =
            |s: &[u8], what: &str| CString::new(s).map_err(|_| format!("{what} holds a NUL byte"));
        Ok(LaunchSpec {
            shell: c(program.as_os_str().as_bytes(), "the program")?,
            argv: argv
                .iter()
                .map(|a| c(a.as_bytes(), "an argument"))
                .collect::<Result<_, _>>()?,
            envp: env
                .iter()
                .map(|e| c(e.as_bytes(), "the environment"))
                .collect::<Result<_, _>>()?,
            cwd: c(cwd.as_os_str().as_bytes(), "the working directory")?,
            walls,
            cgroup_procs: None,
            eof_grace: std::time::Duration::ZERO,
        })
    }
}

/// The worker's ends of a started task.
#[derive(Debug)]
pub struct Launched {
    pub leader: libc::pid_t,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// Shell pid, then wait status (4 bytes each).
    pub status: OwnedFd,
    /// `T` (SIGTERM) or `K` (SIGKILL) to every process of the task.
    pub control: OwnedFd,
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: a valid array of two fds.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh fds nobody else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: fcntl on an fd we own.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Starts `spec` as a task. `stdin` is what the command reads: `/dev/null` opened
/// read-write for a workspace command, the read end of a pipe for a local server.
pub fn launch(spec: &LaunchSpec, stdin: &OwnedFd) -> io::Result<Launched> {
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let (status_r, status_w) = pipe()?;
    let (ctl_r, ctl_w) = pipe()?;
    for fd in [&out_r, &err_r, &status_r, &ctl_w] {
        set_nonblocking(fd)?;
    }
    let mut argv: Vec<*const libc::c_char> = spec.argv.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = spec.envp.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    let child_fds = [
        stdin.as_raw_fd(),
        out_w.as_raw_fd(),
        err_w.as_raw_fd(),
        ctl_r.as_raw_fd(),
        status_w.as_raw_fd(),
    ];
    let shell = Exec {
        path: spec.shell.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        cwd: spec.cwd.as_ptr(),
    };
    let eof_grace_ms = i64::try_from(spec.eof_grace.as_millis()).unwrap_or(i64::MAX);
    // SAFETY: the child runs only `leader_main`, which makes async-signal-safe system
    // calls on values prepared above and never returns.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: in the forked child; see leader_main.
        unsafe {
            leader_main(
                child_fds,
                &shell,
                spec.walls,
                spec.cgroup_procs.as_ref().map_or(-1, |f| f.as_raw_fd()),
                eof_grace_ms,
            )
        }
    }
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    // The child's ends close here; the leader holds its own copies.
    drop((out_w, err_w, status_w, ctl_r));
    Ok(Launched {
        leader: pid,
        stdout: out_r,
        stderr: err_r,
        status: status_r,
        control: ctl_w,
    })
}

/// Pointers for execve, valid while the spec lives (the fork copies them).
struct Exec {
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: *const libc::c_char,
}

const FD_CONTROL: RawFd = 3;
/// Signals a leader ignores (and its shell gets back at their default).
const STOP_SIGNALS: [libc::c_int; 4] = [libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGTERM];
const FD_STATUS: RawFd = 4;

/// Leader exit codes when it cannot set the task up (the worker reports a lost task).
const EXIT_SETUP: i32 = 121;

/// A Landlock domain that handles no access right and only scopes signals and abstract
/// unix sockets. 0 on success.
///
/// # Safety
/// Plain system calls; async-signal-safe.
unsafe fn restrict_scoped() -> libc::c_long {
    #[repr(C)]
    struct RulesetAttr {
        handled_access_fs: u64,
        handled_access_net: u64,
        scoped: u64,
    }
    const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1;
    const SCOPE_SIGNAL: u64 = 2;
    let attr = RulesetAttr {
        handled_access_fs: 0,
        handled_access_net: 0,
        scoped: SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL,
    };
    // SAFETY: a valid attribute struct of the size given; the fd is closed below.
    unsafe {
        let fd = libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &attr as *const RulesetAttr,
            std::mem::size_of::<RulesetAttr>(),
            0u32,
        );
        if fd < 0 {
            return -1;
        }
        let rc = libc::syscall(libc::SYS_landlock_restrict_self, fd as libc::c_int, 0u32);
        libc::close(fd as libc::c_int);
        rc
    }
}

/// # Safety
/// Async-signal-safe.
unsafe fn write_all(fd: RawFd, bytes: &[u8]) {
    let mut done = 0;
    while done < bytes.len() {
        // SAFETY: a valid buffer range.
        let n = unsafe { libc::write(fd, bytes[done..].as_ptr().cast(), bytes.len() - done) };
        if n > 0 {
            done += n as usize;
        } else if n < 0 && unsafe { *libc::__errno_location() } == libc::EINTR {
            continue;
        } else {
            return;
        }
    }
}

/// The leader: see the module documentation. Never returns.
///
/// # Safety
/// Only in the child of `fork`; makes only async-signal-safe calls (no allocation).
unsafe fn leader_main(
    fds: [RawFd; 5],
    shell: &Exec,
    walls: &ProgramWalls,
    cgroup_procs: RawFd,
    eof_grace_ms: i64,
) -> ! {
    // SAFETY (whole body): system calls on valid, pre-built arguments.
    unsafe {
        // Into the task's cgroup first, so everything it starts is born there.
        if cgroup_procs >= 0 && libc::write(cgroup_procs, b"0".as_ptr().cast(), 1) != 1 {
            write_all(fds[2], b"toolwall: cannot enter the task's cgroup\n");
            libc::_exit(EXIT_SETUP);
        }
        // Fds 0..4 = /dev/null, stdout, stderr, control, status. Copy them above the range
        // first so no dup2 overwrites a source still needed.
        let mut high = [0; 5];
        for (i, fd) in fds.iter().enumerate() {
            high[i] = libc::fcntl(*fd, libc::F_DUPFD, 16);
            if high[i] < 0 {
                libc::_exit(EXIT_SETUP);
            }
        }
        for (i, fd) in high.iter().enumerate() {
            if libc::dup2(*fd, i as RawFd) < 0 {
                libc::_exit(EXIT_SETUP);
            }
        }
        if libc::syscall(libc::SYS_close_range, 5u32, u32::MAX, 0u32) != 0 {
            for fd in 5..65536 {
                libc::close(fd);
            }
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        // Only SIGKILL or its control pipe ends a leader: a signal to the worker's process
        // group must not leave the task without the one process that can clean it up.
        for sig in STOP_SIGNALS {
            libc::signal(sig, libc::SIG_IGN);
        }
        if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
            libc::_exit(EXIT_SETUP);
        }
        let scoped = restrict_scoped() == 0;
        if let Err((step, errno)) = walls.apply() {
            write_all(2, step.message());
            let _ = errno;
            libc::_exit(EXIT_SETUP);
        }
        let leader = libc::getpid();
        let child = libc::fork();
        if child == 0 {
            shell_main(leader, scoped, shell);
        }
        if child < 0 {
            libc::_exit(EXIT_SETUP);
        }
        // The child makes its group itself, but the pid is reported (and a stop may signal
        // the group) at once: make it here too, so the group exists before anyone hears
        // of it. An error means the child did it first (or has exec'd, after doing it).
        libc::setpgid(child, child);
        // Only the shell writes the output pipes now.
        libc::close(0);
        libc::close(1);
        libc::close(2);
        write_all(FD_STATUS, &child.to_ne_bytes());
        let terminate = |sig: libc::c_int| {
            if scoped {
                // Every process in this task's domain, and none outside it.
                libc::kill(-1, sig);
            }
            libc::kill(-child, sig);
        };
        let pidfd = libc::syscall(libc::SYS_pidfd_open, child, 0u32) as libc::c_int;
        let mut poll_ms = if pidfd >= 0 { 1000 } else { 50 };
        let mut control_open = true;
        let mut shell_status: Option<libc::c_int> = None;
        // Milliseconds on the monotonic clock when a graceful stop turns into SIGKILL.
        let mut kill_at: Option<i64> = None;
        let now_ms = || {
            let mut ts: libc::timespec = std::mem::zeroed();
            libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
            ts.tv_sec as i64 * 1000 + ts.tv_nsec as i64 / 1_000_000
        };
        loop {
            if let Some(at) = kill_at
                && now_ms() >= at
            {
                kill_at = None;
                terminate(libc::SIGKILL);
            }
            let mut poll_fds = [
                libc::pollfd {
                    fd: if control_open { FD_CONTROL } else { -1 },
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: pidfd,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            libc::poll(poll_fds.as_mut_ptr(), 2, poll_ms);
            if control_open && poll_fds[0].revents != 0 {
                let mut buf = [0u8; 16];
                let n = libc::read(FD_CONTROL, buf.as_mut_ptr().cast(), buf.len());
                if n == 0 || (n < 0 && *libc::__errno_location() != libc::EINTR) {
                    // The worker is gone: so is the task (gracefully, when it may be).
                    control_open = false;
                    if eof_grace_ms > 0 {
                        terminate(libc::SIGTERM);
                        kill_at = Some(now_ms().saturating_add(eof_grace_ms));
                        poll_ms = 20;
                    } else {
                        terminate(libc::SIGKILL);
                    }
                } else if n > 0 {
                    for byte in &buf[..n as usize] {
                        match byte {
                            b'T' => terminate(libc::SIGTERM),
                            b'K' => terminate(libc::SIGKILL),
                            _ => {}
                        }
                    }
                }
            }
            // Reap the shell and any orphan that came to us as subreaper.
            loop {
                let mut status = 0;
                let r = libc::waitpid(-1, &mut status, libc::WNOHANG);
                if r <= 0 {
                    break;
                }
                if r == child {
                    shell_status = Some(status);
                }
            }
            if shell_status.is_some() {
                break;
            }
        }
        // What the task left behind goes with it.
        terminate(libc::SIGKILL);
        loop {
            let mut status = 0;
            let r = libc::waitpid(-1, &mut status, 0);
            if r < 0 && *libc::__errno_location() == libc::EINTR {
                continue;
            }
            if r < 0 {
                break;
            }
        }
        write_all(FD_STATUS, &shell_status.unwrap_or(0).to_ne_bytes());
        libc::_exit(0);
    }
}

/// The shell's side of the fork. Never returns.
///
/// # Safety
/// Only in the child of the leader's fork; async-signal-safe.
unsafe fn shell_main(leader: libc::pid_t, scoped: bool, shell: &Exec) -> ! {
    /// # Safety
    /// Async-signal-safe.
    unsafe fn fail(message: &[u8], code: i32) -> ! {
        // SAFETY: writing a static message to stderr, then leaving.
        unsafe {
            write_all(2, message);
            libc::_exit(code)
        }
    }
    // SAFETY (whole body): system calls on valid, pre-built arguments.
    unsafe {
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        ) != 0
            || libc::getppid() != leader
        {
            libc::_exit(EXIT_SETUP);
        }
        if libc::setpgid(0, 0) != 0 {
            fail(b"toolwall: cannot create the task's process group\n", 126);
        }
        // One more domain: the task may not signal its leader.
        if scoped && restrict_scoped() != 0 {
            fail(b"toolwall: cannot scope the task's signals\n", 126);
        }
        // Dispositions set to ignore survive exec: give the command the defaults.
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        for sig in STOP_SIGNALS {
            libc::signal(sig, libc::SIG_DFL);
        }
        libc::close(FD_CONTROL);
        libc::close(FD_STATUS);
        if libc::chdir(shell.cwd) != 0 {
            fail(b"toolwall: cannot enter the working directory\n", 126);
        }
        libc::execve(shell.path, shell.argv, shell.envp);
        if *libc::__errno_location() == libc::EACCES {
            fail(
                b"toolwall: cannot run the program: permission denied (outside the granted paths?)\n",
                126,
            );
        }
        fail(b"toolwall: cannot run the program\n", 127);
    }
}
