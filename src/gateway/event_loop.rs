//! The gateway's one thread: a mio loop that moves bytes and timers. Every decision is the
//! core's; each turn ends with one ledger commit, and only then do answers and worker
//! requests leave.

use mio::net::UnixStream;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::gateway::admin;
use crate::gateway::core::{Action, ConnRef, Core, Expect, Peer};
use crate::gateway::door_limits::{ConnGuard, Door, DoorLimits, Seat};
use crate::gateway::http_door::{HttpConn, HttpDoor, Step};
use crate::gateway::listeners::{self, Listener};
use crate::gateway::stdio::StdioSide;
use crate::ledger::Ledger;
use crate::mcp::catalog::LOCAL_SERVER;
use crate::policy::{Policy, Transport};
use crate::sandbox::{self, Role};
use crate::systemd;
use crate::transport::framed::{self, FramedInbound, Inbound};
use crate::transport::lines::{Line, LineInbound};
use crate::transport::write_interest::WriteInterest;
use crate::workers::settings::WorkerSettings;
use crate::workers::supervisor::{Supervisor, WorkerEvent, WorkerSpec};

mod doors;

const SIGNALS: Token = Token(0);
const WAKE: Token = Token(1);
const ADMIN: Token = Token(2);
const LISTENER_BASE: usize = 16;
const WORKER_BASE: usize = 256;
const CONN_BASE: usize = 4096;
/// At stop, how long requests already sent are still read and refused, and how long
/// without a new one ends that early.
const LINGER: Duration = Duration::from_millis(500);
const LINGER_QUIET: Duration = Duration::from_millis(50);
/// Longest wait for the workers before agents are served anyway.
const START_GRACE: Duration = Duration::from_secs(20);

/// How the gateway runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The daemon: listeners from the config.
    Serve,
    /// One host agent on stdin/stdout; no agent listeners.
    Stdio,
}

enum ConnIo {
    Unix(UnixStream),
    Vsock(vsock::VsockStream),
    Tcp(mio::net::TcpStream),
    /// Slot of the stdio connection: bytes move through [`StdioSide`].
    Stdio,
}

enum Wire {
    Framed(FramedInbound),
    Lines(LineInbound),
    /// The admin socket: JSON lines, never an agent.
    Admin(LineInbound),
    /// The Streamable HTTP door.
    Http(Box<HttpConn>),
}

struct Conn {
    generation: u64,
    io: ConnIo,
    wire: Wire,
    peer: Peer,
    out: Vec<u8>,
    out_pos: usize,
    read_closed: bool,
    /// The core was told the agent stopped sending (its held asks end then).
    eof_reported: bool,
    /// Set when the stream became unframeable or a write failed: close now.
    broken: bool,
    partial_since: Option<Instant>,
    /// Reading stopped by a bound (in-flight, queued output); resume when it clears.
    paused: bool,
    /// Registered writable only while output waits.
    write_interest: WriteInterest,
    /// Its seat in the doors' budgets and the facts its deadlines are measured from.
    guard: ConnGuard,
}

impl Conn {
    fn queued(&self) -> usize {
        self.out.len() - self.out_pos
    }
}

