//! What a server sends the agent during a call besides its answer, and the agent's answers
//! back: one path for every such message, like the pipeline for requests.
//!
//! ```text
//!  worker event (call_notification | call_requests)
//!    ─ find the call (its worker, its server; progress by the gateway's own token)
//!    ─ bounds (size, rate per call, requests per call) ─ client capability
//!    ─ policy, response phase (method, server, tool, caller; the params as the result)
//!    ─ event in the ledger, linked to the call ─ relayed (after the commit) ─┐
//!  agent's answer (JSON-RPC response, or an input_required retry)           │
//!    ─ the relayed request it answers, from the connection that holds it ◄──┘
//!    ─ policy, request phase (rules that match it; the default does not apply)
//!    ─ event in the ledger ─ to the worker (after the commit)
//! ```
//!
//! Progress travels under the agent's own `progressToken`: the upstream sees only the
//! gateway's (`toolwall-<call>`), and a notification with any other token is dropped.
//! Legacy doors get a server's request as a JSON-RPC request with an id of the gateway's
//! own (`toolwall-<n>`); a 2026-07-28 client gets it inside an `input_required` result
//! whose sealed `requestState` names the call and the round, and its retry resumes the
//! call where the server waits.

use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Instant;

use super::calls::Stage;
use super::exchange::{Exchange, Routed};
use super::request_state::{Claims, StateKey};
use super::{Action, ConnRef, Core, Recorder};
use crate::gateway::relay_config::RelayConfig;
use crate::log::Level;
use crate::mcp::catalog::WorkerId;
use crate::mcp::client_caps::ClientCaps;
use crate::mcp::jsonrpc;
use crate::mcp::log_level::LogLevel;
use crate::mcp::token_bucket::TokenBucket;
use crate::policy::{Phase, Subject, Verdict};
use crate::workers::relay_wire::{
    CALL_NOTIFICATION, CALL_REQUESTS, CallMeta, CallNotification, CallRequests, RELAY_DROPPED,
    RelayDropped, RequestAnswer, required_capability,
};
use crate::workers::rpc::{self, Op};

/// Prefix of the ids and tokens the gateway makes up for an agent's call.
pub const ID_PREFIX: &str = "toolwall-";
/// Longest progress token of an agent's that is kept (a longer one: no progress).
pub const MAX_PROGRESS_TOKEN_BYTES: usize = 256;
/// `_meta` key of a modern request's client capabilities.
const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
/// `_meta` key of a modern request's log level (log messages are opt-in per request).
pub const META_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";

/// Characters of a relayed message's params kept in its ledger event.
const EVENT_PREVIEW_CHARS: usize = 512;

/// What the gateway knows of the client on a connection: its era and, in the legacy era,
/// the capabilities it declared at `initialize` (a modern client declares them per
/// request).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnFacts {
    pub modern: bool,
    pub caps: ClientCaps,
    /// The lowest log level the client asked for (`logging/setLevel`, legacy era).
    pub log_level: Option<LogLevel>,
}

/// One call's relay state, on its [`Exchange`].
#[derive(Debug)]
pub struct CallRelay {
    /// The agent's progress token, raw JSON, when it asked for progress.
    pub agent_token: Option<String>,
    pub caps: ClientCaps,
    pub modern: bool,
    bucket: TokenBucket,
    pub relayed: u32,
    pub dropped: u32,
    pub blocked: u32,
    /// Server requests relayed (or refused) so far.
    pub requests: u32,
    /// Relayed requests not yet answered (relay keys).
    pub pending: Vec<u64>,
    /// Modern era: requests waiting to go out in the next `input_required`.
    pub queued: Vec<u64>,
    /// Modern era: the round of the last `input_required` issued (0: none).
    pub round: u64,
    /// SHA-256 of the arguments as they arrived (a retry must carry the same).
    pub arrived_args: String,
    /// The lowest level of log messages the agent wants (None: none asked for; a legacy
    /// upstream's messages are relayed all the same, a modern one sends none).
    pub log_level: Option<LogLevel>,
    /// The approval question asked of a legacy client (its relay key), if any.
    pub client_ask: Option<u64>,
}

impl Default for CallRelay {
    fn default() -> Self {
        CallRelay {
            agent_token: None,
            caps: ClientCaps::default(),
            modern: false,
            bucket: TokenBucket::new(0, 1),
            relayed: 0,
            dropped: 0,
            blocked: 0,
            requests: 0,
            pending: Vec::new(),
            queued: Vec::new(),
            round: 0,
            arrived_args: String::new(),
            log_level: None,
            client_ask: None,
        }
    }
}

