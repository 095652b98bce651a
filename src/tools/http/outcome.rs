//! What a tool call hands back: the MCP result for the agent and the facts for the ledger.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The result of one tool call.
#[derive(Debug, Clone)]
pub struct ToolOutcome {
    /// An MCP `CallToolResult`: `{content: [{type: "text", text}], isError?, structuredContent?}`.
    pub result: Value,
    /// What happened on the network, for the ledger.
    pub facts: HttpFacts,
}

/// Network facts of one call, recorded in the ledger.
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct HttpFacts {
    /// The URL the agent asked for.
    pub url: String,
    /// Per hop, the address connected to; for a hop refused by the address policy, every
    /// address its host resolved to.
    pub resolved: Vec<String>,
    /// The status of the last response received.
    pub status: Option<u16>,
    /// "ok", or the error code of the refusal.
    pub outcome: String,
    /// The URLs redirected to, in order.
    pub redirects: Vec<String>,
}

/// Why a call was refused; the `code` an agent sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    AddressRefused,
    Timeout,
    TooLarge,
    UnsupportedContent,
    HttpError,
    InvalidArguments,
    ConnectFailed,
    /// The worker could not finish the call (a resource limit); not the agent's fault.
    InternalError,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::AddressRefused => "address_refused",
            ErrorCode::Timeout => "timeout",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::UnsupportedContent => "unsupported_content",
            ErrorCode::HttpError => "http_error",
            ErrorCode::InvalidArguments => "invalid_arguments",
            ErrorCode::ConnectFailed => "connect_failed",
            ErrorCode::InternalError => "internal_error",
        }
    }
}

/// A refusal: code and a message for the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolError {
    pub code: ErrorCode,
    pub message: String,
}

impl ToolError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ToolError {
        ToolError {
            code,
            message: message.into(),
        }
    }
}

/// An error result: text, `isError`, and the code in `structuredContent`.
pub fn error_result(err: &ToolError) -> Value {
    json!({
        "content": [{"type": "text", "text": format!("{}: {}", err.code.as_str(), err.message)}],
        "isError": true,
        "structuredContent": {"error": {"code": err.code.as_str(), "message": err.message}},
    })
}

/// A successful result: the text and its metadata.
pub fn success_result(text: String, structured: Value) -> Value {
    json!({
        "content": [{"type": "text", "text": text}],
        "structuredContent": structured,
    })
}
