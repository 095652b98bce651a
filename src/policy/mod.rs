//! TEMPORARY interface shim until the policy branch lands (replaced wholesale on merge).

use serde::Deserialize;

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    #[default]
    Allow,
    Ask,
    Block,
    Rewrite,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    pub default: Action,
    pub ask_timeout_secs: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    Vsock,
    Unix,
    Stdio,
    Http,
}

impl Transport {
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Vsock => "vsock",
            Transport::Unix => "unix",
            Transport::Stdio => "stdio",
            Transport::Http => "http",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Request,
    Response,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    Allow,
    Ask,
    Block,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    Builtin,
    Operator,
    Corp,
}

pub struct Subject<'a> {
    pub method: &'a str,
    pub server: Option<&'a str>,
    pub tool: Option<&'a str>,
    pub resource: Option<&'a str>,
    pub principal: &'a str,
    pub transport: Transport,
    pub process: &'a str,
    pub arguments: Option<&'a serde_json::Value>,
}

#[derive(Debug, Clone)]
pub struct MatchedRule {
    pub id: String,
    pub action: Action,
    pub phase: Phase,
    pub layer: Layer,
    pub reason: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Decision {
    pub verdict: Verdict,
    pub rule: Option<String>,
    pub reason: Option<String>,
    pub matched: Vec<MatchedRule>,
}

#[derive(Debug)]
pub struct PolicyError(pub String);
impl std::fmt::Display for PolicyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

pub struct Policy {
    default: Verdict,
}

impl Policy {
    pub fn load(operator: &PolicyConfig, _origin: &str) -> Result<Policy, PolicyError> {
        let default = match operator.default {
            Action::Block => Verdict::Block,
            Action::Ask => Verdict::Ask,
            _ => Verdict::Allow,
        };
        Ok(Policy { default })
    }
    pub fn decide(
        &self,
        _phase: Phase,
        _subject: &Subject,
        _result: Option<&serde_json::Value>,
    ) -> Decision {
        Decision {
            verdict: self.default,
            rule: None,
            reason: Some("default".into()),
            matched: vec![],
        }
    }
    pub fn hides_tool(
        &self,
        _tool: &str,
        _server: &str,
        _principal: &str,
        _transport: Transport,
        _process: &str,
    ) -> bool {
        false
    }
    pub fn wants_arguments(&self, _phase: Phase, _method: &str, _tool: Option<&str>) -> bool {
        false
    }
    pub fn has_response_rules(&self, _method: &str, _tool: Option<&str>) -> bool {
        false
    }
    pub fn rewrite_arguments(
        &self,
        _decision: &Decision,
        _args: &mut serde_json::Value,
    ) -> Vec<String> {
        vec![]
    }
    pub fn rewrite_result(
        &self,
        _decision: &Decision,
        _result: &mut serde_json::Value,
    ) -> Vec<String> {
        vec![]
    }
    pub fn default_verdict(&self) -> Verdict {
        self.default
    }
    pub fn ask_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(120)
    }
    pub fn rule_count(&self) -> usize {
        0
    }
}

pub fn check_report(_cfg: &PolicyConfig, origin: &str) -> (String, i32) {
    (format!("{origin}: ok"), 0)
}

pub struct ExplainQuery {
    pub tool: String,
    pub args: Option<serde_json::Value>,
    pub principal: String,
    pub transport: Transport,
    pub process: String,
    pub phase: Phase,
    pub result: Option<serde_json::Value>,
    pub method: String,
}

pub fn explain(_policy: &Policy, q: &ExplainQuery) -> String {
    format!("{}: allow (default)", q.tool)
}
