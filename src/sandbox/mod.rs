//! TEMPORARY interface shim until the sandbox branch lands (replaced wholesale on merge).

use serde::{Deserialize, Serialize};
use std::os::fd::RawFd;
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SandboxMode {
    #[default]
    Enforce,
    Warn,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxConfig {
    pub mode: SandboxMode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Builtin,
    Aggregator,
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "builtin" => Ok(Role::Builtin),
            "aggregator" => Ok(Role::Aggregator),
            _ => Err(format!("unknown worker role {s:?}")),
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Builtin => "builtin",
            Role::Aggregator => "aggregator",
        })
    }
}

#[derive(Debug, Clone, Default)]
pub struct RoleGrant {
    pub tcp_connect_ports: Vec<u16>,
    pub read_paths: Vec<PathBuf>,
    pub forbidden_probe_dir: PathBuf,
}

pub fn role_grant_defaults(_role: Role) -> RoleGrant {
    RoleGrant::default()
}

/// # Safety
/// Async-signal-safe calls only.
pub unsafe fn child_pre_exec(rpc_fd: RawFd, _cfg: &SandboxConfig) -> std::io::Result<()> {
    if unsafe { libc::dup2(rpc_fd, 3) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

pub fn scrub_inherited_fds() -> std::io::Result<()> {
    Ok(())
}

#[derive(Debug)]
pub struct SandboxError(pub String);

pub fn confine(
    role: Role,
    _grant: &RoleGrant,
    mode: SandboxMode,
) -> Result<ConfinementReport, SandboxError> {
    Ok(ConfinementReport {
        role: role.to_string(),
        landlock_abi: 0,
        landlock: "not_enforced".into(),
        seccomp: false,
        no_new_privs: false,
        mode: format!("{mode:?}").to_lowercase(),
        probes: vec![],
    })
}

pub fn attest(_role: Role, _grant: &RoleGrant, report: &mut ConfinementReport) {
    let _ = report;
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ConfinementReport {
    pub role: String,
    pub landlock_abi: i32,
    pub landlock: String,
    pub seccomp: bool,
    pub no_new_privs: bool,
    pub mode: String,
    pub probes: Vec<Probe>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Probe {
    pub name: String,
    pub denied: bool,
    pub detail: String,
}

impl ConfinementReport {
    pub fn verdict(&self, _mode: SandboxMode) -> Result<Vec<String>, String> {
        Ok(vec!["sandbox not built yet".into()])
    }
}
