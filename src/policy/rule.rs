//! One rule, validated and compiled: patterns classified, regexes built, paths parsed, so
//! judging a message is a handful of comparisons.

use std::sync::Arc;

use regex::Regex;

use super::condition::{Condition, ResultView, compile_regex};
use super::config::{Action, AskVia, Phase, RuleConfig};
use super::path::ValuePath;
use super::pattern::Pattern;
use super::subject::Subject;

/// Longest rule id accepted, in bytes.
pub const MAX_RULE_ID_BYTES: usize = 128;

/// Which config a rule comes from. Ordered from lowest to highest layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Layer {
    Builtin,
    Operator,
    Corp,
}

impl Layer {
    pub fn as_str(self) -> &'static str {
        match self {
            Layer::Builtin => "builtin",
            Layer::Operator => "operator",
            Layer::Corp => "corp",
        }
    }
}

impl std::fmt::Display for Layer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `replace` of a rewrite rule.
#[derive(Debug, Clone)]
pub struct Rewrite {
    pub path: Option<ValuePath>,
    pub regex: Regex,
    pub with: String,
}

#[derive(Debug, Clone)]
pub struct Rule {
    /// Shared with every decision that names the rule (no copy per call).
    pub id: Arc<str>,
    /// None only for a disabled rule written without one (a pure "disable" override).
    pub action: Option<Action>,
    pub phase: Phase,
    pub reason: Option<Arc<str>>,
    /// What a decision by this rule says: `reason`, or "<verdict> by rule <id>" (built
    /// once here rather than formatted per call).
    pub decided_reason: Arc<str>,
    pub enabled: bool,
    pub locked: bool,
    pub layer: Layer,
    /// The file (or "built-in") the rule was read from.
    pub origin: String,
    method: Option<Pattern>,
    server: Option<Pattern>,
    tool: Option<Pattern>,
    resource: Option<Pattern>,
    principal: Option<Pattern>,
    process: Option<Pattern>,
    /// `Transport::bit`s; 0 = any transport.
    transports: u8,
    arg_present: Vec<ValuePath>,
    args: Vec<Condition>,
    results: Vec<Condition>,
    pub rewrite: Option<Rewrite>,
    /// Who answers this rule's `ask`.
    pub ask_via: AskVia,
}

/// True if `id` is a usable rule id: ASCII letters, digits and `_ - . : /`.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_RULE_ID_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.:/".contains(&b))
}

impl Rule {
    /// Validate and compile; every fault found is returned (messages name the key, not the
    /// rule: the caller adds file, line and id).
    pub fn compile(
        cfg: &RuleConfig,
        layer: Layer,
        origin: &str,
        max_regex: usize,
    ) -> Result<Rule, Vec<String>> {
        let mut faults = Vec::new();
        if !valid_id(&cfg.id) {
            faults.push(format!(
                "id must be 1 to {MAX_RULE_ID_BYTES} characters of A-Z a-z 0-9 _ - . : /"
            ));
        }
        if cfg.action.is_none() && cfg.enabled {
            faults.push("action is required (allow, ask, block or rewrite)".into());
        }
        if cfg.locked && layer != Layer::Corp {
            faults.push("locked = true has effect only in the corp config".into());
        }
        if cfg.ask_via.is_some() && cfg.action != Some(Action::Ask) {
            faults.push("ask_via is only for action = \"ask\"".into());
        }
        if cfg.ask_via == Some(AskVia::Client) && cfg.phase == Phase::Response {
            faults.push("ask_via = \"client\" needs phase = \"request\"".into());
        }
        if cfg.phase == Phase::Request && !cfg.result.is_empty() {
            faults.push("result conditions need phase = \"response\"".into());
        }
        match (cfg.action, &cfg.replace) {
            (Some(Action::Rewrite), None) => {
                faults.push("action = \"rewrite\" needs replace = { matches, with }".into())
            }
            (Some(a), Some(_)) if a != Action::Rewrite => faults.push(format!(
                "replace is only for action = \"rewrite\", not \"{a}\""
            )),
            _ => {}
        }

        let mut pattern = |key: &str, text: &Option<String>| match text {
            None => None,
            Some(t) => match Pattern::compile(t) {
                Ok(p) => Some(p),
                Err(e) => {
                    faults.push(format!("{key}: {e}"));
                    None
                }
            },
        };
        let method = pattern("method", &cfg.method);
        let server = pattern("server", &cfg.server);
        let tool = pattern("tool", &cfg.tool);
        let resource = pattern("resource", &cfg.resource);
        let principal = pattern("principal", &cfg.principal);
        let process = pattern("process", &cfg.process);

        let mut arg_present = Vec::new();
        for p in &cfg.arg_present {
            match ValuePath::parse(p) {
                Ok(p) => arg_present.push(p),
                Err(e) => faults.push(format!("arg_present: {e}")),
            }
        }
        let mut conditions = |what: &str, list: &[super::config::ValueCondition]| {
            let mut out = Vec::new();
            for c in list {
                match Condition::compile(c, what, max_regex) {
                    Ok(c) => out.push(c),
                    Err(e) => faults.push(e),
                }
            }
            out
        };
        let args = conditions("arg", &cfg.arg);
        let results = conditions("result", &cfg.result);

        let rewrite = match &cfg.replace {
            None => None,
            Some(r) => {
                let path = match r.path.as_deref().map(ValuePath::parse).transpose() {
                    Ok(p) => p,
                    Err(e) => {
                        faults.push(format!("replace.path: {e}"));
                        None
                    }
                };
                match compile_regex(&r.matches, max_regex) {
                    Ok(regex) => Some(Rewrite {
                        path,
                        regex,
                        with: r.with.clone(),
                    }),
                    Err(e) => {
                        faults.push(format!("replace.matches: {e}"));
                        None
                    }
                }
            }
        };

        if !faults.is_empty() {
            return Err(faults);
        }
        let decided_reason: Arc<str> = match (&cfg.reason, cfg.action.and_then(Action::verdict)) {
            (Some(reason), _) => reason.as_str().into(),
            (None, Some(verdict)) => format!("{verdict} by rule {}", cfg.id).into(),
            (None, None) => format!("by rule {}", cfg.id).into(),
        };
        Ok(Rule {
            id: cfg.id.as_str().into(),
            action: cfg.action,
            phase: cfg.phase,
            reason: cfg.reason.as_deref().map(Arc::from),
            decided_reason,
            enabled: cfg.enabled,
            locked: cfg.locked,
            layer,
            origin: origin.to_string(),
            method,
            server,
            tool,
            resource,
            principal,
            process,
            transports: cfg.transport.iter().fold(0, |bits, t| bits | t.bit()),
            arg_present,
            args,
            results,
            rewrite,
            ask_via: cfg.ask_via.unwrap_or_default(),
        })
    }