/// A server request relayed to an agent, awaiting its answer.
#[derive(Debug, Clone)]
struct Relayed {
    call: u64,
    /// The worker's number for it.
    worker_request: u64,
    method: String,
    params: Option<Value>,
    /// The key the server gave it in its `input_required` result, if any.
    server_key: Option<String>,
    /// The key a modern agent was given it under (set when an `input_required` carries
    /// it): its answer is the retry's `inputResponses` entry under this key.
    agent_key: Option<String>,
}

/// Longest server key of an input request kept as the agent's key (a longer one: the
/// gateway's own).
const MAX_INPUT_KEY_BYTES: usize = 256;

/// The core's relay state across calls.
#[derive(Debug)]
pub struct RelayHub {
    pub config: RelayConfig,
    relayed: HashMap<u64, Relayed>,
    unrouted: TokenBucket,
    pub unrouted_dropped: u64,
    /// Agents' answers to relayed requests that were over (or never were): dropped.
    pub answers_dropped: u64,
    /// Seals the `requestState` of `input_required` results (and client asks).
    pub key: Option<StateKey>,
    /// Names this gateway instance in the nonces it issues.
    pub instance: String,
    pub issued: u64,
}

impl Default for RelayHub {
    fn default() -> Self {
        RelayHub::new(RelayConfig::default())
    }
}

impl RelayHub {
    pub fn new(config: RelayConfig) -> RelayHub {
        RelayHub {
            unrouted: TokenBucket::new(
                config.unrouted_logs_per_sec,
                config.unrouted_logs_per_sec.max(1),
            ),
            config,
            relayed: HashMap::new(),
            unrouted_dropped: 0,
            answers_dropped: 0,
            key: None,
            instance: "0".into(),
            issued: 0,
        }
    }
}

/// The upstream progress token of call `key`.
pub fn upstream_token(key: u64) -> String {
    format!("{ID_PREFIX}{key}")
}

/// The call or relay key in an id or token the gateway made up.
pub(super) fn key_of(text: &str) -> Option<u64> {
    text.strip_prefix(ID_PREFIX)?.parse().ok()
}

fn preview(value: &Option<Value>) -> String {
    let text = value.as_ref().map(Value::to_string).unwrap_or_default();
    text.chars().take(EVENT_PREVIEW_CHARS).collect()
}

impl<R: Recorder> Core<R> {
    pub fn set_relay_config(&mut self, config: RelayConfig) {
        let mut hub = RelayHub::new(config);
        std::mem::swap(&mut hub.relayed, &mut self.relay.relayed);
        hub.key = self.relay.key.take();
        hub.instance = std::mem::take(&mut self.relay.instance);
        hub.issued = self.relay.issued;
        self.relay = hub;
    }

    /// The key `requestState`s are sealed with, and a name for this instance (random,
    /// from the loop) that makes the nonces it issues unique.
    pub fn set_state_key(&mut self, key: StateKey, instance: String) {
        self.relay.key = Some(key);
        self.relay.instance = instance;
    }

    /// What the door knows of the client on `conn` (HTTP: per request).
    pub fn set_conn_facts(&mut self, conn: ConnRef, facts: ConnFacts) {
        if let Some(s) = self.sessions.get_mut(&conn) {
            s.facts = facts;
        }
    }

    /// The relay state of a new call from `conn` with these params.
    pub(super) fn call_relay(&self, conn: ConnRef, routed: Routed, params: &Value) -> CallRelay {
        let facts = self
            .sessions
            .get(&conn)
            .map(|s| s.facts)
            .unwrap_or_default();
        let meta = params.get("_meta");
        let caps = if facts.modern {
            ClientCaps::from_value(meta.and_then(|m| m.get(META_CLIENT_CAPABILITIES)))
        } else {
            facts.caps
        };
        let log_level = if facts.modern {
            meta.and_then(|m| m.get(META_LOG_LEVEL))
                .and_then(Value::as_str)
                .and_then(LogLevel::parse)
        } else {
            facts.log_level
        };
        let agent_token = meta
            .and_then(|m| m.get("progressToken"))
            .filter(|t| t.is_string() || t.is_i64() || t.is_u64())
            .map(Value::to_string)
            .filter(|t| t.len() <= MAX_PROGRESS_TOKEN_BYTES);
        let c = &self.relay.config;
        CallRelay {
            agent_token,
            caps,
            modern: facts.modern,
            bucket: TokenBucket::new(c.notifications_per_sec, c.notification_burst),
            // Only a 2026-07-28 client retries with a requestState bound to the arguments.
            arrived_args: if facts.modern {
                super::input_retry::arrived_arguments_hash(routed, params)
            } else {
                String::new()
            },
            log_level,
            ..CallRelay::default()
        }
    }

