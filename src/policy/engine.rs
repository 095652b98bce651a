//! The compiled policy and its decisions. Immutable once loaded: the gateway holds it in an
//! `Rc`/`Arc` and swaps the whole thing on reload.

use std::path::Path;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use serde_json::Value;

use super::condition::ResultView;
use super::config::{Action, AskVia, Phase, PolicyConfig, Transport, Verdict};
use super::error::PolicyError;
use super::layers::{self, CORP_CONFIG_ENV, DefaultSource};
use super::rule::{Layer, Rule};
use super::subject::Subject;

/// The reason given when no rule decides.
pub const DEFAULT_REASON: &str = "default";

/// [`DEFAULT_REASON`] as decisions carry it (one allocation per process, not per call).
static DEFAULT_REASON_SHARED: LazyLock<Arc<str>> = LazyLock::new(|| DEFAULT_REASON.into());

#[derive(Debug)]
pub struct Policy {
    /// Enabled request-phase rules, in id order.
    request: Vec<Rule>,
    /// Enabled response-phase rules, in id order.
    response: Vec<Rule>,
    /// Disabled rules, in id order (for `explain` and `check` only).
    disabled: Vec<Rule>,
    default: Verdict,
    default_source: DefaultSource,
    ask_timeout: Duration,
    origin: String,
    corp_file: Option<String>,
    warnings: Vec<String>,
    replacements: Vec<String>,
    /// The corp config allows asks answered at the client.
    client_asks: bool,
    /// Identifies the rules and defaults loaded (the same on every replica with the same
    /// files): what a client's approval is bound to.
    fingerprint: String,
}

/// One rule that matched a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatchedRule {
    pub id: Arc<str>,
    pub action: Action,
    pub phase: Phase,
    pub layer: Layer,
    pub reason: Option<Arc<str>>,
}

/// The outcome for one message in one phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub verdict: Verdict,
    /// The deciding rule: the first, in id order, of the most restrictive matching rules.
    /// None: no allow/ask/block rule matched and the default decided.
    pub rule: Option<Arc<str>>,
    /// The deciding rule's `reason` (or "<action> by rule <id>"), or "default".
    pub reason: Option<Arc<str>>,
    /// Every enabled rule that matched, rewrite rules included, in id order.
    pub matched: Vec<MatchedRule>,
    /// For an `ask`: who answers it. The client only when every matching `ask` rule says
    /// `ask_via = "client"` (and the corp config allows it); else the operator.
    pub ask_via: AskVia,
}

impl Decision {
    /// A rewrite rule of `phase` matched, so applying rewrites may change the message
    /// (callers keep a copy of the original only then).
    pub fn may_rewrite(&self, phase: Phase) -> bool {
        self.verdict != Verdict::Block
            && self
                .matched
                .iter()
                .any(|m| m.action == Action::Rewrite && m.phase == phase)
    }
}

impl Policy {
    /// Load the layers: built-in rules < `operator` (read from the file `origin` names) <
    /// the corp config (`TOOLWALL_CORP_CONFIG` when set and non-empty, else
    /// `operator.corp`). Warnings are logged; faults fail the load.
    pub fn load(operator: &PolicyConfig, origin: &str) -> Result<Policy, PolicyError> {
        let env = std::env::var_os(CORP_CONFIG_ENV);
        let policy = Policy::load_with_corp_env(operator, origin, env.as_deref().map(Path::new))?;
        for warning in &policy.warnings {
            crate::warn!("policy: {warning}");
        }
        Ok(policy)
    }

