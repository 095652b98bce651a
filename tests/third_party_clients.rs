//! Third-party MCP clients against the real gateway: the official conformance suite on the
//! HTTP door, the MCP Inspector CLI and the official Python SDK over HTTP (with a token)
//! and over `toolwall stdio`. Versions are pinned in scripts/versions.env (and, for the
//! Python SDK's whole dependency tree, tests/fixtures/sdk-requirements.txt); the npm tools
//! are installed into target/third-party and the SDK into the venv target/mcp-venv by
//! scripts/install-test-deps.sh, which these tests run themselves (it returns at once when
//! everything is in place).

mod common;

use common::http::HttpGateway;
use common::{BIN, wait_timeout};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Scenarios that must pass; the baseline may list only their untestable checks.
const REQUIRED_SCENARIOS: &[&str] = &[
    "server-initialize",
    "ping",
    "tools-list",
    "http-header-validation",
    "dns-rebinding-protection",
    "server-stateless",
    "server-session-lifecycle",
    "caching",
];

/// How long one third-party command may run before the test gives up on it.
const TOOL_PATIENCE: Duration = Duration::from_secs(300);

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn third_party() -> PathBuf {
    repo().join("target/third-party")
}

fn node_bin() -> PathBuf {
    third_party().join("node_modules/.bin")
}

/// `scripts/versions.env` as a map.
fn pins() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(repo().join("scripts/versions.env")).expect("versions.env");
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

/// Install (or confirm) the pinned tools, once per test process.
fn ensure_installed() {
    common::deps::ensure(&["node", "python"]);
}

/// A command with Node 22 first on PATH and a private HOME (the Inspector keeps a catalog
/// there).
fn node_command(program: &str, home: &Path) -> Command {
    let path = format!(
        "{}:{}",
        node_bin().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new(node_bin().join(program));
    cmd.env("PATH", path).env("HOME", home).stdin(Stdio::null());
    cmd
}

struct Ran {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// Run `cmd` to the end (killed after TOOL_PATIENCE), capturing both streams.
fn run(mut cmd: Command) -> Ran {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let mut out_pipe = child.stdout.take().unwrap();
    let mut err_pipe = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out_pipe.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err_pipe.read_to_string(&mut s);
        s
    });
    let status = match wait_timeout(&mut child, TOOL_PATIENCE) {
        Some(s) => s,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not finish in {TOOL_PATIENCE:?}");
        }
    };
    Ran {
        ok: status.success(),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// The JSON document a CLI printed on stdout (ignoring lines around it).
fn json_of(stdout: &str) -> Value {
    if let Ok(v) = serde_json::from_str(stdout.trim()) {
        return v;
    }
    let start = stdout.find(['{', '[']).unwrap_or(0);
    serde_json::from_str(stdout[start..].trim())
        .unwrap_or_else(|e| panic!("no JSON on stdout ({e}):\n{stdout}"))
}

fn tool_names(list: &Value) -> Vec<String> {
    list["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools in {list}"))
        .iter()
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect()
}

/// A config for `toolwall stdio` in `dir` (its own ledger and admin socket).
fn stdio_config(dir: &Path) -> PathBuf {
    let path = dir.join("stdio.toml");
    std::fs::write(
        &path,
        format!(
            "[ledger]\npath = \"{d}/stdio/ledger.db\"\n\n[admin]\nsocket = \"{d}/stdio/admin.sock\"\n",
            d = dir.display()
        ),
    )
    .unwrap();
    path
}

/// tool_calls rows of the ledger at `path`.
fn ledger_rows(path: &Path) -> Vec<Value> {
    let conn =
        rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .expect("open ledger");
    common::query_json(&conn, "SELECT * FROM tool_calls ORDER BY id")
}

// ---------------------------------------------------------------- conformance suite

/// One line of tests/conformance-baseline.txt.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct BaselineEntry {
    scenario: String,
    /// None: every failing check of the scenario.
    check: Option<String>,
    reason: String,
}

