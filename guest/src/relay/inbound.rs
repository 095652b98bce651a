//! What one stdin line is, decided before anything is sent.

use serde_json::Value;

use super::jsonrpc_error::{INVALID_REQUEST, PARSE_ERROR, error_line};

/// The kind of a stdin line.
#[derive(Debug, PartialEq, Eq)]
pub enum Inbound {
    /// Only whitespace: skipped.
    Blank,
    /// Has `method` and `id`: framed on the next stream id.
    Request {
        /// The JSON-RPC id as raw JSON text.
        id: String,
        method: String,
    },
    /// Has `method` and no `id`: framed on stream 0 with the notification flag.
    Notification,
    /// A response from the agent (`result` or `error`, no `method`): its answer to a
    /// request the gateway relayed from a server (ids the gateway chose). Framed on stream
    /// 0 with the notification flag: it opens no stream and awaits no reply.
    Response,
    /// Refused locally with this error line; nothing is sent.
    Refused(String),
}

pub fn classify(line: &[u8]) -> Inbound {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Inbound::Blank;
    }
    let refuse = |code, message: &str| Inbound::Refused(error_line(None, code, message));
    let value: Value = match serde_json::from_slice(line) {
        Ok(value) => value,
        Err(e) => return refuse(PARSE_ERROR, &format!("parse error: {e}")),
    };
    let map = match value {
        Value::Object(map) => map,
        Value::Array(_) => return refuse(INVALID_REQUEST, "batches are not supported"),
        _ => return refuse(INVALID_REQUEST, "a JSON-RPC message must be an object"),
    };
    match (map.get("method"), map.get("id")) {
        (Some(Value::String(_)), None) => Inbound::Notification,
        (
            Some(Value::String(method)),
            Some(id @ (Value::String(_) | Value::Number(_) | Value::Null)),
        ) => Inbound::Request {
            id: id.to_string(),
            method: method.clone(),
        },
        (Some(Value::String(_)), Some(_)) => {
            refuse(INVALID_REQUEST, "id must be a string, a number or null")
        }
        (Some(_), _) => refuse(INVALID_REQUEST, "method must be a string"),
        (None, _) if map.contains_key("result") || map.contains_key("error") => Inbound::Response,
        (None, _) => refuse(INVALID_REQUEST, "not a JSON-RPC request: no method"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused_code(line: &str) -> i64 {
        match classify(line.as_bytes()) {
            Inbound::Refused(reply) => {
                let v: Value = serde_json::from_str(&reply).unwrap();
                assert!(v["id"].is_null(), "{reply}");
                v["error"]["code"].as_i64().unwrap()
            }
            other => panic!("{line}: {other:?}"),
        }
    }

    #[test]
    fn requests_and_notifications() {
        assert_eq!(
            classify(br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{}}"#),
            Inbound::Request {
                id: "7".into(),
                method: "tools/call".into()
            }
        );
        assert_eq!(
            classify(br#"{"id":"x\u0041","method":"ping"}"#),
            Inbound::Request {
                id: "\"xA\"".into(),
                method: "ping".into()
            }
        );
        assert_eq!(
            classify(b"{\"method\":\"notifications/initialized\"}\r"),
            Inbound::Notification
        );
    }

    #[test]
    fn blank_lines() {
        assert_eq!(classify(b""), Inbound::Blank);
        assert_eq!(classify(b" \t\r"), Inbound::Blank);
    }

    #[test]
    fn refusals() {
        assert_eq!(refused_code("not json"), -32700);
        assert_eq!(refused_code("{\"id\":1,"), -32700);
        assert_eq!(refused_code("[1,2]"), -32600);
        assert_eq!(refused_code("42"), -32600);
        assert_eq!(refused_code(r#"{"id":1}"#), -32600);
        assert_eq!(refused_code(r#"{"id":1,"method":5}"#), -32600);
        assert_eq!(refused_code(r#"{"id":[1],"method":"ping"}"#), -32600);
    }

    #[test]
    fn responses_from_the_agent_are_forwarded() {
        assert_eq!(
            classify(br#"{"jsonrpc":"2.0","id":3,"result":{}}"#),
            Inbound::Response
        );
    }
}
