//! The one pipeline every request to a server crosses, written once:
//! parse → route → request phase → record → forward (as judged) → response phase (over the
//! whole answer: results, errors, every content block) → record → answer (serialized from
//! the judged value). Refusals at any step end the row and answer the agent the same way.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use std::rc::Rc;
use std::time::Instant;

use super::calls::{Call, Purpose, Stage};
use super::dispatch::RequestCtx;
use super::exchange::{Exchange, Requester, Routed, Target};
use super::fair_lanes::{self, Admission};
use super::{AskRoute, Core, Recorder};
use crate::aggregator::missing_capability;
use crate::ledger::{CallEnd, CallStart, decision};
use crate::mcp::catalog::{Entry, Kind, split_namespaced};
use crate::mcp::compact_text::compact;
use crate::mcp::jsonrpc;
use crate::mcp::tool_error::{ToolErrorCode, refusal, tool_error_result};
use crate::policy::{Decision, Phase, Subject, Verdict};
use crate::workers::rpc;

/// What the agent gets: a result object, or a JSON-RPC error held as
/// `{"error": {code, message, data?}}` (the value the response phase judges).
#[derive(Debug)]
pub(super) struct Answer {
    value: Value,
    is_error: bool,
}

impl Answer {
    pub fn result(value: Value) -> Answer {
        Answer {
            value,
            is_error: false,
        }
    }

    pub fn error(code: i64, message: &str, data: Option<Value>) -> Answer {
        let mut error = json!({"code": code, "message": message});
        if let Some(data) = data {
            error["data"] = data;
        }
        Answer {
            value: json!({ "error": error }),
            is_error: true,
        }
    }

    /// The error column: a JSON-RPC error's message, or a tool result's `isError` text.
    fn error_text(&self) -> Option<String> {
        if self.is_error {
            let message = self.value["error"]["message"].as_str().unwrap_or("error");
            return Some(message.to_owned());
        }
        tool_error_text(&self.value)
    }

    /// The JSON text the ledger keeps, and the message the agent gets.
    fn encode(&self, id: &str) -> (String, Vec<u8>) {
        if self.is_error {
            let text = compact(&self.value["error"]);
            let mut bytes = Vec::with_capacity(40 + id.len() + text.len());
            bytes.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
            bytes.extend_from_slice(id.as_bytes());
            bytes.extend_from_slice(b",\"error\":");
            bytes.extend_from_slice(text.as_bytes());
            bytes.push(b'}');
            (text, bytes)
        } else {
            let text = compact(&self.value);
            let bytes = jsonrpc::result_response(id, &text);
            (text, bytes)
        }
    }
}

/// How a call that never got a usable answer ends.
pub(super) struct Refusal<'a> {
    pub code: ToolErrorCode,
    pub message: &'a str,
    pub rule: Option<&'a str>,
    /// `denied` (policy, a human) or `error`.
    pub decision: &'static str,
}

impl<'a> Refusal<'a> {
    /// A refusal that is toolwall's own error (no rule decided it).
    pub fn error(code: ToolErrorCode, message: &'a str) -> Refusal<'a> {
        Refusal {
            code,
            message,
            rule: None,
            decision: decision::ERROR,
        }
    }
}

/// The params fields read before the whole params are parsed: the raw arguments text the
/// ledger keeps as it arrived.
#[derive(Deserialize)]
struct RawArguments<'a> {
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
}