    /// `load` with the corp environment value given, not read: no logging, no globals.
    pub fn load_with_corp_env(
        operator: &PolicyConfig,
        origin: &str,
        corp_env: Option<&Path>,
    ) -> Result<Policy, PolicyError> {
        let layered = layers::resolve(operator, origin, corp_env)?;
        let fingerprint = fingerprint(&layered);
        let mut request = Vec::new();
        let mut response = Vec::new();
        let mut disabled = Vec::new();
        for rule in layered.rules {
            match (rule.enabled, rule.phase) {
                (false, _) => disabled.push(rule),
                (true, Phase::Request) => request.push(rule),
                (true, Phase::Response) => response.push(rule),
            }
        }
        Ok(Policy {
            request,
            response,
            disabled,
            default: layered.default,
            default_source: layered.default_source,
            ask_timeout: layered.ask_timeout,
            origin: origin.to_string(),
            corp_file: layered.corp_file,
            fingerprint,
            warnings: layered.warnings,
            replacements: layered.replacements,
            client_asks: layered.client_asks,
        })
    }

    fn rules_of(&self, phase: Phase) -> &[Rule] {
        match phase {
            Phase::Request => &self.request,
            Phase::Response => &self.response,
        }
    }

    /// Judge one message. `result` is the MCP result object in the response phase. Every
    /// enabled matching rule of the phase counts; the most restrictive wins
    /// (block > ask > allow); rewrite rules are listed but never decide.
    pub fn decide(&self, phase: Phase, subject: &Subject<'_>, result: Option<&Value>) -> Decision {
        let view = result.map(ResultView::new);
        let mut matched = Vec::new();
        let mut decider: Option<(Verdict, &Rule)> = None;
        let mut ask_via_client = true;
        for rule in self.rules_of(phase) {
            let Some(action) = rule.action else { continue };
            if !rule.matches(subject, view.as_ref()) {
                continue;
            }
            if action == Action::Ask && rule.ask_via != AskVia::Client {
                ask_via_client = false;
            }
            matched.push(MatchedRule {
                id: Arc::clone(&rule.id),
                action,
                phase,
                layer: rule.layer,
                reason: rule.reason.clone(),
            });
            if let Some(verdict) = action.verdict()
                && decider.is_none_or(|(best, _)| verdict > best)
            {
                decider = Some((verdict, rule));
            }
        }
        match decider {
            Some((verdict, rule)) => Decision {
                verdict,
                rule: Some(Arc::clone(&rule.id)),
                reason: Some(Arc::clone(&rule.decided_reason)),
                matched,
                ask_via: if verdict == Verdict::Ask && ask_via_client && self.client_asks {
                    AskVia::Client
                } else {
                    AskVia::Operator
                },
            },
            None => Decision {
                // The default decides requests; an answer to a request that was let through
                // is refused only by a rule that matches it.
                verdict: match phase {
                    Phase::Request => self.default,
                    Phase::Response => Verdict::Allow,
                },
                rule: None,
                reason: Some(Arc::clone(&DEFAULT_REASON_SHARED)),
                matched,
                ask_via: AskVia::Operator,
            },
        }
    }

    /// Whether `tools/list` should hide this tool from this caller: every call of it would
    /// be blocked whatever its arguments. True when an enabled block rule with no argument
    /// or result conditions matches a `tools/call` of it from this caller (in either
    /// phase), or when the default is block and no allow or ask rule could match such a call.
    pub fn hides_tool(
        &self,
        tool: &str,
        server: &str,
        principal: &str,
        transport: Transport,
        process: &str,
    ) -> bool {
        let call = Subject {
            method: "tools/call",
            server: Some(server),
            tool: Some(tool),
            resource: None,
            principal,
            transport,
            process,
            arguments: None,
        };
        let blocks_always = |rule: &Rule| {
            rule.action == Some(Action::Block)
                && !rule.inspects_argument_values()
                && !rule.inspects_result()
                && rule.matches_caller(&call)
        };
        if self.request.iter().chain(&self.response).any(blocks_always) {
            return true;
        }
        if self.default == Verdict::Block {
            let may_pass = self.request.iter().any(|rule| {
                matches!(rule.action, Some(Action::Allow | Action::Ask))
                    && rule.matches_caller(&call)
            });
            return !may_pass;
        }
        false
    }

