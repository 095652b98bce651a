//! JSON-RPC messages to and from an upstream, sans-IO: request bodies built around JSON
//! text we already hold (tool arguments are never parsed and re-encoded), and incoming
//! messages sorted into the answer we wait for, notifications and server requests.

use serde::Deserialize;
use serde_json::Value;

use super::json_nodes;
use serde_json::value::RawValue;

/// A request body. `params` is JSON text of an object (or None).
pub fn request_body(id: u64, method: &str, params: Option<&str>) -> Vec<u8> {
    let method = Value::String(method.to_owned()).to_string();
    let mut out = format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":{method}");
    if let Some(p) = params {
        out.push_str(",\"params\":");
        out.push_str(p);
    }
    out.push('}');
    out.into_bytes()
}

/// A notification body.
pub fn notification_body(method: &str, params: Option<&str>) -> Vec<u8> {
    let method = Value::String(method.to_owned()).to_string();
    let mut out = format!("{{\"jsonrpc\":\"2.0\",\"method\":{method}");
    if let Some(p) = params {
        out.push_str(",\"params\":");
        out.push_str(p);
    }
    out.push('}');
    out.into_bytes()
}

/// An error answer to a request the server sent us (we serve none).
pub fn refusal_body(id: &RawValue, message: &str) -> Vec<u8> {
    let message = Value::String(message.to_owned()).to_string();
    format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{},\"error\":{{\"code\":-32601,\"message\":{message}}}}}",
        id.get()
    )
    .into_bytes()
}

/// Our answer to a request the server sent us: its result, or an error.
pub fn answer_body(id: &RawValue, answer: &crate::workers::relay_wire::RequestAnswer) -> Vec<u8> {
    let mut out = format!("{{\"jsonrpc\":\"2.0\",\"id\":{}", id.get());
    match (&answer.result, &answer.error) {
        (Some(result), _) => {
            out.push_str(",\"result\":");
            out.push_str(&result.to_string());
        }
        (None, Some(e)) => {
            let mut error = serde_json::json!({"code": e.code, "message": e.message});
            if let Some(data) = &e.data {
                error["data"] = data.clone();
            }
            out.push_str(",\"error\":");
            out.push_str(&error.to_string());
        }
        (None, None) => out.push_str(",\"result\":{}"),
    }
    out.push('}');
    out.into_bytes()
}

/// A JSON-RPC error from the upstream.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcFailure {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

/// One message from the upstream.
#[derive(Debug)]
pub enum Incoming {
    /// The answer to the request with our id: the result as JSON text, or the error.
    Answer(Result<String, RpcFailure>),
    /// A notification (progress, log message, list changed, ...).
    Notification {
        method: String,
        params: Option<Value>,
    },
    /// A request from the server (sampling, elicitation, roots, ping).
    ServerRequest {
        id: Box<RawValue>,
        method: String,
        params: Option<Value>,
    },
    /// An answer to some other id, or anything else JSON-RPC allows: ignored.
    Unrelated,
    /// A notification or server request whose params no agent may be sent (beyond
    /// [`MAX_PARAMS_BYTES`] or [`json_nodes::MAX_JSON_NODES`]): judged on its envelope
    /// alone, never parsed, dropped and counted by the caller. `request` is the id of a
    /// server request (the server may be told no).
    Dropped {
        method: String,
        request: Option<Box<RawValue>>,
        /// The progress token a dropped progress notification names (read without a tree).
        progress_token: Option<String>,
        why: String,
    },
}

/// The progress token of a notification's params, read without building their tree.
fn progress_token_of(params: &RawValue) -> Option<String> {
    #[derive(Deserialize)]
    struct Token<'a> {
        #[serde(rename = "progressToken", borrow, default)]
        token: Option<std::borrow::Cow<'a, str>>,
    }
    let t: Token = serde_json::from_str(params.get()).ok()?;
    t.token.map(|t| t.chars().take(64).collect())
}

/// Largest params of a notification or server request that is parsed: nothing larger can
/// be relayed (`relay.max_message_bytes` is at most this), so nothing larger becomes a tree.
pub const MAX_PARAMS_BYTES: usize = crate::gateway::relay_config::MAX_MESSAGE_BYTES;

/// The params of a notification or server request as a tree, when their size allows it.
fn bounded_params(method: &str, params: Option<&RawValue>) -> Result<Option<Value>, String> {
    let Some(p) = params else {
        return Ok(None);
    };
    // A list change is a bit: whatever its params hold is never needed.
    if list_changed_kind(method).is_some() {
        return Ok(None);
    }
    let text = p.get();
    if text.len() > MAX_PARAMS_BYTES {
        return Err(format!(
            "params of {} bytes, more than {MAX_PARAMS_BYTES} (relay.max_message_bytes at most)",
            text.len()
        ));
    }
    if json_nodes::within(text.as_bytes(), json_nodes::MAX_JSON_NODES).is_err() {
        return Err(json_nodes::too_many(
            "params",
            json_nodes::MAX_JSON_NODES,
            "gateway.max_json_nodes at most",
        ));
    }
    Ok(serde_json::from_str::<Value>(text).ok())
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(default)]
    method: Option<String>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
    #[serde(default)]
    error: Option<ErrorObject>,
}

#[derive(Deserialize)]
struct ErrorObject {
    code: i64,
    #[serde(default)]
    message: String,
    #[serde(default)]
    data: Option<Value>,
}