impl<R: Recorder> Core<R> {
    /// A request for a server: one row, whatever happens to it.
    pub(super) fn begin_exchange(
        &mut self,
        ctx: &RequestCtx,
        routed: Routed,
        params: Option<&RawValue>,
    ) {
        // A retry carrying a requestState resumes the call it names (or is refused).
        if let Some(p) = params.filter(|p| p.get().contains("\"requestState\""))
            && let Ok(p) = serde_json::from_str::<Value>(p.get())
            && let Some(state) = super::input_retry::request_state(&p).cloned()
        {
            self.resume_with_state(ctx, routed, &p, &state);
            return;
        }
        self.counters.calls_total += 1;
        let ledger_id = self.records.new_call_id();
        let from = Requester {
            conn: Some(ctx.conn),
            stream: ctx.stream,
            id: ctx.id.to_owned(),
            principal: ctx.peer.principal.clone(),
            process: ctx.process.to_owned(),
            transport: ctx.peer.transport,
        };
        let params_text = params.map(RawValue::get).unwrap_or("{}");
        // What arrived, for the ledger: the arguments (or the whole params) as sent.
        // When `arguments` cannot be picked out alone (a duplicate key), the row keeps the
        // whole params as they arrived.
        let raw: &str = match routed {
            _ if !routed.has_arguments() => params_text,
            _ => match serde_json::from_str::<RawArguments>(params_text) {
                Ok(p) => p.arguments.map(RawValue::get).unwrap_or(""),
                Err(_) => params_text,
            },
        };
        let parsed = serde_json::from_str::<Value>(params_text);
        let target_name = parsed
            .as_ref()
            .ok()
            .and_then(|p| super::forwarded::target_in(routed, p))
            .map(str::to_owned);
        let by_uri = parsed
            .as_ref()
            .is_ok_and(|p| super::forwarded::by_uri(routed, p));
        let names_target = target_name.is_some();
        let mut x = Box::new(Exchange {
            routed,
            from,
            target: Target {
                worker: 0,
                server: String::new(),
                upstream: String::new(),
                name: target_name.unwrap_or_default(),
                tool: None,
                resource: None,
            },
            ledger_id,
            params: Value::Null,
            request_decision: Decision {
                verdict: Verdict::Allow,
                rule: None,
                reason: None,
                matched: Vec::new(),
                ask_via: Default::default(),
            },
            response_decision: None,
            arrived_differs: false,
            rewritten: false,
            judged: None,
            forwarded: None,
            approved: None,
            relay: Default::default(),
            queued_bytes: 0,
            arrived_bytes: ctx.bytes_received,
        });
        // Malformed params: still a row, then a JSON-RPC error.
        let fault = match (&parsed, names_target) {
            // Well-formed JSON a value cannot hold (a number beyond f64, say): say so.
            (Err(e), _) => Some(format!("invalid params: {e}")),
            (Ok(Value::Object(_)), false) => Some(super::forwarded::missing_target(routed)),
            (Ok(p), true) => match p.get("arguments") {
                Some(a) if !a.is_object() && routed.has_arguments() => {
                    Some("invalid params: arguments must be an object".to_owned())
                }
                _ => None,
            },
            (Ok(_), false) => Some("invalid params: params must be an object".to_owned()),
        };
        if let Some(message) = fault {
            self.start_row(&x, ctx.bytes_received, raw, decision::ERROR);
            self.protocol_refusal(x, self.now, jsonrpc::INVALID_PARAMS, &message);
            return;
        }
        let mut params = parsed.unwrap_or(Value::Null);
        if routed.has_arguments() && params.get("arguments").is_none() {
            params["arguments"] = json!({});
        }
        x.relay = self.call_relay(ctx.conn, routed, &params);
        x.params = params;
        let name = x.target.name.clone();
        // Where it goes; a tool hidden by a changed pin is refused before anything else.
        // Resources go by the ownership rule (owned URIs, templates, contested URIs
        // served by nobody); the reason a URI is not served goes into the error.
        // A completion of a resource template goes to the server that lists the template.
        let template = (routed == Routed::Complete && by_uri)
            .then(|| self.catalog.get(Kind::Templates, &name).map(Entry::route))
            .flatten();
        let (entry, unserved) = match template {
            Some(t) => (Some(t), None),
            None if by_uri => match self.resource_entry(&name) {
                Ok(e) => (e, None),
                Err(why) => (None, Some(why)),
            },
            None => (
                self.catalog.get(routed.kind(), &name).map(Entry::route),
                None,
            ),
        };
        let unknown = entry.is_none();
        // Policy, pins and the ledger know a tool or prompt by `server__name`, whatever
        // agents call it (`prefix = false`: see mcp::catalog::names). The route's strings
        // are moved into the target, not copied.
        let name = match entry {
            Some(e) => {
                x.target.worker = e.worker;
                x.target.server = e.server;
                if !by_uri {
                    x.target.name.clone_from(&e.upstream);
                }
                x.target.upstream = e.upstream;
                if routed == Routed::CallTool
                    && !e.declares_input
                    && let Some(args) = x.arguments_mut()
                {
                    // `{"input": {...}}` from clients built that way means the inner
                    // object: policy and the tool see it unwrapped, however deep the
                    // wrapping (the row keeps what arrived). Unwrapping to the end here
                    // means nothing downstream unwraps what policy did not see.
                    loop {
                        let inner = crate::workspace::args::unwrap_input(args);
                        if std::ptr::eq(inner, &*args) {
                            break;
                        }
                        *args = inner.clone();
                    }
                }
                if by_uri { name } else { e.name }
            }
            None => {
                if let Some((server, bare)) = split_namespaced(&name) {
                    x.target.server = server.to_owned();
                    if !by_uri {
                        x.target.name = bare.to_owned();
                    }
                }
                name
            }
        };
        match routed {
            Routed::CallTool => x.target.tool = Some(name.clone()),
            _ if by_uri => x.target.resource = Some(name.clone()),
            _ => {}
        }
        // Spaces an agent put between tokens are no difference (mcp::compact_text).
        let judged = x.judged_text();
        x.arrived_differs = !crate::mcp::compact_text::same_but_whitespace(raw, &judged);
        x.judged = Some(judged);
        if routed == Routed::CallTool
            && let Some(message) = self.upstreams.as_ref().and_then(|u| u.pin_refusal(&name))
        {
            x.request_decision.reason = Some("pin_changed".into());
            self.start_row(&x, ctx.bytes_received, raw, decision::DENIED);
            let refusal = Refusal {
                code: ToolErrorCode::PinChanged,
                message: &message,
                rule: None,
                decision: decision::DENIED,
            };
            self.refuse(x, self.now, &refusal);
            return;
        }
        // The request phase, over the whole arguments.
        let decision = self.judge_request(&x);
        let row_decision = match decision.verdict {
            Verdict::Allow => decision::ALLOWED,
            Verdict::Ask => decision::PENDING,
            Verdict::Block => decision::DENIED,
        };
        x.request_decision = decision;
        self.start_row(
            &x,
            ctx.bytes_received,
            raw,
            if unknown && row_decision != decision::DENIED {
                decision::ERROR
            } else {
                row_decision
            },
        );
        self.stage_rules(x.ledger_id, "request", &x.request_decision);
        let verdict = x.request_decision.verdict;
        // A client's approval for an ask this policy no longer makes is refused.
        if verdict != Verdict::Ask
            && let Some(message) = self.stale_client_approval()
            && verdict == Verdict::Allow
            && !unknown
        {
            let rule = x.request_decision.rule.clone();
            let refusal = Refusal {
                code: ToolErrorCode::AskDenied,
                message: &message,
                rule: rule.as_deref(),
                decision: decision::DENIED,
            };
            self.refuse(x, self.now, &refusal);
            return;
        }
        match verdict {
            Verdict::Block => self.refuse_by_policy(x, self.now, Phase::Request),
            _ if unknown => {
                let (code, message) = match routed {
                    Routed::CallTool => (jsonrpc::INVALID_PARAMS, format!("unknown tool: {name}")),
                    Routed::ReadResource | Routed::Subscribe | Routed::Unsubscribe => {
                        match &unserved {
                            Some(why) => (-32002, format!("resource not served: {why}")),
                            None => (-32002, format!("resource not found: {name}")),
                        }
                    }
                    Routed::GetPrompt => {
                        (jsonrpc::INVALID_PARAMS, format!("unknown prompt: {name}"))
                    }
                    Routed::Complete if by_uri => (
                        jsonrpc::INVALID_PARAMS,
                        format!("unknown resource template: {name}"),
                    ),
                    Routed::Complete => {
                        (jsonrpc::INVALID_PARAMS, format!("unknown prompt: {name}"))
                    }
                };
                self.protocol_refusal(x, self.now, code, &message);
            }
            Verdict::Ask => self.hold(x),
            Verdict::Allow if routed == Routed::Subscribe => {
                let refusal = x
                    .from
                    .conn
                    .and_then(|c| self.subscription_refusal(c, &name));
                match refusal {
                    Some(why) => self.protocol_refusal(x, self.now, jsonrpc::INVALID_REQUEST, &why),
                    None => self.forward(x, self.now),
                }
            }
            // The server keeps one subscription for all sessions: while another holds the
            // URI, this session's unsubscribe is answered here.
            Verdict::Allow
                if routed == Routed::Unsubscribe
                    && self.subscribed_elsewhere(x.from.conn, &name, &x.target.server) =>
            {
                self.respond(x, self.now, Answer::result(json!({})));
            }
            Verdict::Allow => {
                x.rewritten = self.rewrite_arguments(&mut x);
                if x.rewritten && !self.rewritten_still_allowed(&mut x) {
                    self.refuse_by_policy(x, self.now, Phase::Request);
                    return;
                }
                self.forward(x, self.now);
            }
        }
    }

