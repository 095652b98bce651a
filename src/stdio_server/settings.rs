//! What the gateway hands a local server's host on its stdin: the program, its grants,
//! what to hide, who to run as, and the limits. Never a secret: the secret variables come
//! over the RPC channel (`configure`), after the host attested its confinement.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

use super::config::{DEFAULT_PATH, TMP_DIR_NAME};
use crate::aggregator::config::EraChoice;
use crate::sandbox::{
    ProgramRlimits, Role, RoleGrant, SandboxMode, SecretPath, role_grant_defaults,
};
use crate::workspace::config::Network;
use crate::workspace::settings::AgentExpectation;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HostSettings {
    pub sandbox_mode: SandboxMode,
    /// The server's name (`[servers.NAME]`).
    pub name: String,
    /// The program and its arguments, as configured.
    pub command: Vec<String>,
    /// The working directory (`None`: the private state directory).
    pub cwd: Option<PathBuf>,
    /// Plain variables (`env`).
    pub env: BTreeMap<String, String>,
    /// The server's private state directory: `HOME`, and `TMPDIR` inside it.
    pub state_dir: PathBuf,
    pub read_paths: Vec<PathBuf>,
    pub write_paths: Vec<PathBuf>,
    pub network: Network,
    /// Carved out of every read grant: toolwall's files, other servers' state, workspaces.
    pub hidden_paths: Vec<PathBuf>,
    /// The ledger's directory: the attestation proves it can be neither read nor written.
    pub forbidden_probe_dir: PathBuf,
    pub agent: AgentExpectation,
    /// The secrets the config names (hidden, each probed).
    pub secrets: Vec<SecretPath>,
    pub era: EraChoice,
    pub timeout_secs: u64,
    pub start_timeout_secs: u64,
    pub stop_grace_ms: u64,
    pub discover_timeout_ms: u64,
    pub max_processes: u64,
    pub max_file_size_bytes: u64,
    /// Longest line on stdout (`[servers] max_body_bytes`).
    pub max_body_bytes: usize,
    /// Requests to the server at once, and queued beyond them.
    pub threads: usize,
    pub queue: usize,
    /// Backoff cap between starts of a program that keeps failing.
    pub retry_max_secs: u64,
    /// stderr lines per second sent on to the gateway (the rest are counted).
    pub stderr_lines_per_sec: u32,
}

impl HostSettings {
    /// The private temp dir.
    pub fn tmp_dir(&self) -> PathBuf {
        self.state_dir.join(TMP_DIR_NAME)
    }

    /// Where the program starts.
    pub fn cwd(&self) -> PathBuf {
        self.cwd.clone().unwrap_or_else(|| self.state_dir.clone())
    }

    /// The program's `PATH`.
    pub fn path_var(&self) -> String {
        self.env
            .get("PATH")
            .cloned()
            .unwrap_or_else(|| DEFAULT_PATH.to_owned())
    }

    /// The Landlock grant: the role's profile, the private state directory and
    /// `write_paths` (every right; the state directory first, as the attestation's
    /// "root"), `read_paths` (read and execute), the `network` ports, the hidden paths.
    pub fn grant(&self) -> RoleGrant {
        let mut grant = role_grant_defaults(Role::StdioServer);
        grant.write_paths = std::iter::once(self.state_dir.clone())
            .chain(self.write_paths.iter().cloned())
            .collect();
        grant.execute_paths.extend(self.read_paths.iter().cloned());
        grant.tcp_connect_ports = self.network.ports().to_vec();
        grant.hidden_paths.extend(self.hidden_paths.iter().cloned());
        let granted: Vec<PathBuf> = grant
            .read_paths
            .iter()
            .chain(&grant.execute_paths)
            .chain(&grant.write_paths)
            .cloned()
            .collect();
        grant
            .hidden_paths
            .extend(crate::sandbox::secrets::hidden_for(&self.secrets, &granted));
        grant.secrets = self.secrets.clone();
        grant.forbidden_probe_dir = self.forbidden_probe_dir.clone();
        grant
    }

    pub fn rlimits(&self) -> ProgramRlimits {
        ProgramRlimits {
            // A server runs for as long as toolwall does: no CPU-time limit.
            cpu_secs: u64::MAX / 2,
            max_processes: self.max_processes,
            max_file_size_bytes: self.max_file_size_bytes,
        }
    }
}
