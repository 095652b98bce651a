//! The policy matrix through the real gateway: every kind of rule, deny over allow across
//! layers, ask through the admin CLI, rewrite, live reload, and proof that refused
//! requests and responses leak nothing to the agent.

mod common;

use common::*;
use serde_json::{Value, json};
use std::time::Duration;

fn echo(c: &mut FramedClient, text: &str) -> Value {
    c.tool("local__echo", json!({"text": text}))
}

fn refusal_code(r: &Value) -> Option<&str> {
    (r["result"]["isError"] == true)
        .then(|| r["result"]["structuredContent"]["error"]["code"].as_str())
        .flatten()
}

fn echoed(r: &Value) -> Option<&str> {
    r["result"]["content"][0]["text"]
        .as_str()
        .filter(|_| r["result"]["isError"] != true)
}

#[test]
fn argument_rules_equals_contains_regex_glob_and_presence() {
    let gw = TestGateway::start(
        r#"
[[policy.rules]]
id = "eq"
action = "block"
tool = "local__echo"
arg = { path = "text", equals = "exactly this" }
reason = "equals rule"

[[policy.rules]]
id = "contains"
action = "block"
tool = "local__echo"
arg = { path = "text", contains = "rm -rf" }

[[policy.rules]]
id = "regex"
action = "block"
tool = "local__echo"
arg = { path = "text", matches = '(?i)^drop\s+table' }

[[policy.rules]]
id = "glob"
action = "block"
tool = "local__echo"
arg = { path = "text", glob = "*.pem" }

[[policy.rules]]
id = "presence"
action = "block"
tool = "local__echo"
arg_present = "extra"
"#,
    );
    let mut c = gw.connect();
    for (text, rule) in [
        ("exactly this", "eq"),
        ("please rm -rf /", "contains"),
        ("DROP  TABLE x", "regex"),
        ("key.pem", "glob"),
    ] {
        let r = echo(&mut c, text);
        assert_eq!(refusal_code(&r), Some("policy_blocked"), "{text}: {r}");
        assert_eq!(r["result"]["structuredContent"]["error"]["rule"], rule);
        // The refusal carries nothing of the arguments.
        assert!(
            !r.to_string().contains(text),
            "no echo of the blocked argument: {r}"
        );
    }
    let r = c.tool("local__echo", json!({"text": "fine", "extra": 1}));
    assert_eq!(
        r["result"]["structuredContent"]["error"]["rule"],
        "presence"
    );
    // Wrapped arguments are judged unwrapped.
    let r = c.tool("local__echo", json!({"input": {"text": "please rm -rf /"}}));
    assert_eq!(
        r["result"]["structuredContent"]["error"]["rule"], "contains",
        "{r}"
    );
    for text in ["exactly this!", "rm -r", "table drop", "key.pem.txt"] {
        assert_eq!(echoed(&echo(&mut c, text)), Some(text));
    }
    let rows = gw.wait_rows("10 rows", |r| r.len() == 10);
    assert_eq!(rows[0]["decision"], "denied");
    assert_eq!(rows[0]["policy_rule"], "eq");
    assert_eq!(rows[0]["policy_reason"], "equals rule");
    assert_eq!(rows[6]["decision"], "allowed");
    assert_eq!(rows[6]["policy_reason"], "default");
    let n: i64 = gw
        .ledger()
        .query_row(
            "SELECT count(*) FROM security_rule_events WHERE rule_id = 'regex'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(n, 1, "one security_rule_events row per matched rule");
}

#[test]
fn a_900kb_argument_is_judged_whole() {
    let gw = TestGateway::start(
        r#"
[[policy.rules]]
id = "tail-secret"
action = "block"
tool = "local__echo"
arg = { path = "text", contains = "NEEDLE" }
"#,
    );
    let mut c = gw.connect();
    let mut text = "x".repeat(900_000);
    text.push_str("NEEDLE");
    let r = echo(&mut c, &text);
    assert_eq!(
        r["result"]["structuredContent"]["error"]["rule"],
        "tail-secret"
    );
}

#[test]
fn per_tool_block_hides_the_tool_and_refuses_the_call() {
    let gw = TestGateway::start(
        r#"
[[policy.rules]]
id = "no-echo"
action = "block"
tool = "local__echo"
reason = "echo is off today"
"#,
    );
    let mut c = gw.connect();
    let list = c.call("tools/list", json!({}));
    assert!(
        !list.to_string().contains("local__echo"),
        "hidden from tools/list: {list}"
    );
    let r = echo(&mut c, "hello");
    assert_eq!(refusal_code(&r), Some("policy_blocked"));
    assert!(
        r["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("echo is off today")
    );
}

#[test]
fn deny_over_allow_whatever_order_and_layer() {
    let dir = tempfile::tempdir().unwrap();
    let corp = dir.path().join("corp.toml");
    std::fs::write(
        &corp,
        r#"
[policy]
[[policy.rules]]
id = "corp-allow-echo"
action = "allow"
tool = "local__echo"
"#,
    )
    .unwrap();
    let extra = format!(
        r#"
[policy]
corp = "{}"

[[policy.rules]]
id = "a-allow"
action = "allow"
tool = "local__*"

[[policy.rules]]
id = "z-block"
action = "block"
tool = "local__echo"
arg = {{ path = "text", contains = "bad" }}

[[policy.rules]]
id = "m-allow"
action = "allow"
tool = "local__echo"
"#,
        corp.display()
    );
    let config = base_config(dir.path(), &extra);
    let gw = TestGateway::start_with(dir, &config);
    let mut c = gw.connect();
    let r = echo(&mut c, "bad thing");
    assert_eq!(
        r["result"]["structuredContent"]["error"]["rule"], "z-block",
        "{r}"
    );
    assert_eq!(echoed(&echo(&mut c, "good")), Some("good"));
    let rows = gw.wait_rows("two rows", |r| r.len() == 2);
    assert_eq!(
        rows[1]["policy_rule"], "a-allow",
        "the first allow by id names the decision"
    );
}

#[test]
fn locked_corp_rule_cannot_be_disabled_by_the_operator() {
    let dir = tempfile::tempdir().unwrap();
    let corp = dir.path().join("corp.toml");
    std::fs::write(
        &corp,
        r#"
[policy]
[[policy.rules]]
id = "corp-no-echo-secrets"
action = "block"
locked = true
tool = "local__echo"
arg = { contains = "secret" }
"#,
    )
    .unwrap();
    let extra = format!(
        "[policy]\ncorp = \"{}\"\n\n[[policy.rules]]\nid = \"corp-no-echo-secrets\"\noverride = true\nenabled = false\n",
        corp.display()
    );
    let config_path = dir.path().join("toolwall.toml");
    std::fs::write(&config_path, base_config(dir.path(), &extra)).unwrap();
    let out = std::process::Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&config_path)
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success(), "the gateway refuses to start");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("corp-no-echo-secrets"),
        "names the rule: {err}"
    );
    let check = std::process::Command::new(BIN)
        .args(["policy", "check", "--config"])
        .arg(&config_path)
        .output()
        .unwrap();
    assert!(!check.status.success());
    assert!(String::from_utf8_lossy(&check.stdout).contains("corp-no-echo-secrets"));
}