    /// The request-phase decision for `x` under the current policy.
    pub(super) fn judge_request(&mut self, x: &Exchange) -> Decision {
        let subject = Subject {
            method: x.routed.method(),
            server: (!x.target.server.is_empty()).then_some(x.target.server.as_str()),
            tool: x.target.tool.as_deref(),
            resource: x.target.resource.as_deref(),
            principal: &x.from.principal,
            transport: x.from.transport,
            process: &x.from.process,
            arguments: x.arguments(),
        };
        let decision = self.policy.decide(Phase::Request, &subject, None);
        self.observed
            .decision(decision.rule.as_deref(), decision.verdict);
        decision
    }

    /// Apply the request decision's rewrite rules; true if any changed the arguments.
    pub(super) fn rewrite_arguments(&mut self, x: &mut Exchange) -> bool {
        if !x.request_decision.may_rewrite(Phase::Request) {
            return false;
        }
        let policy = Rc::clone(&self.policy);
        let decision = x.request_decision.clone();
        // The judged text stays valid unless a rewrite changed something: a rule that
        // matched without changing the arguments must not cost a second encoding.
        let judged = x.judged.take();
        let rewritten = x
            .arguments_mut()
            .is_some_and(|args| !policy.rewrite_arguments(&decision, args).is_empty());
        if !rewritten {
            x.judged = judged;
        }
        rewritten
    }

