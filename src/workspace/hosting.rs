//! How the gateway starts one workspace's worker: as its agent user through the agent
//! launcher, as toolwall's own user (only when configured and toolwall cannot switch
//! users), or not at all (fail closed). Pure: it fills in the worker's settings and says
//! how the supervisor must start and judge it.

use super::settings::WorkspaceWorkerSettings;
use crate::launcher::{AgentHosting, AgentPlan};
use crate::sandbox::SecretPath;
use crate::workers::supervisor::WorkerHost;

/// Probes a worker running as toolwall's own user cannot pass, and which
/// `[sandbox] run_agents_as_gateway_user = true` accepts with a warning.
pub const GATEWAY_USER_EXCEPTIONS: &[&str] = &["run_as_gateway_user", "chmod_toolwall_files"];

/// Fills in `settings` (its identity and the secrets) and returns how to start it and
/// the probes allowed to succeed. `agent_user` is the workspace's agent user name.
pub fn host(
    settings: &mut WorkspaceWorkerSettings,
    agent_user: &str,
    plan: &AgentPlan,
    secrets: &[SecretPath],
) -> (WorkerHost, Vec<String>) {
    settings.secrets = secrets.to_vec();
    settings.agent.gateway_uid = plan.gateway_uid;
    settings.agent.user = None;
    match &plan.hosting {
        AgentHosting::Launcher(_) => match plan.identity(agent_user) {
            Some((index, identity)) => {
                settings.agent.user = Some(identity.clone());
                let cgroup = plan.cgroups.workspace(&settings.id);
                settings.task_cgroups = task_cgroups(settings, cgroup);
                (
                    WorkerHost::AgentUser {
                        identity: index,
                        uid: identity.uid,
                        cgroup: cgroup.map(|c| c.worker_leaf.clone()),
                    },
                    Vec::new(),
                )
            }
            None => (
                WorkerHost::Refused(format!(
                    "workspace {}: agent user {agent_user} unknown to the launcher",
                    settings.name
                )),
                Vec::new(),
            ),
        },
        AgentHosting::GatewayUser(_) => (
            WorkerHost::Gateway,
            GATEWAY_USER_EXCEPTIONS
                .iter()
                .map(|s| s.to_string())
                .collect(),
        ),
        AgentHosting::Refused(why) => (
            WorkerHost::Refused(format!("workspace {}: {why}", settings.name)),
            Vec::new(),
        ),
        AgentHosting::Unused => (
            WorkerHost::Refused(format!(
                "workspace {}: no agent plan (internal error)",
                settings.name
            )),
            Vec::new(),
        ),
    }
}

/// Where the worker makes its tasks' cgroups and with which limits, when it may.
fn task_cgroups(
    settings: &WorkspaceWorkerSettings,
    cgroup: Option<&crate::launcher::cgroup_tree::WorkspaceCgroup>,
) -> Option<super::settings::TaskCgroups> {
    let dir = cgroup?.tasks.as_ref().ok()?.clone();
    Some(super::settings::TaskCgroups {
        dir,
        limits: crate::sandbox::cgroup::CgroupLimits {
            pids_max: Some(settings.workspace.task_max_processes),
            memory_max_bytes: settings.workspace.task_memory_max_bytes,
            cpu_weight: None,
        },
    })
}