    /// The `meta` of a call's request to the aggregator.
    pub(super) fn call_meta(&self, key: u64, x: &Exchange, deadline: Instant) -> CallMeta {
        let c = &self.relay.config;
        CallMeta {
            progress_token: x.relay.agent_token.as_ref().map(|_| upstream_token(key)),
            client_capabilities: Some(x.relay.caps.to_value()),
            wait_ms: u64::try_from(deadline.saturating_duration_since(self.now).as_millis())
                .unwrap_or(u64::MAX),
            notifications_per_sec: c.notifications_per_sec,
            notification_burst: c.notification_burst,
            log_level: x.relay.log_level.map(|l| l.as_str().to_owned()),
            max_message_bytes: c.max_message_bytes,
            max_requests: c.max_requests_per_call,
            param_headers: self.param_headers(x),
            max_answer_bytes: self.limits.max_answer_bytes,
            max_json_nodes: self.limits.max_json_nodes,
        }
    }

    /// The `Mcp-Param-*` headers of a call's request upstream (SEP-2243): the tool's
    /// bindings over the arguments as forwarded (after policy).
    fn param_headers(&self, x: &Exchange) -> Vec<(String, String)> {
        if x.routed != super::exchange::Routed::CallTool {
            return Vec::new();
        }
        let server = &x.target.server;
        let entry = [x.display_name(), x.target.upstream.clone()]
            .iter()
            .find_map(|k| {
                self.catalog
                    .get(crate::mcp::catalog::Kind::Tools, k)
                    .filter(|e| &e.server == server && e.upstream == x.target.upstream)
            });
        match entry {
            Some(e) if !e.header_bindings.is_empty() => {
                crate::mcp::param_headers::mirrored(&e.header_bindings, x.arguments())
            }
            _ => Vec::new(),
        }
    }

    /// `logging/setLevel` (legacy era): the lowest level of the log messages relayed to
    /// this client's calls from now on.
    pub(super) fn set_log_level(
        &mut self,
        ctx: &super::dispatch::RequestCtx,
        method: &str,
        params: Option<&serde_json::value::RawValue>,
    ) {
        if !self.method_allowed(ctx, method) {
            return;
        }
        let level = params
            .and_then(|p| serde_json::from_str::<Value>(p.get()).ok())
            .and_then(|p| {
                p.get("level")
                    .and_then(Value::as_str)
                    .and_then(LogLevel::parse)
            });
        let Some(level) = level else {
            self.answer_error(
                ctx,
                method,
                jsonrpc::INVALID_PARAMS,
                "invalid params: level must be one of debug, info, notice, warning, error, critical, alert, emergency",
                None,
            );
            return;
        };
        if let Some(s) = self.sessions.get_mut(&ctx.conn) {
            s.facts.log_level = Some(level);
        }
        self.answer(ctx, method, "{}");
    }

    /// A worker event of the relay's; false for any other kind.
    pub(super) fn on_relay_event(&mut self, worker: WorkerId, kind: &str, detail: &str) -> bool {
        match kind {
            CALL_NOTIFICATION => {
                // Judged by its size before it is parsed: beyond the bounds it is dropped
                // and counted (its call, if its envelope names one).
                match self.relayed_detail_beyond_bounds(detail) {
                    None => {
                        if let Ok(n) = serde_json::from_str::<CallNotification>(detail) {
                            self.relay_notification(worker, n);
                        }
                    }
                    Some(call) => self.count_dropped(worker, call, 1),
                }
                true
            }
            RELAY_DROPPED => {
                if let Ok(d) = serde_json::from_str::<RelayDropped>(detail) {
                    let key = d
                        .progress_token
                        .as_deref()
                        .and_then(key_of)
                        .filter(|k| self.relay_target(worker, &d.server, *k));
                    self.count_dropped(worker, key, d.count);
                }
                true
            }
            CALL_REQUESTS => {
                if let Ok(r) = serde_json::from_str::<CallRequests>(detail) {
                    self.relay_requests(worker, r);
                }
                true
            }
            _ => false,
        }
    }

    /// `None` when a `call_notification` event may be parsed; else the call its envelope
    /// names (if any), for the count. A worker bounds these already; the gateway does not
    /// trust it to.
    fn relayed_detail_beyond_bounds(&self, detail: &str) -> Option<Option<u64>> {
        // The params, escaped once more inside the event, plus the envelope's few fields.
        let slack = 4096;
        let max_bytes = self.relay.config.max_message_bytes.saturating_mul(2) + slack;
        let over = detail.len() > max_bytes
            || crate::aggregator::json_nodes::within(detail.as_bytes(), self.limits.max_json_nodes)
                .is_err();
        if !over {
            return None;
        }
        #[derive(serde::Deserialize)]
        struct Envelope {
            #[serde(default)]
            call: Option<u64>,
        }
        Some(
            serde_json::from_str::<Envelope>(detail)
                .ok()
                .and_then(|e| e.call),
        )
    }

