//! Method dispatch: what the gateway answers itself (initialize, discover, ping, lists) and
//! what goes to the pipeline ([`Routed`] methods). Protocol faults are answered here.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use std::time::Instant;

use super::exchange::Routed;
use super::{Action, ConnRef, Core, Expect, Peer, Recorder};
use crate::mcp::catalog::Kind;
use crate::mcp::jsonrpc::{self, Message};
use crate::mcp::protocol;
use crate::policy::{Phase, Subject, Transport, Verdict};

/// Characters of an agent's cancellation reason kept in its `cancelled` event.
pub const MAX_CANCEL_REASON_CHARS: usize = 256;

/// The request being dispatched.
pub(super) struct RequestCtx<'a> {
    pub conn: ConnRef,
    pub stream: u32,
    pub id: &'a str,
    pub peer: &'a Peer,
    pub process: &'a str,
    pub bytes_received: usize,
}

#[derive(Deserialize)]
struct CursorParams {
    #[serde(default)]
    cursor: Option<String>,
}

#[derive(Deserialize)]
struct CancelParams<'a> {
    #[serde(borrow, rename = "requestId")]
    request_id: &'a RawValue,
    #[serde(default)]
    reason: Option<String>,
}

impl<R: Recorder> Core<R> {
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
        self.now = now;
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
                self.calls.opened(conn);
                self.counters.requests_total += 1;
                let ctx = RequestCtx {
                    conn,
                    stream,
                    id: id.get(),
                    peer,
                    process,
                    bytes_received: payload.len(),
                };
                self.on_request(&ctx, &method, params);
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
            Message::Response { id, result, error } => {
                // The answer to a server's request toolwall relayed to this agent.
                self.on_agent_response(
                    conn,
                    id.get(),
                    result.map(RawValue::get),
                    error.map(RawValue::get),
                );
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
            .keys_where(|c| {
                c.exchange()
                    .is_some_and(|x| x.from.conn == Some(conn) && x.from.id == target)
            })
            .first()
            .copied();
        let Some(key) = key else {
            // A cancel for nothing of this agent's (it ended already, or never was): only
            // counted. Recorded, a flood of them filled the ledger at 85 MB/s.
            self.observed
                .request("notifications/cancelled", "unmatched");
            return;
        };
        let reason: String = p
            .reason
            .as_deref()
            .unwrap_or("cancelled by the client")
            .chars()
            .take(MAX_CANCEL_REASON_CHARS)
            .collect();
        self.event(
            "cancelled",
            json!({"request_id": target, "reason": reason, "found": true}),
        );
        self.cancel_call(key, &reason);
    }