#[test]
fn response_rule_blocks_and_leaks_nothing_and_rewrites_apply() {
    let gw = TestGateway::start(
        r#"
[[policy.rules]]
id = "no-secret-results"
action = "block"
phase = "response"
tool = "local__echo"
result = { contains = "TOPSECRET" }

[[policy.rules]]
id = "mask-args"
action = "rewrite"
tool = "local__echo"
replace = { path = "text", matches = 'password=\S+', with = "password=***" }

[[policy.rules]]
id = "mask-results"
action = "rewrite"
phase = "response"
tool = "local__echo"
replace = { matches = '\d{4}-\d{4}-\d{4}-\d{4}', with = "[card]" }
"#,
    );
    let mut c = gw.connect();
    // Capture every byte the agent receives for the blocked response.
    let r = echo(&mut c, "the TOPSECRET plan: attack at dawn");
    assert_eq!(refusal_code(&r), Some("policy_blocked"));
    let raw = r.to_string();
    for leak in ["TOPSECRET", "attack at dawn", "dawn"] {
        assert!(
            !raw.contains(leak),
            "blocked response leaked {leak:?}: {raw}"
        );
    }
    // Rewrite of an argument (the tool sees the masked text) and of a result.
    let r = echo(&mut c, "login password=hunter2 ok");
    assert_eq!(echoed(&r), Some("login password=*** ok"));
    let r = echo(&mut c, "card 1234-5678-9012-3456 end");
    assert_eq!(echoed(&r), Some("card [card] end"));
    let rows = gw.wait_rows("3 finished rows", |r| {
        r.len() == 3 && r.iter().all(|x| !x["duration_us"].is_null())
    });
    assert_eq!(rows[0]["decision"], "denied");
    assert_eq!(rows[0]["policy_rule"], "no-secret-results");
    // The ledger keeps the original for the operator, and both argument bodies.
    let all: Vec<String> = query_json(&gw.ledger(), "SELECT * FROM tool_call_bodies")
        .iter()
        .map(Value::to_string)
        .collect();
    assert!(
        all.iter().any(|b| b.contains("attack at dawn")),
        "original kept in the ledger"
    );
    assert!(
        all.iter().any(|b| b.contains("hunter2")),
        "original arguments kept"
    );
    assert!(
        all.iter().any(|b| b.contains("password=***")),
        "rewritten arguments kept"
    );
}