fn parse_baseline(text: &str) -> Result<Vec<BaselineEntry>, String> {
    let mut entries = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (key, reason) = line
            .split_once(char::is_whitespace)
            .ok_or_else(|| format!("baseline line {}: no reason given: {line}", n + 1))?;
        let (scenario, check) = match key.split_once('/') {
            Some((s, c)) => (s.to_owned(), Some(c.to_owned())),
            None => (key.to_owned(), None),
        };
        let entry = BaselineEntry {
            scenario,
            check,
            reason: reason.trim().to_owned(),
        };
        if entries.contains(&entry) {
            return Err(format!("baseline line {}: repeated: {line}", n + 1));
        }
        entries.push(entry);
    }
    Ok(entries)
}

/// One failing check of a run.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Failure {
    scenario: String,
    check: String,
    /// The suite says it could not exercise the check (a fixture of its own is missing).
    untestable: bool,
    message: String,
}

/// Results of a run: scenario → its checks (id, status, untestable, message).
type Results = BTreeMap<String, Vec<(String, String, bool, String)>>;

/// Statuses that are not failures: the suite itself counts only FAILURE (and errors).
const NOT_FAILED: &[&str] = &["SUCCESS", "SKIPPED", "WARNING", "INFO"];

/// What is wrong with a run compared to the baseline; empty when it matches.
fn compare(results: &Results, baseline: &[BaselineEntry]) -> Vec<String> {
    let mut problems = Vec::new();
    let failures: BTreeSet<Failure> = results
        .iter()
        .flat_map(|(scenario, checks)| {
            checks
                .iter()
                .filter(|(_, status, _, _)| !NOT_FAILED.contains(&status.as_str()))
                .map(|(check, _, untestable, message)| Failure {
                    scenario: scenario.clone(),
                    check: check.clone(),
                    untestable: *untestable,
                    message: message.clone(),
                })
        })
        .collect();
    let covers = |e: &BaselineEntry, f: &Failure| {
        e.scenario == f.scenario && e.check.as_ref().is_none_or(|c| *c == f.check)
    };
    for required in REQUIRED_SCENARIOS {
        if !results.contains_key(*required) {
            problems.push(format!("required scenario {required} did not run"));
        }
    }
    for f in &failures {
        match baseline.iter().find(|e| covers(e, f)) {
            None => problems.push(format!(
                "NEW FAILURE {}/{}: {}",
                f.scenario, f.check, f.message
            )),
            Some(_) if REQUIRED_SCENARIOS.contains(&f.scenario.as_str()) && !f.untestable => {
                problems.push(format!(
                    "required scenario {} failed {}: {} (only checks the suite reports \
                     untestable may be baselined there)",
                    f.scenario, f.check, f.message
                ))
            }
            Some(_) => {}
        }
    }
    for e in baseline {
        let key = match &e.check {
            Some(c) => format!("{}/{c}", e.scenario),
            None => e.scenario.clone(),
        };
        if REQUIRED_SCENARIOS.contains(&e.scenario.as_str()) && e.check.is_none() {
            problems.push(format!(
                "baseline lists the required scenario {key} whole; list single checks"
            ));
        }
        if !failures.iter().any(|f| covers(e, f)) {
            problems.push(format!(
                "baseline entry {key} covers no failure (it passes now, or did not run): \
                 remove it ({})",
                e.reason
            ));
        }
    }
    problems
}

