//! The ledger as evidence, through the real binary: `toolwall ledger verify` against a
//! ledger written by a real gateway, attacked from outside with the `sqlite3` program,
//! read live while the gateway runs, and after the gateway was killed with SIGKILL.

mod common;

use common::*;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const RULES: &str = r#"
[[policy.rules]]
id = "block-secrets"
action = "block"
tool = "local__echo"
arg = { path = "text", contains = "secret" }
reason = "no secrets"

[[policy.rules]]
id = "allow-echo"
action = "allow"
tool = "local__echo"
"#;

fn toolwall(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run toolwall")
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn verify(ledger: &Path) -> Output {
    toolwall(&["ledger", "verify", "--ledger", ledger.to_str().unwrap()])
}

fn sqlite3(ledger: &Path, sql: &str) {
    let out = Command::new("sqlite3")
        .arg(ledger)
        .arg(sql)
        .output()
        .expect("the sqlite3 program is installed");
    assert!(out.status.success(), "sqlite3 {sql}: {}", text(&out));
}

/// A gateway that served allowed and blocked calls, then stopped cleanly.
fn written_ledger() -> (TestGateway, PathBuf) {
    let mut gw = TestGateway::start(RULES);
    let mut c = gw.connect();
    for i in 0..20 {
        let word = if i % 4 == 0 { "secret" } else { "hello" };
        let r = c.tool("local__echo", json!({ "text": format!("{word} {i}") }));
        assert!(r.get("result").is_some(), "{r}");
    }
    drop(c);
    gw.wait_rows("20 calls ended", |rows| {
        rows.len() == 20 && rows.iter().all(|r| !r["duration_us"].is_null())
    });
    assert!(gw.terminate().success());
    let ledger = gw.ledger.clone();
    (gw, ledger)
}

/// A copy of the stopped gateway's ledger (the WAL was folded back at shutdown).
fn copy_of(gw: &TestGateway, ledger: &Path, name: &str) -> PathBuf {
    let copy = gw.dir.path().join(name);
    std::fs::copy(ledger, &copy).unwrap();
    copy
}

#[test]
fn verify_passes_a_written_ledger_and_fails_every_attack_naming_the_place() {
    let (gw, ledger) = written_ledger();
    let out = verify(&ledger);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(": OK"), "{stdout}");
    assert!(stdout.contains("tool_calls 20"), "{stdout}");
    // Every call matches the allow rule; the 5 blocked ones the block rule too.
    assert!(stdout.contains("security_rule_events 25"), "{stdout}");

    let attacks: &[(&str, &str, &str)] = &[
        (
            "edit one byte",
            "UPDATE tool_calls SET decision = 'allowed' WHERE id = 1",
            "tool_calls id 1 does not match",
        ),
        (
            "edit a preview",
            "UPDATE tool_calls SET arguments = replace(arguments, 'secret', 'secreT') \
             WHERE id = 5",
            "tool_calls id 5 does not match",
        ),
        (
            "delete a row",
            "DELETE FROM tool_calls WHERE id = 7",
            "tool_calls id 7 is missing",
        ),
        (
            "delete a rule event",
            "DELETE FROM security_rule_events WHERE call_id = 9",
            "security_rule_events call_id 9",
        ),
        (
            "swap two rows",
            "UPDATE tool_calls SET id = -3 WHERE id = 3; \
             UPDATE tool_calls SET id = 3 WHERE id = 4; \
             UPDATE tool_calls SET id = 4 WHERE id = -3;",
            "tool_calls id 3",
        ),
        (
            "add a row",
            "INSERT INTO events (ts_ms, kind, detail, chain_seq) \
             VALUES (1, 'reload', '{}', 2)",
            "events id",
        ),
        (
            "truncate the last group",
            "DELETE FROM tool_calls WHERE chain_seq = (SELECT max(seq) FROM ledger_chain); \
             DELETE FROM events WHERE chain_seq = (SELECT max(seq) FROM ledger_chain); \
             DELETE FROM security_rule_events \
             WHERE chain_seq = (SELECT max(seq) FROM ledger_chain);",
            "is missing",
        ),
        (
            "edit a group",
            "UPDATE ledger_chain SET ts_ms = ts_ms + 1 WHERE seq = 3",
            "group 3: its hash does not match",
        ),
        (
            "remove a group",
            "DELETE FROM ledger_chain WHERE seq = 4",
            "groups 4..4 are missing",
        ),
    ];
    for (i, (what, sql, named)) in attacks.iter().enumerate() {
        let copy = copy_of(&gw, &ledger, &format!("attacked-{i}.db"));
        sqlite3(&copy, sql);
        let out = verify(&copy);
        assert_eq!(out.status.code(), Some(1), "{what}: {}", text(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("FAILED"), "{what}: {stdout}");
        let first_bad = stdout
            .lines()
            .find(|l| l.contains("BAD:"))
            .unwrap_or_default();
        assert!(
            stdout.contains(named),
            "{what}: expected {named:?}; first: {first_bad}\n{stdout}"
        );
    }

    // JSON for tools.
    let out = toolwall(&[
        "ledger",
        "verify",
        "--json",
        "--ledger",
        ledger.to_str().unwrap(),
    ]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ok"], true);
    assert_eq!(report["rows"]["tool_calls"], 20);
}

#[test]
fn a_missing_or_foreign_file_is_an_error_not_a_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let out = verify(&dir.path().join("nope.db"));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope.db"));
    let other = dir.path().join("other.db");
    sqlite3(&other, "CREATE TABLE t (x); INSERT INTO t VALUES (1);");
    let out = verify(&other);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no chain"));
}

/// Calls on `threads` connections until `stop` is set; returns how many got answers.
fn load(
    sock: &Path,
    threads: usize,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<std::thread::JoinHandle<u64>> {
    (0..threads)
        .map(|t| {
            let sock = sock.to_path_buf();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let Ok(stream) = std::os::unix::net::UnixStream::connect(&sock) else {
                    return 0;
                };
                drop(stream);
                let mut c = FramedClient::connect(&sock);
                let mut answered = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let sid = c.request(
                        json!(answered + 1),
                        "tools/call",
                        Some(json!({"name": "local__echo",
                                    "arguments": {"text": format!("t{t} n{answered}")}})),
                    );
                    match c.recv() {
                        Some(reply) if reply.stream == sid => answered += 1,
                        _ => break,
                    }
                }
                answered
            })
        })
        .collect()
}

