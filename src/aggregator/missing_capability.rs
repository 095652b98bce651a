//! An upstream's MissingRequiredClientCapabilityError (-32021): the call needs a client
//! capability (sampling, elicitation, roots) the agent did not declare. toolwall forwards
//! the agent's capabilities to the server, so this refusal is the agent's to read as the
//! server gave it: a 2026-07-28 agent gets the same JSON-RPC error (HTTP 400 on the modern
//! door), not a tool error result that would hide it; a legacy agent (the code is not in
//! its era) the tool error it always got. Only the capability names toolwall knows travel
//! on, so nothing else of the server's error data reaches the agent.

use serde_json::{Map, Value, json};

use super::error::UpstreamErrorCode;
use crate::workers::rpc::RpcError;

/// The JSON-RPC code (2026-07-28).
pub const CODE: i64 = -32021;
/// The RPC error `kind` the aggregator worker reports it with; its `message` is then JSON:
/// `{"requiredCapabilities": {...}, "message": "..."}` (known names only; the message as
/// any upstream error's, naming the server).
pub const KIND: &str = "missing_client_capability";
/// Client capabilities a server may require of the agent (and toolwall relays).
const KNOWN: &[&str] = &["sampling", "elicitation", "roots"];

/// The worker's report of a -32021 with `data` and `message` (toolwall's own, naming the
/// server): `None` when the data names no capability toolwall knows (then the error is
/// reported as any other upstream error).
pub fn report(data: Option<&Value>, message: &str) -> Option<String> {
    let required = data?.get("requiredCapabilities")?.as_object()?;
    let kept: Map<String, Value> = KNOWN
        .iter()
        .filter(|name| required.contains_key(**name))
        .map(|name| ((*name).to_owned(), json!({})))
        .collect();
    if kept.is_empty() {
        return None;
    }
    Some(json!({"requiredCapabilities": kept, "message": message}).to_string())
}

/// What the agent gets for the worker's report: a 2026-07-28 request gets the JSON-RPC
/// error (message and data) as the server gave it; a legacy one, where the code does not
/// exist, the upstream error it always got (`Err`, kind `upstream_error`).
pub fn for_agent(report: &str, modern: bool) -> Result<(String, Value), RpcError> {
    let parsed: Value = serde_json::from_str(report).unwrap_or_else(|_| json!({}));
    let upstream = parsed["message"].as_str().unwrap_or("").to_owned();
    if !modern {
        return Err(RpcError {
            kind: UpstreamErrorCode::UpstreamError.as_str().to_owned(),
            message: upstream,
        });
    }
    let required = parsed
        .get("requiredCapabilities")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let names: Vec<&str> = required
        .as_object()
        .map(|m| m.keys().map(String::as_str).collect())
        .unwrap_or_default();
    Ok((
        format!(
            "Missing required client capability: {} ({upstream})",
            names.join(", ")
        ),
        json!({"requiredCapabilities": required}),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_known_capability_names_travel_and_legacy_agents_get_the_upstream_error() {
        let data = json!({"requiredCapabilities": {"sampling": {"x": "secret"}, "evil\"": {}},
                          "other": "dropped"});
        let sent = report(Some(&data), "server s refused tools/call: no").unwrap();
        let (message, back) = for_agent(&sent, true).unwrap();
        assert!(
            message.contains("sampling") && message.contains("server s refused"),
            "{message}"
        );
        assert_eq!(back, json!({"requiredCapabilities": {"sampling": {}}}));
        let legacy = for_agent(&sent, false).unwrap_err();
        assert_eq!(legacy.kind, "upstream_error");
        assert_eq!(legacy.message, "server s refused tools/call: no");
        assert_eq!(
            report(Some(&json!({"requiredCapabilities": {"x": {}}})), "m"),
            None
        );
        assert_eq!(
            report(Some(&json!({"requiredCapabilities": ["sampling"]})), "m"),
            None
        );
        assert_eq!(report(None, "m"), None);
    }
}
