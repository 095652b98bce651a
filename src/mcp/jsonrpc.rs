//! The JSON-RPC 2.0 envelope, parsed once and borrowed: the method and the raw id and
//! params, never a re-encoded copy. Replies are written by splicing raw JSON.

use serde::Deserialize;
use serde::de::{self, Deserializer};
use serde_json::value::RawValue;
use std::borrow::Cow;

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;
/// Transport-level failure (timeout, worker gone, disconnect).
pub const TRANSPORT_ERROR: i64 = -32001;
/// A method refused by policy (not `tools/call`, which answers with a tool result).
pub const POLICY_BLOCKED: i64 = -32003;
/// The gateway cannot record, so it does not serve (fail closed).
pub const LEDGER_UNAVAILABLE: i64 = -32004;
/// The gateway is stopping.
pub const SHUTTING_DOWN: i64 = -32005;

/// `id` as written: absent, or raw JSON (which may be `null`, refused later).
#[derive(Debug, Default)]
enum RawId<'a> {
    #[default]
    Absent,
    Present(&'a RawValue),
}

impl<'de: 'a, 'a> Deserialize<'de> for RawId<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <&'a RawValue>::deserialize(d).map(RawId::Present)
    }
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    jsonrpc: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    id: RawId<'a>,
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

/// One parsed JSON-RPC message.
#[derive(Debug)]
pub enum Message<'a> {
    Request {
        id: &'a RawValue,
        method: Cow<'a, str>,
        params: Option<&'a RawValue>,
    },
    Notification {
        method: Cow<'a, str>,
        params: Option<&'a RawValue>,
    },
    /// A response from the agent: the answer to a server's request toolwall relayed.
    Response {
        id: &'a RawValue,
        result: Option<&'a RawValue>,
        error: Option<&'a RawValue>,
    },
}

/// Why a payload is not a JSON-RPC message; `id` is the request id when it could be read.
#[derive(Debug)]
pub struct Fault<'a> {
    pub code: i64,
    pub message: &'static str,
    pub id: Option<&'a RawValue>,
}

fn fault<'a>(code: i64, message: &'static str, id: Option<&'a RawValue>) -> Fault<'a> {
    Fault { code, message, id }
}

/// Parse one payload. Batches (arrays) are refused: removed from MCP in 2025-06-18.
pub fn parse(payload: &[u8]) -> Result<Message<'_>, Fault<'_>> {
    let first = payload.iter().find(|b| !b.is_ascii_whitespace());
    match first {
        Some(b'[') => {
            // Refuse without walking the array; it may be a valid batch or garbage.
            return Err(fault(
                INVALID_REQUEST,
                "batch requests are not supported",
                None,
            ));
        }
        Some(b'{') => {}
        None => return Err(fault(PARSE_ERROR, "empty message", None)),
        Some(_) => {
            return Err(match serde_json::from_slice::<de::IgnoredAny>(payload) {
                Ok(_) => fault(
                    INVALID_REQUEST,
                    "a JSON-RPC message must be an object",
                    None,
                ),
                Err(_) => fault(PARSE_ERROR, "parse error: invalid JSON", None),
            });
        }
    }
    let env: Envelope = match serde_json::from_slice(payload) {
        Ok(env) => env,
        Err(e) if e.is_data() => {
            return Err(fault(INVALID_REQUEST, "invalid JSON-RPC message", None));
        }
        Err(_) => return Err(fault(PARSE_ERROR, "parse error: invalid JSON", None)),
    };
    let id = match env.id {
        RawId::Absent => None,
        RawId::Present(raw) => Some(raw),
    };
    let valid_id = id.filter(|raw| is_valid_id(raw));
    if env.jsonrpc.as_deref() != Some("2.0") {
        return Err(fault(INVALID_REQUEST, "jsonrpc must be \"2.0\"", valid_id));
    }
    if let Some(params) = env.params {
        let kind = params.get().as_bytes().first();
        if !matches!(kind, Some(b'{') | Some(b'[')) {
            return Err(fault(INVALID_REQUEST, "params must be an object", valid_id));
        }
    }
    match (env.method, id) {
        (Some(method), None) => Ok(Message::Notification {
            method,
            params: env.params,
        }),
        (Some(method), Some(raw)) => {
            if valid_id.is_none() {
                return Err(fault(
                    INVALID_REQUEST,
                    "id must be a string or an integer",
                    None,
                ));
            }
            Ok(Message::Request {
                id: raw,
                method,
                params: env.params,
            })
        }
        (None, Some(raw)) if env.result.is_some() || env.error.is_some() => Ok(Message::Response {
            id: raw,
            result: env.result,
            error: env.error,
        }),
        (None, _) => Err(fault(INVALID_REQUEST, "missing method", valid_id)),
    }
}

