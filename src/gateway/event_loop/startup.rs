//! Building the gateway: the ledger, the core, the doors (or the stdio slot), the admin
//! socket and the workers' specs, before the loop runs.

use super::*;

/// The doors the config asks for: sockets systemd passed are used (matched by name and
/// address), the rest are bound here; every mismatch is explained in the log.
pub(super) fn open_listeners(
    config: &Config,
    inherited: Vec<systemd::InheritedSocket>,
    tls: bool,
) -> Result<Vec<Listener>, String> {
    let wanted = systemd::wanted_listeners(&config.listen);
    let plan = systemd::match_listeners(inherited, &wanted);
    for line in &plan.explanations {
        crate::warn!("socket activation: {line}");
    }
    let mut out = Vec::new();
    for (spec, socket) in plan.adopted {
        crate::info!("using the socket systemd passed: {}", socket.describe());
        match spec {
            systemd::ListenerSpec::Unix { path } => {
                let path = match &socket.kind {
                    systemd::SocketKind::Unix { path } => path.clone(),
                    _ => path,
                };
                let socket = socket
                    .into_unix_listener()
                    .map_err(|e| format!("listen unix: {e}"))?;
                // systemd owns the socket file: never unlink it.
                out.push(Listener::Unix {
                    socket,
                    path,
                    owned: false,
                });
            }
            systemd::ListenerSpec::Vsock { port } => {
                let socket = socket
                    .into_vsock_listener()
                    .map_err(|e| format!("listen vsock: {e}"))?;
                out.push(Listener::Vsock { socket, port });
            }
            systemd::ListenerSpec::Http { addr } => {
                let socket = socket
                    .into_tcp_listener()
                    .map_err(|e| format!("listen http: {e}"))?;
                let addr = socket.local_addr().unwrap_or(addr);
                let socket = mio::net::TcpListener::from_std(socket);
                out.push(Listener::Http { socket, addr, tls });
            }
        }
    }
    for spec in plan.to_bind {
        match spec {
            systemd::ListenerSpec::Unix { path } => {
                let socket =
                    listeners::bind_unix(&path, 0o660).map_err(|e| format!("listen unix: {e}"))?;
                out.push(Listener::Unix {
                    socket,
                    path,
                    owned: true,
                });
            }
            systemd::ListenerSpec::Vsock { port } => {
                let socket = listeners::bind_vsock(port).map_err(|e| {
                    format!(
                        "listen vsock: {e} (is the vsock module loaded and /dev/vsock accessible?)"
                    )
                })?;
                out.push(Listener::Vsock { socket, port });
            }
            systemd::ListenerSpec::Http { addr } => {
                let socket = listeners::bind_tcp(addr).map_err(|e| format!("listen http: {e}"))?;
                let addr = socket.local_addr().unwrap_or(addr);
                out.push(Listener::Http { socket, addr, tls });
            }
        }
    }
    Ok(out)
}

/// The builtin worker's spec from the config.
pub fn builtin_spec(config: &Config) -> WorkerSpec {
    let mut grant = sandbox::role_grant_defaults(Role::Builtin);
    grant.tcp_connect_ports = crate::tools::http::tool_ports(&config.builtin.http);
    grant.forbidden_probe_dir = config.state_dir();
    WorkerSpec {
        name: "builtin".into(),
        role: Role::Builtin,
        server: LOCAL_SERVER.into(),
        settings: WorkerSettings {
            sandbox_mode: config.sandbox.mode,
            tcp_connect_ports: grant.tcp_connect_ports,
            read_paths: grant.read_paths,
            forbidden_probe_dir: std::fs::canonicalize(&grant.forbidden_probe_dir)
                .unwrap_or(grant.forbidden_probe_dir),
            threads: config.builtin.threads,
            queue: config.builtin.queue,
            http: config.builtin.http.clone(),
            // Filled in by the supervisor (`Supervisor::set_secrets`).
            secrets: Vec::new(),
        },
    }
}

