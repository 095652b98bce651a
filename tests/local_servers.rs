//! Local MCP servers (`[servers.NAME] command = [...]`) through the real binary: started
//! as confined children of a host that attested first, spoken to over stdio in both eras,
//! behind the same catalog, policy and ledger as any server; faults at start and mid-call;
//! secrets that reach the program and nothing else.

mod common;

use common::{PATIENCE, TestGateway, agent_user, base_config};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/stdio_server.py")
}

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The tempdir of a test gateway, traversable by the agent user (its servers' state
/// directory is inside it).
fn open_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    common::searchable_above(dir.path());
    let _ = agent_user();
    dir
}

/// A `[servers.NAME]` table running the fixture with `args`, plus `extra` keys.
fn fixture_server(name: &str, args: &[&str], extra: &str) -> String {
    let mut command = vec!["python3".to_string(), fixture().display().to_string()];
    command.extend(args.iter().map(|a| a.to_string()));
    format!(
        "[servers.{name}]\ncommand = {}\nread_paths = [\"{}\"]\n{extra}\n",
        serde_json::to_string(&command).unwrap(),
        fixtures_dir().display()
    )
}

fn start(dir: tempfile::TempDir, servers: &str) -> TestGateway {
    let settings = format!(
        "[servers]\nstate_dir = \"{}/servers\"\nretry_max_secs = 2\n",
        dir.path().display()
    );
    let config = base_config(dir.path(), &format!("{settings}\n{servers}"));
    TestGateway::start_with(dir, &config)
}

/// The text of a tool result.
fn text(result: &Value) -> String {
    result["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn tool_json(result: &Value) -> Value {
    serde_json::from_str(&text(result)).unwrap_or(Value::Null)
}

/// Poll `status` until `check` holds for server `name`.
fn wait_server(gw: &TestGateway, name: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + PATIENCE * 2;
    loop {
        let status = gw.admin(json!({"op": "status"}));
        let entry = status["servers"]
            .as_array()
            .and_then(|a| a.iter().find(|s| s["server"] == name).cloned())
            .unwrap_or(Value::Null);
        if check(&entry) {
            return entry;
        }
        if Instant::now() > deadline {
            panic!(
                "server {name} never showed {what}: {entry:#}\nlog:\n{}",
                gw.log()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_tool(gw: &TestGateway, tool: &str) {
    let deadline = Instant::now() + PATIENCE * 2;
    let mut c = gw.connect();
    loop {
        let list = c.call("tools/list", json!({}));
        let names: Vec<String> = list["result"]["tools"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|t| t["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        if names.iter().any(|n| n == tool) {
            return;
        }
        if Instant::now() > deadline {
            panic!("{tool} never listed: {names:?}\nlog:\n{}", gw.log());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_local_server_serves_through_the_one_pipeline() {
    common::deps::ensure(&["python3"]);
    let dir = open_dir();
    let gw = start(dir, &fixture_server("fx", &[], ""));
    wait_tool(&gw, "fx__echo");
    let mut c = gw.connect();
    let r = c.tool("fx__echo", json!({"text": "through the wall"}));
    assert_eq!(text(&r), "through the wall", "{r}");
    let who = tool_json(&c.tool("fx__whoami", json!({})));
    let agent = agent_user();
    assert_eq!(who["uid"], agent.uid, "runs as the agent user: {who}");
    let env: Vec<String> = serde_json::from_value(who["env"].clone()).unwrap();
    // Python adds nothing of its own to os.environ here; the set is exactly ours.
    assert_eq!(env, vec!["HOME", "LANG", "PATH", "TMPDIR"], "{who}");
    assert!(
        who["home"].as_str().unwrap().ends_with("/servers/fx"),
        "{who}"
    );
    assert!(
        who["tmpdir"].as_str().unwrap().ends_with("/servers/fx/tmp"),
        "{who}"
    );
    // Resources and prompts cross the same pipeline.
    let read = c.call("resources/read", json!({"uri": "fixture://hello"}));
    assert_eq!(read["result"]["contents"][0]["text"], "hello", "{read}");
    let prompt = c.call(
        "prompts/get",
        json!({"name": "fx__greet", "arguments": {"who": "me"}}),
    );
    assert_eq!(
        prompt["result"]["messages"][0]["content"]["text"], "hello me",
        "{prompt}"
    );
    // The ledger has the rows, as for any server.
    let rows = gw.wait_rows("the echo row", |rows| {
        rows.iter()
            .any(|r| r["tool_name"] == "echo" && r["decision"] == "allowed")
    });
    assert!(rows.iter().any(|r| r["server_name"] == "fx"), "{rows:#?}");
    // Status: the server's transport, pid, era; its host's probes like any worker's.
    let entry = wait_server(&gw, "fx", "a pid", |s| s["pid"].is_i64());
    assert_eq!(entry["transport"], "stdio", "{entry}");
    assert_eq!(entry["state"], "up", "{entry}");
    assert!(
        entry["era"].as_str().unwrap().starts_with("modern"),
        "{entry}"
    );
    let status = gw.admin(json!({"op": "status"}));
    let host = status["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == "server:fx")
        .cloned()
        .expect("the host in status");
    assert_eq!(host["role"], "stdio-server", "{host}");
    assert_eq!(host["confined"], true, "{host}");
    assert_eq!(host["confinement"]["uid"], agent.uid, "{host}");
    let text = String::from_utf8_lossy(&gw.cli(&["status"]).stdout).into_owned();
    assert!(text.contains("server fx  state up"), "{text}");
    assert!(text.contains("stdio python3"), "{text}");
}