    /// Every match field holds for this message (and result, in the response phase).
    pub fn matches(&self, s: &Subject<'_>, result: Option<&ResultView<'_>>) -> bool {
        if !self.matches_caller(s) {
            return false;
        }
        if self.inspects_argument_values() {
            let Some(args) = s.arguments else {
                return false;
            };
            if !self.arg_present.iter().all(|p| p.resolve(args).is_some())
                || !self.args.iter().all(|c| c.holds_in(args))
            {
                return false;
            }
        }
        if !self.results.is_empty() {
            let Some(result) = result else {
                return false;
            };
            if !self.results.iter().all(|c| c.holds_in_result(result)) {
                return false;
            }
        }
        true
    }

    /// The name fields hold (method, tool, server, principal, process, resource,
    /// transport); argument and result conditions are not looked at.
    pub fn matches_caller(&self, s: &Subject<'_>) -> bool {
        // Cheapest and most selective first.
        (self.transports == 0 || self.transports & s.transport.bit() != 0)
            && self.method.as_ref().is_none_or(|p| p.is_match(s.method))
            && optional(&self.tool, s.tool)
            && optional(&self.server, s.server)
            && self
                .principal
                .as_ref()
                .is_none_or(|p| p.is_match(s.principal))
            && self.process.as_ref().is_none_or(|p| p.is_match(s.process))
            && optional(&self.resource, s.resource)
    }

    /// The rule could match some message of this method and tool (argument and result
    /// conditions aside).
    pub fn could_match(&self, method: &str, tool: Option<&str>) -> bool {
        self.method.as_ref().is_none_or(|p| p.is_match(method)) && optional(&self.tool, tool)
    }

    /// The rule has `arg` or `arg_present` conditions.
    pub fn inspects_argument_values(&self) -> bool {
        !self.arg_present.is_empty() || !self.args.is_empty()
    }

    /// The rule needs the arguments parsed: it tests them, or rewrites them.
    pub fn needs_arguments(&self) -> bool {
        self.inspects_argument_values()
            || (self.action == Some(Action::Rewrite) && self.phase == Phase::Request)
    }

    /// The rule has `result` conditions.
    pub fn inspects_result(&self) -> bool {
        !self.results.is_empty()
    }

    /// The rule has no match fields at all, so it matches every message of its phase.
    pub fn matches_everything(&self) -> bool {
        self.method.is_none()
            && self.server.is_none()
            && self.tool.is_none()
            && self.resource.is_none()
            && self.principal.is_none()
            && self.process.is_none()
            && self.transports == 0
            && !self.inspects_argument_values()
            && self.results.is_empty()
    }
}

/// A pattern on an optional field: absent pattern holds; a pattern on an absent value fails.
fn optional(pattern: &Option<Pattern>, value: Option<&str>) -> bool {
    match (pattern, value) {
        (None, _) => true,
        (Some(p), Some(v)) => p.is_match(v),
        (Some(_), None) => false,
    }
}