impl Read for ConnIo {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            ConnIo::Unix(s) => s.read(buf),
            ConnIo::Vsock(s) => s.read(buf),
            ConnIo::Tcp(s) => s.read(buf),
            ConnIo::Stdio => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

impl ConnIo {
    /// Re-registers the socket for `interest`; the stdio slot has no socket.
    fn reregister(
        &mut self,
        registry: &Registry,
        token: Token,
        interest: Interest,
    ) -> io::Result<()> {
        match self {
            ConnIo::Unix(s) => registry.reregister(s, token, interest),
            ConnIo::Tcp(s) => registry.reregister(s, token, interest),
            ConnIo::Vsock(s) => registry.reregister(&mut SourceFd(&s.as_raw_fd()), token, interest),
            ConnIo::Stdio => Ok(()),
        }
    }
}

impl Write for ConnIo {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            ConnIo::Unix(s) => s.write(buf),
            ConnIo::Vsock(s) => s.write(buf),
            ConnIo::Tcp(s) => s.write(buf),
            ConnIo::Stdio => Ok(buf.len()),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Why the loop ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Exit {
    Stopped,
    StdinClosed,
}

pub struct Gateway {
    poll: Poll,
    config: Config,
    core: Core,
    supervisor: Supervisor,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    generation: u64,
    live_conns: usize,
    listeners: Vec<Listener>,
    admin: Option<mio::net::UnixListener>,
    signals: SignalFd,
    /// Budgets, deadlines and tallies of the doors (`event_loop/doors.rs`).
    doors: doors::DoorState,
    /// Connections given output by this pass of `end_turn`: each is written once, after
    /// every action of the pass, not once per answer.
    to_flush: Vec<usize>,
    stdio: Option<StdioSide>,
    stdio_slot: Option<usize>,
    waker: Arc<Waker>,
    stop_deadline: Option<Instant>,
    stop_now: bool,
    announced_ready: bool,
    /// Agents are served once the workers attested and listed their tools (or the start
    /// grace passed), so the first `tools/list` sees the whole catalog.
    serving: bool,
    pub started: Instant,
    pub last_reload: Option<String>,
    pub reloads: u64,
    notifier: Option<systemd::Notifier>,
    watchdog: Option<systemd::WatchdogTimer>,
    /// The Streamable HTTP door, when `[listen] http` is set.
    http: Option<HttpDoor>,
    /// The last STATUS= line sent, and when: sent again when it changes, at most once a second.
    status_sent: (String, Instant),
}

/// What systemd handed the process; taken first thing in `serve`, before any fd is opened.
#[derive(Default)]
pub struct FromSystemd {
    pub inherited: Vec<systemd::InheritedSocket>,
    pub notifier: Option<systemd::Notifier>,
    pub watchdog_period: Option<Duration>,
}

/// Frames of the current turn, for [`Gateway::deliver`].
enum Outgoing<'a> {
    Reply(u32, &'a [u8]),
    Notification(&'a [u8]),
}

impl Gateway {
    /// Open the ledger, bind the doors, start the workers. Errors name what failed.
    pub fn new(config: Config, mode: Mode) -> Result<Gateway, String> {
        Gateway::with_systemd(config, mode, FromSystemd::default())
    }

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
        let id = core.add_worker(&spec.name, &spec.server);
        supervisor.add(spec, id, Token(WORKER_BASE));
        // Upstream servers: url servers through the aggregator worker, each local server
        // through a host of its own (added below, with the workspaces' agent users).
        let mut upstreams = config.servers.enabled().next().map(|_| {
            crate::aggregator::gateway_state::UpstreamsState::empty(
                &config.servers,
                &config.ledger.path,
                Arc::clone(&waker),
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
            doors: doors::DoorState::new(door_limits),
            to_flush: Vec::new(),
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

    fn open_stdio(&mut self) -> io::Result<()> {
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

    pub fn core(&self) -> &Core {
        &self.core
    }

    pub fn core_mut(&mut self) -> &mut Core {
        &mut self.core
    }

    pub fn supervisor(&self) -> &Supervisor {
        &self.supervisor
    }

    pub fn supervisor_mut(&mut self) -> &mut Supervisor {
        &mut self.supervisor
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn live_connections(&self) -> usize {
        self.live_conns
    }

    fn insert_conn(&mut self, io: ConnIo, wire: Wire, peer: Peer, guard: ConnGuard) -> usize {
        self.generation += 1;
        let conn = Conn {
            generation: self.generation,
            io,
            wire,
            peer,
            out: Vec::new(),
            out_pos: 0,
            read_closed: false,
            eof_reported: false,
            broken: false,
            partial_since: None,
            paused: false,
            write_interest: WriteInterest::default(),
            guard,
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.conns[slot] = Some(conn);
                slot
            }
            None => {
                self.conns.push(Some(conn));
                self.conns.len() - 1
            }
        };
        self.live_conns += 1;
        if let Some(c) = self.conns[slot].as_ref()
            && !matches!(c.wire, Wire::Admin(_))
            && c.guard.seat.as_ref().is_none_or(Seat::is_agent)
        {
            let r = ConnRef {
                slot,
                generation: c.generation,
            };
            let peer = c.peer.clone();
            if let Some(Some(c)) = self.conns.get_mut(slot) {
                c.guard.announced = true;
            }
            self.core.on_connect(r, &peer);
        }
        slot
    }

    /// Run until stopped (serve) or until stdin ends (stdio).
    pub fn run(&mut self) -> Result<Exit, String> {
        let mut events = Events::with_capacity(1024);
        let mut worker_events = Vec::new();
        let now = Instant::now();
        self.supervisor
            .on_timers(self.poll.registry(), now, &mut worker_events);
        self.apply_worker_events(&mut worker_events, now);
        loop {
            let timeout = self.next_timeout();
            match self.poll.poll(&mut events, timeout) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("poll: {e}")),
            }
            let now = Instant::now();
            self.core.set_wall_clock(now, crate::ledger::now_ms());
            for event in events.iter() {
                match event.token() {
                    SIGNALS => self.on_signals(now, &mut worker_events),
                    WAKE => {
                        if let Some(slot) = self.stdio_slot {
                            self.service_conn(slot, now);
                        }
                    }
                    ADMIN => self.accept_admin(),
                    Token(t) if (LISTENER_BASE..WORKER_BASE).contains(&t) => {
                        self.accept(t - LISTENER_BASE)
                    }
                    Token(t) if (WORKER_BASE..CONN_BASE).contains(&t) => {
                        self.supervisor.on_io(
                            Token(t),
                            self.poll.registry(),
                            now,
                            &mut worker_events,
                        );
                    }
                    Token(t) => {
                        let slot = t - CONN_BASE;
                        if event.is_writable() {
                            self.flush_conn(slot);
                        }
                        if event.is_readable() || event.is_read_closed() {
                            self.service_conn(slot, now);
                        }
                    }
                }
            }
            self.supervisor
                .on_timers(self.poll.registry(), now, &mut worker_events);
            self.apply_worker_events(&mut worker_events, now);
            self.core.on_timers(now);
            self.sweep_doors(now);
            self.end_turn(now, &mut worker_events);
            self.maybe_announce_ready();
            self.tell_systemd();
            self.resume_paused(now);
            self.end_turn(now, &mut worker_events);
            self.report_eofs(now);
            self.close_finished();
            if let Some(exit) = self.check_exit(now) {
                return Ok(exit);
            }
        }
    }

    /// Commit, then release this turn's actions; repeat while releasing produced more.
    fn end_turn(&mut self, now: Instant, worker_events: &mut Vec<WorkerEvent>) {
        for _ in 0..8 {
            self.commit();
            let actions = self.core.take_actions();
            if actions.is_empty() {
                break;
            }
            for action in actions {
                self.execute(action);
            }
            self.to_flush.sort_unstable();
            self.to_flush.dedup();
            let to_flush = std::mem::take(&mut self.to_flush);
            for &slot in &to_flush {
                self.flush_conn(slot);
            }
            self.to_flush = to_flush;
            self.to_flush.clear();
            self.supervisor
                .flush_all(self.poll.registry(), now, worker_events);
            self.apply_worker_events(worker_events, now);
        }
    }

    /// An agent that closed its sending side (EOF) can no longer act on a held call: the
    /// core ends its asks (calls already at a worker still finish and are answered).
    fn report_eofs(&mut self, now: Instant) {
        for (slot, c) in self.conns.iter_mut().enumerate() {
            let Some(c) = c.as_mut() else { continue };
            if c.read_closed && !c.eof_reported && !matches!(c.wire, Wire::Admin(_)) {
                c.eof_reported = true;
                let conn = ConnRef {
                    slot,
                    generation: c.generation,
                };
                self.core.on_agent_eof(conn, now);
            }
        }
    }

    /// Commit what the core staged and tell it how that went: only then may its actions
    /// leave (the core turns them into refusals when the commit failed).
    fn commit(&mut self) {
        if self.core.records().staged() > 0 {
            let started = Instant::now();
            let outcome = self
                .core
                .records_mut()
                .commit()
                .map(|_| ())
                .map_err(|e| e.to_string());
            self.core.after_commit(outcome, started.elapsed());
        }
        for (level, line) in self.core.take_logs() {
            crate::log::write(level, format_args!("{line}"));
        }
    }

    fn execute(&mut self, action: Action) {
        match action {
            Action::Reply {
                conn,
                stream,
                bytes,
                ..
            } => self.deliver(conn, Outgoing::Reply(stream, &bytes)),
            Action::Push {
                conn,
                stream,
                bytes,
            } => self.deliver(conn, Outgoing::Reply(stream, &bytes)),
            Action::Notify { conn, bytes } => self.deliver(conn, Outgoing::Notification(&bytes)),
            Action::ToWorker { worker, call, msg } => {
                if let Err(why) = self.supervisor.send(worker, &msg)
                    && let Some(key) = call
                {
                    self.core.fail_unsent(key, &why, Instant::now());
                }
            }
        }
    }

    fn deliver(&mut self, conn: ConnRef, out: Outgoing) {
        let Some(Some(c)) = self.conns.get_mut(conn.slot) else {
            return;
        };
        if c.generation != conn.generation || c.broken {
            return;
        }
        // A line transport carries one message per line: a message with a raw line break
        // (which the core never produces) is dropped rather than split into two.
        let unframed = matches!(c.io, ConnIo::Stdio) || matches!(c.wire, Wire::Lines(_));
        if unframed {
            let (Outgoing::Reply(_, bytes) | Outgoing::Notification(bytes)) = &out;
            if !crate::transport::lines::is_one_line(bytes) {
                crate::error!("a message with a raw line break was withheld from a line transport");
                return;
            }
        }
        match (&c.io, &c.wire) {
            (ConnIo::Stdio, _) => {
                let bytes = match out {
                    Outgoing::Reply(_, b) | Outgoing::Notification(b) => b,
                };
                if let Some(side) = self.stdio.as_mut() {
                    side.write(bytes.to_vec());
                }
                return;
            }
            (_, Wire::Framed(_)) => match out {
                Outgoing::Reply(stream, b) => framed::encode_reply(&mut c.out, stream, false, b),
                Outgoing::Notification(b) => framed::encode_reply(&mut c.out, 0, true, b),
            },
            (_, Wire::Http(_)) => {
                // An HTTP answer is the response to the one request the core holds; no
                // stream carries notifications (no SSE), so those are dropped.
                let Outgoing::Reply(_, bytes) = out else {
                    return;
                };
                let (Some(door), Wire::Http(h)) = (self.http.as_mut(), &mut c.wire) else {
                    return;
                };
                door.answer(h, bytes, &mut c.out, Instant::now());
                // The next pipelined request, if any, is parsed by resume_paused.
                c.paused = true;
            }
            _ => {
                let b = match out {
                    Outgoing::Reply(_, b) | Outgoing::Notification(b) => b,
                };
                c.out.extend_from_slice(b);
                c.out.push(b'\n');
            }
        }
        self.to_flush.push(conn.slot);
    }

    fn flush_conn(&mut self, slot: usize) {
        let Some(Some(c)) = self.conns.get_mut(slot) else {
            return;
        };
        let mut written = 0;
        while c.out_pos < c.out.len() {
            match c.io.write(&c.out[c.out_pos..]) {
                Ok(0) => {
                    c.broken = true;
                    break;
                }
                Ok(n) => {
                    c.out_pos += n;
                    written += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    c.broken = true;
                    break;
                }
            }
        }
        if c.out_pos == c.out.len() {
            c.out.clear();
            c.out_pos = 0;
            if c.out.capacity() > 1 << 20 {
                c.out.shrink_to(64 * 1024);
            }
        } else if c.out_pos > c.out.len() / 2 {
            c.out.drain(..c.out_pos);
            c.out_pos = 0;
        }
        let pending = c.out_pos < c.out.len();
        if written > 0 || pending || c.guard.write_blocked_since.is_some() {
            c.guard.on_write(written, pending, Instant::now());
        }
        let token = Token(CONN_BASE + slot);
        let registry = self.poll.registry();
        if c.write_interest
            .update(pending, |interest| {
                c.io.reregister(registry, token, interest)
            })
            .is_err()
        {
            c.broken = true;
        }
    }

    /// An HTTP connection: read, parse, hand one request at a time to the core.
    fn service_http(&mut self, slot: usize, now: Instant) {
        loop {
            let step = {
                let (Some(door), Some(Some(c))) = (self.http.as_mut(), self.conns.get_mut(slot))
                else {
                    return;
                };
                let conn = ConnRef {
                    slot,
                    generation: c.generation,
                };
                let queued = c.queued();
                let Wire::Http(h) = &mut c.wire else { return };
                if !self.serving
                    || self.core.in_flight_total() >= self.config.gateway.max_in_flight_total
                    || queued > self.config.gateway.max_write_buffer_bytes
                {
                    c.paused = true;
                    return;
                }
                c.paused = false;

                loop {
                    match door.process(h, &mut c.out, &mut self.core, conn, now) {
                        Step::NeedBytes => {}
                        // A call is with the core: still read (pipelined bytes, bounded),
                        // to see the client close, which cancels a modern-era call.
                        Step::Waiting if h.is_waiting() => {}
                        Step::Waiting => break None,
                        other => break Some(other),
                    }
                    let room = door.read_room(h).min(16 * 1024);
                    if c.read_closed || c.broken || h.closing || room == 0 {
                        break None;
                    }
                    let mut buf = [0u8; 16 * 1024];
                    match c.io.read(&mut buf[..room]) {
                        Ok(0) => {
                            c.read_closed = true;
                            if h.is_waiting() && h.pending_is_modern() {
                                c.broken = true;
                            }
                            break None;
                        }
                        Ok(n) => {
                            c.guard.on_read(n, now);
                            if let Err(e) = door.on_bytes(h, &buf[..n], &mut c.out, now) {
                                crate::debug!("http connection of {}: {e}", c.peer.principal);
                                h.closing = true;
                                break None;
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break None,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => {
                            c.broken = true;
                            break None;
                        }
                    }
                }
            };
            match step {
                Some(Step::Health { keep_alive }) => {
                    let report = self.health_report();
                    if let (Some(door), Some(Some(c))) =
                        (self.http.as_mut(), self.conns.get_mut(slot))
                        && let Wire::Http(h) = &mut c.wire
                    {
                        door.write_health(h, &report, keep_alive, &mut c.out);
                    }
                }
                Some(Step::Metrics { keep_alive }) => {
                    let text = crate::transport::http::metrics::render(&self.metrics());
                    if let (Some(door), Some(Some(c))) =
                        (self.http.as_mut(), self.conns.get_mut(slot))
                        && let Wire::Http(h) = &mut c.wire
                    {
                        door.write_metrics(h, &text, keep_alive, &mut c.out);
                    }
                }
                Some(Step::Seat { principal }) => {
                    let seated = self.seat_http(slot, &principal, now);
                    if let (Some(door), Some(Some(c))) =
                        (self.http.as_mut(), self.conns.get_mut(slot))
                        && let Wire::Http(h) = &mut c.wire
                    {
                        door.seated(h, seated, &mut c.out, now);
                    }
                }
                Some(Step::CancelElsewhere {
                    target,
                    principal,
                    payload,
                }) => self.cancel_elsewhere(target, principal, &payload, now),
                _ => break,
            }
        }
        self.flush_conn(slot);
    }

    /// What `/health` says.
    fn health_report(&self) -> crate::transport::http::HealthReport {
        let workers: Vec<serde_json::Value> = self
            .supervisor
            .workers
            .iter()
            .map(|w| serde_json::json!({"name": w.spec.name, "state": w.state.as_str(), "pid": w.pid, "restarts": w.restarts}))
            .collect();
        // The same verdict the supervisor gives a worker before it gets work.
        let confined = self
            .supervisor
            .workers
            .iter()
            .all(|w| w.report.as_ref().is_some_and(|r| r.gaps().is_empty()));
        crate::transport::http::HealthReport {
            serving: self.announced_ready && self.core.ledger_ok() && self.stop_deadline.is_none(),
            workers: serde_json::Value::Array(workers),
            sandbox: serde_json::json!({"mode": format!("{:?}", self.config.sandbox.mode).to_lowercase(), "confined": confined}),
            ledger: serde_json::json!({"writable": self.core.ledger_ok()}),
        }
    }

    /// What `/metrics` says.
    fn metrics(&self) -> crate::transport::http::metrics::Metrics {
        let mut m = crate::transport::http::metrics::Metrics::default();
        let observed = &self.core.observed;
        m.requests = observed.requests.clone();
        m.policy_decisions = observed.policy_decisions.clone();
        m.tool_call_latency = observed.tool_call_latency.clone();
        m.ledger_commit_latency = observed.ledger_commit_latency.clone();
        m.ledger_commit_failures = self.core.counters.ledger_failures;
        m.in_flight = self.core.in_flight_total() as u64;
        for c in self.conns.iter().flatten() {
            if !matches!(c.wire, Wire::Admin(_)) {
                *m.connections.entry(c.peer.transport.as_str()).or_insert(0) += 1;
            }
        }
        for w in &self.supervisor.workers {
            m.worker_restarts
                .insert(w.spec.name.clone(), u64::from(w.restarts));
        }
        m.http_sessions = self.http.as_ref().map_or(0, |d| d.sessions() as u64);
        m.http_responses = self
            .http
            .as_ref()
            .map(HttpDoor::responses)
            .unwrap_or_default();
        m.connections_closed = self.doors.tally.closed.clone();
        m.connections_refused = self.doors.tally.refused.clone();
        m
    }

    /// Read and hand messages to the core while the bounds allow.
    fn service_conn(&mut self, slot: usize, now: Instant) {
        let limits = self.config.gateway.clone();
        let Some(Some(c)) = self.conns.get_mut(slot) else {
            return;
        };
        let conn = ConnRef {
            slot,
            generation: c.generation,
        };
        let is_stdio = matches!(c.io, ConnIo::Stdio);
        // Lingering, or kept only to be refused: nothing it sends is served.
        if c.guard.lingering_since.is_some()
            || (c.guard.close_when_drained && !matches!(c.wire, Wire::Http(_)))
        {
            self.discard_input(slot);
            return;
        }
        if matches!(c.wire, Wire::Admin(_)) {
            self.service_admin(slot);
            return;
        }
        if matches!(c.wire, Wire::Http(_)) {
            self.service_http(slot, now);
            return;
        }
        loop {
            let Some(Some(c)) = self.conns.get_mut(slot) else {
                return;
            };
            if !self.serving {
                c.paused = true;
                return;
            }
            // Bounds: in flight here, in flight everywhere, and output not drained.
            let queued = if is_stdio {
                self.stdio.as_ref().map_or(0, StdioSide::pending)
            } else {
                c.queued()
            };
            if self.core.in_flight(conn) >= limits.max_in_flight_per_connection
                || self.core.in_flight_total() >= limits.max_in_flight_total
                || queued > limits.max_write_buffer_bytes
            {
                c.paused = true;
                return;
            }
            c.paused = false;
            // Hand over one buffered message, if there is one.
            match &mut c.wire {
                Wire::Framed(inb) => match inb.next_inbound() {
                    Some(Inbound::Message {
                        stream,
                        expect,
                        process,
                        payload,
                    }) => {
                        let peer = &c.peer;
                        let process = if process.is_empty() {
                            peer.process.as_str()
                        } else {
                            process
                        };
                        self.core
                            .on_message(conn, peer, process, expect, stream, payload, now);
                        continue;
                    }
                    Some(Inbound::Refuse { stream, bytes }) => {
                        framed::encode_reply(&mut c.out, stream, false, &bytes);
                        self.flush_conn(slot);
                        continue;
                    }
                    Some(Inbound::Close(why)) => {
                        crate::warn!(
                            "closing {} connection of {}: {why}",
                            c.peer.transport.as_str(),
                            c.peer.principal
                        );
                        c.broken = true;
                        return;
                    }
                    None => {}
                },
                Wire::Lines(inb) => match inb.next_line() {
                    Some(Line::Message(payload)) => {
                        let peer = &c.peer;
                        self.core.on_message(
                            conn,
                            peer,
                            &peer.process,
                            Expect::Any,
                            0,
                            payload,
                            now,
                        );
                        continue;
                    }
                    Some(Line::Refuse(bytes)) => {
                        self.core.push_raw(conn, bytes);
                        continue;
                    }
                    None => {}
                },
                Wire::Admin(_) | Wire::Http(_) => return,
            }
            // Nothing whole is buffered: read more.
            if c.read_closed || c.broken {
                return;
            }
            if is_stdio {
                let Some(side) = self.stdio.as_mut() else {
                    return;
                };
                match side.try_input() {
                    Some(chunk) if chunk.is_empty() => {
                        c.read_closed = true;
                        return;
                    }
                    Some(chunk) => {
                        if let Wire::Lines(inb) = &mut c.wire {
                            inb.push(&chunk);
                        }
                    }
                    None => return,
                }
                continue;
            }
            let Wire::Framed(inb) = &mut c.wire else {
                return;
            };
            if inb.is_closed() {
                return;
            }
            let spare = inb.spare();
            match c.io.read(spare) {
                Ok(0) => {
                    inb.filled(0);
                    c.read_closed = true;
                    return;
                }
                Ok(n) => {
                    inb.filled(n);
                    c.guard.on_read(n, now);
                    if inb.has_partial() {
                        if c.partial_since.is_none() {
                            c.partial_since = Some(now);
                        }
                    } else {
                        c.partial_since = None;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    inb.filled(0);
                    if !inb.has_partial() {
                        c.partial_since = None;
                    }
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => inb.filled(0),
                Err(_) => {
                    inb.filled(0);
                    c.broken = true;
                    return;
                }
            }
        }
    }

    fn resume_paused(&mut self, now: Instant) {
        for slot in 0..self.conns.len() {
            if self.conns[slot]
                .as_ref()
                .is_some_and(|c| c.paused && !c.broken)
            {
                self.service_conn(slot, now);
            }
        }
        if let Some(slot) = self.stdio_slot {
            // stdin chunks may be waiting in the channel without a new wake.
            self.service_conn(slot, now);
        }
    }

    fn close_conn(&mut self, slot: usize) {
        self.on_conn_closing(slot, Instant::now());
        let Some(mut c) = self.conns[slot].take() else {
            return;
        };
        match &mut c.io {
            ConnIo::Unix(s) => {
                let _ = self.poll.registry().deregister(s);
            }
            ConnIo::Tcp(s) => {
                let _ = self.poll.registry().deregister(s);
            }
            ConnIo::Vsock(s) => {
                let _ = self
                    .poll
                    .registry()
                    .deregister(&mut SourceFd(&s.as_raw_fd()));
            }
            ConnIo::Stdio => {}
        }
        if c.guard.announced {
            self.core.on_disconnect(
                ConnRef {
                    slot,
                    generation: c.generation,
                },
                &c.peer,
                Instant::now(),
            );
        }
        self.free.push(slot);
        self.live_conns -= 1;
    }

    fn service_admin(&mut self, slot: usize) {
        let mut requests = Vec::new();
        {
            let Some(Some(c)) = self.conns.get_mut(slot) else {
                return;
            };
            let mut buf = [0u8; 16 * 1024];
            loop {
                match c.io.read(&mut buf) {
                    Ok(0) => {
                        c.read_closed = true;
                        break;
                    }
                    Ok(n) => {
                        c.guard.on_read(n, Instant::now());
                        if let Wire::Admin(inb) = &mut c.wire {
                            inb.push(&buf[..n]);
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        c.broken = true;
                        break;
                    }
                }
            }
            if let Wire::Admin(inb) = &mut c.wire {
                while let Some(line) = inb.next_line() {
                    match line {
                        Line::Message(bytes) => requests.push(bytes.to_vec()),
                        Line::Refuse(_) => c.broken = true,
                    }
                }
            }
        }
        for request in requests {
            let principal = match &self.conns[slot] {
                Some(c) => c.peer.principal.clone(),
                None => return,
            };
            let mut reply = admin::handle(self, &principal, &request)
                .to_string()
                .into_bytes();
            reply.push(b'\n');
            if let Some(Some(c)) = self.conns.get_mut(slot) {
                c.out.extend_from_slice(&reply);
            }
            self.flush_conn(slot);
        }
    }

    fn on_signals(&mut self, now: Instant, worker_events: &mut Vec<WorkerEvent>) {
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

    fn reload_config(&mut self) -> Result<String, String> {
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
            Ok((policy, config))
        })();
        self.reloads += 1;
        match result {
            Ok((policy, config)) => {
                let now = Instant::now();
                if config.servers != self.config.servers {
                    self.restart_changed_local_servers(&config);
                    let same_set = config.servers.same_connections(&self.config.servers);
                    self.core.reconfigure_upstreams(&config.servers, now);
                    if !same_set {
                        crate::warn!(
                            "reload: the set of [servers] changed; restart toolwall to reach the new ones (pin modes and refresh_secs apply now)"
                        );
                    }
                    self.config.servers = config.servers.clone();
                }
                self.core.refresh_upstreams(now);
                let rules = policy.rule_count();
                self.core.set_policy(Rc::new(policy), now);
                let mut summary = format!("policy reloaded: {rules} rules");
                // The HTTP door's settings and certificate follow; on error they stay.
                if let Some(door) = self.http.as_mut() {
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
                // Budgets and deadlines of every door follow; seats already given stay.
                self.doors
                    .budgets
                    .set_limits(DoorLimits::from_config(&config));
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

    fn begin_stop(&mut self, now: Instant) {
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

    fn check_exit(&mut self, now: Instant) -> Option<Exit> {
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
    fn finish(&mut self, now: Instant) {
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

    fn next_timeout(&self) -> Option<Duration> {
        let now = Instant::now();
        let candidates = [
            self.core.next_deadline(),
            self.supervisor.next_deadline(),
            self.doors.check_at,
            self.stop_deadline,
            (!self.serving).then_some(self.started + START_GRACE),
            self.watchdog.as_ref().map(systemd::WatchdogTimer::deadline),
        ];
        candidates.into_iter().flatten().min().map(|t| {
            t.saturating_duration_since(now)
                .max(Duration::from_millis(1))
        })
    }

    fn apply_worker_events(&mut self, events: &mut Vec<WorkerEvent>, now: Instant) {
        for event in events.drain(..) {
            match event {
                WorkerEvent::Started(id, pid) => {
                    let name = self.core.workers()[id].name.clone();
                    self.core.event(
                        "worker_start",
                        serde_json::json!({"worker": name, "pid": pid}),
                    );
                }
                WorkerEvent::Ready(id, warnings) => {
                    let w = self.supervisor.workers.iter().find(|w| w.id == id);
                    let report = w.and_then(|w| w.report.clone());
                    let name = self.core.workers()[id].name.clone();
                    crate::info!(
                        "worker {name} (pid {}) attested and ready",
                        w.and_then(|w| w.pid).unwrap_or(0)
                    );
                    let gaps = report.as_ref().map(|r| r.gaps());
                    self.core.event(
                        "worker_ready",
                        serde_json::json!({"worker": name, "confinement": report, "warnings": warnings,
                                           "confined": gaps.as_ref().is_some_and(Vec::is_empty), "gaps": gaps}),
                    );
                    self.core.on_worker_ready(id, now);
                }
                WorkerEvent::Message(id, msg) => self.core.on_worker_message(id, msg, now),
                WorkerEvent::Gone(id, why) => {
                    let name = self.core.workers()[id].name.clone();
                    self.core.event(
                        "worker_gone",
                        serde_json::json!({"worker": name, "reason": why}),
                    );
                    self.core.on_worker_gone(id, &why, now);
                }
                WorkerEvent::Exited(id, pid, how) => {
                    let name = self.core.workers()[id].name.clone();
                    self.core.event(
                        "worker_exit",
                        serde_json::json!({"worker": name, "pid": pid, "status": how}),
                    );
                }
            }
        }
    }

    fn maybe_announce_ready(&mut self) {
        if !self.serving && self.started.elapsed() >= START_GRACE {
            crate::warn!(
                "serving agents before every worker is ready ({} s passed)",
                START_GRACE.as_secs()
            );
            self.serving = true;
        }
        if !self.serving && self.supervisor.all_settled() && !self.supervisor.all_ready() {
            crate::warn!(
                "serving agents while a worker is down; its tools answer worker_unavailable"
            );
            self.serving = true;
        }
        if self.announced_ready || !self.supervisor.all_ready() || self.core.listings_pending() > 0
        {
            return;
        }
        self.announced_ready = true;
        self.serving = true;
        let line = self.status_line();
        self.notify(|n| n.ready_with_status(&line));
        self.status_sent = (line, Instant::now());
        crate::info!(
            "ready: {} tools",
            self.core.catalog().len(crate::mcp::catalog::Kind::Tools)
        );
    }

    pub fn is_ready(&self) -> bool {
        self.announced_ready
    }

    /// Send one state to systemd, if it listens; a failure is logged, never waited on.
    fn notify(&self, send: impl FnOnce(&systemd::Notifier) -> io::Result<()>) {
        if let Some(n) = &self.notifier
            && let Err(e) = send(n)
        {
            crate::warn!("sd_notify to {}: {e}", n.address());
        }
    }

    fn status_line(&self) -> String {
        let facts = systemd::StatusFacts {
            ready: self.announced_ready,
            stopping: self.stop_deadline.is_some(),
            calls_served: self.core.counters.calls_total,
            in_flight: self.core.in_flight_total(),
            workers_ready: self.core.workers().iter().filter(|w| w.ready).count(),
            workers_total: self.core.workers().len(),
            last_reload: self.last_reload.clone(),
        };
        systemd::status_line(&facts)
    }

    /// The watchdog ping (from the loop itself, so a stuck loop is caught) and STATUS=.
    fn tell_systemd(&mut self) {
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

/// The doors the config asks for: sockets systemd passed are used (matched by name and
/// address), the rest are bound here; every mismatch is explained in the log.
fn open_listeners(
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