    /// `count` notifications dropped before the gateway saw them whole: the call's row
    /// (when `key` is a call of `worker`'s) and the metrics count them.
    fn count_dropped(&mut self, worker: WorkerId, key: Option<u64>, count: u64) {
        self.counters.relay_dropped = self.counters.relay_dropped.saturating_add(count);
        let owned = key.filter(|k| {
            self.calls
                .get(*k)
                .is_some_and(|c| c.worker == worker && c.stage == Stage::AtWorker)
        });
        match owned
            .and_then(|k| self.calls.get_mut(k))
            .and_then(|c| c.exchange_mut())
        {
            Some(x) => {
                let n = u32::try_from(count).unwrap_or(u32::MAX);
                x.relay.dropped = x.relay.dropped.saturating_add(n);
            }
            None => self.relay.unrouted_dropped = self.relay.unrouted_dropped.saturating_add(count),
        }
    }

    /// The call `key` if it is an exchange at `worker` for `server`.
    fn relay_target(&self, worker: WorkerId, server: &str, key: u64) -> bool {
        self.calls.get(key).is_some_and(|c| {
            c.worker == worker
                && c.stage == Stage::AtWorker
                && c.exchange().is_some_and(|x| x.target.server == server)
        })
    }

    fn relay_event(&mut self, x_id: i64, detail: Value) {
        let mut detail = detail;
        detail["call_id"] = json!(x_id);
        self.records.stage_event("relay", &detail);
    }

    /// The response phase over a message from the server: Block (with the rule) or Allow
    /// (params possibly rewritten).
    fn judge_from_server(
        &mut self,
        x: &Exchange,
        method: &str,
        params: &mut Option<Value>,
    ) -> (Verdict, Option<String>) {
        let policy = Rc::clone(&self.policy);
        if !policy.has_response_rules(method, x.target.tool.as_deref()) {
            return (Verdict::Allow, None);
        }
        let subject = Subject {
            method,
            server: Some(&x.target.server),
            tool: x.target.tool.as_deref(),
            resource: x.target.resource.as_deref(),
            principal: &x.from.principal,
            transport: x.from.transport,
            process: &x.from.process,
            arguments: None,
        };
        let mut value = params.take().unwrap_or_else(|| json!({}));
        let decision = policy.decide(Phase::Response, &subject, Some(&value));
        if decision.verdict != Verdict::Allow {
            self.observed
                .decision(decision.rule.as_deref(), Verdict::Block);
            *params = Some(value);
            return (Verdict::Block, decision.rule.as_deref().map(str::to_owned));
        }
        policy.rewrite_result(&decision, &mut value);
        *params = Some(value);
        (Verdict::Allow, decision.rule.as_deref().map(str::to_owned))
    }

    fn relay_notification(&mut self, worker: WorkerId, n: CallNotification) {
        if n.method == super::subscriptions::UPDATED {
            // Not a call's: it goes to the sessions subscribed to the URI at that server.
            if self.is_aggregator(worker) {
                self.relay_resource_updated(&n.server, n.params.as_ref());
            }
            return;
        }
        let by_token = n
            .params
            .as_ref()
            .and_then(|p| p.get("progressToken"))
            .and_then(Value::as_str)
            .and_then(key_of);
        let key = n.call.or(if n.method == "notifications/progress" {
            by_token
        } else {
            None
        });
        let Some(key) = key.filter(|k| self.relay_target(worker, &n.server, *k)) else {
            self.unrouted(&n);
            return;
        };
        let Some(mut call) = self.calls.take(key) else {
            return;
        };
        if let Some(x) = call.exchange_mut() {
            self.relay_notification_of(key, x, by_token, n);
        }
        self.calls.insert(key, call);
    }

