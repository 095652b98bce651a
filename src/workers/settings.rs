//! What the gateway tells a worker at start, through a pipe on its stdin (read to EOF
//! before confinement; the environment stays empty): the role's grant and tool settings.
//! Never a secret: upstream credentials travel over the RPC channel after confinement.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

use crate::sandbox::{RoleGrant, SandboxMode, SecretPath};
use crate::tools::http::HttpToolsConfig;

/// `Default` is what a worker of a role that reads its own settings (the workspace role
/// reads `WorkspaceWorkerSettings` instead) carries in its spec: nothing granted.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WorkerSettings {
    pub sandbox_mode: SandboxMode,
    pub tcp_connect_ports: Vec<u16>,
    pub read_paths: Vec<PathBuf>,
    pub forbidden_probe_dir: PathBuf,
    pub threads: usize,
    pub queue: usize,
    pub http: HttpToolsConfig,
    /// The secrets the config names: hidden, and each tried by the attestation.
    #[serde(default)]
    pub secrets: Vec<SecretPath>,
}

impl WorkerSettings {
    pub fn grant(&self) -> RoleGrant {
        RoleGrant {
            tcp_connect_ports: self.tcp_connect_ports.clone(),
            read_paths: self.read_paths.clone(),
            forbidden_probe_dir: self.forbidden_probe_dir.clone(),
            hidden_paths: crate::sandbox::secrets::hidden_for(&self.secrets, &self.read_paths),
            secrets: self.secrets.clone(),
            ..RoleGrant::default()
        }
    }
}