    /// Rewritten arguments are what the server would get, so they are judged too: a
    /// rewrite must not produce what a block rule refuses. On a refusal the deciding
    /// decision becomes the second one (its rules are recorded as `request_rewritten`).
    pub(super) fn rewritten_still_allowed(&mut self, x: &mut Exchange) -> bool {
        let second = self.judge_request(x);
        self.stage_rules(x.ledger_id, "request_rewritten", &second);
        if second.verdict == Verdict::Allow {
            return true;
        }
        x.request_decision = second;
        false
    }

    fn start_row(&mut self, x: &Exchange, bytes_received: usize, raw: &str, decision: &str) {
        let ts_ms = self.wall_ms();
        let d = &x.request_decision;
        self.records.stage_call(&CallStart {
            id: x.ledger_id,
            ts_ms,
            transport: x.from.transport.as_str(),
            principal: &x.from.principal,
            process_name: &x.from.process,
            server_name: &x.target.server,
            tool_name: &x.target.name,
            method: x.routed.method(),
            request_id: &x.from.id,
            decision,
            policy_rule: d.rule.as_deref(),
            policy_reason: d.reason.as_deref(),
            bytes_received,
            arguments: raw.as_bytes(),
        });
    }

    fn stage_rules(&mut self, call_id: i64, phase: &str, d: &Decision) {
        for (seq, m) in (0u32..).zip(&d.matched) {
            self.records.stage_rule_event(
                call_id,
                seq,
                &m.id,
                action_str(m.action),
                phase,
                layer_str(m.layer),
            );
        }
    }

