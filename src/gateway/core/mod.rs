//! The gateway's decisions as a pure state machine: messages, worker events, approvals and
//! the current time in; actions, staged ledger records and log lines out. No sockets,
//! SQLite, files, clock reads or logging happen in here (tested in `tests.rs` without any).
//!
//! Every request that reaches a server crosses one pipeline (`pipeline.rs`):
//!
//! ```text
//!  agent ─ on_message ─ dispatch ─┬─ gateway's own answer (initialize, ping, lists)
//!                                 └─ route ─ request phase ─ record ─┬─ refuse ─ record ─┐
//!                                                                    ├─ hold (ask) ──────┤
//!                                                                    └─ forward          │
//!  worker ─ on_worker_message ─ response phase (results and errors, all blocks) ─ record ┤
//!                                                                                        ▼
//!                                  commit barrier: staged rows committed, then the answer
//! ```
//!
//! Nothing an agent receives is an upstream's raw bytes: answers are serialized from the
//! value the response phase judged, and requests from the value the request phase judged.
//! The loop commits the staged records after each turn and calls [`Core::after_commit`];
//! only then are the actions released. A failed commit turns them into refusals, and the
//! rows of those calls end as `error` (fail closed, recorded once the ledger can be written).

mod approvals;
mod barrier;
mod calls;
mod client_ask;
#[cfg(test)]
mod client_ask_tests;
mod dispatch;
mod exchange;
mod fair_lanes;
mod forwarded;
mod input_retry;
mod list_events;
mod listings;
mod observed;
#[cfg(test)]
mod pins_tests;
mod pipeline;
mod principal_share;
mod queued_bytes;
mod recorder;
mod relay;
#[cfg(test)]
mod relay_tests;
mod reloaded_servers;
mod request_state;
mod subscriptions;
#[cfg(test)]
mod tests;
mod upstream_listings;
mod worker_events;

use serde_json::Value;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::aggregator::gateway_state::UpstreamsState;
use crate::config::GatewayConfig;
use crate::ledger::Ledger;
use crate::log::Level;
use crate::mcp::catalog::{Catalog, WorkerId};
use crate::policy::{Policy, Transport};
use crate::workers::rpc;

pub use approvals::PendingApproval;
pub use client_ask::MAX_USED_APPROVALS;
pub use observed::{Counters, Observed};
pub use recorder::Recorder;
pub use relay::ConnFacts;
pub use request_state::{Claims, MASTER_KEY_BYTES, StateKey};

/// Claims for tests of sealing outside the core.
#[cfg(test)]
pub fn test_claims() -> Claims {
    Claims {
        kind: "input".into(),
        principal: "p".into(),
        tool: "t".into(),
        args: String::new(),
        policy: String::new(),
        rule: String::new(),
        expires_ms: 1,
        call: 1,
        round: 1,
        nonce: "n".into(),
    }
}

use calls::CallTable;

/// A connection as the core knows it: its slot in the loop and a generation, so an answer
/// for a closed connection never reaches the next one in the same slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnRef {
    pub slot: usize,
    pub generation: u64,
}

/// Who is at the other end of a connection.
#[derive(Debug, Clone)]
pub struct Peer {
    pub transport: Transport,
    pub principal: String,
    /// The process name when a message does not carry its own.
    pub process: String,
}

/// What the transport says a payload must be (framed flags), or `Any`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    Any,
    Request,
    Notification,
}

#[derive(Debug)]
pub enum Action {
    /// The one answer to a request on `stream` (0 for unframed transports).
    Reply {
        conn: ConnRef,
        stream: u32,
        /// The request's raw id, to rebuild the answer as a refusal if the commit fails.
        id: String,
        /// The `tool_calls` row this answer ends, to record a withheld answer as such.
        row: Option<i64>,
        bytes: Vec<u8>,
    },
    /// An answer to a faulty message (not a request the core accepted).
    Push {
        conn: ConnRef,
        stream: u32,
        bytes: Vec<u8>,
    },
    /// A notification for the agent (stream 0, notification flag on framed doors).
    Notify { conn: ConnRef, bytes: Vec<u8> },
    /// A message a server sent during call `call` (a notification, or a request with the
    /// gateway's id `request_id`), relayed to the agent whose request `stream` it serves:
    /// framed doors carry it on stream 0 as a notification frame, line doors as a line,
    /// the HTTP door in the event stream of the request it serves. Recorded first: a
    /// failed commit drops it.
    Relay {
        conn: ConnRef,
        stream: u32,
        call: u64,
        bytes: Vec<u8>,
        request_id: Option<String>,
    },
    /// A request to a worker; `call` names the call it serves.
    ToWorker {
        worker: WorkerId,
        call: Option<u64>,
        msg: rpc::Message,
    },
}

