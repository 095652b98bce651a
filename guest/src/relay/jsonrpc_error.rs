//! JSON-RPC error responses the relay writes on its own behalf.

/// Invalid JSON.
pub const PARSE_ERROR: i32 = -32700;
/// Valid JSON that is not a request or notification object.
pub const INVALID_REQUEST: i32 = -32600;
/// The gateway broke the frame contract for one reply.
pub const INTERNAL_ERROR: i32 = -32603;
/// The transport failed: no connection, a dropped connection, or a line too long to frame.
pub const TRANSPORT_ERROR: i32 = -32001;

/// One error response line (no newline). `id` is raw JSON; `None` writes `null`.
pub fn error_line(id: Option<&str>, code: i32, message: &str) -> String {
    // Display of a JSON string value is its escaped form; it cannot fail.
    let message = serde_json::Value::from(message);
    format!(
        r#"{{"jsonrpc":"2.0","id":{},"error":{{"code":{code},"message":{message}}}}}"#,
        id.unwrap_or("null")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn well_formed_and_escaped() {
        let line = error_line(Some(r#""a\"b""#), TRANSPORT_ERROR, "quote \" and\nnewline");
        assert!(!line.contains('\n'));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["jsonrpc"], "2.0");
        assert_eq!(v["id"], "a\"b");
        assert_eq!(v["error"]["code"], -32001);
        assert_eq!(v["error"]["message"], "quote \" and\nnewline");
        let null: serde_json::Value =
            serde_json::from_str(&error_line(None, PARSE_ERROR, "x")).unwrap();
        assert!(null["id"].is_null());
    }
}