    /// Hold a call for a human (`ask`), or refuse it where no human can answer safely.
    fn hold(&mut self, x: Box<Exchange>) {
        // A client's approval carried by this request, or an ask answered at the client.
        let Some(x) = self.ask_at_client_or_apply(x) else {
            return;
        };
        let at_client = self.client_can_be_asked(&x);
        if self.ask_route == AskRoute::Refuse && !at_client {
            let message = "an ask rule holds this call, but no operator can answer it here: the \
                           admin socket is reachable by the agent's own uid (toolwall stdio), so \
                           the call is refused";
            let rule = x.request_decision.rule.clone();
            let refusal = Refusal {
                code: ToolErrorCode::AskDenied,
                message,
                rule: rule.as_deref(),
                decision: decision::DENIED,
            };
            self.refuse(x, self.now, &refusal);
            return;
        }
        let key = self.calls.new_key();
        let deadline = self.now + self.policy.ask_timeout();
        let via = if at_client { "client" } else { "operator" };
        self.event(
            "ask_pending",
            json!({"approval_id": key, "call_id": x.ledger_id, "method": x.routed.method(),
                   "tool": x.display_name(), "principal": x.from.principal, "via": via}),
        );
        self.calls.insert(
            key,
            Call {
                worker: x.target.worker,
                purpose: Purpose::Exchange(x),
                stage: Stage::AwaitingApproval,
                started: self.now,
                deadline,
                timeout_key: "policy.ask_timeout_secs",
                lane: None,
                unsent: None,
            },
        );
        if at_client {
            self.ask_client(key);
        }
    }

    /// An allowed call goes to its worker (released once the commit holds its row).
    pub(super) fn forward(&mut self, mut x: Box<Exchange>, started: Instant) {
        // `ws` calls are routed among the caller's own workspaces, or answered here.
        if x.target.server == crate::workspace::tools::SERVER
            && let Some((directory, ws_workers)) = &self.workspaces
        {
            let workers = &self.workers;
            let state = |id: &str| match ws_workers.get(id) {
                Some(w) if workers[*w].ready => crate::workspace::WorkerState::Online,
                _ => crate::workspace::WorkerState::Offline,
            };
            let arguments = x.arguments().cloned().unwrap_or_else(|| json!({}));
            match crate::workspace::route_call(
                directory,
                &x.from.principal,
                &x.target.upstream,
                &arguments,
                state,
            ) {
                crate::workspace::WsRoute::Answer(result) => {
                    self.respond(x, started, Answer::result(result));
                    return;
                }
                crate::workspace::WsRoute::Forward {
                    workspace_id,
                    arguments,
                } => {
                    if let Some(&w) = ws_workers.get(&workspace_id) {
                        x.target.worker = w;
                    }
                    if let Some(args) = x.arguments_mut() {
                        *args = arguments;
                    }
                }
            }
        }
        if !self.workers[x.target.worker].ready {
            let message = format!(
                "worker {} is not available (restarting)",
                self.workers[x.target.worker].name
            );
            self.refuse(
                x,
                started,
                &Refusal::error(ToolErrorCode::WorkerUnavailable, &message),
            );
            return;
        }
        // Each pool is shared fairly between principals (`fair_lanes.rs`).
        let lane = self.lane_of_call(x.target.worker, &x.target.server, &x.target.upstream);
        let mut stage = Stage::AtWorker;
        if let Some((key, bounds, keys)) = &lane {
            let admission = self.calls.admission(key, &x.from.principal, *bounds);
            match admission {
                Admission::Run => {}
                Admission::Wait => stage = Stage::Queued,
                Admission::OverShare { .. } | Admission::Full => {
                    let who = self.pool_name(key);
                    let message =
                        fair_lanes::refusal(&admission, &who, &x.from.principal, *bounds, keys);
                    self.refuse(x, started, &Refusal::error(ToolErrorCode::Busy, &message));
                    return;
                }
            }
        }
        // Encoded once, and only for a call that goes on: the worker's request, the bound
        // below and the row's copy of what went upstream all use this text.
        let args = x.forward_text();
        if x.arrived_differs || x.rewritten {
            x.forwarded = Some(match x.routed {
                Routed::CallTool => args.clone(),
                _ => x.judged_text(),
            });
        }
        // Bytes queued toward upstream servers are bounded (`servers.max_queued_bytes`).
        if self.is_aggregator(x.target.worker)
            && let Err(message) = self.take_queued_bytes(&mut x, args.len())
        {
            self.refuse(x, started, &Refusal::error(ToolErrorCode::Busy, &message));
            return;
        }
        let key = self.calls.new_key();
        let worker = x.target.worker;
        let timeout_key = x.routed.timeout_key();
        let deadline = self.now + self.timeout(timeout_key);
        let upstream = self.is_aggregator(worker).then(|| rpc::UpstreamCall {
            server: x.target.server.clone(),
            meta: Box::new(self.call_meta(key, &x, deadline)),
        });
        let msg = rpc::Message::Request {
            id: key,
            op: x.worker_op(args, upstream),
        };
        // A waiting call keeps its request until its turn (`start_waiting_calls`).
        let unsent = if stage == Stage::Queued {
            Some(msg)
        } else {
            self.actions.push(super::Action::ToWorker {
                worker,
                call: Some(key),
                msg,
            });
            None
        };
        self.calls.insert(
            key,
            Call {
                purpose: Purpose::Exchange(x),
                worker,
                stage,
                started,
                deadline,
                timeout_key,
                lane: lane.map(|(key, _, _)| key),
                unsent,
            },
        );
    }

