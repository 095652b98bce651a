//! The reviewed profiles in `sandbox-profiles/`, compiled into the binary.

use serde::Deserialize;
use std::path::PathBuf;

use super::{Role, RoleGrant};
use crate::config::DEFAULT_STATE_DIR;

/// A role's seccomp profile (seccompiler JSON).
pub(super) fn seccomp_json(role: Role) -> &'static str {
    match role {
        Role::Builtin => include_str!("../../sandbox-profiles/builtin.json"),
        Role::Aggregator => include_str!("../../sandbox-profiles/aggregator.json"),
        Role::Workspace => include_str!("../../sandbox-profiles/workspace.json"),
        Role::StdioServer => include_str!("../../sandbox-profiles/stdio-server.json"),
    }
}

/// A role's Landlock grants (TOML).
pub(super) fn landlock_toml(role: Role) -> &'static str {
    match role {
        Role::Builtin => include_str!("../../sandbox-profiles/builtin.landlock.toml"),
        Role::Aggregator => include_str!("../../sandbox-profiles/aggregator.landlock.toml"),
        Role::Workspace => include_str!("../../sandbox-profiles/workspace.landlock.toml"),
        Role::StdioServer => include_str!("../../sandbox-profiles/stdio-server.landlock.toml"),
    }
}

/// `sandbox-profiles/<role>.landlock.toml`. Everything not granted is denied.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub(super) struct LandlockProfile {
    /// The Landlock ABI the rules were written and tested against.
    pub abi: i32,
    #[serde(default)]
    pub read: Vec<ReadGrant>,
    #[serde(default)]
    pub connect_tcp: Vec<PortGrant>,
    /// Read, list and execute (roles that run programs only).
    #[serde(default)]
    pub execute: Vec<ReadGrant>,
    /// Character devices under /dev opened read-write (roles that run programs only).
    #[serde(default)]
    pub device: Vec<ReadGrant>,
    /// Paths carved out of the read and execute grants whatever the config says.
    #[serde(default)]
    pub hidden: Vec<ReadGrant>,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub(super) struct ReadGrant {
    pub path: PathBuf,
    /// Who needs it and why; required, so every grant is explained.
    pub why: String,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub(super) struct PortGrant {
    pub port: u16,
    /// Who needs it and why; required, so every grant is explained.
    pub why: String,
}

/// Parses and checks a role's Landlock profile.
pub(super) fn landlock_profile(role: Role) -> Result<LandlockProfile, String> {
    parse_landlock_profile(landlock_toml(role))
        .map_err(|e| format!("sandbox-profiles/{role}.landlock.toml: {e}"))
}

pub(super) fn parse_landlock_profile(text: &str) -> Result<LandlockProfile, String> {
    let profile: LandlockProfile = toml::from_str(text).map_err(|e| e.to_string())?;
    if landlock_abi(profile.abi).is_none() {
        return Err(format!(
            "abi = {} is not a Landlock ABI this build knows",
            profile.abi
        ));
    }
    for (kind, grants) in [
        ("read", &profile.read),
        ("execute", &profile.execute),
        ("device", &profile.device),
        ("hidden", &profile.hidden),
    ] {
        for grant in grants {
            if !grant.path.is_absolute() {
                return Err(format!("{kind} path {:?} is not absolute", grant.path));
            }
            if grant.why.trim().is_empty() {
                return Err(format!("{kind} path {:?} has no `why`", grant.path));
            }
        }
    }
    for grant in &profile.device {
        // Read-write on anything but a device node would be a write grant in disguise.
        if grant.path.parent() != Some(std::path::Path::new("/dev")) {
            return Err(format!(
                "device path {:?} is not directly under /dev",
                grant.path
            ));
        }
    }
    for grant in &profile.connect_tcp {
        if grant.port == 0 {
            return Err("connect_tcp port 0 is not a port".to_string());
        }
        if grant.why.trim().is_empty() {
            return Err(format!("connect_tcp port {} has no `why`", grant.port));
        }
    }
    Ok(profile)
}

/// The crate's ABI value for a profile's `abi` number.
pub(super) fn landlock_abi(n: i32) -> Option<landlock::ABI> {
    use landlock::ABI;
    Some(match n {
        1 => ABI::V1,
        2 => ABI::V2,
        3 => ABI::V3,
        4 => ABI::V4,
        5 => ABI::V5,
        6 => ABI::V6,
        7 => ABI::V7,
        8 => ABI::V8,
        9 => ABI::V9,
        10 => ABI::V10,
        _ => return None,
    })
}

/// The role's baseline grant from its profile file. The gateway adds configured ports and
/// paths, and sets `forbidden_probe_dir` to the ledger's directory (the default here is the
/// default state directory, which must exist for the read probe to prove anything).
///
/// The embedded profiles are checked by the unit tests; should one still fail to parse,
/// the grant is empty (nothing allowed) and the error is logged.
pub fn role_grant_defaults(role: Role) -> RoleGrant {
    let forbidden_probe_dir = PathBuf::from(DEFAULT_STATE_DIR);
    match landlock_profile(role) {
        Ok(profile) => RoleGrant {
            tcp_connect_ports: profile.connect_tcp.iter().map(|g| g.port).collect(),
            read_paths: profile.read.into_iter().map(|g| g.path).collect(),
            forbidden_probe_dir,
            execute_paths: profile.execute.into_iter().map(|g| g.path).collect(),
            device_paths: profile.device.into_iter().map(|g| g.path).collect(),
            hidden_paths: profile.hidden.into_iter().map(|g| g.path).collect(),
            ..RoleGrant::default()
        },
        Err(e) => {
            crate::error!("{e}; the {role} worker gets an empty grant");
            RoleGrant {
                forbidden_probe_dir,
                ..RoleGrant::default()
            }
        }
    }
}
