//! A call's server-to-client traffic on the upstream side, inside the aggregator worker.
//!
//! - Notifications the upstream sends during the call (`notifications/progress`,
//!   `notifications/message`) become `call_notification` events tied to the call, bounded
//!   by the gateway's per-call rate (beyond it they are dropped and counted here, so a
//!   flood never crosses the RPC channel). The gateway judges, records and relays them.
//! - Requests the upstream makes during the call (`elicitation/create`,
//!   `sampling/createMessage`, `roots/list`), in either era, become one `call_requests`
//!   event; the worker then waits for the gateway's `answer` to each (or the call's
//!   cancellation). A legacy upstream gets each answer as a JSON-RPC response, from a
//!   thread that waits while the call's answer stream is read on (and ends without an
//!   answer when the server answers the call first); a modern
//!   upstream's `input_required` result is answered by retrying the request with
//!   `inputResponses` and its `requestState`.
//!
//! The upstream request carries `_meta.progressToken` = the gateway's own token (never the
//! agent's) when the agent asked for progress, and, to a modern upstream, the client
//! capabilities the agent declared, so the upstream asks only for what the agent can give.

use serde_json::{Map, Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::call_link::{CallLink, NoAnswer};
use super::era::{Era, META_CLIENT_CAPABILITIES};
use super::upstream::EventSink;
use crate::mcp::token_bucket::TokenBucket;
use crate::workers::relay_wire::{
    CALL_NOTIFICATION, CALL_REQUESTS, CallMeta, CallNotification, CallRequests, RequestAnswer,
    ServerRequest, required_capability,
};

/// `_meta` key of a modern request's log level.
const META_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
/// Rounds of `input_required` answered for one call before it fails (a server that keeps
/// asking).
pub const MAX_INPUT_ROUNDS: usize = 10;
/// Requests one `input_required` result may carry.
pub const MAX_INPUT_REQUESTS: usize = 16;
/// Requests of one call that may wait for the client at once when the gateway named no
/// bound (older gateways); else `relay.max_requests_per_call`.
const DEFAULT_MAX_WAITING: usize = 16;
/// How long a relayed request waits when the gateway named no bound (older gateways).
const DEFAULT_WAIT: Duration = Duration::from_secs(300);
/// Largest relayed message when the gateway named no bound.
const DEFAULT_MAX_MESSAGE_BYTES: usize = 256 * 1024;
/// Notifications relayed per call when the gateway named no bound.
const DEFAULT_RATE: (u32, u32) = (20, 50);

/// The notifications relayed to the agent; others are only counted.
pub fn relayed_notification(method: &str) -> bool {
    matches!(
        method,
        "notifications/progress" | "notifications/message" | "notifications/resources/updated"
    )
}

/// One call's relay state on the worker side.
pub struct CallContext {
    pub link: Arc<CallLink>,
    pub meta: CallMeta,
    events: EventSink,
    server: String,
    bucket: TokenBucket,
    next_request: u64,
    /// Notifications dropped by the rate bound.
    pub dropped: u64,
}

impl CallContext {
    pub fn new(link: Arc<CallLink>, meta: CallMeta, events: EventSink, server: &str) -> Self {
        let (rate, burst) = if meta.notification_burst == 0 {
            DEFAULT_RATE
        } else {
            (meta.notifications_per_sec, meta.notification_burst)
        };
        CallContext {
            link,
            meta,
            events,
            server: server.to_owned(),
            bucket: TokenBucket::new(rate, burst),
            next_request: 0,
            dropped: 0,
        }
    }

    /// Add what the agent asked for to a request's `params._meta`: the gateway's progress
    /// token, and (modern era) the agent's client capabilities in place of toolwall's.
    pub fn apply_meta(&self, era: &Era, params: &mut Map<String, Value>) {
        let modern = era.is_modern();
        let caps = self.meta.client_capabilities.as_ref().filter(|_| modern);
        let log_level = self.meta.log_level.as_ref().filter(|_| modern);
        if self.meta.progress_token.is_none() && caps.is_none() && log_level.is_none() {
            return;
        }
        let meta = params
            .entry("_meta")
            .or_insert_with(|| Value::Object(Map::new()));
        if !meta.is_object() {
            *meta = Value::Object(Map::new());
        }
        let Some(meta) = meta.as_object_mut() else {
            return;
        };
        if let Some(token) = &self.meta.progress_token {
            meta.insert("progressToken".into(), Value::String(token.clone()));
        }
        if let Some(caps) = caps {
            meta.insert(META_CLIENT_CAPABILITIES.into(), caps.clone());
        }
        if let Some(level) = log_level {
            meta.insert(META_LOG_LEVEL.into(), Value::String(level.clone()));
        }
    }

    /// A notification met during the call: relayed (true) unless it is not of a relayed
    /// kind or the rate bound drops it.
    pub fn notification(&mut self, method: &str, params: Option<Value>) -> bool {
        if !relayed_notification(method) {
            return false;
        }
        if too_large(&params, self.meta.max_message_bytes) || !self.bucket.take(Instant::now()) {
            self.dropped += 1;
            return false;
        }
        let note = CallNotification {
            call: Some(self.link.call),
            server: self.server.clone(),
            method: method.to_owned(),
            params,
        };
        if let Ok(detail) = serde_json::to_value(&note) {
            (self.events)(CALL_NOTIFICATION, detail);
        }
        true
    }

    /// Relay `requests` (method, params) to the agent and wait for an answer to each, in
    /// order. Err when the call was cancelled meanwhile; a request nobody answered in time
    /// gets an error answer.
    pub fn relay(
        &mut self,
        requests: Vec<(String, Option<Value>)>,
    ) -> Result<Vec<RequestAnswer>, NoAnswer> {
        self.ask(requests).wait(&self.link, None)
    }

    /// How many of a legacy server's requests may wait for the client at once during one
    /// request of the call (each on a thread of its own): `relay.max_requests_per_call`,
    /// which the gateway enforces per call anyway.
    pub fn max_waiting(&self) -> usize {
        match self.meta.max_requests {
            0 => DEFAULT_MAX_WAITING,
            n => n as usize,
        }
    }

    /// Send `requests` (method, params) to the gateway for the agent, without waiting:
    /// [`Asked::wait`] waits for the answers.
    pub fn ask(&mut self, requests: Vec<(String, Option<Value>)>) -> Asked {
        self.ask_keyed(requests.into_iter().map(|(m, p)| (None, m, p)).collect())
    }

    /// [`CallContext::ask`] for requests a modern server keyed in its `input_required`
    /// result (key, method, params).
    pub fn ask_keyed(&mut self, requests: Vec<(Option<String>, String, Option<Value>)>) -> Asked {
        let mut numbered = Vec::with_capacity(requests.len());
        // Too large to relay: refused here, never sent over the RPC channel.
        let mut refused = Vec::new();
        for (key, method, params) in requests {
            self.next_request += 1;
            if too_large(&params, self.meta.max_message_bytes) {
                refused.push(RequestAnswer::error(
                    self.next_request,
                    crate::mcp::jsonrpc::INTERNAL_ERROR,
                    "the request is too large to relay (relay.max_message_bytes)",
                    None,
                ));
                continue;
            }
            numbered.push(ServerRequest {
                id: self.next_request,
                method,
                params,
                key,
            });
        }
        let wait = match self.meta.wait_ms {
            0 => DEFAULT_WAIT,
            ms => Duration::from_millis(ms),
        };
        let asked = Asked {
            ids: numbered.iter().map(|r| r.id).collect(),
            refused,
            deadline: Instant::now() + wait,
        };
        if numbered.is_empty() {
            return asked;
        }
        let event = CallRequests {
            call: self.link.call,
            server: self.server.clone(),
            requests: numbered,
        };
        if let Ok(detail) = serde_json::to_value(&event) {
            (self.events)(CALL_REQUESTS, detail);
        }
        asked
    }
}

/// Requests sent to the gateway for the agent, whose answers are awaited.
pub struct Asked {
    ids: Vec<u64>,
    refused: Vec<RequestAnswer>,
    deadline: Instant,
}

impl Asked {
    /// Wait for an answer to each request, in order; `epoch` (see
    /// [`CallLink::wait_answer_in`]) ends the wait when the server answered its call
    /// without them. Err when the call was cancelled or its request is over; a request
    /// nobody answered in time gets an error answer.
    pub fn wait(self, link: &CallLink, epoch: Option<u64>) -> Result<Vec<RequestAnswer>, NoAnswer> {
        let mut answers = self.refused;
        for id in self.ids {
            let got = match epoch {
                Some(e) => link.wait_answer_in(id, self.deadline, e),
                None => link.wait_answer(id, self.deadline),
            };
            match got {
                Ok(a) => answers.push(a),
                Err(NoAnswer::TimedOut) => answers.push(RequestAnswer::error(
                    id,
                    crate::mcp::jsonrpc::INTERNAL_ERROR,
                    "the client did not answer in time",
                    None,
                )),
                Err(other) => return Err(other),
            }
        }
        // In the order asked (ids were given in that order).
        answers.sort_by_key(|a| a.id);
        Ok(answers)
    }
}

/// Whether `params` exceed `max` bytes as JSON (a `max` of 0, from an older gateway,
/// means the default).
fn too_large(params: &Option<Value>, max: usize) -> bool {
    let max = if max == 0 {
        DEFAULT_MAX_MESSAGE_BYTES
    } else {
        max
    };
    params.as_ref().is_some_and(|p| p.to_string().len() > max)
}

/// Whether the server asks the client something toolwall relays.
pub fn relayed_request(method: &str) -> bool {
    required_capability(method).is_some()
}

/// The parts of an `input_required` result (2026-07-28).
#[derive(Debug, PartialEq)]
pub struct InputRequired {
    /// (key, method, params), in the order the server listed them.
    pub requests: Vec<(String, String, Option<Value>)>,
    pub state: Option<String>,
}

/// `Some` when `result` is an `input_required` result: its requests and state, or why it
/// cannot be served (malformed, a method toolwall does not relay, too many requests).
pub fn input_required(result: &str) -> Option<Result<InputRequired, String>> {
    if !result.contains("input_required") {
        return None;
    }
    // The kind is read without building a tree: only a real `input_required` result
    // within the node bound is parsed whole (a larger one is refused as an answer).
    #[derive(serde::Deserialize)]
    struct ResultType<'a> {
        #[serde(rename = "resultType", borrow, default)]
        result_type: Option<std::borrow::Cow<'a, str>>,
    }
    let kind: ResultType = serde_json::from_str(result).ok()?;
    if kind.result_type.as_deref() != Some("input_required") {
        return None;
    }
    if super::json_nodes::within(result.as_bytes(), super::json_nodes::MAX_JSON_NODES).is_err() {
        return Some(Err(super::json_nodes::too_many(
            "the input_required result",
            super::json_nodes::MAX_JSON_NODES,
            "gateway.max_json_nodes at most",
        )));
    }
    let value: Value = serde_json::from_str(result).ok()?;
    Some(parse_input_required(&value))
}

