//! `cargo bench --bench workspace`: what a workspace costs. Two figures, each the median
//! (and spread) of several runs, printed and never asserted:
//!
//! - **start-up**: from spawning `toolwall serve` (one workspace) to the log line saying
//!   the workspace's worker attested and is ready, and to `ready`;
//! - **`shell_run "true"`**: one `ws__shell_run` call through the framed unix door, from
//!   the request's write to its answer, called one after another.
//!
//! Needs root (as the tests do): the workspace root is handed to the agent user
//! (`toolwall-agent`) when that user exists. Flags: `--runs N` (start-ups, default 10),
//! `--calls N` (shell_run calls, default 200).

#[path = "../tests/common/mod.rs"]
mod common;

use serde_json::json;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const AGENT_USER: &str = "toolwall-agent";

fn main() {
    let mut runs = 10usize;
    let mut calls = 200usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--runs" => runs = args.next().and_then(|v| v.parse().ok()).expect("--runs N"),
            "--calls" => calls = args.next().and_then(|v| v.parse().ok()).expect("--calls N"),
            "--bench" => {}
            other => {
                eprintln!("unknown flag {other}; flags: --runs N --calls N");
                std::process::exit(2);
            }
        }
    }
    let mut worker_ready = Vec::new();
    let mut all_ready = Vec::new();
    for _ in 0..runs {
        let (w, r) = start_up();
        worker_ready.push(w);
        all_ready.push(r);
    }
    let latencies = shell_run_latency(calls);
    println!("| figure | median | min | max | n |");
    println!("|---|---|---|---|---|");
    row(
        "start-up: spawn to workspace worker ready",
        &mut worker_ready,
    );
    row("start-up: spawn to gateway ready", &mut all_ready);
    let mut lat = latencies;
    row("shell_run \"true\" through the unix door", &mut lat);
    let p90 = lat[(lat.len() * 9 / 10).min(lat.len() - 1)];
    println!("\nshell_run p90: {:.2} ms", ms(p90));
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn row(what: &str, v: &mut [Duration]) {
    v.sort();
    println!(
        "| {what} | {:.2} ms | {:.2} ms | {:.2} ms | {} |",
        ms(v[v.len() / 2]),
        ms(v[0]),
        ms(v[v.len() - 1]),
        v.len()
    );
}

/// A config with one workspace owned by this uid, its root given to the agent user.
fn setup() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = std::fs::canonicalize(dir.path()).expect("canonical");
    let root = base.join("ws");
    std::fs::create_dir_all(&root).expect("mkdir");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let _ = Command::new("chown")
        .arg(format!("{AGENT_USER}:"))
        .arg(&root)
        .stderr(Stdio::null())
        .status();
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let config = common::base_config(
        &base,
        &format!(
            "[workspaces.bench]\nroot = \"{}\"\nowners = [\"uid:{uid}\"]\n",
            root.display()
        ),
    );
    let path = base.join("toolwall.toml");
    std::fs::write(&path, config).expect("config");
    (dir, path)
}

/// (spawn to the workspace worker's ready line, spawn to `ready`).
fn start_up() -> (Duration, Duration) {
    let (dir, config) = setup();
    let start = Instant::now();
    let mut child = Command::new(common::BIN)
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn toolwall serve");
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send((Instant::now(), line)).is_err() {
                return;
            }
        }
    });
    let mut worker = None;
    let mut ready = None;
    let mut log = Vec::new();
    while ready.is_none() {
        let (at, line) = rx
            .recv_timeout(common::PATIENCE)
            .unwrap_or_else(|_| panic!("no ready line; log:\n{}", log.join("\n")));
        if line.contains("worker workspace:bench") && line.contains("attested and ready") {
            worker = Some(at - start);
        }
        if line.contains("info: ready") {
            ready = Some(at - start);
        }
        log.push(line);
    }
    let _ = child.kill();
    let _ = child.wait();
    (
        worker.unwrap_or_else(|| panic!("no worker line; log:\n{}", log.join("\n"))),
        ready.expect("ready"),
    )
}

fn shell_run_latency(calls: usize) -> Vec<Duration> {
    let (dir, config) = setup();
    let text = std::fs::read_to_string(&config).expect("config");
    let gw = common::TestGateway::start_with(dir, &text);
    let mut agent = gw.connect();
    let mut out = Vec::with_capacity(calls);
    for i in 0..calls + 10 {
        let t = Instant::now();
        let r = agent.tool(
            "ws__shell_run",
            json!({"worker": "bench", "command": "true"}),
        );
        let took = t.elapsed();
        let status = &r["result"]["structuredContent"]["status"];
        assert_eq!(status, "completed", "{r}");
        if i >= 10 {
            out.push(took);
        }
    }
    out
}
