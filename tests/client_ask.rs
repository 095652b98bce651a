//! `ask_via = "client"` through the real binary: an ask rule holds `*__note` (a tool of the
//! SDK relay fixture that records each run) and the human at the client answers, with the
//! official Python SDK as the client over the HTTP door (both eras) and `toolwall stdio`.
//! Approve: the tool runs once with the original arguments, and the row says who decided.
//! Decline: `ask_denied`, the tool never runs. A client without elicitation: the operator
//! decides. A forged, replayed, expired or argument-swapped `requestState` never runs it.

mod common;

use common::http::{HttpGateway, MODERN, Req, modern, rpc};
use common::{BIN, PATIENCE};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn python() -> PathBuf {
    repo().join("target/mcp-venv/bin/python")
}

struct Fixture {
    child: Child,
    port: u16,
    record: PathBuf,
    _dir: tempfile::TempDir,
}

impl Fixture {
    fn start() -> Fixture {
        common::deps::ensure(&["python"]);
        let dir = tempfile::tempdir().unwrap();
        let record = dir.path().join("record.jsonl");
        let port = common::http::free_port();
        let child = Command::new(python())
            .arg(repo().join("tests/fixtures/sdk_relay_server.py"))
            .arg(port.to_string())
            .arg(&record)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the SDK relay fixture");
        let deadline = Instant::now() + PATIENCE;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the SDK fixture never listened");
            std::thread::sleep(Duration::from_millis(50));
        }
        Fixture {
            child,
            port,
            record,
            _dir: dir,
        }
    }

    /// The fixture's servers and the ask rule (`ask_timeout_secs` for the approvals).
    fn config(&self, ask_timeout_secs: u64) -> String {
        format!(
            r#"
[servers.sdk]
url = "http://127.0.0.1:{p}/mcp"
pin = "off"

[servers.old]
url = "http://127.0.0.1:{p}/mcp"
pin = "off"
era = "legacy"

[policy]
ask_timeout_secs = {ask_timeout_secs}

[[policy.rules]]
id = "ask-notes"
action = "ask"
tool = "*__note"
ask_via = "client"
reason = "notes need a human"
"#,
            p = self.port
        )
    }

    fn notes(&self) -> usize {
        std::fs::read_to_string(&self.record)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("\"note\""))
            .count()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client(args: &[&str]) -> Value {
    let out = Command::new(python())
        .arg(repo().join("tests/third_party/sdk_relay_client.py"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run the SDK client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "sdk_relay_client.py {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn text(out: &Value) -> String {
    out["texts"][0].as_str().unwrap_or_default().to_owned()
}

/// Approve and deny through `run`, checking the fixture's records and the question asked.
fn approve_and_deny(label: &str, fixture: &Fixture, run: &dyn Fn(&str, &str) -> Value) {
    for server in ["sdk", "old"] {
        let before = fixture.notes();
        let out = run(server, "approve");
        let question = out["elicited"][0].as_str().unwrap_or_default();
        assert!(
            question.contains(&format!("{server}__note"))
                && question.contains(r#""text": "from the client""#)
                && question.contains("notes need a human"),
            "{label} {server}: {out}"
        );
        assert_eq!(
            text(&out),
            "noted: from the client",
            "{label} {server}: {out}"
        );
        assert_eq!(fixture.notes(), before + 1, "{label} {server}: ran once");
        let out = run(server, "deny");
        assert_eq!(out["is_error"], true, "{label} {server}: {out}");
        assert!(text(&out).contains("ask_denied"), "{label} {server}: {out}");
        assert_eq!(fixture.notes(), before + 1, "{label} {server}: never ran");
    }
}

#[test]
fn the_human_at_the_client_approves_or_declines() {
    let fixture = Fixture::start();
    let gw = HttpGateway::start("", &fixture.config(120));
    let token = gw.client_token("alice");
    let url = format!("http://127.0.0.1:{}/mcp", gw.port);
    for mode in ["legacy", "2026-07-28"] {
        let run =
            |server: &str, scenario: &str| client(&["http", &url, &token, mode, server, scenario]);
        approve_and_deny(&format!("http {mode}"), &fixture, &run);
    }
    let rows = gw.tool_calls();
    let decided: Vec<(&str, &str)> = rows
        .iter()
        .filter(|r| r["tool_name"] == "note")
        .map(|r| {
            (
                r["decision"].as_str().unwrap(),
                r["approved_by"].as_str().unwrap_or("-"),
            )
        })
        .collect();
    assert_eq!(
        decided
            .iter()
            .filter(|d| **d == ("allowed", "client:alice"))
            .count(),
        4,
        "{decided:?}"
    );
    assert_eq!(
        decided
            .iter()
            .filter(|d| **d == ("denied", "client:alice"))
            .count(),
        4,
        "{decided:?}"
    );
    assert!(
        rows.iter()
            .filter(|r| r["approved_by"] == "client:alice")
            .all(|r| r["decided_at_ms"].as_i64().is_some()),
        "when it was decided"
    );

    // A legacy client without the elicitation capability: the operator decides.
    let before = fixture.notes();
    let waiting = Command::new(python())
        .arg(repo().join("tests/third_party/sdk_relay_client.py"))
        .args(["http", &url, &token, "legacy", "sdk", "operator"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + PATIENCE;
    let id = loop {
        let out = gw.cli(&["approvals", "--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        if let Some(p) = v["pending"].as_array().and_then(|p| p.first()) {
            assert_eq!(p["via"], "operator", "{p}");
            break p["id"].to_string();
        }
        assert!(
            Instant::now() < deadline,
            "the call was never held for the operator"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(gw.cli(&["approve", &id]).status.success());
    let out = waiting.wait_with_output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("noted: from the client"));
    assert_eq!(fixture.notes(), before + 1);
}

#[test]
fn toolwall_stdio_asks_the_client() {
    let fixture = Fixture::start();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("stdio.toml");
    // The admin socket belongs to the agent's own uid here: no operator can be asked, but
    // the human at the client can.
    std::fs::write(
        &config,
        format!(
            "[listen]\nunix = \"\"\n[ledger]\npath = \"{d}/stdio/ledger.db\"\n[admin]\nsocket = \"{d}/stdio/admin.sock\"\n{}",
            fixture.config(120),
            d = dir.path().display()
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap().to_owned();
    let run = |server: &str, scenario: &str| client(&["stdio", BIN, &config, server, scenario]);
    approve_and_deny("stdio", &fixture, &run);
}

/// A modern `tools/call` of `sdk__note` whose client declares elicitation; `extra` joins
/// the params (a retry's `inputResponses` and `requestState`).
fn modern_note(port: u16, id: u64, text: &str, extra: Value) -> Req {
    let mut params = json!({"name": "sdk__note", "arguments": {"text": text},
        "_meta": {"io.modelcontextprotocol/protocolVersion": MODERN,
                  "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}});
    if let (Some(p), Some(e)) = (params.as_object_mut(), extra.as_object()) {
        p.extend(e.clone());
    }
    Req::post_mcp(port, &rpc(id, "tools/call", params))
        .header("MCP-Protocol-Version", MODERN)
        .header("Mcp-Method", "tools/call")
        .header("Mcp-Name", "sdk__note")
}

/// Call `sdk__note` with `text` (and a retry's `extra`) as `token`; the JSON-RPC answer.
fn note(gw: &HttpGateway, id: u64, text: &str, extra: Value, token: &str) -> Value {
    gw.http()
        .call(&modern_note(gw.port, id, text, extra).bearer(token))
        .answer()
}

/// Wait until `sdk__note` is listed: the gateway is ready before an upstream's tools are
/// (a call before that is an unknown tool).
fn wait_note_listed(gw: &HttpGateway, token: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = gw
            .http()
            .call(&modern(gw.port, 1, "tools/list", json!({}), None).bearer(token))
            .answer();
        let listed = v["result"]["tools"]
            .as_array()
            .is_some_and(|tools| tools.iter().any(|t| t["name"] == "sdk__note"));
        if listed {
            return;
        }
        assert!(Instant::now() < deadline, "sdk__note never listed: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Ask about `text`: the approval's key and state.
fn ask(gw: &HttpGateway, id: u64, text: &str, token: &str) -> (String, String) {
    let v = note(gw, id, text, json!({}), token);
    assert_eq!(v["result"]["resultType"], "input_required", "{v}");
    let key = v["result"]["inputRequests"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    (
        key,
        v["result"]["requestState"].as_str().unwrap().to_owned(),
    )
}

fn yes(key: &str, state: &str) -> Value {
    json!({"requestState": state,
           "inputResponses": {key: {"action": "accept", "content": {"approve": true}}}})
}

fn error_message(v: &Value) -> String {
    v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn a_forged_replayed_expired_or_swapped_approval_never_runs_the_tool() {
    let fixture = Fixture::start();
    let mut gw = HttpGateway::start("", &fixture.config(3));
    let token = gw.client_token("alice");
    let bob = gw.client_token("bob");
    wait_note_listed(&gw, &token);
    let (key, state) = ask(&gw, 1, "mine", &token);
    // Swapped arguments, another principal, one character changed: refused.
    let v = note(&gw, 2, "someone else's", yes(&key, &state), &token);
    assert!(error_message(&v).contains("other arguments"), "{v}");
    let v = note(&gw, 3, "mine", yes(&key, &state), &bob);
    assert!(error_message(&v).contains("another principal"), "{v}");
    let mut forged: Vec<char> = state.chars().collect();
    let at = forged.len() / 2;
    forged[at] = if forged[at] == 'A' { 'B' } else { 'A' };
    let forged: String = forged.into_iter().collect();
    let v = note(&gw, 4, "mine", yes(&key, &forged), &token);
    assert!(error_message(&v).contains("requestState"), "{v}");
    assert_eq!(fixture.notes(), 0, "nothing ran");
    // The real one runs once; its replay is refused.
    let v = note(&gw, 5, "mine", yes(&key, &state), &token);
    assert_eq!(v["result"]["content"][0]["text"], "noted: mine", "{v}");
    let v = note(&gw, 6, "mine", yes(&key, &state), &token);
    assert!(error_message(&v).contains("good once"), "{v}");
    assert_eq!(fixture.notes(), 1);
    // A restart does not forget that it was used (the ledger remembers).
    gw.terminate();
    gw.stderr.lock().unwrap().clear();
    gw.spawn();
    let v = note(&gw, 7, "mine", yes(&key, &state), &token);
    assert!(error_message(&v).contains("good once"), "{v}");
    // Expired: asked, then answered after ask_timeout_secs (3 s).
    let (key, late) = ask(&gw, 8, "late", &token);
    std::thread::sleep(Duration::from_millis(3500));
    let v = note(&gw, 9, "late", yes(&key, &late), &token);
    assert!(error_message(&v).contains("expired"), "{v}");
    assert_eq!(fixture.notes(), 1, "nothing more ran");
}
