//! Micro-benchmarks of the pieces every call goes through, on the library directly: frame
//! decode, JSON-RPC envelope parse, a policy decision at 1, 20 and 100 rules, and one ledger
//! group commit of 1 and of 64 calls (a real SQLite file in a temporary directory).
//!
//! Cheap operations are timed in batches (the median of the batches' ns per operation);
//! ledger commits are timed one by one, since their spread (a WAL checkpoint now and then)
//! is the point.

use serde_json::{Value, json};
use std::hint::black_box;
use std::time::{Duration, Instant};

use toolwall::ledger::{CallEnd, CallStart, Ledger, LedgerConfig};
use toolwall::policy::{Phase, Policy, PolicyConfig, Subject, Transport};
use toolwall_relay::frame;

use crate::policy_rules;
use crate::wire;

/// One micro-benchmark's figures.
#[derive(Debug, Clone)]
pub struct Micro {
    pub name: String,
    /// Median nanoseconds per operation.
    pub ns_per_op: f64,
    /// Slowest single operation seen, when they were timed one by one.
    pub p99_ns: Option<f64>,
    pub max_ns: Option<f64>,
    pub ops: u64,
    pub note: String,
}

impl Micro {
    pub fn json(&self) -> Value {
        json!({
            "name": self.name, "ns_per_op": self.ns_per_op, "p99_ns": self.p99_ns,
            "max_ns": self.max_ns, "ops": self.ops, "note": self.note,
        })
    }
}

/// Batches of `f` for `budget`; the median of the batches' time per call.
fn batched(budget: Duration, mut f: impl FnMut()) -> (f64, u64) {
    // Size a batch to about 1 ms.
    let mut batch = 1u64;
    loop {
        let t = Instant::now();
        for _ in 0..batch {
            f();
        }
        if t.elapsed() >= Duration::from_micros(1000) || batch >= 1 << 24 {
            break;
        }
        batch *= 2;
    }
    let mut per_op = Vec::new();
    let mut ops = 0;
    let end = Instant::now() + budget;
    while Instant::now() < end || per_op.len() < 5 {
        let t = Instant::now();
        for _ in 0..batch {
            f();
        }
        per_op.push(t.elapsed().as_nanos() as f64 / batch as f64);
        ops += batch;
    }
    per_op.sort_by(f64::total_cmp);
    (per_op[per_op.len() / 2], ops)
}

/// The request frame and payload of a typical echo call.
fn sample_request() -> (Vec<u8>, Vec<u8>) {
    let mut text = String::new();
    wire::call_text(3, 12345, &mut text);
    let mut payload = Vec::new();
    wire::request_json(12345, wire::ECHO_TOOL, &text, &mut payload);
    let mut framed = Vec::new();
    // A constant, well-formed frame.
    let _ = frame::encode(&mut framed, 12345, 0, wire::CLIENT_NAME, &payload);
    (framed, payload)
}

pub fn run_all(budget: Duration) -> Vec<Micro> {
    let mut out = Vec::new();
    let (framed, payload) = sample_request();

    let (ns, ops) = batched(budget, || {
        let _ = black_box(frame::decode_frame(black_box(&framed)));
    });
    out.push(Micro {
        name: "frame decode".into(),
        ns_per_op: ns,
        p99_ns: None,
        max_ns: None,
        ops,
        note: format!(
            "toolwall_relay::frame::decode_frame, {} byte frame",
            framed.len()
        ),
    });

    let (ns, ops) = batched(budget, || {
        let _ = black_box(toolwall::mcp::jsonrpc::parse(black_box(&payload)));
    });
    out.push(Micro {
        name: "JSON-RPC envelope parse".into(),
        ns_per_op: ns,
        p99_ns: None,
        max_ns: None,
        ops,
        note: format!(
            "toolwall::mcp::jsonrpc::parse, {} byte tools/call",
            payload.len()
        ),
    });

    for n in [1, 20, 100] {
        out.push(policy_decision(n, budget));
    }
    for rows in [1, 64] {
        out.push(ledger_commit(rows, budget));
    }
    out
}

fn skipped(name: String, why: String) -> Micro {
    Micro {
        name,
        ns_per_op: f64::NAN,
        p99_ns: None,
        max_ns: None,
        ops: 0,
        note: format!("skipped: {why}"),
    }
}

