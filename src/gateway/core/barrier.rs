//! The commit barrier. The loop commits the staged records once per turn and reports the
//! outcome here; only then are the actions released. When the commit failed, nothing the
//! ledger does not hold may reach a tool or an agent: requests for servers are refused
//! (their agent is told, their row ends as `error`), answers are withheld (an error goes
//! out instead, and the row says so). Those rows are committed with the rest as soon as
//! the ledger can be written, so a refused call is never recorded as allowed.

use std::time::Duration;

use super::calls::Purpose;
use super::pipeline::Refusal;
use super::{Action, Core, Recorder};
use crate::ledger::{CallEnd, decision};
use crate::log::Level;
use crate::mcp::jsonrpc;
use crate::mcp::tool_error::ToolErrorCode;
use crate::workers::rpc::{self, Op};

const CALL_NOT_MADE: &str = "the ledger cannot be written, so the call was not made (fail closed)";
const ANSWER_WITHHELD: &str =
    "the ledger cannot be written, so the answer is withheld (fail closed)";

impl<R: Recorder> Core<R> {
    /// The outcome of the loop's commit of everything staged this turn.
    pub fn after_commit(&mut self, outcome: Result<(), String>, took: Duration) {
        self.observed.ledger_commit_latency.observe(took);
        match outcome {
            Ok(()) => {
                if !self.ledger_ok {
                    self.log(Level::Info, "ledger writable again; serving calls".into());
                }
                self.ledger_ok = true;
            }
            Err(e) => {
                self.counters.ledger_failures += 1;
                if self.ledger_ok {
                    self.log(
                        Level::Error,
                        format!("ledger cannot be written ({e}); refusing calls until it can"),
                    );
                }
                self.ledger_ok = false;
                self.refuse_uncommitted();
            }
        }
    }

    fn refuse_uncommitted(&mut self) {
        let actions = std::mem::take(&mut self.actions);
        let mut released = Vec::with_capacity(actions.len());
        for action in actions {
            match action {
                Action::ToWorker {
                    call: Some(key),
                    msg,
                    ..
                } if self
                    .calls
                    .get(key)
                    .is_some_and(|c| matches!(c.purpose, Purpose::Exchange(_))) =>
                {
                    // The row saying this call reaches its tool is not on disk: it must
                    // not, whether or not its agent is still there. An answer to the
                    // server's request whose record is not on disk ends the call too.
                    let Some(call) = self.calls.take(key) else {
                        continue;
                    };
                    if matches!(
                        msg,
                        rpc::Message::Request {
                            op: Op::Answer { .. },
                            ..
                        }
                    ) {
                        self.cancel_at_worker(call.worker, key);
                    }
                    let Purpose::Exchange(x) = call.purpose else {
                        continue;
                    };
                    let refusal = Refusal {
                        code: ToolErrorCode::LedgerUnavailable,
                        message: CALL_NOT_MADE,
                        rule: None,
                        decision: decision::ERROR,
                    };
                    self.refuse(x, call.started, &refusal);
                }
                Action::Reply {
                    conn,
                    stream,
                    id,
                    row,
                    ..
                } => {
                    if let Some(row) = row {
                        self.records.stage_call_end(
                            row,
                            &CallEnd {
                                decision: decision::ERROR,
                                policy_rule: None,
                                policy_reason: None,
                                duration_us: 0,
                                error_message: Some(ANSWER_WITHHELD),
                                bytes_sent: 0,
                                response: b"",
                                rewritten_arguments: None,
                                original_response: None,
                                approved_by: None,
                                decided_at_ms: None,
                            },
                        );
                    }
                    let bytes = jsonrpc::error_response(
                        Some(&id),
                        jsonrpc::LEDGER_UNAVAILABLE,
                        ANSWER_WITHHELD,
                        None,
                    );
                    released.push(Action::Reply {
                        conn,
                        stream,
                        id,
                        row: None,
                        bytes,
                    });
                }
                Action::Relay {
                    call, request_id, ..
                } => {
                    // Its record is not on disk: it does not leave. A server's request
                    // that cannot be relayed ends its call (fail closed).
                    if request_id.is_some()
                        && let Some(c) = self.calls.take(call)
                    {
                        self.cancel_at_worker(c.worker, call);
                        if let Purpose::Exchange(mut x) = c.purpose {
                            // It never reached the agent: nothing there to cancel.
                            if let Some(rk) = request_id.as_deref().and_then(super::relay::key_of) {
                                x.relay.pending.retain(|k| *k != rk);
                                self.forget_relayed(rk);
                            }
                            let refusal = Refusal {
                                code: ToolErrorCode::LedgerUnavailable,
                                message: CALL_NOT_MADE,
                                rule: None,
                                decision: decision::ERROR,
                            };
                            self.refuse(x, c.started, &refusal);
                        }
                    }
                }
                other => released.push(other),
            }
        }
        // The refusals staged above queued their own answers (a refusal carries nothing
        // from a server, and their rows are staged for the next commit).
        released.append(&mut self.actions);
        self.actions = released;
    }
}
