//! What the gateway reports about itself: `/health` and `/metrics`.

use super::*;

impl Gateway {
    /// What `/health` says.
    pub(super) fn health_report(&self) -> crate::transport::http::HealthReport {
        let workers: Vec<serde_json::Value> = self
            .supervisor
            .workers
            .iter()
            .map(|w| serde_json::json!({"name": w.spec.name, "state": w.state.as_str(), "pid": w.pid, "restarts": w.restarts}))
            .collect();
        // The same verdict the supervisor gives a worker before it gets work.
        let confined = self
            .supervisor
            .workers
            .iter()
            .all(|w| w.report.as_ref().is_some_and(|r| r.gaps().is_empty()));
        crate::transport::http::HealthReport {
            serving: self.announced_ready && self.core.ledger_ok() && self.stop_deadline.is_none(),
            workers: serde_json::Value::Array(workers),
            sandbox: serde_json::json!({"mode": format!("{:?}", self.config.sandbox.mode).to_lowercase(), "confined": confined}),
            ledger: serde_json::json!({"writable": self.core.ledger_ok()}),
        }
    }

    /// What `/metrics` says.
    pub(super) fn metrics(&self) -> crate::transport::http::metrics::Metrics {
        let mut m = crate::transport::http::metrics::Metrics::default();
        let observed = &self.core.observed;
        m.requests = observed.requests.clone();
        m.policy_decisions = observed.policy_decisions();
        m.tool_call_latency = observed.tool_call_latency.clone();
        m.ledger_commit_latency = observed.ledger_commit_latency.clone();
        m.ledger_commit_failures = self.core.counters.ledger_failures;
        m.relay_dropped = self.core.counters.relay_dropped;
        m.relay_late_answers = self.core.relay_answers_dropped();
        m.share_refusals = self.core.counters.share_refusals;
        m.list_coalesced = self.core.counters.list_coalesced;
        m.in_flight = self.core.in_flight_total() as u64;
        for c in self.conns.iter().flatten() {
            if !matches!(c.wire, Wire::Admin(_)) {
                *m.connections.entry(c.peer.transport.as_str()).or_insert(0) += 1;
            }
        }
        for w in &self.supervisor.workers {
            m.worker_restarts
                .insert(w.spec.name.clone(), u64::from(w.restarts));
        }
        m.http_sessions = self.http.as_ref().map_or(0, |d| d.sessions() as u64);
        m.http_responses = self
            .http
            .as_ref()
            .map(HttpDoor::responses)
            .unwrap_or_default();
        m.connections_closed = self.doors.tally.closed.clone();
        m.connections_refused = self.doors.tally.refused.clone();
        m.partial_bytes = self.doors.partial.held() as u64;
        m.partial_pauses = self.doors.partial.paused.clone();
        m.partial_refusals = self.doors.partial.refused.clone();
        m
    }
}
