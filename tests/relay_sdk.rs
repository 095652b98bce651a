//! Two-way MCP through the wall, with the official Python SDK (`mcp`, pinned) on both
//! sides: its client talks to toolwall over the HTTP door (legacy and 2026-07-28 eras),
//! `toolwall stdio` and the framed door (through `toolwall-relay`); its server
//! (tests/fixtures/sdk_relay_server.py) sits behind toolwall twice, once reached in the
//! modern era (`sdk`) and once forced to the legacy era (`old`). Every combination relays
//! progress and log messages to the client's callbacks, an elicitation to the client's
//! callback and its answer back, sampling and roots; a client without the elicitation
//! capability makes the server see the refusal; a cancelled call reaches the server (the
//! fixture records it) and the ledger says `cancelled`; a rule blocks sampling before it
//! reaches the client.

mod common;

use common::http::{HttpGateway, Req, modern};
use common::{BIN, PATIENCE, query_json};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn python() -> PathBuf {
    repo().join("target/mcp-venv/bin/python")
}

/// The SDK relay fixture on a free port, recording into a file.
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

    /// `[servers]` for the fixture: `sdk` (detected: modern) and `old` (legacy forced).
    fn servers(&self) -> String {
        format!(
            r#"
[servers.sdk]
url = "http://127.0.0.1:{p}/mcp"
pin = "off"

[servers.old]
url = "http://127.0.0.1:{p}/mcp"
pin = "off"
era = "legacy"
"#,
            p = self.port
        )
    }

    fn records(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.record)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Run the SDK client with `args`; its JSON summary.
