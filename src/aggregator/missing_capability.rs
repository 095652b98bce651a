//! An upstream's MissingRequiredClientCapabilityError (-32021): the call needs a client
//! capability (sampling, elicitation, roots) the agent did not declare. toolwall forwards
//! the agent's capabilities to the server, so this refusal is the agent's to read as the
//! server gave it: the same JSON-RPC error (HTTP 400 on the modern door), not a tool error
//! result that would hide it. Only the capability names toolwall knows travel on, so
//! nothing else of the server's error data reaches the agent.

use serde_json::{Map, Value, json};

/// The JSON-RPC code (2026-07-28).
pub const CODE: i64 = -32021;
/// The RPC error `kind` the aggregator worker reports it with; its `message` is then the
/// error's `data` as JSON (`{"requiredCapabilities": {...}}`, known names only).
pub const KIND: &str = "missing_client_capability";
/// Client capabilities a server may require of the agent (and toolwall relays).
const KNOWN: &[&str] = &["sampling", "elicitation", "roots"];

/// The error data to forward for a -32021 with `data`: its `requiredCapabilities`, known
/// names only, each as `{}`. `None` when it names none of them (then the error is
/// reported as any other upstream error).
pub fn forwarded_data(data: Option<&Value>) -> Option<String> {
    let required = data?.get("requiredCapabilities")?.as_object()?;
    let kept: Map<String, Value> = KNOWN
        .iter()
        .filter(|name| required.contains_key(**name))
        .map(|name| ((*name).to_owned(), json!({})))
        .collect();
    if kept.is_empty() {
        return None;
    }
    Some(json!({"requiredCapabilities": kept}).to_string())
}

/// The agent's JSON-RPC error from the worker's report: message and data.
pub fn agent_error(reported: &str) -> (String, Value) {
    let data: Value = serde_json::from_str(reported).unwrap_or_else(|_| json!({}));
    let names: Vec<&str> = data["requiredCapabilities"]
        .as_object()
        .map(|m| m.keys().map(String::as_str).collect())
        .unwrap_or_default();
    (
        format!(
            "Missing required client capability: {} (the server needs it for this request)",
            names.join(", ")
        ),
        data,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_known_capability_names_travel() {
        let data = json!({"requiredCapabilities": {"sampling": {"x": "secret"}, "evil\"": {}},
                          "other": "dropped"});
        let fwd = forwarded_data(Some(&data)).unwrap();
        assert_eq!(fwd, r#"{"requiredCapabilities":{"sampling":{}}}"#);
        let (message, back) = agent_error(&fwd);
        assert!(message.contains("sampling"), "{message}");
        assert_eq!(back["requiredCapabilities"]["sampling"], json!({}));
        assert_eq!(
            forwarded_data(Some(&json!({"requiredCapabilities": {"x": {}}}))),
            None
        );
        assert_eq!(
            forwarded_data(Some(&json!({"requiredCapabilities": ["sampling"]}))),
            None
        );
        assert_eq!(forwarded_data(None), None);
    }
}