    fn relay_notification_of(
        &mut self,
        key: u64,
        x: &mut Exchange,
        by_token: Option<u64>,
        n: CallNotification,
    ) {
        let mut params = n.params;
        if n.method == "notifications/progress" {
            // Only the token the gateway gave for this call, and only for an agent that
            // asked: the upstream cannot make up progress for anyone.
            let agent = x
                .relay
                .agent_token
                .as_deref()
                .and_then(|t| serde_json::from_str::<Value>(t).ok());
            let Some(agent) = agent.filter(|_| by_token == Some(key)) else {
                x.relay.dropped += 1;
                self.counters.relay_dropped += 1;
                return;
            };
            if let Some(p) = params.as_mut().and_then(Value::as_object_mut) {
                p.insert("progressToken".into(), agent);
            }
        }
        if n.method == "notifications/message"
            && let Some(wanted) = x.relay.log_level
        {
            let level = params
                .as_ref()
                .and_then(|p| p.get("level"))
                .and_then(Value::as_str)
                .and_then(LogLevel::parse);
            if level.is_none_or(|l| l < wanted) {
                x.relay.dropped += 1;
                self.counters.relay_dropped += 1;
                return;
            }
        }
        let size = params.as_ref().map_or(0, |p| p.to_string().len());
        if size > self.relay.config.max_message_bytes
            || x.from.conn.is_none()
            || !x.relay.bucket.take(self.now)
        {
            x.relay.dropped += 1;
            self.counters.relay_dropped += 1;
            return;
        }
        let (verdict, rule) = self.judge_from_server(x, &n.method, &mut params);
        let decision = if verdict == Verdict::Block {
            x.relay.blocked += 1;
            "blocked"
        } else {
            x.relay.relayed += 1;
            "relayed"
        };
        self.relay_event(
            x.ledger_id,
            json!({"direction": "to_client", "method": n.method, "server": n.server,
                   "decision": decision, "rule": rule, "params": preview(&params)}),
        );
        if verdict == Verdict::Block {
            return;
        }
        if let Some(conn) = x.from.conn {
            let bytes = jsonrpc::notification(&n.method, &params.unwrap_or_else(|| json!({})));
            self.actions.push(Action::Relay {
                conn,
                stream: x.from.stream,
                call: key,
                bytes,
                request_id: None,
            });
        }
    }

    /// A server's log message (or progress) that belongs to no call: logged, bounded.
    fn unrouted(&mut self, n: &CallNotification) {
        if n.method != "notifications/message" {
            return;
        }
        if !self.relay.unrouted.take(self.now) {
            self.relay.unrouted_dropped += 1;
            self.counters.relay_dropped += 1;
            return;
        }
        let p = n.params.as_ref();
        let level = p
            .and_then(|p| p.get("level"))
            .and_then(Value::as_str)
            .unwrap_or("info");
        let data = p
            .and_then(|p| p.get("data"))
            .map(Value::to_string)
            .unwrap_or_default();
        // JSON text keeps bidi, zero-width and tag characters as they are: escaped here
        // like every other upstream text in the log.
        let text = crate::aggregator::error::quote_upstream(&data, 300);
        let level: String = level
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .take(16)
            .collect();
        let server = crate::aggregator::error::quote_upstream(&n.server, 64);
        self.log(
            Level::Info,
            format!("server {server} says ({level}): {text}"),
        );
    }

    fn relay_requests(&mut self, worker: WorkerId, r: CallRequests) {
        let key = r.call;
        if !self.relay_target(worker, &r.server, key) {
            // The call ended (cancelled, timed out): the worker's link is gone too.
            return;
        }
        let Some(mut call) = self.calls.take(key) else {
            return;
        };
        let issue = match call.exchange_mut() {
            Some(x) => self.relay_requests_of(worker, key, x, r),
            None => false,
        };
        self.calls.insert(key, call);
        if issue {
            self.issue_input_required(key);
        }
    }