    /// The worker answered an exchange: build what the agent would get, then judge it.
    pub(super) fn complete_exchange(
        &mut self,
        mut x: Box<Exchange>,
        started: Instant,
        ok: Option<String>,
        error: Option<rpc::RpcError>,
        facts: Option<String>,
    ) {
        if let Some(facts) = facts {
            // What the worker dropped of the call's notifications counts in its row.
            #[derive(serde::Deserialize)]
            struct Dropped {
                #[serde(default)]
                relay_dropped: u64,
            }
            if let Ok(d) = serde_json::from_str::<Dropped>(&facts)
                && d.relay_dropped > 0
            {
                let n = u32::try_from(d.relay_dropped).unwrap_or(u32::MAX);
                x.relay.dropped = x.relay.dropped.saturating_add(n);
                self.counters.relay_dropped =
                    self.counters.relay_dropped.saturating_add(d.relay_dropped);
            }
            self.event(
                "tool_facts",
                json!({"call_id": x.ledger_id, "facts": facts}),
            );
        }
        let error = match error {
            Some(e) if e.kind == missing_capability::KIND => {
                match missing_capability::for_agent(&e.message, x.relay.modern) {
                    Ok((message, data)) => {
                        let answer = Answer::error(missing_capability::CODE, &message, Some(data));
                        self.respond(x, started, answer);
                        return;
                    }
                    Err(e) => Some(e),
                }
            }
            other => other,
        };
        // The length and the node count decide before any tree is built: a worker's
        // answer beyond either bound is refused, never parsed (see `answer_bound.rs`).
        if let Some(text) = ok.as_deref()
            && let Some(why) = self.answer_beyond_bounds(text)
        {
            // The row keeps what came (as bytes, within ledger.body_cap_bytes).
            let answer = refusal_answer(x.routed, ToolErrorCode::TooLarge, &why, None);
            self.end(x, started, decision::ERROR, &answer, Some(&why), Some(text));
            return;
        }
        let answer =
            match (ok, error) {
                (Some(text), _) => match serde_json::from_str::<Value>(&text) {
                    Ok(v @ Value::Object(_)) => Answer::result(v),
                    _ => {
                        self.refuse(
                            x,
                            started,
                            &Refusal::error(
                                ToolErrorCode::Internal,
                                "the server's result is not a JSON object",
                            ),
                        );
                        return;
                    }
                },
                (None, Some(e)) if x.routed.refuses_as_result() => Answer::result(
                    tool_error_result(&e.kind, jsonrpc::INTERNAL_ERROR, &e.message, None),
                ),
                (None, Some(e)) => Answer::error(
                    jsonrpc::INTERNAL_ERROR,
                    &format!("{}: {}", e.kind, e.message),
                    None,
                ),
                (None, None) => {
                    self.refuse(
                        x,
                        started,
                        &Refusal::error(ToolErrorCode::Internal, "the worker sent an empty answer"),
                    );
                    return;
                }
            };
        self.respond(x, started, answer);
    }