/// A worker as the core sees it.
#[derive(Debug, Clone)]
pub struct WorkerView {
    pub name: String,
    pub server: String,
    pub ready: bool,
}

/// Who may answer an `ask`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AskRoute {
    /// The operator over the admin socket (which no agent's uid can reach).
    Operator,
    /// Nobody the agent cannot impersonate: asks are refused (`toolwall stdio` when the
    /// admin socket belongs to the agent's own uid).
    Refuse,
}

#[derive(Debug, Default)]
struct Session {
    protocol_version: Option<&'static str>,
    /// The client's era and declared capabilities (see `relay.rs`).
    facts: ConnFacts,
    /// Resource URIs this session is subscribed to (`subscriptions.rs`).
    subscribed: subscriptions::SessionSubscriptions,
}

/// Wall-clock time derived from the loop's monotonic `now`, anchored by the loop once per
/// turn: the core never reads a clock.
#[derive(Debug, Clone, Copy)]
struct WallClock {
    at: Instant,
    ms: i64,
}

impl WallClock {
    fn ms(&self, now: Instant) -> i64 {
        let since = now.saturating_duration_since(self.at).as_millis();
        self.ms
            .saturating_add(i64::try_from(since).unwrap_or(i64::MAX))
    }
}

pub struct Core<R: Recorder = Ledger> {
    limits: GatewayConfig,
    policy: Rc<Policy>,
    /// Bumped by every policy swap; an approval is for the generation it was held under.
    policy_generation: u64,
    records: R,
    catalog: Catalog,
    workers: Vec<WorkerView>,
    /// The `ws` server: who owns which workspace, and each workspace's worker.
    workspaces: Option<(
        crate::workspace::WorkspaceDirectory,
        HashMap<String, WorkerId>,
    )>,
    calls: CallTable,
    sessions: HashMap<ConnRef, Session>,
    actions: Vec<Action>,
    logs: Vec<(Level, String)>,
    ledger_ok: bool,
    stopping: bool,
    ask_route: AskRoute,
    wall: WallClock,
    /// The `now` of the input being handled.
    now: Instant,
    pub counters: Counters,
    pub observed: Observed,
    /// `list` events, coalesced per principal and method (`gateway.list_event_secs`).
    pub list_events: list_events::ListEvents,
    /// Tools per page of `tools/list` (and resources, prompts).
    pub page_size: usize,
    /// The aggregator worker and its upstream servers, when any is configured.
    upstreams: Option<UpstreamsState>,
    /// Server-to-client messages relayed during calls (`relay.rs`).
    relay: relay::RelayHub,
    /// Asks answered at the agent's client (`client_ask.rs`).
    client_asks: client_ask::ClientAsks,
    /// Bytes of calls in flight per server (`queued_bytes.rs`).
    queued: queued_bytes::QueuedBytes,
    /// What the upstream servers offer beyond tools, resources and prompts.
    offers: forwarded::UpstreamOffers,
    /// Answer bytes waiting to be written to each principal's connections, as the loop
    /// last told (`principal_share.rs`).
    output_waiting: HashMap<String, usize>,
    /// The builtin worker's threads and queue (its lane, `fair_lanes.rs`).
    builtin_pool: (usize, usize),
    /// Each workspace worker's file-tool threads and queue (its lane, `fair_lanes.rs`).
    workspace_pools: HashMap<WorkerId, (usize, usize)>,
    /// Unsubscribes toolwall sent for sessions that went, not answered yet (`subscriptions.rs`).
    releases: subscriptions::PendingReleases,
}

impl<R: Recorder> Core<R> {
    /// `now` and `wall_ms` anchor the core's wall clock (see [`Core::set_wall_clock`]).
    pub fn new(
        limits: GatewayConfig,
        policy: Rc<Policy>,
        records: R,
        now: Instant,
        wall_ms: i64,
    ) -> Core<R> {
        Core {
            list_events: list_events::ListEvents::new(limits.list_event_secs),
            limits,
            policy,
            policy_generation: 1,
            records,
            catalog: Catalog::default(),
            workers: Vec::new(),
            workspaces: None,
            calls: CallTable::default(),
            sessions: HashMap::new(),
            actions: Vec::new(),
            logs: Vec::new(),
            ledger_ok: true,
            stopping: false,
            ask_route: AskRoute::Operator,
            wall: WallClock {
                at: now,
                ms: wall_ms,
            },
            now,
            counters: Counters::default(),
            observed: Observed::default(),
            page_size: 200,
            upstreams: None,
            relay: relay::RelayHub::default(),
            releases: Default::default(),
            client_asks: client_ask::ClientAsks::default(),
            queued: Default::default(),
            offers: Default::default(),
            output_waiting: HashMap::new(),
            builtin_pool: (16, 256),
            workspace_pools: HashMap::new(),
        }
    }

