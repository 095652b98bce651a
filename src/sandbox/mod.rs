//! Worker confinement: what a worker may do, how it is locked down, and the proof it gives.
//!
//! The gateway starts a worker as a re-exec of its own binary. The order is fixed:
//! 1. parent side, in `Command::pre_exec`: [`child_pre_exec`] (new session, parent-death
//!    signal, RPC socket at fd 3, rlimits);
//! 2. worker side, first thing: [`scrub_inherited_fds`];
//! 3. worker side, before any thread starts: [`confine`] (capabilities cleared, Landlock,
//!    no_new_privs, seccomp), then [`attest`], whose probes go into the ready message;
//! 4. gateway side: [`ConfinementReport::verdict`] decides whether the worker gets work.
//!
//! The rules are reviewed data in `sandbox-profiles/` (seccomp allow-lists in seccompiler's
//! JSON, Landlock grants in TOML), compiled into the binary.

mod abi_guard;
mod attest;
pub mod capabilities;
mod carve;
pub mod cgroup;
mod confine;
mod inherited_fds;
mod landlock_rules;
mod launch;
mod observe;
mod profile;
pub mod program_walls;
mod report;
mod seccomp_filter;
pub mod secrets;
mod workspace_probes;

#[cfg(test)]
mod tests;

pub use attest::{REQUIRED_PROBES, attest, c_path, probes_allowed_by_design, required_probes};
pub use carve::carve_hidden;
pub use confine::confine;
pub use inherited_fds::{RPC_FD, scrub_inherited_fds};
pub use launch::{MIN_OPEN_FILES, child_pre_exec};
pub use observe::{ObservedProcess, observe_process};
pub use profile::role_grant_defaults;
pub use program_walls::{ProgramRlimits, ProgramWalls};
pub use report::{ConfinementReport, LandlockState, Probe};
pub use secrets::SecretPath;
pub use workspace_probes::{WORKSPACE_PROBES, WorkspaceProbeContext, attest_workspace};

use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// `[sandbox]` in the config file.
#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxConfig {
    /// `enforce`: a worker whose confinement is incomplete gets no work. `warn`: it works,
    /// and the gap is reported loudly (for kernels without Landlock).
    pub mode: SandboxMode,
    /// RLIMIT_NOFILE of each worker (soft and hard).
    pub max_open_files: u64,
    /// RLIMIT_AS of each worker in bytes; none by default (thread stacks reserve a lot of
    /// address space they never touch, so a tight value breaks the thread pool).
    pub max_address_space_bytes: Option<u64>,
    /// The user agent programs (workspace commands) run as, unless a workspace names its
    /// own `agent_user`. Never root, never toolwall's own user or group.
    pub agent_user: String,
    /// When toolwall cannot switch users (it runs as a user without `CAP_SETUID` and
    /// `CAP_SETGID`): `false` keeps workspaces offline (fail closed); `true` runs agent
    /// programs as toolwall's own user, loudly reported.
    pub run_agents_as_gateway_user: bool,
    /// cgroup v2 limits of workspaces and local servers: `auto` uses toolwall's delegated
    /// cgroup when it has one (else rlimits only, and status says so); `required` keeps
    /// workspaces and local servers offline without one; `off` never touches cgroups.
    pub cgroups: CgroupMode,
}

/// `[sandbox] cgroups`.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum CgroupMode {
    #[default]
    Auto,
    Required,
    Off,
}

/// Default of `[sandbox] max_open_files`.
pub const DEFAULT_MAX_OPEN_FILES: u64 = 1024;

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            mode: SandboxMode::Enforce,
            max_open_files: DEFAULT_MAX_OPEN_FILES,
            max_address_space_bytes: None,
            agent_user: crate::launcher::DEFAULT_AGENT_USER.to_string(),
            run_agents_as_gateway_user: false,
            cgroups: CgroupMode::Auto,
        }
    }
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SandboxMode {
    #[default]
    Enforce,
    Warn,
}

impl SandboxMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::Enforce => "enforce",
            SandboxMode::Warn => "warn",
        }
    }
}

impl fmt::Display for SandboxMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SandboxMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "enforce" => Ok(SandboxMode::Enforce),
            "warn" => Ok(SandboxMode::Warn),
            other => Err(format!(
                "unknown sandbox mode {other:?} (expected \"enforce\" or \"warn\")"
            )),
        }
    }
}

