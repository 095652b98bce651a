//! What the gateway decides at start about agent programs, before it starts a thread.
//!
//! - toolwall can switch users (root, or `CAP_SETUID` and `CAP_SETGID` as the shipped
//!   unit grants): every agent user is resolved (the default `toolwall-agent` is created
//!   when root runs without it), checked, and the launcher starts with them.
//! - it cannot, and `[sandbox] run_agents_as_gateway_user = true`: agent programs run as
//!   toolwall's own user, and every report and `toolwall status` says so loudly.
//! - it cannot, and that key is false (the default): hosts of agent programs stay offline,
//!   and the reason is logged and shown (fail closed).
//!
//! Then a gateway that is not root drops every capability it holds (the launcher keeps
//! what it needs): nothing the gateway or its other workers run can use one.

use serde_json::{Value, json};
use std::collections::BTreeSet;

use super::client::Launcher;
use super::identity::{self, AgentIdentity};
use crate::config::Config;
use crate::sandbox::capabilities::{self, CapabilitySets};

/// How agent programs are hosted.
pub enum AgentHosting {
    /// No workspace (nothing runs agent programs).
    Unused,
    /// Through the launcher, as the agent users.
    Launcher(Launcher),
    /// As toolwall's own user: configured, and toolwall cannot switch users.
    GatewayUser(String),
    /// Not at all, and why.
    Refused(String),
}

pub struct AgentPlan {
    pub hosting: AgentHosting,
    /// The workspaces' cgroups, or why there are none.
    pub cgroups: super::cgroup_tree::CgroupTree,
    /// The agent users, in the launcher's order.
    pub identities: Vec<AgentIdentity>,
    pub gateway_uid: u32,
    pub gateway_gid: u32,
    /// What happened at start worth saying in status (user created, capabilities dropped).
    pub notes: Vec<String>,
}

/// The agent user of each workspace and each local server: its own `agent_user`, else
/// `[sandbox] agent_user`.
pub fn agent_user_names(config: &Config) -> BTreeSet<String> {
    let workspaces = config.workspaces.0.values().map(|ws| ws.agent_user.clone());
    let servers = config
        .servers
        .enabled()
        .filter(|(_, s)| s.is_local())
        .map(|(_, s)| s.local.agent_user.clone());
    workspaces
        .chain(servers)
        .map(|u| u.unwrap_or_else(|| config.sandbox.agent_user.clone()))
        .collect()
}

/// Whether any enabled server is a local program.
fn has_local_servers(config: &Config) -> bool {
    config.servers.enabled().any(|(_, s)| s.is_local())
}

/// One note per agent user that several workspaces share: Unix permissions cannot keep
/// them apart, only Landlock can, and Landlock does not cover metadata changes.
pub fn shared_user_notes(config: &Config) -> Vec<String> {
    let mut by_user: std::collections::BTreeMap<String, Vec<&str>> = Default::default();
    for (name, ws) in &config.workspaces.0 {
        let user = ws
            .agent_user
            .clone()
            .unwrap_or_else(|| config.sandbox.agent_user.clone());
        by_user.entry(user).or_default().push(name);
    }
    by_user
        .into_iter()
        .filter(|(_, names)| names.len() > 1)
        .map(|(user, names)| {
            format!(
                "workspaces {} share the agent user {user}: their programs cannot read or write each other's files, but can change their mode and times; set agent_user per workspace to separate them",
                names.join(", ")
            )
        })
        .collect()
}