/// `decide` in the request phase for a `local__echo` call, with `n` operator rules and the
/// built-in rules off (so exactly `n` rules are in force).
fn policy_decision(n: usize, budget: Duration) -> Micro {
    let name = format!("policy decision, {n} rules");
    let config: PolicyConfig = match toml::from_str(&policy_rules::rules_toml(n)) {
        Ok(c) => c,
        Err(e) => {
            let first = e.to_string().lines().next().unwrap_or_default().to_string();
            return skipped(
                name,
                format!("this build's policy takes no rules ({first})"),
            );
        }
    };
    let policy = match Policy::load(&config, "bench") {
        Ok(p) => p,
        Err(e) => return skipped(name, format!("the rules do not load: {e}")),
    };
    let mut text = String::new();
    wire::call_text(3, 12345, &mut text);
    let arguments = json!({ "text": text });
    let subject = Subject {
        method: "tools/call",
        server: Some("local"),
        tool: Some("local__echo"),
        resource: None,
        principal: "uid:1000",
        transport: Transport::Unix,
        process: wire::CLIENT_NAME,
        arguments: Some(&arguments),
    };
    let decision = policy.decide(Phase::Request, &subject, None);
    let (ns, ops) = batched(budget, || {
        black_box(policy.decide(Phase::Request, black_box(&subject), None));
    });
    Micro {
        name,
        ns_per_op: ns,
        p99_ns: None,
        max_ns: None,
        ops,
        note: format!(
            "verdict {:?} (rule {:?}); arguments already parsed",
            decision.verdict, decision.rule
        ),
    }
}

/// Stage `rows` calls (start and end, as the gateway does for a call answered within the
/// turn) and commit them in one transaction; timed per commit.
fn ledger_commit(rows: usize, budget: Duration) -> Micro {
    let name = format!("ledger group commit, {rows} calls");
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => return skipped(name, e.to_string()),
    };
    let path = dir.path().join("ledger.db");
    let mut ledger = match Ledger::open(&LedgerConfig {
        path: path.clone(),
        ..LedgerConfig::default()
    }) {
        Ok(l) => l,
        Err(e) => return skipped(name, format!("open: {e}")),
    };
    let mut text = String::new();
    let mut arguments = Vec::new();
    let mut response = Vec::new();
    let mut samples: Vec<f64> = Vec::new();
    let end = Instant::now() + budget;
    let mut seq = 0u32;
    let mut failure = None;
    while Instant::now() < end || samples.len() < 20 {
        let t = Instant::now();
        for _ in 0..rows {
            seq += 1;
            wire::call_text(1, seq, &mut text);
            arguments.clear();
            arguments.extend_from_slice(format!("{{\"text\":\"{text}\"}}").as_bytes());
            response.clear();
            response.extend_from_slice(
                format!("{{\"content\":[{{\"type\":\"text\",\"text\":\"{text}\"}}]}}").as_bytes(),
            );
            let id = ledger.new_call_id();
            let request_id = seq.to_string();
            ledger.stage_call(&CallStart {
                id,
                ts_ms: 1_700_000_000_000 + i64::from(seq),
                transport: "unix",
                principal: "uid:1000",
                process_name: wire::CLIENT_NAME,
                server_name: "local",
                tool_name: "echo",
                method: "tools/call",
                request_id: &request_id,
                decision: "allowed",
                policy_rule: Some("local-echo"),
                policy_reason: Some("allow by rule local-echo"),
                bytes_received: arguments.len() + 90,
                arguments: &arguments,
            });
            ledger.stage_call_end(
                id,
                &CallEnd {
                    decision: "allowed",
                    policy_rule: None,
                    policy_reason: None,
                    duration_us: 40,
                    error_message: None,
                    bytes_sent: response.len() + 40,
                    response: &response,
                    rewritten_arguments: None,
                    original_response: None,
                    approved_by: None,
                    decided_at_ms: None,
                },
            );
        }
        if let Err(e) = ledger.commit() {
            failure = Some(e.to_string());
            break;
        }
        samples.push(t.elapsed().as_nanos() as f64);
    }
    if let Some(why) = failure {
        return skipped(name, format!("commit failed: {why}"));
    }
    if !path.exists() {
        return skipped(name, "this build's ledger writes no file".into());
    }
    samples.sort_by(f64::total_cmp);
    let pick = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    let per_call = pick(0.5) / rows as f64;
    Micro {
        name,
        ns_per_op: pick(0.5),
        p99_ns: Some(pick(0.99)),
        max_ns: samples.last().copied(),
        ops: samples.len() as u64,
        note: format!(
            "per commit, staging included: {:.1} us per call, {:.0} calls/s",
            per_call / 1000.0,
            1e9 / per_call
        ),
    }
}

/// Whether this build's ledger writes a real file (the interface stand-in writes none).
pub fn ledger_is_real() -> bool {
    let Ok(dir) = tempfile::tempdir() else {
        return false;
    };
    let path = dir.path().join("probe.db");
    let opened = Ledger::open(&LedgerConfig {
        path: path.clone(),
        ..LedgerConfig::default()
    });
    match opened {
        Ok(mut l) => {
            let _ = l.commit();
            path.exists()
        }
        Err(_) => false,
    }
}
