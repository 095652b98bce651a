//! What the gateway hands a workspace worker on its stdin: the workspace, what to hide
//! from it, and the sandbox mode. Never a secret.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

use super::config::WorkspaceConfig;
use super::paths::TMP_DIR_NAME;
use super::tasks::TaskLimits;
use crate::sandbox::ProgramRlimits;
use crate::sandbox::{Role, RoleGrant, SandboxMode, role_grant_defaults};

/// `PATH` of commands unless the workspace's `env` sets one.
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceWorkerSettings {
    pub sandbox_mode: SandboxMode,
    /// `wrk_...`
    pub id: String,
    pub name: String,
    /// The workspace, its `root` canonical.
    pub workspace: WorkspaceConfig,
    /// Carved out of every read grant: the config files, the ledger's directory, the admin
    /// socket, token and key files, other workspaces' roots.
    pub hidden_paths: Vec<PathBuf>,
    /// The ledger's directory: the attestation proves it can be neither read nor written.
    pub forbidden_probe_dir: PathBuf,
    /// Who the worker and its programs must run as.
    #[serde(default)]
    pub agent: AgentExpectation,
    /// The secrets the config names: hidden (unless a directory holds a granted path,
    /// then its files), and each tried by the attestation.
    #[serde(default)]
    pub secrets: Vec<crate::sandbox::SecretPath>,
    /// Where each task gets a cgroup of its own, when cgroups are in force and the agent
    /// user may make them.
    #[serde(default)]
    pub task_cgroups: Option<TaskCgroups>,
}

/// The parent of a workspace's task cgroups (writable by its agent user) and the limits
/// of each task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskCgroups {
    pub dir: PathBuf,
    pub limits: crate::sandbox::cgroup::CgroupLimits,
}

/// The identity a host of agent programs must have, checked by the worker itself before
/// it does anything and reported in its attestation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentExpectation {
    /// The agent user. `None`: the worker runs as toolwall's own user, which the
    /// configuration allowed (`[sandbox] run_agents_as_gateway_user`).
    pub user: Option<crate::launcher::AgentIdentity>,
    /// The uid toolwall runs as.
    pub gateway_uid: u32,
}

impl WorkspaceWorkerSettings {
    pub fn root(&self) -> &std::path::Path {
        &self.workspace.root
    }

    /// The worker's private temp dir.
    pub fn tmp_dir(&self) -> PathBuf {
        self.workspace.root.join(TMP_DIR_NAME)
    }

    /// The Landlock grant: the role's profile, plus the root (every right), the
    /// `read_only_paths` (read and execute), the `network` ports, and the hidden paths.
    pub fn grant(&self) -> RoleGrant {
        let mut grant = role_grant_defaults(Role::Workspace);
        grant.write_paths = vec![self.workspace.root.clone()];
        // The worker makes its tasks' cgroups there (and programs may change their own
        // task's limits, never the workspace's).
        grant
            .write_paths
            .extend(self.task_cgroups.iter().map(|t| t.dir.clone()));
        grant
            .execute_paths
            .extend(self.workspace.read_only_paths.iter().cloned());
        grant.tcp_connect_ports = self.workspace.network.ports().to_vec();
        grant.hidden_paths.extend(self.hidden_paths.iter().cloned());
        let granted: Vec<PathBuf> = grant
            .read_paths
            .iter()
            .chain(&grant.execute_paths)
            .cloned()
            .collect();
        grant
            .hidden_paths
            .extend(crate::sandbox::secrets::hidden_for(&self.secrets, &granted));
        grant.secrets = self.secrets.clone();
        grant.forbidden_probe_dir = self.forbidden_probe_dir.clone();
        grant
    }

    /// The environment of every command: the configured variables over the defaults.
    pub fn task_env(&self) -> Vec<String> {
        let root = self.workspace.root.to_string_lossy().into_owned();
        let tmp = self.tmp_dir().to_string_lossy().into_owned();
        let mut env: std::collections::BTreeMap<String, String> = [
            ("PATH", DEFAULT_PATH.to_string()),
            ("HOME", root.clone()),
            ("PWD", root),
            ("TMPDIR", tmp.clone()),
            ("TMP", tmp.clone()),
            ("TEMP", tmp),
            ("LANG", "C.UTF-8".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        for (k, v) in &self.workspace.env {
            env.insert(k.clone(), v.clone());
        }
        env.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
    }

    pub fn task_limits(&self) -> TaskLimits {
        let w = &self.workspace;
        TaskLimits {
            max_tasks: w.max_tasks,
            output_cap_bytes: w.output_cap_bytes,
            retention: Duration::from_secs(w.task_retention_secs),
            max_runtime: Duration::from_secs(w.task_max_runtime_secs),
            cancel_grace: Duration::from_millis(w.cancel_grace_ms),
            preview_bytes: w.preview_bytes,
        }
    }

    pub fn rlimits(&self) -> ProgramRlimits {
        ProgramRlimits {
            cpu_secs: self.workspace.task_cpu_secs,
            max_processes: self.workspace.task_max_processes,
            max_file_size_bytes: self.workspace.task_max_file_size_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace::config::Network;

    #[test]
    fn grant_and_environment_follow_the_workspace() {
        let mut workspace = WorkspaceConfig {
            root: "/srv/ws".into(),
            network: Network::Ports(vec![443]),
            read_only_paths: vec!["/opt/rust".into()],
            ..WorkspaceConfig::default()
        };
        workspace
            .env
            .insert("PATH".into(), "/opt/rust/bin:/usr/bin".into());
        workspace
            .env
            .insert("CARGO_HOME".into(), "/srv/ws/.cargo".into());
        let s = WorkspaceWorkerSettings {
            sandbox_mode: SandboxMode::Enforce,
            id: "wrk_000000000000".into(),
            name: "ws".into(),
            workspace,
            hidden_paths: vec!["/etc/toolwall".into()],
            forbidden_probe_dir: "/var/lib/toolwall".into(),
            agent: AgentExpectation::default(),
            secrets: Vec::new(),
            task_cgroups: None,
        };
        let g = s.grant();
        assert_eq!(g.write_paths, vec![PathBuf::from("/srv/ws")]);
        assert!(g.execute_paths.contains(&PathBuf::from("/usr")));
        assert!(g.execute_paths.contains(&PathBuf::from("/opt/rust")));
        assert_eq!(g.tcp_connect_ports, vec![443]);
        assert!(g.hidden_paths.contains(&PathBuf::from("/etc/toolwall")));
        assert!(
            g.hidden_paths.contains(&PathBuf::from("/etc/shadow")),
            "profile default"
        );
        let env = s.task_env();
        assert!(env.contains(&"PATH=/opt/rust/bin:/usr/bin".to_string()));
        assert!(env.contains(&"CARGO_HOME=/srv/ws/.cargo".to_string()));
        assert!(env.contains(&"TMPDIR=/srv/ws/.toolwall-tmp".to_string()));
        assert!(env.contains(&"HOME=/srv/ws".to_string()));
        let round: WorkspaceWorkerSettings =
            serde_json::from_str(&serde_json::to_string(&s).expect("json")).expect("back");
        assert_eq!(round.workspace, s.workspace);
    }
}
