//! The figures of one run and how they are printed (markdown) and saved (JSON).

use serde_json::{Value, json};
use std::fmt::Write as _;

use crate::micro::Micro;
use crate::options::Level;

/// One process's share of a measured run.
#[derive(Debug, Clone)]
pub struct ProcFigures {
    pub role: &'static str,
    pub pid: u32,
    /// CPU seconds per 1,000 calls answered inside the window.
    pub cpu_s_per_1k: Option<f64>,
    /// VmHWM and VmRSS in KiB at the end of the window.
    pub peak_kib: Option<u64>,
    pub rss_kib: Option<u64>,
}

/// One door at one level.
#[derive(Debug, Clone)]
pub struct RunRow {
    pub door: String,
    pub level: Level,
    pub calls_per_sec: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub samples: usize,
    pub window_secs: f64,
    pub answered: u64,
    pub errors: u64,
    pub unanswered: u64,
    pub first_error: Option<String>,
    pub procs: Vec<ProcFigures>,
    pub client_cpu_s_per_1k: Option<f64>,
    /// Against the two-hop baseline at the same level.
    pub ratio_calls: Option<f64>,
    pub ratio_p50: Option<f64>,
    /// /proc/loadavg's first figure when the run started.
    pub load_before: f64,
}

/// A door's ledger verdict.
#[derive(Debug, Clone)]
pub struct LedgerRow {
    pub door: String,
    pub ok: bool,
    pub text: String,
}

/// The value at quantile `q` of sorted nanoseconds, in microseconds.
pub fn quantile_us(sorted_ns: &[u64], q: f64) -> f64 {
    if sorted_ns.is_empty() {
        return f64::NAN;
    }
    let at = ((sorted_ns.len() - 1) as f64 * q).round() as usize;
    sorted_ns[at.min(sorted_ns.len() - 1)] as f64 / 1000.0
}

fn num(v: f64, decimals: usize) -> String {
    if v.is_finite() {
        format!("{v:.decimals$}")
    } else {
        "-".into()
    }
}

fn opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".into(), |v| num(v, decimals))
}

fn mib(kib: Option<u64>) -> String {
    kib.map_or_else(|| "-".into(), |k| format!("{:.1}", k as f64 / 1024.0))
}

pub fn markdown(
    rows: &[RunRow],
    ledger: &[LedgerRow],
    micro: &[Micro],
    skipped: &[String],
) -> String {
    let mut out = String::new();
    out.push_str(
        "| door | in flight | calls/s | p50 µs | p90 µs | p99 µs | max µs | calls/s ÷ 2-hop | \
         p50 ÷ 2-hop | CPU s/1k calls (front / back / client) | peak RSS MiB (front / back) |\n",
    );
    out.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|\n");
    for r in rows {
        let front = r.procs.first();
        let back = r.procs.get(1);
        let errors = if r.errors + r.unanswered > 0 {
            format!(" ⚠ {} errors, {} unanswered", r.errors, r.unanswered)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "| {}{errors} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} / {} | {} / {} |",
            r.door,
            r.level.label(),
            num(r.calls_per_sec, 0),
            num(r.p50_us, 1),
            num(r.p90_us, 1),
            num(r.p99_us, 1),
            num(r.max_us, 0),
            opt(r.ratio_calls, 2),
            opt(r.ratio_p50, 2),
            opt(front.and_then(|p| p.cpu_s_per_1k), 4),
            opt(back.and_then(|p| p.cpu_s_per_1k), 4),
            opt(r.client_cpu_s_per_1k, 4),
            mib(front.and_then(|p| p.peak_kib)),
            mib(back.and_then(|p| p.peak_kib)),
        );
    }
    out.push_str("\nfront/back: gateway/worker for toolwall, forwarder/echo for the 2-hop baseline, echo/- for the 1-hop one.\n");

    out.push_str(
        "\n| door | in flight | process | pid | CPU s/1k calls | VmHWM MiB | VmRSS MiB |\n",
    );
    out.push_str("|---|---|---|---:|---:|---:|---:|\n");
    for r in rows {
        for p in &r.procs {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} |",
                r.door,
                r.level.label(),
                p.role,
                p.pid,
                opt(p.cpu_s_per_1k, 4),
                mib(p.peak_kib),
                mib(p.rss_kib)
            );
        }
    }

    if !ledger.is_empty() {
        out.push_str("\n| door | ledger rows vs calls answered |\n|---|---|\n");
        for l in ledger {
            let _ = writeln!(out, "| {} | {} |", l.door, l.text);
        }
    }

    if !micro.is_empty() {
        out.push_str(
            "\n| micro-benchmark | median | p99 | max | note |\n|---|---:|---:|---:|---|\n",
        );
        for m in micro {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} |",
                m.name,
                time(m.ns_per_op),
                m.p99_ns.map_or_else(|| "-".into(), time),
                m.max_ns.map_or_else(|| "-".into(), time),
                m.note
            );
        }
    }
    for s in skipped {
        let _ = writeln!(out, "\nskipped: {s}");
    }
    out
}

fn time(ns: f64) -> String {
    if !ns.is_finite() {
        "-".into()
    } else if ns < 10_000.0 {
        format!("{ns:.0} ns")
    } else {
        format!("{:.1} µs", ns / 1000.0)
    }
}

pub fn row_json(r: &RunRow) -> Value {
    json!({
        "door": r.door,
        "connections": r.level.conns,
        "depth": r.level.depth,
        "in_flight": r.level.in_flight(),
        "calls_per_sec": r.calls_per_sec,
        "p50_us": r.p50_us, "p90_us": r.p90_us, "p99_us": r.p99_us, "max_us": r.max_us,
        "latency_samples": r.samples,
        "window_secs": r.window_secs,
        "answered": r.answered,
        "errors": r.errors,
        "unanswered": r.unanswered,
        "first_error": r.first_error,
        "ratio_calls_vs_two_hop": r.ratio_calls,
        "ratio_p50_vs_two_hop": r.ratio_p50,
        "client_cpu_s_per_1k_calls": r.client_cpu_s_per_1k,
        "load_average_before": r.load_before,
        "processes": r.procs.iter().map(|p| json!({
            "role": p.role, "pid": p.pid, "cpu_s_per_1k_calls": p.cpu_s_per_1k,
            "vm_hwm_kib": p.peak_kib, "vm_rss_kib": p.rss_kib,
        })).collect::<Vec<_>>(),
    })
}
