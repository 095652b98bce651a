//! The core's JSON-RPC answer turned into what an era expects on the wire.
//!
//! Legacy answers go out as the core wrote them, always with status 200. Modern results
//! gain the fields 2026-07-28 requires and the core does not know about: `resultType`,
//! `ttlMs` and `cacheScope` on cacheable results, and `serverInfo` in `_meta`. Fields the
//! core already set are kept. Only the top level of the result (and of its `_meta`) is
//! rewritten; nested values are copied as raw JSON, never re-encoded. Modern errors get the
//! HTTP status the spec gives their code.

use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;

use super::era::{
    CACHEABLE_METHODS, HEADER_MISMATCH, META_SERVER_INFO, MISSING_REQUIRED_CLIENT_CAPABILITY,
    UNSUPPORTED_PROTOCOL_VERSION,
};
use crate::mcp::jsonrpc;

/// A JSON object's members in order, values raw.
struct RawObject<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de: 'a, 'a> Deserialize<'de> for RawObject<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Members<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for Members<'a> {
            type Value = RawObject<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<RawObject<'a>, M::Error> {
                let mut members = Vec::new();
                while let Some(key) = map.next_key::<Cow<'a, str>>()? {
                    let value: &'a RawValue = map.next_value()?;
                    members.push((key, value));
                }
                Ok(RawObject(members))
            }
        }
        d.deserialize_map(Members(std::marker::PhantomData))
    }
}

impl RawObject<'_> {
    fn has(&self, key: &str) -> bool {
        self.0.iter().any(|(k, _)| k == key)
    }
}

fn push_key(out: &mut Vec<u8>, key: &str) {
    // A string always serializes.
    serde_json::to_writer(&mut *out, key).unwrap_or_default();
    out.push(b':');
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
    #[serde(default)]
    error: Option<ErrorCode>,
}

#[derive(Deserialize)]
struct ErrorCode {
    code: i64,
}

/// The HTTP status of a modern-era JSON-RPC error.
pub fn modern_error_status(code: i64) -> u16 {
    match code {
        jsonrpc::METHOD_NOT_FOUND => 404,
        jsonrpc::PARSE_ERROR
        | jsonrpc::INVALID_REQUEST
        | jsonrpc::INVALID_PARAMS
        | HEADER_MISMATCH
        | MISSING_REQUIRED_CLIENT_CAPABILITY
        | UNSUPPORTED_PROTOCOL_VERSION => 400,
        _ => 200,
    }
}

/// What a modern answer becomes: status and body.
#[derive(Debug, PartialEq, Eq)]
pub struct Wrapped {
    pub status: u16,
    pub body: Vec<u8>,
    /// Whether the answer was a result (not an error).
    pub is_result: bool,
}

/// The answer's `result.protocolVersion` (for `initialize`), if any.
pub fn result_protocol_version(answer: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Init {
        #[serde(rename = "protocolVersion")]
        protocol_version: String,
    }
    let env: Envelope = serde_json::from_slice(answer).ok()?;
    let result = env.result?;
    serde_json::from_str::<Init>(result.get())
        .ok()
        .map(|i| i.protocol_version)
}

/// Whether the answer is a JSON-RPC result (an error, or garbage, is not).
pub fn is_result(answer: &[u8]) -> bool {
    serde_json::from_slice::<Envelope>(answer).is_ok_and(|e| e.result.is_some())
}

/// Rewrite a modern-era answer to `method`. `Err` when the core's answer is not a JSON-RPC
/// response (a bug; the caller answers 500).
pub fn wrap_modern(method: &str, answer: &[u8], cache_ttl_ms: u64) -> Result<Wrapped, String> {
    let env: Envelope =
        serde_json::from_slice(answer).map_err(|e| format!("core answer is not JSON-RPC: {e}"))?;
    if let Some(error) = env.error {
        return Ok(Wrapped {
            status: modern_error_status(error.code),
            body: answer.to_vec(),
            is_result: false,
        });
    }
    let (Some(id), Some(result)) = (env.id, env.result) else {
        return Err("core answer has neither result nor error".to_owned());
    };
    let Ok(members) = serde_json::from_str::<RawObject>(result.get()) else {
        // A result that is not an object cannot carry the fields; pass it on as is.
        return Ok(Wrapped {
            status: 200,
            body: answer.to_vec(),
            is_result: true,
        });
    };
    let mut out = Vec::with_capacity(answer.len() + 192);
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.extend_from_slice(id.get().as_bytes());
    out.extend_from_slice(b",\"result\":{");
    let mut first = true;
    let mut sep = |out: &mut Vec<u8>| {
        if !std::mem::replace(&mut first, false) {
            out.push(b',');
        }
    };
    for (key, value) in &members.0 {
        sep(&mut out);
        push_key(&mut out, key);
        if key == "_meta" {
            write_meta(&mut out, value);
        } else {
            out.extend_from_slice(value.get().as_bytes());
        }
    }
    if !members.has("resultType") {
        sep(&mut out);
        out.extend_from_slice(b"\"resultType\":\"complete\"");
    }
    if let Some((_, scope)) = CACHEABLE_METHODS.iter().find(|(m, _)| *m == method) {
        if !members.has("ttlMs") {
            sep(&mut out);
            out.extend_from_slice(format!("\"ttlMs\":{cache_ttl_ms}").as_bytes());
        }
        if !members.has("cacheScope") {
            sep(&mut out);
            out.extend_from_slice(format!("\"cacheScope\":\"{scope}\"").as_bytes());
        }
    }
    if !members.has("_meta") {
        sep(&mut out);
        push_key(&mut out, "_meta");
        out.push(b'{');
        push_server_info(&mut out);
        out.push(b'}');
    }
    out.extend_from_slice(b"}}");
    Ok(Wrapped {
        status: 200,
        body: out,
        is_result: true,
    })
}