    fn on_request(&mut self, ctx: &RequestCtx, method: &str, params: Option<&RawValue>) {
        self.observed.request(method, "received");
        if self.stopping {
            self.answer_error(
                ctx,
                method,
                jsonrpc::SHUTTING_DOWN,
                "the gateway is stopping",
                None,
            );
            return;
        }
        if let Some(routed) = Routed::from_method(method) {
            if self.refuse_over_share(ctx, method)
                || self.refuse_over_pool_share(ctx, method, routed, params)
            {
                return;
            }
            self.begin_exchange(ctx, routed, params);
            return;
        }
        match method {
            "initialize" => {
                let asked = protocol::requested_version(params);
                let version = protocol::negotiate(asked.as_deref());
                if let Some(s) = self.sessions.get_mut(&ctx.conn) {
                    s.protocol_version = Some(version);
                    s.facts.caps = crate::mcp::client_caps::ClientCaps::from_value(
                        params
                            .and_then(|p| serde_json::from_str::<Value>(p.get()).ok())
                            .as_ref()
                            .and_then(|p| p.get("capabilities")),
                    );
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
                let mut result = protocol::initialize_result(version, list_changed);
                // Updates of subscribed resources need a standing stream (not on HTTP).
                self.offers
                    .declare(&mut result["capabilities"], list_changed);
                let result = result.to_string();
                self.answer(ctx, method, &result);
            }
            "server/discover" => {
                // The modern era's handshake-free description; the HTTP door adds the
                // era's fields (resultType, _meta) when it writes the answer.
                let mut result =
                    crate::transport::http::era::discover_result(protocol::INSTRUCTIONS);
                self.offers.declare(&mut result["capabilities"], false);
                let result = result.to_string();
                self.answer(ctx, method, &result);
            }
            "ping" => self.answer(ctx, method, "{}"),
            "logging/setLevel" => self.set_log_level(ctx, method, params),
            "tools/list" => self.list(ctx, Kind::Tools, method, params),
            "resources/list" => self.list(ctx, Kind::Resources, method, params),
            "prompts/list" => self.list(ctx, Kind::Prompts, method, params),
            "resources/templates/list" => self.list(ctx, Kind::Templates, method, params),
            _ => {
                let message = format!("method not found: {method}");
                self.answer_error(ctx, method, jsonrpc::METHOD_NOT_FOUND, &message, None);
            }
        }
    }

    /// The request phase for a method the gateway answers itself (lists): `ask` is for
    /// requests that reach a server, so here it refuses like a block.
    pub(super) fn method_allowed(&mut self, ctx: &RequestCtx, method: &str) -> bool {
        let subject = Subject {
            method,
            server: None,
            tool: None,
            resource: None,
            principal: &ctx.peer.principal,
            transport: ctx.peer.transport,
            process: ctx.process,
            arguments: None,
        };
        let decision = self.policy.decide(Phase::Request, &subject, None);
        if decision.verdict == Verdict::Allow {
            return true;
        }
        let rule = decision.rule.clone();
        let message = format!(
            "{method} refused by policy{}",
            rule.as_deref()
                .map(|r| format!(" rule {r}"))
                .unwrap_or_default()
        );
        self.event(
            "method_denied",
            json!({"method": method, "rule": rule, "reason": decision.reason,
                   "principal": ctx.peer.principal}),
        );
        let data = json!({"rule": rule, "reason": decision.reason});
        self.answer_error(ctx, method, jsonrpc::POLICY_BLOCKED, &message, Some(&data));
        false
    }

    fn list(&mut self, ctx: &RequestCtx, kind: Kind, method: &str, params: Option<&RawValue>) {
        if !self.method_allowed(ctx, method) {
            return;
        }
        let cursor = match params.map(|p| serde_json::from_str::<CursorParams>(p.get())) {
            None => None,
            Some(Ok(p)) => p.cursor,
            Some(Err(_)) => {
                self.answer_error(ctx, method, jsonrpc::INVALID_PARAMS, "invalid params", None);
                return;
            }
        };
        // Room for the envelope, the id and the cursor within one answer.
        let page_bytes = self.limits.max_answer_bytes.saturating_sub(8 * 1024);
        let policy = &self.policy;
        let peer = ctx.peer;
        let process = ctx.process;
        let result =
            self.catalog
                .list_page(kind, cursor.as_deref(), self.page_size, page_bytes, |e| {
                    kind != Kind::Tools
                        || !policy.hides_tool(
                            &e.name,
                            &e.server,
                            &peer.principal,
                            peer.transport,
                            process,
                        )
                });
        // The first listing of a window is recorded; the rest are counted into one
        // `list_summary` when the window ends (`gateway.list_event_secs`).
        let now = self.now;
        let wall_ms = self.wall_ms();
        match self.list_events.on_list(
            now,
            wall_ms,
            &ctx.peer.principal,
            ctx.peer.transport.as_str(),
            method,
        ) {
            Some(detail) => self.event("list", detail),
            None => self.counters.list_coalesced += 1,
        }
        self.answer(ctx, method, &result);
    }

    /// The answer to a request the gateway serves itself.
    pub(super) fn answer(&mut self, ctx: &RequestCtx, method: &str, result: &str) {
        self.observed.request(method, "ok");
        let bytes = jsonrpc::result_response(ctx.id, result);
        self.reply(ctx.conn, ctx.stream, ctx.id, None, bytes);
    }

    /// A JSON-RPC error for a request the gateway refuses itself.
    pub(super) fn answer_error(
        &mut self,
        ctx: &RequestCtx,
        method: &str,
        code: i64,
        message: &str,
        data: Option<&Value>,
    ) {
        let outcome = if code == jsonrpc::POLICY_BLOCKED {
            "refused"
        } else {
            "error"
        };
        self.observed.request(method, outcome);
        let bytes = jsonrpc::error_response(Some(ctx.id), code, message, data);
        self.reply(ctx.conn, ctx.stream, ctx.id, None, bytes);
    }

    /// Queue an answer; the commit barrier releases it.
    pub(super) fn reply(
        &mut self,
        conn: ConnRef,
        stream: u32,
        id: &str,
        row: Option<i64>,
        bytes: Vec<u8>,
    ) {
        self.calls.answered(conn);
        self.actions.push(Action::Reply {
            conn,
            stream,
            id: id.to_owned(),
            row,
            bytes,
        });
    }
}
