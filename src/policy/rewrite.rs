//! Rewrite rules: `replace = { path?, matches, with }` applied to the arguments (request
//! phase) or the result (response phase) of a call that goes ahead.
//!
//! Targets:
//! - with `path`: the string at that path (a path that does not resolve, or a value that is
//!   not a string, is left alone);
//! - request phase without `path`: every string anywhere in the arguments;
//! - response phase without `path`: the result's text: `content[].text`,
//!   `content[].resource.text`, `contents[].text`, and every string in `structuredContent`
//!   (so a redaction reaches both forms of a tool's output).
//!
//! Object keys are never rewritten. Rules judge the message as it arrived; rewrites come
//! after the decision, in rule-id order, each seeing the previous one's output; the gateway
//! then judges the rewritten message again (a rewrite must not assemble what a block rule
//! refuses).

use serde_json::Value;

use super::config::{Action, Phase, Verdict};
use super::engine::{Decision, Policy};
use super::rule::Rewrite;

impl Policy {
    /// Apply the request-phase rewrite rules of `decision` to `args`. Does nothing for a
    /// block; call it for an allow, or for an ask once approved (never for a denied ask).
    /// Returns the ids of the rules that changed something. Use the policy that decided.
    pub fn rewrite_arguments(&self, decision: &Decision, args: &mut Value) -> Vec<String> {
        self.apply_rewrites(Phase::Request, decision, args)
    }

    /// Apply the response-phase rewrite rules of `decision` to the MCP result object.
    /// Same conditions and return as `rewrite_arguments`.
    pub fn rewrite_result(&self, decision: &Decision, result: &mut Value) -> Vec<String> {
        self.apply_rewrites(Phase::Response, decision, result)
    }

    fn apply_rewrites(&self, phase: Phase, decision: &Decision, target: &mut Value) -> Vec<String> {
        let mut applied = Vec::new();
        if decision.verdict == Verdict::Block {
            return applied;
        }
        for matched in &decision.matched {
            if matched.action != Action::Rewrite || matched.phase != phase {
                continue;
            }
            let Some(rewrite) = self
                .rule(phase, &matched.id)
                .and_then(|r| r.rewrite.as_ref())
            else {
                continue;
            };
            if apply(rewrite, phase, target) {
                applied.push(matched.id.to_string());
            }
        }
        applied
    }
}

/// Apply one rewrite; true if anything changed.
fn apply(rewrite: &Rewrite, phase: Phase, target: &mut Value) -> bool {
    if let Some(path) = &rewrite.path {
        return path
            .resolve_mut(target)
            .is_some_and(|v| replace_in(rewrite, v));
    }
    match phase {
        Phase::Request => every_string(target, |s| replace_in(rewrite, s)),
        Phase::Response => {
            let mut changed = false;
            let Value::Object(result) = target else {
                return false;
            };
            for key in ["content", "contents"] {
                if let Some(Value::Array(items)) = result.get_mut(key) {
                    for item in items {
                        if let Some(text) = item.get_mut("text") {
                            changed |= replace_in(rewrite, text);
                        }
                        if let Some(text) = item.get_mut("resource").and_then(|r| r.get_mut("text"))
                        {
                            changed |= replace_in(rewrite, text);
                        }
                    }
                }
            }
            if let Some(structured) = result.get_mut("structuredContent") {
                changed |= every_string(structured, |s| replace_in(rewrite, s));
            }
            changed
        }
    }
}

/// Replace in `value` if it is a string; true if it changed.
fn replace_in(rewrite: &Rewrite, value: &mut Value) -> bool {
    let Value::String(s) = value else {
        return false;
    };
    let replaced = match rewrite.regex.replace_all(s, rewrite.with.as_str()) {
        std::borrow::Cow::Borrowed(_) => return false,
        std::borrow::Cow::Owned(new) => new,
    };
    if replaced == *s {
        return false;
    }
    *s = replaced;
    true
}

/// Call `f` on every string value under `root` (an explicit stack: no depth limit needed);
/// true if any call returned true.
fn every_string(root: &mut Value, mut f: impl FnMut(&mut Value) -> bool) -> bool {
    let mut changed = false;
    let mut pending: Vec<&mut Value> = vec![root];
    while let Some(here) = pending.pop() {
        match here {
            Value::Object(map) => pending.extend(map.values_mut()),
            Value::Array(items) => pending.extend(items.iter_mut()),
            s @ Value::String(_) => changed |= f(s),
            _ => {}
        }
    }
    changed
}