/// MCP ids are strings or integers; never null, never fractional.
fn is_valid_id(raw: &RawValue) -> bool {
    let text = raw.get();
    match text.as_bytes().first() {
        Some(b'"') => true,
        // An integer a 64-bit signed number holds: a longer one is well-formed JSON that no
        // client can mean (JavaScript loses it past 2^53) and no `Value` keeps exactly.
        Some(b'-' | b'0'..=b'9') => text.parse::<i64>().is_ok(),
        _ => false,
    }
}

/// `{"jsonrpc":"2.0","id":<id>,"result":<result>}` from raw parts.
pub fn result_response(id: &str, result: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(36 + id.len() + result.len());
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(b",\"result\":");
    out.extend_from_slice(result.as_bytes());
    out.push(b'}');
    out
}

/// A JSON-RPC error response; `id` is raw JSON (`null` when unknown).
pub fn error_response(
    id: Option<&str>,
    code: i64,
    message: &str,
    data: Option<&serde_json::Value>,
) -> Vec<u8> {
    let mut error = serde_json::json!({ "code": code, "message": message });
    if let Some(data) = data {
        error["data"] = data.clone();
    }
    let id = id.unwrap_or("null");
    let mut out = Vec::with_capacity(64 + id.len() + message.len());
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(b",\"error\":");
    // A Value built from strings and integers always serializes.
    serde_json::to_writer(&mut out, &error).unwrap_or_default();
    out.push(b'}');
    out
}

/// A notification message.
pub fn notification(method: &str, params: &serde_json::Value) -> Vec<u8> {
    let msg = serde_json::json!({ "jsonrpc": "2.0", "method": method, "params": params });
    serde_json::to_vec(&msg).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_borrowed() {
        let m = parse(br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x"}}"#)
            .unwrap();
        match m {
            Message::Request { id, method, params } => {
                assert_eq!(id.get(), "7");
                assert_eq!(method, "tools/call");
                assert_eq!(params.unwrap().get(), r#"{"name":"x"}"#);
            }
            _ => panic!(),
        }
    }

    #[test]
    fn faults() {
        let cases: &[(&[u8], i64)] = &[
            (b"{nope", PARSE_ERROR),
            (b"", PARSE_ERROR),
            (
                b"[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}]",
                INVALID_REQUEST,
            ),
            (b"42", INVALID_REQUEST),
            (b"\"x\"", INVALID_REQUEST),
            (
                br#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#,
                INVALID_REQUEST,
            ),
            (
                br#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#,
                INVALID_REQUEST,
            ),
            (
                br#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#,
                INVALID_REQUEST,
            ),
            (
                br#"{"jsonrpc":"2.0","id":{},"method":"ping"}"#,
                INVALID_REQUEST,
            ),
            // Beyond a 64-bit integer (found by fuzzing: no `Value` keeps it exactly).
            (
                br#"{"jsonrpc":"2.0","id":99999999999999999999,"method":"ping"}"#,
                INVALID_REQUEST,
            ),
            (br#"{"jsonrpc":"2.0","id":1}"#, INVALID_REQUEST),
            (br#"{"jsonrpc":"2.0","id":1,"method":7}"#, INVALID_REQUEST),
            (
                br#"{"jsonrpc":"2.0","id":1,"method":"x","params":3}"#,
                INVALID_REQUEST,
            ),
        ];
        for (bytes, code) in cases {
            let got = parse(bytes).unwrap_err();
            assert_eq!(got.code, *code, "{}", String::from_utf8_lossy(bytes));
        }
        // The id survives in faults where it is readable.
        for edge in ["-9223372036854775808", "9223372036854775807", "0"] {
            let text = format!(r#"{{"jsonrpc":"2.0","id":{edge},"method":"ping"}}"#);
            assert!(parse(text.as_bytes()).is_ok(), "{edge}");
        }
        let f = parse(br#"{"jsonrpc":"1.0","id":"a","method":"ping"}"#).unwrap_err();
        assert_eq!(f.id.unwrap().get(), "\"a\"");
    }

    #[test]
    fn notification_and_response() {
        assert!(matches!(
            parse(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).unwrap(),
            Message::Notification { .. }
        ));
        assert!(matches!(
            parse(br#"{"jsonrpc":"2.0","id":3,"result":{}}"#).unwrap(),
            Message::Response { .. }
        ));
    }

    #[test]
    fn escaped_method_is_owned() {
        let m = parse(br#"{"jsonrpc":"2.0","id":"x","method":"tools\/list"}"#).unwrap();
        let Message::Request { method, .. } = m else {
            panic!()
        };
        assert_eq!(method, "tools/list");
    }

    #[test]
    fn responses_splice() {
        let r = result_response("\"a\"", "{}");
        let v: serde_json::Value = serde_json::from_slice(&r).unwrap();
        assert_eq!(v["id"], "a");
        let e = error_response(None, PARSE_ERROR, "bad", None);
        let v: serde_json::Value = serde_json::from_slice(&e).unwrap();
        assert_eq!(v["id"], serde_json::Value::Null);
        assert_eq!(v["error"]["code"], PARSE_ERROR);
    }
}
