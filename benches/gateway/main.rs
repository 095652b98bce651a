//! `cargo bench --bench gateway [-- --quick]`: what a `local__echo` call through toolwall
//! costs, against a minimal echo server (one hop) and a minimal forwarder in front of it (two
//! hops, toolwall's shape without its work), with the same client code in the same run.
//! See benches/README.md for what each figure means.

mod baseline;
mod doors;
mod load;
mod micro;
mod options;
mod policy_rules;
mod procstat;
mod report;
mod stdio_doors;
mod toolwall_proc;
mod wire;

use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use doors::{BASELINE_TWO_HOP, Ctx, Door, LedgerCheck};
use load::Window;
use options::{Level, Options};
use report::{LedgerRow, ProcFigures, RunRow};

/// The toolwall binary cargo built for this bench, with the same (release) profile.
const TOOLWALL_BIN: &str = env!("CARGO_BIN_EXE_toolwall");
pub const WORKSPACE: &str = env!("CARGO_MANIFEST_DIR");

static NOTES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Something the reader of the results must know; printed now and kept for the report.
pub fn note(text: &str) {
    eprintln!("note: {text}");
    if let Ok(mut n) = NOTES.lock() {
        n.push(text.to_string());
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(code) = baseline::child_main(&args) {
        std::process::exit(code);
    }
    let opts = match options::parse(args.into_iter().skip(1).collect()) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    std::process::exit(run(&opts));
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

fn newest_mtime(path: &Path) -> Option<SystemTime> {
    let meta = std::fs::metadata(path).ok()?;
    if meta.is_file() {
        return meta.modified().ok();
    }
    std::fs::read_dir(path)
        .ok()?
        .filter_map(|e| newest_mtime(&e.ok()?.path()))
        .max()
}

/// The relay as it ships to guests: static (glibc linked in, no loader or shared libc to
/// page in), size-optimised (`release-small`), built when missing or older than its sources
/// into `target/x86_64-unknown-linux-gnu/release-small/toolwall-relay`.
fn relay_binary() -> Option<PathBuf> {
    const TRIPLE: &str = "x86_64-unknown-linux-gnu";
    let bin = target_dir()
        .join(TRIPLE)
        .join("release-small")
        .join("toolwall-relay");
    let guest = Path::new(WORKSPACE).join("guest");
    let sources = newest_mtime(&guest.join("src")).max(newest_mtime(&guest.join("Cargo.toml")));
    let built = std::fs::metadata(&bin).and_then(|m| m.modified()).ok();
    if built.is_none() || built < sources {
        eprintln!("building toolwall-relay (static, release-small)");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args([
                "build",
                "--profile",
                "release-small",
                "-p",
                "toolwall-relay",
                "--target",
                TRIPLE,
            ])
            .env("RUSTFLAGS", "-C target-feature=+crt-static")
            .current_dir(WORKSPACE)
            .status();
        if !status.is_ok_and(|s| s.success()) {
            note("toolwall-relay did not build; the relay door is skipped");
            return None;
        }
    }
    bin.exists().then_some(bin)
}

/// Where results go: $CARGO_TARGET_DIR, else the target directory this bench runs from.
fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.ancestors().nth(3)?.to_path_buf()))
        .unwrap_or_else(|| Path::new(WORKSPACE).join("target"))
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

