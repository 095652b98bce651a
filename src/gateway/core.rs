//! The gateway's decisions, sans-IO: messages in, actions out.
//!
//! Every agent message enters through [`Core::on_message`]; everything the loop must do
//! afterwards (answer an agent, send a worker request) comes out of [`Core::take_actions`]
//! only after [`Core::commit`] wrote the ledger rows those actions depend on. If the commit
//! fails, the actions are turned into refusals: nothing reaches a tool or an agent that
//! the ledger does not hold (fail closed).

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::aggregator::gateway_state::UpstreamsState;
use crate::config::GatewayConfig;
use crate::ledger::{CallEnd, CallStart, Ledger};
use crate::mcp::catalog::{Catalog, Kind, WorkerId, split_namespaced};
use crate::mcp::jsonrpc::{self, Message};
use crate::mcp::protocol;
use crate::mcp::tool_error::{ToolErrorCode, refusal};
use crate::policy::{Decision, Phase, Policy, Subject, Transport, Verdict};
use crate::transport::http::metrics::{self, Histogram};
use crate::workers::rpc::{self, Op};

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
    /// A request to a worker; `call` names the call it serves.
    ToWorker {
        worker: WorkerId,
        call: Option<u64>,
        msg: rpc::Message,
    },
}

/// Where a call stands.
#[derive(Debug)]
enum Stage {
    /// Held for a human decision (`ask`).
    AwaitingApproval { arguments: String },
    /// Sent to a worker.
    AtWorker,
}

#[derive(Debug)]
enum CallKind {
    Tool {
        ledger_id: i64,
        server: String,
        tool: String,
        decision: Decision,
        /// The arguments the tool got, when a rewrite rule changed them (the ledger keeps
        /// both; the originals are on the row from the start).
        rewritten: Option<String>,
    },
    /// resources/read, prompts/get: answered with the worker's result as is.
    Other,
    /// list_tools / list_resources / list_prompts sent by the gateway itself.
    Listing { kind: Kind, server: String },
    /// A fresh confinement report asked of a live worker.
    Attest,
    /// The aggregator's `configure` request.
    Configure,
}

#[derive(Debug)]
struct Call {
    conn: Option<ConnRef>,
    stream: u32,
    id: String,
    method: String,
    worker: WorkerId,
    kind: CallKind,
    stage: Stage,
    principal: String,
    process: String,
    transport: Transport,
    started: Instant,
    deadline: Instant,
    timeout_key: &'static str,
    /// Who approved a held call, and when (ms since the epoch).
    approved: Option<(String, i64)>,
}

/// A call held for approval, as the admin socket lists it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PendingApproval {
    pub id: u64,
    pub tool: String,
    pub principal: String,
    pub process: String,
    pub transport: &'static str,
    pub arguments: String,
    pub rule: Option<String>,
    pub reason: Option<String>,
    pub waiting_ms: u128,
}

/// A worker as the core sees it.
#[derive(Debug, Clone)]
pub struct WorkerView {
    pub name: String,
    pub server: String,
    pub ready: bool,
}

/// What `/metrics` reports that only the core sees; bounded (method labels are a fixed
/// set, rule ids come from the loaded policy).
#[derive(Debug)]
pub struct Observed {
    /// Requests by (method label, outcome: ok | error | refused).
    pub requests: BTreeMap<(&'static str, &'static str), u64>,
    /// `tools/call` decisions by (deciding rule or "default", decision).
    pub policy_decisions: BTreeMap<(String, &'static str), u64>,
    pub tool_call_latency: Histogram,
    pub ledger_commit_latency: Histogram,
}

impl Default for Observed {
    fn default() -> Self {
        Observed {
            requests: BTreeMap::new(),
            policy_decisions: BTreeMap::new(),
            tool_call_latency: Histogram::new(metrics::TOOL_CALL_BUCKETS),
            ledger_commit_latency: Histogram::new(metrics::LEDGER_COMMIT_BUCKETS),
        }
    }
}

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Counters {
    pub calls_total: u64,
    pub calls_allowed: u64,
    pub calls_denied: u64,
    pub calls_error: u64,
    pub requests_total: u64,
    pub ledger_failures: u64,
}

#[derive(Debug, Default)]
struct Session {
    protocol_version: Option<&'static str>,
}

pub struct Core {
    limits: GatewayConfig,
    policy: Rc<Policy>,
    ledger: Ledger,
    catalog: Catalog,
    workers: Vec<WorkerView>,
    /// The `ws` server: who owns which workspace, and each workspace's worker.
    workspaces: Option<(
        crate::workspace::WorkspaceDirectory,
        HashMap<String, WorkerId>,
    )>,
    calls: HashMap<u64, Call>,
    in_flight: HashMap<ConnRef, usize>,
    sessions: HashMap<ConnRef, Session>,
    /// Every call's deadline, removed when the call ends: bounded by the calls in flight.
    deadlines: BTreeSet<(Instant, u64)>,
    next_key: u64,
    actions: Vec<Action>,
    ledger_ok: bool,
    stopping: bool,
    pub counters: Counters,
    pub observed: Observed,
    /// Tools per page of `tools/list` (and resources, prompts).
    pub page_size: usize,
    /// The aggregator worker and its upstream servers, when any is configured.
    upstreams: Option<UpstreamsState>,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[derive(Deserialize)]
struct ToolCallParams<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct CursorParams {
    #[serde(default)]
    cursor: Option<String>,
}

#[derive(Deserialize)]
struct UriParams {
    uri: String,
}

#[derive(Deserialize)]
struct NameParams {
    name: String,
}

#[derive(Deserialize)]
struct CancelParams<'a> {
    #[serde(borrow, rename = "requestId")]
    request_id: &'a RawValue,
    #[serde(default)]
    reason: Option<String>,
}

impl Core {
    pub fn new(limits: GatewayConfig, policy: Rc<Policy>, ledger: Ledger) -> Core {
        Core {
            limits,
            policy,
            ledger,
            catalog: Catalog::default(),
            workers: Vec::new(),
            workspaces: None,
            calls: HashMap::new(),
            in_flight: HashMap::new(),
            sessions: HashMap::new(),
            deadlines: BTreeSet::new(),
            next_key: 1,
            actions: Vec::new(),
            ledger_ok: true,
            stopping: false,
            counters: Counters::default(),
            observed: Observed::default(),
            page_size: 200,
            upstreams: None,
        }
    }

    /// The aggregator worker is `upstreams.worker`; the core lists and routes its servers.
    pub fn set_upstreams(&mut self, upstreams: UpstreamsState) {
        self.upstreams = Some(upstreams);
    }

    pub fn upstreams(&self) -> Option<&UpstreamsState> {
        self.upstreams.as_ref()
    }

    pub fn upstreams_mut(&mut self) -> Option<&mut UpstreamsState> {
        self.upstreams.as_mut()
    }

    fn is_aggregator(&self, worker: WorkerId) -> bool {
        self.upstreams.as_ref().is_some_and(|u| u.is_worker(worker))
    }

    /// List every upstream server again (reload, refresh).
    pub fn refresh_upstreams(&mut self, now: Instant) {
        let Some(u) = &self.upstreams else { return };
        let (worker, servers) = (u.worker, u.servers());
        if !self.workers[worker].ready {
            return;
        }
        for server in servers {
            self.list_server(
                worker,
                &server,
                &[Kind::Tools, Kind::Resources, Kind::Prompts],
                now,
            );
        }
    }

    fn list_server(&mut self, worker: WorkerId, server: &str, kinds: &[Kind], now: Instant) {
        for kind in kinds {
            let op = match kind {
                Kind::Tools => Op::ListTools,
                Kind::Resources => Op::ListResources,
                Kind::Prompts => Op::ListPrompts,
            };
            self.gateway_request(worker, op, *kind, server, now);
        }
    }

