//! `toolwall policy check`: load every layer and say precisely what is wrong, or what is in
//! force. Pure: returns the text to print and the exit code.

use std::fmt::Write;
use std::path::Path;

use super::config::PolicyConfig;
use super::engine::Policy;
use super::layers::CORP_CONFIG_ENV;
use super::rule::Layer;

/// Exit code of a check that found faults.
pub const CHECK_FAILED: i32 = 1;

/// Check the policy as `serve` would load it (`TOOLWALL_CORP_CONFIG` included). Exit code 0
/// when it loads, `CHECK_FAILED` with one line per fault otherwise.
pub fn check_report(cfg: &PolicyConfig, origin: &str) -> (String, i32) {
    let env = std::env::var_os(CORP_CONFIG_ENV);
    check_report_with_corp_env(cfg, origin, env.as_deref().map(Path::new))
}

/// `check_report` with the corp environment value given, not read.
pub fn check_report_with_corp_env(
    cfg: &PolicyConfig,
    origin: &str,
    corp_env: Option<&Path>,
) -> (String, i32) {
    let policy = match Policy::load_with_corp_env(cfg, origin, corp_env) {
        Ok(policy) => policy,
        Err(error) => {
            let faults = error.faults();
            let mut out = format!(
                "policy check failed: {} fault{}\n",
                faults.len(),
                if faults.len() == 1 { "" } else { "s" }
            );
            for fault in faults {
                let _ = writeln!(out, "  {fault}");
            }
            return (out, CHECK_FAILED);
        }
    };
    (summary(&policy), 0)
}

fn summary(policy: &Policy) -> String {
    let rules = policy.all_rules();
    let count = |layer: Layer| {
        rules
            .iter()
            .filter(|r| r.enabled && r.layer == layer)
            .count()
    };
    let disabled = rules.iter().filter(|r| !r.enabled).count();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "policy OK: {} rules in force ({} built-in, {} operator, {} corp), {} disabled",
        policy.rule_count(),
        count(Layer::Builtin),
        count(Layer::Operator),
        count(Layer::Corp),
        disabled
    );
    let _ = writeln!(out, "operator config: {}", policy.origin());
    if let Some(corp) = policy.corp_file() {
        let _ = writeln!(out, "corp config: {corp}");
    }
    let source = policy.default_source();
    let _ = writeln!(
        out,
        "default: {} (set by {}{}); ask timeout: {} s",
        policy.default_verdict(),
        match source.layer {
            Layer::Builtin => "nobody: built-in",
            other => other.as_str(),
        },
        if source.locked { ", locked" } else { "" },
        policy.ask_timeout().as_secs()
    );
    if !rules.is_empty() {
        let width = rules.iter().map(|r| r.id.len()).max().unwrap_or(0);
        let _ = writeln!(out, "rules, in decision order:");
        for rule in &rules {
            let mut flags = String::new();
            if rule.locked {
                flags.push_str(" locked");
            }
            if !rule.enabled {
                flags.push_str(" disabled");
            }
            let line = format!(
                "  {:width$}  {:7}  {:8}  {:8}{}",
                rule.id,
                rule.action.map_or("-", |a| a.as_str()),
                rule.phase.as_str(),
                rule.layer.as_str(),
                flags,
            );
            let _ = writeln!(out, "{}", line.trim_end());
        }
    }
    if !policy.replacements().is_empty() {
        let _ = writeln!(out, "replaced:");
        for line in policy.replacements() {
            let _ = writeln!(out, "  {line}");
        }
    }
    if !policy.warnings().is_empty() {
        let _ = writeln!(out, "warnings:");
        for line in policy.warnings() {
            let _ = writeln!(out, "  {line}");
        }
    }
    out
}