fn parse_input_required(value: &Value) -> Result<InputRequired, String> {
    let state = match value.get("requestState") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err("its requestState is not a string".into()),
    };
    let mut requests = Vec::new();
    match value.get("inputRequests") {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            if map.len() > MAX_INPUT_REQUESTS {
                return Err(format!(
                    "it asks {} things at once (at most {MAX_INPUT_REQUESTS} are relayed)",
                    map.len()
                ));
            }
            for (key, request) in map {
                let method = request
                    .get("method")
                    .and_then(Value::as_str)
                    .ok_or_else(|| format!("input request {key:?} has no method"))?;
                if !relayed_request(method) {
                    return Err(format!(
                        "input request {key:?} is {method:?}, which toolwall does not relay"
                    ));
                }
                requests.push((
                    key.clone(),
                    method.to_owned(),
                    request.get("params").cloned(),
                ));
            }
        }
        Some(_) => return Err("its inputRequests is not an object".into()),
    }
    if requests.is_empty() && state.is_none() {
        return Err("it has neither inputRequests nor requestState".into());
    }
    Ok(InputRequired { requests, state })
}

/// The params additions of the retry: `inputResponses` keyed as the server asked, and its
/// `requestState` echoed. Err when the agent refused one (the error's message).
pub fn retry_params(
    asked: &InputRequired,
    answers: &[RequestAnswer],
) -> Result<Map<String, Value>, String> {
    let mut responses = Map::new();
    for ((key, method, _), answer) in asked.requests.iter().zip(answers) {
        match (&answer.result, &answer.error) {
            (Some(result), _) => {
                responses.insert(key.clone(), result.clone());
            }
            (None, Some(e)) => {
                return Err(format!(
                    "the client refused the server's {method}: {} ({})",
                    e.message, e.code
                ));
            }
            (None, None) => {
                responses.insert(key.clone(), json!({}));
            }
        }
    }
    let mut extra = Map::new();
    if !asked.requests.is_empty() {
        extra.insert("inputResponses".into(), Value::Object(responses));
    }
    if let Some(state) = &asked.state {
        extra.insert("requestState".into(), Value::String(state.clone()));
    }
    Ok(extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_required_is_read_and_checked() {
        assert!(input_required(r#"{"content":[]}"#).is_none());
        assert!(
            input_required(r#"{"content":[{"type":"text","text":"input_required"}]}"#).is_none()
        );
        let ok = input_required(
            r#"{"resultType":"input_required","requestState":"s1","inputRequests":{"a":{"method":"elicitation/create","params":{"message":"?"}}}}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(ok.state.as_deref(), Some("s1"));
        assert_eq!(ok.requests[0].0, "a");
        assert_eq!(ok.requests[0].1, "elicitation/create");
        for bad in [
            r#"{"resultType":"input_required"}"#,
            r#"{"resultType":"input_required","requestState":5}"#,
            r#"{"resultType":"input_required","inputRequests":{"a":{"method":"tools/call"}}}"#,
            r#"{"resultType":"input_required","inputRequests":[1]}"#,
        ] {
            assert!(input_required(bad).unwrap().is_err(), "{bad}");
        }
    }

    #[test]
    fn oversized_messages_never_cross_the_rpc_channel() {
        let sent = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let seen = Arc::clone(&sent);
        let events: EventSink = Arc::new(move |kind: &str, _: Value| {
            seen.lock().unwrap().push(kind.to_owned());
        });
        let meta = CallMeta {
            max_message_bytes: 64,
            notification_burst: 10,
            notifications_per_sec: 10,
            ..CallMeta::default()
        };
        let mut ctx = CallContext::new(CallLink::new(1), meta, events, "up");
        let big = Some(json!({"data": "x".repeat(100)}));
        assert!(!ctx.notification("notifications/message", big.clone()));
        assert!(ctx.notification("notifications/message", Some(json!({"data": "ok"}))));
        assert_eq!(ctx.dropped, 1);
        let answers = ctx
            .relay(vec![("elicitation/create".into(), big)])
            .expect("answered at once");
        assert!(answers[0].error.is_some(), "refused here");
        assert_eq!(*sent.lock().unwrap(), vec![CALL_NOTIFICATION.to_owned()]);
    }

    #[test]
    fn retry_carries_responses_and_state() {
        let asked = InputRequired {
            requests: vec![("k".into(), "roots/list".into(), None)],
            state: Some("opaque".into()),
        };
        let extra =
            retry_params(&asked, &[RequestAnswer::result(1, json!({"roots": []}))]).unwrap();
        assert_eq!(extra["inputResponses"]["k"]["roots"], json!([]));
        assert_eq!(extra["requestState"], "opaque");
        let refused = retry_params(
            &asked,
            &[RequestAnswer::error(1, -32601, "no roots here", None)],
        )
        .unwrap_err();
        assert!(refused.contains("no roots here"), "{refused}");
    }
}