    /// `toolwall pins approve TOOL`: the tool's server is listed again, so it reappears.
    pub fn approve_pin(&mut self, tool: &str, who: &str, now: Instant) -> Result<String, String> {
        let Some(u) = self.upstreams.as_mut() else {
            return Err("no upstream servers are configured".into());
        };
        let server = u.approve_pin(tool, who)?;
        let worker = u.worker;
        self.event("pin", json!({"what": "approved", "tool": tool, "by": who}));
        crate::info!("pin: {tool} approved by {who}");
        if self.workers[worker].ready {
            self.list_server(worker, &server, &[Kind::Tools], now);
        }
        Ok(format!(
            "{tool} approved; its server {server} is being listed again"
        ))
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

    pub fn ledger_mut(&mut self) -> &mut Ledger {
        &mut self.ledger
    }

    /// Swap the policy: the next message on every connection is judged by the new one.
    pub fn set_policy(&mut self, policy: Rc<Policy>) {
        self.policy = policy;
    }

    /// Requests of this connection not yet answered.
    pub fn in_flight(&self, conn: ConnRef) -> usize {
        self.in_flight.get(&conn).copied().unwrap_or(0)
    }

    /// Listings the gateway asked of its workers and has not had answered.
    pub fn listings_pending(&self) -> usize {
        self.calls
            .values()
            .filter(|c| matches!(c.kind, CallKind::Listing { .. }))
            .count()
    }

    /// Requests not yet answered, everywhere.
    pub fn in_flight_total(&self) -> usize {
        self.calls.len()
    }

    pub fn event(&mut self, kind: &str, detail: Value) {
        self.ledger.stage_event(kind, &detail);
    }

    // ---- workers ------------------------------------------------------------------

    /// Serve the `ws` server: its tools are in the catalog from the start (ready or not),
    /// and calls are routed by the caller's workspaces.
    pub fn set_workspaces(
        &mut self,
        directory: crate::workspace::WorkspaceDirectory,
        workers: HashMap<String, WorkerId>,
    ) {
        if let Some(&any) = workers.values().next() {
            let _ = self.catalog.set(
                Kind::Tools,
                crate::workspace::tools::SERVER,
                any,
                crate::workspace::routing::catalog_definitions(),
            );
        }
        self.workspaces = Some((directory, workers));
    }

    /// Register a worker slot; returns its id.
    pub fn add_worker(&mut self, name: &str, server: &str) -> WorkerId {
        self.workers.push(WorkerView {
            name: name.to_owned(),
            server: server.to_owned(),
            ready: false,
        });
        self.workers.len() - 1
    }

    pub fn workers(&self) -> &[WorkerView] {
        &self.workers
    }

    /// A worker attested and may get work: ask it what it serves.
    pub fn on_worker_ready(&mut self, worker: WorkerId, now: Instant) {
        self.workers[worker].ready = true;
        if self.is_aggregator(worker) {
            // Credentials first (only over this channel), then every server's lists.
            let key = self.new_key();
            let Some(msg) = self.upstreams.as_ref().map(|u| u.configure_request(key)) else {
                return;
            };
            self.internal_request(key, worker, CallKind::Configure, "configure", msg, now);
            self.refresh_upstreams(now);
            return;
        }
        let server = self.workers[worker].server.clone();
        self.gateway_request(worker, Op::ListTools, Kind::Tools, &server, now);
        self.gateway_request(worker, Op::ListResources, Kind::Resources, &server, now);
        self.gateway_request(worker, Op::ListPrompts, Kind::Prompts, &server, now);
    }

    fn gateway_request(
        &mut self,
        worker: WorkerId,
        op: Op,
        kind: Kind,
        server: &str,
        now: Instant,
    ) {
        let key = self.new_key();
        // The aggregator serves many servers: the request names the one to list.
        let name = self.is_aggregator(worker).then(|| server.to_owned());
        let msg = rpc::Message::Request {
            id: key,
            op,
            name,
            args: None,
            target: None,
        };
        let listing = CallKind::Listing {
            kind,
            server: server.to_owned(),
        };
        self.internal_request(key, worker, listing, &format!("{op:?}"), msg, now);
    }

    /// A request the gateway itself makes of a worker (configure, listings, attest): a
    /// call with no agent behind it, under the request timeout.
    fn internal_request(
        &mut self,
        key: u64,
        worker: WorkerId,
        kind: CallKind,
        method: &str,
        msg: rpc::Message,
        now: Instant,
    ) {
        let deadline = now + Duration::from_secs(self.limits.request_timeout_secs);
        self.calls.insert(
            key,
            Call {
                conn: None,
                stream: 0,
                id: String::new(),
                method: method.to_owned(),
                worker,
                kind,
                stage: Stage::AtWorker,
                principal: String::new(),
                process: String::new(),
                transport: Transport::Stdio,
                started: now,
                deadline,
                timeout_key: "gateway.request_timeout_secs",
                approved: None,
            },
        );
        self.deadlines.insert((deadline, key));
        self.actions.push(Action::ToWorker {
            worker,
            call: Some(key),
            msg,
        });
    }

    /// Ask a live worker to run its confinement probes again (with its threads running).
    /// The fresh report lands in the ledger as a `worker_reattested` event.
    pub fn request_attest(&mut self, worker: WorkerId, now: Instant) -> bool {
        if !self.workers[worker].ready {
            return false;
        }
        let key = self.new_key();
        let msg = rpc::Message::Request {
            id: key,
            op: Op::Attest,
            name: None,
            args: None,
            target: None,
        };
        self.internal_request(key, worker, CallKind::Attest, "attest", msg, now);
        true
    }

    /// A worker is gone (exited, or broke the protocol): every call it held fails now.
    pub fn on_worker_gone(&mut self, worker: WorkerId, reason: &str) {
        self.workers[worker].ready = false;
        if let Some(u) = self.upstreams.as_mut().filter(|u| u.is_worker(worker)) {
            u.on_worker_gone(reason);
        }
        let keys: Vec<u64> = self
            .calls
            .iter()
            .filter(|(_, c)| c.worker == worker && matches!(c.stage, Stage::AtWorker))
            .map(|(k, _)| *k)
            .collect();
        let name = self.workers[worker].name.clone();
        let message = format!("worker {name} is gone: {reason}");
        for key in keys {
            self.fail_call(key, ToolErrorCode::WorkerUnavailable, &message);
        }
    }

    pub fn on_worker_message(&mut self, worker: WorkerId, msg: rpc::Message, now: Instant) {
        match msg {
            rpc::Message::Response {
                id,
                ok,
                error,
                facts,
            } => {
                // A late answer (timed out, cancelled) or another worker's id is dropped.
                if self.calls.get(&id).is_none_or(|c| c.worker != worker) {
                    return;
                }
                let Some(call) = self.take_call(id) else {
                    return;
                };
                self.complete(call, ok, error, facts);
            }
            rpc::Message::Event { kind, detail } => {
                self.event(
                    "worker_event",
                    json!({"worker": self.workers[worker].name, "kind": kind, "detail": detail}),
                );
                let relist = self
                    .upstreams
                    .as_mut()
                    .filter(|u| u.is_worker(worker))
                    .and_then(|u| u.on_event(&kind, &detail));
                if let Some(r) = relist
                    && self.workers[worker].ready
                {
                    self.list_server(worker, &r.server, &r.kinds, now);
                }
            }
            rpc::Message::Ready { .. } | rpc::Message::Request { .. } => {
                // The supervisor handles ready; a worker never sends requests.
            }
        }
    }

    // ---- connections ----------------------------------------------------------------

    pub fn on_connect(&mut self, conn: ConnRef, peer: &Peer) {
        self.sessions.insert(conn, Session::default());
        self.event(
            "connect",
            json!({"transport": peer.transport.as_str(), "principal": peer.principal, "process": peer.process}),
        );
    }

    /// The agent left: its calls still finish (their rows are completed) but nobody is
    /// answered.
    pub fn on_disconnect(&mut self, conn: ConnRef, peer: &Peer) {
        self.sessions.remove(&conn);
        self.in_flight.remove(&conn);
        for call in self.calls.values_mut() {
            if call.conn == Some(conn) {
                call.conn = None;
            }
        }
        self.event(
            "disconnect",
            json!({"transport": peer.transport.as_str(), "principal": peer.principal, "process": peer.process}),
        );
    }

    /// Stop taking new work: every request from now on is refused as "stopping".
    pub fn set_stopping(&mut self) {
        self.stopping = true;
    }

    /// Answer every call still in flight with the stopping error (after the drain).
    pub fn refuse_remaining(&mut self) {
        let keys: Vec<u64> = self.calls.keys().copied().collect();
        for key in keys {
            self.fail_call(key, ToolErrorCode::ShuttingDown, "the gateway is stopping");
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
    pub fn fail_unsent(&mut self, key: u64, why: &str) {
        self.fail_call(key, ToolErrorCode::WorkerUnavailable, why);
    }

    /// Remove a call and its deadline.
    fn take_call(&mut self, key: u64) -> Option<Call> {
        let call = self.calls.remove(&key)?;
        self.deadlines.remove(&(call.deadline, key));
        Some(call)
    }

    fn new_key(&mut self) -> u64 {
        let key = self.next_key;
        self.next_key += 1;
        key
    }

    fn reply(&mut self, conn: ConnRef, stream: u32, id: &str, bytes: Vec<u8>) {
        if let Some(n) = self.in_flight.get_mut(&conn) {
            *n = n.saturating_sub(1);
        }
        self.actions.push(Action::Reply {
            conn,
            stream,
            id: id.to_owned(),
            bytes,
        });
    }

    fn reply_error(
        &mut self,
        conn: ConnRef,
        stream: u32,
        id: &str,
        code: i64,
        message: &str,
        data: Option<&Value>,
    ) {
        let bytes = jsonrpc::error_response(Some(id), code, message, data);
        self.reply(conn, stream, id, bytes);
    }

    /// One payload from an agent.
    #[allow(clippy::too_many_arguments)]
    pub fn on_message(
        &mut self,
        conn: ConnRef,
        peer: &Peer,
        process: &str,
        expect: Expect,
        stream: u32,
        payload: &[u8],
        now: Instant,
    ) {
        let message = match jsonrpc::parse(payload) {
            Ok(m) => m,
            Err(fault) => {
                let id = fault.id.map(|r| r.get());
                let bytes = jsonrpc::error_response(id, fault.code, fault.message, None);
                self.actions.push(Action::Push {
                    conn,
                    stream,
                    bytes,
                });
                return;
            }
        };
        match message {
            Message::Request { id, method, params } => {
                if expect == Expect::Notification {
                    let bytes = jsonrpc::error_response(
                        Some(id.get()),
                        jsonrpc::INVALID_REQUEST,
                        "a notification frame must not carry an id",
                        None,
                    );
                    self.actions.push(Action::Push {
                        conn,
                        stream,
                        bytes,
                    });
                    return;
                }
                *self.in_flight.entry(conn).or_insert(0) += 1;
                self.counters.requests_total += 1;
                let ctx = RequestCtx {
                    conn,
                    stream,
                    id: id.get(),
                    peer,
                    process,
                    bytes_received: payload.len(),
                };
                self.on_request(&ctx, &method, params, now);
            }
            Message::Notification { method, params } => {
                if expect == Expect::Request {
                    let bytes = jsonrpc::error_response(
                        None,
                        jsonrpc::INVALID_REQUEST,
                        "a request frame must carry an id",
                        None,
                    );
                    self.actions.push(Action::Push {
                        conn,
                        stream,
                        bytes,
                    });
                    return;
                }
                self.on_notification(conn, &method, params);
            }
            Message::Response { .. } => {
                // toolwall sends agents no requests, so no response is awaited.
            }
        }
    }

    /// Only `notifications/cancelled` needs anything; initialized, roots/list_changed,
    /// progress and the rest are accepted and ignored.
    fn on_notification(&mut self, conn: ConnRef, method: &str, params: Option<&RawValue>) {
        if method != "notifications/cancelled" {
            return;
        }
        let Some(p) = params.and_then(|p| serde_json::from_str::<CancelParams>(p.get()).ok())
        else {
            return;
        };
        let target = p.request_id.get();
        let key = self
            .calls
            .iter()
            .find(|(_, c)| c.conn == Some(conn) && c.id == target)
            .map(|(k, _)| *k);
        let reason = p.reason.unwrap_or_else(|| "cancelled by the client".into());
        self.event(
            "cancelled",
            json!({"request_id": target, "reason": reason, "found": key.is_some()}),
        );
        if let Some(key) = key {
            self.cancel_call(key, &reason);
        }
    }

    /// Tell a worker to stop working on `target`; no answer is owed for the cancel.
    fn cancel_at_worker(&mut self, worker: WorkerId, target: u64) {
        let id = self.new_key();
        self.actions.push(Action::ToWorker {
            worker,
            call: None,
            msg: rpc::Message::Request {
                id,
                op: Op::Cancel,
                name: None,
                args: None,
                target: Some(target),
            },
        });
    }

    /// The client cancelled: the worker is told, the row ends as an error, no answer is
    /// sent (the MCP rule for cancelled requests).
    fn cancel_call(&mut self, key: u64, reason: &str) {
        let Some(call) = self.take_call(key) else {
            return;
        };
        if matches!(call.stage, Stage::AtWorker) {
            self.cancel_at_worker(call.worker, key);
        }
        if let Some(conn) = call.conn
            && let Some(n) = self.in_flight.get_mut(&conn)
        {
            *n = n.saturating_sub(1);
        }
        if let CallKind::Tool { ledger_id, .. } = &call.kind {
            let message = format!("cancelled: {reason}");
            self.counters.calls_error += 1;
            self.ledger.stage_call_end(
                *ledger_id,
                &CallEnd {
                    decision: "error",
                    policy_rule: None,
                    policy_reason: None,
                    duration_us: call.started.elapsed().as_micros() as u64,
                    error_message: Some(&message),
                    bytes_sent: 0,
                    response: b"",
                    rewritten_arguments: None,
                    original_response: None,
                    approved_by: None,
                    decided_at_ms: None,
                },
            );
        }
    }

    fn on_request(
        &mut self,
        ctx: &RequestCtx,
        method: &str,
        params: Option<&RawValue>,
        now: Instant,
    ) {
        *self
            .observed
            .requests
            .entry((metrics::method_label(method), "received"))
            .or_insert(0) += 1;
        if self.stopping {
            self.reply_error(
                ctx.conn,
                ctx.stream,
                ctx.id,
                jsonrpc::SHUTTING_DOWN,
                "the gateway is stopping",
                None,
            );
            return;
        }
        match method {
            "initialize" => {
                let asked = protocol::requested_version(params);
                let version = protocol::negotiate(asked.as_deref());
                if let Some(s) = self.sessions.get_mut(&ctx.conn) {
                    s.protocol_version = Some(version);
                }
                let client = params
                    .and_then(|p| serde_json::from_str::<Value>(p.get()).ok())
                    .and_then(|v| v.get("clientInfo").cloned())
                    .unwrap_or(Value::Null);
                self.event(
                    "initialize",
                    json!({"requested": asked, "negotiated": version, "client": client,
                           "principal": ctx.peer.principal, "transport": ctx.peer.transport.as_str()}),
                );
                let list_changed = ctx.peer.transport != Transport::Http;
                let result = protocol::initialize_result(version, list_changed).to_string();
                self.reply(
                    ctx.conn,
                    ctx.stream,
                    ctx.id,
                    jsonrpc::result_response(ctx.id, &result),
                );
            }
            "server/discover" => {
                // The modern era's handshake-free description; the HTTP door adds the
                // era's fields (resultType, _meta) when it writes the answer.
                let result = crate::transport::http::era::discover_result(protocol::INSTRUCTIONS)
                    .to_string();
                self.reply(
                    ctx.conn,
                    ctx.stream,
                    ctx.id,
                    jsonrpc::result_response(ctx.id, &result),
                );
            }
            "ping" => {
                self.reply(
                    ctx.conn,
                    ctx.stream,
                    ctx.id,
                    jsonrpc::result_response(ctx.id, "{}"),
                );
            }
            "tools/list" => self.list(ctx, Kind::Tools, method, params),
            "resources/list" => self.list(ctx, Kind::Resources, method, params),
            "prompts/list" => self.list(ctx, Kind::Prompts, method, params),
            "resources/templates/list" => {
                self.reply(
                    ctx.conn,
                    ctx.stream,
                    ctx.id,
                    jsonrpc::result_response(ctx.id, "{\"resourceTemplates\":[]}"),
                );
            }
            "tools/call" => self.tool_call(ctx, params, now),
            "resources/read" => self.routed(ctx, Kind::Resources, method, params, now),
            "prompts/get" => self.routed(ctx, Kind::Prompts, method, params, now),
            _ => {
                let message = format!("method not found: {method}");
                self.reply_error(
                    ctx.conn,
                    ctx.stream,
                    ctx.id,
                    jsonrpc::METHOD_NOT_FOUND,
                    &message,
                    None,
                );
            }
        }
    }

    /// The request-phase decision for a method that is not `tools/call`.
    fn method_allowed(
        &mut self,
        ctx: &RequestCtx,
        method: &str,
        server: Option<&str>,
        resource: Option<&str>,
    ) -> bool {
        let subject = Subject {
            method,
            server,
            tool: None,
            resource,
            principal: &ctx.peer.principal,
            transport: ctx.peer.transport,
            process: ctx.process,
            arguments: None,
        };
        let decision = self.policy.decide(Phase::Request, &subject, None);
        if decision.verdict == Verdict::Allow {
            return true;
        }
        // `ask` is for tool calls; any other method it would hold is refused instead.
        let rule = decision.rule.clone();
        let message = format!(
            "{method} refused by policy{}",
            rule.as_deref()
                .map(|r| format!(" rule {r}"))
                .unwrap_or_default()
        );
        self.event(
            "method_denied",
            json!({"method": method, "rule": rule, "reason": decision.reason, "resource": resource,
                   "principal": ctx.peer.principal}),
        );
        let data = json!({"rule": rule, "reason": decision.reason});
        self.reply_error(
            ctx.conn,
            ctx.stream,
            ctx.id,
            jsonrpc::POLICY_BLOCKED,
            &message,
            Some(&data),
        );
        false
    }

    fn list(&mut self, ctx: &RequestCtx, kind: Kind, method: &str, params: Option<&RawValue>) {
        if !self.method_allowed(ctx, method, None, None) {
            return;
        }
        let cursor = match params.map(|p| serde_json::from_str::<CursorParams>(p.get())) {
            None => None,
            Some(Ok(p)) => p.cursor,
            Some(Err(_)) => {
                self.reply_error(
                    ctx.conn,
                    ctx.stream,
                    ctx.id,
                    jsonrpc::INVALID_PARAMS,
                    "invalid params",
                    None,
                );
                return;
            }
        };
        let policy = &self.policy;
        let peer = ctx.peer;
        let process = ctx.process;
        let result = self
            .catalog
            .list_page(kind, cursor.as_deref(), self.page_size, |e| {
                kind != Kind::Tools
                    || !policy.hides_tool(
                        &e.name,
                        &e.server,
                        &peer.principal,
                        peer.transport,
                        process,
                    )
            });
        self.event(
            "list",
            json!({"method": method, "principal": ctx.peer.principal, "transport": ctx.peer.transport.as_str()}),
        );
        self.reply(
            ctx.conn,
            ctx.stream,
            ctx.id,
            jsonrpc::result_response(ctx.id, &result),
        );
    }

    /// resources/read and prompts/get: find the owning server, check policy, forward.
    fn routed(
        &mut self,
        ctx: &RequestCtx,
        kind: Kind,
        method: &str,
        params: Option<&RawValue>,
        now: Instant,
    ) {
        let key = match kind {
            Kind::Resources => params
                .and_then(|p| serde_json::from_str::<UriParams>(p.get()).ok())
                .map(|p| p.uri),
            _ => params
                .and_then(|p| serde_json::from_str::<NameParams>(p.get()).ok())
                .map(|p| p.name),
        };
        let Some(key) = key else {
            let what = if kind == Kind::Resources {
                "uri"
            } else {
                "name"
            };
            let message = format!("invalid params: {what} is required");
            self.reply_error(
                ctx.conn,
                ctx.stream,
                ctx.id,
                jsonrpc::INVALID_PARAMS,
                &message,
                None,
            );
            return;
        };
        // Policy first: a refused URI or prompt is refused whether or not it exists.
        let entry = self.catalog.get(kind, &key).cloned();
        let resource = (kind == Kind::Resources).then_some(key.as_str());
        let server = entry.as_ref().map(|e| e.server.clone());
        if !self.method_allowed(ctx, method, server.as_deref(), resource) {
            return;
        }
        let Some(entry) = entry else {
            let (code, message) = match kind {
                Kind::Resources => (-32002, format!("resource not found: {key}")),
                _ => (jsonrpc::INVALID_PARAMS, format!("unknown prompt: {key}")),
            };
            self.reply_error(ctx.conn, ctx.stream, ctx.id, code, &message, None);
            return;
        };
        if !self.workers[entry.worker].ready {
            let message = format!(
                "worker {} is not available",
                self.workers[entry.worker].name
            );
            self.reply_error(
                ctx.conn,
                ctx.stream,
                ctx.id,
                jsonrpc::TRANSPORT_ERROR,
                &message,
                None,
            );
            return;
        }
        // Forward the params as they came, with the upstream name.
        let mut args: Value = params
            .and_then(|p| serde_json::from_str(p.get()).ok())
            .unwrap_or_else(|| json!({}));
        if kind == Kind::Prompts {
            args["name"] = Value::String(entry.upstream.clone());
        }
        let op = match kind {
            Kind::Resources => Op::ReadResource,
            _ => Op::GetPrompt,
        };
        let key = self.new_key();
        let deadline = now + Duration::from_secs(self.limits.request_timeout_secs);
        self.calls.insert(
            key,
            Call {
                conn: Some(ctx.conn),
                stream: ctx.stream,
                id: ctx.id.to_owned(),
                method: method.to_owned(),
                worker: entry.worker,
                kind: CallKind::Other,
                stage: Stage::AtWorker,
                principal: ctx.peer.principal.clone(),
                process: ctx.process.to_owned(),
                transport: ctx.peer.transport,
                started: now,
                deadline,
                timeout_key: "gateway.request_timeout_secs",
                approved: None,
            },
        );
        self.deadlines.insert((deadline, key));
        self.actions.push(Action::ToWorker {
            worker: entry.worker,
            call: Some(key),
            msg: rpc::Message::Request {
                id: key,
                op,
                name: Some(if self.is_aggregator(entry.worker) {
                    UpstreamsState::request_name(op, &entry.server, &entry.upstream)
                } else {
                    entry.upstream
                }),
                args: Some(args.to_string()),
                target: None,
            },
        });
    }

    fn tool_call(&mut self, ctx: &RequestCtx, params: Option<&RawValue>, now: Instant) {
        let parsed_params =
            params.and_then(|p| serde_json::from_str::<ToolCallParams>(p.get()).ok());
        let (name, arguments): (&str, &str) = match &parsed_params {
            Some(p) => (&p.name, p.arguments.map(RawValue::get).unwrap_or("{}")),
            None => ("", params.map(RawValue::get).unwrap_or("{}")),
        };
        self.counters.calls_total += 1;
        let ledger_id = self.ledger.new_call_id();
        let (server, bare_tool) = split_namespaced(name).unwrap_or(("", name));
        let start = CallStart {
            id: ledger_id,
            ts_ms: now_ms(),
            transport: ctx.peer.transport.as_str(),
            principal: &ctx.peer.principal,
            process_name: ctx.process,
            server_name: server,
            tool_name: bare_tool,
            method: "tools/call",
            request_id: ctx.id,
            decision: "allowed",
            policy_rule: None,
            policy_reason: None,
            bytes_received: ctx.bytes_received,
            arguments: arguments.as_bytes(),
        };
        if parsed_params.is_none() {
            // Still one row: every tools/call is in the ledger, even a malformed one.
            self.refuse_at_start(
                ctx,
                start,
                "error",
                None,
                None,
                jsonrpc::INVALID_PARAMS,
                "invalid params: tools/call needs a name",
            );
            return;
        }
        if !arguments.starts_with('{') {
            self.refuse_at_start(
                ctx,
                start,
                "error",
                None,
                None,
                jsonrpc::INVALID_PARAMS,
                "invalid params: arguments must be an object",
            );
            return;
        }
        // Only what routing needs; the definition text stays in the catalog.
        let pin_refusal = self.upstreams.as_ref().and_then(|u| u.pin_refusal(name));
        if let Some(message) = pin_refusal {
            // Hidden by a changed pin: a row, and a refusal the model can read.
            let start = CallStart {
                decision: "denied",
                ..start
            };
            self.ledger.stage_call(&start);
            let call = Call {
                conn: Some(ctx.conn),
                stream: ctx.stream,
                id: ctx.id.to_owned(),
                method: "tools/call".into(),
                worker: 0,
                kind: CallKind::Tool {
                    ledger_id,
                    server: server.to_owned(),
                    tool: bare_tool.to_owned(),
                    decision: Decision {
                        verdict: Verdict::Block,
                        rule: None,
                        reason: Some("pin_changed".into()),
                        matched: Vec::new(),
                    },
                    rewritten: None,
                },
                stage: Stage::AtWorker,
                principal: ctx.peer.principal.clone(),
                process: ctx.process.to_owned(),
                transport: ctx.peer.transport,
                started: now,
                deadline: now,
                timeout_key: "gateway.tool_call_timeout_secs",
                approved: None,
            };
            let result = refusal(ToolErrorCode::PinChanged, &message, None);
            self.finish_tool(
                call,
                "denied",
                &result.to_string(),
                Some(&message),
                None,
                None,
            );
            return;
        }
        let Some(entry) = self.catalog.get(Kind::Tools, name).map(Route::from) else {
            let message = format!("unknown tool: {name}");
            self.refuse_at_start(
                ctx,
                start,
                "error",
                None,
                None,
                jsonrpc::INVALID_PARAMS,
                &message,
            );
            return;
        };
        // `{"input": {...}}` from clients built that way means the inner object; policy
        // and the tool see it unwrapped (the row keeps what arrived).
        let unwrapped = (!entry.declares_input)
            .then(|| crate::mcp::catalog::unwrap_input(arguments))
            .flatten();
        let arguments: &str = unwrapped.as_deref().unwrap_or(arguments);
        // `ws` arguments may come wrapped in `input`: policy sees them unwrapped.
        let normalized;
        let arguments: &str = if entry.server == crate::workspace::tools::SERVER {
            normalized = crate::workspace::normalize_arguments(arguments);
            &normalized
        } else {
            arguments
        };
        // Policy, on the whole arguments when a rule needs them.
        let policy = Rc::clone(&self.policy);
        let mut parsed: Option<Value> = None;
        if policy.wants_arguments(Phase::Request, "tools/call", Some(name)) {
            match serde_json::from_str::<Value>(arguments) {
                Ok(v) => parsed = Some(v),
                Err(_) => {
                    self.refuse_at_start(
                        ctx,
                        start,
                        "error",
                        None,
                        None,
                        jsonrpc::INVALID_PARAMS,
                        "invalid params: arguments are not valid JSON",
                    );
                    return;
                }
            }
        }
        let subject = Subject {
            method: "tools/call",
            server: Some(&entry.server),
            tool: Some(name),
            resource: None,
            principal: &ctx.peer.principal,
            transport: ctx.peer.transport,
            process: ctx.process,
            arguments: parsed.as_ref(),
        };
        let decision = policy.decide(Phase::Request, &subject, None);
        let start = CallStart {
            decision: match decision.verdict {
                Verdict::Allow => "allowed",
                Verdict::Ask => "pending",
                Verdict::Block => "denied",
            },
            policy_rule: decision.rule.as_deref(),
            policy_reason: decision.reason.as_deref(),
            ..start
        };
        self.ledger.stage_call(&start);
        for (seq, m) in (0u32..).zip(&decision.matched) {
            self.ledger.stage_rule_event(
                ledger_id,
                seq,
                &m.id,
                action_str(m.action),
                "request",
                layer_str(m.layer),
            );
        }
        let mut call = Call {
            conn: Some(ctx.conn),
            stream: ctx.stream,
            id: ctx.id.to_owned(),
            method: "tools/call".into(),
            worker: entry.worker,
            kind: CallKind::Tool {
                ledger_id,
                server: entry.server,
                tool: entry.upstream,
                decision: decision.clone(),
                rewritten: None,
            },
            stage: Stage::AtWorker,
            principal: ctx.peer.principal.clone(),
            process: ctx.process.to_owned(),
            transport: ctx.peer.transport,
            started: now,
            deadline: now,
            timeout_key: "gateway.tool_call_timeout_secs",
            approved: None,
        };
        match decision.verdict {
            Verdict::Block => {
                let message = match &decision.reason {
                    Some(r) => format!("blocked by policy: {r}"),
                    None => "blocked by policy".to_owned(),
                };
                let result = refusal(
                    ToolErrorCode::PolicyBlocked,
                    &message,
                    decision.rule.as_deref(),
                );
                self.finish_tool(
                    call,
                    "denied",
                    &result.to_string(),
                    Some(&message),
                    None,
                    None,
                );
            }
            Verdict::Ask => {
                let key = self.new_key();
                call.stage = Stage::AwaitingApproval {
                    arguments: arguments.to_owned(),
                };
                call.deadline = now + policy.ask_timeout();
                call.timeout_key = "policy.ask_timeout_secs";
                self.deadlines.insert((call.deadline, key));
                self.event("ask_pending", json!({"approval_id": key, "call_id": ledger_id, "tool": name, "principal": call.principal}));
                self.calls.insert(key, call);
            }
            Verdict::Allow => {
                let args = match parsed {
                    Some(mut v) if !decision.matched.is_empty() => {
                        let applied = policy.rewrite_arguments(&decision, &mut v);
                        if applied.is_empty() {
                            arguments.to_owned()
                        } else {
                            let text = v.to_string();
                            if let CallKind::Tool { rewritten, .. } = &mut call.kind {
                                *rewritten = Some(text.clone());
                            }
                            text
                        }
                    }
                    _ => arguments.to_owned(),
                };
                self.dispatch_tool(call, args, now);
            }
        }
    }

    /// An allowed call goes to its worker (after the commit that holds its row).
    fn dispatch_tool(&mut self, mut call: Call, mut args: String, now: Instant) {
        if let CallKind::Tool { server, tool, .. } = &call.kind
            && server == crate::workspace::tools::SERVER
            && let Some((directory, ws_workers)) = &self.workspaces
        {
            let workers = &self.workers;
            let state = |id: &str| match ws_workers.get(id) {
                Some(w) if workers[*w].ready => crate::workspace::WorkerState::Online,
                _ => crate::workspace::WorkerState::Offline,
            };
            match crate::workspace::route_call(directory, &call.principal, tool, &args, state) {
                crate::workspace::WsRoute::Answer(result) => {
                    let text = result.to_string();
                    let error = tool_error_text(&result);
                    let decision = if error.is_some() { "error" } else { "allowed" };
                    self.finish_tool(call, decision, &text, error.as_deref(), None, None);
                    return;
                }
                crate::workspace::WsRoute::Forward {
                    workspace_id,
                    arguments,
                } => {
                    if let Some(&w) = ws_workers.get(&workspace_id) {
                        call.worker = w;
                    }
                    args = arguments;
                }
            }
        }
        if !self.workers[call.worker].ready {
            let message = format!(
                "worker {} is not available (restarting)",
                self.workers[call.worker].name
            );
            let result = refusal(ToolErrorCode::WorkerUnavailable, &message, None);
            self.finish_tool(
                call,
                "error",
                &result.to_string(),
                Some(&message),
                None,
                None,
            );
            return;
        }
        let CallKind::Tool { tool, server, .. } = &call.kind else {
            return;
        };
        let name = if self.is_aggregator(call.worker) {
            UpstreamsState::request_name(Op::CallTool, server, tool)
        } else {
            tool.clone()
        };
        let key = self.new_key();
        call.stage = Stage::AtWorker;
        call.deadline = now + Duration::from_secs(self.limits.tool_call_timeout_secs);
        call.timeout_key = "gateway.tool_call_timeout_secs";
        self.deadlines.insert((call.deadline, key));
        self.actions.push(Action::ToWorker {
            worker: call.worker,
            call: Some(key),
            msg: rpc::Message::Request {
                id: key,
                op: Op::CallTool,
                name: Some(name),
                args: Some(args),
                target: None,
            },
        });
        self.calls.insert(key, call);
    }

    /// Refuse a `tools/call` before it has a policy decision (bad params, unknown tool):
    /// a row, then a JSON-RPC error.
    #[allow(clippy::too_many_arguments)]
    fn refuse_at_start(
        &mut self,
        ctx: &RequestCtx,
        start: CallStart,
        decision: &str,
        rule: Option<&str>,
        reason: Option<&str>,
        code: i64,
        message: &str,
    ) {
        let id = start.id;
        self.ledger.stage_call(&CallStart {
            decision,
            policy_rule: rule,
            policy_reason: reason,
            ..start
        });
        let bytes = jsonrpc::error_response(Some(ctx.id), code, message, None);
        self.counters.calls_error += 1;
        self.ledger.stage_call_end(
            id,
            &CallEnd {
                decision,
                policy_rule: rule,
                policy_reason: reason,
                duration_us: 0,
                error_message: Some(message),
                bytes_sent: bytes.len(),
                response: &bytes,
                rewritten_arguments: None,
                original_response: None,
                approved_by: None,
                decided_at_ms: None,
            },
        );
        self.reply(ctx.conn, ctx.stream, ctx.id, bytes);
    }

    /// End a tool call: the row's outcome, then the agent's answer.
    fn finish_tool(
        &mut self,
        call: Call,
        decision: &str,
        result_json: &str,
        error: Option<&str>,
        original: Option<&str>,
        approved: Option<(&str, i64)>,
    ) {
        let CallKind::Tool {
            ledger_id,
            decision: policy_decision,
            rewritten,
            ..
        } = &call.kind
        else {
            return;
        };
        let approved_owned = call.approved.clone();
        let approved = approved.or(approved_owned.as_ref().map(|(w, t)| (w.as_str(), *t)));
        let bytes = jsonrpc::result_response(&call.id, result_json);
        match decision {
            "allowed" => self.counters.calls_allowed += 1,
            "denied" => self.counters.calls_denied += 1,
            _ => self.counters.calls_error += 1,
        }
        let outcome = match decision {
            "allowed" => "ok",
            "denied" => "refused",
            _ => "error",
        };
        *self
            .observed
            .requests
            .entry(("tools/call", outcome))
            .or_insert(0) += 1;
        let rule = policy_decision
            .rule
            .clone()
            .unwrap_or_else(|| "default".into());
        let verdict = match decision {
            "denied" => "block",
            "error" => "error",
            _ => "allow",
        };
        *self
            .observed
            .policy_decisions
            .entry((rule, verdict))
            .or_insert(0) += 1;
        self.observed
            .tool_call_latency
            .observe(call.started.elapsed());
        let rewritten_args = rewritten.as_deref().map(str::as_bytes);
        self.ledger.stage_call_end(
            *ledger_id,
            &CallEnd {
                decision,
                policy_rule: policy_decision.rule.as_deref(),
                policy_reason: policy_decision.reason.as_deref(),
                duration_us: call.started.elapsed().as_micros() as u64,
                error_message: error,
                bytes_sent: if call.conn.is_some() { bytes.len() } else { 0 },
                response: result_json.as_bytes(),
                rewritten_arguments: rewritten_args,
                original_response: original.map(str::as_bytes),
                approved_by: approved.map(|a| a.0),
                decided_at_ms: approved.map(|a| a.1),
            },
        );
        if let Some(conn) = call.conn {
            self.reply(conn, call.stream, &call.id, bytes);
        }
    }

    /// A call could not be served (worker gone, timeout, stopping, ledger): answer it.
    fn fail_call(&mut self, key: u64, code: ToolErrorCode, message: &str) {
        let Some(call) = self.take_call(key) else {
            return;
        };
        match &call.kind {
            CallKind::Tool { .. } => {
                let result = refusal(code, message, None).to_string();
                let decision = if code == ToolErrorCode::AskTimeout {
                    "denied"
                } else {
                    "error"
                };
                self.finish_tool(call, decision, &result, Some(message), None, None);
            }
            CallKind::Other => {
                if let Some(conn) = call.conn {
                    let jcode = code.mcp_error_code();
                    self.reply_error(conn, call.stream, &call.id, jcode, message, None);
                }
            }
            CallKind::Listing { server, .. } => {
                crate::warn!("listing of server {server} failed: {message}");
            }
            CallKind::Attest => {
                let name = self.workers[call.worker].name.clone();
                crate::warn!("re-attestation of worker {name} failed: {message}");
            }
            CallKind::Configure => {
                crate::error!("configuring the aggregator failed: {message}");
            }
        }
    }

    fn complete(
        &mut self,
        call: Call,
        ok: Option<String>,
        error: Option<rpc::RpcError>,
        facts: Option<String>,
    ) {
        match &call.kind {
            CallKind::Listing { kind, server } => {
                let (kind, server) = (*kind, server.clone());
                let items = ok
                    .as_deref()
                    .and_then(|t| serde_json::from_str::<Vec<Value>>(t).ok());
                let items = match (items, self.upstreams.as_mut()) {
                    (Some(items), Some(u)) if kind == Kind::Tools && u.is_worker(call.worker) => {
                        let review = u.review_tools(&server, items);
                        for note in &review.notes {
                            if let Some(line) = note.log_line() {
                                crate::warn!("{line}");
                            }
                            let (kind, detail) = note.event();
                            self.ledger.stage_event(kind, &detail);
                        }
                        Some(review.visible)
                    }
                    (items, _) => items,
                };
                match items {
                    Some(items) => {
                        match self.catalog.set(kind, &server, call.worker, items) {
                            Ok(changed) => {
                                let count = self.catalog.len(kind);
                                self.event("catalog", json!({"server": server, "kind": kind.list_key(), "count": count}));
                                if changed {
                                    self.broadcast_list_changed(kind);
                                }
                            }
                            Err(e) => crate::warn!("catalog: {}", e.0),
                        }
                    }
                    None => crate::warn!(
                        "server {server}: listing failed: {}",
                        error
                            .map(|e| e.message)
                            .unwrap_or_else(|| "not a JSON array".into())
                    ),
                }
            }
            CallKind::Other => {
                if let Some(conn) = call.conn {
                    match (ok, error) {
                        (Some(result), _) => {
                            self.reply(
                                conn,
                                call.stream,
                                &call.id,
                                jsonrpc::result_response(&call.id, &result),
                            );
                        }
                        (None, e) => {
                            let message =
                                e.map(|e| e.message).unwrap_or_else(|| "no result".into());
                            self.reply_error(
                                conn,
                                call.stream,
                                &call.id,
                                jsonrpc::INTERNAL_ERROR,
                                &message,
                                None,
                            );
                        }
                    }
                }
            }
            CallKind::Tool { .. } => self.complete_tool(call, ok, error, facts),
            CallKind::Configure => {
                if let Some(e) = error {
                    crate::error!(
                        "configuring the aggregator failed: {}: {}",
                        e.kind,
                        e.message
                    );
                }
                let _ = ok;
            }
            CallKind::Attest => {
                let name = self.workers[call.worker].name.clone();
                let report: Value = ok
                    .as_deref()
                    .and_then(|t| serde_json::from_str(t).ok())
                    .unwrap_or(Value::Null);
                let all_denied = report["probes"]
                    .as_array()
                    .is_some_and(|p| !p.is_empty() && p.iter().all(|p| p["denied"] == true));
                if !all_denied {
                    crate::error!("worker {name}: a live re-attestation found a probe not denied");
                }
                self.event(
                    "worker_reattested",
                    json!({"worker": name, "all_denied": all_denied, "report": report}),
                );
            }
        }
    }

    fn complete_tool(
        &mut self,
        mut call: Call,
        ok: Option<String>,
        error: Option<rpc::RpcError>,
        facts: Option<String>,
    ) {
        if let Some(facts) = facts
            && let CallKind::Tool { ledger_id, .. } = &call.kind
        {
            self.event("tool_facts", json!({"call_id": ledger_id, "facts": facts}));
        }
        let result = match (ok, error) {
            (Some(result), _) => result,
            (None, Some(e)) => {
                let message = format!("{}: {}", e.kind, e.message);
                let result = crate::mcp::tool_error::tool_error_result(
                    &e.kind,
                    jsonrpc::INTERNAL_ERROR,
                    &e.message,
                    None,
                );
                self.finish_tool(
                    call,
                    "error",
                    &result.to_string(),
                    Some(&message),
                    None,
                    None,
                );
                return;
            }
            (None, None) => {
                let result = refusal(
                    ToolErrorCode::Internal,
                    "the worker sent an empty answer",
                    None,
                );
                self.finish_tool(
                    call,
                    "error",
                    &result.to_string(),
                    Some("empty answer"),
                    None,
                    None,
                );
                return;
            }
        };
        let CallKind::Tool { server, tool, .. } = &call.kind else {
            return;
        };
        let tool_name = format!("{server}__{tool}");
        let policy = Rc::clone(&self.policy);
        // The result as a value, when the response phase needed it parsed anyway.
        let mut parsed: Option<Value> = None;
        if policy.has_response_rules("tools/call", Some(&tool_name)) {
            let Ok(mut value) = serde_json::from_str::<Value>(&result) else {
                let r = refusal(
                    ToolErrorCode::Internal,
                    "the tool's result is not valid JSON",
                    None,
                );
                self.finish_tool(
                    call,
                    "error",
                    &r.to_string(),
                    Some("invalid result JSON"),
                    Some(&result),
                    None,
                );
                return;
            };
            let subject = Subject {
                method: "tools/call",
                server: Some(server),
                tool: Some(&tool_name),
                resource: None,
                principal: &call.principal,
                transport: call.transport,
                process: &call.process,
                arguments: None,
            };
            let decision = policy.decide(Phase::Response, &subject, Some(&value));
            if let CallKind::Tool { ledger_id, .. } = &call.kind {
                for (seq, m) in (0u32..).zip(&decision.matched) {
                    self.ledger.stage_rule_event(
                        *ledger_id,
                        seq,
                        &m.id,
                        action_str(m.action),
                        "response",
                        layer_str(m.layer),
                    );
                }
            }
            match decision.verdict {
                Verdict::Allow => {
                    let applied = policy.rewrite_result(&decision, &mut value);
                    if !applied.is_empty() {
                        let rewritten = value.to_string();
                        self.finish_tool(call, "allowed", &rewritten, None, Some(&result), None);
                        return;
                    }
                    parsed = Some(value);
                }
                _ => {
                    // `ask` on a result cannot wait for a human while holding the answer
                    // forever; it is treated as a block (documented).
                    let message = match &decision.reason {
                        Some(r) => format!("result blocked by policy: {r}"),
                        None => "result blocked by policy".to_owned(),
                    };
                    let r = refusal(
                        ToolErrorCode::PolicyBlocked,
                        &message,
                        decision.rule.as_deref(),
                    );
                    // The row names the rule that refused the result.
                    if let CallKind::Tool { decision: d, .. } = &mut call.kind {
                        *d = decision.clone();
                    }
                    self.finish_tool(
                        call,
                        "denied",
                        &r.to_string(),
                        Some(&message),
                        Some(&result),
                        None,
                    );
                    return;
                }
            }
        }
        // A tool's own failure (`isError`) ends the row as an error with its message.
        let error = match &parsed {
            Some(value) => tool_error_text(value),
            None if result.contains("\"isError\"") => serde_json::from_str::<Value>(&result)
                .ok()
                .as_ref()
                .and_then(tool_error_text),
            None => None,
        };
        let decision = if error.is_some() { "error" } else { "allowed" };
        self.finish_tool(call, decision, &result, error.as_deref(), None, None);
    }

    fn broadcast_list_changed(&mut self, kind: Kind) {
        let method = match kind {
            Kind::Tools => "notifications/tools/list_changed",
            Kind::Resources => "notifications/resources/list_changed",
            Kind::Prompts => "notifications/prompts/list_changed",
        };
        let bytes = jsonrpc::notification(method, &json!({}));
        let conns: Vec<ConnRef> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.protocol_version.is_some())
            .map(|(c, _)| *c)
            .collect();
        for conn in conns {
            self.actions.push(Action::Notify {
                conn,
                bytes: bytes.clone(),
            });
        }
    }

    // ---- approvals --------------------------------------------------------------------

    pub fn pending_approvals(&self, now: Instant) -> Vec<PendingApproval> {
        let mut out: Vec<PendingApproval> = self
            .calls
            .iter()
            .filter_map(|(key, c)| match (&c.stage, &c.kind) {
                (
                    Stage::AwaitingApproval { arguments },
                    CallKind::Tool {
                        server,
                        tool,
                        decision,
                        ..
                    },
                ) => Some(PendingApproval {
                    id: *key,
                    tool: format!("{server}__{tool}"),
                    principal: c.principal.clone(),
                    process: c.process.clone(),
                    transport: c.transport.as_str(),
                    arguments: arguments.clone(),
                    rule: decision.rule.clone(),
                    reason: decision.reason.clone(),
                    waiting_ms: now.saturating_duration_since(c.started).as_millis(),
                }),
                _ => None,
            })
            .collect();
        out.sort_by_key(|p| p.id);
        out
    }

    /// A human approved or denied a held call. Returns an error text when `id` is not a
    /// call awaiting approval.
    pub fn decide_approval(
        &mut self,
        id: u64,
        approve: bool,
        who: &str,
        reason: Option<&str>,
        now: Instant,
    ) -> Result<(), String> {
        match self.calls.get(&id) {
            Some(Call {
                stage: Stage::AwaitingApproval { .. },
                ..
            }) => {}
            _ => return Err(format!("no call awaiting approval has id {id}")),
        }
        let Some(mut call) = self.take_call(id) else {
            return Err(format!("no call awaiting approval has id {id}"));
        };
        let decided = now_ms();
        let ledger_id = match &call.kind {
            CallKind::Tool { ledger_id, .. } => *ledger_id,
            _ => 0,
        };
        self.event(
            "ask_decided",
            json!({"approval_id": id, "call_id": ledger_id, "approved": approve, "by": who, "reason": reason}),
        );
        if !approve {
            let message = match reason {
                Some(r) => format!("denied by {who}: {r}"),
                None => format!("denied by {who}"),
            };
            let rule = match &call.kind {
                CallKind::Tool { decision, .. } => decision.rule.clone(),
                _ => None,
            };
            let result = refusal(ToolErrorCode::AskDenied, &message, rule.as_deref());
            self.finish_tool(
                call,
                "denied",
                &result.to_string(),
                Some(&message),
                None,
                Some((who, decided)),
            );
            return Ok(());
        }
        call.approved = Some((who.to_owned(), decided));
        let Stage::AwaitingApproval { arguments } =
            std::mem::replace(&mut call.stage, Stage::AtWorker)
        else {
            return Ok(());
        };
        // Approved: rewrites apply now, as for an allow.
        let policy = Rc::clone(&self.policy);
        let mut args = arguments.clone();
        if let CallKind::Tool {
            decision,
            rewritten,
            ..
        } = &mut call.kind
        {
            decision.verdict = Verdict::Allow;
            if let Ok(mut v) = serde_json::from_str::<Value>(&arguments)
                && !policy.rewrite_arguments(decision, &mut v).is_empty()
            {
                args = v.to_string();
                *rewritten = Some(args.clone());
            }
        }
        // Record who approved on the row now; the outcome follows at completion.
        self.ledger.stage_call_end(
            ledger_id,
            &CallEnd {
                decision: "allowed",
                policy_rule: None,
                policy_reason: None,
                duration_us: 0,
                error_message: None,
                bytes_sent: 0,
                response: b"",
                rewritten_arguments: None,
                original_response: None,
                approved_by: Some(who),
                decided_at_ms: Some(decided),
            },
        );
        self.dispatch_tool(call, args, now);
        Ok(())
    }

    // ---- time -------------------------------------------------------------------------

    pub fn next_deadline(&self) -> Option<Instant> {
        let call = self.deadlines.first().map(|(t, _)| *t);
        let refresh = self
            .upstreams
            .as_ref()
            .and_then(UpstreamsState::next_refresh);
        // The ledger's chain rows that wait are written by a commit when due.
        let ledger = self.ledger.next_deadline();
        call.into_iter().chain(refresh).chain(ledger).min()
    }

    pub fn on_timers(&mut self, now: Instant) {
        if self.upstreams.as_mut().is_some_and(|u| u.refresh_due(now)) {
            self.refresh_upstreams(now);
        }
        while let Some((t, key)) = self.deadlines.first().copied() {
            if t > now {
                break;
            }
            self.deadlines.pop_first();
            let Some(call) = self.calls.get(&key) else {
                continue;
            };
            if call.deadline != t {
                continue; // superseded (an approved ask got a new deadline)
            }
            match call.stage {
                Stage::AwaitingApproval { .. } => {
                    let secs = self.policy.ask_timeout().as_secs();
                    let message = format!("no approval within {secs} s (policy.ask_timeout_secs)");
                    self.event("ask_timeout", json!({"approval_id": key}));
                    self.fail_call(key, ToolErrorCode::AskTimeout, &message);
                }
                Stage::AtWorker => {
                    let secs = t.saturating_duration_since(call.started).as_secs();
                    let message = format!(
                        "{} timed out after {secs} s ({})",
                        call.method, call.timeout_key
                    );
                    self.cancel_at_worker(call.worker, key);
                    self.fail_call(key, ToolErrorCode::Timeout, &message);
                }
            }
        }
    }

    // ---- the commit barrier -----------------------------------------------------------

    /// Commit what this turn staged. On success the actions may go out; on failure every
    /// call that would have reached a tool or an agent is refused instead.
    pub fn commit(&mut self) -> Result<(), String> {
        if !self.ledger.has_work() {
            return Ok(());
        }
        let started = Instant::now();
        let outcome = self.ledger.commit();
        self.observed
            .ledger_commit_latency
            .observe(started.elapsed());
        match outcome {
            Ok(_) => {
                if !self.ledger_ok {
                    crate::info!("ledger writable again; serving calls");
                }
                self.ledger_ok = true;
                Ok(())
            }
            Err(e) => {
                self.counters.ledger_failures += 1;
                if self.ledger_ok {
                    crate::error!("ledger cannot be written ({e}); refusing calls until it can");
                }
                self.ledger_ok = false;
                self.refuse_uncommitted();
                Err(e.to_string())
            }
        }
    }

    fn refuse_uncommitted(&mut self) {
        let actions = std::mem::take(&mut self.actions);
        for action in actions {
            match action {
                Action::ToWorker {
                    call: Some(key), ..
                } if self.calls.get(&key).is_some_and(|c| c.conn.is_some()) => {
                    // The row saying this call reaches the tool is not on disk: it must not.
                    if let Some(call) = self.take_call(key)
                        && let Some(conn) = call.conn
                    {
                        let bytes = refused_bytes(&call.method, &call.id);
                        self.actions.push(Action::Reply {
                            conn,
                            stream: call.stream,
                            id: call.id,
                            bytes,
                        });
                    }
                }
                Action::Reply {
                    conn, stream, id, ..
                } => {
                    let bytes = jsonrpc::error_response(
                        Some(&id),
                        jsonrpc::LEDGER_UNAVAILABLE,
                        "the ledger cannot be written, so the answer is withheld (fail closed)",
                        None,
                    );
                    self.actions.push(Action::Reply {
                        conn,
                        stream,
                        id,
                        bytes,
                    });
                }
                other => self.actions.push(other),
            }
        }
    }

    pub fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }

    pub fn checkpoint(&mut self) {
        if let Err(e) = self.ledger.checkpoint() {
            crate::warn!("ledger checkpoint failed: {e}");
        }
    }
}

fn refused_bytes(method: &str, id: &str) -> Vec<u8> {
    let message = "the ledger cannot be written, so the call was not made (fail closed)";
    if method == "tools/call" {
        let r = refusal(ToolErrorCode::LedgerUnavailable, message, None).to_string();
        jsonrpc::result_response(id, &r)
    } else {
        jsonrpc::error_response(Some(id), jsonrpc::LEDGER_UNAVAILABLE, message, None)
    }
}

/// Where a tool call goes.
struct Route {
    worker: WorkerId,
    server: String,
    upstream: String,
    declares_input: bool,
}

impl From<&crate::mcp::catalog::Entry> for Route {
    fn from(e: &crate::mcp::catalog::Entry) -> Route {
        Route {
            worker: e.worker,
            server: e.server.clone(),
            upstream: e.upstream.clone(),
            declares_input: e.declares_input,
        }
    }
}

struct RequestCtx<'a> {
    conn: ConnRef,
    stream: u32,
    id: &'a str,
    peer: &'a Peer,
    process: &'a str,
    bytes_received: usize,
}

fn action_str(a: crate::policy::Action) -> &'static str {
    match a {
        crate::policy::Action::Allow => "allow",
        crate::policy::Action::Ask => "ask",
        crate::policy::Action::Block => "block",
        crate::policy::Action::Rewrite => "rewrite",
    }
}

fn layer_str(l: crate::policy::Layer) -> &'static str {
    match l {
        crate::policy::Layer::Builtin => "builtin",
        crate::policy::Layer::Operator => "operator",
        crate::policy::Layer::Corp => "corp",
    }
}

/// The error message of a CallToolResult that says `isError: true`, for the ledger's
/// error column; None for a result that is not an error.
fn tool_error_text(result: &Value) -> Option<String> {
    if result.get("isError").and_then(Value::as_bool) != Some(true) {
        return None;
    }
    if let Some(m) = result
        .pointer("/structuredContent/error/message")
        .and_then(Value::as_str)
    {
        let code = result
            .pointer("/structuredContent/error/code")
            .and_then(Value::as_str)
            .unwrap_or("error");
        return Some(format!("{code}: {m}"));
    }
    Some(
        result
            .pointer("/content/0/text")
            .and_then(Value::as_str)
            .map(|t| t.chars().take(512).collect())
            .unwrap_or_else(|| "tool returned isError".into()),
    )
}
