//! Protocol versions and the answers of the lifecycle methods.

use serde_json::{Value, json};

/// Legacy-era versions (initialize handshake), newest first.
pub const LEGACY_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];
/// The newest version a legacy `initialize` can negotiate.
pub const NEWEST_LEGACY: &str = LEGACY_VERSIONS[0];

/// What the server tells clients about itself.
pub const INSTRUCTIONS: &str =
    "toolwall is an MCP firewall: every call is checked by policy and recorded before it runs.";

/// The version `initialize` answers with: the one asked for when supported, else the newest.
pub fn negotiate(requested: Option<&str>) -> &'static str {
    requested
        .and_then(|r| LEGACY_VERSIONS.iter().copied().find(|v| *v == r))
        .unwrap_or(NEWEST_LEGACY)
}

/// The `initialize` result. Only capabilities toolwall has are declared: tools, resources,
/// prompts; `listChanged` only where the door can carry `notifications/tools/list_changed`
/// (framed and stdio; the HTTP door opens no stream for server messages).
pub fn initialize_result(version: &str, list_changed: bool) -> Value {
    json!({
        "protocolVersion": version,
        "capabilities": {
            "tools": { "listChanged": list_changed },
            "resources": {},
            "prompts": {},
            // logging/setLevel sets the lowest level of the servers' log messages relayed
            // during this client's calls.
            "logging": {}
        },
        "serverInfo": {
            "name": "toolwall",
            "version": env!("CARGO_PKG_VERSION"),
        },
        "instructions": INSTRUCTIONS
    })
}

/// The `initialize` request's `protocolVersion`, if it has one.
pub fn requested_version(params: Option<&serde_json::value::RawValue>) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct InitParams {
        #[serde(rename = "protocolVersion")]
        protocol_version: Option<String>,
    }
    let params = params?;
    serde_json::from_str::<InitParams>(params.get())
        .ok()?
        .protocol_version
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echoes_supported_and_falls_back() {
        for v in LEGACY_VERSIONS {
            assert_eq!(negotiate(Some(v)), *v);
        }
        assert_eq!(negotiate(Some("1999-01-01")), NEWEST_LEGACY);
        assert_eq!(negotiate(None), NEWEST_LEGACY);
    }
}
