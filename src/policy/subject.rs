//! What a rule can see of one message.

use serde_json::Value;

use super::config::Transport;

/// One message as the gateway presents it to the policy. Borrowed, so judging allocates
/// nothing for the message itself.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    /// The JSON-RPC method: `tools/call`, `resources/read`, `tools/list`, ...
    pub method: &'a str,
    /// The server the message is for (`local`, `github`, ...), when there is one.
    pub server: Option<&'a str>,
    /// The namespaced tool name `server__tool` of a `tools/call`.
    pub tool: Option<&'a str>,
    /// The URI of a `resources/read`.
    pub resource: Option<&'a str>,
    /// Who is calling: `uid:1000`, `cid:3`, a token's principal.
    pub principal: &'a str,
    pub transport: Transport,
    /// The calling process as the client names it.
    pub process: &'a str,
    /// The whole arguments object (never a preview); None when the message has none or
    /// the gateway did not parse them because no rule asks for them.
    pub arguments: Option<&'a Value>,
}
