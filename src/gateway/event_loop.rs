//! The gateway's one thread: a mio loop that moves bytes and timers. Every decision is the
//! core's; each turn ends with one ledger commit, and only then do answers and worker
//! requests leave.
//!
//! This file holds the loop itself (`run`, the end of a turn, the commit, worker events).
//! Around it: `startup.rs` builds the gateway; `conns.rs` is the connection table and
//! delivers answers; one servicer per wire (`framed_lines.rs`, `http_service.rs`,
//! `admin_service.rs`); `doors.rs` holds the doors' budgets and deadlines; `lifecycle.rs`
//! signals, reload, readiness and stop; `observability.rs` `/health` and `/metrics`. The
//! child modules share this file's imports (`use super::*`).

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

mod admin_service;
mod conns;
mod doors;
mod framed_lines;
mod http_service;
mod lifecycle;
mod observability;
mod pin_io;
mod relay;
mod server_set;
mod startup;

use conns::{Conn, ConnIo, Outgoing, Wire};
pub use startup::{builtin_spec, workspace_protected_paths};

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
    /// The core's released actions, drained each turn and handed back to it (one
    /// allocation for the run rather than one per turn).
    actions: Vec<Action>,
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
    /// The pin store's connection and the listing intake, when upstream servers are
    /// configured (`event_loop/pin_io.rs`).
    pins: Option<pin_io::PinIo>,
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

impl Gateway {
    /// Open the ledger, bind the doors, start the workers. Errors name what failed.
    pub fn new(config: Config, mode: Mode) -> Result<Gateway, String> {
        Gateway::with_systemd(config, mode, FromSystemd::default())
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
            self.tell_output_waiting();
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
                            event.is_read_closed() || event.is_error(),
                            &mut worker_events,
                        );
                    }
                    Token(t) => {
                        let slot = t - CONN_BASE;
                        if event.is_writable() {
                            self.flush_conn(slot);
                        }
                        if event.is_read_closed() || event.is_error() {
                            self.on_hang_up(slot);
                        }
                        if event.is_readable() || event.is_read_closed() {
                            self.service_conn(slot, now);
                        }
                        // Closed both ways (not a half-close): no answer can be read.
                        if event.is_write_closed() && event.is_read_closed() {
                            self.on_peer_gone(slot, now);
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
            self.tell_output_waiting();
            self.resume_paused(now);
            // Before the turn's last commit: the answers that ending an agent's held calls
            // gives are written before a finished connection closes.
            self.report_eofs(now);
            self.end_turn(now, &mut worker_events);
            self.close_finished();
            if let Some(exit) = self.check_exit(now) {
                return Ok(exit);
            }
        }
    }

    /// Commit, then release this turn's actions; repeat while releasing produced more.
    fn end_turn(&mut self, now: Instant, worker_events: &mut Vec<WorkerEvent>) {
        for _ in 0..8 {
            self.pump_pins(now);
            self.commit();
            let mut actions = std::mem::take(&mut self.actions);
            actions.clear();
            self.core.swap_actions(&mut actions);
            if actions.is_empty() {
                self.actions = actions;
                break;
            }
            for action in actions.drain(..) {
                self.execute(action);
            }
            self.actions = actions;
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

    /// Commit what the core staged and tell it how that went: only then may its actions
    /// leave (the core turns them into refusals when the commit failed).
    fn commit(&mut self) {
        // Staged rows, or the chain's waiting rows and a signature that fell due.
        if self.core.records().has_work() {
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
            Action::Relay {
                conn,
                bytes,
                request_id,
                ..
            } => self.deliver_relay(conn, &bytes, request_id.as_deref()),
            Action::ToWorker { worker, call, msg } => {
                if let Err(why) = self.supervisor.send(worker, &msg)
                    && let Some(key) = call
                {
                    self.core.fail_unsent(key, &why, Instant::now());
                }
            }
        }
    }

    fn next_timeout(&self) -> Option<Duration> {
        let now = Instant::now();
        let candidates = [
            self.core.next_deadline(),
            // The ledger's waiting chain rows and checkpoint signatures.
            self.core.records().next_deadline(),
            self.supervisor.next_deadline(),
            self.doors.check_at,
            self.stop_deadline,
            (!self.serving).then_some(self.started + START_GRACE),
            self.watchdog.as_ref().map(systemd::WatchdogTimer::deadline),
            self.doors.yielded.then_some(now),
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
}
