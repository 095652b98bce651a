//! The gateway's side of local servers: one host worker per enabled `[servers.NAME]
//! command`, started as the server's agent user through the agent launcher (or as
//! toolwall's own user when configured and it cannot switch users, or not at all); its
//! settings (grants, what to hide, limits), its private state directory, and its
//! `configure` setup carrying the secret variables, read here. Blocking (files): run it
//! before the loop starts or on reload.

use std::path::{Path, PathBuf};

use super::config::{read_secret_env, servers_state_root};
use super::settings::HostSettings;
use crate::aggregator::config::{ServerConfig, ServersConfig};
use crate::aggregator::setup::{AggregatorSetup, Limits, UpstreamSetup};
use crate::config::Config;
use crate::launcher::{AgentHosting, AgentPlan};
use crate::sandbox::{Role, SecretPath};
use crate::workers::settings::WorkerSettings;
use crate::workers::supervisor::{WorkerHost, WorkerSpec};
use crate::workspace::settings::AgentExpectation;

/// Default of `[servers] stderr_lines_per_sec`.
pub const STDERR_LINES_PER_SEC: u32 = 20;

/// One local server, ready for the supervisor and the core.
pub struct PlannedServer {
    pub name: String,
    pub spec: WorkerSpec,
    /// The host's settings (JSON, no secret).
    pub stdin: Vec<u8>,
    pub host: WorkerHost,
    /// Probes allowed to succeed (a configured exception).
    pub allowed: Vec<String>,
    /// Its `configure` request's setup (with the secrets).
    pub setup: AggregatorSetup,
}

/// The name of a local server's host worker.
pub fn worker_name(server: &str) -> String {
    format!("server:{server}")
}

/// Every enabled local server of `config`. `protected`: toolwall's own files (config,
/// sockets, secrets) no server may write or read; `secrets`: what every worker hides and
/// probes.
pub fn plan_servers(
    config: &Config,
    plan: &AgentPlan,
    secrets: &[SecretPath],
    protected: &[PathBuf],
) -> Result<Vec<PlannedServer>, String> {
    let names: Vec<String> = config
        .servers
        .enabled()
        .filter(|(_, s)| s.is_local())
        .map(|(n, _)| n.clone())
        .collect();
    names
        .iter()
        .map(|n| plan_server(config, n, plan, secrets, protected))
        .collect()
}

