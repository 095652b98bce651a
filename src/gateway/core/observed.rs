//! What the core counts for `toolwall status` and `/metrics`; bounded (method labels are a
//! fixed set, rule ids come from the loaded policy).

use std::collections::BTreeMap;

use crate::transport::http::metrics::{self, Histogram};

#[derive(Debug)]
pub struct Observed {
    /// Requests by (method label, outcome: received | ok | error | refused).
    pub requests: BTreeMap<(&'static str, &'static str), u64>,
    /// Policy decisions of requests that reach servers, by (deciding rule or "default",
    /// verdict: allow | ask | block). Tool failures and timeouts are not decisions.
    pub policy_decisions: BTreeMap<(String, &'static str), u64>,
    pub tool_call_latency: Histogram,
    pub ledger_commit_latency: Histogram,
}

impl Default for Observed {
    fn default() -> Self {
        Observed {
            requests: BTreeMap::new(),
            policy_decisions: BTreeMap::new(),
            tool_call_latency: Histogram::new(metrics::TOOL_CALL_BUCKETS),
            ledger_commit_latency: Histogram::new(metrics::LEDGER_COMMIT_BUCKETS),
        }
    }
}

impl Observed {
    pub fn request(&mut self, method: &str, outcome: &'static str) {
        *self
            .requests
            .entry((metrics::method_label(method), outcome))
            .or_insert(0) += 1;
    }

    pub fn decision(&mut self, rule: Option<&str>, verdict: crate::policy::Verdict) {
        let verdict = match verdict {
            crate::policy::Verdict::Allow => "allow",
            crate::policy::Verdict::Ask => "ask",
            crate::policy::Verdict::Block => "block",
        };
        *self
            .policy_decisions
            .entry((rule.unwrap_or("default").to_owned(), verdict))
            .or_insert(0) += 1;
    }
}

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Counters {
    /// Requests that reached the pipeline (tools/call, resources/read, prompts/get).
    pub calls_total: u64,
    pub calls_allowed: u64,
    pub calls_denied: u64,
    pub calls_error: u64,
    pub requests_total: u64,
    pub ledger_failures: u64,
    /// Notifications and requests from servers dropped (see `toolwall_relay_dropped_total`).
    pub relay_dropped: u64,
    /// Calls refused because their principal held its whole share of the calls in flight
    /// (`gateway.max_in_flight_per_principal`); counted, not recorded one by one.
    pub share_refusals: u64,
    /// Listings counted into a `list_summary` event rather than recorded one by one
    /// (`gateway.list_event_secs`).
    pub list_coalesced: u64,
}
