//! The seccomp filters of a role, compiled from `sandbox-profiles/<role>.json`.
//!
//! A profile of a role that runs no programs holds two filters. `allow_list` answers EPERM
//! to every syscall it does not list. `enosys_list` answers ENOSYS to `clone3`, so glibc
//! falls back to `clone`, whose flags the allow-list can inspect (clone3 passes them behind
//! a pointer).
//!
//! The workspace role runs arbitrary programs, which inherit its filters, so no allow-list
//! can fit them: its profile holds `deny_list` (EPERM to what no workspace program may do:
//! namespaces, mounts, ptrace, unix and raw sockets, acting on other processes, ...),
//! `enosys_list`, and `offline_list` (no IPv4/IPv6 socket at all), installed only when the
//! workspace has no network.
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
/// Name of the deny-list filter of a role that runs programs.
pub(super) const DENY_LIST: &str = "deny_list";
/// Name of the filter a role that runs programs adds when it has no network.
pub(super) const OFFLINE_LIST: &str = "offline_list";
/// Name of the filter a role that runs programs installs in each program's process (the
/// task leader), on top of its own: what programs may not do but the worker needs.
pub(super) const PROGRAMS_ENOSYS_LIST: &str = "programs_enosys_list";

/// The filter names a role's profile must hold, exactly.
pub(super) fn filter_names(role: Role) -> &'static [&'static str] {
    if role.runs_programs() {
        &[DENY_LIST, ENOSYS_LIST, OFFLINE_LIST, PROGRAMS_ENOSYS_LIST]
    } else {
        &[ALLOW_LIST, ENOSYS_LIST]
    }
}

pub(super) struct RoleFilters {
    /// Refuses x32 and out-of-table numbers, kills foreign architectures (see
    /// [`super::abi_guard`]).
    abi_guard: BpfProgram,
    /// The allow-list, or for a role that runs programs, the deny-list.
    allow_list: BpfProgram,
    enosys_list: BpfProgram,
    /// Only for roles that run programs: installed when the grant has no TCP port.
    offline_list: Option<BpfProgram>,
    /// Only for roles that run programs: installed by each program's leader, not here.
    pub(super) programs_list: Option<BpfProgram>,
}

/// The filter a program host (the workspace's task leader) installs in each program's
/// process, on top of the worker's: compiled here, installed with
/// [`super::program_walls::ProgramWalls`]. Errors for a role that runs no programs.
pub fn programs_filter(role: Role) -> Result<BpfProgram, String> {
    compile(role)?
        .programs_list
        .ok_or_else(|| format!("the {role} role runs no programs"))
}

/// Compiles the role's profile for the running architecture.
pub(super) fn compile(role: Role) -> Result<RoleFilters, String> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| format!("architecture {}: {e}", std::env::consts::ARCH))?;
    let mut map = seccompiler::compile_from_json(seccomp_json(role).as_bytes(), arch)
        .map_err(|e| format!("sandbox-profiles/{role}.json: {e}"))?;
    let abi_guard = super::abi_guard::program()?;
    let names = filter_names(role);
    if map.len() != names.len() {
        return Err(format!(
            "sandbox-profiles/{role}.json: expected exactly the filters {}",
            names.join(", ")
        ));
    }
    let mut take = |name: &str| {
        map.remove(name)
            .ok_or_else(|| format!("sandbox-profiles/{role}.json: no filter named {name}"))
    };
    if role.runs_programs() {
        Ok(RoleFilters {
            abi_guard,
            allow_list: take(DENY_LIST)?,
            enosys_list: take(ENOSYS_LIST)?,
            offline_list: Some(take(OFFLINE_LIST)?),
            programs_list: Some(take(PROGRAMS_ENOSYS_LIST)?),
        })
    } else {
        Ok(RoleFilters {
            abi_guard,
            allow_list: take(ALLOW_LIST)?,
            enosys_list: take(ENOSYS_LIST)?,
            offline_list: None,
            programs_list: None,
        })
    }
}

/// Installs the filters on the calling thread (inherited by every thread and child
/// created later); `offline` adds the role's offline filter when it has one. Also sets
/// no_new_privs, which seccomp requires.
pub(super) fn install(filters: &RoleFilters, offline: bool) -> Result<(), String> {
    seccompiler::apply_filter(&filters.abi_guard)
        .map_err(|e| format!("installing the ABI guard: {e}"))?;
    seccompiler::apply_filter(&filters.enosys_list)
        .map_err(|e| format!("installing {ENOSYS_LIST}: {e}"))?;
    if offline && let Some(offline_list) = &filters.offline_list {
        seccompiler::apply_filter(offline_list)
            .map_err(|e| format!("installing {OFFLINE_LIST}: {e}"))?;
    }
    seccompiler::apply_filter(&filters.allow_list)
        .map_err(|e| format!("installing the main filter: {e}"))?;
    Ok(())
}
