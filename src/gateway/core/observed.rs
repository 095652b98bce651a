//! What the core counts for `toolwall status` and `/metrics`; bounded (method labels are a
//! fixed set, rule ids come from the loaded policy).

use std::collections::BTreeMap;

use crate::transport::http::metrics::{self, Histogram};

/// The verdicts `policy_decisions` counts, in the order of its counts.
const VERDICTS: [&str; 3] = ["allow", "ask", "block"];

#[derive(Debug)]
pub struct Observed {
    /// Requests by (method label, outcome: received | ok | error | refused).
    pub requests: BTreeMap<(&'static str, &'static str), u64>,
    /// Policy decisions of requests that reach servers, by deciding rule (or "default"),
    /// counted per verdict in [`VERDICTS`] order. Tool failures and timeouts are not
    /// decisions. Keyed by rule alone so that counting looks up a `&str` (no key built per
    /// call); [`Observed::policy_decisions`] gives the (rule, verdict) view.
    policy_decisions: BTreeMap<String, [u64; 3]>,
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
        let slot = match verdict {
            crate::policy::Verdict::Allow => 0,
            crate::policy::Verdict::Ask => 1,
            crate::policy::Verdict::Block => 2,
        };
        let rule = rule.unwrap_or("default");
        match self.policy_decisions.get_mut(rule) {
            Some(counts) => counts[slot] += 1,
            None => {
                let mut counts = [0; 3];
                counts[slot] = 1;
                self.policy_decisions.insert(rule.to_owned(), counts);
            }
        }
    }

    /// Policy decisions by (deciding rule or "default", verdict: allow | ask | block).
    pub fn policy_decisions(&self) -> BTreeMap<(String, &'static str), u64> {
        let mut out = BTreeMap::new();
        for (rule, counts) in &self.policy_decisions {
            for (verdict, &n) in VERDICTS.iter().zip(counts) {
                if n > 0 {
                    out.insert((rule.clone(), *verdict), n);
                }
            }
        }
        out
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
