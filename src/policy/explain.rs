//! `toolwall policy explain`: judge one described message and show the decision, every rule
//! that matched (with its action, layer and reason), what rewrites would do, and whether
//! `tools/list` hides the tool. Pure: returns the text to print.

use std::fmt::Write;

use serde_json::Value;

use super::config::{Phase, Transport, Verdict};
use super::engine::Policy;
use super::rule::Layer;
use super::subject::Subject;

/// One message to explain, as the operator describes it on the command line.
#[derive(Debug, Clone)]
pub struct ExplainQuery {
    /// The namespaced tool `server__tool`; empty for methods without a tool.
    pub tool: String,
    /// The arguments object, whole.
    pub args: Option<Value>,
    pub principal: String,
    pub transport: Transport,
    pub process: String,
    pub phase: Phase,
    /// The MCP result object, for the response phase.
    pub result: Option<Value>,
    /// The JSON-RPC method; `tools/call` unless told.
    pub method: String,
    /// The resource URI, for `resources/read`.
    pub resource: Option<String>,
}

impl Default for ExplainQuery {
    fn default() -> Self {
        ExplainQuery {
            tool: String::new(),
            args: None,
            principal: String::new(),
            transport: Transport::Unix,
            process: String::new(),
            phase: Phase::Request,
            result: None,
            method: "tools/call".into(),
            resource: None,
        }
    }
}

impl ExplainQuery {
    /// The server part of `tool` (`github` of `github__search`).
    fn server(&self) -> Option<&str> {
        self.tool.split_once("__").map(|(server, _)| server)
    }
}

pub fn explain(policy: &Policy, q: &ExplainQuery) -> String {
    let tool = Some(q.tool.as_str()).filter(|t| !t.is_empty());
    let subject = Subject {
        method: &q.method,
        server: q.server(),
        tool,
        resource: q.resource.as_deref(),
        principal: &q.principal,
        transport: q.transport,
        process: &q.process,
        arguments: q.args.as_ref(),
    };
    let result = match q.phase {
        Phase::Request => None,
        Phase::Response => q.result.as_ref(),
    };
    let decision = policy.decide(q.phase, &subject, result);

    let mut out = String::new();
    let _ = writeln!(
        out,
        "message: {} phase, method {}, tool {}, server {}, resource {}, principal {:?}, \
         transport {}, process {:?}",
        q.phase,
        q.method,
        tool.unwrap_or("-"),
        subject.server.unwrap_or("-"),
        subject.resource.unwrap_or("-"),
        q.principal,
        q.transport,
        q.process
    );
    let _ = writeln!(out, "decision: {}", decision.verdict);
    if decision.verdict == super::config::Verdict::Ask {
        let _ = writeln!(
            out,
            "asked of: {} (a client that cannot be asked falls back to the operator)",
            decision.ask_via.as_str()
        );
    }
    match &decision.rule {
        Some(id) => match policy.rule(q.phase, id) {
            Some(rule) => {
                let _ = writeln!(out, "deciding rule: {id} ({}, {})", rule.layer, rule.origin);
            }
            None => {
                let _ = writeln!(out, "deciding rule: {id}");
            }
        },
        None => {
            let source = policy.default_source();
            let _ = writeln!(
                out,
                "deciding rule: none; the default decides (set by {}{})",
                match source.layer {
                    Layer::Builtin => "nobody: built-in",
                    other => other.as_str(),
                },
                if source.locked { ", locked" } else { "" }
            );
        }
    }
    if let Some(reason) = &decision.reason {
        let _ = writeln!(out, "reason: {reason}");
    }
    if decision.matched.is_empty() {
        let _ = writeln!(out, "matched rules: none");
    } else {
        let _ = writeln!(
            out,
            "matched rules ({}, in id order):",
            decision.matched.len()
        );
        let width = decision
            .matched
            .iter()
            .map(|m| m.id.len())
            .max()
            .unwrap_or(0);
        for m in &decision.matched {
            let marker = if decision.rule.as_deref() == Some(&*m.id) {
                "  <- decides"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "  {:width$}  {:7}  {:8}  {}{}",
                m.id,
                m.action.as_str(),
                m.layer.as_str(),
                m.reason.as_deref().unwrap_or("(no reason given)"),
                marker
            );
        }
    }
    let disabled = policy.disabled_matching(q.phase, &subject, result);
    if !disabled.is_empty() {
        let ids: Vec<String> = disabled
            .iter()
            .map(|r| format!("{} ({})", r.id, r.layer))
            .collect();
        let _ = writeln!(out, "disabled rules that would match: {}", ids.join(", "));
    }

    // What the rewrites would make of the message.
    let target = match q.phase {
        Phase::Request => q.args.as_ref(),
        Phase::Response => q.result.as_ref(),
    };
    if decision.verdict != Verdict::Block
        && let Some(original) = target
    {
        let mut rewritten = original.clone();
        let applied = match q.phase {
            Phase::Request => policy.rewrite_arguments(&decision, &mut rewritten),
            Phase::Response => policy.rewrite_result(&decision, &mut rewritten),
        };
        if !applied.is_empty() {
            let what = match q.phase {
                Phase::Request => "arguments",
                Phase::Response => "result",
            };
            let _ = writeln!(
                out,
                "rewritten {what} (by {}{}): {}",
                applied.join(", "),
                if decision.verdict == Verdict::Ask {
                    ", once approved"
                } else {
                    ""
                },
                serde_json::to_string(&rewritten).unwrap_or_default()
            );
        }
    }

    if q.method == "tools/call"
        && let (Some(tool), Some(server)) = (tool, subject.server)
    {
        let hidden = policy.hides_tool(tool, server, &q.principal, q.transport, &q.process);
        let _ = writeln!(
            out,
            "tools/list: {tool} is {} for this caller",
            if hidden { "hidden" } else { "listed" }
        );
    }
    out
}
