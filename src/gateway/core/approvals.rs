//! `ask`: calls held for a human. The operator decides over the admin socket (never an
//! agent's door); a timeout denies; a policy reload judges every held call again, so an
//! approval never lets through what the policy now in force blocks; a held call whose agent
//! has gone ends at once (nobody is left to act on the answer).

use serde_json::json;
use std::time::Instant;

use super::calls::{Purpose, Stage};
use super::pipeline::Refusal;
use super::{Core, Recorder};
use crate::ledger::{CallEnd, decision};
use crate::log::Level;
use crate::mcp::tool_error::ToolErrorCode;
use crate::policy::Verdict;

/// A call held for approval, as the admin socket lists it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PendingApproval {
    pub id: u64,
    pub method: &'static str,
    /// `server__tool`, `server__prompt` or the URI.
    pub tool: String,
    pub principal: String,
    pub process: String,
    pub transport: &'static str,
    pub arguments: String,
    pub rule: Option<String>,
    pub reason: Option<String>,
    pub waiting_ms: u128,
    /// Who is asked: `operator`, or `client` (the human at the agent's client was asked
    /// too; the operator may still decide first).
    pub via: &'static str,
}

impl<R: Recorder> Core<R> {
    pub fn pending_approvals(&self, now: Instant) -> Vec<PendingApproval> {
        let mut out: Vec<PendingApproval> = self
            .calls
            .iter()
            .filter(|(_, c)| c.stage == Stage::AwaitingApproval)
            .filter_map(|(key, c)| {
                let x = c.exchange()?;
                Some(PendingApproval {
                    id: key,
                    method: x.routed.method(),
                    tool: x.display_name(),
                    principal: x.from.principal.clone(),
                    process: x.from.process.clone(),
                    transport: x.from.transport.as_str(),
                    arguments: x.judged_text(),
                    rule: x.request_decision.rule.as_deref().map(str::to_owned),
                    reason: x.request_decision.reason.as_deref().map(str::to_owned),
                    waiting_ms: now.saturating_duration_since(c.started).as_millis(),
                    via: if x.relay.client_ask.is_some() {
                        "client"
                    } else {
                        "operator"
                    },
                })
            })
            .collect();
        out.sort_by_key(|p| p.id);
        out
    }

    /// A human approved or denied a held call. Returns an error text when `id` is not a
    /// call awaiting approval.
    pub fn decide_approval(
        &mut self,
        id: u64,
        approve: bool,
        who: &str,
        reason: Option<&str>,
        now: Instant,
    ) -> Result<(), String> {
        self.now = now;
        let held = self
            .calls
            .get(id)
            .is_some_and(|c| c.stage == Stage::AwaitingApproval);
        let Some(call) = held.then(|| self.calls.take(id)).flatten() else {
            return Err(format!("no call awaiting approval has id {id}"));
        };
        let Purpose::Exchange(mut x) = call.purpose else {
            return Err(format!("no call awaiting approval has id {id}"));
        };
        let decided = self.wall_ms();
        self.event(
            "ask_decided",
            json!({"approval_id": id, "call_id": x.ledger_id, "approved": approve, "by": who, "reason": reason}),
        );
        x.approved = Some((who.to_owned(), decided));
        if !approve {
            let message = match reason {
                Some(r) => format!("denied by {who}: {r}"),
                None => format!("denied by {who}"),
            };
            let rule = x.request_decision.rule.clone();
            let refusal = Refusal {
                code: ToolErrorCode::AskDenied,
                message: &message,
                rule: rule.as_deref(),
                decision: decision::DENIED,
            };
            self.refuse(x, call.started, &refusal);
            return Ok(());
        }
        // Approved: rewrites apply now, as for an allow. Who approved is on the row before
        // the call is sent; the outcome follows at completion.
        x.request_decision.verdict = Verdict::Allow;
        x.rewritten = self.rewrite_arguments(&mut x);
        if x.rewritten && !self.rewritten_still_allowed(&mut x) {
            let d = x.request_decision.clone();
            let message = format!(
                "approved, but the rewritten arguments are blocked by policy: {}",
                d.reason.as_deref().unwrap_or("-")
            );
            let refusal = Refusal {
                code: ToolErrorCode::PolicyBlocked,
                message: &message,
                rule: d.rule.as_deref(),
                decision: decision::DENIED,
            };
            self.refuse(x, call.started, &refusal);
            return Ok(());
        }
        self.records.stage_call_end(
            x.ledger_id,
            &CallEnd {
                decision: decision::ALLOWED,
                policy_rule: None,
                policy_reason: None,
                duration_us: 0,
                error_message: None,
                bytes_sent: 0,
                response: b"",
                rewritten_arguments: None,
                original_response: None,
                approved_by: Some(who),
                decided_at_ms: Some(decided),
            },
        );
        self.forward(x, call.started);
        Ok(())
    }