/// toolwall's own files, which no workspace may hold or read (the ledger's directory is
/// added by `workspace::worker_settings`).
pub fn workspace_protected_paths(config: &Config) -> Vec<std::path::PathBuf> {
    let mut paths = vec![config.admin.socket.clone()];
    paths.extend(config.source.clone());
    paths.extend(config.policy.corp.clone());
    paths.extend(
        config
            .listen
            .unix
            .clone()
            .filter(|p| !p.as_os_str().is_empty()),
    );
    paths
        .into_iter()
        .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
        .collect()
}

impl Gateway {
    /// As [`Gateway::new`], using the sockets, notify socket and watchdog systemd passed.
    pub fn with_systemd(
        config: Config,
        mode: Mode,
        from_systemd: FromSystemd,
    ) -> Result<Gateway, String> {
        // Signals first, before any thread exists, so every thread inherits the block.
        let mut mask = SigSet::empty();
        for s in [
            Signal::SIGCHLD,
            Signal::SIGHUP,
            Signal::SIGTERM,
            Signal::SIGINT,
        ] {
            mask.add(s);
        }
        mask.thread_block()
            .map_err(|e| format!("blocking signals: {e}"))?;
        let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
            .map_err(|e| format!("signalfd: {e}"))?;
        // Agent users and the launcher, before any thread: a gateway that is not root then
        // drops its capabilities (they are per thread).
        let agents = crate::launcher::AgentPlan::prepare(&config);

        let origin = config
            .source
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "embedded defaults".into());
        let policy = Policy::load(&config.policy, &origin).map_err(|e| format!("policy: {e}"))?;
        let state_dir = config.state_dir();
        listeners::create_private_dir(&state_dir, 0o750)
            .map_err(|e| format!("state directory {}: {e}", state_dir.display()))?;
        let ledger = Ledger::open(&config.ledger).map_err(|e| format!("ledger: {e}"))?;
        let mut core = Core::new(
            config.gateway.clone(),
            Rc::new(policy),
            ledger,
            Instant::now(),
            crate::ledger::now_ms(),
        );
        core.set_relay_config(config.relay.clone());
        let state_key = crate::gateway::state_key::load_or_create(&state_dir)
            .map_err(|e| format!("request state key: {e}"))?;
        core.set_state_key(state_key, crate::gateway::state_key::instance_name());
        crate::gateway::used_approvals::restore(&mut core, &config.ledger.path);