    /// The loop re-anchors the wall clock once per turn (system time may be stepped).
    pub fn set_wall_clock(&mut self, now: Instant, wall_ms: i64) {
        self.wall = WallClock {
            at: now,
            ms: wall_ms,
        };
    }

    pub fn set_ask_route(&mut self, route: AskRoute) {
        self.ask_route = route;
    }

    pub fn policy(&self) -> &Rc<Policy> {
        &self.policy
    }

    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    pub fn ledger_ok(&self) -> bool {
        self.ledger_ok
    }

    /// The records staged since the last commit: the loop commits them.
    pub fn records(&self) -> &R {
        &self.records
    }

    pub fn records_mut(&mut self) -> &mut R {
        &mut self.records
    }

    /// Requests of this connection not yet answered.
    pub fn in_flight(&self, conn: ConnRef) -> usize {
        self.calls.in_flight(conn)
    }

    /// Requests not yet answered, everywhere.
    pub fn in_flight_total(&self) -> usize {
        self.calls.len()
    }

    /// A lifecycle or protocol fact for the ledger's `events`.
    pub fn event(&mut self, kind: &str, detail: Value) {
        self.records.stage_event(kind, &detail);
    }

    /// Log lines produced since the last call; the loop writes them.
    pub fn take_logs(&mut self) -> Vec<(Level, String)> {
        std::mem::take(&mut self.logs)
    }

    fn log(&mut self, level: Level, line: String) {
        self.logs.push((level, line));
    }

    fn wall_ms(&self) -> i64 {
        self.wall.ms(self.now)
    }

    fn elapsed_us(&self, since: Instant) -> u64 {
        u64::try_from(self.now.saturating_duration_since(since).as_micros()).unwrap_or(u64::MAX)
    }

    fn timeout(&self, key: &str) -> Duration {
        Duration::from_secs(match key {
            "gateway.tool_call_timeout_secs" => self.limits.tool_call_timeout_secs,
            _ => self.limits.request_timeout_secs,
        })
    }

    // ---- connections ----------------------------------------------------------------

    pub fn on_connect(&mut self, conn: ConnRef, peer: &Peer) {
        self.sessions.insert(conn, Session::default());
        self.event(
            "connect",
            serde_json::json!({"transport": peer.transport.as_str(), "principal": peer.principal, "process": peer.process}),
        );
    }

    /// The agent left: nobody is left to take an answer, so its calls end as cancelled:
    /// a call waiting in its lane never starts, a call at a worker is cancelled there as a
    /// `notifications/cancelled` would, and calls held for approval end (nobody is left to
    /// act on a decision).
    pub fn on_disconnect(&mut self, conn: ConnRef, peer: &Peer, now: Instant) {
        self.now = now;
        self.release_subscriptions(conn);
        self.sessions.remove(&conn);
        let left = self.calls_of(conn);
        self.calls.detach(conn);
        self.drop_held_asks(None);
        // What the servers asked of this agent is answered first, then its calls end.
        self.fail_orphaned_relays();
        for key in left {
            self.cancel_call(key, "the client closed the connection");
        }
        self.event(
            "disconnect",
            serde_json::json!({"transport": peer.transport.as_str(), "principal": peer.principal, "process": peer.process}),
        );
    }

    /// The agent's calls running or waiting (not those held for approval).
    fn calls_of(&self, conn: ConnRef) -> Vec<u64> {
        self.calls.keys_where(|c| {
            c.stage != calls::Stage::AwaitingApproval
                && c.exchange().is_some_and(|x| x.from.conn == Some(conn))
        })
    }

    /// The peer is gone both ways (a hang-up, not a half-close): nobody can read an
    /// answer, so its calls end now as cancelled (the waiting ones never start) and its
    /// held asks end; the connection closes once it is idle.
    pub fn on_peer_gone(&mut self, conn: ConnRef, now: Instant) {
        self.now = now;
        self.drop_held_asks(Some(conn));
        for key in self.calls_of(conn) {
            self.cancel_call(key, "the client closed the connection");
        }
    }

    /// The agent closed its sending side: calls held for approval on this connection end
    /// now (an approval could only send them to a server for an agent that has gone);
    /// calls at a worker finish and are answered as usual.
    pub fn on_agent_eof(&mut self, conn: ConnRef, now: Instant) {
        self.now = now;
        self.drop_held_asks(Some(conn));
    }

    /// Stop taking new work: every request from now on is refused as "stopping".
    pub fn set_stopping(&mut self) {
        self.stopping = true;
        // Listings counted in open windows are recorded before the gateway's last rows.
        for detail in self.list_events.flush(self.wall_ms()) {
            self.event("list_summary", detail);
        }
    }

