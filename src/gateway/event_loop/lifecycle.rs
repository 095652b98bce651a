//! The gateway's life: signals, reload, readiness (and what systemd is told), the drain
//! on stop and the last commit.

use super::*;

impl Gateway {
    pub(super) fn on_signals(&mut self, now: Instant, worker_events: &mut Vec<WorkerEvent>) {
        loop {
            match self.signals.read_signal() {
                Ok(Some(info)) => match Signal::try_from(info.ssi_signo as i32) {
                    Ok(Signal::SIGCHLD) => {
                        self.supervisor
                            .reap(self.poll.registry(), now, worker_events)
                    }
                    Ok(Signal::SIGHUP) => {
                        let _ = self.reload();
                    }
                    Ok(Signal::SIGTERM) | Ok(Signal::SIGINT) => self.begin_stop(now),
                    _ => {}
                },
                Ok(None) => return,
                Err(e) => {
                    crate::warn!("reading signals: {e}");
                    return;
                }
            }
        }
    }

    /// Re-read the config and swap the policy. The old policy stays on any error.
    pub fn reload(&mut self) -> Result<String, String> {
        self.notify(|n| n.reloading());
        let outcome = self.reload_config();
        self.notify(|n| n.ready());
        outcome
    }

    pub(super) fn reload_config(&mut self) -> Result<String, String> {
        let result = (|| -> Result<(Policy, Config), String> {
            let config = match &self.config.source {
                Some(path) => Config::from_file(path).map_err(|e| e.to_string())?,
                None => Config::default(),
            };
            let origin = config
                .source
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "embedded defaults".into());
            let policy = Policy::load(&config.policy, &origin).map_err(|e| e.to_string())?;
            // A local server's secret file the running workers were not started to hide
            // (walls are set when a worker starts) would be read by the restarted server
            // while every other running one could read it too: refused whole, fail closed.
            let unwalled = self.unwalled_secrets(&config, |what| what.starts_with("secret_env"));
            if !unwalled.is_empty() {
                return Err(format!(
                    "the config names local-server secret files the running workers do not hide: {}; restart toolwall to use them",
                    unwalled.join(", ")
                ));
            }
            Ok((policy, config))
        })();
        self.reloads += 1;
        match result {
            Ok((policy, config)) => {
                let now = Instant::now();
                let mut set_change = server_set::ServerSetChange::default();
                if config.servers != self.config.servers {
                    self.restart_changed_local_servers(&config);
                    set_change = self.apply_server_set(&config, now);
                    crate::stdio_server::load_warnings::warn(&config);
                    let same_remote = server_set::remote_only(&config.servers)
                        .same_connections(&server_set::remote_only(&self.config.servers));
                    self.core.reconfigure_upstreams(&config.servers, now);
                    if !same_remote {
                        crate::warn!(
                            "reload: the url servers' connections changed; restart toolwall to reach them as configured (pin modes and refresh_secs apply now)"
                        );
                        set_change.need_restart.push(
                            "the url servers as configured (their connections changed)".into(),
                        );
                    }
                    self.config.servers = config.servers.clone();
                }
                self.core.refresh_upstreams(now);
                let rules = policy.rule_count();
                self.core.set_relay_config(config.relay.clone());
                self.core.set_policy(Rc::new(policy), now);
                let mut summary = format!("policy reloaded: {rules} rules");
                if let Some(servers) = set_change.summary() {
                    summary.push_str(&format!("; {servers}"));
                }
                // The HTTP door's settings and certificate follow; on error they stay.
                // A secret the running workers were not started to hide (a TLS key at a new
                // path) must not be put to use: the walls are set when a worker starts.
                let unwalled = self.unwalled_secrets(&config, |_| true);
                if !unwalled.is_empty() && self.http.is_some() {
                    let why = format!(
                        "the config names secrets the running workers do not hide: {}; restart toolwall to use them",
                        unwalled.join(", ")
                    );
                    crate::error!("http door kept its previous settings: {why}");
                    summary.push_str(&format!("; http door kept its previous settings: {why}"));
                } else if let Some(door) = self.http.as_mut() {
                    match door.reload(&config) {
                        Ok(()) => {
                            // The loop's own [http] limits (connections, timers) follow too.
                            self.config.http = config.http.clone();
                            summary.push_str("; http door settings and certificate reloaded")
                        }
                        Err(e) => {
                            crate::error!("http door kept its previous settings: {e}");
                            summary
                                .push_str(&format!("; http door kept its previous settings: {e}"));
                        }
                    }
                }
                // [gateway]'s bounds follow too: in flight per connection, per principal and
                // in all, per-turn budgets, timeouts of calls started from now on.
                self.core.set_limits(config.gateway.clone());
                self.config.gateway = config.gateway.clone();
                // Budgets and deadlines of every door follow; seats already given stay.
                self.doors
                    .budgets
                    .set_limits(DoorLimits::from_config(&config));
                self.doors.partial.set_limits(
                    crate::gateway::door_limits::PartialLimits::from_config(&config),
                );
                crate::info!("{summary}");
                self.core.event(
                    "reload",
                    serde_json::json!({"ok": true, "rules": rules, "summary": summary}),
                );
                self.last_reload = Some(summary.clone());
                Ok(summary)
            }
            Err(e) => {
                crate::error!("reload failed, the previous policy stays in force: {e}");
                self.core
                    .event("reload", serde_json::json!({"ok": false, "error": e}));
                self.last_reload = Some(format!("failed: {e}"));
                Err(e)
            }
        }
    }

    /// The secrets `config` names (those whose kind `what` passes) at paths the running
    /// workers were not started to hide, as `what (path)`: walls are set when a worker
    /// starts, so such a secret must not be put to use before a restart.
    fn unwalled_secrets(&self, config: &Config, what: impl Fn(&str) -> bool) -> Vec<String> {
        crate::sandbox::secrets::config_secrets(config)
            .into_iter()
            .filter(|s| what(&s.what))
            .filter(|s| self.supervisor.secrets().iter().all(|k| k.path != s.path))
            .map(|s| format!("{} ({})", s.what, s.path.display()))
            .collect()
    }

    /// Local servers whose program, environment, grants or limits changed start again
    /// with the new ones (their secrets read again); the others keep running.
    fn restart_changed_local_servers(&mut self, config: &Config) {
        let changed = self.config.servers.changed_local_servers(&config.servers);
        if changed.is_empty() {
            return;
        }
        let Some(plan) = self.supervisor.agents.as_ref() else {
            return;
        };
        let mut protected = workspace_protected_paths(config);
        protected.extend(
            crate::sandbox::secrets::secret_files(self.supervisor.secrets())
                .map(|p| p.to_path_buf()),
        );
        let secrets = self.supervisor.secrets().to_vec();
        let planned: Vec<_> = changed
            .into_iter()
            .map(|name| {
                let p = crate::stdio_server::hosting::plan_server(
                    config, &name, plan, &secrets, &protected,
                );
                (name, p)
            })
            .collect();
        let mut events = Vec::new();
        let now = Instant::now();
        for (name, planned) in planned {
            let worker = self.core.upstreams().and_then(|u| u.worker_of(&name));
            match (planned, worker) {
                (Ok(p), Some(id)) => {
                    crate::info!("reload: server {name} changed; starting it again");
                    if let Some(u) = self.core.upstreams_mut() {
                        u.replace_setup(id, p.setup);
                    }
                    self.supervisor.restart_with_settings(
                        id,
                        p.stdin,
                        self.poll.registry(),
                        now,
                        &mut events,
                    );
                }
                (Err(e), _) => {
                    crate::error!("reload: server {name} keeps its previous configuration: {e}")
                }
                (_, None) => {}
            }
        }
        self.apply_worker_events(&mut events, now);
    }

    pub(super) fn begin_stop(&mut self, now: Instant) {
        if self.stop_deadline.is_some() {
            crate::warn!("second stop signal: stopping now");
            self.stop_now = true;
            return;
        }
        let drain = Duration::from_secs(self.config.gateway.drain_secs);
        self.notify(|n| n.stopping());
        self.notify(|n| n.extend_timeout(drain + Duration::from_secs(10)));
        crate::info!(
            "stopping: no new connections; finishing {} calls in flight within {} s",
            self.core.in_flight_total(),
            drain.as_secs()
        );
        self.stop_deadline = Some(now + drain);
        for l in self.listeners.iter_mut() {
            match l {
                Listener::Unix { socket, .. } => {
                    let _ = self.poll.registry().deregister(socket);
                }
                Listener::Http { socket, .. } => {
                    let _ = self.poll.registry().deregister(socket);
                }
                Listener::Vsock { socket, .. } => {
                    let _ = self
                        .poll
                        .registry()
                        .deregister(&mut SourceFd(&socket.as_raw_fd()));
                }
            }
            l.cleanup();
        }
        self.listeners.clear();
        self.core.set_stopping();
        self.core.event(
            "gateway_stopping",
            serde_json::json!({"in_flight": self.core.in_flight_total()}),
        );
    }

    pub(super) fn check_exit(&mut self, now: Instant) -> Option<Exit> {
        if let Some(slot) = self.stdio_slot {
            let c = self.conns[slot].as_ref()?;
            let conn = ConnRef {
                slot,
                generation: c.generation,
            };
            let output_failed = self
                .stdio
                .as_ref()
                .is_some_and(|s| s.output_failed.load(std::sync::atomic::Ordering::Acquire));
            if (c.read_closed && self.core.in_flight(conn) == 0) || output_failed {
                self.finish(now);
                return Some(Exit::StdinClosed);
            }
        }
        let deadline = self.stop_deadline?;
        let drained = self.core.in_flight_total() == 0;
        if drained || self.stop_now || now >= deadline {
            self.finish(now);
            return Some(Exit::Stopped);
        }
        None
    }

    /// Answer what is left, commit, flush, checkpoint, stop the workers.
    pub(super) fn finish(&mut self, now: Instant) {
        let mut worker_events = Vec::new();
        self.core.set_stopping();
        self.core.refuse_remaining(now);
        self.core.event(
            "gateway_stop",
            serde_json::json!({"uptime_s": now.saturating_duration_since(self.started).as_secs()}),
        );
        self.end_turn(now, &mut worker_events);
        // Requests still in socket buffers get the stopping error rather than silence:
        // keep reading (and refusing) until the agents go quiet, briefly.
        let linger_until = Instant::now() + LINGER;
        let mut quiet_since = Instant::now();
        while Instant::now() < linger_until && quiet_since.elapsed() < LINGER_QUIET {
            let before = self.core.counters.requests_total;
            for slot in 0..self.conns.len() {
                if Some(slot) != self.stdio_slot {
                    self.service_conn(slot, Instant::now());
                }
            }
            self.end_turn(Instant::now(), &mut worker_events);
            if self.core.counters.requests_total != before {
                quiet_since = Instant::now();
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        // Give agents a moment to take their last answers.
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until
            && self
                .conns
                .iter()
                .flatten()
                .any(|c| c.queued() > 0 && !c.broken)
        {
            for slot in 0..self.conns.len() {
                self.flush_conn(slot);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Some(side) = self.stdio.as_mut() {
            side.finish();
        }
        self.supervisor
            .shutdown(self.poll.registry(), Duration::from_secs(2));
        self.commit();
        if let Err(e) = self.core.records_mut().checkpoint() {
            crate::warn!("ledger checkpoint failed: {e}");
        }
        for l in &self.listeners {
            l.cleanup();
        }
        if self.admin.take().is_some() {
            let _ = std::fs::remove_file(&self.config.admin.socket);
        }
    }

    /// Serve agents and tell systemd READY=1 once the gateway's own workers (builtin,
    /// aggregator, workspaces) are ready and listed. Local servers do not hold it: each
    /// starts on its own time (a hung one until its `start_timeout_secs`), shown as
    /// starting in `status`, and its tools appear when it has listed them.
    pub(super) fn maybe_announce_ready(&mut self) {
        let local: Vec<crate::mcp::catalog::WorkerId> = self
            .supervisor
            .workers
            .iter()
            .filter(|w| w.spec.role == Role::StdioServer)
            .map(|w| w.id)
            .collect();
        let own = || {
            self.supervisor
                .workers
                .iter()
                .filter(|w| w.spec.role != Role::StdioServer)
        };
        let all_ready = own().all(|w| w.state == crate::workers::supervisor::WorkerState::Ready);
        let all_settled = own().all(|w| w.settled());
        if !self.serving && self.started.elapsed() >= START_GRACE {
            crate::warn!(
                "serving agents before every worker is ready ({} s passed)",
                START_GRACE.as_secs()
            );
            self.serving = true;
        }
        if !self.serving && all_settled && !all_ready {
            crate::warn!(
                "serving agents while a worker is down; its tools answer worker_unavailable"
            );
            self.serving = true;
        }
        if self.announced_ready
            || !all_ready
            || self.core.listings_pending_where(|w| !local.contains(&w)) > 0
        {
            return;
        }
        self.announced_ready = true;
        self.serving = true;
        let line = self.status_line();
        self.notify(|n| n.ready_with_status(&line));
        self.status_sent = (line, Instant::now());
        let starting = self
            .supervisor
            .workers
            .iter()
            .filter(|w| w.spec.role == Role::StdioServer)
            .count();
        crate::info!(
            "ready: {} tools{}",
            self.core.catalog().len(crate::mcp::catalog::Kind::Tools),
            if starting > 0 {
                format!(" ({starting} local servers add theirs as they start)")
            } else {
                String::new()
            }
        );
    }

    pub fn is_ready(&self) -> bool {
        self.announced_ready
    }

    /// Send one state to systemd, if it listens; a failure is logged, never waited on.
    pub(super) fn notify(&self, send: impl FnOnce(&systemd::Notifier) -> io::Result<()>) {
        if let Some(n) = &self.notifier
            && let Err(e) = send(n)
        {
            crate::warn!("sd_notify to {}: {e}", n.address());
        }
    }

    pub(super) fn status_line(&self) -> String {
        let facts = systemd::StatusFacts {
            ready: self.announced_ready,
            stopping: self.stop_deadline.is_some(),
            calls_served: self.core.counters.calls_total,
            in_flight: self.core.in_flight_total(),
            workers_ready: self
                .supervisor
                .workers
                .iter()
                .filter(|w| w.state == crate::workers::supervisor::WorkerState::Ready)
                .count(),
            workers_total: self.supervisor.workers.len(),
            last_reload: self.last_reload.clone(),
        };
        systemd::status_line(&facts)
    }

    /// The watchdog ping (from the loop itself, so a stuck loop is caught) and STATUS=.
    pub(super) fn tell_systemd(&mut self) {
        if self.notifier.is_none() {
            return;
        }
        let now = Instant::now();
        if self.watchdog.as_mut().is_some_and(|w| w.due(now)) {
            self.notify(|n| n.watchdog());
        }
        if now.saturating_duration_since(self.status_sent.1) >= Duration::from_secs(1) {
            let line = self.status_line();
            if line != self.status_sent.0 {
                self.notify(|n| n.status(&line));
            }
            self.status_sent = (line, now);
        }
    }
}
