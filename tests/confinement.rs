//! Worker confinement seen from outside: /proc of the live worker, a re-attestation run
//! inside the serving worker, and a worker whose attestation fails getting no work.

mod common;

use common::*;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

fn proc_field(pid: u32, field: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_owned())
        .unwrap_or_default()
}

#[test]
fn live_worker_is_confined_with_an_empty_environment_and_only_its_fds() {
    let gw = TestGateway::start("");
    let pid = gw.worker_pid();
    assert_eq!(proc_field(pid, "Seccomp"), "2");
    assert_eq!(proc_field(pid, "NoNewPrivs"), "1");
    assert_eq!(
        proc_field(pid, "CapEff"),
        "0000000000000000",
        "no capabilities"
    );
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let names: Vec<String> = environ
        .split(|b| *b == 0)
        .filter(|v| !v.is_empty())
        .map(|v| {
            String::from_utf8_lossy(v)
                .split('=')
                .next()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    assert!(
        names.is_empty(),
        "the builtin role needs no environment: {names:?}"
    );
    // Every fd is stdio, its RPC socket, or its own event loop's; never the ledger or
    // the gateway's listeners.
    let mut kinds = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap() {
        let entry = entry.unwrap();
        let fd: u32 = entry.file_name().to_string_lossy().parse().unwrap();
        let target = std::fs::read_link(entry.path())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let ok = match fd {
            0 => target.starts_with("pipe:"), // the settings pipe, read to EOF
            1 => target == "/dev/null",
            2 => target.starts_with("pipe:") || target.starts_with("/dev/"),
            3 => target.starts_with("socket:"),
            _ => target == "anon_inode:[eventpoll]" || target == "anon_inode:[eventfd]",
        };
        assert!(ok, "fd {fd} -> {target}");
        kinds.push(target);
    }
    assert!(
        kinds
            .iter()
            .all(|k| !k.contains("ledger") && !k.contains(".sock")),
        "{kinds:?}"
    );
    // The worker is in its own session.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit(") ").next().unwrap().split(' ').collect();
    assert_eq!(
        fields[3],
        pid.to_string(),
        "session id is its own pid (setsid)"
    );
    // status shows it all.
    let out = gw.cli(&["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "landlock ABI",
        "fully_enforced",
        "seccomp true",
        "probe fork",
        "denied",
    ] {
        assert!(text.contains(needle), "status shows {needle}:\n{text}");
    }
}

#[test]
fn probes_rerun_inside_the_serving_worker_are_all_denied_and_it_keeps_serving() {
    let gw = TestGateway::start("");
    let mut c = gw.connect();
    // Work first, so the pool threads are running when the probes run.
    for i in 0..20 {
        c.tool("local__echo", json!({"text": format!("warm {i}")}));
    }
    let r = gw.admin(json!({"op": "attest"}));
    assert_eq!(r["asked"], 1, "{r}");
    let deadline = Instant::now() + PATIENCE;
    let event = loop {
        if let Some(e) = gw.events("worker_reattested").pop() {
            break e;
        }
        assert!(Instant::now() < deadline, "no worker_reattested event");
        std::thread::sleep(Duration::from_millis(20));
    };
    let detail: Value = serde_json::from_str(event["detail"].as_str().unwrap()).unwrap();
    assert_eq!(detail["confined"], true, "{detail:#}");
    assert_eq!(detail["gaps"], json!([]), "{detail:#}");
    let probes = detail["report"]["probes"].as_array().unwrap();
    for name in [
        "create_file_tmp",
        "read_probe_dir",
        "fork",
        "exec",
        "connect_ungranted_port",
        "bind_tcp",
    ] {
        let p = probes
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("probe {name}"));
        assert_eq!(p["denied"], true, "{p}");
    }
    let r = c.tool("local__echo", json!({"text": "after probes"}));
    assert_eq!(r["result"]["content"][0]["text"], "after probes");
}

#[test]
fn a_worker_whose_attestation_fails_gets_no_work() {
    // Granting every TCP port leaves the connect probe nothing to prove: the report shows
    // it not denied, so the gateway must refuse the worker.
    let ports: Vec<String> = (1..=65535u32).map(|p| p.to_string()).collect();
    let extra = format!("[builtin.http]\nextra_ports = [{}]\n", ports.join(","));
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("toolwall.toml");
    std::fs::write(&config_path, base_config(dir.path(), &extra)).unwrap();
    let mut child = KillOnDrop(
        std::process::Command::new(BIN)
            .args(["serve", "--config"])
            .arg(&config_path)
            .current_dir(dir.path())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stderr = child.0.stderr.take().unwrap();
    let lines = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = std::sync::Arc::clone(&lines);
    std::thread::spawn(move || {
        use std::io::BufRead;
        for l in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            sink.lock().unwrap().push_str(&l);
            sink.lock().unwrap().push('\n');
        }
    });
    let deadline = Instant::now() + PATIENCE;
    while !lines
        .lock()
        .unwrap()
        .contains("failed its confinement attestation")
    {
        assert!(
            Instant::now() < deadline,
            "no refusal logged:\n{}",
            lines.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        lines.lock().unwrap().contains("connect_ungranted_port"),
        "names the probe:\n{}",
        lines.lock().unwrap()
    );
    // Agents are served, but the refused worker gets nothing.
    let mut c = FramedClient::connect(&dir.path().join("mcp.sock"));
    let r = c.tool("local__echo", json!({"text": "x"}));
    assert!(
        r["error"]["code"] == -32602
            || r["result"]["structuredContent"]["error"]["code"] == "worker_unavailable",
        "no work for an unproven worker: {r}"
    );
    let ledger = rusqlite::Connection::open(dir.path().join("state/ledger.db")).unwrap();
    let gone: i64 = ledger
        .query_row("SELECT count(*) FROM events WHERE kind = 'worker_gone' AND detail LIKE '%attestation%'", [], |r| r.get(0))
        .unwrap();
    assert!(gone >= 1, "the refusal is recorded");
    drop(child);
}

/// A gateway the test started on its own: killed even when an assertion fails.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
