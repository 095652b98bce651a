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
use std::collections::BTreeMap;
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

/// The eras the suite runs in (`--spec-version`): 2025-11-25 sessions and 2026-07-28
/// stateless requests. The tasks extension's scenarios run in neither (they run only
/// without `--spec-version`, and the fixture serves no tasks).
const ERAS: &[&str] = &["2025-11-25", "2026-07-28"];

/// The name toolwall knows the fixture server by (`prefix = false`: agents never see it).
const FIXTURE_SERVER: &str = "conformance";

/// One line of tests/conformance-baseline.txt.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct BaselineEntry {
    /// None: both eras.
    era: Option<String>,
    scenario: String,
    /// None: every difference of the scenario.
    check: Option<String>,
    reason: String,
}

impl BaselineEntry {
    fn key(&self) -> String {
        let era = self
            .era
            .as_ref()
            .map(|e| format!("{e}:"))
            .unwrap_or_default();
        match &self.check {
            Some(c) => format!("{era}{}/{c}", self.scenario),
            None => format!("{era}{}", self.scenario),
        }
    }

    fn covers(&self, d: &Difference) -> bool {
        self.era.as_ref().is_none_or(|e| *e == d.era)
            && self.scenario == d.scenario
            && self.check.as_ref().is_none_or(|c| *c == d.check)
    }
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
        let (era, key) = match key.split_once(':') {
            Some((era, rest)) if ERAS.contains(&era) => (Some(era.to_owned()), rest),
            Some((era, _)) => {
                return Err(format!(
                    "baseline line {}: unknown era {era:?} (known: {})",
                    n + 1,
                    ERAS.join(", ")
                ));
            }
            None => (None, key),
        };
        let (scenario, check) = match key.split_once('/') {
            Some((s, c)) => (s.to_owned(), Some(c.to_owned())),
            None => (key.to_owned(), None),
        };
        let entry = BaselineEntry {
            era,
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

/// One check of one scenario.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Check {
    id: String,
    /// A scenario may report one check id several times (one per case): the n-th report of
    /// this id (from 0), so each case is compared with the same case of the other run.
    nth: usize,
    status: String,
    /// The suite says it could not exercise the check (a fixture of its own is missing).
    untestable: bool,
    message: String,
}

impl Check {
    fn failed(&self) -> bool {
        !NOT_FAILED.contains(&self.status.as_str())
    }
}

/// Results of the runs: (era, scenario) → its checks.
type Results = BTreeMap<(String, String), Vec<Check>>;

/// Statuses that are not failures: the suite itself counts only FAILURE (and errors).
const NOT_FAILED: &[&str] = &["SUCCESS", "SKIPPED", "WARNING", "INFO"];

/// A check that passes against the fixture directly and not through toolwall.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Difference {
    era: String,
    scenario: String,
    check: String,
    untestable: bool,
    message: String,
}

/// Every check that does not fail directly but fails (or is missing) through toolwall; a
/// scenario that ran directly and not through toolwall is one difference (check `*`).
fn differences(direct: &Results, through: &Results) -> Vec<Difference> {
    let mut out = Vec::new();
    for ((era, scenario), checks) in direct {
        let Some(theirs) = through.get(&(era.clone(), scenario.clone())) else {
            out.push(Difference {
                era: era.clone(),
                scenario: scenario.clone(),
                check: "*".into(),
                untestable: false,
                message: "ran against the fixture, not through toolwall".into(),
            });
            continue;
        };
        for check in checks.iter().filter(|c| !c.failed()) {
            let same = |t: &&Check| t.id == check.id && t.nth == check.nth;
            let message = match theirs.iter().find(same) {
                Some(t) if t.failed() => t.message.clone(),
                Some(_) => continue,
                None if theirs.iter().any(Check::failed) => {
                    "not reached through toolwall (the scenario failed earlier)".into()
                }
                // Checks some runs emit and others do not (the scenario passed).
                None => continue,
            };
            let untestable = theirs.iter().any(|t| same(&t) && t.untestable);
            out.push(Difference {
                era: era.clone(),
                scenario: scenario.clone(),
                check: check.id.clone(),
                untestable,
                message,
            });
        }
    }
    out.sort();
    out
}