/// The kind of worker; each has its own profile in `sandbox-profiles/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// The built-in tools (HTTP fetches, echo).
    Builtin,
    /// External MCP servers reached over HTTP.
    Aggregator,
    /// Shell and file tools in one workspace: runs programs (fork and exec are its job),
    /// writes only under the workspace root.
    Workspace,
    /// One local MCP server (`[servers.NAME] command`): runs its program and speaks MCP to
    /// it over its stdin and stdout; writes only its private state directory and
    /// `write_paths`.
    StdioServer,
}

impl Role {
    pub const ALL: [Role; 4] = [
        Role::Builtin,
        Role::Aggregator,
        Role::Workspace,
        Role::StdioServer,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Builtin => "builtin",
            Role::Aggregator => "aggregator",
            Role::Workspace => "workspace",
            Role::StdioServer => "stdio-server",
        }
    }

    /// Whether the role runs programs: its seccomp profile is then a deny-list (the
    /// programs are arbitrary) instead of an allow-list, and its attestation expects
    /// fork, spawn and exec to succeed.
    pub fn runs_programs(self) -> bool {
        matches!(self, Role::Workspace | Role::StdioServer)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "builtin" => Ok(Role::Builtin),
            "aggregator" => Ok(Role::Aggregator),
            "workspace" => Ok(Role::Workspace),
            "stdio-server" => Ok(Role::StdioServer),
            other => Err(format!(
                "unknown worker role {other:?} (expected \"builtin\", \"aggregator\", \"workspace\" or \"stdio-server\")"
            )),
        }
    }
}

/// What one worker instance may do, decided by the gateway from the config and handed to
/// the worker before it confines itself (serde, so it can travel as an argument or message).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RoleGrant {
    /// TCP ports the worker may connect to (any address: Landlock filters by port only).
    pub tcp_connect_ports: Vec<u16>,
    /// Files and directories the worker may read (directories: their whole subtree).
    /// Missing paths are skipped and noted in the report.
    pub read_paths: Vec<PathBuf>,
    /// An existing directory the worker must not read (the ledger's); the attestation
    /// proves it cannot be read or written.
    pub forbidden_probe_dir: PathBuf,
    /// Directories the worker may read, list and execute from (directories: their whole
    /// subtree). The workspace role's system directories and `read_only_paths`.
    #[serde(default)]
    pub execute_paths: Vec<PathBuf>,
    /// Directories granted every right: read, write, create, remove, rename, execute.
    /// The workspace root; empty for every other role.
    #[serde(default)]
    pub write_paths: Vec<PathBuf>,
    /// Character devices the worker may open for reading and writing (`/dev/null`).
    #[serde(default)]
    pub device_paths: Vec<PathBuf>,
    /// Paths carved out of `read_paths` and `execute_paths`: a granted directory that
    /// holds one is granted entry by entry instead, without it (the config, the ledger,
    /// the admin socket, other workspaces).
    #[serde(default)]
    pub hidden_paths: Vec<PathBuf>,
    /// Secrets the config names (also in `hidden_paths`): the attestation tries to read
    /// each one (`read_secret:*`).
    #[serde(default)]
    pub secrets: Vec<SecretPath>,
}

/// Why a worker could not be confined. In enforce mode any of these is fatal.
#[derive(Debug)]
pub enum SandboxError {
    /// An embedded profile does not parse or compile for this architecture.
    Profile(String),
    /// Threads were already running: confinement would cover only the calling thread.
    ThreadsRunning(usize),
    /// The thread count could not be read from /proc.
    ThreadCount(std::io::Error),
    /// Capabilities could not be cleared.
    Capabilities(std::io::Error),
    /// The Landlock ruleset failed or is not fully enforced.
    Landlock(String),
    /// `PR_SET_NO_NEW_PRIVS` failed.
    NoNewPrivs(std::io::Error),
    /// The seccomp filter could not be installed.
    Seccomp(String),
}

impl fmt::Display for SandboxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SandboxError::Profile(m) => write!(f, "sandbox profile: {m}"),
            SandboxError::ThreadsRunning(n) => write!(
                f,
                "{n} threads running before confinement; a worker must confine itself before starting threads"
            ),
            SandboxError::ThreadCount(e) => write!(f, "counting threads in /proc/self/task: {e}"),
            SandboxError::Capabilities(e) => write!(f, "clearing capabilities failed: {e}"),
            SandboxError::Landlock(m) => write!(f, "landlock: {m}"),
            SandboxError::NoNewPrivs(e) => write!(f, "PR_SET_NO_NEW_PRIVS failed: {e}"),
            SandboxError::Seccomp(m) => write!(f, "seccomp: {m}"),
        }
    }
}

impl std::error::Error for SandboxError {}