    /// Relay each request of `r`, or refuse it to the worker. True when a modern agent is
    /// to be sent an `input_required` now.
    fn relay_requests_of(
        &mut self,
        worker: WorkerId,
        key: u64,
        x: &mut Exchange,
        r: CallRequests,
    ) -> bool {
        let max = self.relay.config.max_requests_per_call;
        for request in r.requests {
            x.relay.requests = x.relay.requests.saturating_add(1);
            let mut params = request.params;
            let refusal = match required_capability(&request.method) {
                None => Some(Refused::new(
                    jsonrpc::METHOD_NOT_FOUND,
                    format!("toolwall does not relay {}", request.method),
                    "refused",
                )),
                Some(_)
                    if params.as_ref().map_or(0, |p| p.to_string().len())
                        > self.relay.config.max_message_bytes =>
                {
                    Some(Refused::new(
                        jsonrpc::INTERNAL_ERROR,
                        format!(
                            "the request is larger than {} bytes (relay.max_message_bytes)",
                            self.relay.config.max_message_bytes
                        ),
                        "refused",
                    ))
                }
                Some(_) if x.relay.requests > max => Some(Refused::new(
                    jsonrpc::INTERNAL_ERROR,
                    format!("more than {max} requests in one call (relay.max_requests_per_call)"),
                    "refused",
                )),
                Some(cap) if !x.relay.caps.has(cap) => Some(Refused {
                    data: Some(json!({"requiredCapabilities": {cap: {}}})),
                    ..Refused::new(
                        jsonrpc::METHOD_NOT_FOUND,
                        format!("the client did not declare the {cap} capability"),
                        "no_capability",
                    )
                }),
                Some(_) if x.from.conn.is_none() && !x.relay.modern => Some(Refused::new(
                    jsonrpc::INTERNAL_ERROR,
                    "the client is gone".to_owned(),
                    "refused",
                )),
                Some(_) => match self.judge_from_server(x, &request.method, &mut params) {
                    (Verdict::Block, rule) => Some(Refused {
                        data: Some(json!({"rule": rule})),
                        rule: rule.clone(),
                        ..Refused::new(
                            jsonrpc::POLICY_BLOCKED,
                            format!(
                                "{} blocked by policy{}",
                                request.method,
                                rule.as_deref()
                                    .map(|r| format!(" (rule {r})"))
                                    .unwrap_or_default()
                            ),
                            "blocked",
                        )
                    }),
                    _ => None,
                },
            };
            if let Some(refused) = refusal {
                if refused.decision == "blocked" {
                    x.relay.blocked += 1;
                }
                self.relay_event(
                    x.ledger_id,
                    json!({"direction": "to_client", "method": request.method, "server": r.server,
                           "decision": refused.decision, "rule": refused.rule,
                           "reason": refused.message, "params": preview(&params)}),
                );
                let answer =
                    RequestAnswer::error(request.id, refused.code, refused.message, refused.data);
                self.answer_worker(worker, key, &answer);
                continue;
            }
            let rk = self.calls.new_key();
            let agent_id = format!("{ID_PREFIX}{rk}");
            self.relay_event(
                x.ledger_id,
                json!({"direction": "to_client", "method": request.method, "server": r.server,
                       "decision": "relayed", "relay_id": agent_id, "params": preview(&params)}),
            );
            self.relay.relayed.insert(
                rk,
                Relayed {
                    call: key,
                    worker_request: request.id,
                    method: request.method.clone(),
                    params: params.clone(),
                    server_key: request.key.clone(),
                    agent_key: None,
                },
            );
            if x.relay.modern {
                x.relay.queued.push(rk);
                continue;
            }
            x.relay.pending.push(rk);
            if let Some(conn) = x.from.conn {
                let mut msg = json!({"jsonrpc": "2.0", "id": agent_id, "method": request.method});
                if let Some(p) = params {
                    msg["params"] = p;
                }
                self.actions.push(Action::Relay {
                    conn,
                    stream: x.from.stream,
                    call: key,
                    bytes: msg.to_string().into_bytes(),
                    request_id: Some(agent_id),
                });
            }
        }
        x.relay.modern && !x.relay.queued.is_empty() && x.from.conn.is_some()
    }

    /// Tell the worker the answer to its request (released after the commit).
    fn answer_worker(&mut self, worker: WorkerId, call: u64, answer: &RequestAnswer) {
        let id = self.calls.new_key();
        self.actions.push(Action::ToWorker {
            worker,
            call: Some(call),
            msg: rpc::Message::Request {
                id,
                op: Op::Answer {
                    call,
                    answer: answer.clone(),
                },
            },
        });
    }

    /// A modern agent's call: answer its current request with `input_required` holding the
    /// queued server requests; the call waits (detached) for the retry.
    fn issue_input_required(&mut self, key: u64) {
        let expires_ms = self.wall_ms().saturating_add(
            i64::try_from(self.relay.config.input_state_ttl_secs)
                .unwrap_or(i64::MAX)
                .saturating_mul(1000),
        );
        self.relay.issued += 1;
        let nonce = format!("{}-{}", self.relay.instance, self.relay.issued);
        let Some(call) = self.calls.get_mut(key) else {
            return;
        };
        let Some(x) = call.exchange_mut() else {
            return;
        };
        let Some(conn) = x.from.conn.take() else {
            return;
        };
        x.relay.round += 1;
        let queued = std::mem::take(&mut x.relay.queued);
        x.relay.pending.extend(queued.iter().copied());
        let mut requests = Map::new();
        // The server's own keys where they are unique in this round (one server's
        // input_required), else the gateway's: the state names the call and the round,
        // so a key binds an answer to one request of this call only.
        let own_key = |r: &Relayed| {
            r.server_key
                .as_ref()
                .filter(|k| !k.is_empty() && k.len() <= MAX_INPUT_KEY_BYTES)
                .filter(|k| !k.starts_with(ID_PREFIX))
                .cloned()
        };
        let proposed: Vec<Option<String>> = queued
            .iter()
            .map(|rk| self.relay.relayed.get(rk).and_then(own_key))
            .collect();
        let clashing = |k: &String| proposed.iter().flatten().filter(|p| *p == k).count() > 1;
        for (rk, own) in queued.iter().zip(proposed.iter()) {
            if let Some(r) = self.relay.relayed.get_mut(rk) {
                let agent_key = match own {
                    Some(k) if !clashing(k) => k.clone(),
                    _ => format!("{ID_PREFIX}{rk}"),
                };
                let mut req = json!({"method": r.method});
                if let Some(p) = &r.params {
                    req["params"] = p.clone();
                }
                requests.insert(agent_key.clone(), req);
                r.agent_key = Some(agent_key);
            }
        }
        let claims = Claims {
            kind: "input".into(),
            principal: x.from.principal.clone(),
            tool: x.display_name(),
            args: x.relay.arrived_args.clone(),
            policy: String::new(),
            rule: String::new(),
            expires_ms,
            call: key,
            round: x.relay.round,
            nonce,
        };
        let (stream, id, ledger_id, round) =
            (x.from.stream, x.from.id.clone(), x.ledger_id, x.relay.round);
        let state = self.relay.key.as_ref().map(|k| k.seal(&claims));
        let mut result = json!({"resultType": "input_required", "inputRequests": requests});
        if let Some(state) = state {
            result["requestState"] = Value::String(state);
        }
        self.relay_event(
            ledger_id,
            json!({"direction": "to_client", "method": "input_required", "round": round,
                   "requests": queued.len(), "decision": "relayed"}),
        );
        let bytes = jsonrpc::result_response(&id, &result.to_string());
        self.reply(conn, stream, &id, None, bytes);
    }