#[test]
fn a_live_ledger_verifies_while_calls_are_committed() {
    let gw = TestGateway::start(RULES);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers = load(&gw.sock, 3, stop.clone());
    gw.wait_rows("some calls", |rows| rows.len() > 200);
    for _ in 0..3 {
        let out = verify(&gw.ledger);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let answered: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert!(answered > 200);
}

#[test]
fn a_gateway_killed_under_load_leaves_a_ledger_that_verifies_to_its_last_commit() {
    let mut gw = TestGateway::start(RULES);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers = load(&gw.sock, 3, stop.clone());
    gw.wait_rows("some calls", |rows| rows.len() > 300);
    let mut child = gw.child.take().unwrap();
    child.kill().unwrap(); // SIGKILL, mid-commit or not
    child.wait().unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in workers {
        let _ = w.join();
    }
    // As the kill left it: everything committed with a chain row verifies; the last
    // groups' rows wait for theirs and are said to.
    let out = verify(&gw.ledger);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // The next gateway seals them into a recovery group, and says so.
    gw.stderr.lock().unwrap().clear();
    gw.spawn();
    gw.wait_for_log("recovery group");
    let status = gw.terminate();
    assert!(status.success(), "{status:?}\n{}", gw.log());
    let out = verify(&gw.ledger);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("recovered after an unclean stop"),
        "{stdout}"
    );
    assert!(!stdout.contains("not written yet"), "{stdout}");
}

#[test]
fn a_version_3_ledger_is_migrated_with_a_chain_start() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("state")).unwrap();
    let ledger = dir.path().join("state/ledger.db");
    // The three released migrations, as a version-3 toolwall left them, with a call.
    let conn = rusqlite::Connection::open(&ledger).unwrap();
    conn.execute_batch("PRAGMA page_size = 1024; PRAGMA journal_mode = WAL;")
        .unwrap();
    for step in &toolwall::ledger::MIGRATIONS[..3] {
        conn.execute_batch(step.sql).unwrap();
    }
    conn.execute_batch(&format!(
        "PRAGMA application_id = {}; PRAGMA user_version = 3; \
         INSERT INTO tool_calls (id, ts_ms, transport, principal, process_name, server_name, \
           tool_name, method, request_id, decision, bytes_received, duration_us) \
         VALUES (1, 1000, 'unix', 'uid:7', 'old', 'local', 'echo', 'tools/call', '1', \
           'allowed', 10, 5); \
         INSERT INTO events (ts_ms, kind, detail) VALUES (500, 'reload', '{{}}');",
        toolwall::ledger::APPLICATION_ID
    ))
    .unwrap();
    drop(conn);
    let config = base_config(dir.path(), "");
    let mut gw = TestGateway::start_with(dir, &config);
    gw.wait_for_log("chain started; 2 existing rows sealed");
    let mut c = gw.connect();
    c.tool("local__echo", json!({"text": "after the migration"}));
    drop(c);
    gw.wait_rows("2 calls", |rows| {
        rows.len() == 2 && !rows[1]["duration_us"].is_null()
    });
    assert!(gw.terminate().success());
    let out = verify(&ledger);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("rows older than the chain (sealed): 2"),
        "{}",
        text(&out)
    );
    sqlite3(
        &ledger,
        "UPDATE tool_calls SET principal = 'uid:0' WHERE id = 1",
    );
    let out = verify(&ledger);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("older than the chain"));
}

