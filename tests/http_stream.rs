//! The HTTP door's streamed answers, read byte for byte: a call whose server sends progress
//! and a log message before its answer is answered as a chunked `text/event-stream` — the
//! agent's own progress token, the server's made-up one dropped, the log message, the
//! answer last — and the connection carries the next request; an HTTP/1.0 client gets the
//! stream until the connection closes. A call with nothing relayed stays plain JSON.

mod common;

use common::http::{HttpGateway, LEGACY, Req, open_session, rpc};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The stdlib fixture upstream answering as an event stream (a progress notification with
/// a token nobody sent, one with the request's token, a log message, then the answer).
struct Upstream {
    child: Child,
    port: u16,
}

impl Upstream {
    fn start() -> Upstream {
        common::deps::ensure(&["python3"]);
        let mut child = Command::new("python3")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/upstream.py"))
            .args(["--port", "0", "--era", "legacy", "--sse"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 runs the fixture upstream");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().strip_prefix("PORT ").unwrap().parse().unwrap();
        Upstream { child, port }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn call(port: u16, id: u64, session: &str, meta: Value) -> Req {
    Req::post_mcp(
        port,
        &rpc(
            id,
            "tools/call",
            json!({"name": "fx__echo", "arguments": {"text": "hi"}, "_meta": meta}),
        ),
    )
    .session(session)
    .header("MCP-Protocol-Version", LEGACY)
}

#[test]
fn a_call_that_relays_messages_is_answered_as_an_event_stream() {
    let up = Upstream::start();
    let gw = HttpGateway::start(
        "",
        &format!(
            "[servers.fx]\nurl = \"http://127.0.0.1:{}/mcp\"\npin = \"off\"\n",
            up.port
        ),
    );
    let token = gw.client_token("alice");
    let mut http = gw.http();
    let session = open_session(&mut http, gw.port, Some(&token));
    let r =
        http.call(&call(gw.port, 2, &session, json!({"progressToken": "mine-7"})).bearer(&token));
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    let events = r.events();
    let methods: Vec<&str> = events
        .iter()
        .map(|e| e["method"].as_str().unwrap_or("(answer)"))
        .collect();
    assert_eq!(
        methods,
        [
            "notifications/progress",
            "notifications/message",
            "(answer)"
        ],
        "{events:?}"
    );
    assert_eq!(
        events[0]["params"]["progressToken"], "mine-7",
        "the agent's own token"
    );
    assert_eq!(events[1]["params"]["data"], "working");
    assert_eq!(events[2]["id"], 2);
    assert_eq!(events[2]["result"]["content"][0]["text"], "hi");
    // The connection carries on.
    let r = http.call(
        &Req::post_mcp(gw.port, &rpc(3, "ping", json!({})))
            .bearer(&token)
            .session(&session)
            .header("MCP-Protocol-Version", LEGACY),
    );
    assert_eq!(r.json()["result"], json!({}));

    // Without a progress token: no progress, only the log message.
    let r = http.call(&call(gw.port, 4, &session, json!({})).bearer(&token));
    let events = r.events();
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0]["method"], "notifications/message");

    // HTTP/1.0: the stream, then the connection closes.
    let mut raw = gw.http();
    let bytes = call(gw.port, 5, &session, json!({"progressToken": 1}))
        .bearer(&token)
        .bytes();
    let text = String::from_utf8(bytes)
        .unwrap()
        .replacen("HTTP/1.1", "HTTP/1.0", 1);
    raw.stream.write_all(text.as_bytes()).unwrap();
    let mut got = String::new();
    raw.stream.read_to_string(&mut got).unwrap();
    assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got}");
    let lower = got.to_ascii_lowercase();
    assert!(lower.contains("connection: close") && !lower.contains("transfer-encoding"));
    let data: Vec<Value> = got
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(data.len(), 3, "{got}");
    assert_eq!(data[0]["params"]["progressToken"], 1);
    assert_eq!(data[2]["id"], 5);

    // A local tool relays nothing: plain JSON as before.
    let r = http.call(
        &Req::post_mcp(
            gw.port,
            &rpc(
                6,
                "tools/call",
                json!({"name": "local__echo", "arguments": {"text": "x"}}),
            ),
        )
        .bearer(&token)
        .session(&session)
        .header("MCP-Protocol-Version", LEGACY),
    );
    assert_eq!(r.header("content-type"), Some("application/json"));
    // The made-up token was dropped and counted, the relayed ones recorded.
    let summaries = gw.events("relay_summary");
    assert!(
        summaries
            .iter()
            .any(|s| s["detail"].as_str().unwrap().contains("\"dropped\":1")),
        "{summaries:?}"
    );
}