/// What is wrong with the runs compared to the baseline; empty when it matches.
fn compare(direct: &Results, through: &Results, baseline: &[BaselineEntry]) -> Vec<String> {
    let mut problems = Vec::new();
    for required in REQUIRED_SCENARIOS {
        for results in [direct, through] {
            if !results.keys().any(|(_, s)| s == required) {
                problems.push(format!("required scenario {required} did not run"));
            }
        }
    }
    let diffs = differences(direct, through);
    for d in &diffs {
        match baseline.iter().find(|e| e.covers(d)) {
            None => problems.push(format!(
                "DIFFERENCE {}:{}/{}: passes against the fixture, through toolwall: {}",
                d.era, d.scenario, d.check, d.message
            )),
            Some(_) if REQUIRED_SCENARIOS.contains(&d.scenario.as_str()) && !d.untestable => {
                problems.push(format!(
                    "required scenario {} differs in {}:{}: {} (only checks the suite reports \
                     untestable may be baselined there)",
                    d.scenario, d.era, d.check, d.message
                ))
            }
            Some(_) => {}
        }
    }
    for e in baseline {
        if REQUIRED_SCENARIOS.contains(&e.scenario.as_str()) && e.check.is_none() {
            problems.push(format!(
                "baseline lists the required scenario {} whole; list single checks",
                e.key()
            ));
        }
        if !diffs.iter().any(|d| e.covers(d)) {
            problems.push(format!(
                "baseline entry {} covers no difference (it passes through toolwall now, or \
                 did not run): remove it ({})",
                e.key(),
                e.reason
            ));
        }
    }
    problems
}

/// Read one run's output directory (`server-SCENARIO-TIMESTAMP/checks.json` per scenario)
/// into `results` under `era`.
fn read_results(dir: &Path, era: &str, results: &mut Results) {
    let stamp = regex::Regex::new(r"^server-(.+)-\d{4}-\d{2}-\d{2}T[0-9-]+Z$").unwrap();
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
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        let list = checks
            .iter()
            .map(|c| {
                let id = c["id"].as_str().unwrap_or("?").to_owned();
                let nth = seen.entry(id.clone()).or_default();
                *nth += 1;
                Check {
                    nth: *nth - 1,
                    id,
                    status: c["status"].as_str().unwrap_or("?").to_owned(),
                    untestable: c["details"]["untestable"] == true,
                    message: c["errorMessage"].as_str().unwrap_or("").to_owned(),
                }
            })
            .collect();
        assert!(
            results
                .insert((era.to_owned(), scenario.clone()), list)
                .is_none(),
            "{era} {scenario} ran twice"
        );
    }
}

/// Scenarios in which no check failed, of all that ran.
fn passing(results: &Results) -> (usize, usize) {
    let passed = results
        .values()
        .filter(|checks| !checks.iter().any(Check::failed))
        .count();
    (passed, results.len())
}

/// The suite's fixture server (tests/fixtures/conformance_server.py on the official Python
/// SDK), killed when dropped.
struct ConformanceFixture {
    child: std::process::Child,
    port: u16,
}

