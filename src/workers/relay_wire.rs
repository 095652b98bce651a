//! What travels between the gateway and the aggregator worker about one call's
//! server-to-client traffic, besides the call itself: the facts the gateway gives the
//! worker for the upstream (`meta` of a `call_tool` request), the notifications and server
//! requests the worker meets during the call (events), and the agent's answers to those
//! requests (`answer` requests). Plain serde types, shared by both processes.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Event kind: a notification from the upstream during (or about) a call.
pub const CALL_NOTIFICATION: &str = "call_notification";
/// Event kind: requests from the upstream (elicitation, sampling, roots) during a call.
pub const CALL_REQUESTS: &str = "call_requests";

/// Event kind: notifications a worker dropped outside a call's thread (its listening
/// stream's rate bound, a local server's full queue, beyond the size bounds).
pub const RELAY_DROPPED: &str = "relay_dropped";

/// What a `relay_dropped` event says: how many, and the progress token they named (the
/// gateway counts them for that call, or as unrouted).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RelayDropped {
    pub server: String,
    #[serde(default)]
    pub progress_token: Option<String>,
    pub count: u64,
}

/// The `meta` of a `call_tool` (or `read_resource`, `get_prompt`) request: what the
/// gateway says about the agent behind the call.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CallMeta {
    /// The progress token to send upstream (the gateway's own, never the agent's), when
    /// the agent asked for progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_token: Option<String>,
    /// The client capabilities the agent declared (`elicitation`, `sampling`, `roots`
    /// only), for a modern upstream's `_meta`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_capabilities: Option<Value>,
    /// Longest the worker waits for the agent's answer to a relayed request, in ms (the
    /// gateway cancels the call at its own deadline anyway).
    #[serde(default)]
    pub wait_ms: u64,
    /// The gateway's bound on this call's notifications (`relay.notifications_per_sec`,
    /// `relay.notification_burst`): the worker drops beyond it too, so a flood never
    /// crosses the RPC channel.
    #[serde(default)]
    pub notifications_per_sec: u32,
    #[serde(default)]
    pub notification_burst: u32,
    /// The gateway's bound on one relayed message's params (`relay.max_message_bytes`):
    /// larger ones are dropped (notifications) or refused (requests) here already.
    #[serde(default)]
    pub max_message_bytes: usize,
    /// The gateway's bound on this call's server requests (`relay.max_requests_per_call`):
    /// no more wait for the client at once in the worker (0, an older gateway: 16).
    #[serde(default)]
    pub max_requests: u32,
    /// `tools/call` of a tool whose parameters travel as headers too (`x-mcp-header`):
    /// (name suffix, value as text) of each `Mcp-Param-*` header a modern upstream gets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub param_headers: Vec<(String, String)>,
    /// The gateway's bounds on the answer (`gateway.max_answer_bytes`,
    /// `gateway.max_json_nodes`): a larger answer is refused here already, never parsed
    /// (0: no bound named, an older gateway).
    #[serde(default)]
    pub max_answer_bytes: usize,
    #[serde(default)]
    pub max_json_nodes: usize,
    /// The lowest log level the agent wants (a modern upstream sends log messages only
    /// when a request asks for them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_level: Option<String>,
}

/// A notification met during a call. `call` is None when it came on a server's listening
/// stream (it may still name a call by its progress token).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CallNotification {
    #[serde(default)]
    pub call: Option<u64>,
    pub server: String,
    pub method: String,
    #[serde(default)]
    pub params: Option<Value>,
}

/// One request from the upstream, as the worker numbered it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ServerRequest {
    /// The worker's number for it, unique within the call.
    pub id: u64,
    pub method: String,
    #[serde(default)]
    pub params: Option<Value>,
    /// The key a modern server gave it in its `input_required` result: a modern agent
    /// sees it under the same key where that clashes with no other of the round.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// Requests from the upstream during `call`; the worker waits for an answer to each.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CallRequests {
    pub call: u64,
    pub server: String,
    pub requests: Vec<ServerRequest>,
}

/// The `args` of an `answer` request (its `target` is the call): the agent's answer to
/// the server request `id`, or why there is none.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RequestAnswer {
    pub id: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<AnswerError>,
}

/// A JSON-RPC error for the upstream.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AnswerError {
    pub code: i64,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl RequestAnswer {
    pub fn result(id: u64, result: Value) -> RequestAnswer {
        RequestAnswer {
            id,
            result: Some(result),
            error: None,
        }
    }

    pub fn error(
        id: u64,
        code: i64,
        message: impl Into<String>,
        data: Option<Value>,
    ) -> RequestAnswer {
        RequestAnswer {
            id,
            result: None,
            error: Some(AnswerError {
                code,
                message: message.into(),
                data,
            }),
        }
    }
}

/// The methods an upstream may ask a client during a call, with the client capability
/// each needs.
pub fn required_capability(method: &str) -> Option<&'static str> {
    match method {
        "elicitation/create" => Some("elicitation"),
        "sampling/createMessage" => Some("sampling"),
        "roots/list" => Some("roots"),
        _ => None,
    }
}
