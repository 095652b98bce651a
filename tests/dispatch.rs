//! The dispatch matrix: every method of the legacy era over framed unix and over stdio
//! (the relay's run is in tests/relay.rs), with the ledger rows they leave.

mod common;

use common::*;
use serde_json::{Value, json};

/// A method, its params (`None`: none sent), and what the answer must show.
type Case = (&'static str, Option<Value>, fn(&Value));

fn matrix() -> Vec<Case> {
    vec![
        (
            "initialize",
            Some(
                json!({"protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
            ),
            |r| {
                assert_eq!(r["result"]["protocolVersion"], "2025-03-26");
                assert_eq!(r["result"]["serverInfo"]["name"], "toolwall");
                assert_eq!(
                    r["result"]["serverInfo"]["version"],
                    env!("CARGO_PKG_VERSION")
                );
                assert!(r["result"]["capabilities"]["tools"].is_object());
                // logging/setLevel sets the level of the servers' log messages relayed
                // during this client's calls; completions and subscriptions it has not.
                assert!(r["result"]["capabilities"]["logging"].is_object());
                assert!(
                    r["result"]["capabilities"].get("completions").is_none(),
                    "only capabilities it has"
                );
            },
        ),
        ("logging/setLevel", Some(json!({"level": "warning"})), |r| {
            assert_eq!(r["result"], json!({}), "{r}");
        }),
        ("logging/setLevel", Some(json!({"level": "loud"})), |r| {
            assert_eq!(r["error"]["code"], -32602, "{r}");
        }),
        (
            "initialize",
            Some(json!({"protocolVersion": "2031-01-01", "capabilities": {}})),
            |r| {
                assert_eq!(
                    r["result"]["protocolVersion"], "2025-11-25",
                    "unknown version: the newest"
                );
            },
        ),
        ("ping", None, |r| assert_eq!(r["result"], json!({}))),
        ("tools/list", None, |r| {
            let tools = r["result"]["tools"].as_array().unwrap();
            assert!(tools.iter().any(|t| t["name"] == "local__echo"), "{r}");
            assert!(
                tools
                    .iter()
                    .all(|t| t["name"].as_str().unwrap().contains("__"))
            );
        }),
        (
            "tools/call",
            Some(json!({"name": "local__echo", "arguments": {"text": "héllo"}})),
            |r| {
                assert_eq!(
                    r["result"]["content"][0],
                    json!({"type": "text", "text": "héllo"})
                );
            },
        ),
        (
            "tools/call",
            Some(json!({"name": "local__echo", "arguments": {"input": {"text": "wrapped"}}})),
            |r| {
                assert_eq!(
                    r["result"]["content"][0]["text"], "wrapped",
                    "arguments wrapped as {{\"input\": ...}} are unwrapped: {r}"
                );
            },
        ),
        (
            "tools/call",
            Some(json!({"name": "local__missing", "arguments": {}})),
            |r| {
                assert_eq!(r["error"]["code"], -32602);
            },
        ),
        ("tools/call", Some(json!({"arguments": {}})), |r| {
            assert_eq!(r["error"]["code"], -32602)
        }),
        ("resources/list", None, |r| {
            assert_eq!(r["result"], json!({"resources": []}))
        }),
        (
            "resources/read",
            Some(json!({"uri": "file:///nothing"})),
            |r| assert_eq!(r["error"]["code"], -32002),
        ),
        ("prompts/list", None, |r| {
            assert_eq!(r["result"], json!({"prompts": []}))
        }),
        ("prompts/get", Some(json!({"name": "local__none"})), |r| {
            assert_eq!(r["error"]["code"], -32602)
        }),
        ("sampling/createMessage", None, |r| {
            assert_eq!(r["error"]["code"], -32601)
        }),
        ("tools/list", Some(json!({"cursor": 7})), |r| {
            assert_eq!(r["error"]["code"], -32602)
        }),
    ]
}

#[test]
fn every_method_over_framed_unix() {
    let gw = TestGateway::start("");
    let mut c = gw.connect();
    c.notify("notifications/initialized", None);
    for (method, params, check) in matrix() {
        let r = c.call(method, params.unwrap_or(json!({})));
        check(&r);
    }
    // A cancel for something already answered is ignored, and only counted: recorded, a
    // flood of them would fill the ledger.
    c.notify(
        "notifications/cancelled",
        Some(json!({"requestId": 1, "reason": "test"})),
    );
    let r = c.call("ping", json!({}));
    assert_eq!(r["result"], json!({}));
    // Every request that reaches the pipeline has a row: 4 tools/call, and the
    // resources/read and prompts/get of unknown targets.
    let rows = gw.wait_rows("6 rows", |r| r.len() == 6);
    let methods: Vec<&str> = rows.iter().map(|r| r["method"].as_str().unwrap()).collect();
    assert_eq!(
        methods.iter().filter(|m| **m == "tools/call").count(),
        4,
        "{methods:?}"
    );
    assert!(methods.contains(&"resources/read") && methods.contains(&"prompts/get"));
    let rows: Vec<Value> = rows
        .into_iter()
        .filter(|r| r["method"] == "tools/call")
        .collect();
    assert_eq!(rows[0]["decision"], "allowed");
    assert_eq!(rows[0]["server_name"], "local");
    assert_eq!(rows[0]["transport"], "unix");
    assert_eq!(rows[2]["decision"], "error", "unknown tool");
    assert!(
        rows[2]["error_message"]
            .as_str()
            .unwrap()
            .contains("unknown tool")
    );
    // Events: connect, initialize, list calls; no row for the cancel that matched nothing.
    for kind in [
        "connect",
        "initialize",
        "list",
        "worker_start",
        "worker_ready",
    ] {
        assert!(!gw.events(kind).is_empty(), "an events row of kind {kind}");
    }
    assert!(
        gw.events("cancelled").is_empty(),
        "{:?}",
        gw.events("cancelled")
    );
}

#[test]
fn every_method_over_stdio_and_eof_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let config = base_config(dir.path(), "");
    let config_path = dir.path().join("toolwall.toml");
    std::fs::write(&config_path, config).unwrap();
    let mut lines =
        vec![json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string()];
    let cases = matrix();
    for (i, (method, params, _)) in cases.iter().enumerate() {
        let mut msg = json!({"jsonrpc": "2.0", "id": i, "method": method});
        if let Some(p) = params {
            msg["params"] = p.clone();
        }
        lines.push(msg.to_string());
    }
    lines.push("{broken".into());
    lines.push(r#"[{"jsonrpc":"2.0","id":99,"method":"ping"}]"#.into());
    lines.push("\"just a string\"".into());
    let (out, status, err) = stdio_session(&config_path, dir.path(), &lines);
    assert!(status.success(), "exit 0 at EOF; stderr: {err}");
    let by_id = |id: usize| {
        out.iter()
            .find(|v| v["id"] == json!(id))
            .unwrap_or_else(|| panic!("answer {id} in {out:#?}"))
    };
    for (i, (_, _, check)) in cases.iter().enumerate() {
        check(by_id(i));
    }
    let faults: Vec<i64> = out
        .iter()
        .filter(|v| v["id"].is_null())
        .map(|v| v["error"]["code"].as_i64().unwrap())
        .collect();
    assert_eq!(faults, vec![-32700, -32600, -32600]);
    // stdout carried protocol only: every line parsed as JSON above.
    let ledger = rusqlite::Connection::open(dir.path().join("state/ledger.db")).unwrap();
    let rows = query_json(&ledger, "SELECT * FROM tool_calls ORDER BY id");
    assert_eq!(
        rows.len(),
        6,
        "4 tools/call, 1 resources/read, 1 prompts/get"
    );
    assert_eq!(rows[0]["transport"], "stdio");
    assert!(rows[0]["principal"].as_str().unwrap().starts_with("uid:"));
}

#[test]
fn stdio_finishes_calls_in_flight_at_eof() {
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("toolwall.toml");
    std::fs::write(&config_path, base_config(dir.path(), "")).unwrap();
    let lines: Vec<String> = (0..200)
        .map(|i| json!({"jsonrpc":"2.0","id":i,"method":"tools/call","params":{"name":"local__echo","arguments":{"text":format!("t{i}")}}}).to_string())
        .collect();
    let (out, status, err) = stdio_session(&config_path, dir.path(), &lines);
    assert!(status.success(), "{err}");
    assert_eq!(out.len(), 200, "every call answered before exit");
    let ledger = rusqlite::Connection::open(dir.path().join("state/ledger.db")).unwrap();
    let n: i64 = ledger
        .query_row(
            "SELECT count(*) FROM tool_calls WHERE decision = 'allowed'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(n, 200);
}

#[test]
fn ledger_row_fields_for_a_call() {
    let gw = TestGateway::start("");
    let mut c = gw.connect();
    c.name = "claude".into();
    let r = c.tool("local__echo", json!({"text": "row check"}));
    assert_eq!(r["result"]["content"][0]["text"], "row check");
    let rows = gw.wait_rows("the row", |r| {
        r.len() == 1 && !r[0]["duration_us"].is_null()
    });
    let row = &rows[0];
    assert_eq!(row["transport"], "unix");
    assert_eq!(
        row["principal"],
        format!("uid:{}", unsafe { libc::getuid() })
    );
    assert_eq!(row["process_name"], "claude");
    assert_eq!(row["server_name"], "local");
    assert_eq!(row["tool_name"], "echo");
    assert_eq!(row["method"], "tools/call");
    assert_eq!(row["decision"], "allowed");
    assert_eq!(row["policy_reason"], "default");
    assert!(row["arguments"].as_str().unwrap().contains("row check"));
    assert!(
        row["response_preview"]
            .as_str()
            .unwrap()
            .contains("row check")
    );
    assert!(row["bytes_received"].as_i64().unwrap() > 0);
    assert!(row["bytes_sent"].as_i64().unwrap() > 0);
    assert!(row["ts_ms"].as_i64().unwrap() > 1_700_000_000_000);
    // The CLI reads it back.
    let out = gw.cli(&["ledger", "tail", "-n", "5"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("echo"));
    let out = gw.cli(&["ledger", "tail", "--json"]);
    let line = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(line.lines().last().unwrap()).unwrap();
    assert_eq!(v["tool_name"], "echo");
}

#[test]
fn process_name_falls_back_to_the_peer() {
    let gw = TestGateway::start("");
    let mut c = gw.connect();
    c.name = String::new();
    c.tool("local__echo", json!({"text": "x"}));
    let rows = gw.wait_rows("the row", |r| r.len() == 1);
    // The test binary itself is the peer process.
    let comm = std::fs::read_to_string("/proc/self/comm").unwrap();
    assert_eq!(rows[0]["process_name"], comm.trim().replace(' ', "_"));
}

#[test]
fn concurrent_connections_each_get_their_answers() {
    let gw = TestGateway::start("");
    let sock = gw.sock.clone();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let sock = sock.clone();
            std::thread::spawn(move || {
                let mut c = FramedClient::connect(&sock);
                for i in 0..50 {
                    let text = format!("c{t}-{i}");
                    let r = c.tool("local__echo", json!({"text": text}));
                    assert_eq!(r["result"]["content"][0]["text"], text);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    gw.wait_rows("400 rows", |r| r.len() == 400);
}
