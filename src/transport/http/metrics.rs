//! `/metrics`: Prometheus text exposition (format 0.0.4) from plain counters the gateway
//! keeps. This file only renders; the loop fills [`Metrics`].
//!
//! Label values come from bounded sets: methods outside the MCP method list are counted as
//! `other` ([`method_label`]), so a client cannot grow the page by inventing methods.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

/// Bucket upper bounds, in seconds, for tool-call latency.
pub const TOOL_CALL_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];
/// Bucket upper bounds, in seconds, for ledger commit latency.
pub const LEDGER_COMMIT_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0,
];

/// A latency histogram with fixed buckets.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Observations per bucket (not cumulative); one more than `bounds` for +Inf.
    counts: Vec<u64>,
    sum_seconds: f64,
    count: u64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum_seconds: 0.0,
            count: 0,
        }
    }

    pub fn observe(&mut self, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        let slot = self
            .bounds
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[slot] += 1;
        self.sum_seconds += secs;
        self.count += 1;
    }

    pub fn count(&self) -> u64 {
        self.count
    }
}

/// Everything `/metrics` shows.
#[derive(Debug, Clone, PartialEq)]
pub struct Metrics {
    /// MCP requests by (method label, outcome), outcome one of `ok`, `error`, `refused`.
    pub requests: BTreeMap<(&'static str, &'static str), u64>,
    /// HTTP responses by status code.
    pub http_responses: BTreeMap<u16, u64>,
    /// Policy decisions by (rule id, decision); rule ids come from the loaded policy.
    pub policy_decisions: BTreeMap<(String, &'static str), u64>,
    pub tool_call_latency: Histogram,
    /// Requests being served now.
    pub in_flight: u64,
    /// Open agent connections by transport (`http`, `unix`, `vsock`, `stdio`).
    pub connections: BTreeMap<&'static str, u64>,
    /// Worker restarts by worker name.
    pub worker_restarts: BTreeMap<String, u64>,
    pub ledger_commit_latency: Histogram,
    pub ledger_commit_failures: u64,
    /// Notifications from servers dropped (rate, size and queue bounds, the gateway's and
    /// the workers'), whether or not a call was found for them.
    pub relay_dropped: u64,
    /// Agents' answers to relayed server requests that came after the call had ended
    /// (the server answered or the call was cancelled): dropped, never forwarded.
    pub relay_late_answers: u64,
    /// Calls refused for a principal's full share (`gateway.max_in_flight_per_principal`).
    pub share_refusals: u64,
    /// Live legacy-era HTTP sessions.
    pub http_sessions: u64,
    /// Connections closed at a stage deadline, by (door, reason).
    pub connections_closed: BTreeMap<(&'static str, &'static str), u64>,
    /// Connections refused at a limit, or displaced to make room, by (door, reason).
    pub connections_refused: BTreeMap<(&'static str, &'static str), u64>,
    /// Bytes granted now to messages not yet whole (`gateway.max_partial_bytes`).
    pub partial_bytes: u64,
    /// Times a connection's reading paused for want of such a grant, by door.
    pub partial_pauses: BTreeMap<&'static str, u64>,
    /// Messages refused as larger than any grant, by door.
    pub partial_refusals: BTreeMap<&'static str, u64>,
    /// Listings counted into a `list_summary` event rather than recorded one by one.
    pub list_coalesced: u64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: BTreeMap::new(),
            http_responses: BTreeMap::new(),
            policy_decisions: BTreeMap::new(),
            tool_call_latency: Histogram::new(TOOL_CALL_BUCKETS),
            in_flight: 0,
            connections: BTreeMap::new(),
            worker_restarts: BTreeMap::new(),
            ledger_commit_latency: Histogram::new(LEDGER_COMMIT_BUCKETS),
            ledger_commit_failures: 0,
            relay_dropped: 0,
            relay_late_answers: 0,
            share_refusals: 0,
            http_sessions: 0,
            connections_closed: BTreeMap::new(),
            connections_refused: BTreeMap::new(),
            partial_bytes: 0,
            partial_pauses: BTreeMap::new(),
            partial_refusals: BTreeMap::new(),
            list_coalesced: 0,
        }
    }
}

/// MCP methods counted under their own name; anything else is `other`.
const KNOWN_METHODS: &[&str] = &[
    "initialize",
    "ping",
    "server/discover",
    "tools/list",
    "tools/call",
    "resources/list",
    "resources/read",
    "resources/templates/list",
    "prompts/list",
    "prompts/get",
    "completion/complete",
    "logging/setLevel",
    "notifications/initialized",
    "notifications/cancelled",
];

/// The label for `method`: itself when it is a known MCP method, else `other`.
pub fn method_label(method: &str) -> &'static str {
    KNOWN_METHODS
        .iter()
        .copied()
        .find(|m| *m == method)
        .unwrap_or("other")
}