    /// A JSON-RPC response from an agent: the answer to a request the gateway relayed.
    pub(super) fn on_agent_response(
        &mut self,
        conn: ConnRef,
        id: &str,
        result: Option<&str>,
        error: Option<&str>,
    ) {
        let Some(rk) = serde_json::from_str::<String>(id)
            .ok()
            .as_deref()
            .and_then(key_of)
        else {
            return;
        };
        if self.on_client_approval(conn, rk, result) {
            return;
        }
        if !self.relay.relayed.contains_key(&rk) {
            // An answer to a request that is over (its call ended) or never was.
            self.relay.answers_dropped += 1;
            return;
        }
        let owned = self.relay.relayed.get(&rk).is_some_and(|r| {
            self.calls
                .get(r.call)
                .and_then(|c| c.exchange())
                .is_some_and(|x| x.from.conn == Some(conn) && !x.relay.modern)
        });
        if !owned {
            return;
        }
        let result = result.and_then(|r| serde_json::from_str::<Value>(r).ok());
        let error = error.and_then(|e| serde_json::from_str::<Value>(e).ok());
        self.deliver_answer(rk, result, error);
    }

    /// The key a modern agent answers relayed request `rk` under.
    pub(super) fn input_key(&self, rk: u64) -> String {
        self.relay
            .relayed
            .get(&rk)
            .and_then(|r| r.agent_key.clone())
            .unwrap_or_else(|| format!("{ID_PREFIX}{rk}"))
    }

    /// Forget relayed request `rk` (it never left).
    pub(super) fn forget_relayed(&mut self, rk: u64) {
        self.relay.relayed.remove(&rk);
    }

    /// Agents' answers to relayed requests that were over (their call had ended) or never
    /// were: dropped, never forwarded.
    pub fn relay_answers_dropped(&self) -> u64 {
        self.relay.answers_dropped
    }

    /// A modern client's input response to relayed request `rk`.
    pub(super) fn deliver_input(&mut self, rk: u64, result: Value) {
        self.deliver_answer(rk, Some(result), None);
    }

    /// A modern client retried without a response to relayed request `rk`.
    pub(super) fn deliver_input_refused(&mut self, rk: u64) {
        let error = json!({"code": jsonrpc::INTERNAL_ERROR,
                           "message": "the client retried without answering this request"});
        self.deliver_answer(rk, None, Some(error));
    }

    /// Server requests that arrived while a modern client was away go out now, with the
    /// retry's answer.
    pub(super) fn issue_queued_input(&mut self, key: u64) {
        let ready = self
            .calls
            .get(key)
            .and_then(|c| c.exchange())
            .is_some_and(|x| !x.relay.queued.is_empty() && x.from.conn.is_some());
        if ready {
            self.issue_input_required(key);
        }
    }