    /// Why the JSON text of a worker's answer may not be parsed, if it may not.
    fn answer_beyond_bounds(&self, text: &str) -> Option<String> {
        let max = self.limits.max_answer_bytes;
        if text.len() > max {
            return Some(format!(
                "the answer is {} bytes, more than gateway.max_answer_bytes ({max})",
                text.len()
            ));
        }
        let nodes = self.limits.max_json_nodes;
        crate::aggregator::json_nodes::within(text.as_bytes(), nodes)
            .err()
            .map(|_| {
                crate::aggregator::json_nodes::too_many(
                    "the answer",
                    nodes,
                    "gateway.max_json_nodes",
                )
            })
    }

    /// The response phase over the whole answer (result or error, every content block),
    /// then the row's end and the answer, serialized from the judged value.
    pub(super) fn respond(&mut self, mut x: Box<Exchange>, started: Instant, mut answer: Answer) {
        let policy = Rc::clone(&self.policy);
        let method = x.routed.method();
        let mut original: Option<String> = None;
        if policy.has_response_rules(method, x.target.tool.as_deref()) {
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
            let decision = policy.decide(Phase::Response, &subject, Some(&answer.value));
            self.stage_rules(x.ledger_id, "response", &decision);
            if decision.verdict != Verdict::Allow {
                // `ask` on an answer cannot hold the agent's call for a human; it blocks.
                self.observed
                    .decision(decision.rule.as_deref(), Verdict::Block);
                let text = compact(&answer.value);
                x.response_decision = Some(decision);
                self.refuse_by_policy_with(x, started, Phase::Response, Some(&text));
                return;
            }
            // The original text is kept only when a rewrite may change the answer: the
            // common path serializes the answer once, in `end`.
            let before = decision
                .may_rewrite(Phase::Response)
                .then(|| compact(&answer.value));
            if let Some(before) = before
                && !policy
                    .rewrite_result(&decision, &mut answer.value)
                    .is_empty()
            {
                original = Some(before);
                // The rewritten answer is what the agent would get: judged again, so a
                // rewrite cannot assemble what a block rule refuses.
                let second = policy.decide(Phase::Response, &subject, Some(&answer.value));
                self.stage_rules(x.ledger_id, "response_rewritten", &second);
                if second.verdict != Verdict::Allow {
                    self.observed
                        .decision(second.rule.as_deref(), Verdict::Block);
                    x.response_decision = Some(second);
                    self.refuse_by_policy_with(x, started, Phase::Response, original.as_deref());
                    return;
                }
            }
        }
        let error = answer.error_text();
        let decision = if error.is_some() {
            decision::ERROR
        } else {
            decision::ALLOWED
        };
        if error.is_none() && matches!(x.routed, Routed::Subscribe | Routed::Unsubscribe) {
            self.subscription_answered(&x);
        }
        self.end(
            x,
            started,
            decision,
            &answer,
            error.as_deref(),
            original.as_deref(),
        );
    }

    fn refuse_by_policy(&mut self, x: Box<Exchange>, started: Instant, phase: Phase) {
        self.refuse_by_policy_with(x, started, phase, None);
    }

    fn refuse_by_policy_with(
        &mut self,
        x: Box<Exchange>,
        started: Instant,
        phase: Phase,
        original: Option<&str>,
    ) {
        let d = match phase {
            Phase::Request => &x.request_decision,
            Phase::Response => x.response_decision.as_ref().unwrap_or(&x.request_decision),
        };
        let what = match phase {
            Phase::Request => "blocked by policy",
            Phase::Response => "result blocked by policy",
        };
        let message = match &d.reason {
            Some(r) => format!("{what}: {r}"),
            None => what.to_owned(),
        };
        let rule = d.rule.clone();
        let answer = refusal_answer(
            x.routed,
            ToolErrorCode::PolicyBlocked,
            &message,
            rule.as_deref(),
        );
        self.end(
            x,
            started,
            decision::DENIED,
            &answer,
            Some(&message),
            original,
        );
    }

    /// End a call with a refusal (policy, a human, a timeout, a worker gone, ...).
    pub(super) fn refuse(&mut self, x: Box<Exchange>, started: Instant, r: &Refusal) {
        let answer = refusal_answer(x.routed, r.code, r.message, r.rule);
        self.end(x, started, r.decision, &answer, Some(r.message), None);
    }

