//! Workloads that measure what a commit costs, on a real file. Used by an ignored test and
//! meant for the benchmark harness; they report, they never assert a time.

use std::path::Path;
use std::time::{Duration, Instant};

use super::error::LedgerError;
use super::record::{CallEnd, CallStart, decision};
use super::writer::Ledger;
use super::{LedgerConfig, now_ms};

/// Wall-clock cost of a run of commits.
#[derive(Debug, Clone, Copy)]
pub struct CommitMeasurement {
    pub commits: u64,
    /// Calls whose start and end were both committed (0 for the one-row workload).
    pub calls: u64,
    /// Time spent staging rows.
    pub staging: Duration,
    /// Time spent in `commit`.
    pub committing: Duration,
}

impl CommitMeasurement {
    /// Microseconds per commit, staging excluded.
    pub fn us_per_commit(&self) -> f64 {
        self.committing.as_secs_f64() * 1e6 / self.commits.max(1) as f64
    }

    /// Microseconds per loop turn: staging plus commit.
    pub fn us_per_turn(&self) -> f64 {
        (self.staging + self.committing).as_secs_f64() * 1e6 / self.commits.max(1) as f64
    }

    /// Calls per second the ledger sustains, staging included.
    pub fn calls_per_sec(&self) -> f64 {
        let secs = (self.staging + self.committing).as_secs_f64();
        if secs > 0.0 {
            self.calls as f64 / secs
        } else {
            0.0
        }
    }
}

/// A ledger at `dir/ledger.db` with the default limits.
pub fn open_in(dir: &Path) -> Result<Ledger, LedgerError> {
    Ledger::open(&LedgerConfig {
        path: dir.join("ledger.db"),
        ..LedgerConfig::default()
    })
}

/// `commits` commits of one `events` row each.
pub fn commit_one_row(ledger: &mut Ledger, commits: u64) -> Result<CommitMeasurement, LedgerError> {
    let mut m = CommitMeasurement {
        commits,
        calls: 0,
        staging: Duration::ZERO,
        committing: Duration::ZERO,
    };
    let detail = serde_json::json!({ "conn": 1, "transport": "unix" });
    for _ in 0..commits {
        let started = Instant::now();
        ledger.stage_event("connect", &detail);
        let staged = Instant::now();
        ledger.commit()?;
        m.staging += staged - started;
        m.committing += staged.elapsed();
    }
    Ok(m)
}

/// The gateway's steady state: each commit holds the starts of `calls_per_commit` new calls
/// (row + arguments blob) and the ends of the previous turn's calls (update + response
/// blob). Every body is distinct, so no blob insert is deduplicated away.
pub fn commit_calls(
    ledger: &mut Ledger,
    calls_per_commit: usize,
    commits: u64,
) -> Result<CommitMeasurement, LedgerError> {
    let mut m = CommitMeasurement {
        commits,
        calls: 0,
        staging: Duration::ZERO,
        committing: Duration::ZERO,
    };
    let mut arguments = Vec::with_capacity(128);
    let mut response = Vec::with_capacity(256);
    let mut in_flight: Vec<i64> = Vec::with_capacity(calls_per_commit);
    let mut next_in_flight: Vec<i64> = Vec::with_capacity(calls_per_commit);
    for _ in 0..commits {
        let started = Instant::now();
        for &id in &in_flight {
            response.clear();
            response.extend_from_slice(br#"{"content":[{"type":"text","text":"hello from call "#);
            response.extend_from_slice(id.to_string().as_bytes());
            response.extend_from_slice(br#""}],"isError":false}"#);
            ledger.stage_call_end(
                id,
                &CallEnd {
                    decision: decision::ALLOWED,
                    policy_rule: None,
                    policy_reason: None,
                    duration_us: 180,
                    error_message: None,
                    bytes_sent: response.len(),
                    response: &response,
                    rewritten_arguments: None,
                    original_response: None,
                    approved_by: None,
                    decided_at_ms: None,
                },
            );
        }
        m.calls += in_flight.len() as u64;
        next_in_flight.clear();
        let ts_ms = now_ms();
        for _ in 0..calls_per_commit {
            let id = ledger.new_call_id();
            arguments.clear();
            arguments.extend_from_slice(br#"{"text":"hello from call "#);
            arguments.extend_from_slice(id.to_string().as_bytes());
            arguments.extend_from_slice(br#""}"#);
            let request_id = id.to_string();
            ledger.stage_call(&CallStart {
                id,
                ts_ms,
                transport: "unix",
                principal: "uid:1000",
                process_name: "claude",
                server_name: "local",
                tool_name: "echo",
                method: "tools/call",
                request_id: &request_id,
                decision: decision::ALLOWED,
                policy_rule: Some("allow-local"),
                policy_reason: None,
                bytes_received: arguments.len() + 64,
                arguments: &arguments,
            });
            next_in_flight.push(id);
        }
        std::mem::swap(&mut in_flight, &mut next_in_flight);
        let staged = Instant::now();
        ledger.commit()?;
        m.staging += staged - started;
        m.committing += staged.elapsed();
    }
    Ok(m)
}