    /// The agent answered relayed request `rk`: judge, record, send to the worker.
    fn deliver_answer(&mut self, rk: u64, result: Option<Value>, error: Option<Value>) {
        let Some(r) = self.relay.relayed.remove(&rk) else {
            return;
        };
        let Some(call) = self.calls.get_mut(r.call) else {
            return;
        };
        let worker = call.worker;
        let Some(x) = call.exchange_mut() else {
            return;
        };
        x.relay.pending.retain(|k| *k != rk);
        let answer = match (result, error) {
            (Some(result), _) => {
                let decision = self.judge_answer(r.call, &r.method, &result);
                match decision {
                    Some(rule) => RequestAnswer::error(
                        r.worker_request,
                        jsonrpc::POLICY_BLOCKED,
                        format!("the client's answer to {} was blocked by policy", r.method),
                        Some(json!({"rule": rule})),
                    ),
                    None => RequestAnswer::result(r.worker_request, result),
                }
            }
            (None, Some(e)) => RequestAnswer::error(
                r.worker_request,
                e.get("code")
                    .and_then(Value::as_i64)
                    .unwrap_or(jsonrpc::INTERNAL_ERROR),
                e.get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("the client refused")
                    .chars()
                    .take(1024)
                    .collect::<String>(),
                None,
            ),
            (None, None) => RequestAnswer::error(
                r.worker_request,
                jsonrpc::INTERNAL_ERROR,
                "the client sent no answer",
                None,
            ),
        };
        let ledger_id = self
            .calls
            .get(r.call)
            .and_then(|c| c.exchange())
            .map_or(0, |x| x.ledger_id);
        let outcome = if answer.error.is_some() {
            "error"
        } else {
            "answered"
        };
        self.relay_event(
            ledger_id,
            json!({"direction": "to_server", "method": r.method, "relay_id": format!("{ID_PREFIX}{rk}"),
                   "decision": outcome, "params": preview(&answer.result)}),
        );
        self.answer_worker(worker, r.call, &answer);
    }

    /// The request phase over an agent's answer to a relayed request: the rule that blocks
    /// it, if any. Only rules that match it count (the default decides requests the agent
    /// makes, not its answers).
    fn judge_answer(&mut self, call: u64, method: &str, answer: &Value) -> Option<String> {
        let x = self.calls.get(call)?.exchange()?;
        let subject = Subject {
            method,
            server: Some(&x.target.server),
            tool: x.target.tool.as_deref(),
            resource: x.target.resource.as_deref(),
            principal: &x.from.principal,
            transport: x.from.transport,
            process: &x.from.process,
            arguments: Some(answer),
        };
        let decision = self.policy.decide(Phase::Request, &subject, None);
        match (decision.verdict, decision.rule) {
            (Verdict::Allow, _) | (_, None) => None,
            (_, Some(rule)) => {
                self.observed.decision(Some(&rule), Verdict::Block);
                Some(rule.to_string())
            }
        }
    }

    /// Relayed requests of calls whose agent left: the worker hears they go unanswered.
    pub(super) fn fail_orphaned_relays(&mut self) {
        let orphaned: Vec<u64> = self
            .relay
            .relayed
            .iter()
            .filter(|(_, r)| {
                self.calls
                    .get(r.call)
                    .and_then(|c| c.exchange())
                    .is_none_or(|x| x.from.conn.is_none() && !x.relay.modern)
            })
            .map(|(k, _)| *k)
            .collect();
        for rk in orphaned {
            let error =
                json!({"code": jsonrpc::INTERNAL_ERROR, "message": "the client disconnected"});
            self.deliver_answer(rk, None, Some(error));
        }
    }

    /// A call ended: forget its relayed requests, and note what was relayed. A request
    /// still waiting for the agent is void now (the server has answered its call without
    /// it): the ledger says so, a legacy agent is told with `notifications/cancelled`, and
    /// its answer, should it come, reaches nobody (see [`Core::relay_answers_dropped`]).
    pub(super) fn end_relay(&mut self, x: &Exchange) {
        let r = &x.relay;
        for rk in r.pending.iter().chain(&r.queued) {
            let Some(relayed) = self.relay.relayed.remove(rk) else {
                continue;
            };
            let agent_id = format!("{ID_PREFIX}{rk}");
            self.relay_event(
                x.ledger_id,
                json!({"direction": "to_client", "method": relayed.method,
                       "relay_id": agent_id, "decision": "forgotten",
                       "reason": "the call ended before the client answered"}),
            );
            let sent = !x.relay.modern && r.pending.contains(rk);
            if let (true, Some(conn)) = (sent, x.from.conn) {
                let msg = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                 "params": {"requestId": agent_id,
                                            "reason": "the server answered its call without it"}});
                self.actions.push(Action::Relay {
                    conn,
                    stream: x.from.stream,
                    call: relayed.call,
                    bytes: msg.to_string().into_bytes(),
                    request_id: None,
                });
            }
        }
        if let Some(rk) = r.client_ask {
            self.client_asks.asked.remove(&rk);
        }
        if r.relayed + r.dropped + r.blocked + r.requests > 0 {
            self.records.stage_event(
                "relay_summary",
                &json!({"call_id": x.ledger_id, "relayed": r.relayed, "dropped": r.dropped,
                        "blocked": r.blocked, "requests": r.requests}),
            );
        }
    }
}

/// Why a server's request is not relayed: the error the server gets, and the ledger's word.
struct Refused {
    code: i64,
    message: String,
    data: Option<Value>,
    decision: &'static str,
    rule: Option<String>,
}

impl Refused {
    fn new(code: i64, message: String, decision: &'static str) -> Refused {
        Refused {
            code,
            message,
            data: None,
            decision,
            rule: None,
        }
    }
}