#[test]
fn an_older_copy_of_the_database_fails_against_the_head_anchor_command_shipped() {
    let dir = tempfile::tempdir().unwrap();
    let shipped = dir.path().join("shipped.jsonl");
    let extra = format!(
        "{RULES}\n[ledger]\npath = \"{d}/state/ledger.db\"\n\
         anchor_command = [\"sh\", \"-c\", \"cat >> '{s}'\"]\ncheckpoint_groups = 10\n",
        d = dir.path().display(),
        s = shipped.display()
    );
    // base_config has its own [ledger] table: build the file without it.
    let config = base_config(dir.path(), "").replace(
        &format!(
            "[ledger]\npath = \"{}/state/ledger.db\"\n",
            dir.path().display()
        ),
        "",
    ) + &extra;
    let mut gw = TestGateway::start_with(dir, &config);
    let key_out = gw.cli(&["ledger", "key"]);
    assert!(key_out.status.success(), "{}", text(&key_out));
    let key = String::from_utf8_lossy(&key_out.stdout).trim().to_string();
    assert!(key.starts_with("ed25519:") && key.len() == 8 + 64, "{key}");
    let key_file = gw.dir.path().join("ledger.pub");
    std::fs::write(&key_file, format!("{key}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(gw.dir.path().join("state/ledger-signing.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    let calls = |gw: &TestGateway, n: usize| {
        let mut c = gw.connect();
        for i in 0..n {
            c.tool("local__echo", json!({ "text": format!("call {i}") }));
        }
    };
    calls(&gw, 10);
    assert!(gw.terminate().success());
    let old = gw.dir.path().join("old.db");
    std::fs::copy(&gw.ledger, &old).unwrap();
    gw.stderr.lock().unwrap().clear();
    gw.spawn();
    calls(&gw, 10);
    assert!(gw.terminate().success());

    let verify_with = |ledger: &Path| {
        toolwall(&[
            "ledger",
            "verify",
            "--ledger",
            ledger.to_str().unwrap(),
            "--public-key",
            key_file.to_str().unwrap(),
            "--anchor",
            shipped.to_str().unwrap(),
        ])
    };
    let out = verify_with(&gw.ledger);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("anchors checked"));
    // The attacker puts the older copy back: a valid chain, but not the one shipped.
    let _ = std::fs::remove_file(gw.ledger.with_extension("db-wal"));
    let _ = std::fs::remove_file(gw.ledger.with_extension("db-shm"));
    std::fs::copy(&old, &gw.ledger).unwrap();
    let out = verify(&gw.ledger);
    assert_eq!(
        out.status.code(),
        Some(0),
        "alone it verifies: {}",
        text(&out)
    );
    let out = verify_with(&gw.ledger);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("this is an older copy"),
        "{}",
        text(&out)
    );
    // Another key: the shipped heads are not its signatures.
    std::fs::write(&key_file, format!("ed25519:{}\n", "ab".repeat(32))).unwrap();
    let out = verify_with(&gw.ledger);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    // The next gateway on the older copy says so in its log and its ledger.
    gw.stderr.lock().unwrap().clear();
    gw.spawn();
    gw.wait_for_log("this database does not reach that group");
    assert!(gw.terminate().success());
    assert_eq!(gw.events("ledger_behind_signed_head").len(), 1);
}

