//! `toolwall agent-launcher`: the only toolwall process that keeps a privilege once the
//! gateway runs, and it keeps only `CAP_SETUID`, `CAP_SETGID` (to become the agent user)
//! and `CAP_SETPCAP` (to empty its children's bounding set).
//!
//! The gateway starts it before it drops its own capabilities, hands it the agent users
//! fixed at start (never changed by a reload), and then asks, one packet per worker: start
//! `toolwall worker ROLE` as agent user N with these two fds. It can do nothing else: no
//! other program, no other user, no other role than those that host agent programs. A
//! gateway taken over by an attacker gains from it what it could already ask for.

use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg, send};
use std::ffi::CString;
use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::LauncherSettings;
use super::child::{self, ChildPlan, Step};
use super::protocol::{self, SpawnAnswer, SpawnRequest};
use crate::sandbox::{self, RPC_FD, Role, capabilities};

/// Run the launcher; returns the process exit code.
pub fn run() -> i32 {
    if let Err(e) = sandbox::scrub_inherited_fds() {
        crate::error!("agent launcher: cannot close inherited fds: {e}");
        return 3;
    }
    let settings: LauncherSettings = match crate::workers::worker_main::read_settings() {
        Ok(s) => s,
        Err(e) => {
            crate::error!("agent launcher: bad or missing settings on stdin: {e}");
            return 2;
        }
    };
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    for identity in &settings.identities {
        if let Err(e) = super::identity::check(identity, uid, gid) {
            crate::error!("agent launcher: {e}");
            return 2;
        }
    }
    if let Err(e) = keep_only_what_switching_needs() {
        crate::error!("agent launcher: {e}");
        return 3;
    }
    let devnull = match std::fs::OpenOptions::new().write(true).open("/dev/null") {
        Ok(f) => OwnedFd::from(f),
        Err(e) => {
            crate::error!("agent launcher: /dev/null: {e}");
            return 2;
        }
    };
    loop {
        match serve_one(&settings, &devnull) {
            Ok(true) => {}
            // The gateway closed its end: it is gone or stopping.
            Ok(false) => return 0,
            Err(e) => {
                crate::error!("agent launcher: {e}");
                return 5;
            }
        }
    }
}

/// Keeps `CAP_SETUID`, `CAP_SETGID` and `CAP_SETPCAP` (those it holds), nothing else, and
/// nothing inheritable or ambient; empties the bounding set but for those.
fn keep_only_what_switching_needs() -> Result<(), String> {
    let sets = capabilities::CapabilitySets::current()
        .map_err(|e| format!("reading capabilities: {e}"))?;
    let wanted = capabilities::bit(capabilities::CAP_SETUID)
        | capabilities::bit(capabilities::CAP_SETGID)
        | capabilities::bit(capabilities::CAP_SETPCAP);
    if !sets.permits(capabilities::CAP_SETUID) || !sets.permits(capabilities::CAP_SETGID) {
        return Err(format!(
            "started without CAP_SETUID and CAP_SETGID ({})",
            sets.describe()
        ));
    }
    if sets.permits(capabilities::CAP_SETPCAP) {
        for cap in 0..64u32 {
            if wanted & capabilities::bit(cap) != 0 || sets.bounding & capabilities::bit(cap) == 0 {
                continue;
            }
            // SAFETY: prctl with integer arguments.
            if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } != 0 {
                return Err(format!(
                    "dropping capability {cap} from the bounding set: {}",
                    std::io::Error::last_os_error()
                ));
            }
        }
    }
    // SAFETY: prctl with integer arguments.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        );
    }
    capabilities::keep_only(sets.permitted & wanted)
        .map_err(|e| format!("dropping capabilities: {e}"))?;
    // What it executes (its children's `toolwall worker`) never gains anything either.
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(format!("no_new_privs: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// One request and its answer. `Ok(false)` at end of file.
fn serve_one(settings: &LauncherSettings, devnull: &OwnedFd) -> Result<bool, String> {
    let mut buf = [0u8; protocol::MAX_PACKET];
    let mut cmsg = nix::cmsg_space!([RawFd; protocol::REQUEST_FDS]);
    let (len, fds, truncated) = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = match recvmsg::<()>(
            RPC_FD,
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(m) => m,
            Err(nix::errno::Errno::EINTR) => return Ok(true),
            Err(e) => return Err(format!("receiving a request: {e}")),
        };
        let mut fds: Vec<OwnedFd> = Vec::new();
        for c in msg.cmsgs().map_err(|e| e.to_string())? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                for fd in raw {
                    // SAFETY: the kernel just gave us this fd; nobody else owns it.
                    fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
        }
        let truncated = msg
            .flags
            .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC);
        (msg.bytes, fds, truncated)
    };
    if len == 0 && fds.is_empty() {
        return Ok(false);
    }
    let answer = if truncated {
        SpawnAnswer::Failed {
            pid: 0,
            message: "request truncated".into(),
        }
    } else {
        match protocol::decode_request(&buf[..len]) {
            Ok(req) => spawn(settings, &req, &fds, devnull),
            Err(e) => SpawnAnswer::Failed { pid: 0, message: e },
        }
    };
    drop(fds);
    let bytes = protocol::encode_answer(&answer);
    send(RPC_FD, &bytes, MsgFlags::MSG_NOSIGNAL).map_err(|e| format!("answering: {e}"))?;
    Ok(true)
}

