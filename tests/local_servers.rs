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
    wait_listed(gw, "tools/list", "tools", "name", tool);
}

/// Wait until `method`'s answer lists an item whose `field` is `want`: a server's tools,
/// prompts and resources are listed one after another, so one being there says nothing
/// of the others.
fn wait_listed(gw: &TestGateway, method: &str, key: &str, field: &str, want: &str) {
    let deadline = Instant::now() + PATIENCE * 2;
    let mut c = gw.connect();
    loop {
        let list = c.call(method, json!({}));
        let names: Vec<String> = list["result"][key]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|t| t[field].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        if names.iter().any(|n| n == want) {
            return;
        }
        if Instant::now() > deadline {
            panic!(
                "{want} never listed by {method}: {names:?}\nlog:\n{}",
                gw.log()
            );
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
    // Resources and prompts cross the same pipeline (once listed: the tools were first).
    wait_listed(&gw, "resources/list", "resources", "uri", "fixture://hello");
    wait_listed(&gw, "prompts/list", "prompts", "name", "fx__greet");
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

fn is_tool_error(r: &Value) -> bool {
    r["result"]["isError"] == true
}

/// The message of a refused call (the structured error's, or the text).
fn error_message(r: &Value) -> String {
    r["result"]["structuredContent"]["error"]["message"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| text(r))
}

#[test]
fn faults_at_start_are_clear_errors_naming_the_server_and_the_gateway_goes_on() {
    common::deps::ensure(&["python3"]);
    let dir = open_dir();
    let servers = [
        fixture_server(
            "hang",
            &["--hang"],
            "start_timeout_secs = 2\ndiscover_timeout_ms = 300",
        ),
        fixture_server("junk", &["--garbage-at-start"], "start_timeout_secs = 5"),
        fixture_server("gone", &["--exit-at-start"], "start_timeout_secs = 5"),
        fixture_server("missing", &[], "start_timeout_secs = 5")
            .replace("\"python3\"", "\"surely-not-installed-mcp-server\""),
    ]
    .join("\n");
    let gw = start(dir, &servers);
    let hang = wait_server(&gw, "hang", "a start timeout", |s| {
        s["state"] == "down"
            && s["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("did not answer within 2 s of its start"))
    });
    assert!(
        hang["last_error"].as_str().unwrap().contains("server hang"),
        "{hang}"
    );
    let junk = wait_server(&gw, "junk", "the garbage", |s| {
        s["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("something other than a JSON-RPC message"))
    });
    let e = junk["last_error"].as_str().unwrap();
    assert!(
        e.contains("server junk") && e.contains("Server listening on stdio"),
        "{e}"
    );
    let gone = wait_server(&gw, "gone", "its exit", |s| {
        s["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("exited with code 7"))
    });
    let e = gone["last_error"].as_str().unwrap();
    // The usual cause of a failed start, in the error: its last stderr lines.
    assert!(e.contains("cannot find my package"), "{e}");
    let missing = wait_server(&gw, "missing", "the missing program", |s| {
        s["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("was not found on PATH"))
    });
    assert!(
        missing["last_error"]
            .as_str()
            .unwrap()
            .contains("surely-not-installed-mcp-server"),
        "{missing}"
    );
    // Started again with backoff, not given up.
    wait_server(&gw, "gone", "a restart", |s| {
        s["starts"].as_u64() >= Some(2)
    });
    // Meanwhile the gateway serves everything else.
    let mut c = gw.connect();
    let r = c.tool("local__echo", json!({"text": "still here"}));
    assert_eq!(text(&r), "still here", "{r}");
    // `status NAME` says why, with the server's stderr.
    let out = gw.cli(&["status", "gone"]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("server gone  state"), "{shown}");
    assert!(shown.contains("cannot find my package"), "{shown}");
    assert!(shown.contains("worker server:gone"), "{shown}");
    assert!(shown.contains("probe read_probe_dir"), "{shown}");
}

#[test]
fn faults_mid_call_fail_at_once_and_the_server_starts_again() {
    common::deps::ensure(&["python3"]);
    let dir = open_dir();
    let gw = start(
        dir,
        &fixture_server("fx", &[], "timeout_secs = 3\nstop_grace_ms = 200"),
    );
    wait_tool(&gw, "fx__crash");
    // A call in flight fails as soon as the program dies, not when its sleep would end.
    let mut sleeper = gw.connect();
    let sid = sleeper.request(
        json!(1),
        "tools/call",
        Some(json!({"name": "fx__sleep", "arguments": {"secs": 30}})),
    );
    let _ = sid;
    std::thread::sleep(Duration::from_millis(200));
    let mut c = gw.connect();
    let crash = c.tool("fx__crash", json!({"code": 3}));
    assert!(is_tool_error(&crash), "{crash}");
    let m = error_message(&crash);
    assert!(
        m.contains("server fx") && m.contains("exited with code 3"),
        "{m}"
    );
    assert!(m.contains("crashing on purpose"), "the stderr tail: {m}");
    let slept = sleeper.recv().expect("the sleeping call's answer");
    let slept = slept.body;
    assert!(is_tool_error(&slept), "failed with the program: {slept}");
    // Back after its backoff.
    let entry = wait_server(&gw, "fx", "a second start", |s| {
        s["state"] == "up" && s["starts"].as_u64() >= Some(2)
    });
    assert!(entry["pid"].is_i64(), "{entry}");
    let r = c.tool("fx__echo", json!({"text": "again"}));
    assert_eq!(text(&r), "again", "{r}");

    // A call the program does not answer within timeout_secs fails, naming the key; the
    // program goes on serving.
    let slow = c.tool("fx__sleep", json!({"secs": 10}));
    assert!(is_tool_error(&slow), "{slow}");
    let m = error_message(&slow);
    assert!(
        m.contains("no answer within 3 s") && m.contains("servers.fx.timeout_secs"),
        "{m}"
    );
    let r = c.tool("fx__echo", json!({"text": "still up"}));
    assert_eq!(text(&r), "still up", "{r}");

    // Garbage on stdout in the middle of a call.
    let junk = c.tool("fx__garbage", json!({}));
    assert!(is_tool_error(&junk), "{junk}");
    let m = error_message(&junk);
    assert!(
        m.contains("not a JSON-RPC message") || m.contains("something other than a JSON-RPC"),
        "{m}"
    );
    wait_server(&gw, "fx", "a third start", |s| {
        s["state"] == "up" && s["starts"].as_u64() >= Some(3)
    });

    // A program that stops reading its stdin: a big message cannot be written; the call
    // fails after timeout_secs, naming the server.
    let r = c.tool("fx__stop_reading", json!({}));
    assert!(!is_tool_error(&r), "{r}");
    let big = "x".repeat(512 * 1024);
    let r = c.tool("fx__echo", json!({"text": big}));
    assert!(
        is_tool_error(&r),
        "{}",
        &r.to_string()[..300.min(r.to_string().len())]
    );
    let m = error_message(&r);
    assert!(
        m.contains("server fx") && m.contains("does not read its stdin"),
        "{m}"
    );
    wait_server(&gw, "fx", "a fourth start", |s| {
        s["state"] == "up" && s["starts"].as_u64() >= Some(4)
    });
    let r = c.tool("fx__echo", json!({"text": "and again"}));
    assert_eq!(text(&r), "and again", "{r}");
}

/// VmRSS of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_stderr_flood_is_bounded_counted_and_shown_in_status() {
    common::deps::ensure(&["python3"]);
    let dir = open_dir();
    let gw = start(dir, &fixture_server("fx", &[], ""));
    wait_tool(&gw, "fx__flood_stderr");
    let mut c = gw.connect();
    let before = rss_kib(gw.pid());
    // 200,000 lines, about 16 MB.
    let r = c.tool("fx__flood_stderr", json!({"lines": 200000}));
    assert!(!is_tool_error(&r), "{r}");
    let r = c.tool("fx__echo", json!({"text": "after the flood"}));
    assert_eq!(text(&r), "after the flood", "{r}");
    let after = rss_kib(gw.pid());
    assert!(
        after < before + 16 * 1024,
        "the gateway grew from {before} to {after} KiB"
    );
    let detail = {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let d = gw.admin(json!({"op": "status", "server": "fx"}));
            if d["server"]["stderr"]["dropped"].as_u64().unwrap_or(0) > 1000 {
                break d;
            }
            assert!(Instant::now() < deadline, "{d}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let lines = detail["server"]["stderr"]["lines"].as_array().unwrap();
    assert!(!lines.is_empty() && lines.len() <= 50, "{}", lines.len());
    assert!(lines[0].as_str().unwrap().contains("stderr flood line"));
    // The log says it left lines out, and holds far fewer than were written.
    gw.wait_for_log("stderr lines not logged");
    let logged = gw.log().matches("stderr flood line").count();
    assert!(logged < 1000, "{logged} lines logged");
}

fn refused(r: &Value, what: &str) -> String {
    let v = tool_json(r);
    assert_eq!(v["ok"], false, "{what} was not refused: {r}");
    let errno = v["errno"].as_str().unwrap_or_default().to_owned();
    assert!(
        matches!(errno.as_str(), "EACCES" | "EPERM"),
        "{what}: refused with {errno}, not by the kernel's walls: {v}"
    );
    errno
}

fn pid_alive(pid: i64) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

#[test]
fn a_hostile_server_is_refused_by_the_kernel_and_leaves_nothing_behind() {
    common::deps::ensure(&["python3"]);
    let dir = open_dir();
    let open_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let granted = open_port.local_addr().unwrap().port();
    let other_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let ungranted = other_port.local_addr().unwrap().port();
    let d = dir.path().to_path_buf();
    let servers = format!(
        "{}\n{}\n{}",
        fixture_server("evil", &[], ""),
        fixture_server("other", &[], ""),
        fixture_server("net", &[], &format!("network = [{granted}]"))
    );
    let mut gw = start(dir, &servers);
    wait_tool(&gw, "evil__read_file");
    wait_tool(&gw, "other__echo");
    wait_tool(&gw, "net__connect_tcp");
    let mut c = gw.connect();
    let call = |c: &mut common::FramedClient, tool: &str, args: Value| c.tool(tool, args);
    let ledger = d.join("state/ledger.db");
    let config = d.join("toolwall.toml");
    let other_state = d.join("servers/other");
    for (what, path) in [
        ("the ledger", ledger.clone()),
        ("the config", config.clone()),
        ("/etc/shadow", PathBuf::from("/etc/shadow")),
        ("another server's state", other_state.join("tmp")),
    ] {
        refused(
            &call(&mut c, "evil__read_file", json!({"path": path})),
            what,
        );
    }
    refused(
        &call(&mut c, "evil__list_dir", json!({"path": other_state})),
        "listing another server's state",
    );
    refused(
        &call(&mut c, "evil__list_dir", json!({"path": d.join("state")})),
        "listing the ledger's directory",
    );
    for path in [
        d.join("escape.txt"),
        fixtures_dir().join("written-by-a-server.txt"),
        PathBuf::from("/tmp/written-by-a-server.txt"),
        other_state.join("planted.txt"),
    ] {
        refused(
            &call(&mut c, "evil__write_file", json!({"path": path})),
            &format!("writing {}", path.display()),
        );
        assert!(!path.exists(), "{} exists", path.display());
    }
    // Its own state directory is its own.
    let who = tool_json(&call(&mut c, "evil__whoami", json!({})));
    let home = PathBuf::from(who["home"].as_str().unwrap());
    let own = home.join("own.txt");
    let r = tool_json(&call(&mut c, "evil__write_file", json!({"path": own})));
    assert_eq!(r["ok"], true, "{r}");
    // No network at all without `network`; with it, only its ports.
    refused(
        &call(&mut c, "evil__connect_tcp", json!({"port": granted})),
        "a TCP connect without network",
    );
    let r = tool_json(&call(&mut c, "net__connect_tcp", json!({"port": granted})));
    assert_eq!(r["ok"], true, "the granted port: {r}");
    refused(
        &call(&mut c, "net__connect_tcp", json!({"port": ungranted})),
        "an ungranted port",
    );
    for sock in [d.join("mcp.sock"), d.join("admin.sock")] {
        refused(
            &call(&mut c, "evil__connect_unix", json!({"path": sock})),
            "toolwall's unix sockets",
        );
    }
    refused(
        &call(&mut c, "evil__signal", json!({"pid": gw.pid(), "sig": 0})),
        "signalling the gateway",
    );
    refused(
        &call(&mut c, "evil__parent_environ", json!({})),
        "its parent's environment",
    );
    // A process that tries to outlive the server (new session, SIGTERM ignored).
    let pidfile = home.join("tmp/left.pid");
    let left = tool_json(&call(
        &mut c,
        "evil__leave_behind",
        json!({"pidfile": pidfile}),
    ));
    let pid = left["pid"].as_i64().unwrap_or(0);
    assert!(pid > 0 && pid_alive(pid), "{left}");
    let server_pid = who["pid"].as_i64().unwrap();
    gw.terminate();
    let deadline = Instant::now() + PATIENCE;
    while pid_alive(pid) || pid_alive(server_pid) {
        assert!(
            Instant::now() < deadline,
            "a process of the server outlived the stop: {pid} {server_pid}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(open_port);
    drop(other_port);
}

#[test]
fn a_secret_reaches_the_program_and_no_ledger_byte_log_line_or_status() {
    use sha2::Digest;
    use std::os::unix::fs::PermissionsExt;
    common::deps::ensure(&["python3"]);
    let dir = open_dir();
    let secret = format!("tw-secret-{:x}", rand_u64());
    let file = dir.path().join("api.token");
    std::fs::write(&file, format!("{secret}\n")).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let servers = fixture_server(
        "fx",
        &["--print-env-to-stderr"],
        &format!("secret_env = {{ API_TOKEN = \"{}\" }}", file.display()),
    );
    let gw = start(dir, &servers);
    wait_tool(&gw, "fx__env_check");
    let mut c = gw.connect();
    let digest = hex(&sha2::Sha256::digest(secret.as_bytes()));
    let r = tool_json(&c.tool(
        "fx__env_check",
        json!({"name": "API_TOKEN", "sha256": digest}),
    ));
    assert_eq!(r["present"], true, "{r}");
    assert_eq!(r["matches"], true, "the program has the exact value: {r}");
    // The program printed its environment on stderr: the value is redacted.
    let detail = {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let d = gw.admin(json!({"op": "status", "server": "fx"}));
            if d.to_string().contains("env API_TOKEN=") {
                break d;
            }
            assert!(Instant::now() < deadline, "{d}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    assert!(
        detail
            .to_string()
            .contains("env API_TOKEN=<secret API_TOKEN>"),
        "{detail}"
    );
    // A refusal and an error in the same session, to give it every chance to leak.
    let _ = c.tool("fx__read_file", json!({"path": "/etc/shadow"}));
    let _ = c.tool("fx__crash", json!({"code": 9}));
    wait_server(&gw, "fx", "a restart", |s| {
        s["state"] == "up" && s["starts"].as_u64() >= Some(2)
    });
    let statuses = [
        gw.cli(&["status"]).stdout,
        gw.cli(&["status", "--json"]).stdout,
        gw.cli(&["status", "fx"]).stdout,
        gw.cli(&["status", "fx", "--json"]).stdout,
    ];
    let mut gw = gw;
    gw.terminate();
    let mut haystacks: Vec<(String, Vec<u8>)> = statuses
        .into_iter()
        .enumerate()
        .map(|(i, s)| (format!("status output {i}"), s))
        .collect();
    haystacks.push(("the log".into(), gw.log().into_bytes()));
    for entry in std::fs::read_dir(gw.dir.path().join("state")).unwrap() {
        let p = entry.unwrap().path();
        if p.is_file() {
            haystacks.push((p.display().to_string(), std::fs::read(&p).unwrap()));
        }
    }
    assert!(haystacks.len() >= 6, "{}", haystacks.len());
    for (what, bytes) in &haystacks {
        let text = String::from_utf8_lossy(bytes);
        assert!(!text.contains(&secret), "the secret is in {what}");
    }
}

fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .unwrap();
    u64::from_ne_bytes(b)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn both_eras_over_stdio() {
    common::deps::ensure(&["python3"]);
    let dir = open_dir();
    let servers = [
        fixture_server("both", &["--era", "both"], ""),
        fixture_server("legacy", &["--era", "legacy"], ""),
        fixture_server(
            "silent",
            &["--era", "legacy-silent"],
            "discover_timeout_ms = 300",
        ),
        fixture_server("modern", &["--era", "modern"], ""),
    ]
    .join("\n");
    let gw = start(dir, &servers);
    for (name, era) in [
        ("both", "modern"),
        ("legacy", "legacy"),
        ("silent", "legacy"),
        ("modern", "modern"),
    ] {
        let entry = wait_server(&gw, name, "up", |s| s["state"] == "up");
        assert!(
            entry["era"].as_str().unwrap_or_default().starts_with(era),
            "{name}: {entry}"
        );
        wait_tool(&gw, &format!("{name}__echo"));
        let r = gw
            .connect()
            .tool(&format!("{name}__echo"), json!({"text": name}));
        assert_eq!(text(&r), name, "{r}");
    }
}

#[test]
fn reload_restarts_only_the_servers_whose_configuration_changed() {
    common::deps::ensure(&["python3"]);
    let dir = open_dir();
    let servers = format!(
        "{}\n{}",
        fixture_server("a", &[], "env = { MODE = \"one\" }"),
        fixture_server("b", &[], "")
    );
    let gw = start(dir, &servers);
    wait_tool(&gw, "a__whoami");
    let a = wait_server(&gw, "a", "a pid", |s| s["pid"].is_i64());
    let b = wait_server(&gw, "b", "a pid", |s| s["pid"].is_i64());
    let config = std::fs::read_to_string(&gw.config_path).unwrap();
    std::fs::write(
        &gw.config_path,
        config.replace("MODE = \"one\"", "MODE = \"two\""),
    )
    .unwrap();
    let r = gw.admin(json!({"op": "reload"}));
    assert_eq!(r["ok"], true, "{r}");
    let a2 = wait_server(&gw, "a", "a new pid", |s| {
        s["pid"].is_i64() && s["pid"] != a["pid"]
    });
    assert!(!pid_alive(a["pid"].as_i64().unwrap()) || a2["pid"] != a["pid"]);
    let answer = gw.connect().tool("a__whoami", json!({}));
    let who = tool_json(&answer);
    assert!(
        who["env"]
            .as_array()
            .is_some_and(|e| e.contains(&json!("MODE"))),
        "{answer}\nlog:\n{}",
        gw.log()
    );
    let b2 = wait_server(&gw, "b", "its pid", |s| s["pid"].is_i64());
    assert_eq!(b2["pid"], b["pid"], "an unchanged server keeps running");
    assert_eq!(b2["starts"], 1, "{b2}");
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The npm packages' directory (`scripts/install-test-deps.sh node`).
fn node_modules() -> PathBuf {
    repo().join("target/third-party/node_modules")
}

#[test]
fn the_reference_filesystem_server_lists_and_reads_what_it_was_granted_only() {
    common::deps::ensure(&["node"]);
    let dir = open_dir();
    let granted = dir.path().join("project");
    std::fs::create_dir_all(granted.join("src")).unwrap();
    std::fs::write(granted.join("README.md"), "hello from the project\n").unwrap();
    std::fs::write(dir.path().join("outside.txt"), "not yours\n").unwrap();
    common::give_to_agent(&granted);
    let nm = node_modules();
    let servers = format!(
        r#"[servers.fs]
command = ["{bin}", "{granted}"]
env = {{ PATH = "{nm}/node/bin:/usr/bin:/bin" }}
read_paths = ["{nm}", "{granted}"]
start_timeout_secs = 30
"#,
        bin = nm.join(".bin/mcp-server-filesystem").display(),
        granted = granted.display(),
        nm = nm.display(),
    );
    let gw = start(dir, &servers);
    wait_tool(&gw, "fs__read_text_file");
    let mut c = gw.connect();
    let list = c.tool("fs__list_directory", json!({"path": granted}));
    let listing = text(&list);
    assert!(
        listing.contains("README.md") && listing.contains("src"),
        "{list}"
    );
    let read = c.tool(
        "fs__read_text_file",
        json!({"path": granted.join("README.md")}),
    );
    assert!(text(&read).contains("hello from the project"), "{read}");
    // Outside its directory: refused (by the server, and under it by the kernel).
    let outside = c.tool(
        "fs__read_text_file",
        json!({"path": gw.dir.path().join("outside.txt")}),
    );
    assert!(is_tool_error(&outside), "{outside}");
    assert!(!text(&outside).contains("not yours"), "{outside}");
    // The server allows writing its directory; the walls do not (read_paths only).
    let write = c.tool(
        "fs__write_file",
        json!({"path": granted.join("new.txt"), "content": "x"}),
    );
    assert!(is_tool_error(&write), "{write}");
    assert!(!granted.join("new.txt").exists());
    let entry = wait_server(&gw, "fs", "up", |s| s["state"] == "up");
    assert!(entry["pid"].is_i64(), "{entry}");
}

#[test]
fn the_reference_everything_server_over_stdio() {
    common::deps::ensure(&["node"]);
    let dir = open_dir();
    let nm = node_modules();
    let servers = format!(
        r#"[servers.every]
command = ["{bin}", "stdio"]
env = {{ PATH = "{nm}/node/bin:/usr/bin:/bin" }}
read_paths = ["{nm}"]
start_timeout_secs = 30
pin = "off"
"#,
        bin = nm.join(".bin/mcp-server-everything").display(),
        nm = nm.display(),
    );
    let gw = start(dir, &servers);
    wait_tool(&gw, "every__echo");
    let mut c = gw.connect();
    let r = c.tool(
        "every__echo",
        json!({"message": "from the everything server"}),
    );
    assert!(text(&r).contains("from the everything server"), "{r}");
    let sum = c.tool("every__get-sum", json!({"a": 2, "b": 3}));
    assert!(text(&sum).contains('5'), "{sum}");
    let prompts = c.call("prompts/list", json!({}));
    assert!(
        prompts["result"]["prompts"].as_array().is_some_and(|p| p
            .iter()
            .any(|p| p["name"].as_str().is_some_and(|n| n.starts_with("every__")))),
        "{prompts}"
    );
}

#[test]
fn the_official_python_sdk_server_over_stdio_in_both_eras() {
    common::deps::ensure(&["python"]);
    let dir = open_dir();
    // The SDK's venv may be built on an interpreter the agent user cannot reach (pyenv
    // under /root): the system's Python 3.11 runs it with the venv's packages, as an
    // operator would run it.
    let venv = repo().join("target/mcp-venv");
    let site = venv.join("lib/python3.11/site-packages");
    let table = |name: &str, era: &str| {
        format!(
            r#"[servers.{name}]
command = ["/usr/bin/python3", "{script}", "stdio"]
env = {{ PYTHONPATH = "{site}" }}
read_paths = ["{venv}", "{fixtures}"]
era = "{era}"
start_timeout_secs = 30
"#,
            site = site.display(),
            script = repo().join("tests/fixtures/sdk_server.py").display(),
            venv = venv.display(),
            fixtures = fixtures_dir().display(),
        )
    };
    // The SDK serves the 2026-07-28 era over stdio too (server/discover answers before
    // initialize); its URI is owned by the first one, or neither would serve it.
    let servers = format!(
        "{}discover_timeout_ms = 60000\nowns_resources = [\"sdk://*\"]\n\n{}",
        table("sdk", "auto"),
        table("sdkold", "legacy")
    );
    let gw = start(dir, &servers);
    for name in ["sdk", "sdkold"] {
        wait_tool(&gw, &format!("{name}__add"));
        let mut c = gw.connect();
        let r = c.tool(&format!("{name}__add"), json!({"a": 2, "b": 40}));
        assert!(text(&r).contains("42"), "{name}: {r}");
        let r = c.tool(&format!("{name}__shout"), json!({"text": "quiet"}));
        assert!(text(&r).contains("QUIET"), "{name}: {r}");
    }
    let auto = wait_server(&gw, "sdk", "up", |s| s["state"] == "up");
    let legacy = wait_server(&gw, "sdkold", "up", |s| s["state"] == "up");
    assert!(
        legacy["era"]
            .as_str()
            .unwrap_or_default()
            .starts_with("legacy"),
        "{legacy}"
    );
    assert!(
        auto["era"]
            .as_str()
            .unwrap_or_default()
            .starts_with("modern"),
        "{auto}"
    );
    // Tools are listed first; the resources listing may land a moment later (a full run
    // under load read the resource before it did).
    wait_listed(&gw, "resources/list", "resources", "uri", "sdk://greeting");
    let read = gw
        .connect()
        .call("resources/read", json!({"uri": "sdk://greeting"}));
    assert!(read.to_string().contains("hello from the SDK"), "{read}");
}

/// The names `tools/list` shows.
fn tool_names(gw: &TestGateway) -> Vec<String> {
    let list = gw.connect().call("tools/list", json!({}));
    list["result"]["tools"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|t| t["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Wait until `pid` is gone (reaped or a zombie).
fn wait_dead(gw: &TestGateway, pid: i64, what: &str) {
    let deadline = Instant::now() + PATIENCE;
    while pid_alive(pid) {
        if Instant::now() > deadline {
            panic!("{what} (pid {pid}) still runs\nlog:\n{}", gw.log());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An operator who takes a (compromised) server out of the config and reloads has
/// revoked it: its program and everything it started are stopped, its secret with them,
/// and its tools, resources and prompts are gone; a server added by a reload starts.
/// (Before this, the removed program kept running and answering, and the reload only
/// warned that a restart was needed.)
#[test]
fn a_reload_stops_a_removed_server_and_starts_an_added_one() {
    common::deps::ensure(&["python3"]);
    let dir = open_dir();
    let keep = fixture_server("keep", &[], "");
    let gone = fixture_server("gone", &[], "");
    let gw = start(dir, &format!("{keep}\n{gone}"));
    wait_tool(&gw, "gone__echo");
    wait_tool(&gw, "keep__echo");
    let kept = wait_server(&gw, "keep", "a pid", |s| s["pid"].is_i64());
    let before = wait_server(&gw, "gone", "a pid", |s| s["pid"].is_i64());
    let program = before["pid"].as_i64().unwrap();
    // A process that leaves the group and ignores SIGTERM goes with it.
    let who = tool_json(&gw.connect().tool("gone__whoami", json!({})));
    let pidfile = PathBuf::from(who["home"].as_str().unwrap()).join("left.pid");
    let left = tool_json(
        &gw.connect()
            .tool("gone__leave_behind", json!({"pidfile": pidfile})),
    );
    let left = left["pid"].as_i64().unwrap();
    assert!(left > 0 && pid_alive(left), "{left}");

    let config = std::fs::read_to_string(&gw.config_path).unwrap();
    // Another command line than `gone`'s: the same one would be held as `gone` renamed.
    let added = fixture_server("added", &["--era", "both"], "");
    std::fs::write(&gw.config_path, config.replace(&gone, &added)).unwrap();
    let r = gw.admin(json!({"op": "reload"}));
    assert_eq!(r["ok"], true, "{r}");
    let message = r["message"].as_str().unwrap_or_default();
    assert!(message.contains("servers removed: gone"), "{r}");
    assert!(message.contains("servers started: added"), "{r}");

    wait_dead(&gw, program, "the removed server's program");
    wait_dead(&gw, left, "the process it left behind");
    let names = tool_names(&gw);
    assert!(!names.iter().any(|n| n.starts_with("gone__")), "{names:?}");
    let call = gw
        .connect()
        .tool("gone__echo", json!({"text": "still there?"}));
    assert!(
        call.get("error").is_some() || is_tool_error(&call),
        "a removed server's tool still answers: {call}"
    );
    assert_ne!(text(&call), "still there?", "{call}");
    let status = gw.admin(json!({"op": "status"}));
    assert!(
        !status["servers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["server"] == "gone"),
        "{status:#}"
    );
    assert!(
        !status.to_string().contains("server:gone"),
        "its worker is forgotten: {status:#}"
    );

    wait_tool(&gw, "added__echo");
    let echoed = gw
        .connect()
        .tool("added__echo", json!({"text": "hello from a new server"}));
    assert_eq!(text(&echoed), "hello from a new server", "{echoed}");
    let still = wait_server(&gw, "keep", "its pid", |s| s["pid"].is_i64());
    assert_eq!(
        still["pid"], kept["pid"],
        "an untouched server keeps running"
    );
}

/// A server that never answers its handshake holds no one: the gateway is ready and
/// serves the other tools while it starts (before this, READY waited for its
/// `start_timeout_secs` and the first builtin call for the 20 s start grace); it shows
/// as starting in `status`, with no tools, and the other local server's tools appear as
/// soon as it has listed them.
#[test]
fn a_server_that_hangs_at_start_blocks_no_one() {
    common::deps::ensure(&["python3"]);
    let dir = open_dir();
    let servers = format!(
        "{}\n{}",
        fixture_server("hung", &["--hang"], "start_timeout_secs = 3600"),
        fixture_server("fine", &[], "")
    );
    // Waits for `info: ready` (PATIENCE), far less than the hung server's start timeout.
    let gw = start(dir, &servers);
    let echoed = gw
        .connect()
        .tool("local__echo", json!({"text": "served meanwhile"}));
    assert!(text(&echoed).contains("served meanwhile"), "{echoed}");
    wait_tool(&gw, "fine__echo");
    let hung = wait_server(&gw, "hung", "its start", |s| !s.is_null());
    assert!(
        matches!(
            hung["state"].as_str(),
            Some("starting" | "connecting" | "down")
        ),
        "{hung:#}"
    );
    assert_eq!(hung["tools"], 0, "{hung:#}");
    let status = gw.admin(json!({"op": "status"}));
    assert_eq!(status["ready"], true, "{status:#}");
    assert!(
        !tool_names(&gw).iter().any(|n| n.starts_with("hung__")),
        "{status:#}"
    );
}

/// Another server of the same uid can chmod a server's state directory open (Landlock
/// does not cover chmod): the next start of the program closes it again, and a file
/// another uid planted there stops the start, named in status. (Before this, the
/// directory stayed 0777 across program restarts and the planted file ran.)
#[test]
fn a_state_dir_opened_by_another_server_is_closed_at_the_next_start() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    common::deps::ensure(&["python3"]);
    let dir = open_dir();
    let gw = start(dir, &fixture_server("victim", &[], ""));
    wait_tool(&gw, "victim__crash");
    let first = wait_server(&gw, "victim", "a pid", |s| s["pid"].is_i64());
    let who = tool_json(&gw.connect().tool("victim__whoami", json!({})));
    let home = PathBuf::from(who["home"].as_str().unwrap());
    // What a server of the same uid can do.
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o777)).unwrap();
    let _ = gw.connect().tool("victim__crash", json!({"code": 3}));
    let again = wait_server(&gw, "victim", "up with a new pid", |s| {
        s["pid"].is_i64() && s["pid"] != first["pid"] && s["state"] == "up"
    });
    assert!(again["pid"].is_i64());
    let mode = std::fs::metadata(&home).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o700, "the state directory stays open");
    // A local user wrote into it while it was open.
    let planted = home.join("planted.py");
    std::fs::write(&planted, "print('pwned')").unwrap();
    std::os::unix::fs::lchown(&planted, Some(65534), Some(65534)).unwrap();
    let _ = gw.connect().tool("victim__crash", json!({"code": 3}));
    let refused = wait_server(&gw, "victim", "its refusal", |s| {
        s["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("planted.py"))
    });
    assert!(
        refused["last_error"].as_str().unwrap().contains("65534"),
        "{refused:#}"
    );
}

/// A line of /proc/PID/status, in KiB (VmRSS, VmHWM).
fn vm_kib(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn start_with_settings(dir: tempfile::TempDir, settings: &str, servers: &str) -> TestGateway {
    let settings = format!(
        "[servers]\nstate_dir = \"{}/servers\"\nretry_max_secs = 2\n{settings}\n",
        dir.path().display()
    );
    let config = base_config(dir.path(), &format!("{settings}\n{servers}"));
    TestGateway::start_with(dir, &config)
}

#[test]
fn messages_of_tiny_values_are_judged_by_their_bytes_before_any_tree_is_built() {
    common::deps::ensure(&["python3"]);
    let dir = open_dir();
    let gw = start(dir, &fixture_server("fx", &[], "timeout_secs = 60"));
    wait_tool(&gw, "fx__tiny_values");
    let mut c = gw.connect();
    let hwm_before = vm_kib(gw.pid(), "VmHWM");
    // Lines of 7.8 MB made of {"a":1} (below servers.max_body_bytes, far beyond
    // relay.max_message_bytes): dropped from their envelope, never parsed.
    let r = c.tool("fx__tiny_values", json!({"lines": 2, "count": 780000}));
    assert!(
        !is_tool_error(&r),
        "{}",
        &r.to_string()[..300.min(r.to_string().len())]
    );
    // An answer of 200,000 blocks (5.6 MB, beyond gateway.max_answer_bytes): too_large,
    // refused before it is parsed.
    for _ in 0..3 {
        let r = c.tool("fx__many_blocks", json!({"count": 200000}));
        assert!(
            is_tool_error(&r),
            "{}",
            &r.to_string()[..300.min(r.to_string().len())]
        );
        let m = error_message(&r);
        assert!(m.contains("gateway.max_answer_bytes"), "{m}");
    }
    let hwm_answers = vm_kib(gw.pid(), "VmHWM");
    eprintln!(
        "gateway VmHWM: {hwm_before} KiB before, {hwm_answers} KiB after the floods and big answers"
    );
    // Under max_answer_bytes but beyond gateway.max_json_nodes (30,000 blocks of 5 nodes).
    let r = c.tool("fx__many_blocks", json!({"count": 30000}));
    assert!(
        is_tool_error(&r),
        "{}",
        &r.to_string()[..300.min(r.to_string().len())]
    );
    let m = error_message(&r);
    assert!(m.contains("gateway.max_json_nodes"), "{m}");
    let hwm_after = vm_kib(gw.pid(), "VmHWM");
    eprintln!(
        "gateway VmHWM: {hwm_before} KiB before, {hwm_after} KiB after (growth {} KiB)",
        hwm_after.saturating_sub(hwm_before)
    );
    // Before the bounds, these messages took the gateway from ~15 MiB to ~590 MiB.
    assert!(
        hwm_after.saturating_sub(hwm_before) < 64 * 1024,
        "gateway peak grew by {} KiB",
        hwm_after.saturating_sub(hwm_before)
    );
    // The rows say why.
    let rows = gw.wait_rows("the refused answers", |rows| {
        rows.iter()
            .filter(|r| {
                r["error_message"]
                    .as_str()
                    .is_some_and(|m| m.contains("gateway.max_answer_bytes"))
            })
            .count()
            >= 3
    });
    assert!(rows.iter().any(|r| {
        r["error_message"]
            .as_str()
            .is_some_and(|m| m.contains("gateway.max_json_nodes"))
    }));
    let r = c.tool("fx__echo", json!({"text": "still here"}));
    assert_eq!(text(&r), "still here", "{r}");
}

#[test]
fn calls_beyond_max_queued_bytes_are_refused_at_once_naming_the_key() {
    common::deps::ensure(&["python3"]);
    let dir = open_dir();
    let gw = start_with_settings(
        dir,
        "max_queued_bytes = 2000000",
        &fixture_server("fx", &[], "timeout_secs = 5\nstop_grace_ms = 200"),
    );
    wait_tool(&gw, "fx__stop_reading");
    let mut c = gw.connect();
    let r = c.tool("fx__stop_reading", json!({}));
    assert!(!is_tool_error(&r), "{r}");
    let hwm_before = vm_kib(gw.pid(), "VmHWM");
    let big = "x".repeat(600_000);
    let mut sids = Vec::new();
    for i in 0..10 {
        sids.push(c.request(
            json!(100 + i),
            "tools/call",
            Some(json!({"name": "fx__echo", "arguments": {"text": big}})),
        ));
    }
    // Three fit (1.8 MB); the others are refused at once, while the three still wait for
    // a server that does not read.
    let mut refused = 0;
    let mut others = 0;
    while refused + others < 10 {
        let reply = c.recv().expect("an answer");
        if !sids.contains(&reply.stream) {
            continue;
        }
        let m = error_message(&reply.body);
        if m.contains("servers.max_queued_bytes") {
            assert_eq!(others, 0, "refusals come before the waiting calls end: {m}");
            refused += 1;
        } else {
            others += 1;
        }
    }
    let hwm_after = vm_kib(gw.pid(), "VmHWM");
    eprintln!(
        "max_queued_bytes: {refused} refused, {others} waited; gateway VmHWM {hwm_before} -> {hwm_after} KiB"
    );
    assert_eq!(refused, 7, "7 of 10 calls of 600 kB beyond 2 MB in flight");
    let rows = gw.wait_rows("the refusals", |rows| {
        rows.iter()
            .filter(|r| {
                r["error_message"]
                    .as_str()
                    .is_some_and(|m| m.contains("servers.max_queued_bytes"))
            })
            .count()
            == 7
    });
    assert!(!rows.is_empty());
    // The bytes are given back: once the program is back, a call goes through.
    wait_server(&gw, "fx", "a restart", |s| {
        s["state"] == "up" && s["starts"].as_u64() >= Some(2)
    });
    let r = c.tool("fx__echo", json!({"text": big}));
    assert_eq!(text(&r).len(), big.len());
}

#[test]
fn notifications_dropped_anywhere_are_counted_in_the_calls_row() {
    common::deps::ensure(&["python3"]);
    let dir = open_dir();
    let gw = start(dir, &fixture_server("fx", &[], "timeout_secs = 60"));
    wait_tool(&gw, "fx__notice_flood");
    let mut c = gw.connect();
    let sid = c.request(
        json!(7),
        "tools/call",
        Some(
            json!({"name": "fx__notice_flood", "arguments": {"count": 20000},
                    "_meta": {"progressToken": "p-1"}}),
        ),
    );
    let mut relayed = 0u64;
    loop {
        let reply = c.recv().expect("the call's answer");
        if reply.body.get("method").is_some() {
            relayed += 1;
            continue;
        }
        if reply.stream != sid {
            continue;
        }
        assert!(!is_tool_error(&reply.body), "{}", reply.body);
        break;
    }
    let deadline = Instant::now() + PATIENCE;
    let summary = loop {
        let s = gw.events("relay_summary");
        if let Some(last) = s.last() {
            break last.clone();
        }
        assert!(Instant::now() < deadline, "no relay_summary");
        std::thread::sleep(Duration::from_millis(50));
    };
    let detail: Value = summary["detail"]
        .as_str()
        .and_then(|d| serde_json::from_str(d).ok())
        .unwrap_or_else(|| summary["detail"].clone());
    eprintln!("agent got {relayed} notifications; the row: {detail}");
    let dropped = detail["dropped"].as_u64().unwrap_or(0);
    // 40,000 sent (20,000 progress, 20,000 log messages): what did not reach the agent
    // was dropped, and the row counts it (it said 0 before).
    assert!(dropped >= 10_000, "dropped: {detail}");
}

/// With `network = [ports]`, Landlock governs TCP only: a UDP socket could send anywhere.
/// The server's seccomp filter refuses IP datagram sockets however the type is spelled
/// (flag bits set, IPv6), the program's resolver is told to use TCP, and TCP still
/// reaches its granted port and no other.
#[test]
fn with_network_ports_udp_is_refused_by_the_kernel_and_tcp_reaches_only_its_ports() {
    common::deps::ensure(&["python3"]);
    let dir = open_dir();
    let open_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let granted = open_port.local_addr().unwrap().port();
    let other_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let ungranted = other_port.local_addr().unwrap().port();
    // Where a datagram would land: granted as a TCP port too, so only UDP's wall is tried.
    let udp = std::net::UdpSocket::bind(("127.0.0.1", granted)).unwrap();
    udp.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let servers = fixture_server("net", &[], &format!("network = [{granted}]"));
    let gw = start(dir, &servers);
    wait_tool(&gw, "net__send_udp");
    let mut c = gw.connect();
    for how in ["plain", "flags", "inet6"] {
        let r = c.tool("net__send_udp", json!({"port": granted, "how": how}));
        let errno = refused(&r, &format!("a UDP datagram ({how})"));
        assert_eq!(errno, "EPERM", "seccomp refuses it: {r}");
    }
    let mut buf = [0u8; 64];
    assert!(
        udp.recv_from(&mut buf).is_err(),
        "a datagram arrived: {:?}",
        String::from_utf8_lossy(&buf)
    );
    let r = tool_json(&c.tool("net__connect_tcp", json!({"port": granted})));
    assert_eq!(r["ok"], true, "the granted port: {r}");
    refused(
        &c.tool("net__connect_tcp", json!({"port": ungranted})),
        "an ungranted port",
    );
    // The resolver is told to use TCP.
    let sha = {
        use sha2::Digest;
        hex(&sha2::Sha256::digest(b"use-vc"))
    };
    let env = tool_json(&c.tool(
        "net__env_check",
        json!({"name": "RES_OPTIONS", "sha256": sha}),
    ));
    assert_eq!(env["matches"], true, "{env}");
    // The host proved it before it got work, and status says so.
    let text = String::from_utf8_lossy(&gw.cli(&["status", "net"]).stdout).into_owned();
    let probe = text
        .lines()
        .find(|l| l.contains("udp_socket"))
        .unwrap_or_else(|| panic!("no udp_socket probe in status:\n{text}"));
    assert!(probe.contains("denied"), "{probe}");
    drop(open_port);
    drop(other_port);
}

/// Each local server runs in a cgroup of its own where cgroups are in force: its memory
/// and processes are bounded there, `toolwall status NAME` shows it, and on stop every
/// process in it dies, one that left its process group and session included. Where they
/// are not in force (no delegated cgroup v2), status says so and the rest is skipped, as
/// for workspaces (`walls::a_fork_bomb_and_a_memory_hog_stop_at_their_cgroup`); the
/// process that outlives a stop is then the leader's to end
/// (`a_hostile_server_is_refused_by_the_kernel_and_leaves_nothing_behind`).
#[test]
fn a_local_server_runs_in_a_cgroup_of_its_own_and_all_of_it_dies_at_stop() {
    common::deps::ensure(&["python3"]);
    let dir = open_dir();
    let servers = fixture_server("cg", &[], "pids_max = 64\nmemory_max_bytes = 134217728");
    let mut gw = start(dir, &servers);
    wait_tool(&gw, "cg__memory_hog");
    let status = gw.admin(json!({"op": "status", "server": "cg"}));
    let cgroup = status["cgroup"].clone();
    let shown = String::from_utf8_lossy(&gw.cli(&["status", "cg"]).stdout).into_owned();
    if cgroup["in_force"] != true {
        assert_eq!(cgroup["in_force"], false, "{status:#}");
        assert!(shown.contains("cgroup: none ("), "{shown}");
        eprintln!(
            "\n\n*** SKIPPED: cgroup limits are not in force here ({}). The local server cgroup test needs a delegated cgroup v2 (systemd Delegate=yes with the pids and memory controllers). ***\n\n",
            cgroup["reason"]
        );
        return;
    }
    let path = PathBuf::from(cgroup["path"].as_str().unwrap());
    assert!(path.ends_with("servers/cg"), "{cgroup}");
    assert_eq!(cgroup["pids.max"], "64", "{cgroup}");
    assert_eq!(cgroup["memory.max"], "134217728", "{cgroup}");
    assert!(shown.contains("servers/cg"), "{shown}");
    let mut c = gw.connect();
    // 512 MiB against a 128 MiB cgroup: the hog is killed, the server lives on.
    let hog = tool_json(&c.tool("cg__memory_hog", json!({"bytes": 512u64 << 20})));
    assert_eq!(hog["exit"], -9, "the hog was not held: {hog}");
    let r = c.tool("cg__echo", json!({"text": "alive"}));
    assert_eq!(text(&r), "alive", "{r}");
    // A process in a new session that ignores SIGTERM: in the cgroup, and gone at stop.
    let who = tool_json(&c.tool("cg__whoami", json!({})));
    let home = PathBuf::from(who["home"].as_str().unwrap());
    let left = tool_json(&c.tool(
        "cg__leave_behind",
        json!({"pidfile": home.join("tmp/left.pid")}),
    ));
    let pid = left["pid"].as_i64().unwrap_or(0);
    assert!(pid > 0 && pid_alive(pid), "{left}");
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    assert!(own.contains("/servers/cg"), "{own}");
    gw.terminate();
    let deadline = Instant::now() + PATIENCE;
    while pid_alive(pid) {
        assert!(Instant::now() < deadline, "{pid} outlived the stop");
        std::thread::sleep(Duration::from_millis(50));
    }
    let events = std::fs::read_to_string(path.join("cgroup.events")).unwrap_or_default();
    assert!(!events.contains("populated 1"), "{events}");
}

/// Walls are set when a worker starts: a reload that gives a local server a secret file the
/// running workers were not started to hide is refused whole (before, the restarted server
/// read it while every running server could read it too, and the reload said "restart").
/// The server keeps running with its old configuration; a restart takes the new secret.
#[test]
fn a_reload_naming_a_new_secret_file_is_refused_until_a_restart() {
    use std::os::unix::fs::PermissionsExt;
    common::deps::ensure(&["python3"]);
    let dir = open_dir();
    let file = dir.path().join("late.token");
    std::fs::write(&file, "tw-late-secret\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let plain = fixture_server("fx", &[], "");
    let gw = start(dir, &plain);
    wait_tool(&gw, "fx__echo");
    let before = wait_server(&gw, "fx", "a pid", |s| s["pid"].is_i64());
    let with_secret = fixture_server(
        "fx",
        &[],
        &format!("secret_env = {{ API_TOKEN = \"{}\" }}", file.display()),
    );
    let config = std::fs::read_to_string(&gw.config_path).unwrap();
    std::fs::write(&gw.config_path, config.replace(&plain, &with_secret)).unwrap();
    let r = gw.admin(json!({"op": "reload"}));
    assert_ne!(r["ok"], true, "the reload is refused: {r}");
    let said = r.to_string();
    assert!(
        said.contains("secret_env:fx:API_TOKEN") && said.contains("restart toolwall"),
        "{r}"
    );
    let after = wait_server(&gw, "fx", "a pid", |s| s["pid"].is_i64());
    assert_eq!(after["pid"], before["pid"], "the server was not restarted");
    let echoed = gw.connect().tool("fx__echo", json!({"text": "still old"}));
    assert_eq!(text(&echoed), "still old", "{echoed}");
}

/// Calls in flight together on one local server, answered out of their order: whichever
/// thread reads the program's stdout (a waiting call's own, or the reader thread), every
/// answer reaches its own call, a slow call never holds a quick one, and progress with a
/// call's token stays that call's.
#[test]
fn calls_in_flight_together_each_get_their_own_answer() {
    common::deps::ensure(&["python3"]);
    let dir = open_dir();
    let gw = start(dir, &fixture_server("fx", &[], "timeout_secs = 30"));
    wait_tool(&gw, "fx__echo");
    std::thread::scope(|s| {
        let gw = &gw;
        let mut threads = Vec::new();
        for t in 0..5u64 {
            threads.push(s.spawn(move || {
                let mut c = gw.connect();
                for round in 0..6u64 {
                    match (t + round) % 3 {
                        0 => {
                            // Slow, answered after the quick calls of the others.
                            let secs = 0.05 * ((t + round) % 4 + 1) as f64;
                            let r = c.tool("fx__sleep", json!({"secs": secs}));
                            assert_eq!(tool_json(&r)["slept"], json!(secs), "{r}");
                        }
                        1 => {
                            // Its progress comes to it alone, ahead of its answer.
                            let token = format!("t{t}r{round}");
                            let id = json!(1000 + round);
                            c.request(
                                id.clone(),
                                "tools/call",
                                Some(json!({"name": "fx__notice_flood",
                                            "arguments": {"count": 20},
                                            "_meta": {"progressToken": token}})),
                            );
                            let mut progress = 0;
                            let answer = loop {
                                let reply = c.recv().expect("notice_flood's answer");
                                let body = reply.body;
                                if body["id"] == id {
                                    break body;
                                }
                                if body["method"] == "notifications/progress" {
                                    assert_eq!(body["params"]["progressToken"], json!(token));
                                    progress += 1;
                                }
                            };
                            assert_eq!(tool_json(&answer)["sent"], 20, "{answer}");
                            assert_eq!(
                                progress, 20,
                                "every progress of the call, before its answer"
                            );
                        }
                        _ => {
                            let want = format!("thread {t} round {round}");
                            let r = c.tool("fx__echo", json!({"text": want}));
                            assert_eq!(text(&r), want, "{r}");
                        }
                    }
                }
            }));
        }
        for th in threads {
            th.join().expect("a caller's thread");
        }
    });
    // The program serves on, one call at a time.
    let mut c = gw.connect();
    let r = c.tool("fx__echo", json!({"text": "after"}));
    assert_eq!(text(&r), "after", "{r}");
}
