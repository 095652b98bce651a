//! A 2026-07-28 client's retry of a call that was answered `input_required`: it carries
//! the `requestState` toolwall sealed and the `inputResponses` to the requests it held.
//! The state must open under toolwall's key and name this principal, this tool, these
//! arguments, a call still waiting at that round, and must not have expired; then the
//! responses go to the server (through the relay's one path: policy, ledger, worker) and
//! the retry becomes the request the call's answer goes to.

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::dispatch::RequestCtx;
use super::exchange::{Requester, Routed};
use super::request_state::Claims;
use super::{Core, Recorder};
use crate::mcp::jsonrpc;

/// SHA-256 (hex) of a request's `arguments` (or whole params, for `resources/read`) as
/// the client sent them, parsed and serialized again (so whitespace does not matter).
pub fn arrived_arguments_hash(routed: Routed, params: &Value) -> String {
    let args = match routed {
        Routed::ReadResource => {
            let mut p = params.clone();
            if let Some(m) = p.as_object_mut() {
                m.remove("_meta");
                m.remove("inputResponses");
                m.remove("requestState");
            }
            p
        }
        _ => params
            .get("arguments")
            .cloned()
            .unwrap_or_else(|| json!({})),
    };
    let digest = Sha256::digest(args.to_string().as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The `requestState` of a request's params, when it has one (any JSON type: a non-string
/// is refused later, not treated as absent).
pub fn request_state(params: &Value) -> Option<&Value> {
    params.get("requestState")
}

impl<R: Recorder> Core<R> {
    /// The tool or prompt a retry names, as the call and its state know it: an agent calls
    /// a `prefix = false` server's tool by the server's own name, the call is `server__name`
    /// (a name no longer in the catalog stays as it came, and matches nothing). A URI as it is.
    pub(super) fn called_name(&self, routed: Routed, params: &Value) -> String {
        let name = params
            .get(routed.target_field())
            .and_then(Value::as_str)
            .unwrap_or_default();
        match routed {
            Routed::ReadResource => name.to_owned(),
            _ => self
                .catalog
                .get(routed.kind(), name)
                .map_or_else(|| name.to_owned(), |e| e.name.clone()),
        }
    }

    /// A request that carries a `requestState`: resume the call it names, or refuse it
    /// with an error naming why. Never a new call.
    pub(super) fn resume_with_state(
        &mut self,
        ctx: &RequestCtx,
        routed: Routed,
        params: &Value,
        state: &Value,
    ) {
        let claims = match state.as_str() {
            None => Err("requestState must be a string".to_owned()),
            Some(text) => match &self.relay.key {
                None => Err("this gateway issues no requestState".to_owned()),
                Some(key) => key.open(text).map_err(|e| e.to_string()),
            },
        };
        let outcome = claims.and_then(|c| match c.kind.as_str() {
            "input" => self.resume_input(ctx, routed, params, &c),
            "ask" => self.resume_client_ask(ctx, routed, params, &c),
            _ => Err("the requestState is not for this request".to_owned()),
        });
        if let Err(why) = outcome {
            self.event(
                "request_state_refused",
                json!({"method": routed.method(), "principal": ctx.peer.principal,
                       "reason": why}),
            );
            let message = format!("invalid requestState: {why}");
            self.answer_error(
                ctx,
                routed.method(),
                jsonrpc::INVALID_PARAMS,
                &message,
                None,
            );
        }
    }

    fn resume_input(
        &mut self,
        ctx: &RequestCtx,
        routed: Routed,
        params: &Value,
        claims: &Claims,
    ) -> Result<(), String> {
        if claims.principal != ctx.peer.principal {
            return Err("it was issued to another principal".into());
        }
        if claims.expires_ms <= self.wall_ms() {
            return Err("it has expired (relay.input_state_ttl_secs)".into());
        }
        let key = claims.call;
        let name = self.called_name(routed, params);
        let hash = arrived_arguments_hash(routed, params);
        let Some(x) = self.calls.get(key).and_then(|c| c.exchange()) else {
            return Err("the call it belongs to has ended".into());
        };
        if x.routed != routed || x.relay.arrived_args.is_empty() {
            return Err("it belongs to another method".into());
        }
        if x.from.conn.is_some() || x.relay.round != claims.round {
            return Err("it was already used (each requestState is good once)".into());
        }
        let named = match routed {
            Routed::ReadResource => x.target.name.clone(),
            _ => x.target.tool.clone().unwrap_or_else(|| x.display_name()),
        };
        if name != named || claims.tool != x.display_name() {
            return Err("it was issued for another tool".into());
        }
        if hash != claims.args || hash != x.relay.arrived_args {
            return Err("it was issued for other arguments".into());
        }
        let ledger_id = x.ledger_id;
        let pending = x.relay.pending.clone();
        // The retry is now the request the call answers.
        let token = params
            .get("_meta")
            .and_then(|m| m.get("progressToken"))
            .filter(|t| t.is_string() || t.is_i64() || t.is_u64())
            .map(Value::to_string)
            .filter(|t| t.len() <= super::relay::MAX_PROGRESS_TOKEN_BYTES);
        if let Some(x) = self.calls.get_mut(key).and_then(|c| c.exchange_mut()) {
            x.from = Requester {
                conn: Some(ctx.conn),
                stream: ctx.stream,
                id: ctx.id.to_owned(),
                principal: ctx.peer.principal.clone(),
                process: ctx.process.to_owned(),
                transport: ctx.peer.transport,
            };
            if token.is_some() {
                x.relay.agent_token = token;
            }
        }
        self.event(
            "input_retry",
            json!({"call_id": ledger_id, "round": claims.round}),
        );
        let responses = params.get("inputResponses").and_then(Value::as_object);
        for rk in pending {
            let answer = responses.and_then(|r| r.get(&self.input_key(rk)));
            match answer {
                Some(result) => self.deliver_input(rk, result.clone()),
                None => self.deliver_input_refused(rk),
            }
        }
        self.issue_queued_input(key);
        Ok(())
    }
}