fn spawn(
    settings: &LauncherSettings,
    req: &SpawnRequest,
    fds: &[OwnedFd],
    devnull: &OwnedFd,
) -> SpawnAnswer {
    let failed = |message: String| SpawnAnswer::Failed { pid: 0, message };
    let role: Role = match req.role.parse() {
        Ok(r) => r,
        Err(e) => return failed(e),
    };
    if !role.runs_programs() {
        return failed(format!(
            "the {role} role runs no agent programs: the gateway starts it itself"
        ));
    }
    let Some(identity) = settings.identities.get(usize::from(req.identity)) else {
        return failed(format!("no agent user number {}", req.identity));
    };
    let (rpc, stdin, cgroup) = match fds {
        [rpc, stdin] => (rpc, stdin, None),
        [rpc, stdin, cgroup] => (rpc, stdin, Some(cgroup)),
        _ => return failed(format!("{} fds attached, expected 2 or 3", fds.len())),
    };
    let (err_read, err_write) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok(p) => p,
        Err(e) => return failed(format!("pipe: {e}")),
    };
    let argv = vec![
        c"toolwall".to_owned(),
        c"worker".to_owned(),
        CString::new(role.as_str()).unwrap_or_default(),
    ];
    let plan = ChildPlan {
        gateway_pid: settings.gateway_pid as libc::pid_t,
        rpc: rpc.as_raw_fd(),
        stdin: stdin.as_raw_fd(),
        devnull: devnull.as_raw_fd(),
        cgroup: cgroup.map(|c| c.as_raw_fd()),
        error: err_write.as_raw_fd(),
        uid: identity.uid,
        gid: identity.gid,
        open_files: settings.max_open_files.max(sandbox::MIN_OPEN_FILES),
        address_space: settings.max_address_space_bytes,
        exe: c"/proc/self/exe".to_owned(),
        argv,
    };
    let mut argv_ptrs: Vec<*const libc::c_char> = plan.argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    // SAFETY: a raw clone without CLONE_VM behaves like fork; the child runs only
    // `child::run`, which makes system calls on the plan and never returns.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (libc::CLONE_PARENT | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid == 0 {
        // SAFETY: in the child; see above.
        unsafe { child::run(&plan, &argv_ptrs) }
    }
    if pid < 0 {
        return failed(format!("clone: {}", std::io::Error::last_os_error()));
    }
    drop(err_write);
    let pid = pid as i32;
    // The child either executes (the pipe closes, nothing read) or reports its failure.
    let mut report = [0u8; 5];
    let mut got = 0;
    let mut reader = std::fs::File::from(err_read);
    loop {
        use std::io::Read;
        match reader.read(&mut report[got..]) {
            Ok(0) => break,
            Ok(n) => {
                got += n;
                if got == report.len() {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                return SpawnAnswer::Failed {
                    pid,
                    message: format!("reading the child's report: {e}"),
                };
            }
        }
    }
    if got == 0 {
        return SpawnAnswer::Started { pid };
    }
    let step = Step::from_byte(report[0]);
    let errno = i32::from_ne_bytes([report[1], report[2], report[3], report[4]]);
    let what = step.map_or("starting the worker", Step::describe);
    SpawnAnswer::Failed {
        pid,
        message: format!(
            "{what} for agent user {identity}: {}",
            std::io::Error::from_raw_os_error(errno)
        ),
    }
}