fn push_server_info(out: &mut Vec<u8>) {
    push_key(out, META_SERVER_INFO);
    out.extend_from_slice(
        format!(
            "{{\"name\":\"toolwall\",\"version\":\"{}\"}}",
            env!("CARGO_PKG_VERSION")
        )
        .as_bytes(),
    );
}

/// `_meta` as the core wrote it, with `serverInfo` added when missing.
fn write_meta(out: &mut Vec<u8>, meta: &RawValue) {
    let Ok(members) = serde_json::from_str::<RawObject>(meta.get()) else {
        out.extend_from_slice(meta.get().as_bytes());
        return;
    };
    if members.has(META_SERVER_INFO) {
        out.extend_from_slice(meta.get().as_bytes());
        return;
    }
    out.push(b'{');
    for (key, value) in &members.0 {
        push_key(out, key);
        out.extend_from_slice(value.get().as_bytes());
        out.push(b',');
    }
    push_server_info(out);
    out.push(b'}');
}

/// A JSON-RPC error body for a refusal decided before the core.
pub fn error_body(
    id: Option<&str>,
    code: i64,
    message: &str,
    data: Option<&serde_json::Value>,
) -> Vec<u8> {
    jsonrpc::error_response(id, code, message, data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn wrap(method: &str, answer: Value) -> (u16, Value) {
        let w = wrap_modern(method, answer.to_string().as_bytes(), 0).unwrap();
        (w.status, serde_json::from_slice(&w.body).unwrap())
    }

    #[test]
    fn list_results_gain_fields() {
        let (status, v) = wrap(
            "tools/list",
            json!({"jsonrpc":"2.0","id":3,"result":{"tools":[{"name":"local__echo","inputSchema":{"type":"object"}}]}}),
        );
        assert_eq!(status, 200);
        let r = &v["result"];
        assert_eq!(r["resultType"], "complete");
        assert_eq!(r["ttlMs"], 0);
        assert_eq!(r["cacheScope"], "private");
        assert_eq!(r["_meta"][META_SERVER_INFO]["name"], "toolwall");
        assert_eq!(r["tools"][0]["name"], "local__echo");
        assert_eq!(v["id"], 3);
    }

    #[test]
    fn existing_fields_are_kept() {
        let (_, v) = wrap(
            "server/discover",
            json!({"jsonrpc":"2.0","id":"d","result":{"resultType":"input_required","ttlMs":5,"_meta":{"a":1}}}),
        );
        let r = &v["result"];
        assert_eq!(r["resultType"], "input_required");
        assert_eq!(r["ttlMs"], 5);
        assert_eq!(r["cacheScope"], "public");
        assert_eq!(r["_meta"]["a"], 1);
        assert_eq!(
            r["_meta"][META_SERVER_INFO]["version"],
            env!("CARGO_PKG_VERSION")
        );
    }

    #[test]
    fn calls_get_result_type_only() {
        let (_, v) = wrap(
            "tools/call",
            json!({"jsonrpc":"2.0","id":1,"result":{"content":[],"isError":true}}),
        );
        assert_eq!(v["result"]["resultType"], "complete");
        assert!(v["result"].get("ttlMs").is_none());
        let (_, v) = wrap("x", json!({"jsonrpc":"2.0","id":1,"result":{}}));
        assert_eq!(v["result"]["resultType"], "complete");
    }

    #[test]
    fn error_statuses() {
        assert_eq!(
            wrap(
                "x",
                json!({"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"m"}})
            )
            .0,
            404
        );
        assert_eq!(
            wrap(
                "x",
                json!({"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"m"}})
            )
            .0,
            400
        );
        assert_eq!(
            wrap(
                "x",
                json!({"jsonrpc":"2.0","id":1,"error":{"code":-32003,"message":"m"}})
            )
            .0,
            200
        );
        assert!(wrap_modern("x", b"nonsense", 0).is_err());
    }

    #[test]
    fn escaped_keys_survive() {
        let answer = br#"{"jsonrpc":"2.0","id":1,"result":{"a\"b":"c\u00e9","tools":[]}}"#;
        let w = wrap_modern("tools/list", answer, 7).unwrap();
        let v: Value = serde_json::from_slice(&w.body).unwrap();
        assert_eq!(v["result"]["a\"b"], "cé");
        assert_eq!(v["result"]["ttlMs"], 7);
    }

    #[test]
    fn initialize_version() {
        assert_eq!(
            result_protocol_version(
                br#"{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18"}}"#
            )
            .as_deref(),
            Some("2025-06-18")
        );
        assert!(
            result_protocol_version(br#"{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":""}}"#)
                .is_none()
        );
        assert!(is_result(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#));
        assert!(!is_result(
            br#"{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":""}}"#
        ));
    }
}