    /// A protocol fault of a routed request (bad params, unknown target): a JSON-RPC error
    /// whatever the method, and the row ends as `error`.
    fn protocol_refusal(&mut self, x: Box<Exchange>, started: Instant, code: i64, message: &str) {
        let answer = Answer::error(code, message, None);
        self.end(x, started, decision::ERROR, &answer, Some(message), None);
    }

    /// The one place a call ends: its row's outcome is staged, then its answer queued (the
    /// commit barrier releases both together).
    fn end(
        &mut self,
        x: Box<Exchange>,
        started: Instant,
        decision: &'static str,
        answer: &Answer,
        error: Option<&str>,
        original: Option<&str>,
    ) {
        self.end_relay(&x);
        self.give_back_queued_bytes(&x);
        let (mut text, mut bytes) = answer.encode(&x.from.id);
        // An answer no door could carry whole is refused, and the row says so, rather than
        // cut or dropped by the door (which would leave the agent waiting and the row
        // saying it was answered). The row keeps what the server sent.
        let (mut too_large, mut server_text) = (None, None);
        if bytes.len() > self.limits.max_answer_bytes {
            let message = format!(
                "the answer is {} bytes, more than gateway.max_answer_bytes ({})",
                bytes.len(),
                self.limits.max_answer_bytes
            );
            let refusal = refusal_answer(x.routed, ToolErrorCode::TooLarge, &message, None);
            let (t, b) = refusal.encode(&x.from.id);
            server_text = Some(std::mem::replace(&mut text, t));
            bytes = b;
            too_large = Some(message);
        }
        let decision = if too_large.is_some() {
            decision::ERROR
        } else {
            decision
        };
        let error = too_large.as_deref().or(error);
        let original = server_text.as_deref().or(original);
        match decision {
            decision::ALLOWED => self.counters.calls_allowed += 1,
            decision::DENIED => self.counters.calls_denied += 1,
            _ => self.counters.calls_error += 1,
        }
        let outcome = match decision {
            decision::ALLOWED => "ok",
            decision::DENIED => "refused",
            decision::CANCELLED => "cancelled",
            _ => "error",
        };
        self.observed.request(x.routed.method(), outcome);
        if x.routed == Routed::CallTool {
            self.observed
                .tool_call_latency
                .observe(self.now.saturating_duration_since(started));
        }
        // The rule that decided the end: the response phase's when it refused the answer.
        let decided_by = x
            .response_decision
            .as_ref()
            .or_else(|| (decision == decision::DENIED).then_some(&x.request_decision));
        let approved = x.approved.as_ref().map(|(w, t)| (w.as_str(), *t));
        self.records.stage_call_end(
            x.ledger_id,
            &CallEnd {
                decision,
                policy_rule: decided_by.and_then(|d| d.rule.as_deref()),
                policy_reason: decided_by.and_then(|d| d.reason.as_deref()),
                duration_us: self.elapsed_us(started),
                error_message: error,
                bytes_sent: if x.from.conn.is_some() {
                    bytes.len()
                } else {
                    0
                },
                response: text.as_bytes(),
                rewritten_arguments: x.forwarded.as_deref().map(str::as_bytes),
                original_response: original.map(str::as_bytes),
                approved_by: approved.map(|a| a.0),
                decided_at_ms: approved.map(|a| a.1),
            },
        );
        if let Some(conn) = x.from.conn {
            self.reply(conn, x.from.stream, &x.from.id, Some(x.ledger_id), bytes);
        }
    }
}

/// A refusal as the method answers it: a readable tool result, or a JSON-RPC error.
fn refusal_answer(
    routed: Routed,
    code: ToolErrorCode,
    message: &str,
    rule: Option<&str>,
) -> Answer {
    if routed.refuses_as_result() {
        Answer::result(refusal(code, message, rule))
    } else {
        let data = json!({"code": code.as_str(), "rule": rule});
        Answer::error(code.mcp_error_code(), message, Some(data))
    }
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
pub(super) fn tool_error_text(result: &Value) -> Option<String> {
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