fn run(opts: &Options) -> i32 {
    let machine = procstat::machine();
    eprintln!("machine: {machine}; load average {:.2}", load_average());
    if let Err(e) = wire::self_check() {
        eprintln!("the client's codec fails its self-check: {e}");
        return 2;
    }
    // TOOLWALL_BENCH_BIN: another build of toolwall, driven by this same client (A/B
    // runs of two builds interleaved, with one harness).
    let toolwall_bin = std::env::var_os("TOOLWALL_BENCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(TOOLWALL_BIN));
    if !toolwall_bin.exists() {
        eprintln!(
            "{} is missing: run this through `cargo bench --bench gateway`",
            toolwall_bin.display()
        );
        return 2;
    }
    if toolwall_bin != Path::new(TOOLWALL_BIN) {
        note(&format!("toolwall binary: {}", toolwall_bin.display()));
    }
    let with_rules = match toolwall_proc::config_takes_rules() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    let ledger_is_real = micro::ledger_is_real();
    if !ledger_is_real {
        note("this build's ledger writes no file: ledger rows cannot be counted");
    }
    let ctx = Ctx {
        toolwall_bin,
        relay_bin: if opts.wants_door("toolwall relay") {
            relay_binary()
        } else {
            None
        },
        with_rules,
        ledger_is_real,
    };

    let mut rows: Vec<RunRow> = Vec::new();
    let mut ledger_rows: Vec<LedgerRow> = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    let started = Instant::now();
    for (name, open) in doors::all_doors() {
        if !opts.wants_door(name) {
            continue;
        }
        let mut door = match open(&ctx) {
            Ok(d) => d,
            Err(why) => {
                eprintln!("skipped {name}: {why}");
                skipped.push(format!("{name}: {why}"));
                continue;
            }
        };
        let check = run_door(door.as_mut(), opts, &mut rows);
        if !matches!(check, LedgerCheck::NotApplicable) {
            eprintln!("{name}: ledger {}", check.describe());
            ledger_rows.push(LedgerRow {
                door: name.to_string(),
                ok: check.ok(),
                text: check.describe(),
            });
        }
    }

    stdio_doors::note_ratio(&rows);
    let cpus = machine["cpus"].as_u64().unwrap_or(1) as f64;
    let busiest = rows.iter().map(|r| r.load_before).fold(0.0, f64::max);
    if busiest > cpus / 2.0 {
        note(&format!(
            "the machine was busy: load average up to {busiest:.1} on {cpus} CPUs before a run; \
             figures are noisier and lower than on an idle machine"
        ));
    }

    let micro = if opts.run_micro {
        eprintln!("micro-benchmarks");
        micro::run_all(opts.micro)
    } else {
        Vec::new()
    };

    let table = report::markdown(&rows, &ledger_rows, &micro, &skipped);
    println!("\n{table}");
    let notes = NOTES.lock().map(|n| n.clone()).unwrap_or_default();
    for n in &notes {
        println!("note: {n}");
    }
    let doc = json!({
        "machine": machine,
        "command": std::env::args().collect::<Vec<_>>(),
        "quick": opts.quick,
        "warmup_secs": opts.warmup.as_secs_f64(),
        "duration_secs": opts.duration.as_secs_f64(),
        "client_threads": opts.client_threads,
        "policy_rules": if with_rules { 20 } else { 0 },
        "ledger_checked": ledger_is_real,
        "runs": rows.iter().map(report::row_json).collect::<Vec<_>>(),
        "ledger": ledger_rows.iter().map(|l| json!({"door": l.door, "ok": l.ok, "check": l.text})).collect::<Vec<_>>(),
        "micro": micro.iter().map(micro::Micro::json).collect::<Vec<_>>(),
        "skipped": skipped,
        "notes": notes,
        "elapsed_secs": started.elapsed().as_secs_f64(),
    });
    let out_dir = target_dir().join("bench");
    let out = out_dir.join("gateway.json");
    let written = std::fs::create_dir_all(&out_dir).and_then(|_| {
        std::fs::write(
            &out,
            serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n",
        )
    });
    match written {
        Ok(()) => println!("\nwrote {}", out.display()),
        Err(e) => eprintln!("could not write {}: {e}", out.display()),
    }

    let mut code = 0;
    for l in ledger_rows.iter().filter(|l| !l.ok) {
        eprintln!("FAIL: {}: ledger {}", l.door, l.text);
        code = 1;
    }
    for r in rows.iter().filter(|r| r.errors + r.unanswered > 0) {
        eprintln!(
            "FAIL: {} at {}: {} errors, {} unanswered; first: {}",
            r.door,
            r.level.label(),
            r.errors,
            r.unanswered,
            r.first_error.as_deref().unwrap_or("-")
        );
        code = 1;
    }
    code
}

/// Every level of one door, then its ledger check.
fn run_door(door: &mut dyn Door, opts: &Options, rows: &mut Vec<RunRow>) -> LedgerCheck {
    let mut answered = 0u64;
    let levels: Vec<Level> = opts
        .levels
        .iter()
        .copied()
        .filter(|&l| door.runs_at(l))
        .collect();
    for level in levels {
        match run_level(door, opts, level, rows) {
            Ok(row) => {
                answered += row.answered;
                eprintln!(
                    "{} c={}: {:.0} calls/s, p50 {:.1} µs, p99 {:.1} µs ({})",
                    row.door,
                    level.label(),
                    row.calls_per_sec,
                    row.p50_us,
                    row.p99_us,
                    doors::describe_procs(&door.processes())
                );
                rows.push(row);
            }
            Err(e) => {
                eprintln!("{} c={}: {e}", door.name(), level.label());
                return LedgerCheck::Failed(format!("run at {} failed: {e}", level.label()));
            }
        }
    }
    door.finish(answered)
}

fn run_level(
    door: &mut dyn Door,
    opts: &Options,
    level: Level,
    rows: &[RunRow],
) -> Result<RunRow, String> {
    let load_before = load_average();
    let conns = (0..level.conns)
        .map(|_| door.connect())
        .collect::<Result<Vec<_>, _>>()?;
    let procs = door.processes();
    eprintln!(
        "{} c={}: running ({})",
        door.name(),
        level.label(),
        doors::describe_procs(&procs)
    );
    let start = Instant::now() + opts.warmup;
    let window = Window {
        start,
        end: start + opts.duration,
    };
    let threads = opts.client_threads;
    let depth = level.depth;
    let driver = std::thread::spawn(move || load::drive(conns, depth, threads, window));

    sleep_until(window.start);
    let cpu_before: Vec<Option<f64>> = procs.iter().map(|p| procstat::cpu_seconds(p.pid)).collect();
    let client_before = procstat::own_cpu_seconds();
    sleep_until(window.end);
    let cpu_after: Vec<Option<f64>> = procs.iter().map(|p| procstat::cpu_seconds(p.pid)).collect();
    let client_after = procstat::own_cpu_seconds();
    let window_secs = opts.duration.as_secs_f64();

    let (result, open) = driver
        .join()
        .map_err(|_| "the load driver panicked".to_string())?;
    let memory: Vec<Option<(u64, u64)>> =
        procs.iter().map(|p| procstat::memory_kib(p.pid)).collect();
    drop(open);

    let calls = result.window_replies;
    let per_1k = |before: Option<f64>, after: Option<f64>| -> Option<f64> {
        let (b, a) = (before?, after?);
        (calls > 0).then(|| (a - b) * 1000.0 / calls as f64)
    };
    let proc_figures = procs
        .iter()
        .enumerate()
        .map(|(i, p)| ProcFigures {
            role: p.role,
            pid: p.pid,
            cpu_s_per_1k: per_1k(cpu_before[i], cpu_after[i]),
            peak_kib: memory[i].map(|m| m.0),
            rss_kib: memory[i].map(|m| m.1),
        })
        .collect();
    let lat = &result.latencies_ns;
    let calls_per_sec = calls as f64 / window_secs;
    let p50_us = report::quantile_us(lat, 0.5);
    let two_hop = rows
        .iter()
        .find(|r| r.door == BASELINE_TWO_HOP && r.level == level);
    let ratio = |ours: f64, base: f64| (base > 0.0 && ours.is_finite()).then(|| ours / base);
    // Let the processes settle before the next level.
    std::thread::sleep(Duration::from_millis(100));
    Ok(RunRow {
        door: door.name().to_string(),
        level,
        calls_per_sec,
        p50_us,
        p90_us: report::quantile_us(lat, 0.9),
        p99_us: report::quantile_us(lat, 0.99),
        max_us: report::quantile_us(lat, 1.0),
        samples: lat.len(),
        window_secs,
        answered: result.answered,
        errors: result.errors,
        unanswered: result.unanswered,
        first_error: result.first_error,
        procs: proc_figures,
        client_cpu_s_per_1k: per_1k(client_before, client_after),
        ratio_calls: two_hop.and_then(|b| ratio(calls_per_sec, b.calls_per_sec)),
        ratio_p50: two_hop.and_then(|b| ratio(p50_us, b.p50_us)),
        load_before,
    })
}
