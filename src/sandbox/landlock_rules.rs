//! The Landlock ruleset of a worker: every filesystem right and TCP bind/connect handled
//! (so denied unless granted), signals and abstract unix sockets scoped to the worker.

use landlock::{
    Access, AccessFs, AccessNet, BitFlags, NetPort, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope,
};
use std::collections::BTreeSet;
use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;

use super::carve::carve_hidden;

use super::profile::{landlock_abi, landlock_profile};
use super::report::LandlockState;
use super::{Role, RoleGrant};

/// The Landlock ABI of the running kernel; 0 when Landlock is absent or disabled.
pub(super) fn kernel_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: the version query takes no attribute pointer.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if v < 0 { 0 } else { v as i32 }
}

/// Restricts the calling thread (and every thread and child it creates later). Also sets
/// no_new_privs. Missing paths are skipped with a note; hidden paths are carved out of the
/// read and execute grants (see [`carve_hidden`]).
pub(super) fn restrict(
    role: Role,
    grant: &RoleGrant,
    notes: &mut Vec<String>,
) -> Result<LandlockState, String> {
    let profile = landlock_profile(role)?;
    let abi =
        landlock_abi(profile.abi).ok_or_else(|| format!("profile abi {} unknown", profile.abi))?;
    let err = |stage: &str, e: landlock::RulesetError| format!("{stage}: {e}");

    let mut ruleset = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .map_err(|e| err("filesystem rights", e))?;
    let net = AccessNet::from_all(abi);
    if !net.is_empty() {
        ruleset = ruleset
            .handle_access(net)
            .map_err(|e| err("network rights", e))?;
    }
    let scopes = Scope::from_all(abi);
    if !scopes.is_empty() {
        ruleset = ruleset.scope(scopes).map_err(|e| err("scopes", e))?;
    }
    let mut created = ruleset.create().map_err(|e| err("create", e))?;

    let read_paths = carve_hidden(&grant.read_paths, &grant.hidden_paths, notes)?;
    let execute_paths = carve_hidden(&grant.execute_paths, &grant.hidden_paths, notes)?;
    let read_dir = AccessFs::ReadFile | AccessFs::ReadDir;
    // (paths, rights on a directory, rights on a file, what the grant is called)
    type RuleSet<'a> = (
        &'a [PathBuf],
        BitFlags<AccessFs>,
        BitFlags<AccessFs>,
        &'a str,
    );
    let rule_sets: [RuleSet; 4] = [
        (&read_paths, read_dir, AccessFs::ReadFile.into(), "read"),
        (
            &execute_paths,
            read_dir | AccessFs::Execute,
            AccessFs::ReadFile | AccessFs::Execute,
            "execute",
        ),
        (
            &grant.device_paths,
            AccessFs::ReadFile.into(),
            AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate,
            "device",
        ),
        (
            &grant.write_paths,
            AccessFs::from_all(abi),
            AccessFs::from_file(abi),
            "write",
        ),
    ];
    for (paths, dir_access, file_access, kind) in rule_sets {
        for path in paths {
            let meta = match std::fs::metadata(path) {
                Ok(meta) => meta,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    notes.push(format!(
                        "{kind} path {} is missing; not granted",
                        path.display()
                    ));
                    continue;
                }
                Err(e) => return Err(format!("{kind} path {}: {e}", path.display())),
            };
            if kind == "device" && !meta.file_type().is_char_device() {
                return Err(format!(
                    "device path {} is not a character device",
                    path.display()
                ));
            }
            let access = if meta.is_dir() {
                dir_access
            } else {
                file_access
            };
            let fd =
                PathFd::new(path).map_err(|e| format!("{kind} path {}: {e}", path.display()))?;
            created = created
                .add_rule(PathBeneath::new(fd, access))
                .map_err(|e| err("path rule", e))?;
        }
    }
    if !net.is_empty() {
        let ports: BTreeSet<u16> = grant.tcp_connect_ports.iter().copied().collect();
        for port in ports {
            created = created
                .add_rule(NetPort::new(port, AccessNet::ConnectTcp))
                .map_err(|e| err("connect rule", e))?;
        }
    }
    let status = created
        .restrict_self()
        .map_err(|e| err("restrict_self", e))?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => LandlockState::FullyEnforced,
        RulesetStatus::PartiallyEnforced => LandlockState::PartiallyEnforced,
        RulesetStatus::NotEnforced => LandlockState::NotEnforced,
    })
}