#[test]
fn blocked_request_never_reaches_the_worker_and_leaks_nothing() {
    let gw = TestGateway::start(
        r#"
[[policy.rules]]
id = "block-marker"
action = "block"
tool = "local__echo"
arg = { contains = "MARKER-7731" }
"#,
    );
    let mut c = gw.connect();
    // Read raw bytes: nothing of the argument comes back.
    c.request(
        json!(1),
        "tools/call",
        Some(json!({"name": "local__echo", "arguments": {"text": "MARKER-7731 payload"}})),
    );
    let r = c.recv().unwrap();
    let raw = r.body.to_string();
    assert!(!raw.contains("MARKER") && !raw.contains("payload"), "{raw}");
    assert_eq!(refusal_code(&r.body), Some("policy_blocked"));
    // The worker never saw it: no tool_facts, duration near zero, decision denied.
    let rows = gw.wait_rows("row", |r| r.len() == 1);
    assert_eq!(rows[0]["decision"], "denied");
}

#[test]
fn resource_uri_rule() {
    let gw = TestGateway::start(
        r#"
[[policy.rules]]
id = "no-etc"
action = "block"
method = "resources/read"
resource = "file:///etc/*"
"#,
    );
    let mut c = gw.connect();
    let r = c.call("resources/read", json!({"uri": "file:///etc/shadow"}));
    assert_eq!(r["error"]["code"], -32003, "{r}");
    assert_eq!(r["error"]["data"]["rule"], "no-etc");
    let r = c.call("resources/read", json!({"uri": "file:///home/x"}));
    assert_eq!(r["error"]["code"], -32002, "not blocked, just absent: {r}");
    // Both reads have rows: the refused one names its rule.
    let rows = gw.wait_rows("two resources/read rows", |r| r.len() == 2);
    assert_eq!(rows[0]["method"], "resources/read");
    assert_eq!(rows[0]["tool_name"], "file:///etc/shadow");
    assert_eq!(rows[0]["decision"], "denied");
    assert_eq!(rows[0]["policy_rule"], "no-etc");
    assert_eq!(rows[1]["decision"], "error");
}

