//! One path for every message, through every door: a hostile upstream
//! (`tests/fixtures/hostile_answers.py`) answers with secrets in JSON-RPC errors, patterns
//! split across content blocks, resources and prompts that carry a private key, a result
//! laid out over several lines with a forged message inside, and an echo of which duplicate
//! key it got. Through the framed socket, the HTTP door and `toolwall stdio`, the agent
//! never sees the secret, every answer is one message, the upstream gets what policy judged,
//! and the ledger has a row with its rule for every read and prompt.

mod common;

use common::http::{HttpGateway, LEGACY, Req};
use common::*;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The hostile upstream, killed on drop.
struct Hostile {
    child: Child,
    port: u16,
}

impl Hostile {
    fn start() -> Hostile {
        let mut child = Command::new("python3")
            .arg(
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hostile_answers.py"),
            )
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs the fixture");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("fixture prints its port");
        let port = line
            .trim()
            .strip_prefix("PORT ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("fixture said {line:?}"));
        Hostile { child, port }
    }

    fn config(&self) -> String {
        format!(
            r#"
[servers.evil]
url = "http://127.0.0.1:{}/mcp"
era = "legacy"
pin = "off"

[[policy.rules]]
id = "no-respblock"
action = "block"
phase = "response"
result = {{ matches = "RESPBLOCK" }}
"#,
            self.port
        )
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A door: send one raw JSON-RPC request, get the raw bytes of its one answer.
trait Door {
    fn ask(&mut self, request: &str) -> Vec<u8>;
}

struct Framed(FramedClient);

impl Door for Framed {
    fn ask(&mut self, request: &str) -> Vec<u8> {
        let sid = self.0.next_sid;
        self.0.next_sid += 1;
        self.0.send_frame(sid, 0, request.as_bytes());
        loop {
            let reply = self.0.recv().expect("an answer");
            if reply.stream == sid {
                return reply.body.to_string().into_bytes();
            }
        }
    }
}

struct HttpDoor {
    gw: HttpGateway,
    session: String,
}

impl Door for HttpDoor {
    fn ask(&mut self, request: &str) -> Vec<u8> {
        let req = Req::post_mcp(self.gw.port, &json!({}))
            .body(request.as_bytes().to_vec())
            .session(&self.session)
            .header("MCP-Protocol-Version", LEGACY);
        let r = self.gw.http().call(&req);
        assert_eq!(r.status, 200, "{}", r.text());
        r.body
    }
}

/// `toolwall stdio` kept open: one line in, the lines out until the answer's.
struct StdioDoor {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
    /// Every line stdout carried, to check that each is one whole message.
    lines: Vec<String>,
    _dir: tempfile::TempDir,
}

impl StdioDoor {
    fn start(servers: &str) -> StdioDoor {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("toolwall.toml");
        std::fs::write(&config, base_config(dir.path(), servers)).expect("config");
        let mut child = Command::new(BIN)
            .args(["stdio", "--config"])
            .arg(&config)
            .current_dir(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn toolwall stdio");
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        StdioDoor {
            child,
            out,
            lines: Vec::new(),
            _dir: dir,
        }
    }
}

impl Door for StdioDoor {
    fn ask(&mut self, request: &str) -> Vec<u8> {
        let id = serde_json::from_str::<Value>(request).expect("json")["id"].clone();
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin.write_all(request.as_bytes()).expect("write");
        stdin.write_all(b"\n").expect("write");
        stdin.flush().expect("flush");
        loop {
            let mut line = String::new();
            assert!(
                self.out.read_line(&mut line).expect("read") > 0,
                "stdio ended"
            );
            let line = line.trim_end_matches('\n').to_owned();
            self.lines.push(line.clone());
            let v: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("a stdout line is not one message ({e}): {line}"));
            if v["id"] == id {
                return line.into_bytes();
            }
        }
    }
}

impl Drop for StdioDoor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn request(id: u64, method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
}

/// Waits until the upstream's tools are in the catalog.
fn wait_for_catalog(door: &mut dyn Door) {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let list = door.ask(&request(1, "tools/list", json!({})));
        if String::from_utf8_lossy(&list).contains("evil__leak_error") {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the upstream never listed"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Every attack through one door.
fn attack(door: &mut dyn Door, name: &str) {
    wait_for_catalog(door);
    let refused_tool = |bytes: &[u8], rule: &str, what: &str| {
        let text = String::from_utf8_lossy(bytes);
        for secret in ["PRIVATE KEY", "MIIBOg", "RESPBLOCK", "PRIV"] {
            assert!(
                !text.contains(secret),
                "{name}: {what} leaked {secret}: {text}"
            );
        }
        let v: Value = serde_json::from_slice(bytes).expect("json");
        assert_eq!(v["result"]["isError"], true, "{name}: {what}: {v}");
        assert_eq!(
            v["result"]["structuredContent"]["error"]["rule"], rule,
            "{name}: {what}: {v}"
        );
    };
    let call = |tool: &str| request(10, "tools/call", json!({"name": tool, "arguments": {}}));
    refused_tool(
        &door.ask(&call("evil__leak_error")),
        "builtin-private-key-in-result",
        "a JSON-RPC error",
    );
    refused_tool(
        &door.ask(&call("evil__split_words")),
        "no-respblock",
        "split words",
    );
    refused_tool(
        &door.ask(&call("evil__split_pem")),
        "builtin-private-key-in-result",
        "a split key",
    );
    // Pretty-printed with a forged message inside: one answer, serialized by toolwall.
    let bytes = door.ask(&call("evil__multiline"));
    assert!(
        !bytes.contains(&b'\n'),
        "{name}: a raw line break reached the agent"
    );
    let v: Value = serde_json::from_slice(&bytes).expect("json");
    assert_eq!(v["id"], 10);
    assert!(
        v["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("line one\n")),
        "{name}: {v}"
    );
    // Duplicate keys: the upstream (which keeps the first) gets the value policy judged.
    let raw = r#"{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"evil__first_key","arguments":{"text":"TOPSECRET","text":"ok"}}}"#;
    let v: Value = serde_json::from_slice(&door.ask(raw)).expect("json");
    assert_eq!(
        v["result"]["content"][0]["text"], "received ok",
        "{name}: {v}"
    );
    // Resources and prompts, results and errors.
    for (method, params) in [
        ("resources/read", json!({"uri": "secret://key"})),
        ("resources/read", json!({"uri": "secret://error"})),
        ("prompts/get", json!({"name": "evil__leaky"})),
        ("prompts/get", json!({"name": "evil__erring"})),
    ] {
        let bytes = door.ask(&request(12, method, params.clone()));
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            !text.contains("PRIVATE KEY") && !text.contains("MIIBOg"),
            "{name}: {method} {params} leaked: {text}"
        );
        let v: Value = serde_json::from_slice(&bytes).expect("json");
        assert_eq!(v["error"]["code"], -32003, "{name}: {method} {params}: {v}");
        assert_eq!(
            v["error"]["data"]["rule"], "builtin-private-key-in-result",
            "{name}: {v}"
        );
    }
}

/// Every read and prompt has its row, with the rule that refused it.
fn check_rows(ledger: &std::path::Path, name: &str) {
    let conn = rusqlite::Connection::open(ledger).expect("ledger");
    let rows = query_json(
        &conn,
        "SELECT method, tool_name, decision, policy_rule, arguments FROM tool_calls ORDER BY id",
    );
    for (method, target) in [
        ("resources/read", "secret://key"),
        ("resources/read", "secret://error"),
        ("prompts/get", "leaky"),
        ("prompts/get", "erring"),
        ("tools/call", "leak_error"),
    ] {
        let row = rows
            .iter()
            .find(|r| r["method"] == method && r["tool_name"] == target)
            .unwrap_or_else(|| panic!("{name}: no row for {method} {target}: {rows:#?}"));
        assert_eq!(row["decision"], "denied", "{name}: {row}");
        assert_eq!(
            row["policy_rule"], "builtin-private-key-in-result",
            "{name}: {row}"
        );
    }
    let dup = rows
        .iter()
        .find(|r| r["tool_name"] == "first_key")
        .expect("first_key row");
    assert_eq!(
        dup["arguments"], r#"{"text":"TOPSECRET","text":"ok"}"#,
        "{name}: the row keeps what arrived"
    );
}

#[test]
fn hostile_answers_through_the_framed_door() {
    let hostile = Hostile::start();
    let gw = TestGateway::start(&hostile.config());
    let mut door = Framed(gw.connect());
    attack(&mut door, "framed");
    gw.wait_rows("the reads' rows", |r| r.len() >= 9);
    check_rows(&gw.ledger, "framed");
}

#[test]
fn hostile_answers_through_the_http_door() {
    let hostile = Hostile::start();
    let gw = HttpGateway::start("http_auth = \"none\"", &hostile.config());
    let init = gw.http().call(&Req::post_mcp(
        gw.port,
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": LEGACY, "capabilities": {},
                           "clientInfo": {"name": "t", "version": "1"}}}),
    ));
    let session = init.header("Mcp-Session-Id").expect("session").to_owned();
    let mut door = HttpDoor { gw, session };
    attack(&mut door, "http");
    door.gw.wait_rows("the reads' rows", |r| r.len() >= 9);
    check_rows(&door.gw.ledger, "http");
}

#[test]
fn hostile_answers_through_stdio() {
    let hostile = Hostile::start();
    let mut door = StdioDoor::start(&hostile.config());
    let ledger = door._dir.path().join("state/ledger.db");
    attack(&mut door, "stdio");
    // No line is the forged message the upstream hid in its answer.
    for line in &door.lines {
        let v: Value = serde_json::from_str(line).expect("one message per line");
        assert_ne!(v["result"]["content"][0]["text"], "FORGED", "{line}");
    }
    drop(door.child.stdin.take());
    let _ = wait_timeout(&mut door.child, PATIENCE);
    check_rows(&ledger, "stdio");
}
