//! The policy engine (sans-IO): layered rules judge every message in two phases (request,
//! response); the most restrictive matching rule wins (block > ask > allow); rewrite rules
//! change arguments or results of calls that go ahead. The rule language is described for
//! operators in `src/policy/README.md`.
//!
//! Use: `Policy::load` once per (re)load; per message, `decide`, then `rewrite_*` when the
//! call goes ahead. `wants_arguments` / `wants_result` / `has_response_rules` let the
//! gateway skip parsing what no rule looks at; `hides_tool` filters `tools/list`.

mod builtin;
mod check;
mod condition;
mod config;
mod engine;
mod error;
mod explain;
mod layers;
mod path;
mod pattern;
mod rewrite;
mod rule;
mod subject;

#[cfg(test)]
mod tests;

pub use builtin::{BUILTIN_ORIGIN, BUILTIN_RULES_TOML};
pub use check::{CHECK_FAILED, check_report, check_report_with_corp_env};
pub use config::{
    Action, AskVia, CorpFile, CorpPolicyConfig, DEFAULT_ASK_TIMEOUT_SECS, DEFAULT_MAX_REGEX_BYTES,
    MAX_ASK_TIMEOUT_SECS, Phase, PolicyConfig, ReplaceConfig, RuleConfig, Transport,
    ValueCondition, Verdict,
};
pub use engine::{DEFAULT_REASON, Decision, MatchedRule, Policy};
pub use error::PolicyError;
pub use explain::{ExplainQuery, explain};
pub use layers::{CORP_CONFIG_ENV, DefaultSource};
pub use path::{MAX_PATH_BYTES, ValuePath};
pub use rule::{Layer, MAX_RULE_ID_BYTES};
pub use subject::Subject;