impl AgentPlan {
    /// Decides, starts the launcher when it can, then drops this process's capabilities
    /// when it is not root. Call before any thread starts: capabilities are per thread.
    pub fn prepare(config: &Config) -> AgentPlan {
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let mut plan = AgentPlan {
            hosting: AgentHosting::Unused,
            cgroups: super::cgroup_tree::CgroupTree::Off("no workspace and no local server".into()),
            identities: Vec::new(),
            gateway_uid: uid,
            gateway_gid: gid,
            notes: Vec::new(),
        };
        let names = agent_user_names(config);
        if !names.is_empty() {
            plan.hosting = plan.decide(config, &names);
        }
        if let Some(why) = &plan.cgroups_refusal(config) {
            plan.hosting = AgentHosting::Refused(why.clone());
        }
        for note in shared_user_notes(config) {
            crate::warn!("{note}");
            plan.notes.push(note);
        }
        match &plan.hosting {
            AgentHosting::Unused => {}
            AgentHosting::Launcher(l) => crate::info!(
                "agent programs run as {} (agent launcher pid {})",
                plan.identities
                    .iter()
                    .map(|i| i.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                l.pid()
            ),
            AgentHosting::GatewayUser(why) => crate::warn!("{why}"),
            AgentHosting::Refused(why) => crate::error!("{why}"),
        }
        match &plan.cgroups {
            super::cgroup_tree::CgroupTree::InForce {
                layout,
                controllers,
                ..
            } => crate::info!(
                "cgroup limits in force for workspaces and local servers under {} ({})",
                layout.service.display(),
                controllers.join(", ")
            ),
            super::cgroup_tree::CgroupTree::Off(reason)
                if !config.workspaces.0.is_empty() || has_local_servers(config) =>
            {
                crate::warn!(
                    "cgroup limits are not in force ({reason}): workspaces and local servers are bounded by rlimits only, and RLIMIT_NPROC counts every process of their agent user"
                )
            }
            super::cgroup_tree::CgroupTree::Off(_) => {}
        }
        if uid != 0 {
            plan.drop_own_capabilities();
        }
        plan
    }

    fn decide(&mut self, config: &Config, names: &BTreeSet<String>) -> AgentHosting {
        let sets = CapabilitySets::current().unwrap_or_default();
        let can_switch =
            sets.permits(capabilities::CAP_SETUID) && sets.permits(capabilities::CAP_SETGID);
        if !can_switch {
            let why = format!(
                "toolwall runs as uid {} without CAP_SETUID and CAP_SETGID, so it cannot run agent programs as their agent user ({})",
                self.gateway_uid,
                names.iter().cloned().collect::<Vec<_>>().join(", ")
            );
            return if config.sandbox.run_agents_as_gateway_user {
                self.cgroups = super::cgroup_tree::build(
                    config,
                    &self.cgroup_requests(config, false),
                    has_local_servers(config),
                );
                AgentHosting::GatewayUser(format!(
                    "{why}: they run as toolwall's own uid {} ([sandbox] run_agents_as_gateway_user = true), and can change the metadata of toolwall's files and read what toolwall's user may read beyond Landlock's reach",
                    self.gateway_uid
                ))
            } else {
                AgentHosting::Refused(format!(
                    "{why}: workspaces stay offline. Run toolwall as root or under the shipped systemd unit (which grants those capabilities to its agent launcher only), or set [sandbox] run_agents_as_gateway_user = true to run them as toolwall's own user"
                ))
            };
        }
        for name in names {
            let identity = match identity::lookup(name) {
                Ok(Some(i)) => i,
                Ok(None) if identity::may_create(name, self.gateway_uid) => {
                    match identity::create_default_user() {
                        Ok(i) => {
                            let note = format!(
                                "created the system user {i} for agent programs: workspace commands run as it, never as root"
                            );
                            crate::info!("{note}");
                            self.notes.push(note);
                            i
                        }
                        Err(e) => return AgentHosting::Refused(e),
                    }
                }
                Ok(None) => {
                    return AgentHosting::Refused(format!(
                        "the agent user {name} does not exist: create it (systemd-sysusers with systemd/toolwall.sysusers, or useradd --system --user-group {name}); workspaces stay offline"
                    ));
                }
                Err(e) => return AgentHosting::Refused(e),
            };
            if let Err(e) = identity::check(&identity, self.gateway_uid, self.gateway_gid) {
                return AgentHosting::Refused(format!("{e}; workspaces stay offline"));
            }
            self.identities.push(identity);
        }
        self.cgroups = super::cgroup_tree::build(
            config,
            &self.cgroup_requests(config, true),
            has_local_servers(config),
        );
        if config.sandbox.cgroups == crate::sandbox::CgroupMode::Required
            && !self.cgroups.in_force()
        {
            // Refused below (cgroups_refusal); no launcher for workers that never start.
            return AgentHosting::Unused;
        }
        match Launcher::start(self.identities.clone(), &config.sandbox) {
            Ok(l) => AgentHosting::Launcher(l),
            Err(e) => AgentHosting::Refused(format!("{e}; workspaces stay offline")),
        }
    }

    /// One cgroup request per workspace whose root resolves: its id, its limits, and
    /// (`with_agents`) its agent user, who makes its task cgroups.
    fn cgroup_requests(
        &self,
        config: &Config,
        with_agents: bool,
    ) -> Vec<super::cgroup_tree::WorkspaceRequest> {
        config
            .workspaces
            .0
            .iter()
            .filter_map(|(name, ws)| {
                let root = ws.canonical_root().ok()?;
                let user = ws
                    .agent_user
                    .as_deref()
                    .unwrap_or(&config.sandbox.agent_user);
                Some(super::cgroup_tree::WorkspaceRequest {
                    id: crate::workspace::id::workspace_id(name, &root),
                    limits: crate::sandbox::cgroup::CgroupLimits {
                        pids_max: Some(ws.pids_max),
                        memory_max_bytes: ws.memory_max_bytes,
                        cpu_weight: ws.cpu_weight,
                    },
                    agent: if with_agents {
                        self.identity(user).map(|(_, i)| i.clone())
                    } else {
                        None
                    },
                })
            })
            .collect()
    }

    /// With `[sandbox] cgroups = "required"`, why workspaces and local servers stay
    /// offline.
    fn cgroups_refusal(&self, config: &Config) -> Option<String> {
        if config.sandbox.cgroups != crate::sandbox::CgroupMode::Required
            || matches!(self.hosting, AgentHosting::Refused(_))
            || (config.workspaces.0.is_empty() && !has_local_servers(config))
        {
            return None;
        }
        match &self.cgroups {
            super::cgroup_tree::CgroupTree::Off(reason) => Some(format!(
                "[sandbox] cgroups = \"required\", and cgroup limits are not in force: {reason}; workspaces and local servers stay offline"
            )),
            super::cgroup_tree::CgroupTree::InForce { .. } => None,
        }
    }

    fn drop_own_capabilities(&mut self) {
        let Ok(sets) = CapabilitySets::current() else {
            return;
        };
        if sets.holds_none() && sets.bounding == 0 {
            return;
        }
        if sets.effective & capabilities::bit(capabilities::CAP_SETPCAP) != 0 {
            let _ = capabilities::drop_bounding_set();
        }
        match capabilities::clear_held() {
            Ok(()) => {
                if !sets.holds_none() {
                    self.notes.push(format!(
                        "the gateway dropped its capabilities ({})",
                        sets.describe()
                    ));
                }
            }
            Err(e) => crate::warn!("the gateway could not drop its capabilities: {e}"),
        }
    }

    /// The index and identity of agent user `name`.
    pub fn identity(&self, name: &str) -> Option<(usize, &AgentIdentity)> {
        self.identities
            .iter()
            .enumerate()
            .find(|(_, i)| i.name == name)
    }

    /// For `toolwall status`.
    pub fn status_json(&self) -> Value {
        let (mode, detail, launcher) = match &self.hosting {
            AgentHosting::Unused => ("unused", None, None),
            AgentHosting::Launcher(l) => ("agent_user", None, Some(l.pid())),
            AgentHosting::GatewayUser(why) => ("gateway_user", Some(why.clone()), None),
            AgentHosting::Refused(why) => ("refused", Some(why.clone()), None),
        };
        json!({
            "mode": mode,
            "cgroups": self.cgroups.status_json(),
            "users": self.identities,
            "launcher_pid": launcher,
            "gateway_uid": self.gateway_uid,
            "detail": detail,
            "notes": self.notes,
        })
    }
}

/// The `agents:` lines of `toolwall status` from [`AgentPlan::status_json`].
pub fn format_status(agents: &Value) -> String {
    let users = agents["users"]
        .as_array()
        .map(|users| {
            users
                .iter()
                .map(|u| {
                    format!(
                        "{} (uid {}, gid {})",
                        u["name"].as_str().unwrap_or(""),
                        u["uid"],
                        u["gid"]
                    )
                })
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    let detail = agents["detail"].as_str().unwrap_or("");
    let mut out = match agents["mode"].as_str() {
        Some("agent_user") => format!(
            "agent programs: run as {users} (agent launcher pid {})\n",
            agents["launcher_pid"]
        ),
        Some("gateway_user") => format!("agent programs: AS TOOLWALL'S OWN USER: {detail}\n"),
        Some("refused") => format!("agent programs: REFUSED (workspaces offline): {detail}\n"),
        _ => String::new(),
    };
    let cg = &agents["cgroups"];
    if cg["in_force"] == true {
        out.push_str(&format!(
            "cgroups: in force under {} ({})\n",
            cg["path"].as_str().unwrap_or(""),
            cg["controllers"]
                .as_array()
                .map(|c| c
                    .iter()
                    .filter_map(|c| c.as_str())
                    .collect::<Vec<_>>()
                    .join(", "))
                .unwrap_or_default()
        ));
        for w in cg["workspaces"].as_array().into_iter().flatten() {
            let max = |v: &Value| {
                v.as_u64()
                    .map_or_else(|| "max".to_string(), |n| n.to_string())
            };
            out.push_str(&format!(
                "    {}  pids.max {}  memory.max {}  cpu.weight {}  task cgroups {}\n",
                w["id"].as_str().unwrap_or(""),
                max(&w["pids_max"]),
                max(&w["memory_max_bytes"]),
                w["cpu_weight"]
                    .as_u64()
                    .map_or_else(|| "100".to_string(), |n| n.to_string()),
                if w["task_cgroups"] == true {
                    "yes".to_string()
                } else {
                    format!("no ({})", w["task_cgroups_reason"].as_str().unwrap_or(""))
                }
            ));
        }
    } else if !agents["mode"].is_null() && agents["mode"] != "unused" {
        out.push_str(&format!(
            "cgroups: NOT in force ({}); workspaces and local servers have rlimits only\n",
            cg["reason"].as_str().unwrap_or("unknown")
        ));
    }
    for note in agents["notes"].as_array().into_iter().flatten() {
        out.push_str(&format!("    note: {}\n", note.as_str().unwrap_or("")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspaces_sharing_an_agent_user_are_named_in_a_note() {
        let dir = tempfile::tempdir().expect("tempdir");
        for d in ["a", "b", "c"] {
            std::fs::create_dir(dir.path().join(d)).expect("mkdir");
        }
        let text = format!(
            r#"
[workspaces.a]
root = "{d}/a"
owners = ["uid:1"]
[workspaces.b]
root = "{d}/b"
owners = ["uid:1"]
[workspaces.c]
root = "{d}/c"
owners = ["uid:1"]
agent_user = "agent-c"
"#,
            d = dir.path().display()
        );
        let config = Config::from_toml(&text, "t.toml").expect("config");
        assert_eq!(
            agent_user_names(&config).into_iter().collect::<Vec<_>>(),
            vec!["agent-c".to_string(), "toolwall-agent".to_string()]
        );
        let notes = shared_user_notes(&config);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("workspaces a, b share the agent user toolwall-agent"));
    }
}
