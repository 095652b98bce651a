//! `cargo bench --bench ledger [-- --rows N] [--keep DIR]`: what the ledger's evidence
//! features cost on a large ledger. Builds a ledger of N calls (default 1,000,000; the
//! issue's figure is 10,000,000) through the gateway's own writer (64 calls per commit,
//! 50 tools, 200 principals, one call in ten blocked with a rule event), then times:
//! the commits that built it, `ledger query` pages (a common tool, a rare tool, a
//! principal, a time window, text), `ledger stats --since 1h`, `ledger show`, `ledger
//! verify` (the whole chain) and, when the build has it, archiving. Reports, never
//! asserts a time. `--keep DIR` keeps (and reuses) the ledger at DIR/ledger.db.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use toolwall::ledger::chain::verify;
use toolwall::ledger::query::{self, Filters, Page};
use toolwall::ledger::{CallEnd, CallStart, Ledger, LedgerConfig, decision, now_ms};

struct Options {
    rows: u64,
    keep: Option<PathBuf>,
    verify: bool,
    archive_rows: u64,
}

fn options() -> Result<Options, String> {
    let mut out = Options {
        rows: 1_000_000,
        keep: None,
        verify: true,
        archive_rows: 200_000,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--rows" => {
                out.rows = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--rows needs a number")?
            }
            "--keep" => out.keep = Some(args.next().ok_or("--keep needs a directory")?.into()),
            "--no-verify" => out.verify = false,
            "--archive-rows" => {
                out.archive_rows = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--archive-rows needs a number (0: no archive run)")?
            }
            "--bench" => {}
            "--help" | "-h" => {
                return Err("cargo bench --bench ledger -- [--rows N] [--keep DIR]".into());
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(out)
}

fn config(dir: &std::path::Path) -> LedgerConfig {
    LedgerConfig {
        path: dir.join("ledger.db"),
        ..LedgerConfig::default()
    }
}

/// Writes `rows` calls as the gateway does under load, 64 per commit, timestamps spread
/// over the last `rows / 1000` seconds (1,000 calls per second).
fn build(cfg: &LedgerConfig, rows: u64) -> Duration {
    let mut ledger = Ledger::open(cfg).expect("open the ledger");
    let now = now_ms();
    let span_ms = i64::try_from(rows).unwrap_or(i64::MAX);
    let started = Instant::now();
    let mut written = 0u64;
    let mut in_flight: Vec<(i64, bool)> = Vec::with_capacity(64);
    while written < rows {
        for &(id, blocked) in &in_flight {
            let response = format!(r#"{{"content":[{{"type":"text","text":"answer {id}"}}]}}"#);
            ledger.stage_call_end(
                id,
                &CallEnd {
                    decision: if blocked {
                        decision::DENIED
                    } else {
                        decision::ALLOWED
                    },
                    policy_rule: None,
                    policy_reason: None,
                    duration_us: 100 + (id as u64 * 7919) % 5000,
                    error_message: None,
                    bytes_sent: response.len(),
                    response: response.as_bytes(),
                    rewritten_arguments: None,
                    original_response: None,
                    approved_by: None,
                    decided_at_ms: None,
                },
            );
        }
        in_flight.clear();
        for _ in 0..64.min(rows - written) {
            let id = ledger.new_call_id();
            let n = id as u64;
            let tool = format!("tool{:02}", (n * 31) % 50);
            let principal = format!("uid:{}", 1000 + (n * 17) % 200);
            let blocked = n.is_multiple_of(10);
            let args = format!(r#"{{"text":"call {id} for {principal}","n":{n}}}"#);
            let ts = now - span_ms + (id * span_ms) / i64::try_from(rows).unwrap_or(1);
            ledger.stage_call(&CallStart {
                id,
                ts_ms: ts,
                transport: if n.is_multiple_of(3) { "http" } else { "unix" },
                principal: &principal,
                process_name: "agent",
                server_name: "local",
                tool_name: &tool,
                method: "tools/call",
                request_id: "1",
                decision: if blocked {
                    decision::DENIED
                } else {
                    decision::ALLOWED
                },
                policy_rule: Some(if blocked {
                    "block-bench"
                } else {
                    "allow-bench"
                }),
                policy_reason: None,
                bytes_received: args.len() + 60,
                arguments: args.as_bytes(),
            });
            if blocked {
                ledger.stage_rule_event(id, 0, "block-bench", "block", "request", "config");
            }
            in_flight.push((id, blocked));
            written += 1;
        }
        ledger.commit().expect("commit");
    }
    for &(id, _) in &in_flight {
        ledger.stage_call_end(
            id,
            &CallEnd {
                decision: decision::ALLOWED,
                policy_rule: None,
                policy_reason: None,
                duration_us: 100,
                error_message: None,
                bytes_sent: 0,
                response: b"{}",
                rewritten_arguments: None,
                original_response: None,
                approved_by: None,
                decided_at_ms: None,
            },
        );
    }
    ledger.commit().expect("commit");
    drop(ledger);
    started.elapsed()
}

fn time<T>(
    label: &str,
    rows: &mut Vec<(String, Duration, String)>,
    f: impl FnOnce() -> (T, String),
) -> T {
    let started = Instant::now();
    let (value, note) = f();
    let took = started.elapsed();
    eprintln!("{label}: {:.1} ms {note}", took.as_secs_f64() * 1e3);
    rows.push((label.to_owned(), took, note));
    value
}

/// Builds a ledger of `calls` calls, then lets retention archive all of it but the newest
/// group while a writer keeps committing (as a live gateway would), and times the run.
fn archive_run(calls: u64, rows: &mut Vec<(String, Duration, String)>) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = config(tmp.path());
    build(&cfg, calls);
    std::thread::sleep(Duration::from_millis(1100));
    let started = Instant::now();
    let mut ledger = Ledger::open(&LedgerConfig {
        retain_secs: Some(1),
        retention_check_secs: 1,
        ..cfg.clone()
    })
    .expect("open");
    let conn = query::open_read_only(&cfg.path).expect("open read-only");
    let mut commit_worst = Duration::ZERO;
    let mut commits = 0u64;
    let archived_at = loop {
        ledger.stage_event("tick", &serde_json::json!({}));
        let t = Instant::now();
        ledger.commit().expect("commit");
        commit_worst = commit_worst.max(t.elapsed());
        commits += 1;
        let done = conn
            .query_row(
                "SELECT (SELECT count(*) FROM events WHERE kind = 'ledger_archived'), \
                 (SELECT min(seq) FROM ledger_chain)",
                [],
                |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)),
            )
            .is_ok_and(|(archived, oldest)| archived > 0 && oldest > 1);
        if done {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(3600),
            "no archive in an hour"
        );
        std::thread::sleep(Duration::from_millis(2));
    };
    drop(ledger);
    let bytes: u64 = std::fs::read_dir(cfg.archive_dir_path())
        .map(|d| {
            d.filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0);
    let db = std::fs::metadata(&cfg.path).map(|m| m.len()).unwrap_or(0);
    let note = format!(
        "{:.0} calls/s archived and deleted; archive {:.1} MiB gzip for a {:.1} MiB ledger; \
         {commits} commits meanwhile, the slowest {:.2} ms",
        calls as f64 / archived_at.as_secs_f64(),
        bytes as f64 / (1 << 20) as f64,
        db as f64 / (1 << 20) as f64,
        commit_worst.as_secs_f64() * 1e3
    );
    eprintln!("archive: {note}");
    rows.push((
        format!("archive {calls} calls (export, record, delete)"),
        archived_at,
        note,
    ));
}

fn main() {
    let opts = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = opts
        .keep
        .clone()
        .unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir).expect("create the directory");
    let cfg = config(&dir);
    let mut rows: Vec<(String, Duration, String)> = Vec::new();
    let have = query::open_read_only(&cfg.path)
        .ok()
        .and_then(|c| {
            c.query_row("SELECT count(*) FROM tool_calls", [], |r| {
                r.get::<_, i64>(0)
            })
            .ok()
        })
        .unwrap_or(0);
    if u64::try_from(have).unwrap_or(0) < opts.rows {
        let _ = std::fs::remove_file(&cfg.path);
        eprintln!(
            "building a ledger of {} calls in {}",
            opts.rows,
            dir.display()
        );
        let took = build(&cfg, opts.rows);
        let note = format!(
            "{:.0} calls/s, {:.1} us per call",
            opts.rows as f64 / took.as_secs_f64(),
            took.as_secs_f64() * 1e6 / opts.rows as f64
        );
        eprintln!("built in {:.1} s: {note}", took.as_secs_f64());
        rows.push((
            format!("write {} calls (64 per commit)", opts.rows),
            took,
            note,
        ));
    }
    let size = std::fs::metadata(&cfg.path).map(|m| m.len()).unwrap_or(0);
    let path = cfg.path.clone();
    let open = || query::open_read_only(&path).expect("open read-only");
    let page = |filters: Filters| {
        move || {
            let calls = query::query(&open(), &filters, Page::Newest, 50).expect("query");
            let n = calls.rows.len();
            (n, format!("{n} calls"))
        }
    };
    time(
        "query --tool local__tool07 (50 newest; 1 call in 50)",
        &mut rows,
        page(Filters {
            tool: Some("local__tool07".into()),
            ..Filters::default()
        }),
    );
    time(
        "query --tool nosuchtool (no match: scans every call)",
        &mut rows,
        page(Filters {
            tool: Some("nosuchtool".into()),
            ..Filters::default()
        }),
    );
    time(
        "query --principal uid:1042 (50 newest; 1 in 200)",
        &mut rows,
        page(Filters {
            principal: Some("uid:1042".into()),
            ..Filters::default()
        }),
    );
    time(
        "query --principal uid:1042 --since 1h",
        &mut rows,
        page(Filters {
            principal: Some("uid:1042".into()),
            since_ms: Some(now_ms() - 3_600_000),
            ..Filters::default()
        }),
    );
    time(
        "query --decision denied --rule block-bench",
        &mut rows,
        page(Filters {
            decision: Some("denied".into()),
            rule: Some("block-bench".into()),
            ..Filters::default()
        }),
    );
    time(
        "query --text 'call 12345 '",
        &mut rows,
        page(Filters {
            text: Some("call 12345 ".into()),
            ..Filters::default()
        }),
    );
    time("stats --since 1h", &mut rows, || {
        let s = query::stats(&open(), now_ms() - 3_600_000, None).expect("stats");
        ((), format!("{} calls", s["calls"]))
    });
    time("show (one call)", &mut rows, || {
        let c = query::show(&open(), 4242).expect("show");
        (
            (),
            format!(
                "chain: {}",
                c.map(|c| c["chain"].to_string()).unwrap_or_default()
            ),
        )
    });
    if opts.verify {
        time("verify (the whole chain)", &mut rows, || {
            let r = verify::verify_file(&cfg.path, &verify::Options::default()).expect("verify");
            (
                (),
                format!(
                    "ok={} groups={} rows={:?}",
                    r.ok(),
                    r.groups,
                    r.chained_rows
                ),
            )
        });
    }
    if opts.archive_rows > 0 {
        archive_run(opts.archive_rows, &mut rows);
    }
    println!(
        "\nledger: {} calls, {:.2} GiB ({})\n",
        opts.rows,
        size as f64 / (1u64 << 30) as f64,
        cfg.path.display()
    );
    println!("| operation | time | note |\n|---|---:|---|");
    for (label, took, note) in rows {
        println!("| {label} | {:.1} ms | {note} |", took.as_secs_f64() * 1e3);
    }
}
