//! Refusals and failures of a `tools/call`, as a result the model can read:
//! `isError: true`, the error as JSON text, and the same in `structuredContent.error`.

use serde_json::{Value, json};

/// Stable codes an agent (and an operator) can rely on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolErrorCode {
    PolicyBlocked,
    AskDenied,
    AskTimeout,
    WorkerUnavailable,
    Timeout,
    PinChanged,
    LedgerUnavailable,
    ShuttingDown,
    InvalidArguments,
    /// An answer larger than a door may carry.
    TooLarge,
    /// A bound on what is in flight toward a server was reached (`servers.max_queued_bytes`).
    Busy,
    Internal,
}

impl ToolErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ToolErrorCode::PolicyBlocked => "policy_blocked",
            ToolErrorCode::AskDenied => "ask_denied",
            ToolErrorCode::AskTimeout => "ask_timeout",
            ToolErrorCode::WorkerUnavailable => "worker_unavailable",
            ToolErrorCode::Timeout => "timeout",
            ToolErrorCode::PinChanged => "pin_changed",
            ToolErrorCode::LedgerUnavailable => "ledger_unavailable",
            ToolErrorCode::ShuttingDown => "shutting_down",
            ToolErrorCode::InvalidArguments => "invalid_arguments",
            ToolErrorCode::TooLarge => "too_large",
            ToolErrorCode::Busy => "busy",
            ToolErrorCode::Internal => "internal",
        }
    }

    /// The JSON-RPC code the same refusal would carry as a protocol error.
    pub fn mcp_error_code(self) -> i64 {
        use crate::mcp::jsonrpc::*;
        match self {
            ToolErrorCode::PolicyBlocked
            | ToolErrorCode::AskDenied
            | ToolErrorCode::AskTimeout
            | ToolErrorCode::PinChanged => POLICY_BLOCKED,
            ToolErrorCode::WorkerUnavailable | ToolErrorCode::Timeout | ToolErrorCode::Busy => {
                TRANSPORT_ERROR
            }
            ToolErrorCode::LedgerUnavailable => LEDGER_UNAVAILABLE,
            ToolErrorCode::ShuttingDown => SHUTTING_DOWN,
            ToolErrorCode::InvalidArguments => INVALID_PARAMS,
            ToolErrorCode::TooLarge => INTERNAL_ERROR,
            ToolErrorCode::Internal => INTERNAL_ERROR,
        }
    }
}

/// The CallToolResult for a refusal. `code` may be one of [`ToolErrorCode`] or a tool's
/// own code (the HTTP tools' `address_refused`, ...).
pub fn tool_error_result(
    code: &str,
    mcp_error_code: i64,
    message: &str,
    rule: Option<&str>,
) -> Value {
    let mut error = json!({
        "code": code,
        "mcp_error_code": mcp_error_code,
        "message": message,
    });
    if let Some(rule) = rule {
        error["rule"] = json!(rule);
    }
    let text = error.to_string();
    json!({
        "content": [{ "type": "text", "text": text }],
        "isError": true,
        "structuredContent": { "error": error },
    })
}

pub fn refusal(code: ToolErrorCode, message: &str, rule: Option<&str>) -> Value {
    tool_error_result(code.as_str(), code.mcp_error_code(), message, rule)
}
