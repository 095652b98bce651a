//! The seccomp filters of a role, compiled from `sandbox-profiles/<role>.json`.
//!
//! A profile holds two filters. `allow_list` answers EPERM to every syscall it does not
//! list. `enosys_list` answers ENOSYS to `clone3`, so glibc falls back to `clone`, whose
//! flags the allow-list can inspect (clone3 passes them behind a pointer).
//!
//! When two filters return the same kind of action, the kernel keeps the one from the most
//! recently installed filter. So `enosys_list` goes first, and `allow_list` (installed
//! last) lists `clone3` as allowed: ERRNO from `enosys_list` then beats ALLOW. Installing
//! `allow_list` first would also make it refuse the second `seccomp()` call.

use seccompiler::{BpfProgram, TargetArch};

use super::Role;
use super::profile::seccomp_json;

/// Name of the allow-list filter in a profile.
pub(super) const ALLOW_LIST: &str = "allow_list";
/// Name of the filter answering ENOSYS in a profile.
pub(super) const ENOSYS_LIST: &str = "enosys_list";

pub(super) struct RoleFilters {
    allow_list: BpfProgram,
    enosys_list: BpfProgram,
}

/// Compiles the role's profile for the running architecture.
pub(super) fn compile(role: Role) -> Result<RoleFilters, String> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| format!("architecture {}: {e}", std::env::consts::ARCH))?;
    let mut map = seccompiler::compile_from_json(seccomp_json(role).as_bytes(), arch)
        .map_err(|e| format!("sandbox-profiles/{role}.json: {e}"))?;
    if map.len() != 2 {
        return Err(format!(
            "sandbox-profiles/{role}.json: expected exactly the filters {ALLOW_LIST} and {ENOSYS_LIST}"
        ));
    }
    let mut take = |name: &str| {
        map.remove(name)
            .ok_or_else(|| format!("sandbox-profiles/{role}.json: no filter named {name}"))
    };
    Ok(RoleFilters {
        allow_list: take(ALLOW_LIST)?,
        enosys_list: take(ENOSYS_LIST)?,
    })
}

/// Installs both filters on the calling thread (inherited by every thread created later).
/// Also sets no_new_privs, which seccomp requires.
pub(super) fn install(filters: &RoleFilters) -> Result<(), String> {
    seccompiler::apply_filter(&filters.enosys_list)
        .map_err(|e| format!("installing {ENOSYS_LIST}: {e}"))?;
    seccompiler::apply_filter(&filters.allow_list)
        .map_err(|e| format!("installing {ALLOW_LIST}: {e}"))?;
    Ok(())
}