    /// No decision in time: the call is denied.
    pub(super) fn ask_timed_out(&mut self, key: u64) {
        let Some(call) = self.calls.take(key) else {
            return;
        };
        let Purpose::Exchange(x) = call.purpose else {
            return;
        };
        let secs = self.policy.ask_timeout().as_secs();
        let message = format!("no approval within {secs} s (policy.ask_timeout_secs)");
        self.event("ask_timeout", json!({"approval_id": key}));
        let rule = x.request_decision.rule.clone();
        let refusal = Refusal {
            code: ToolErrorCode::AskTimeout,
            message: &message,
            rule: rule.as_deref(),
            decision: decision::DENIED,
        };
        self.refuse(x, call.started, &refusal);
    }

    /// After a policy swap: every held call is judged again. Blocked now: denied with the
    /// new rule. Allowed now: sent. Still `ask`: held, under the new rule.
    pub(super) fn rejudge_held(&mut self) {
        for key in self
            .calls
            .keys_where(|c| c.stage == Stage::AwaitingApproval)
        {
            let Some(call) = self.calls.take(key) else {
                continue;
            };
            let (started, deadline, worker) = (call.started, call.deadline, call.worker);
            let Purpose::Exchange(mut x) = call.purpose else {
                continue;
            };
            let decision = self.judge_request(&x);
            self.event(
                "ask_rejudged",
                json!({"approval_id": key, "call_id": x.ledger_id, "verdict": decision.verdict.to_string(),
                       "rule": decision.rule, "generation": self.policy_generation}),
            );
            let verdict = decision.verdict;
            x.request_decision = decision;
            match verdict {
                Verdict::Block => {
                    self.log(
                        Level::Info,
                        format!("held call {key} is blocked by the reloaded policy; denied"),
                    );
                    let d = x.request_decision.clone();
                    let message = match &d.reason {
                        Some(r) => format!("blocked by policy (reloaded while held): {r}"),
                        None => "blocked by policy (reloaded while held)".to_owned(),
                    };
                    let refusal = Refusal {
                        code: ToolErrorCode::PolicyBlocked,
                        message: &message,
                        rule: d.rule.as_deref(),
                        decision: decision::DENIED,
                    };
                    self.stage_decision_change(&x);
                    self.refuse(x, started, &refusal);
                }
                Verdict::Allow => {
                    self.stage_decision_change(&x);
                    x.rewritten = self.rewrite_arguments(&mut x);
                    if x.rewritten && !self.rewritten_still_allowed(&mut x) {
                        let rule = x.request_decision.rule.clone();
                        let refusal = Refusal {
                            code: ToolErrorCode::PolicyBlocked,
                            message: "the rewritten arguments are blocked by policy",
                            rule: rule.as_deref(),
                            decision: decision::DENIED,
                        };
                        self.refuse(x, started, &refusal);
                        continue;
                    }
                    self.forward(x, started);
                }
                Verdict::Ask => {
                    let call = super::calls::Call {
                        purpose: Purpose::Exchange(x),
                        worker,
                        stage: Stage::AwaitingApproval,
                        started,
                        deadline,
                        timeout_key: "policy.ask_timeout_secs",
                        lane: None,
                        unsent: None,
                    };
                    self.calls.insert(key, call);
                }
            }
        }
    }

    /// The row names the rule of the decision that ended a held call.
    fn stage_decision_change(&mut self, x: &super::exchange::Exchange) {
        let d = &x.request_decision;
        let verdict = match d.verdict {
            Verdict::Allow => decision::ALLOWED,
            Verdict::Ask => decision::PENDING,
            Verdict::Block => decision::DENIED,
        };
        self.records.stage_call_end(
            x.ledger_id,
            &CallEnd {
                decision: verdict,
                policy_rule: d.rule.as_deref(),
                policy_reason: d.reason.as_deref(),
                duration_us: 0,
                error_message: None,
                bytes_sent: 0,
                response: b"",
                rewritten_arguments: None,
                original_response: None,
                approved_by: None,
                decided_at_ms: None,
            },
        );
    }

    /// Held calls of `conn` (None: of agents already gone) end now, as cancelled: nobody
    /// can act on them.
    pub(super) fn drop_held_asks(&mut self, conn: Option<super::ConnRef>) {
        for key in self.calls.keys_where(|c| {
            c.stage == Stage::AwaitingApproval && c.exchange().is_some_and(|x| x.from.conn == conn)
        }) {
            let Some(call) = self.calls.take(key) else {
                continue;
            };
            let Purpose::Exchange(x) = call.purpose else {
                continue;
            };
            self.event(
                "ask_dropped",
                json!({"approval_id": key, "call_id": x.ledger_id}),
            );
            let refusal = Refusal {
                code: ToolErrorCode::AskDenied,
                message: "cancelled: the agent closed the connection while the call was held for approval",
                rule: None,
                decision: decision::CANCELLED,
            };
            self.refuse(x, call.started, &refusal);
        }
    }
}