/// A label value escaped as the text format requires.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A float as Prometheus writes it.
fn number(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        }
    } else if v.is_nan() {
        "NaN".into()
    } else {
        format!("{v}")
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn histogram(out: &mut String, name: &str, help: &str, h: &Histogram) {
    header(out, name, "histogram", help);
    let mut cumulative = 0u64;
    for (i, bound) in h.bounds.iter().enumerate() {
        cumulative += h.counts[i];
        let _ = writeln!(
            out,
            "{name}_bucket{{le=\"{}\"}} {cumulative}",
            number(*bound)
        );
    }
    cumulative += h.counts[h.bounds.len()];
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
    let _ = writeln!(out, "{name}_sum {}", number(h.sum_seconds));
    let _ = writeln!(out, "{name}_count {}", h.count);
}

/// The whole page.
pub fn render(m: &Metrics) -> String {
    let mut out = String::with_capacity(4096);
    header(
        &mut out,
        "toolwall_requests_total",
        "counter",
        "MCP requests by method and outcome.",
    );
    for ((method, outcome), n) in &m.requests {
        let _ = writeln!(
            out,
            "toolwall_requests_total{{method=\"{}\",outcome=\"{}\"}} {n}",
            escape(method),
            escape(outcome)
        );
    }
    header(
        &mut out,
        "toolwall_http_responses_total",
        "counter",
        "HTTP responses of the Streamable HTTP door by status code.",
    );
    for (status, n) in &m.http_responses {
        let _ = writeln!(
            out,
            "toolwall_http_responses_total{{status=\"{status}\"}} {n}"
        );
    }
    header(
        &mut out,
        "toolwall_policy_decisions_total",
        "counter",
        "Policy rule matches by rule and decision.",
    );
    for ((rule, decision), n) in &m.policy_decisions {
        let _ = writeln!(
            out,
            "toolwall_policy_decisions_total{{rule=\"{}\",decision=\"{}\"}} {n}",
            escape(rule),
            escape(decision)
        );
    }
    histogram(
        &mut out,
        "toolwall_tool_call_duration_seconds",
        "Time from a tools/call request to its answer.",
        &m.tool_call_latency,
    );
    header(
        &mut out,
        "toolwall_requests_in_flight",
        "gauge",
        "Requests being served now.",
    );
    let _ = writeln!(out, "toolwall_requests_in_flight {}", m.in_flight);
    header(
        &mut out,
        "toolwall_connections",
        "gauge",
        "Open agent connections by transport.",
    );
    for (transport, n) in &m.connections {
        let _ = writeln!(
            out,
            "toolwall_connections{{transport=\"{}\"}} {n}",
            escape(transport)
        );
    }
    for (name, help, counts) in [
        (
            "toolwall_connections_closed_total",
            "Connections closed because a stage deadline passed, by door and reason.",
            &m.connections_closed,
        ),
        (
            "toolwall_connections_refused_total",
            "Connections refused at a limit, or closed to make room, by door and reason.",
            &m.connections_refused,
        ),
    ] {
        header(&mut out, name, "counter", help);
        for ((door, reason), n) in counts {
            let _ = writeln!(
                out,
                "{name}{{door=\"{}\",reason=\"{}\"}} {n}",
                escape(door),
                escape(reason)
            );
        }
    }
    header(
        &mut out,
        "toolwall_partial_bytes",
        "gauge",
        "Bytes granted to messages not yet whole (gateway.max_partial_bytes).",
    );
    let _ = writeln!(out, "toolwall_partial_bytes {}", m.partial_bytes);
    for (name, help, counts) in [
        (
            "toolwall_partial_pauses_total",
            "Times reading from a connection paused until room for a large message was free, by door.",
            &m.partial_pauses,
        ),
        (
            "toolwall_partial_refusals_total",
            "Messages refused as larger than gateway.max_partial_bytes_per_peer allows, by door.",
            &m.partial_refusals,
        ),
    ] {
        header(&mut out, name, "counter", help);
        for (door, n) in counts {
            let _ = writeln!(out, "{name}{{door=\"{}\"}} {n}", escape(door));
        }
    }
    header(
        &mut out,
        "toolwall_list_events_coalesced_total",
        "counter",
        "Listings counted into a list_summary ledger event rather than recorded one by one.",
    );
    let _ = writeln!(
        out,
        "toolwall_list_events_coalesced_total {}",
        m.list_coalesced
    );
    header(
        &mut out,
        "toolwall_http_sessions",
        "gauge",
        "Live legacy-era HTTP sessions.",
    );
    let _ = writeln!(out, "toolwall_http_sessions {}", m.http_sessions);
    header(
        &mut out,
        "toolwall_worker_restarts_total",
        "counter",
        "Worker restarts by worker.",
    );
    for (worker, n) in &m.worker_restarts {
        let _ = writeln!(
            out,
            "toolwall_worker_restarts_total{{worker=\"{}\"}} {n}",
            escape(worker)
        );
    }
    histogram(
        &mut out,
        "toolwall_ledger_commit_duration_seconds",
        "Time of one grouped ledger commit.",
        &m.ledger_commit_latency,
    );
    header(
        &mut out,
        "toolwall_ledger_commit_failures_total",
        "counter",
        "Ledger commits that failed (calls are refused while the ledger cannot be written).",
    );
    let _ = writeln!(
        out,
        "toolwall_ledger_commit_failures_total {}",
        m.ledger_commit_failures
    );
    header(
        &mut out,
        "toolwall_relay_dropped_total",
        "counter",
        "Notifications and requests from servers dropped by the relay's rate, size and queue bounds (in the gateway and its workers).",
    );
    let _ = writeln!(out, "toolwall_relay_dropped_total {}", m.relay_dropped);
    header(
        &mut out,
        "toolwall_relay_late_answers_dropped_total",
        "counter",
        "Agents' answers to relayed server requests that match no request waiting on that connection (their call ended, or the id is not one it was sent): dropped, not forwarded to the server.",
    );
    let _ = writeln!(
        out,
        "toolwall_relay_late_answers_dropped_total {}",
        m.relay_late_answers
    );
    header(
        &mut out,
        "toolwall_share_refusals_total",
        "counter",
        "Calls refused at once for a full share: of the calls in flight (gateway.max_in_flight_per_principal), of the bytes in flight (gateway.max_bytes_in_flight_per_principal, gateway.max_bytes_in_flight) or of a pool (gateway.pool_share_percent); not recorded in the ledger one by one.",
    );
    let _ = writeln!(out, "toolwall_share_refusals_total {}", m.share_refusals);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every sample line parses as `name{labels} value` with a finite or infinite value,
    /// and every sample belongs to a declared family.
    fn check_format(text: &str) {
        let mut families = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                families.push(rest.split(' ').next().unwrap().to_owned());
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').unwrap();
            assert!(value.parse::<f64>().is_ok() || value == "+Inf", "{line}");
            let name = series.split('{').next().unwrap();
            assert!(
                families.iter().any(|f| name == f
                    || name
                        .strip_prefix(f.as_str())
                        .is_some_and(|s| ["_bucket", "_sum", "_count"].contains(&s))),
                "{line}"
            );
            if let Some(labels) = series.strip_prefix(name)
                && !labels.is_empty()
            {
                assert!(labels.starts_with('{') && labels.ends_with('}'), "{line}");
            }
        }
    }

    #[test]
    fn renders_every_family() {
        let mut m = Metrics::default();
        m.requests.insert(("tools/call", "ok"), 3);
        m.requests
            .insert((method_label("evil/\"method\n"), "refused"), 1);
        m.http_responses.insert(401, 2);
        m.policy_decisions
            .insert(("block-\"rm\"\\".into(), "block"), 4);
        m.tool_call_latency.observe(Duration::from_millis(3));
        m.tool_call_latency.observe(Duration::from_secs(1000));
        m.in_flight = 2;
        m.connections.insert("http", 5);
        m.worker_restarts.insert("builtin".into(), 1);
        m.ledger_commit_latency.observe(Duration::from_micros(300));
        m.ledger_commit_failures = 1;
        let text = render(&m);
        check_format(&text);
        assert!(text.contains("toolwall_requests_total{method=\"tools/call\",outcome=\"ok\"} 3"));
        assert!(text.contains("toolwall_requests_total{method=\"other\",outcome=\"refused\"} 1"));
        assert!(text.contains("rule=\"block-\\\"rm\\\"\\\\\""));
        assert!(text.contains("toolwall_tool_call_duration_seconds_bucket{le=\"0.005\"} 1"));
        assert!(text.contains("toolwall_tool_call_duration_seconds_bucket{le=\"300\"} 1"));
        assert!(text.contains("toolwall_tool_call_duration_seconds_bucket{le=\"+Inf\"} 2"));
        assert!(text.contains("toolwall_tool_call_duration_seconds_count 2"));
        assert!(text.contains("toolwall_ledger_commit_duration_seconds_bucket{le=\"0.0005\"} 1"));
        assert!(text.contains("toolwall_connections{transport=\"http\"} 5"));
        assert!(text.contains("toolwall_ledger_commit_failures_total 1"));
    }

    #[test]
    fn empty_metrics_render() {
        let text = render(&Metrics::default());
        check_format(&text);
        assert!(text.contains("toolwall_requests_in_flight 0"));
        assert!(text.contains("toolwall_tool_call_duration_seconds_bucket{le=\"+Inf\"} 0"));
    }

    #[test]
    fn bucket_edges_are_inclusive() {
        let mut h = Histogram::new(&[1.0, 2.0]);
        h.observe(Duration::from_secs(1));
        h.observe(Duration::from_secs(2));
        h.observe(Duration::from_secs(3));
        assert_eq!(h.counts, vec![1, 1, 1]);
        assert_eq!(h.count(), 3);
    }
}
