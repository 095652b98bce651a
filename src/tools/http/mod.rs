//! TEMPORARY interface shim until the HTTP tools branch lands (replaced wholesale on merge).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpToolsConfig {
    pub extra_ports: Vec<u16>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct HttpFacts {
    pub url: String,
    pub resolved: Vec<String>,
    pub status: Option<u16>,
    pub outcome: String,
    pub redirects: Vec<String>,
}

pub struct ToolOutcome {
    pub result: serde_json::Value,
    pub facts: HttpFacts,
}

pub fn tool_definitions() -> Vec<serde_json::Value> {
    vec![]
}

pub fn call_tool(name: &str, _args: &serde_json::Value, _cfg: &HttpToolsConfig) -> ToolOutcome {
    ToolOutcome {
        result: serde_json::json!({"content":[{"type":"text","text":format!("{name} not built")}],"isError":true}),
        facts: HttpFacts::default(),
    }
}

pub fn tool_ports(cfg: &HttpToolsConfig) -> Vec<u16> {
    let mut p = vec![80, 443];
    p.extend(&cfg.extra_ports);
    p
}