    /// True if some enabled rule of `phase` that could match this method and tool tests
    /// the arguments (`arg`, `arg_present`) or, in the request phase, rewrites them. When
    /// false, the gateway may pass `arguments: None` and skip parsing them.
    pub fn wants_arguments(&self, phase: Phase, method: &str, tool: Option<&str>) -> bool {
        self.rules_of(phase)
            .iter()
            .any(|r| r.needs_arguments() && r.could_match(method, tool))
    }

    /// True if some enabled response-phase rule could match this method and tool. When
    /// false, the response phase can be skipped (the decision would be the default).
    pub fn has_response_rules(&self, method: &str, tool: Option<&str>) -> bool {
        self.response.iter().any(|r| r.could_match(method, tool))
    }

    /// True if some enabled response-phase rule that could match this method and tool tests
    /// or rewrites the result. When false, the response phase may be judged with
    /// `result: None`, without parsing the result.
    pub fn wants_result(&self, method: &str, tool: Option<&str>) -> bool {
        self.response.iter().any(|r| {
            (r.inspects_result() || r.action == Some(Action::Rewrite))
                && r.could_match(method, tool)
        })
    }

    /// A short hash of the rules and defaults in force (hex): equal on every replica that
    /// loaded the same policy, different after a reload that changed any rule.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// Whether the corp config allows `ask_via = "client"`.
    pub fn client_asks_allowed(&self) -> bool {
        self.client_asks
    }

    /// The verdict when no rule decides.
    pub fn default_verdict(&self) -> Verdict {
        self.default
    }

    /// Which layer set the default, and whether the corp config locked it.
    pub fn default_source(&self) -> DefaultSource {
        self.default_source
    }

    pub fn ask_timeout(&self) -> Duration {
        self.ask_timeout
    }

    /// Enabled rules, both phases.
    pub fn rule_count(&self) -> usize {
        self.request.len() + self.response.len()
    }

    /// Non-fatal findings of the load (also logged by `load`).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// "rule X at A is replaced by the one at B", one per replaced definition.
    pub fn replacements(&self) -> &[String] {
        &self.replacements
    }

    /// The operator config file this policy was loaded from.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The corp config file loaded, if any.
    pub fn corp_file(&self) -> Option<&str> {
        self.corp_file.as_deref()
    }

    /// Every rule, enabled or not, in id order.
    pub(crate) fn all_rules(&self) -> Vec<&Rule> {
        let mut all: Vec<&Rule> = self
            .request
            .iter()
            .chain(&self.response)
            .chain(&self.disabled)
            .collect();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        all
    }

    /// Disabled rules that would match this message (for `explain`).
    pub(crate) fn disabled_matching(
        &self,
        phase: Phase,
        subject: &Subject<'_>,
        result: Option<&Value>,
    ) -> Vec<&Rule> {
        let view = result.map(ResultView::new);
        self.disabled
            .iter()
            .filter(|r| r.phase == phase && r.action.is_some() && r.matches(subject, view.as_ref()))
            .collect()
    }

    /// The enabled rule of `phase` with this id.
    pub(crate) fn rule(&self, phase: Phase, id: &str) -> Option<&Rule> {
        let rules = self.rules_of(phase);
        rules
            .binary_search_by(|r| (*r.id).cmp(id))
            .ok()
            .map(|i| &rules[i])
    }
}

/// The rules as compiled (patterns, conditions, actions, layers, origins), the default and
/// the ask timeout, hashed: the policy's identity.
fn fingerprint(layered: &layers::Layered) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for rule in &layered.rules {
        h.update(format!("{rule:?}").as_bytes());
        h.update(b"\n");
    }
    h.update(
        format!(
            "{:?}|{:?}|{}",
            layered.default, layered.ask_timeout, layered.client_asks
        )
        .as_bytes(),
    );
    h.finalize()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
