//! The dispatch matrix through the real guest relay, into the real gateway, over unix.

mod common;

use common::*;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The relay binary next to ours; built on demand when only this package was built.
fn relay_bin() -> PathBuf {
    let bin = PathBuf::from(BIN).with_file_name("toolwall-relay");
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "toolwall-relay"])
            .status()
            .expect("build the relay");
        assert!(status.success());
    }
    bin
}

#[test]
fn dispatch_through_the_relay() {
    let gw = TestGateway::start("");
    let mut relay = Command::new(relay_bin())
        .arg("--connect")
        .arg(format!("unix:{}", gw.sock.display()))
        .arg("--name")
        .arg("guest agent")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn relay");
    let mut stdin = relay.stdin.take().unwrap();
    let mut stdout = BufReader::new(relay.stdout.take().unwrap());
    let mut ask = |msg: Value| -> Value {
        stdin.write_all(format!("{msg}\n").as_bytes()).unwrap();
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    };
    let r = ask(
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{}}}),
    );
    assert_eq!(r["result"]["protocolVersion"], "2025-06-18");
    let r = ask(json!({"jsonrpc":"2.0","id":2,"method":"tools/list"}));
    assert!(
        r["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "local__echo")
    );
    let r = ask(
        json!({"jsonrpc":"2.0","id":"three","method":"tools/call","params":{"name":"local__echo","arguments":{"text":"via relay"}}}),
    );
    assert_eq!(r["id"], "three");
    assert_eq!(r["result"]["content"][0]["text"], "via relay");
    for (method, code) in [("resources/read", -32602), ("nope", -32601)] {
        let r = ask(json!({"jsonrpc":"2.0","id":4,"method":method}));
        assert_eq!(r["error"]["code"], code, "{method}: {r}");
    }
    let r = ask(json!({"jsonrpc":"2.0","id":5,"method":"resources/list"}));
    assert_eq!(r["result"]["resources"], json!([]));
    let r = ask(json!({"jsonrpc":"2.0","id":6,"method":"prompts/list"}));
    assert_eq!(r["result"]["prompts"], json!([]));
    let r = ask(json!({"jsonrpc":"2.0","id":7,"method":"ping"}));
    assert_eq!(r["result"], json!({}));
    drop(stdin);
    let status = wait_timeout(&mut relay, PATIENCE).expect("relay exits at EOF");
    assert!(status.success());
    // The echo, and the resources/read refused for its missing uri.
    let rows = gw.wait_rows("the relay's calls", |r| r.len() == 2);
    assert_eq!(rows[1]["method"], "resources/read");
    assert_eq!(rows[0]["process_name"], "guest_agent");
    assert_eq!(rows[0]["transport"], "unix");
}
