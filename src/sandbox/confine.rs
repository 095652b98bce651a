//! The worker confining itself: capabilities, Landlock, no_new_privs, seccomp, in that order
//! (seccomp last, since its allow-list has neither capset nor the Landlock calls).

use std::io;

use super::capabilities::{self, CapabilitySets};
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
    // Before seccomp, whose allow-lists do not have getresuid.
    let ids = own_ids();
    // Other threads would stay unconfined whatever the kernel offers: a bug in the worker,
    // not a kernel gap, so warn mode refuses it too.
    match running_threads() {
        Ok(1) => {}
        Ok(n) => return Err(SandboxError::ThreadsRunning(n)),
        Err(e) if enforce => return Err(SandboxError::ThreadCount(e)),
        Err(e) => notes.push(format!("thread count unknown: {e}")),
    }

    let (capabilities_cleared, bounding_set_cleared) = match clear_capabilities(&mut notes) {
        Ok(bounding_empty) => (true, bounding_empty),
        Err(e) if enforce => return Err(SandboxError::Capabilities(e)),
        Err(e) => {
            notes.push(format!("capabilities not cleared: {e}"));
            (false, false)
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
        bounding_set_cleared,
        mode: mode.to_string(),
        uid: Some(ids.0),
        gid: Some(ids.1),
        probes: Vec::new(),
        notes,
    })
}

/// (uid, gid) when real, effective and saved ids agree; else the first id that differs
/// from the real one, so a report never hides a mixed identity.
pub(crate) fn own_ids() -> (u32, u32) {
    let (mut r, mut e, mut s) = (0, 0, 0);
    let (mut gr, mut ge, mut gs) = (0, 0, 0);
    // SAFETY: out-pointers to local integers.
    unsafe {
        libc::getresuid(&mut r, &mut e, &mut s);
        libc::getresgid(&mut gr, &mut ge, &mut gs);
    }
    let pick = |a: u32, b: u32, c: u32| {
        if b != a {
            b
        } else if c != a {
            c
        } else {
            a
        }
    };
    (pick(r, e, s), pick(gr, ge, gs))
}

/// Threads of this process, from /proc (read before Landlock hides it).
fn running_threads() -> io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/task")?.count())
}

/// Drops the bounding set when this process may (`CAP_SETPCAP`: a root gateway, or the
/// agent launcher), then empties the ambient, effective, permitted and inheritable sets: a
/// worker started by a root gateway otherwise keeps every capability. Returns whether the
/// bounding set is empty now; a worker of an unprivileged gateway cannot empty it, and
/// no_new_privs then keeps execve from granting any of it.
fn clear_capabilities(notes: &mut Vec<String>) -> io::Result<bool> {
    let before = CapabilitySets::current()?;
    if before.bounding != 0 && before.effective & capabilities::bit(capabilities::CAP_SETPCAP) != 0
    {
        capabilities::drop_bounding_set()?;
    }
    capabilities::clear_held()?;
    let after = CapabilitySets::current()?;
    if !after.holds_none() {
        return Err(io::Error::other(format!(
            "capabilities still held: {}",
            after.describe()
        )));
    }
    if after.bounding != 0 {
        notes.push(format!(
            "capability bounding set not empty ({} capabilities): this process had no CAP_SETPCAP to drop them; no_new_privs keeps execve from granting any",
            after.bounding.count_ones()
        ));
    }
    Ok(after.bounding == 0)
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