    /// Answer every call still in flight with the stopping error (after the drain).
    pub fn refuse_remaining(&mut self, now: Instant) {
        self.now = now;
        for key in self.calls.keys_where(|_| true) {
            self.fail_call(
                key,
                crate::mcp::tool_error::ToolErrorCode::ShuttingDown,
                "the gateway is stopping",
            );
        }
    }

    /// An error for a message that never became a request (e.g. an overlong line).
    pub fn push_raw(&mut self, conn: ConnRef, bytes: Vec<u8>) {
        self.actions.push(Action::Push {
            conn,
            stream: 0,
            bytes,
        });
    }

    /// A worker request could not be queued (the worker went down this turn).
    pub fn fail_unsent(&mut self, key: u64, why: &str, now: Instant) {
        self.now = now;
        self.fail_call(
            key,
            crate::mcp::tool_error::ToolErrorCode::WorkerUnavailable,
            why,
        );
    }

    /// Swap the policy: the next message on every connection is judged by the new one, and
    /// every call held for approval is judged again (one the new policy blocks cannot be
    /// approved any more).
    /// New `[gateway]` limits (reload). Calls in the table keep their deadlines; the new
    /// bounds judge every call from now on.
    pub fn set_limits(&mut self, limits: GatewayConfig) {
        self.list_events.set_every(limits.list_event_secs);
        self.limits = limits;
    }

    pub fn set_policy(&mut self, policy: Rc<Policy>, now: Instant) {
        self.now = now;
        self.policy = policy;
        self.policy_generation += 1;
        self.rejudge_held();
    }

    // ---- time -------------------------------------------------------------------------

    pub fn next_deadline(&self) -> Option<Instant> {
        let call = self.calls.next_deadline();
        let refresh = self
            .upstreams
            .as_ref()
            .and_then(UpstreamsState::next_deadline);
        call.into_iter()
            .chain(refresh)
            .chain(self.list_events.next_deadline())
            .min()
    }

    pub fn on_timers(&mut self, now: Instant) {
        self.now = now;
        for detail in self.list_events.due(now, self.wall_ms()) {
            self.event("list_summary", detail);
        }
        if self.upstreams.as_mut().is_some_and(|u| u.refresh_due(now)) {
            self.refresh_upstreams(now);
        }
        self.upstream_tick(now);
        while let Some(key) = self.calls.pop_expired(now) {
            let Some(call) = self.calls.get(key) else {
                // A cancelled call the worker never said it ended: its slot is free now.
                self.calls.end_lingering(key);
                continue;
            };
            match call.stage {
                calls::Stage::AwaitingApproval => self.ask_timed_out(key),
                calls::Stage::Queued => {
                    let secs = now.saturating_duration_since(call.started).as_secs();
                    let message = format!(
                        "timed out after {secs} s waiting for room at its server ({})",
                        call.timeout_key
                    );
                    self.fail_call(
                        key,
                        crate::mcp::tool_error::ToolErrorCode::Timeout,
                        &message,
                    );
                }
                calls::Stage::AtWorker => {
                    let secs = now.saturating_duration_since(call.started).as_secs();
                    let method = match &call.purpose {
                        calls::Purpose::Exchange(x) => x.routed.method().to_owned(),
                        calls::Purpose::Listing { kind, .. } => format!("{}/list", kind.list_key()),
                        calls::Purpose::Attest => "attest".into(),
                        calls::Purpose::Configure => "configure".into(),
                    };
                    let message =
                        format!("{method} timed out after {secs} s ({})", call.timeout_key);
                    self.cancel_at_worker(call.worker, key);
                    self.fail_call(
                        key,
                        crate::mcp::tool_error::ToolErrorCode::Timeout,
                        &message,
                    );
                }
            }
        }
    }

    /// Actions released by the last successful commit (or turned into refusals by a
    /// failed one).
    pub fn take_actions(&mut self) -> Vec<Action> {
        let mut actions = Vec::new();
        self.swap_actions(&mut actions);
        actions
    }

    /// As [`take_actions`](Self::take_actions), swapping them into `out` (which must be
    /// empty): the loop hands back its drained vector, so the core's grows once, not
    /// every turn.
    pub fn swap_actions(&mut self, out: &mut Vec<Action>) {
        debug_assert!(out.is_empty());
        // Calls waiting in a lane go once room was made, and only while the ledger holds
        // their rows (they were staged, and committed, when the calls were forwarded).
        if self.ledger_ok {
            self.start_waiting_calls();
        }
        std::mem::swap(&mut self.actions, out);
    }
}