impl ConformanceFixture {
    fn start() -> ConformanceFixture {
        let port = common::http::free_port();
        let child = Command::new(sdk_python())
            .arg(repo().join("tests/fixtures/conformance_server.py"))
            .arg(port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the conformance fixture server");
        let fixture = ConformanceFixture { child, port };
        let deadline = std::time::Instant::now() + TOOL_PATIENCE;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the conformance fixture never listened"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        fixture
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }
}

impl Drop for ConformanceFixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `conformance server --suite all` against `url` in every era; `label` names the runs.
fn run_suite(url: &str, home: &Path, label: &str) -> Results {
    let mut results = Results::new();
    for era in ERAS {
        let out_dir = home.join(format!("conformance-{label}-{era}"));
        let mut cmd = node_command("conformance", home);
        cmd.args([
            "server",
            "--url",
            url,
            "--suite",
            "all",
            "--spec-version",
            era,
        ])
        .arg("-o")
        .arg(&out_dir);
        let ran = run(cmd);
        let summary = ran
            .stdout
            .lines()
            .skip_while(|l| !l.contains("SUMMARY"))
            .collect::<Vec<_>>()
            .join("\n");
        eprintln!(
            "conformance {} {label} {era} ({url}):\n{summary}",
            pins()["CONFORMANCE_VERSION"]
        );
        let before = results.len();
        read_results(&out_dir, era, &mut results);
        assert!(
            results.len() > before,
            "the suite ran no scenario in {era}; stdout:\n{}\nstderr:\n{}",
            ran.stdout,
            ran.stderr
        );
    }
    results
}

#[test]
fn conformance_suite_passes_through_toolwall_what_passes_directly() {
    ensure_installed();
    let fixture = ConformanceFixture::start();
    let gw = HttpGateway::start(
        "http_auth = \"none\"\npublic_url = \"http://127.0.0.1:{port}/mcp\"",
        &format!(
            "[servers.{FIXTURE_SERVER}]\nurl = \"{}\"\nprefix = false\n",
            fixture.url()
        ),
    );
    let url = format!("http://127.0.0.1:{}/mcp", gw.port);
    let direct = run_suite(&fixture.url(), gw.dir.path(), "direct");
    let through = run_suite(&url, gw.dir.path(), "through-toolwall");
    let (d_pass, d_all) = passing(&direct);
    let (t_pass, t_all) = passing(&through);
    eprintln!(
        "scenarios passing (both eras): {d_pass} of {d_all} against the fixture, \
         {t_pass} of {t_all} through toolwall"
    );
    let baseline_text =
        std::fs::read_to_string(repo().join("tests/conformance-baseline.txt")).unwrap();
    let baseline = parse_baseline(&baseline_text).unwrap_or_else(|e| panic!("{e}"));
    let problems = compare(&direct, &through, &baseline);
    assert!(
        problems.is_empty(),
        "through toolwall differs from the fixture beyond tests/conformance-baseline.txt:\n  {}",
        problems.join("\n  ")
    );
    for required in REQUIRED_SCENARIOS {
        let passed = through
            .iter()
            .filter(|((_, s), _)| s == required)
            .flat_map(|(_, checks)| checks)
            .filter(|c| c.status == "SUCCESS")
            .count();
        assert!(passed > 0, "{required} passed no check through toolwall");
    }
    // The fixture's tools were called through toolwall under their own names, and the
    // ledger knows the real server and the qualified name policy saw.
    let rows = ledger_rows(&gw.ledger);
    let simple: Vec<&Value> = rows
        .iter()
        .filter(|r| r["tool_name"] == "test_simple_text")
        .collect();
    assert!(!simple.is_empty(), "no ledger row for test_simple_text");
    assert!(
        simple.iter().all(|r| r["server_name"] == FIXTURE_SERVER),
        "{simple:?}"
    );
}

#[test]
fn baseline_comparison_flags_differences_and_stale_entries() {
    let check = |id: &str, status: &str, untestable: bool| Check {
        id: id.to_owned(),
        nth: 0,
        status: status.to_owned(),
        untestable,
        message: format!("{id} says {status}"),
    };
    let key = |era: &str, s: &str| (era.to_owned(), s.to_owned());
    let mut direct = Results::new();
    for s in REQUIRED_SCENARIOS {
        direct.insert(key("2025-11-25", s), vec![check("ok", "SUCCESS", false)]);
    }
    direct.insert(
        key("2026-07-28", "server-stateless"),
        vec![check("a", "SUCCESS", false), check("b", "SUCCESS", false)],
    );
    direct.insert(
        key("2026-07-28", "tools-call-x"),
        vec![check("c", "SUCCESS", false)],
    );
    direct.insert(
        key("2025-11-25", "fails-anyway"),
        vec![check("f", "FAILURE", false)],
    );
    let mut through = direct.clone();
    through.insert(
        key("2026-07-28", "server-stateless"),
        vec![check("a", "SUCCESS", false), check("b", "FAILURE", true)],
    );
    through.insert(
        key("2026-07-28", "tools-call-x"),
        vec![check("c", "FAILURE", false)],
    );
    let baseline = parse_baseline(
        "# comment\nserver-stateless/b untestable here\n2026-07-28:tools-call-x a reason\n",
    )
    .unwrap();
    assert_eq!(
        compare(&direct, &through, &baseline),
        Vec::<String>::new(),
        "failing in both is no difference"
    );

    // A difference no line covers (the era of a line counts).
    let other_era =
        parse_baseline("server-stateless/b untestable here\n2025-11-25:tools-call-x a reason\n")
            .unwrap();
    let problems = compare(&direct, &through, &other_era);
    assert!(
        problems
            .iter()
            .any(|p| p.contains("DIFFERENCE 2026-07-28:tools-call-x/c")),
        "{problems:?}"
    );

    // A check missing through toolwall after an earlier failure is a difference too.
    let mut cut = through.clone();
    cut.insert(
        key("2025-11-25", "ping"),
        vec![check("early", "FAILURE", false)],
    );
    assert!(
        compare(&direct, &cut, &baseline)
            .iter()
            .any(|p| p.contains("ping") && p.contains("ok")),
    );

    // A baseline entry that now passes through toolwall.
    let mut better = through.clone();
    better.insert(
        key("2026-07-28", "tools-call-x"),
        vec![check("c", "SUCCESS", false)],
    );
    let problems = compare(&direct, &better, &baseline);
    assert!(
        problems.len() == 1 && problems[0].contains("tools-call-x"),
        "{problems:?}"
    );

    // A required scenario may not hide a real difference behind the baseline.
    let mut real = through.clone();
    real.insert(
        key("2026-07-28", "server-stateless"),
        vec![check("a", "SUCCESS", false), check("b", "FAILURE", false)],
    );
    assert!(
        compare(&direct, &real, &baseline)
            .iter()
            .any(|p| p.contains("required scenario server-stateless")),
    );
    let whole = parse_baseline("server-stateless everything\n2026-07-28:tools-call-x f\n").unwrap();
    assert!(
        compare(&direct, &through, &whole)
            .iter()
            .any(|p| p.contains("whole"))
    );

    // One check id reported for several cases: each case is compared with its own.
    let twice = |second: &str| {
        vec![
            check("x", "SUCCESS", false),
            Check {
                nth: 1,
                ..check("x", second, false)
            },
        ]
    };
    let mut cases_direct = direct.clone();
    cases_direct.insert(key("2026-07-28", "cases"), twice("SUCCESS"));
    let mut cases_through = through.clone();
    cases_through.insert(key("2026-07-28", "cases"), twice("FAILURE"));
    assert!(
        compare(&cases_direct, &cases_through, &baseline)
            .iter()
            .any(|p| p.contains("DIFFERENCE 2026-07-28:cases/x")),
        "the second case's failure is a difference even though the first passes"
    );

    // A scenario that ran directly and not through toolwall.
    let mut missing = through.clone();
    missing.remove(&key("2026-07-28", "tools-call-x"));
    let stateless_only = parse_baseline("server-stateless/b untestable here\n").unwrap();
    assert!(
        compare(&direct, &missing, &stateless_only)
            .iter()
            .any(|p| p.contains("tools-call-x/*"))
    );

    assert_eq!(
        passing(&direct),
        (REQUIRED_SCENARIOS.len() + 2, REQUIRED_SCENARIOS.len() + 3)
    );
    assert!(parse_baseline("no-reason\n").is_err());
    assert!(parse_baseline("a b\na b\n").is_err());
    assert!(parse_baseline("1999-01-01:a b\n").is_err());
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