fn lines_json(out: &Output) -> Vec<serde_json::Value> {
    assert!(out.status.success(), "{}", text(out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn ids(rows: &[serde_json::Value]) -> Vec<i64> {
    rows.iter().map(|r| r["id"].as_i64().unwrap()).collect()
}

#[test]
fn query_show_and_stats_answer_from_the_rows_the_calls_made() {
    let (gw, ledger) = written_ledger();
    let l = ledger.to_str().unwrap();
    let query = |args: &[&str]| {
        let mut all = vec!["ledger", "query", "--ledger", l, "--json"];
        all.extend_from_slice(args);
        lines_json(&toolwall(&all))
    };
    // Calls 1, 5, 9, 13, 17 said "secret" and were blocked.
    let blocked = [1, 5, 9, 13, 17];
    assert_eq!(ids(&query(&["--decision", "denied"])), blocked);
    assert_eq!(ids(&query(&["--rule", "block-secrets"])), blocked);
    assert_eq!(query(&["--rule", "allow-echo"]).len(), 20);
    assert_eq!(ids(&query(&["--text", "hello 14"])), [15]);
    assert_eq!(
        ids(&query(&["--text", "secret 8", "--decision", "denied"])),
        [9]
    );
    assert_eq!(query(&["--tool", "local__e*"]).len(), 20);
    assert_eq!(query(&["--tool", "echo", "--server", "local"]).len(), 20);
    assert!(query(&["--tool", "fetch*"]).is_empty());
    assert!(query(&["--principal", "uid:999999"]).is_empty());
    assert_eq!(query(&["--transport", "unix", "--since", "1h"]).len(), 20);
    assert!(query(&["--until", "1970-01-02"]).is_empty());
    // Pages: the newest, then back and forth by cursor, without gaps or repeats.
    assert_eq!(
        ids(&query(&["--limit", "7"])),
        (14..=20).collect::<Vec<_>>()
    );
    assert_eq!(
        ids(&query(&["--limit", "7", "--before", "14"])),
        (7..=13).collect::<Vec<_>>()
    );
    let mut followed = Vec::new();
    let mut cursor = 0;
    loop {
        let page = query(&["--limit", "6", "--after", &cursor.to_string()]);
        if page.is_empty() {
            break;
        }
        cursor = *ids(&page).last().unwrap();
        followed.extend(ids(&page));
    }
    assert_eq!(followed, (1..=20).collect::<Vec<_>>());
    // Every column is in the JSON; the table and CSV say the same.
    let row = &query(&["--text", "hello 14"])[0];
    assert_eq!(row["tool_name"], "echo");
    assert_eq!(row["decision"], "allowed");
    assert_eq!(row["policy_rule"], "allow-echo");
    let out = toolwall(&[
        "ledger",
        "query",
        "--ledger",
        l,
        "--table",
        "--decision",
        "denied",
    ]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.starts_with("ID"), "{table}");
    assert!(table.contains("block-secrets"), "{table}");
    assert!(table.contains("5 calls; next page: --after 17"), "{table}");
    let out = toolwall(&["ledger", "query", "--ledger", l, "--csv", "--limit", "2"]);
    let csv = String::from_utf8_lossy(&out.stdout);
    assert!(csv.starts_with("id,ts_ms,transport"), "{csv}");
    assert_eq!(csv.lines().count(), 3, "{csv}");
    // Bad input is refused, naming it.
    for (args, says) in [
        (vec!["--since", "yesterday"], "is not a time"),
        (vec!["--decision", "maybe"], "--decision must be"),
        (vec!["--limit", "0"], "--limit must be"),
        (vec!["--after", "x"], "--after needs a number"),
    ] {
        let mut all = vec!["ledger", "query", "--ledger", l];
        all.extend(args);
        let out = toolwall(&all);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(says),
            "{}",
            text(&out)
        );
    }

    // One call whole.
    let out = toolwall(&["ledger", "show", "5", "--ledger", l, "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let call: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(call["decision"], "denied");
    assert_eq!(call["policy_rule"], "block-secrets");
    assert!(
        call["bodies"]["arguments"]
            .as_str()
            .unwrap()
            .contains("secret 4")
    );
    let rules: Vec<&str> = call["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rule_id"].as_str().unwrap())
        .collect();
    assert_eq!(rules, ["allow-echo", "block-secrets"]);
    assert!(
        call["chain"].as_str().unwrap().starts_with("matches"),
        "{call}"
    );
    let out = toolwall(&["ledger", "show", "6", "--ledger", l]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("hello 5"), "{shown}");
    assert!(
        shown.contains("rule       request #0 allow-echo allow"),
        "{shown}"
    );
    assert!(shown.contains("response (what the agent got)"), "{shown}");
    let out = toolwall(&["ledger", "show", "99", "--ledger", l]);
    assert_eq!(out.status.code(), Some(1));
    // An edited row says so.
    let copy = copy_of(&gw, &ledger, "edited.db");
    sqlite3(
        &copy,
        "UPDATE tool_calls SET decision = 'allowed' WHERE id = 5",
    );
    let out = toolwall(&["ledger", "show", "5", "--ledger", copy.to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("DOES NOT MATCH"),
        "{}",
        text(&out)
    );

    // Counts.
    let out = toolwall(&["ledger", "stats", "--ledger", l, "--json", "--since", "1h"]);
    assert!(out.status.success(), "{}", text(&out));
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stats["calls"], 20);
    assert_eq!(stats["by_decision"]["denied"], 5);
    assert_eq!(stats["by_decision"]["allowed"], 15);
    assert_eq!(stats["by_tool"][0]["name"], "local__echo");
    assert_eq!(stats["by_tool"][0]["calls"], 20);
    assert!(stats["by_tool"][0]["p99_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(
        stats["top_blocking_rules"],
        json!([{"rule_id": "block-secrets", "calls": 5}])
    );
    let out = toolwall(&[
        "ledger",
        "stats",
        "--ledger",
        l,
        "--since",
        "1970-01-01",
        "--until",
        "1970-01-02",
    ]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(": 0"),
        "{}",
        text(&out)
    );
}

#[test]
fn retention_archives_while_a_load_runs_and_no_call_fails() {
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "{RULES}\n[ledger]\npath = \"{d}/state/ledger.db\"\nretain_secs = 1\n\
         retention_check_secs = 1\nretention_batch_rows = 100\n",
        d = dir.path().display()
    );
    let config = base_config(dir.path(), "").replace(
        &format!(
            "[ledger]\npath = \"{}/state/ledger.db\"\n",
            dir.path().display()
        ),
        "",
    ) + &extra;
    let mut gw = TestGateway::start_with(dir, &config);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let failures = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let workers: Vec<_> = (0..3)
        .map(|t| {
            let sock = gw.sock.clone();
            let stop = stop.clone();
            let failures = failures.clone();
            std::thread::spawn(move || {
                let mut c = FramedClient::connect(&sock);
                let mut answered = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let r = c.tool(
                        "local__echo",
                        json!({"text": format!("load {t} {answered}")}),
                    );
                    if r.get("result").is_none() || r["result"]["isError"] == true {
                        failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    answered += 1;
                }
                answered
            })
        })
        .collect();
    // Until two archives are recorded and the first one's rows are gone from the live file.
    let deadline = std::time::Instant::now() + PATIENCE * 3;
    loop {
        let conn = gw.ledger();
        let archives: i64 = conn
            .query_row(
                "SELECT count(*) FROM events WHERE kind = 'ledger_archived'",
                [],
                |r| r.get(0),
            )
            .unwrap_or(0);
        let oldest: i64 = conn
            .query_row("SELECT COALESCE(min(seq), 0) FROM ledger_chain", [], |r| {
                r.get(0)
            })
            .unwrap_or(0);
        if archives >= 2 && oldest > 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no archive; log:\n{}",
            gw.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let answered: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert_eq!(failures.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert!(answered > 0);
    // Verify live, while it runs, then with the archives after a stop.
    let out = verify(&gw.ledger);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(gw.terminate().success());
    let archive = gw.dir.path().join("state/archive");
    let out = toolwall(&[
        "ledger",
        "verify",
        "--ledger",
        gw.ledger.to_str().unwrap(),
        "--archive",
        archive.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("archives checked"), "{stdout}");
    let out = toolwall(&[
        "ledger",
        "archive",
        "list",
        "--archive",
        archive.to_str().unwrap(),
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let listed = lines_json(&out);
    assert!(listed.len() >= 2, "{listed:?}");
    assert!(
        listed
            .iter()
            .all(|a| a["problems"].as_array().unwrap().is_empty()),
        "{listed:?}"
    );
    // Every answered call is in the live ledger or in an archive (an open call in both).
    let archived_calls: u64 = listed
        .iter()
        .map(|a| {
            let f = std::fs::File::open(a["file"].as_str().unwrap()).unwrap();
            let mut s = String::new();
            use std::io::Read;
            flate2::read::GzDecoder::new(f)
                .read_to_string(&mut s)
                .unwrap();
            s.matches("\"table\":\"tool_calls\"").count() as u64
        })
        .sum();
    let live = gw.tool_calls().len() as u64;
    assert!(
        archived_calls + live >= answered,
        "{archived_calls} + {live} < {answered}"
    );
}
