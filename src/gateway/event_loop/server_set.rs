//! A reload that adds or removes servers: every server taken out of the config (or
//! disabled) leaves the catalog at once and, for a local server, its host is stopped (the
//! program gets SIGTERM, then SIGKILL, to its whole group) so its secret and its tools
//! are revoked; a local server added starts. `url` servers added need a restart (the
//! aggregator's grant and setup are fixed at its start): the summary says so.

use super::*;
use crate::aggregator::config::ServersConfig;
use crate::stdio_server::hosting::{plan_server, worker_name};

/// What a reload did to the set of servers, for its summary.
#[derive(Debug, Default)]
pub(super) struct ServerSetChange {
    pub removed: Vec<String>,
    pub started: Vec<String>,
    /// Servers the reload could not reach without a restart, and why.
    pub need_restart: Vec<String>,
}

impl ServerSetChange {
    pub fn summary(&self) -> Option<String> {
        let mut parts = Vec::new();
        if !self.removed.is_empty() {
            parts.push(format!("servers removed: {}", self.removed.join(", ")));
        }
        if !self.started.is_empty() {
            parts.push(format!("servers started: {}", self.started.join(", ")));
        }
        if !self.need_restart.is_empty() {
            parts.push(format!(
                "restart toolwall to reach: {}",
                self.need_restart.join("; ")
            ));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

/// Enabled server names of `c`, local or not.
fn enabled(c: &ServersConfig, local: bool) -> Vec<String> {
    c.enabled()
        .filter(|(_, s)| s.is_local() == local)
        .map(|(n, _)| n.clone())
        .collect()
}

/// `c` without its local servers (each has a host of its own; the aggregator serves the
/// rest).
pub(super) fn remote_only(c: &ServersConfig) -> ServersConfig {
    let mut c = c.clone();
    c.servers.retain(|_, s| !s.is_local());
    c
}

impl Gateway {
    /// Remove the servers `config` no longer has, start the local servers it adds.
    pub(super) fn apply_server_set(&mut self, config: &Config, now: Instant) -> ServerSetChange {
        let old = &self.config.servers;
        let new = &config.servers;
        let mut change = ServerSetChange::default();
        let mut events = Vec::new();
        let old_local = enabled(old, true);
        let new_local = enabled(new, true);
        let old_remote = enabled(old, false);
        let new_remote = enabled(new, false);
        let gone = old_local
            .iter()
            .chain(&old_remote)
            .filter(|n| !new_local.contains(n) && !new_remote.contains(n))
            .chain(old_local.iter().filter(|n| new_remote.contains(n)))
            .chain(old_remote.iter().filter(|n| new_local.contains(n)))
            .cloned()
            .collect::<Vec<_>>();
        for name in gone {
            let worker = self.core.remove_upstream_server(&name, now);
            let host = self
                .supervisor
                .workers
                .iter()
                .find(|w| Some(w.id) == worker && w.spec.name == worker_name(&name))
                .map(|w| w.id);
            if let Some(id) = host {
                let grace = old.servers.get(&name).map_or(0, |s| s.local.stop_grace_ms);
                // The host's leader stops the program within its grace; the host gets a
                // second more before SIGKILL.
                let grace = Duration::from_millis(grace) + Duration::from_secs(1);
                crate::info!("reload: server {name} removed from the config; stopping it");
                self.supervisor
                    .remove(id, grace, self.poll.registry(), now, &mut events);
            } else if old_remote.contains(&name) {
                change.need_restart.push(format!(
                    "{name} (removed from the catalog; the aggregator keeps its connection until a restart)"
                ));
            }
            change.removed.push(name);
        }
        let added: Vec<String> = new_local
            .iter()
            .filter(|n| !old_local.contains(n))
            .cloned()
            .collect();
        for name in added {
            match self.start_local_server(config, &name, now) {
                Ok(()) => change.started.push(name),
                Err(e) => {
                    crate::error!("reload: server {name} cannot start: {e}");
                    change.need_restart.push(format!("{name} ({e})"));
                }
            }
        }
        for name in new_remote.iter().filter(|n| !old_remote.contains(n)) {
            change
                .need_restart
                .push(format!("{name} (a url server added by a reload)"));
        }
        self.apply_worker_events(&mut events, now);
        change
    }

    /// Plan and add the host of local server `name`, new in `config`; it starts on the
    /// next timer turn.
    fn start_local_server(
        &mut self,
        config: &Config,
        name: &str,
        now: Instant,
    ) -> Result<(), String> {
        let plan = self
            .supervisor
            .agents
            .as_ref()
            .ok_or("no agent plan (internal error)")?;
        let mut protected = workspace_protected_paths(config);
        protected.extend(
            crate::sandbox::secrets::secret_files(self.supervisor.secrets())
                .map(|p| p.to_path_buf()),
        );
        let secrets = self.supervisor.secrets().to_vec();
        let p = plan_server(config, name, plan, &secrets, &protected)?;
        let token = self.supervisor.next_token(WORKER_BASE);
        if token.0 >= CONN_BASE {
            return Err("too many workers for one run".into());
        }
        if self.core.upstreams().is_none() {
            // The first server of this run: the pin store and its intake open now.
            let (pins, owners) = super::pin_io::PinIo::open(
                &config.servers,
                &config.ledger.path,
                Arc::clone(&self.waker),
            );
            self.pins = Some(pins);
            self.core
                .set_upstreams(crate::aggregator::gateway_state::UpstreamsState::empty(
                    &config.servers,
                    owners,
                    now,
                ));
        }
        let s = config
            .servers
            .servers
            .get(name)
            .ok_or("not in the config")?;
        let id = self
            .core
            .add_local_server(name, s, &p.spec.name, p.setup, now)
            .ok_or("no upstream state (internal error)")?;
        self.supervisor
            .add_program_host(p.spec, id, token, p.stdin, p.host, p.allowed);
        crate::info!("reload: server {name} added to the config; starting it");
        Ok(())
    }
}
