//! Running untrusted programs as the agent user: never as root, never as toolwall's own
//! user. See `README.md` here.
//!
//! - [`identity`]: the agent user (lookup, checks, creating the default one as root).
//! - [`plan`]: what the gateway decides at start: switch users through the launcher, run
//!   as toolwall's own user (only when configured), or keep agent programs off.
//! - [`client`] (gateway side) and [`server`] (the `toolwall agent-launcher` process),
//!   speaking [`protocol`]; [`child`] is the launcher's child between clone and exec.
//!
//! Any host of agent programs (the workspace worker, local MCP servers) is started through
//! [`client::Launcher::spawn`] as `toolwall worker ROLE`, runs as the agent user from its
//! first instruction, confines itself, and applies
//! [`crate::sandbox::ProgramWalls`] to each program it starts.

pub mod cgroup_tree;
pub mod child;
pub mod client;
pub mod identity;
pub mod plan;
pub mod protocol;
pub mod server;

pub use client::{Launcher, SpawnError};
pub use identity::{AgentIdentity, DEFAULT_AGENT_USER};
pub use plan::{AgentHosting, AgentPlan};

use serde::{Deserialize, Serialize};

/// What the launcher reads on its stdin at start (JSON): fixed for its whole life.
#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct LauncherSettings {
    /// The gateway: the parent of every worker the launcher starts.
    pub gateway_pid: u32,
    /// The agent users it may switch to, by index.
    pub identities: Vec<AgentIdentity>,
    /// RLIMIT_NOFILE of each worker.
    pub max_open_files: u64,
    /// RLIMIT_AS of each worker, when set.
    pub max_address_space_bytes: Option<u64>,
}