fn cli_json(gw: &TestGateway, args: &[&str]) -> Value {
    let out = gw.cli(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn ask_approved_denied_and_timed_out() {
    let gw = TestGateway::start(
        r#"
[policy]
ask_timeout_secs = 2

[[policy.rules]]
id = "ask-echo"
action = "ask"
tool = "local__echo"
reason = "a human looks at every echo"
"#,
    );
    let mut c = gw.connect();
    // Approved.
    let sid = c.request(
        json!("a"),
        "tools/call",
        Some(json!({"name": "local__echo", "arguments": {"text": "approve me"}})),
    );
    let pending = loop {
        let p = cli_json(&gw, &["approvals", "--json"]);
        if !p["pending"].as_array().unwrap().is_empty() {
            break p;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let item = &pending["pending"][0];
    assert!(item["arguments"].as_str().unwrap().contains("approve me"));
    assert_eq!(item["rule"], "ask-echo");
    // The connection keeps serving other calls meanwhile.
    assert_eq!(c.call("ping", json!({}))["result"], json!({}));
    let id = item["id"].to_string();
    let out = gw.cli(&["approve", &id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = loop {
        let r = c.recv().unwrap();
        if r.stream == sid {
            break r.body;
        }
    };
    assert_eq!(echoed(&r), Some("approve me"));
    // Denied, with a reason.
    let sid = c.request(
        json!("d"),
        "tools/call",
        Some(json!({"name": "local__echo", "arguments": {"text": "deny me"}})),
    );
    let id = loop {
        let p = cli_json(&gw, &["approvals", "--json"]);
        if let Some(first) = p["pending"].as_array().unwrap().first() {
            break first["id"].to_string();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        gw.cli(&["deny", &id, "--reason", "not today"])
            .status
            .success()
    );
    let r = c.recv().unwrap();
    assert_eq!(r.stream, sid);
    assert_eq!(refusal_code(&r.body), Some("ask_denied"));
    assert!(r.body.to_string().contains("not today"));
    // Timed out.
    let r = echo(&mut c, "nobody answers");
    assert_eq!(refusal_code(&r), Some("ask_timeout"), "{r}");
    let rows = gw.wait_rows("3 ended rows", |r| {
        r.len() == 3 && r.iter().all(|x| !x["duration_us"].is_null())
    });
    assert_eq!(rows[0]["decision"], "allowed");
    assert!(
        rows[0]["approved_by"]
            .as_str()
            .unwrap_or("")
            .contains("admin uid:"),
        "{}",
        rows[0]
    );
    assert_eq!(rows[1]["decision"], "denied");
    assert_eq!(rows[2]["decision"], "denied");
    // Approving something that is not pending is an error, not a crash.
    assert!(!gw.cli(&["approve", "999999"]).status.success());
}

#[test]
fn live_reload_changes_the_next_message_on_an_open_connection() {
    let gw = TestGateway::start("");
    let mut c = gw.connect();
    assert_eq!(echoed(&echo(&mut c, "before")), Some("before"));
    let blocked = base_config(
        gw.dir.path(),
        "[[policy.rules]]\nid = \"now-blocked\"\naction = \"block\"\ntool = \"local__echo\"\n",
    );
    std::fs::write(&gw.config_path, blocked).unwrap();
    let out = gw.cli(&["reload"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = echo(&mut c, "after");
    assert_eq!(
        r["result"]["structuredContent"]["error"]["rule"],
        "now-blocked"
    );
    // An invalid config leaves the old policy in force and says why (file, line, rule).
    std::fs::write(
        &gw.config_path,
        base_config(gw.dir.path(), "[[policy.rules]]\nid = \"bad\"\naction = \"block\"\narg = { matches = \"(unclosed\" }\n"),
    )
    .unwrap();
    unsafe {
        libc::kill(gw.pid() as i32, libc::SIGHUP);
    }
    gw.wait_for_log("reload failed");
    let log = gw.log();
    assert!(log.contains("bad"), "{log}");
    let r = echo(&mut c, "still blocked");
    assert_eq!(
        r["result"]["structuredContent"]["error"]["rule"],
        "now-blocked"
    );
    let reloads = gw.events("reload");
    assert_eq!(reloads.len(), 2);
}

#[test]
fn policy_explain_names_every_matching_rule() {
    let gw = TestGateway::start(
        r#"
[[policy.rules]]
id = "allow-local"
action = "allow"
tool = "local__*"

[[policy.rules]]
id = "block-curl"
action = "block"
tool = "local__echo"
arg = { path = "text", contains = "curl" }
reason = "no curl"
"#,
    );
    let out = gw.cli(&[
        "policy",
        "explain",
        "--tool",
        "local__echo",
        "--args",
        r#"{"text":"curl x"}"#,
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        text.contains("block")
            && text.contains("block-curl")
            && text.contains("allow-local")
            && text.contains("no curl"),
        "{text}"
    );
}

/// A rule without a path finds its pattern however deep the arguments nest within the
/// parser's depth bound (128 arrays and objects counted from the message's top); beyond
/// it the call is refused unjudged and never runs, whatever it holds (fails closed).
#[test]
fn deeply_nested_arguments_are_judged_or_refused_never_run() {
    let gw = TestGateway::start(
        r#"
[[policy.rules]]
id = "block-deep"
action = "block"
tool = "local__echo"
arg = { contains = "DEEP-4417" }
"#,
    );
    let nest = |depth: usize, leaf: Value| (0..depth).fold(leaf, |v, _| json!({ "k": v }));
    let mut c = gw.connect();
    let r = c.tool(
        "local__echo",
        json!({"text": "a", "x": nest(110, json!("DEEP-4417"))}),
    );
    assert_eq!(
        r["result"]["structuredContent"]["error"]["rule"], "block-deep",
        "{r}"
    );
    let r = c.tool(
        "local__echo",
        json!({"text": "a", "x": nest(110, json!("fine"))}),
    );
    assert_eq!(echoed(&r), Some("a"), "{r}");
    c.request(
        json!("deep"),
        "tools/call",
        Some(json!({"name": "local__echo", "arguments": {"text": "a", "x": nest(200, json!("fine"))}})),
    );
    let r = c.recv().unwrap().body;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("recursion limit"), "{r}");
    let rows = gw.wait_rows("three rows", |r| r.len() == 3);
    let decisions: Vec<&Value> = rows.iter().map(|r| &r["decision"]).collect();
    assert_eq!(
        decisions,
        [&json!("denied"), &json!("allowed"), &json!("error")]
    );
}
