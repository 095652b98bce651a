//! What the gateway hands the ledger about one call. Borrowed, so building one costs
//! nothing; the ledger copies what it keeps when the record is staged.

/// The `decision` values of `tool_calls`.
pub mod decision {
    /// Policy allowed the call (or a human approved it); it was or will be sent to the tool.
    pub const ALLOWED: &str = "allowed";
    /// Policy blocked it, or a human denied it, or an ask timed out.
    pub const DENIED: &str = "denied";
    /// Allowed, but no usable answer came back (worker gone, timeout, tool error, ledger).
    pub const ERROR: &str = "error";
    /// Held by an `ask` rule, waiting for a human.
    pub const PENDING: &str = "pending";
    /// The client cancelled it (`notifications/cancelled`, or a modern-era HTTP client
    /// closed its connection); the tool was told, and no answer was sent.
    pub const CANCELLED: &str = "cancelled";
}

/// A `tools/call` (or another audited request) as dispatched: becomes a `tool_calls` row.
#[derive(Debug, Clone, Copy)]
pub struct CallStart<'a> {
    /// From [`Ledger::new_call_id`](super::Ledger::new_call_id).
    pub id: i64,
    pub ts_ms: i64,
    pub transport: &'a str,
    pub principal: &'a str,
    pub process_name: &'a str,
    pub server_name: &'a str,
    /// The tool's own name at its server, without the `server__` namespace.
    pub tool_name: &'a str,
    pub method: &'a str,
    /// The JSON-RPC id as JSON text (`7`, `"abc"`).
    pub request_id: &'a str,
    /// `allowed`, `denied`, `error` or `pending` (see [`decision`]).
    pub decision: &'a str,
    pub policy_rule: Option<&'a str>,
    pub policy_reason: Option<&'a str>,
    pub bytes_received: usize,
    /// Full JSON text of the arguments: the `arguments` column gets a preview, the blob the
    /// whole (capped) body. Empty: no arguments, no blob.
    pub arguments: &'a [u8],
}

/// How a call ended: updates its `tool_calls` row.
#[derive(Debug, Clone, Copy)]
pub struct CallEnd<'a> {
    /// The final decision; replaces the one staged at start.
    pub decision: &'a str,
    /// `None` keeps the rule and reason recorded at start.
    pub policy_rule: Option<&'a str>,
    pub policy_reason: Option<&'a str>,
    pub duration_us: u64,
    pub error_message: Option<&'a str>,
    pub bytes_sent: usize,
    /// Full JSON text of the response the agent got. Empty: none.
    pub response: &'a [u8],
    /// The arguments the tool got, when a rewrite rule changed them.
    pub rewritten_arguments: Option<&'a [u8]>,
    /// The tool's response, when the agent got something else (blocked or rewritten).
    pub original_response: Option<&'a [u8]>,
    /// Who approved or denied an `ask`.
    pub approved_by: Option<&'a str>,
    pub decided_at_ms: Option<i64>,
}