/// One enabled local server (see [`plan_servers`]).
pub fn plan_server(
    config: &Config,
    name: &str,
    plan: &AgentPlan,
    secrets: &[SecretPath],
    protected: &[PathBuf],
) -> Result<PlannedServer, String> {
    let servers = &config.servers;
    let s = servers
        .servers
        .get(name)
        .filter(|s| s.is_local())
        .ok_or_else(|| format!("servers.{name} is not a local server"))?;
    let ledger_dir = canonical(&config.state_dir());
    let root = absolute(&servers_state_root(servers, &ledger_dir));
    let state_dir = root.join(name);
    let mut hidden: Vec<PathBuf> = protected.to_vec();
    hidden.push(ledger_dir.clone());
    hidden.extend(
        servers
            .enabled()
            .filter(|(n, o)| o.is_local() && n.as_str() != name)
            .map(|(n, _)| root.join(n)),
    );
    hidden.extend(
        config
            .workspaces
            .0
            .values()
            .map(|w| w.canonical_root().unwrap_or_else(|_| w.root.clone())),
    );
    check_write_paths(name, s, &hidden, &root)?;
    let user = s
        .local
        .agent_user
        .clone()
        .unwrap_or_else(|| config.sandbox.agent_user.clone());
    let mut settings = HostSettings {
        sandbox_mode: config.sandbox.mode,
        name: name.to_owned(),
        command: s.command.clone().unwrap_or_default(),
        cwd: s.local.cwd.clone(),
        env: s.local.env.clone(),
        state_dir: state_dir.clone(),
        read_paths: s.local.read_paths.clone(),
        write_paths: s.local.write_paths.clone(),
        network: s.local.network.clone(),
        hidden_paths: hidden,
        forbidden_probe_dir: ledger_dir,
        agent: AgentExpectation::default(),
        secrets: secrets.to_vec(),
        era: s.era,
        timeout_secs: s.timeout_secs,
        start_timeout_secs: s.local.start_timeout_secs,
        stop_grace_ms: s.local.stop_grace_ms,
        discover_timeout_ms: s.local.discover_timeout_ms,
        max_processes: s.local.max_processes,
        max_file_size_bytes: s.local.max_file_size_bytes,
        max_body_bytes: servers.max_body_bytes,
        threads: servers.threads,
        queue: servers.queue,
        retry_max_secs: servers.retry_max_secs,
        stderr_lines_per_sec: servers.stderr_lines_per_sec,
    };
    let limits = crate::sandbox::cgroup::CgroupLimits {
        pids_max: Some(s.local.pids_max),
        memory_max_bytes: Some(s.local.memory_max_bytes),
        cpu_weight: None,
    };
    let (host, allowed) = hosting(&mut settings, name, &user, plan, limits);
    if let Err(e) = prepare_state_dir(&root, &state_dir, &host, plan) {
        // The host says it again, more precisely, if it cannot make it itself.
        crate::warn!("server {name}: {e}");
    }
    let stdin = serde_json::to_vec(&settings).map_err(|e| format!("servers.{name}: {e}"))?;
    Ok(PlannedServer {
        name: name.to_owned(),
        spec: WorkerSpec {
            name: worker_name(name),
            role: Role::StdioServer,
            server: name.to_owned(),
            settings: WorkerSettings::default(),
        },
        stdin,
        host,
        allowed,
        setup: setup(servers, name, s),
    })
}

/// The `configure` setup of a local server's host: its limits, and its secret variables
/// (read now; a secret that cannot be read leaves the server down, saying why).
pub fn setup(servers: &ServersConfig, name: &str, s: &ServerConfig) -> AggregatorSetup {
    let (secret_env, unusable) = match read_secret_env(name, s) {
        Ok(v) => (v, None),
        Err(e) => {
            crate::warn!("{e}; server {name} stays down until reload");
            (Vec::new(), Some(e))
        }
    };
    AggregatorSetup {
        limits: Limits {
            threads: servers.threads,
            queue: servers.queue,
            max_body_bytes: servers.max_body_bytes,
            // The first handshake may take as long as the program needs to start.
            connect_timeout_secs: s.local.start_timeout_secs,
            retry_max_secs: servers.retry_max_secs,
            max_server_subscriptions: servers.max_server_subscriptions,
            subscription_recheck_secs: servers.subscription_recheck_secs,
            reuse_idle_ms: servers.reuse_idle_ms,
        },
        servers: vec![UpstreamSetup {
            name: name.to_owned(),
            url: String::new(),
            headers: Vec::new(),
            bearer_token: None,
            timeout_secs: s.timeout_secs,
            era: s.era,
            addresses: Vec::new(),
            unusable,
            secret_env,
        }],
    }
}