        let poll = Poll::new().map_err(|e| format!("poll: {e}"))?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKE).map_err(|e| format!("waker: {e}"))?);
        poll.registry()
            .register(
                &mut SourceFd(&signals.as_raw_fd()),
                SIGNALS,
                Interest::READABLE,
            )
            .map_err(|e| format!("register signals: {e}"))?;

        let mut listeners_out = Vec::new();
        let mut http_door = None;
        if mode == Mode::Serve {
            doors::ensure_descriptors(&config);
            http_door = HttpDoor::open(&config).map_err(|e| format!("http door: {e}"))?;
            let tls = http_door.as_ref().is_some_and(HttpDoor::is_tls);
            listeners_out = open_listeners(&config, from_systemd.inherited, tls)?;
        }
        for (i, l) in listeners_out.iter_mut().enumerate() {
            let token = Token(LISTENER_BASE + i);
            let r = match l {
                Listener::Unix { socket, .. } => {
                    poll.registry().register(socket, token, Interest::READABLE)
                }
                Listener::Http { socket, .. } => {
                    poll.registry().register(socket, token, Interest::READABLE)
                }
                Listener::Vsock { socket, .. } => poll.registry().register(
                    &mut SourceFd(&socket.as_raw_fd()),
                    token,
                    Interest::READABLE,
                ),
            };
            r.map_err(|e| format!("register listener: {e}"))?;
        }
        let admin = match admin::bind(&config, mode) {
            Ok(Some(mut l)) => {
                poll.registry()
                    .register(&mut l, ADMIN, Interest::READABLE)
                    .map_err(|e| format!("register admin: {e}"))?;
                Some(l)
            }
            Ok(None) => None,
            Err(e) if mode == Mode::Stdio => {
                crate::warn!("admin socket not available in stdio mode: {e}");
                None
            }
            Err(e) => return Err(format!("admin socket: {e}")),
        };

        let mut supervisor = Supervisor::new(config.sandbox.clone());
        supervisor.set_secrets(crate::sandbox::secrets::config_secrets(&config));
        let spec = builtin_spec(&config);
        core.set_builtin_pool(config.builtin.threads, config.builtin.queue);
        let id = core.add_worker(&spec.name, &spec.server);
        supervisor.add(spec, id, Token(WORKER_BASE));
        // Upstream servers: url servers through the aggregator worker, each local server
        // through a host of its own (added below, with the workspaces' agent users).
        let (pins, owners) = match config.servers.enabled().next() {
            Some(_) => {
                let (pins, owners) = super::pin_io::PinIo::open(
                    &config.servers,
                    &config.ledger.path,
                    Arc::clone(&waker),
                );
                (Some(pins), Some(owners))
            }
            None => (None, None),
        };
        let mut upstreams = owners.map(|owners| {
            crate::aggregator::gateway_state::UpstreamsState::empty(
                &config.servers,
                owners,
                Instant::now(),
            )
        });
        if let Some(spec) = crate::aggregator::spec::worker_spec(
            &config.servers,
            config.sandbox.mode,
            &config.state_dir(),
        ) {
            // Credentials and addresses are read and resolved here, before the loop.
            let setup = crate::aggregator::prepare::build_setup(&config.servers);
            let id = core.add_worker(&spec.name, &spec.server);
            supervisor.add(spec, id, Token(WORKER_BASE + 1));
            if let Some(u) = upstreams.as_mut() {
                u.route(id, setup);
            }
        }
        // One worker per workspace, all serving `ws`; calls are routed by the caller.
        let mut protected = workspace_protected_paths(&config);
        protected.extend(
            crate::sandbox::secrets::secret_files(supervisor.secrets()).map(|p| p.to_path_buf()),
        );
        warn_shared_filesystems(&config);
        crate::stdio_server::load_warnings::warn(&config);
        let workspaces = crate::workspace::worker_settings(
            &config.workspaces,
            &protected,
            &config.state_dir(),
            config.sandbox.mode,
        )
        .map_err(|e| format!("workspaces: {e}"))?;
        let mut ws_workers = std::collections::HashMap::new();
        for (n, mut ws) in workspaces.into_iter().enumerate() {
            let spec = WorkerSpec {
                name: format!("workspace:{}", ws.name),
                role: Role::Workspace,
                server: crate::workspace::tools::SERVER.into(),
                settings: WorkerSettings::default(),
            };
            let user = ws.workspace.agent_user.clone();
            let user = user.as_deref().unwrap_or(&config.sandbox.agent_user);
            let (host, allowed) =
                crate::workspace::hosting::host(&mut ws, user, &agents, supervisor.secrets());
            let stdin = serde_json::to_vec(&ws).map_err(|e| format!("workspaces: {e}"))?;
            let id = core.add_worker(&spec.name, &spec.server);
            core.set_workspace_pool(id, ws.workspace.threads, ws.workspace.queue);
            ws_workers.insert(ws.id.clone(), id);
            let token = Token(WORKER_BASE + 2 + n);
            supervisor.add_program_host(spec, id, token, stdin, host, allowed);
        }
        let first = WORKER_BASE + 2 + ws_workers.len();
        let locals = crate::stdio_server::hosting::plan_servers(
            &config,
            &agents,
            supervisor.secrets(),
            &protected,
        )
        .map_err(|e| format!("servers: {e}"))?;
        for (k, p) in locals.into_iter().enumerate() {
            let id = core.add_worker(&p.spec.name, &p.spec.server);
            supervisor.add_program_host(p.spec, id, Token(first + k), p.stdin, p.host, p.allowed);
            if let Some(u) = upstreams.as_mut() {
                u.route(id, p.setup);
            }
        }
        if let Some(u) = upstreams {
            core.set_upstreams(u);
        }
        supervisor.agents = Some(agents);
        if !ws_workers.is_empty() {
            let directory = crate::workspace::WorkspaceDirectory::new(&config.workspaces)
                .map_err(|e| format!("workspaces: {e}"))?;
            core.set_workspaces(directory, ws_workers);
        }

        let door_limits = DoorLimits::from_config(&config);
        let partial_limits = crate::gateway::door_limits::PartialLimits::from_config(&config);
        let mut gw = Gateway {
            poll,
            config,
            core,
            supervisor,
            conns: Vec::new(),
            free: Vec::new(),
            generation: 0,
            live_conns: 0,
            listeners: listeners_out,
            admin,
            signals,
            doors: doors::DoorState::new(door_limits, partial_limits),
            to_flush: Vec::new(),
            actions: Vec::new(),
            stdio: None,
            stdio_slot: None,
            waker,
            stop_deadline: None,
            stop_now: false,
            announced_ready: false,
            serving: false,
            started: Instant::now(),
            last_reload: None,
            reloads: 0,
            notifier: from_systemd.notifier,
            watchdog: from_systemd
                .watchdog_period
                .map(|p| systemd::WatchdogTimer::new(p, Instant::now())),
            status_sent: (String::new(), Instant::now()),
            http: http_door,
            pins,
        };
        if let Some(period) = gw.watchdog.as_ref().map(systemd::WatchdogTimer::period) {
            crate::info!(
                "systemd watchdog: pinging every {} ms from the loop",
                period.as_millis()
            );
        }
        for l in &gw.listeners {
            crate::info!("listening on {}", l.describe());
        }
        if let Some(path) = gw.admin.as_ref().map(|_| gw.config.admin.socket.clone()) {
            crate::info!("admin socket {}", path.display());
        }
        crate::info!("ledger {}", gw.config.ledger.path.display());
        gw.core.event(
            "gateway_start",
            serde_json::json!({"version": env!("CARGO_PKG_VERSION"), "mode": format!("{mode:?}").to_lowercase(),
                               "listeners": gw.listeners.iter().map(Listener::describe).collect::<Vec<_>>(),
                               "config": origin}),
        );
        if mode == Mode::Stdio {
            gw.open_stdio().map_err(|e| format!("stdio: {e}"))?;
        }
        Ok(gw)
    }

    pub(super) fn open_stdio(&mut self) -> io::Result<()> {
        let side = StdioSide::start(Arc::clone(&self.waker))?;
        // The agent that started us is our parent.
        // SAFETY: getppid/getuid cannot fail.
        let (ppid, uid) = unsafe { (libc::getppid(), libc::getuid()) };
        let peer = Peer {
            transport: Transport::Stdio,
            principal: format!("uid:{uid}"),
            process: listeners::process_name(ppid).unwrap_or_else(|| "unknown".into()),
        };
        let guard = ConnGuard::new(Door::Stdio, None, Instant::now());
        let slot = self.insert_conn(ConnIo::Stdio, Wire::Lines(LineInbound::new()), peer, guard);
        // The agent started us as its own uid: an admin socket it can reach would let it
        // approve its own asks, so asks go to the operator only when it cannot.
        let admin = self
            .admin
            .as_ref()
            .map(|_| self.config.admin.socket.as_path());
        let route = crate::gateway::stdio::ask_route(admin, ppid);
        if route == crate::gateway::core::AskRoute::Refuse {
            crate::info!(
                "ask rules refuse their calls here: no admin socket out of the agent's reach (see README, toolwall stdio)"
            );
        }
        self.core.set_ask_route(route);
        self.stdio = Some(side);
        self.stdio_slot = Some(slot);
        Ok(())
    }
}

/// A workspace on the ledger's filesystem can fill it, and a full ledger refuses every
/// call (fail closed): say so at start, since no quota can be set from here.
fn warn_shared_filesystems(config: &Config) {
    use std::os::unix::fs::MetadataExt;
    let Ok(state) = std::fs::metadata(config.state_dir()) else {
        return;
    };
    for (name, ws) in &config.workspaces.0 {
        if std::fs::metadata(&ws.root).is_ok_and(|m| m.dev() == state.dev()) {
            crate::warn!(
                "workspace {name}: its root {} is on the same filesystem as the ledger ({}): a program there that fills the disk stops every call until space is freed; put workspaces on a filesystem of their own (or one with quotas)",
                ws.root.display(),
                config.state_dir().display()
            );
        }
    }
}