/// Sort one message; the error says why it is not a JSON-RPC message.
pub fn classify(text: &str, want_id: u64) -> Result<Incoming, String> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('[') {
        return Err("a JSON-RPC batch, which MCP no longer allows".into());
    }
    let env: Envelope =
        serde_json::from_str(text).map_err(|e| format!("not a JSON-RPC message: {e}"))?;
    match (env.id, env.method) {
        (Some(id), Some(method)) => Ok(match bounded_params(&method, env.params) {
            Ok(params) => Incoming::ServerRequest {
                id: id.to_owned(),
                method,
                params,
            },
            Err(why) => Incoming::Dropped {
                method,
                request: Some(id.to_owned()),
                progress_token: None,
                why,
            },
        }),
        (None, Some(method)) => Ok(match bounded_params(&method, env.params) {
            Ok(params) => Incoming::Notification { method, params },
            Err(why) => Incoming::Dropped {
                progress_token: env.params.and_then(progress_token_of),
                method,
                request: None,
                why,
            },
        }),
        (Some(id), None) => {
            if id.get().trim() != want_id.to_string() {
                return Ok(Incoming::Unrelated);
            }
            match (env.result, env.error) {
                (Some(result), None) => Ok(Incoming::Answer(Ok(result.get().to_owned()))),
                (None, Some(e)) => Ok(Incoming::Answer(Err(RpcFailure {
                    code: e.code,
                    message: e.message,
                    data: e.data,
                }))),
                _ => Err("a response must hold exactly one of result and error".into()),
            }
        }
        (None, None) => Ok(Incoming::Unrelated),
    }
}

/// A notification's method says one of the lists changed: which one.
pub fn list_changed_kind(method: &str) -> Option<&'static str> {
    match method {
        "notifications/tools/list_changed" => Some("tools"),
        "notifications/resources/list_changed" => Some("resources"),
        "notifications/prompts/list_changed" => Some("prompts"),
        _ => None,
    }
}

#[cfg(test)]
impl PartialEq for Incoming {
    fn eq(&self, other: &Self) -> bool {
        format!("{self:?}") == format!("{other:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_embed_the_json_we_hold() {
        let b = request_body(3, "tools/call", Some(r#"{"name":"x","arguments":{"a":1}}"#));
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["id"], 3);
        assert_eq!(v["params"]["arguments"]["a"], 1);
        let n: Value = serde_json::from_slice(&notification_body("n\"q", None)).unwrap();
        assert_eq!(n["method"], "n\"q");
        assert!(n.get("id").is_none());
        let id: Box<RawValue> = serde_json::from_str("\"abc\"").unwrap();
        let r: Value = serde_json::from_slice(&refusal_body(&id, "no")).unwrap();
        assert_eq!(r["id"], "abc");
        assert_eq!(r["error"]["code"], -32601);
    }

    #[test]
    fn the_answer_among_notifications() {
        let answer = classify(r#"{"jsonrpc":"2.0","id":7,"result":{"tools":[]}}"#, 7).unwrap();
        assert_eq!(answer, Incoming::Answer(Ok(r#"{"tools":[]}"#.into())));
        let other = classify(r#"{"jsonrpc":"2.0","id":8,"result":{}}"#, 7).unwrap();
        assert_eq!(other, Incoming::Unrelated);
        let note = classify(
            r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":1}}"#,
            7,
        )
        .unwrap();
        assert!(
            matches!(note, Incoming::Notification { ref method, .. } if method == "notifications/progress")
        );
        let req = classify(r#"{"jsonrpc":"2.0","id":"s1","method":"ping"}"#, 7).unwrap();
        assert!(matches!(req, Incoming::ServerRequest { ref method, .. } if method == "ping"));
        let err = classify(
            r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32602,"message":"unknown tool"}}"#,
            7,
        )
        .unwrap();
        assert!(matches!(
            err,
            Incoming::Answer(Err(RpcFailure { code: -32602, .. }))
        ));
    }

    #[test]
    fn garbage_is_an_error() {
        for bad in [
            "",
            "nope",
            "[1,2]",
            r#"{"jsonrpc":"2.0","id":7}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":1,"error":{"code":1,"message":""}}"#,
            "{\"id\":7,\"result\":",
        ] {
            assert!(classify(bad, 7).is_err(), "{bad}");
        }
    }

    #[test]
    fn oversized_params_are_judged_on_the_envelope() {
        let many = format!("[{}0]", "0,".repeat(json_nodes::MAX_JSON_NODES));
        let big = "x".repeat(MAX_PARAMS_BYTES + 1);
        for params in [
            format!("{{\"data\":{many}}}"),
            format!("{{\"data\":\"{big}\"}}"),
        ] {
            let note = format!(
                r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{params}}}"#
            );
            let got = classify(&note, 7).unwrap();
            assert!(
                matches!(&got, Incoming::Dropped { method, request: None, .. } if method == "notifications/message"),
                "{got:?}"
            );
            let req = format!(
                r#"{{"jsonrpc":"2.0","id":"s","method":"elicitation/create","params":{params}}}"#
            );
            assert!(matches!(
                classify(&req, 7).unwrap(),
                Incoming::Dropped {
                    request: Some(_),
                    ..
                }
            ));
        }
        // A list change keeps its bit whatever its params.
        let change = format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/tools/list_changed","params":{{"x":"{big}"}}}}"#
        );
        assert!(matches!(
            classify(&change, 7).unwrap(),
            Incoming::Notification { params: None, .. }
        ));
    }

    #[test]
    fn list_changed_methods() {
        assert_eq!(
            list_changed_kind("notifications/tools/list_changed"),
            Some("tools")
        );
        assert_eq!(list_changed_kind("notifications/progress"), None);
    }
}