/// How the host starts: as the agent user through the launcher, as toolwall's own user
/// (configured), or not at all. Fills in the identity the host must check.
fn hosting(
    settings: &mut HostSettings,
    name: &str,
    user: &str,
    plan: &AgentPlan,
    limits: crate::sandbox::cgroup::CgroupLimits,
) -> (WorkerHost, Vec<String>) {
    settings.agent.gateway_uid = plan.gateway_uid;
    settings.agent.user = None;
    match &plan.hosting {
        AgentHosting::Launcher(_) => match plan.identity(user) {
            Some((index, identity)) => {
                settings.agent.user = Some(identity.clone());
                // Its own cgroup where cgroups are in force: the launcher places the host
                // there, and everything it starts is born inside.
                let cgroup = if plan.cgroups.in_force() {
                    match plan.cgroups.server(name, limits) {
                        Ok(dir) => Some(dir),
                        Err(e) => {
                            return (
                                WorkerHost::Refused(format!(
                                    "server {name}: its cgroup cannot be made: {e}"
                                )),
                                Vec::new(),
                            );
                        }
                    }
                } else {
                    None
                };
                (
                    WorkerHost::AgentUser {
                        identity: index,
                        uid: identity.uid,
                        cgroup,
                    },
                    Vec::new(),
                )
            }
            None => (
                WorkerHost::Refused(format!(
                    "server {name}: agent user {user} unknown to the launcher"
                )),
                Vec::new(),
            ),
        },
        AgentHosting::GatewayUser(_) => (
            WorkerHost::Gateway,
            crate::workspace::hosting::GATEWAY_USER_EXCEPTIONS
                .iter()
                .map(|s| s.to_string())
                .collect(),
        ),
        AgentHosting::Refused(why) => (
            WorkerHost::Refused(format!("server {name}: {why}")),
            Vec::new(),
        ),
        AgentHosting::Unused => (
            WorkerHost::Refused(format!("server {name}: no agent plan (internal error)")),
            Vec::new(),
        ),
    }
}

/// The servers' state directory (traversable, not listable) and this server's own
/// (0700, its agent user's), made here when toolwall may: as root, or when the server
/// runs as toolwall's own user. Otherwise the host makes its own, in a `state_dir` its
/// user may write.
fn prepare_state_dir(
    root: &Path,
    dir: &Path,
    host: &WorkerHost,
    plan: &AgentPlan,
) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let as_root = plan.gateway_uid == 0;
    let mine = matches!(host, WorkerHost::Gateway);
    if !as_root && !mine {
        return Ok(());
    }
    if std::fs::symlink_metadata(root).is_err() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(if as_root { 0o711 } else { 0o700 })
            .create(root)
            .map_err(|e| format!("servers.state_dir {}: {e}", root.display()))?;
    }
    if std::fs::symlink_metadata(dir).is_err() {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("state directory {}: {e}", dir.display()))?;
    }
    let meta = std::fs::symlink_metadata(dir)
        .map_err(|e| format!("state directory {}: {e}", dir.display()))?;
    if !meta.is_dir() {
        return Err(format!(
            "state directory {} is not a directory",
            dir.display()
        ));
    }
    if let WorkerHost::AgentUser { uid, .. } = host
        && as_root
        && meta.uid() != *uid
    {
        let gid = plan
            .identities
            .iter()
            .find(|i| i.uid == *uid)
            .map_or(*uid, |i| i.gid);
        std::os::unix::fs::lchown(dir, Some(*uid), Some(gid))
            .map_err(|e| format!("state directory {}: chown: {e}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("state directory {}: {e}", dir.display()))?;
    }
    Ok(())
}

/// A `write_paths` entry may neither hold nor lie inside toolwall's files, another
/// server's state, a workspace, or the servers' state directory itself.
fn check_write_paths(
    name: &str,
    s: &ServerConfig,
    hidden: &[PathBuf],
    root: &Path,
) -> Result<(), String> {
    for w in &s.local.write_paths {
        let w = canonical(w);
        for h in hidden.iter().chain(std::iter::once(&root.to_path_buf())) {
            let h = canonical(h);
            if h.starts_with(&w) || w.starts_with(&h) {
                return Err(format!(
                    "servers.{name}.write_paths: {} overlaps {}, which is toolwall's, another server's or a workspace's",
                    w.display(),
                    h.display()
                ));
            }
        }
    }
    Ok(())
}

fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| absolute(p))
}

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        return p.to_path_buf();
    }
    std::env::current_dir()
        .map(|d| d.join(p))
        .unwrap_or_else(|_| p.to_path_buf())
}