/// Read the suite's output directory: one `server-SCENARIO-TIMESTAMP/checks.json` per
/// scenario.
fn read_results(dir: &Path) -> Results {
    let stamp = regex::Regex::new(r"^server-(.+)-\d{4}-\d{2}-\d{2}T[0-9-]+Z$").unwrap();
    let mut results = Results::new();
    for entry in std::fs::read_dir(dir).expect("conformance output dir") {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(caps) = stamp.captures(&name) else {
            continue;
        };
        let scenario = caps[1].to_owned();
        let text = std::fs::read_to_string(entry.path().join("checks.json"))
            .unwrap_or_else(|e| panic!("{name}/checks.json: {e}"));
        let checks: Vec<Value> = serde_json::from_str(&text).expect("checks.json is JSON");
        let list = checks
            .iter()
            .map(|c| {
                (
                    c["id"].as_str().unwrap_or("?").to_owned(),
                    c["status"].as_str().unwrap_or("?").to_owned(),
                    c["details"]["untestable"] == true,
                    c["errorMessage"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect();
        assert!(
            results.insert(scenario.clone(), list).is_none(),
            "{scenario} ran twice"
        );
    }
    results
}

#[test]
fn conformance_suite_matches_the_baseline() {
    ensure_installed();
    let gw = HttpGateway::start(
        "http_auth = \"none\"\npublic_url = \"http://127.0.0.1:{port}/mcp\"",
        "",
    );
    let url = format!("http://127.0.0.1:{}/mcp", gw.port);
    let out_dir = gw.dir.path().join("conformance");
    let mut cmd = node_command("conformance", gw.dir.path());
    cmd.args(["server", "--url", &url, "--suite", "all", "-o"])
        .arg(&out_dir);
    let ran = run(cmd);
    let summary = ran
        .stdout
        .lines()
        .skip_while(|l| !l.contains("SUMMARY"))
        .collect::<Vec<_>>()
        .join("\n");
    eprintln!(
        "conformance {} against {url}:\n{summary}",
        pins()["CONFORMANCE_VERSION"]
    );
    let results = read_results(&out_dir);
    assert!(
        results.len() >= REQUIRED_SCENARIOS.len(),
        "the suite ran {} scenarios; stdout:\n{}\nstderr:\n{}",
        results.len(),
        ran.stdout,
        ran.stderr
    );
    let baseline_text =
        std::fs::read_to_string(repo().join("tests/conformance-baseline.txt")).unwrap();
    let baseline = parse_baseline(&baseline_text).unwrap_or_else(|e| panic!("{e}"));
    let problems = compare(&results, &baseline);
    assert!(
        problems.is_empty(),
        "conformance results differ from tests/conformance-baseline.txt:\n  {}\n\nsummary:\n{summary}",
        problems.join("\n  ")
    );
    for required in REQUIRED_SCENARIOS {
        let passed = results[*required]
            .iter()
            .filter(|(_, s, _, _)| s == "SUCCESS")
            .count();
        assert!(passed > 0, "{required} passed no check");
    }
    // The suite's requests reached the gateway and were recorded (no tool calls: the
    // suite's tools do not exist here, and an unknown tool is no call).
    assert!(!gw.events("initialize").is_empty());
}

#[test]
fn baseline_comparison_flags_new_failures_and_stale_entries() {
    let check = |id: &str, status: &str, untestable: bool| {
        (
            id.to_owned(),
            status.to_owned(),
            untestable,
            format!("{id} says no"),
        )
    };
    let mut results = Results::new();
    for s in REQUIRED_SCENARIOS {
        results.insert(s.to_string(), vec![check("ok", "SUCCESS", false)]);
    }
    results.insert(
        "server-stateless".into(),
        vec![check("a", "SUCCESS", false), check("b", "FAILURE", true)],
    );
    results.insert("tools-call-x".into(), vec![check("c", "FAILURE", false)]);
    results.insert("warned".into(), vec![check("w", "WARNING", false)]);
    let baseline = parse_baseline(
        "# comment\nserver-stateless/b untestable here\ntools-call-x needs a fixture\n",
    )
    .unwrap();
    assert_eq!(compare(&results, &baseline), Vec::<String>::new());

    // A new failure.
    let mut worse = results.clone();
    worse
        .get_mut("warned")
        .unwrap()
        .push(check("n", "FAILURE", false));
    let problems = compare(&worse, &baseline);
    assert!(
        problems.len() == 1 && problems[0].contains("NEW FAILURE warned/n"),
        "{problems:?}"
    );

    // A baseline entry that now passes.
    let mut better = results.clone();
    better.insert("tools-call-x".into(), vec![check("c", "SUCCESS", false)]);
    let problems = compare(&better, &baseline);
    assert!(
        problems.len() == 1 && problems[0].contains("tools-call-x"),
        "{problems:?}"
    );

    // A required scenario may not hide a real failure behind the baseline.
    let mut real = results.clone();
    real.insert(
        "server-stateless".into(),
        vec![check("b", "FAILURE", false)],
    );
    let problems = compare(&real, &baseline);
    assert!(
        problems
            .iter()
            .any(|p| p.contains("required scenario server-stateless")),
        "{problems:?}"
    );
    let whole = parse_baseline("server-stateless everything\ntools-call-x f\n").unwrap();
    assert!(
        compare(&results, &whole)
            .iter()
            .any(|p| p.contains("whole"))
    );

    // A required scenario that did not run.
    let mut missing = results.clone();
    missing.remove("ping");
    assert!(
        compare(&missing, &baseline)
            .iter()
            .any(|p| p.contains("ping did not run"))
    );

    assert!(parse_baseline("no-reason\n").is_err());
    assert!(parse_baseline("a b\na b\n").is_err());
}

// ---------------------------------------------------------------- MCP Inspector CLI

#[test]
fn inspector_cli_lists_and_calls_over_http_with_a_token() {
    ensure_installed();
    let gw = HttpGateway::start("", "");
    let token = gw.client_token("inspector");
    let url = format!("http://127.0.0.1:{}/mcp", gw.port);
    let home = gw.dir.path();
    let auth = format!("Authorization: Bearer {token}");

    let mut list = node_command("mcp-inspector", home);
    list.args(["--cli", &url, "--header", &auth, "--method", "tools/list"]);
    let ran = run(list);
    assert!(ran.ok, "tools/list failed:\n{}\n{}", ran.stdout, ran.stderr);
    let names = tool_names(&json_of(&ran.stdout));
    assert!(names.contains(&"local__echo".to_owned()), "{names:?}");

    let mut call = node_command("mcp-inspector", home);
    call.args([
        "--cli",
        &url,
        "--header",
        &auth,
        "--method",
        "tools/call",
        "--tool-name",
        "local__echo",
        "--tool-arg",
        "text=hi from the inspector",
    ]);
    let ran = run(call);
    assert!(ran.ok, "tools/call failed:\n{}\n{}", ran.stdout, ran.stderr);
    let result = json_of(&ran.stdout);
    assert_eq!(
        result["content"][0]["text"], "hi from the inspector",
        "{result}"
    );
    assert_ne!(result["isError"], true);

    // Without the token the door refuses it and nothing runs.
    let mut anonymous = node_command("mcp-inspector", home);
    anonymous.args(["--cli", &url, "--method", "tools/list"]);
    let ran = run(anonymous);
    assert!(
        !ran.stdout.contains("local__echo"),
        "listed tools without a token:\n{}",
        ran.stdout
    );

    let rows = gw.wait_rows("the inspector's call", |rows| !rows.is_empty());
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!(rows[0]["principal"], "inspector");
    assert_eq!(rows[0]["transport"], "http");
    let log = gw.log();
    assert!(!log.contains(&token[4..]), "the token is not logged");
}

#[test]
fn inspector_cli_lists_and_calls_over_toolwall_stdio() {
    ensure_installed();
    let dir = tempfile::tempdir().unwrap();
    let config = stdio_config(dir.path());
    let config = config.to_str().unwrap();
    let server = ["--", BIN, "stdio", "--config", config];

    let mut list = node_command("mcp-inspector", dir.path());
    list.args(["--cli", "--method", "tools/list"]).args(server);
    let ran = run(list);
    assert!(ran.ok, "tools/list failed:\n{}\n{}", ran.stdout, ran.stderr);
    let names = tool_names(&json_of(&ran.stdout));
    assert!(names.contains(&"local__echo".to_owned()), "{names:?}");

    let mut call = node_command("mcp-inspector", dir.path());
    call.args([
        "--cli",
        "--method",
        "tools/call",
        "--tool-name",
        "local__echo",
        "--tool-arg",
        "text=hi over stdio",
    ])
    .args(server);
    let ran = run(call);
    assert!(ran.ok, "tools/call failed:\n{}\n{}", ran.stdout, ran.stderr);
    assert_eq!(json_of(&ran.stdout)["content"][0]["text"], "hi over stdio");

    let rows = ledger_rows(&dir.path().join("stdio/ledger.db"));
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!(rows[0]["transport"], "stdio");
    assert_eq!(rows[0]["decision"], "allowed");
}

// ---------------------------------------------------------------- Python SDK

/// The Python of the SDK's venv.
fn sdk_python() -> PathBuf {
    repo().join("target/mcp-venv/bin/python")
}

fn python_client(args: &[&str]) -> Value {
    let mut cmd = Command::new(sdk_python());
    cmd.arg(repo().join("tests/third_party/sdk_client.py"))
        .args(args)
        .stdin(Stdio::null());
    let ran = run(cmd);
    assert!(
        ran.ok,
        "sdk_client.py {args:?} failed:\n{}\n{}",
        ran.stdout, ran.stderr
    );
    json_of(&ran.stdout)
}

#[test]
fn python_sdk_lists_and_calls_over_http_in_both_eras() {
    ensure_installed();
    let gw = HttpGateway::start("", "");
    let token = gw.client_token("python");
    let url = format!("http://127.0.0.1:{}/mcp", gw.port);
    let mut expected_rows = 0;
    for (mode, version) in [
        ("legacy", "2025-11-25"),
        ("auto", "2026-07-28"),
        ("2026-07-28", "2026-07-28"),
    ] {
        let text = format!("python says hi ({mode})");
        let out = python_client(&["http", &url, &token, mode, &text]);
        assert_eq!(out["protocol_version"], version, "{mode}: {out}");
        let tools: Vec<&str> = out["tools"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(tools.contains(&"local__echo"), "{mode}: {out}");
        assert_eq!(out["echo_is_error"], false, "{mode}: {out}");
        assert_eq!(out["echo_texts"][0], text.as_str(), "{mode}: {out}");
        if mode != "2026-07-28" {
            assert_eq!(out["server_name"], "toolwall", "{mode}: {out}");
        }
        expected_rows += 1;
    }
    let rows = gw.wait_rows("three calls", |rows| rows.len() == expected_rows);
    assert!(
        rows.iter()
            .all(|r| r["principal"] == "python" && r["transport"] == "http")
    );

    // A client without a token gets nowhere.
    let mut cmd = Command::new(sdk_python());
    cmd.arg(repo().join("tests/third_party/sdk_client.py"))
        .args(["http", &url, "-", "legacy", "no token"])
        .stdin(Stdio::null());
    let ran = run(cmd);
    assert!(!ran.ok, "succeeded without a token: {}", ran.stdout);
    assert!(
        ran.stderr.contains("bearer token") || ran.stderr.contains("401"),
        "{}",
        ran.stderr
    );
    assert_eq!(gw.tool_calls().len(), expected_rows);
}

#[test]
fn python_sdk_lists_and_calls_over_toolwall_stdio() {
    ensure_installed();
    let dir = tempfile::tempdir().unwrap();
    let config = stdio_config(dir.path());
    let out = python_client(&["stdio", BIN, config.to_str().unwrap(), "python over stdio"]);
    assert_eq!(out["server_name"], "toolwall", "{out}");
    assert_eq!(out["echo_texts"][0], "python over stdio", "{out}");
    assert_eq!(out["echo_is_error"], false);
    let rows = ledger_rows(&dir.path().join("stdio/ledger.db"));
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!(rows[0]["transport"], "stdio");
}

#[test]
fn pins_are_exact_versions() {
    let pins = pins();
    for key in [
        "NODE22_VERSION",
        "CONFORMANCE_VERSION",
        "INSPECTOR_VERSION",
        "MCP_PY_VERSION",
    ] {
        let v = pins
            .get(key)
            .unwrap_or_else(|| panic!("{key} in versions.env"));
        assert!(
            v.chars().next().is_some_and(|c| c.is_ascii_digit())
                && !v.contains(['^', '~', '*', '>', '<', ' ']),
            "{key}={v} is an exact version"
        );
    }
    assert!(pins["NODE22_VERSION"].starts_with("22."));
    // The SDK's venv installs from the fully pinned requirements file: same mcp version.
    let requirements =
        std::fs::read_to_string(repo().join("tests/fixtures/sdk-requirements.txt")).unwrap();
    let wanted = format!("mcp=={}", pins["MCP_PY_VERSION"]);
    assert!(
        requirements.lines().any(|l| l.trim() == wanted),
        "tests/fixtures/sdk-requirements.txt pins {wanted}"
    );
}
