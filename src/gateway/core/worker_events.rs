//! What workers say, and what the gateway tells them: answers routed to the call they
//! serve, workers going away, cancellations and timeouts.

use serde_json::json;
use std::time::Instant;

use super::calls::{Call, Purpose, Stage};
use super::pipeline::Refusal;
use super::{Action, Core, Recorder};
use crate::ledger::decision;
use crate::log::Level;
use crate::mcp::catalog::WorkerId;
use crate::mcp::tool_error::ToolErrorCode;
use crate::sandbox::ConfinementReport;
use crate::workers::rpc::{self, Op};

impl<R: Recorder> Core<R> {
    /// A worker is gone (exited, or broke the protocol): every call it held fails now.
    pub fn on_worker_gone(&mut self, worker: WorkerId, reason: &str, now: Instant) {
        self.now = now;
        self.workers[worker].ready = false;
        if let Some(u) = self.upstreams.as_mut().filter(|u| u.is_worker(worker)) {
            u.on_worker_gone(worker, reason);
        }
        let name = self.workers[worker].name.clone();
        let message = format!("worker {name} is gone: {reason}");
        for key in self
            .calls
            .keys_where(|c| c.worker == worker && c.stage == Stage::AtWorker)
        {
            self.fail_call(key, ToolErrorCode::WorkerUnavailable, &message);
        }
    }

    pub fn on_worker_message(&mut self, worker: WorkerId, msg: rpc::Message, now: Instant) {
        self.now = now;
        match msg {
            rpc::Message::Response {
                id,
                ok,
                error,
                facts,
            } => {
                // A late answer (timed out, cancelled) or another worker's id is dropped;
                // so is an answer to a call still held for approval.
                let owned = self
                    .calls
                    .get(id)
                    .is_some_and(|c| c.worker == worker && c.stage == Stage::AtWorker);
                if !owned {
                    // A cancelled call's end frees the lane slot it kept.
                    self.calls.end_lingering(id);
                    self.release_answered(id, error.as_ref());
                    return;
                }
                let Some(call) = self.calls.take(id) else {
                    return;
                };
                if let Purpose::Listing { kind, server } = &call.purpose
                    && self.is_aggregator(worker)
                {
                    // Upstream listings go to the intake (pins, budgets, owners).
                    self.upstream_listing_answered(worker, *kind, server, ok, error, facts);
                    return;
                }
                self.complete(call, ok, error, facts);
            }
            rpc::Message::Event { kind, detail } => {
                // A call's progress, log messages and requests: judged and recorded by the
                // relay; the aggregator's other events go through the relisting schedule.
                if self.on_relay_event(worker, &kind, &detail) {
                    return;
                }
                if self.is_aggregator(worker) {
                    self.on_upstream_event(worker, &kind, &detail, now);
                } else {
                    self.on_worker_event(worker, &kind, &detail);
                }
            }
            rpc::Message::Ready { .. } | rpc::Message::Request { .. } => {
                // The supervisor handles ready; a worker never sends requests.
            }
        }
    }

    fn complete(
        &mut self,
        call: Call,
        ok: Option<String>,
        error: Option<rpc::RpcError>,
        facts: Option<String>,
    ) {
        match call.purpose {
            Purpose::Exchange(x) => self.complete_exchange(x, call.started, ok, error, facts),
            Purpose::Listing { kind, server } => {
                self.complete_listing(call.worker, kind, &server, ok, error)
            }
            Purpose::Configure => {
                if let Some(e) = error {
                    self.log(
                        Level::Error,
                        format!(
                            "configuring the aggregator failed: {}: {}",
                            e.kind, e.message
                        ),
                    );
                }
            }
            Purpose::Attest => {
                let name = self.workers[call.worker].name.clone();
                // The same verdict as at start-up: the role's probes, Landlock, seccomp,
                // no_new_privs and capabilities.
                let report = ok
                    .as_deref()
                    .and_then(|t| serde_json::from_str::<ConfinementReport>(t).ok());
                let gaps = match &report {
                    Some(r) => r.gaps(),
                    None => vec!["the worker sent no readable confinement report".to_owned()],
                };
                if !gaps.is_empty() {
                    self.log(
                        Level::Error,
                        format!(
                            "worker {name}: a live re-attestation found it not confined: {}",
                            gaps.join("; ")
                        ),
                    );
                }
                self.event(
                    "worker_reattested",
                    json!({"worker": name, "confined": gaps.is_empty(), "gaps": gaps, "report": report}),
                );
            }
        }
    }

    /// A call could not be served (worker gone, timeout, stopping): answer it.
    pub(super) fn fail_call(&mut self, key: u64, code: ToolErrorCode, message: &str) {
        let Some(call) = self.calls.take(key) else {
            return;
        };
        if code == ToolErrorCode::Timeout && call.stage == Stage::AtWorker {
            // The worker may still run it (its own limits can outlast this timeout): the
            // slot stays taken until it says the call ended, or one more timeout.
            let period = call.deadline.saturating_duration_since(call.started);
            self.calls.linger(key, &call, self.now + period);
        }
        match call.purpose {
            Purpose::Exchange(x) => {
                let refusal = Refusal {
                    code,
                    message,
                    rule: None,
                    decision: if code == ToolErrorCode::AskTimeout {
                        decision::DENIED
                    } else {
                        decision::ERROR
                    },
                };
                self.refuse(x, call.started, &refusal);
            }
            Purpose::Listing { server, kind } if self.is_aggregator(call.worker) => {
                self.upstream_listing_failed(kind, &server, message);
            }
            Purpose::Listing { server, .. } => {
                self.log(
                    Level::Warn,
                    format!("listing of server {server} failed: {message}"),
                );
            }
            Purpose::Attest => {
                let name = self.workers[call.worker].name.clone();
                self.log(
                    Level::Warn,
                    format!("re-attestation of worker {name} failed: {message}"),
                );
            }
            Purpose::Configure => {
                self.log(
                    Level::Error,
                    format!("configuring the aggregator failed: {message}"),
                );
            }
        }
    }

    /// Tell a worker to stop working on `target`; no answer is owed for the cancel.
    pub(super) fn cancel_at_worker(&mut self, worker: WorkerId, target: u64) {
        let id = self.calls.new_key();
        self.actions.push(Action::ToWorker {
            worker,
            call: None,
            msg: rpc::Message::Request {
                id,
                op: Op::Cancel { target },
            },
        });
    }

    /// The client cancelled: the worker is told, the row ends as an error, no answer is
    /// sent (the MCP rule for cancelled requests).
    pub(super) fn cancel_call(&mut self, key: u64, reason: &str) {
        let Some(call) = self.calls.take(key) else {
            return;
        };
        if call.stage == Stage::AtWorker {
            self.cancel_at_worker(call.worker, key);
            // The worker may still be running it: the pool is not any emptier yet.
            self.calls.linger(key, &call, call.deadline);
        }
        let Purpose::Exchange(mut x) = call.purpose else {
            return;
        };
        if let Some(conn) = x.from.conn.take() {
            self.calls.answered(conn);
        }
        let message = format!("cancelled: {reason}");
        let refusal = Refusal {
            code: ToolErrorCode::Internal,
            message: &message,
            rule: None,
            decision: decision::CANCELLED,
        };
        self.refuse(x, call.started, &refusal);
    }
}
