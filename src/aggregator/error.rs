//! Why an upstream request failed, as a stable code and a message that names the server.
//! The code becomes the RPC error's `kind`, which the gateway turns into the tool error's
//! `code` an agent reads. Messages never hold a credential or a request header.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamErrorCode {
    /// 401: the server wants (other) credentials.
    AuthRequired,
    /// 403.
    Forbidden,
    /// Connect, headers or body took longer than allowed.
    Timeout,
    /// Refused, unreachable, reset, TLS failed.
    ConnectFailed,
    /// The answer exceeds `[servers] max_body_bytes`.
    TooLarge,
    /// Not HTTP we understand, not JSON-RPC, not the answer to our request.
    BadResponse,
    /// Another HTTP status.
    HttpError,
    /// The server forgot our session (404 with a session id) and the request was not
    /// repeated (tool calls never are).
    SessionExpired,
    /// The server answered with a JSON-RPC error.
    UpstreamError,
    /// The server cannot be reached now; the last error is in the message.
    ServerDown,
    /// No server of that name is configured (or it is disabled).
    UnknownServer,
    /// Every thread and queue slot of that server is in use.
    Busy,
    /// The address policy refused the server's address.
    AddressRefused,
    /// A listing holds more than its budget allows (items, bytes of all pages, pages).
    OverBudget,
    /// Bad request from the gateway (e.g. arguments that are not JSON).
    InvalidArguments,
    /// Something in the worker itself.
    Internal,
}

impl UpstreamErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamErrorCode::AuthRequired => "auth_required",
            UpstreamErrorCode::Forbidden => "forbidden",
            UpstreamErrorCode::Timeout => "timeout",
            UpstreamErrorCode::ConnectFailed => "connect_failed",
            UpstreamErrorCode::TooLarge => "too_large",
            UpstreamErrorCode::BadResponse => "bad_response",
            UpstreamErrorCode::HttpError => "http_error",
            UpstreamErrorCode::SessionExpired => "session_expired",
            UpstreamErrorCode::UpstreamError => "upstream_error",
            UpstreamErrorCode::ServerDown => "server_down",
            UpstreamErrorCode::UnknownServer => "unknown_server",
            UpstreamErrorCode::Busy => "busy",
            UpstreamErrorCode::AddressRefused => "address_refused",
            UpstreamErrorCode::OverBudget => "over_budget",
            UpstreamErrorCode::InvalidArguments => "invalid_arguments",
            UpstreamErrorCode::Internal => "internal",
        }
    }

    /// Failures that say the server is unreachable (rather than that it answered badly):
    /// the connection manager should check it again.
    pub fn means_unreachable(self) -> bool {
        matches!(
            self,
            UpstreamErrorCode::ConnectFailed | UpstreamErrorCode::Timeout
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamError {
    pub code: UpstreamErrorCode,
    pub message: String,
    /// The HTTP status behind it, when there was one.
    pub status: Option<u16>,
    /// The JSON-RPC error code the server answered with, when it did.
    pub rpc_code: Option<i64>,
    /// A -32021 the agent reads as the server gave it: the error data to forward (see
    /// [`super::missing_capability`]).
    pub missing_capability: Option<String>,
}

impl UpstreamError {
    pub fn new(code: UpstreamErrorCode, message: impl Into<String>) -> UpstreamError {
        UpstreamError {
            code,
            message: message.into(),
            status: None,
            rpc_code: None,
            missing_capability: None,
        }
    }

    pub fn with_rpc_code(mut self, code: i64) -> UpstreamError {
        self.rpc_code = Some(code);
        self
    }

    pub fn with_status(mut self, status: u16) -> UpstreamError {
        self.status = Some(status);
        self
    }
}

impl fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

/// Upstream text quoted in an error or a log line: at most `max` characters, control
/// characters and every invisible or direction-changing one (bidi overrides and marks,
/// zero-width, tag characters, separators) escaped, so it cannot drive a terminal or hide
/// what follows.
pub fn quote_upstream(text: &str, max: usize) -> String {
    let mut out = String::new();
    for (n, c) in text.chars().enumerate() {
        if n == max {
            out.push('…');
            break;
        }
        // Controls, and every invisible or direction-changing character (tags, zero-width,
        // bidi marks, separators): what is on screen must be what was sent.
        if c.is_control() || crate::pins::visible::is_format(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_escapes_and_cuts() {
        assert_eq!(quote_upstream("a\x1b[31mb", 100), "a\\u{1b}[31mb");
        assert_eq!(quote_upstream("x\u{202E}y", 100), "x\\u{202e}y");
        assert_eq!(
            quote_upstream("a\u{E0041}\u{200B}b", 100),
            "a\\u{e0041}\\u{200b}b"
        );
        assert_eq!(quote_upstream("abcdef", 3), "abc…");
    }
}