/// The gateway with the fixture's two servers, once both have listed their tools: `ready`
/// says the gateway serves, not that every upstream's listing has landed.
fn start_gateway(extra: &str) -> HttpGateway {
    let gw = HttpGateway::start("", extra);
    let deadline = std::time::Instant::now() + PATIENCE * 2;
    let mut c = gw.connect();
    loop {
        let list = c.call("tools/list", serde_json::json!({}));
        let names: Vec<&str> = list["result"]["tools"]
            .as_array()
            .map(|a| a.iter().filter_map(|t| t["name"].as_str()).collect())
            .unwrap_or_default();
        let listed = |server: &str| names.iter().any(|n| n.starts_with(server));
        if listed("sdk__") && listed("old__") {
            return gw;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the fixture's servers were never listed: {list}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
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
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn texts(out: &Value) -> String {
    out["texts"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// What every door must deliver, whatever the eras: progress and logs, an elicitation
/// answered, a client without the capability refused at the server.
fn check_common(label: &str, run: &dyn Fn(&str, &str) -> Value) {
    for server in ["sdk", "old"] {
        let out = run(server, "count");
        let steps: Vec<String> = out["progress"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p[2].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            steps,
            ["step 1 of 3", "step 2 of 3", "step 3 of 3"],
            "{label} {server}: {out}"
        );
        assert_eq!(out["progress"][2][0], 3.0, "{label} {server}: {out}");
        assert_eq!(
            out["logs"],
            serde_json::json!(["counted 1", "counted 2", "counted 3"]),
            "{label} {server}: {out}"
        );
        assert_eq!(texts(&out), "counted to 3", "{label} {server}");

        let out = run(server, "greet");
        assert_eq!(
            out["elicited"],
            serde_json::json!(["What is your name?"]),
            "{label} {server}: {out}"
        );
        assert_eq!(texts(&out), "Hello Ada", "{label} {server}: {out}");

        if server == "old" {
            // ctx.elicit itself (the SDK sends it mid-call to a 2025 session).
            let out = run(server, "direct");
            assert_eq!(
                out["elicited"],
                serde_json::json!(["Who is asking?"]),
                "{label} {server}: {out}"
            );
            assert_eq!(texts(&out), "Hello Ada", "{label} {server}: {out}");
        }

        let out = run(server, "nocap");
        assert_eq!(out["elicited"], serde_json::json!([]), "{label} {server}");
        if label.ends_with("2026-07-28") && server == "sdk" {
            // Both sides modern: the server answers -32021 (the capability is missing from
            // the request's _meta), and the client gets that error as the server gave it.
            assert_eq!(out["error"]["code"], -32021, "{label} {server}: {out}");
            assert!(
                out["error"]["data"]["requiredCapabilities"]["elicitation"].is_object(),
                "{label} {server}: {out}"
            );
            continue;
        }
        assert_eq!(out["is_error"], true, "{label} {server}: {out}");
        assert!(
            texts(&out).contains("elicitation capability"),
            "{label} {server}: the server saw the refusal: {out}"
        );
    }
}

/// Wait for the fixture to record the cancellation of as many `wait` calls as started.
fn wait_cancelled(fixture: &Fixture, count: usize) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let cancelled = fixture
            .records()
            .iter()
            .filter(|r| r["tool"] == "wait" && r["event"] == "cancelled")
            .count();
        if cancelled >= count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{cancelled} of {count} cancellations reached the server: {:?}",
            fixture.records()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

const SAMPLING_RULE: &str = r#"
[[policy.rules]]
id = "no-sampling-for-interns"
action = "block"
phase = "response"
method = "sampling/createMessage"
principal = "intern"
reason = "interns do not get the model"
"#;

#[test]
fn the_http_door_relays_both_ways_in_both_eras() {
    let fixture = Fixture::start();
    let gw = start_gateway(&format!("{}{SAMPLING_RULE}", fixture.servers()));
    let token = gw.client_token("alice");
    let url = format!("http://127.0.0.1:{}/mcp", gw.port);
    for mode in ["legacy", "2026-07-28"] {
        let run =
            |server: &str, scenario: &str| client(&["http", &url, &token, mode, server, scenario]);
        check_common(&format!("http {mode}"), &run);
        for server in ["sdk", "old"] {
            let out = run(server, "sample");
            assert_eq!(out["sampled"], 1, "{mode} {server}: {out}");
            assert_eq!(texts(&out), "the model said hi there", "{mode} {server}");
            let out = run(server, "roots");
            assert_eq!(out["roots_asked"], 1, "{mode} {server}: {out}");
            assert_eq!(texts(&out), "file:///work/project", "{mode} {server}");
        }
    }
    // Every relayed message is an event of the ledger, linked to its call's row.
    let db = gw.ledger();
    let relays = query_json(
        &db,
        "SELECT e.detail, c.tool_name FROM events e JOIN tool_calls c \
         ON c.id = json_extract(e.detail, '$.call_id') WHERE e.kind = 'relay'",
    );
    let methods: Vec<(String, String)> = relays
        .iter()
        .map(|r| {
            let d: Value = serde_json::from_str(r["detail"].as_str().unwrap()).unwrap();
            (
                d["method"].as_str().unwrap_or_default().to_owned(),
                r["tool_name"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    for (method, tool) in [
        ("notifications/progress", "count"),
        ("notifications/message", "count"),
        ("elicitation/create", "greet"),
        ("sampling/createMessage", "sample"),
        ("roots/list", "roots"),
    ] {
        assert!(
            methods.iter().any(|(m, t)| m == method && t == tool),
            "no {method} event linked to a {tool} row: {methods:?}"
        );
    }
    let refused = query_json(
        &db,
        "SELECT detail FROM events WHERE kind = 'relay' AND detail LIKE '%no_capability%'",
    );
    assert!(
        !refused.is_empty(),
        "the refusal to a client without the capability is recorded"
    );
}

#[test]
fn a_rule_keeps_sampling_from_the_client() {
    let fixture = Fixture::start();
    let gw = start_gateway(&format!("{}{SAMPLING_RULE}", fixture.servers()));
    let token = gw.client_token("intern");
    let url = format!("http://127.0.0.1:{}/mcp", gw.port);
    for mode in ["legacy", "2026-07-28"] {
        for server in ["sdk", "old"] {
            let out = client(&["http", &url, &token, mode, server, "sample"]);
            assert_eq!(
                out["sampled"], 0,
                "{mode} {server}: reached the client: {out}"
            );
            assert_eq!(out["is_error"], true, "{mode} {server}: {out}");
        }
    }
    let blocked = query_json(
        &gw.ledger(),
        "SELECT detail FROM events WHERE kind = 'relay' \
         AND json_extract(detail, '$.decision') = 'blocked' \
         AND json_extract(detail, '$.rule') = 'no-sampling-for-interns'",
    );
    assert_eq!(blocked.len(), 4, "{blocked:?}");
    assert!(
        fixture.records().iter().all(|r| r["tool"] != "sample"),
        "the tool never got a sample: {:?}",
        fixture.records()
    );
}

#[test]
fn cancelled_calls_reach_the_server_and_the_ledger_says_so() {
    let fixture = Fixture::start();
    let gw = start_gateway(&fixture.servers());
    let token = gw.client_token("alice");
    let url = format!("http://127.0.0.1:{}/mcp", gw.port);
    let mut started = 0;
    for mode in ["legacy", "2026-07-28"] {
        for server in ["sdk", "old"] {
            let out = client(&["http", &url, &token, mode, server, "cancel"]);
            assert_eq!(out["cancelled"], true);
            started += 1;
            wait_cancelled(&fixture, started);
        }
    }
    let rows = gw.wait_rows("four cancelled rows", |rows| {
        rows.iter().filter(|r| r["decision"] == "cancelled").count() == 4
    });
    assert!(rows.iter().all(|r| r["tool_name"] == "wait"), "{rows:?}");
}

/// F4: a server that answers its call while its question waits for the client. The answer
/// reaches the client (not held until the client answers, nor until the call's timeout);
/// the question is forgotten (the ledger says so) and the client's late answer never
/// reaches the server. Failed before: the worker waited for the client's answer before it
/// read the server's, and forwarded it (a `to_server` event, no `forgotten`).
#[test]
fn a_server_that_stops_waiting_answers_at_once() {
    let fixture = Fixture::start();
    let gw = start_gateway(&fixture.servers());
    let token = gw.client_token("alice");
    let url = format!("http://127.0.0.1:{}/mcp", gw.port);
    let out = client(&["http", &url, &token, "legacy", "old", "late"]);
    assert_eq!(
        out["elicited"],
        serde_json::json!(["Still there?"]),
        "{out}"
    );
    assert_eq!(out["is_error"], false, "{out}");
    assert_eq!(texts(&out), "gave up", "{out}");
    assert!(
        fixture
            .records()
            .iter()
            .any(|r| r["tool"] == "impatient" && r["outcome"] == "gave up"),
        "{:?}",
        fixture.records()
    );
    let rows = gw.wait_rows("the impatient call's row", |rows| {
        rows.iter()
            .any(|r| r["tool_name"] == "impatient" && r["decision"] == "allowed")
    });
    let call_id = rows
        .iter()
        .find(|r| r["tool_name"] == "impatient")
        .and_then(|r| r["id"].as_i64())
        .expect("the row's id");
    let events: Vec<Value> = query_json(
        &gw.ledger(),
        "SELECT detail FROM events WHERE kind = 'relay'",
    )
    .iter()
    .map(|r| serde_json::from_str(r["detail"].as_str().unwrap()).unwrap())
    .filter(|d: &Value| d["call_id"] == call_id)
    .collect();
    let decisions: Vec<(&str, &str)> = events
        .iter()
        .map(|d| {
            (
                d["direction"].as_str().unwrap_or_default(),
                d["decision"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert!(
        decisions.contains(&("to_client", "relayed"))
            && decisions.contains(&("to_client", "forgotten")),
        "{events:?}"
    );
    assert!(
        !decisions.iter().any(|(d, _)| *d == "to_server"),
        "the late answer reached the server: {events:?}"
    );
    // The SDK client drops its answer once told the request was cancelled; an agent that
    // answers anyway (here a framed one) is dropped and counted where an operator looks.
    let metrics = |gw: &HttpGateway| {
        let admin = gw.token("ops", "admin", "never");
        let r = gw
            .http()
            .call(&Req::new("GET", "/metrics", gw.port).bearer(&admin));
        assert_eq!(r.status, 200, "{}", r.text());
        r.text()
            .lines()
            .find_map(|l| l.strip_prefix("toolwall_relay_late_answers_dropped_total "))
            .and_then(|n| n.trim().parse::<u64>().ok())
    };
    let before = metrics(&gw);
    let mut agent = gw.connect();
    agent.call(
        "initialize",
        serde_json::json!({"protocolVersion": "2025-11-25",
                           "capabilities": {"elicitation": {}},
                           "clientInfo": {"name": "late", "version": "1"}}),
    );
    let sid = agent.request(
        serde_json::json!(7),
        "tools/call",
        Some(serde_json::json!({"name": "old__impatient", "arguments": {}})),
    );
    let mut asked = None;
    let answer = loop {
        let m = agent.recv().expect("the call's messages");
        if m.body["method"] == "elicitation/create" {
            asked = Some(m.body["id"].clone());
        } else if m.stream == sid && m.body["id"] == 7 {
            break m.body;
        }
    };
    assert_eq!(
        answer["result"]["content"][0]["text"], "gave up",
        "{answer}"
    );
    let asked = asked.expect("the server's question reached the agent");
    let late = serde_json::json!({"jsonrpc": "2.0", "id": asked,
                                  "result": {"action": "accept", "content": {"name": "Ada"}}});
    agent.send_frame(
        0,
        toolwall_relay::frame::FLAG_NOTIFICATION,
        late.to_string().as_bytes(),
    );
    let deadline = Instant::now() + PATIENCE;
    let counted = loop {
        let now = metrics(&gw);
        if now > before || Instant::now() > deadline {
            break now;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(before, Some(0), "the SDK client sent no late answer");
    assert_eq!(
        counted,
        Some(1),
        "one late answer, counted once in /metrics"
    );
}

/// SEP-2243: a tool parameter annotated `x-mcp-header` travels as `Mcp-Param-Region` from
/// the SDK client to toolwall's door (which checks it) and from toolwall to a modern
/// server (which refuses a call without it). Failed before: toolwall sent the modern
/// server no such header, and the server refused the call (-32020).
#[test]
fn parameters_bound_to_headers_reach_the_server() {
    let fixture = Fixture::start();
    let gw = start_gateway(&fixture.servers());
    let token = gw.client_token("alice");
    let url = format!("http://127.0.0.1:{}/mcp", gw.port);
    for mode in ["legacy", "2026-07-28"] {
        for server in ["sdk", "old"] {
            let out = client(&["http", &url, &token, mode, server, "where"]);
            assert_eq!(out["error"], Value::Null, "{mode} {server}: {out}");
            assert_eq!(out["is_error"], false, "{mode} {server}: {out}");
            assert_eq!(texts(&out), "region Zürich west", "{mode} {server}: {out}");
        }
    }
    // A tool whose annotation the spec forbids is not offered, and the log says so once
    // per server, escaped (failed before: no line at all).
    let listed = gw
        .http()
        .call(&modern(gw.port, 1, "tools/list", serde_json::json!({}), None).bearer(&token))
        .json();
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"sdk__where"), "{names:?}");
    assert!(!names.iter().any(|n| n.ends_with("misbound")), "{names:?}");
    let log = gw.log();
    for server in ["sdk", "old"] {
        let said = format!("server {server}: tool \"misbound\" is not served");
        let lines: Vec<&str> = log.lines().filter(|l| l.contains(&said)).collect();
        assert_eq!(lines.len(), 1, "{said}: {log}");
        assert!(lines[0].contains("x-mcp-header"), "{}", lines[0]);
        assert!(!lines[0].contains('\u{1b}'), "{}", lines[0]);
    }
}

/// The relay binary next to ours; built on demand when only this package was built.
fn relay_bin() -> PathBuf {
    let bin = PathBuf::from(BIN).with_file_name("toolwall-relay");
    if !bin.exists() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", "toolwall-relay"])
            .current_dir(repo())
            .status()
            .expect("build the relay");
        assert!(status.success());
    }
    bin
}

#[test]
fn stdio_and_the_framed_door_relay_both_ways() {
    let fixture = Fixture::start();
    // toolwall stdio, with a config of its own.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("stdio.toml");
    std::fs::write(
        &config,
        format!(
            "[listen]\nunix = \"\"\n[ledger]\npath = \"{d}/stdio/ledger.db\"\n[admin]\nsocket = \"{d}/stdio/admin.sock\"\n{}",
            fixture.servers(),
            d = dir.path().display()
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap().to_owned();
    let stdio = |server: &str, scenario: &str| client(&["stdio", BIN, &config, server, scenario]);
    check_common("stdio", &stdio);
    let out = stdio("old", "cancel");
    assert_eq!(out["cancelled"], true);
    wait_cancelled(&fixture, 1);
    let rows = query_json(
        &rusqlite::Connection::open(dir.path().join("stdio/ledger.db")).unwrap(),
        "SELECT decision FROM tool_calls WHERE tool_name = 'wait'",
    );
    assert_eq!(rows[0]["decision"], "cancelled");

    // The framed door, through the guest relay.
    let gw = common::TestGateway::start(&fixture.servers());
    let relay = relay_bin();
    let sock = gw.sock.to_str().unwrap().to_owned();
    let framed = |server: &str, scenario: &str| {
        client(&["relay", relay.to_str().unwrap(), &sock, server, scenario])
    };
    check_common("framed", &framed);
    let out = framed("sdk", "cancel");
    assert_eq!(out["cancelled"], true);
    wait_cancelled(&fixture, 2);
}

/// The same fixture as local servers (toolwall starts it and speaks MCP over its stdin and
/// stdout, behind the walls): `loc` in the era it detects, `locold` forced to legacy. What
/// it sends during a call reaches the client over the HTTP door, and a cancelled call
/// reaches it.
#[test]
fn local_servers_relay_both_ways() {
    common::deps::ensure(&["python"]);
    let dir = tempfile::tempdir().unwrap();
    // The local servers run as the agent user: the record goes where it may write.
    let records = dir.path().join("records");
    std::fs::create_dir(&records).unwrap();
    std::fs::set_permissions(
        &records,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let record = records.join("record.jsonl");
    let venv = repo().join("target/mcp-venv");
    let site = venv.join("lib/python3.11/site-packages");
    let table = |name: &str, era: &str| {
        format!(
            r#"
[servers.{name}]
command = ["/usr/bin/python3", "{script}", "stdio", "{record}"]
env = {{ PYTHONPATH = "{site}" }}
read_paths = ["{venv}", "{fixtures}"]
write_paths = ["{records}"]
era = "{era}"
pin = "off"
start_timeout_secs = 30
discover_timeout_ms = 60000
"#,
            script = repo().join("tests/fixtures/sdk_relay_server.py").display(),
            record = record.display(),
            site = site.display(),
            venv = venv.display(),
            fixtures = repo().join("tests/fixtures").display(),
            records = records.display(),
        )
    };
    let servers = format!(
        "[servers]\nstate_dir = \"{}/servers\"\n{}{}",
        dir.path().display(),
        table("loc", "auto"),
        table("locold", "legacy")
    );
    let gw = HttpGateway::start("", &servers);
    // Ready does not wait for local servers: wait until both have listed their tools.
    let deadline = Instant::now() + PATIENCE * 3;
    loop {
        let status = gw.gw.admin(serde_json::json!({"op": "status"}));
        let listed = |name: &str| {
            status["servers"].as_array().is_some_and(|a| {
                a.iter()
                    .any(|s| s["server"] == name && s["tools"].as_u64().unwrap_or(0) > 0)
            })
        };
        if listed("loc") && listed("locold") {
            break;
        }
        assert!(Instant::now() < deadline, "never listed: {status:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let token = gw.client_token("alice");
    let url = format!("http://127.0.0.1:{}/mcp", gw.port);
    let records_of = || -> Vec<Value> {
        std::fs::read_to_string(&record)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let mut cancelled = 0;
    for mode in ["legacy", "2026-07-28"] {
        for server in ["loc", "locold"] {
            let label = format!("{mode} {server}");
            let run = |scenario: &str| client(&["http", &url, &token, mode, server, scenario]);
            let out = run("count");
            assert_eq!(texts(&out), "counted to 3", "{label}: {out}");
            let steps: Vec<&str> = out["progress"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|p| p[2].as_str())
                .collect();
            assert_eq!(
                steps,
                ["step 1 of 3", "step 2 of 3", "step 3 of 3"],
                "{label}: {out}"
            );
            assert_eq!(
                out["logs"],
                serde_json::json!(["counted 1", "counted 2", "counted 3"]),
                "{label}: {out}"
            );
            let out = run("greet");
            assert_eq!(texts(&out), "Hello Ada", "{label}: {out}");
            let out = run("cancel");
            assert_eq!(out["cancelled"], true, "{label}: {out}");
            cancelled += 1;
            let deadline = Instant::now() + PATIENCE;
            while records_of()
                .iter()
                .filter(|r| r["tool"] == "wait" && r["event"] == "cancelled")
                .count()
                < cancelled
            {
                assert!(
                    Instant::now() < deadline,
                    "{label}: the cancellation did not reach the server: {:?}",
                    records_of()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    // Each count call's progress travelled with the call itself (its facts count the
    // three), not through the server's shared queue, where another thread drained it and
    // the call's answer could overtake it: under load the agent then got no progress at
    // all (the call had ended). Failed before: the facts counted no progress.
    let progress_counts: Vec<u64> = query_json(
        &gw.ledger(),
        "SELECT e.detail FROM events e JOIN tool_calls c \
         ON c.id = json_extract(e.detail, '$.call_id') \
         WHERE e.kind = 'tool_facts' AND c.tool_name = 'count'",
    )
    .iter()
    .map(|r| {
        let detail: Value = serde_json::from_str(r["detail"].as_str().unwrap()).unwrap();
        let facts: Value = serde_json::from_str(detail["facts"].as_str().unwrap()).unwrap();
        facts["notifications"]["notifications/progress"]
            .as_u64()
            .unwrap_or(0)
    })
    .collect();
    assert_eq!(progress_counts, [3, 3, 3, 3], "progress per count call");
}

/// `completion/complete` and resource subscriptions through toolwall, to a 2026-07-28
/// server (`sdk`: toolwall turns an agent's subscribe into its listening stream's
/// resourceSubscriptions) and a legacy one (`old`: forwarded as they are). The completion
/// comes from the official SDK client over HTTP: toolwall declares `completions` because
/// the server does, and the prompt reaches the server under its own name (the fixture
/// completes `greet` only). The subscription comes from a framed agent (the framed door
/// carries notifications; it declares `resources.subscribe`, the HTTP door does not):
/// the update reaches it, and stops after its unsubscribe. Each request has its row.
/// Failed before: method not found.
#[test]
fn completions_and_subscriptions_reach_the_owning_server() {
    let fixture = Fixture::start();
    for (server, era) in [("sdk", "auto"), ("old", "legacy")] {
        // One server per gateway: the two would contest test://watched.
        let servers = format!(
            "[servers.{server}]\nurl = \"http://127.0.0.1:{}/mcp\"\npin = \"off\"\nera = \"{era}\"\n",
            fixture.port
        );
        let gw = HttpGateway::start("", &servers);
        let token = gw.client_token("alice");
        let url = format!("http://127.0.0.1:{}/mcp", gw.port);
        let out = client(&["http", &url, &token, "legacy", server, "complete"]);
        assert_eq!(out["completions_declared"], true, "{server}: {out}");
        assert_eq!(out["subscribe_declared"], false, "{server}: {out}");
        assert_eq!(
            out["completions"],
            serde_json::json!(["Ada", "Alan"]),
            "{server}: {out}"
        );

        let mut agent = gw.connect();
        let init = agent.call(
            "initialize",
            serde_json::json!({"protocolVersion": "2025-11-25", "capabilities": {},
                               "clientInfo": {"name": "watcher", "version": "1"}}),
        );
        assert_eq!(
            init["result"]["capabilities"]["resources"]["subscribe"], true,
            "{server}: {init}"
        );
        let watched = serde_json::json!({"uri": "test://watched"});
        let r = agent.call("resources/subscribe", watched.clone());
        assert_eq!(r["result"], serde_json::json!({}), "{server}: {r}");
        // Touch the resource until its update comes (a 2026-07-28 server hears of the
        // subscription when toolwall opens its listening stream again).
        let mut updates = Vec::new();
        let touch = serde_json::json!({"name": format!("{server}__touch"),
                                       "arguments": {"uri": "test://watched"}});
        let touch_and_collect = |agent: &mut common::FramedClient, updates: &mut Vec<Value>| {
            let sid = agent.request(
                serde_json::json!("touch"),
                "tools/call",
                Some(touch.clone()),
            );
            loop {
                let m = agent.recv().expect("frames");
                if m.body["method"] == "notifications/resources/updated" {
                    updates.push(m.body["params"].clone());
                } else if m.stream == sid && m.body["id"] == "touch" {
                    assert_eq!(m.body["result"]["isError"], false, "{}", m.body);
                    break;
                }
            }
        };
        let deadline = Instant::now() + PATIENCE;
        while updates.is_empty() && Instant::now() < deadline {
            touch_and_collect(&mut agent, &mut updates);
            std::thread::sleep(Duration::from_millis(300));
            // A ping flushes an update that came after the touch's answer.
            let sid = agent.request(serde_json::json!("ping"), "ping", None);
            loop {
                let m = agent.recv().expect("frames");
                if m.body["method"] == "notifications/resources/updated" {
                    updates.push(m.body["params"].clone());
                } else if m.stream == sid {
                    break;
                }
            }
        }
        assert_eq!(
            updates.first(),
            Some(&serde_json::json!({"uri": "test://watched"})),
            "{server}: no update reached the subscribed agent"
        );
        // A second session subscribes too; the first one's unsubscribe is answered by
        // toolwall (the server's one subscription still serves the second), and from
        // then on the updates reach the second session only.
        let mut other = gw.connect();
        other.call(
            "initialize",
            serde_json::json!({"protocolVersion": "2025-11-25", "capabilities": {},
                               "clientInfo": {"name": "other", "version": "1"}}),
        );
        let r = other.call("resources/subscribe", watched.clone());
        assert_eq!(r["result"], serde_json::json!({}), "{server}: {r}");
        let r = agent.call("resources/unsubscribe", watched.clone());
        assert_eq!(r["result"], serde_json::json!({}), "{server}: {r}");
        let mut after = Vec::new();
        touch_and_collect(&mut agent, &mut after);
        std::thread::sleep(Duration::from_millis(1500));
        agent.call("ping", serde_json::json!({}));
        touch_and_collect(&mut agent, &mut after);
        assert!(
            after.is_empty(),
            "{server}: updates after unsubscribe: {after:?}"
        );
        // The second session goes without unsubscribing: toolwall unsubscribes for it.
        drop(other);
        let deadline = Instant::now() + PATIENCE;
        while gw.events("subscription_released").is_empty() {
            assert!(Instant::now() < deadline, "{server}: nothing released");
            std::thread::sleep(Duration::from_millis(50));
        }

        let rows = gw.wait_rows("the completion and subscription rows", |rows| {
            [
                "completion/complete",
                "resources/subscribe",
                "resources/unsubscribe",
            ]
            .iter()
            .all(|m| rows.iter().any(|r| r["method"] == *m))
        });
        for r in rows.iter().filter(|r| r["method"] != "tools/call") {
            assert_eq!(r["server_name"], server, "{r}");
            assert_eq!(r["decision"], "allowed", "{r}");
        }
        let completion = rows
            .iter()
            .find(|r| r["method"] == "completion/complete")
            .unwrap();
        assert_eq!(completion["tool_name"], "greet", "{completion}");
        let subscribe = rows
            .iter()
            .find(|r| r["method"] == "resources/subscribe")
            .unwrap();
        assert_eq!(subscribe["tool_name"], "test://watched", "{subscribe}");
    }
    // The legacy server got each session's subscribe and one unsubscribe, when the last
    // session holding the URI went; the modern one has no such method (its subscription
    // travelled in the listening stream).
    let deadline = Instant::now() + PATIENCE;
    let asked = loop {
        let asked: Vec<String> = fixture
            .records()
            .iter()
            .filter_map(|r| r["tool"].as_str().map(str::to_owned))
            .filter(|t| t.ends_with("subscribe"))
            .collect();
        if asked.len() >= 3 || Instant::now() > deadline {
            break asked;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        asked,
        ["subscribe", "subscribe", "unsubscribe"],
        "{:?}",
        fixture.records()
    );
}
