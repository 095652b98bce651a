//! The worker confining itself: capabilities, Landlock, no_new_privs, seccomp, in that order
//! (seccomp last, since its allow-list has neither capset nor the Landlock calls).

use std::io;

use super::report::LandlockState;
use super::{
    ConfinementReport, Role, RoleGrant, SandboxError, SandboxMode, landlock_rules, profile,
    seccomp_filter,
};

/// In the worker, before any thread starts: clears capabilities, applies the role's
/// Landlock ruleset (writes only under `grant.write_paths`, which only the workspace role
/// has; reads only the granted paths minus `grant.hidden_paths`; TCP connect only to
/// `grant.tcp_connect_ports`; no TCP bind; signals and abstract unix sockets scoped to the
/// worker), sets no_new_privs, then installs the role's seccomp filters.
///
/// `enforce`: any gap is an error and the worker must exit. `warn`: what cannot be applied
/// is recorded in the report's notes and fields, and the rest still applies. Threads
/// already running are an error in both modes.
/// Call [`super::attest`] afterwards for the probes.
pub fn confine(
    role: Role,
    grant: &RoleGrant,
    mode: SandboxMode,
) -> Result<ConfinementReport, SandboxError> {
    let enforce = mode == SandboxMode::Enforce;
    // Both profiles are checked before anything is applied.
    let filters = seccomp_filter::compile(role).map_err(SandboxError::Profile)?;
    profile::landlock_profile(role).map_err(SandboxError::Profile)?;

    let mut notes = Vec::new();
    // Other threads would stay unconfined whatever the kernel offers: a bug in the worker,
    // not a kernel gap, so warn mode refuses it too.
    match running_threads() {
        Ok(1) => {}
        Ok(n) => return Err(SandboxError::ThreadsRunning(n)),
        Err(e) if enforce => return Err(SandboxError::ThreadCount(e)),
        Err(e) => notes.push(format!("thread count unknown: {e}")),
    }

    let capabilities_cleared = match clear_capabilities() {
        Ok(()) => true,
        Err(e) if enforce => return Err(SandboxError::Capabilities(e)),
        Err(e) => {
            notes.push(format!("capabilities not cleared: {e}"));
            false
        }
    };

    let landlock_abi = landlock_rules::kernel_abi();
    let landlock = match landlock_rules::restrict(role, grant, &mut notes) {
        Ok(state) => state,
        Err(e) if enforce => return Err(SandboxError::Landlock(e)),
        Err(e) => {
            notes.push(format!("landlock failed: {e}"));
            LandlockState::NotEnforced
        }
    };
    if enforce && landlock != LandlockState::FullyEnforced {
        return Err(SandboxError::Landlock(format!(
            "ruleset {} (kernel ABI {landlock_abi}); sandbox mode \"warn\" runs workers anyway",
            landlock.as_str()
        )));
    }

    let no_new_privs = match set_no_new_privs() {
        Ok(()) => true,
        Err(e) if enforce => return Err(SandboxError::NoNewPrivs(e)),
        Err(e) => {
            notes.push(format!("no_new_privs: {e}"));
            false
        }
    };

    let offline = grant.tcp_connect_ports.is_empty();
    let seccomp = match seccomp_filter::install(&filters, offline) {
        Ok(()) => true,
        Err(e) if enforce => return Err(SandboxError::Seccomp(e)),
        Err(e) => {
            notes.push(format!("seccomp: {e}"));
            false
        }
    };

    Ok(ConfinementReport {
        role: role.to_string(),
        landlock_abi,
        landlock: landlock.as_str().to_string(),
        seccomp,
        no_new_privs,
        capabilities_cleared,
        mode: mode.to_string(),
        probes: Vec::new(),
        notes,
    })
}

/// Threads of this process, from /proc (read before Landlock hides it).
fn running_threads() -> io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/task")?.count())
}

/// Empties the effective, permitted and inheritable sets (and with them the ambient set).
/// A worker started by a root gateway otherwise keeps every capability.
fn clear_capabilities() -> io::Result<()> {
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct CapData {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let empty = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: version 3 takes a header and two data structs, both valid for the call.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header, empty.as_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_no_new_privs() -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1 {
            return Err(io::Error::other("PR_GET_NO_NEW_PRIVS does not read back 1"));
        }
    }
    Ok(())
}
