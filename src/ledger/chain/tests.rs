//! The chain against an attacker who edits the ledger file with SQLite from outside, on
//! real files.

use rusqlite::Connection;
use std::path::Path;

use super::verify::{self, Options, Report};
use crate::ledger::{CallEnd, CallStart, Ledger, LedgerConfig, decision};

fn config(dir: &Path) -> LedgerConfig {
    LedgerConfig {
        path: dir.join("ledger.db"),
        ..LedgerConfig::default()
    }
}

fn start<'a>(id: i64, arguments: &'a [u8]) -> CallStart<'a> {
    CallStart {
        id,
        ts_ms: 1_700_000_000_000 + id,
        transport: "unix",
        principal: "uid:1000",
        process_name: "claude",
        server_name: "local",
        tool_name: "echo",
        method: "tools/call",
        request_id: "7",
        decision: decision::PENDING,
        policy_rule: Some("ask-echo"),
        policy_reason: Some("a human decides"),
        bytes_received: 100 + arguments.len(),
        arguments,
    }
}

fn end(response: &[u8]) -> CallEnd<'_> {
    CallEnd {
        decision: decision::ALLOWED,
        policy_rule: None,
        policy_reason: None,
        duration_us: 1234,
        error_message: None,
        bytes_sent: response.len() + 50,
        response,
        rewritten_arguments: None,
        original_response: None,
        approved_by: Some("uid:0"),
        decided_at_ms: Some(1_700_000_000_999),
    }
}

pub fn verify_path(path: &Path) -> Report {
    verify::verify_file(path, &Options::default()).expect("verify reads the ledger")
}

pub fn assert_verifies(path: &Path) {
    let report = verify_path(path);
    assert!(report.ok(), "verify failed: {:#?}", report.problems);
}

fn raw(path: &Path) -> Connection {
    Connection::open(path).unwrap()
}

/// Writes a ledger with every kind of row: calls started and ended in separate commits
/// and in the same one, rule events, a long body (a blob), events. Returns its path.
fn populated(dir: &Path) -> std::path::PathBuf {
    let cfg = LedgerConfig {
        preview_bytes: 16,
        ..config(dir)
    };
    let mut ledger = Ledger::open(&cfg).unwrap();
    for i in 0..30 {
        let id = ledger.new_call_id();
        let args = format!(r#"{{"text":"call {i} with a body longer than the preview"}}"#);
        ledger.stage_call(&start(id, args.as_bytes()));
        ledger.stage_rule_event(id, 0, "ask-echo", "ask", "request", "config");
        ledger.stage_event("connect", &serde_json::json!({ "conn": i }));
        if i % 3 == 0 {
            // Start and outcome in one commit.
            ledger.stage_call_end(id, &end(br#"{"content":[]}"#));
        }
        ledger.commit().unwrap();
        if i % 3 == 1 {
            ledger.stage_call_end(
                id,
                &CallEnd {
                    policy_rule: Some("block-secret"),
                    policy_reason: Some("the answer held a secret"),
                    decision: decision::DENIED,
                    original_response: Some(b"the secret"),
                    ..end(br#"{"content":[{"type":"text","text":"withheld"}]}"#)
                },
            );
            ledger.stage_rule_event(id, 0, "block-secret", "block", "response", "corp");
            ledger.commit().unwrap();
        }
    }
    cfg.path
}

#[test]
fn what_the_writer_wrote_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let path = populated(dir.path());
    let report = verify_path(&path);
    assert!(report.ok(), "{:#?}", report.problems);
    // tool_calls, rule events, blobs, events: all of them accounted for.
    assert_eq!(report.chained_rows[0], 30);
    assert_eq!(report.chained_rows[1], 40);
    assert!(report.chained_rows[2] > 0);
    assert_eq!(report.chained_rows[3], 31);
    assert_eq!(report.legacy_rows, [0, 0, 0, 0]);
}

/// The writer hashes a row through a fixed buffer, feeding SHA-256 directly what does not
/// fit: rows whose columns end just before, at and just after the buffer's end, or span it
/// several times, must hash to what `verify` recomputes from the row as stored.
#[test]
fn rows_of_every_width_around_the_hashers_buffer_verify() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LedgerConfig {
        preview_bytes: 8192,
        ..config(dir.path())
    };
    let mut ledger = Ledger::open(&cfg).unwrap();
    for width in (0..40).chain(380..560).chain([1023, 1024, 1025, 4000]) {
        let id = ledger.new_call_id();
        let args = "a".repeat(width);
        ledger.stage_call(&start(id, args.as_bytes()));
        ledger.commit().unwrap();
        let response = "r".repeat(width);
        ledger.stage_call_end(id, &end(response.as_bytes()));
        ledger.commit().unwrap();
    }
    drop(ledger);
    assert_verifies(&cfg.path);
}

/// A call opened before the writer closed and ended by the next one: its outcome's row
/// is read back to be hashed.
#[test]
fn an_outcome_after_a_restart_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let id = {
        let mut ledger = Ledger::open(&cfg).unwrap();
        let id = ledger.new_call_id();
        ledger.stage_call(&start(id, b"{}"));
        ledger.commit().unwrap();
        id
    };
    let mut ledger = Ledger::open(&cfg).unwrap();
    ledger.stage_call_end(id, &end(b"{}"));
    ledger.commit().unwrap();
    drop(ledger);
    assert_verifies(&cfg.path);
}

/// Runs `attack` with SQLite on a copy of a populated ledger and returns what verify says.
fn attacked(attack: &str) -> Report {
    let dir = tempfile::tempdir().unwrap();
    let path = populated(dir.path());
    assert_verifies(&path);
    raw(&path).execute_batch(attack).unwrap();
    let report = verify_path(&path);
    assert!(!report.ok(), "verify passed after: {attack}");
    report
}

fn first(report: &Report) -> String {
    let p = &report.problems[0];
    format!("group {:?}: {}", p.group, p.what)
}

#[test]
fn an_edited_byte_is_named() {
    let report = attacked("UPDATE tool_calls SET principal = 'uid:1001' WHERE id = 5");
    let text = first(&report);
    assert!(text.contains("tool_calls id 5"), "{text}");
    assert!(text.contains("does not match"), "{text}");
    // Every column counts, texts and numbers alike, and every chained table.
    for attack in [
        "UPDATE tool_calls SET duration_us = duration_us + 1 WHERE id = 4",
        "UPDATE tool_calls SET decision = 'allowed' WHERE id = 5",
        "UPDATE tool_calls SET arguments = replace(arguments, 'call', 'cell') WHERE id = 9",
        "UPDATE security_rule_events SET action = 'allow' WHERE call_id = 3",
        "UPDATE events SET detail = '{\"conn\":99}' WHERE id = 7",
        "UPDATE event_body_blobs SET body = CAST('x' AS BLOB) \
         WHERE rowid = (SELECT min(rowid) FROM event_body_blobs)",
        "UPDATE tool_calls SET response_preview = NULL WHERE id = 2",
    ] {
        attacked(attack);
    }
}

#[test]
fn a_deleted_row_is_named() {
    let report = attacked("DELETE FROM tool_calls WHERE id = 12");
    let text = first(&report);
    assert!(text.contains("tool_calls id 12 is missing"), "{text}");
    let report =
        attacked("DELETE FROM security_rule_events WHERE call_id = 2 AND phase = 'response'");
    let text = first(&report);
    assert!(text.contains("security_rule_events call_id 2"), "{text}");
}

#[test]
fn swapped_rows_are_named() {
    let report = attacked(
        "UPDATE tool_calls SET principal = CASE id WHEN 6 THEN (SELECT principal FROM \
         tool_calls WHERE id = 7) ELSE 'uid:6' END WHERE id IN (6, 7); \
         UPDATE tool_calls SET id = -6 WHERE id = 6; UPDATE tool_calls SET id = 6 WHERE id = 7; \
         UPDATE tool_calls SET id = 7 WHERE id = -6;",
    );
    let all = format!("{:#?}", report.problems);
    assert!(all.contains("tool_calls id 6"), "{all}");
    assert!(all.contains("tool_calls id 7"), "{all}");
    // Swapping whole rows but keeping their ids is caught the same way.
    attacked(
        "CREATE TEMP TABLE t AS SELECT * FROM events WHERE id IN (3, 4); \
         UPDATE events SET detail = (SELECT detail FROM t WHERE id = 4), ts_ms = \
         (SELECT ts_ms FROM t WHERE id = 4) WHERE id = 3; \
         UPDATE events SET detail = (SELECT detail FROM t WHERE id = 3), ts_ms = \
         (SELECT ts_ms FROM t WHERE id = 3) WHERE id = 4;",
    );
    // Swapping two groups' records.
    attacked(
        "CREATE TEMP TABLE g AS SELECT * FROM ledger_chain WHERE seq IN (5, 6); \
         UPDATE ledger_chain SET records = (SELECT records FROM g WHERE seq = 6) WHERE seq = 5; \
         UPDATE ledger_chain SET records = (SELECT records FROM g WHERE seq = 5) WHERE seq = 6;",
    );
}

#[test]
fn an_added_or_repointed_row_is_named() {
    let report = attacked(
        "INSERT INTO tool_calls (id, ts_ms, transport, principal, process_name, server_name, \
         tool_name, method, request_id, decision, bytes_received, chain_seq) \
         VALUES (1000, 1, 'unix', 'uid:0', 'x', 'local', 'echo', 'tools/call', '1', \
         'allowed', 1, 3)",
    );
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.what.contains("tool_calls id 1000")),
        "{:#?}",
        report.problems
    );
    // A row without chain_seq is not taken for a row older than the chain.
    attacked("INSERT INTO events (ts_ms, kind, detail) VALUES (1, 'connect', '{}')");
    // Rolling an outcome back to the call's start state, chain_seq included.
    attacked("UPDATE tool_calls SET chain_seq = chain_seq - 1 WHERE id = 2");
    attacked("UPDATE tool_calls SET chain_seq = chain_seq + 1 WHERE id = 2");
}

#[test]
fn edited_removed_or_truncated_groups_are_named() {
    let report = attacked("UPDATE ledger_chain SET ts_ms = ts_ms + 1 WHERE seq = 8");
    assert!(first(&report).contains("group 8"), "{}", first(&report));
    let report = attacked("DELETE FROM ledger_chain WHERE seq = 8");
    assert!(
        first(&report).contains("groups 8..8 are missing"),
        "{}",
        first(&report)
    );
    attacked("DELETE FROM ledger_chain WHERE seq = 1");
    attacked("DELETE FROM ledger_chain");
    // The last group's rows deleted, its chain row kept.
    let report = attacked(
        "DELETE FROM tool_calls WHERE chain_seq = (SELECT max(seq) FROM ledger_chain); \
         DELETE FROM events WHERE chain_seq = (SELECT max(seq) FROM ledger_chain); \
         DELETE FROM security_rule_events WHERE chain_seq = (SELECT max(seq) FROM ledger_chain);",
    );
    assert!(first(&report).contains("missing"), "{}", first(&report));
}

/// The canonical column lists are every column of their tables.
#[test]
fn canonical_columns_are_the_whole_schema() {
    let dir = tempfile::tempdir().unwrap();
    let path = populated(dir.path());
    let conn = raw(&path);
    for table in super::canonical::Table::ALL {
        let mut schema: Vec<String> = conn
            .prepare(&format!(
                "SELECT name FROM pragma_table_info('{}')",
                table.name()
            ))
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let mut canonical: Vec<String> = table.columns().split(", ").map(str::to_owned).collect();
        assert_eq!(canonical.len(), table.column_count());
        assert_eq!(canonical.last().map(String::as_str), Some("chain_seq"));
        schema.sort();
        canonical.sort();
        assert_eq!(schema, canonical, "{}", table.name());
    }
}

/// A ledger of schema version 3 (before the chain), with rows in every table.
fn version_3_ledger(path: &Path) {
    let conn = raw(path);
    conn.execute_batch("PRAGMA page_size = 1024; PRAGMA journal_mode = WAL;")
        .unwrap();
    for step in &crate::ledger::MIGRATIONS[..3] {
        conn.execute_batch(step.sql).unwrap();
    }
    conn.execute_batch(&format!(
        "PRAGMA application_id = {}; PRAGMA user_version = 3;",
        crate::ledger::APPLICATION_ID
    ))
    .unwrap();
    conn.execute_batch(
        "INSERT INTO tool_calls (id, ts_ms, transport, principal, process_name, server_name, \
           tool_name, method, request_id, decision, bytes_received, duration_us, arguments) \
         VALUES (1, 1000, 'unix', 'uid:1000', 'claude', 'local', 'echo', 'tools/call', '1', \
           'allowed', 10, 5, '{}'), \
                (2, 2000, 'unix', 'uid:1000', 'claude', 'local', 'fetch', 'tools/call', '2', \
           'denied', 10, 7, '{\"url\":\"http://169.254.169.254\"}'); \
         INSERT INTO security_rule_events (call_id, phase, seq, ts_ms, rule_id, action, layer) \
         VALUES (2, 'request', 0, 2000, 'block-metadata', 'block', 'builtin'); \
         INSERT INTO event_body_blobs (hash, body, size, truncated, first_seen_ms) \
         VALUES ('ab', CAST('body' AS BLOB), 4, 0, 1000); \
         INSERT INTO events (ts_ms, kind, detail) VALUES (500, 'reload', '{}');",
    )
    .unwrap();
}

#[test]
fn a_version_3_ledger_gets_a_chain_start_that_seals_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    version_3_ledger(&cfg.path);
    {
        let mut ledger = Ledger::open(&cfg).unwrap();
        let id = ledger.new_call_id();
        assert_eq!(id, 3);
        ledger.stage_call(&start(id, b"{}"));
        ledger.commit().unwrap();
    }
    let report = verify_path(&cfg.path);
    assert!(report.ok(), "{:#?}", report.problems);
    assert_eq!(report.legacy_rows, [2, 1, 1, 1]);
    assert!(
        report.notes.iter().any(|n| n.contains("5 rows older")),
        "{:?}",
        report.notes
    );
    let detail: String = raw(&cfg.path)
        .query_row(
            "SELECT detail FROM events WHERE kind = 'ledger_chain_start' AND chain_seq = 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let detail: serde_json::Value = serde_json::from_str(&detail).unwrap();
    assert_eq!(detail["legacy_rows"]["tool_calls"], 2);
    assert_eq!(detail["schema_version"], 4);

    // The sealed rows are covered from then on: edited, deleted or added.
    for attack in [
        "UPDATE tool_calls SET decision = 'allowed' WHERE id = 2",
        "DELETE FROM security_rule_events WHERE call_id = 2",
        "INSERT INTO events (ts_ms, kind, detail) VALUES (600, 'reload', '{}')",
        "UPDATE event_body_blobs SET body = CAST('bodY' AS BLOB)",
    ] {
        let copy = dir.path().join("copy.db");
        let _ = std::fs::remove_file(&copy);
        raw(&cfg.path)
            .execute_batch(&format!("VACUUM INTO '{}'", copy.display()))
            .unwrap();
        raw(&copy).execute_batch(attack).unwrap();
        let report = verify_path(&copy);
        assert!(!report.ok(), "verify passed after: {attack}");
        assert!(
            format!("{:?}", report.problems).contains("older than the chain"),
            "{attack}: {:#?}",
            report.problems
        );
    }
}

fn trusted(path: &Path, key: [u8; 32]) -> Report {
    verify::verify_file(
        path,
        &Options {
            trusted_key: Some(key),
            ..Options::default()
        },
    )
    .unwrap()
}

#[test]
fn the_head_is_signed_every_n_groups_and_at_close() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LedgerConfig {
        chain_flush_groups: 1,
        checkpoint_groups: 5,
        ..config(dir.path())
    };
    let key = {
        let mut ledger = Ledger::open(&cfg).unwrap();
        for i in 0..12 {
            ledger.stage_event("tick", &serde_json::json!({ "i": i }));
            ledger.commit().unwrap();
        }
        ledger.public_key()
    };
    let conn = raw(&cfg.path);
    let signed: Vec<i64> = conn
        .prepare("SELECT seq FROM ledger_checkpoints ORDER BY seq")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    // Group 1 (the chain start, signed as the chain begins), every 5 groups, the last one
    // at close.
    assert_eq!(signed, [1, 6, 11, 13], "{signed:?}");
    let report = trusted(&cfg.path, key);
    assert!(report.ok(), "{:#?}", report.problems);
    assert_eq!(report.signatures.checkpoints, 4);
    assert_eq!(report.signatures.last.map(|l| l.0), Some(13));
    // The key file is private, and the head file holds the last signed head.
    let key_path = cfg.signing_key_path();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&key_path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let head = super::anchor::read_head_file(&cfg.head_file_path())
        .unwrap()
        .unwrap();
    assert_eq!(head.seq, 13);
    assert!(head.verify_with(&key));

    // Another key: every signature fails.
    let report = trusted(&cfg.path, [7u8; 32]);
    assert!(!report.ok());
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.what.contains("the signature is not")),
        "{:#?}",
        report.problems
    );
    // A forged signature row, a re-signed group.
    let copy = dir.path().join("copy.db");
    conn.execute_batch(&format!("VACUUM INTO '{}'", copy.display()))
        .unwrap();
    raw(&copy)
        .execute_batch(
            "UPDATE ledger_checkpoints SET signed_at_ms = signed_at_ms + 1 WHERE seq = 6",
        )
        .unwrap();
    assert!(!trusted(&copy, key).ok());
}

#[test]
fn a_group_readable_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    drop(Ledger::open(&cfg).unwrap());
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        cfg.signing_key_path(),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    let err = Ledger::open(&cfg).err().expect("a readable key is refused");
    assert!(err.to_string().contains("chmod 600"), "{err}");
}

/// The database replaced by an older copy: a valid chain, shorter. The head shipped off
/// the machine, and the head file next to it, both show it.
#[test]
fn an_older_copy_fails_against_the_shipped_head() {
    let dir = tempfile::tempdir().unwrap();
    let shipped = dir.path().join("shipped.jsonl");
    let cfg = LedgerConfig {
        anchor_command: Some(vec![
            "sh".into(),
            "-c".into(),
            format!("cat >> '{}'", shipped.display()),
        ]),
        ..config(dir.path())
    };
    let write = |n: i64| {
        let mut ledger = Ledger::open(&cfg).unwrap();
        for i in 0..n {
            ledger.stage_event("tick", &serde_json::json!({ "i": i }));
            ledger.commit().unwrap();
        }
        ledger.public_key()
    };
    let key = write(3);
    let old = dir.path().join("old.db");
    raw(&cfg.path)
        .execute_batch(&format!("VACUUM INTO '{}'", old.display()))
        .unwrap();
    write(5);
    let heads: Vec<super::signing::SignedHead> = std::fs::read_to_string(&shipped)
        .unwrap()
        .lines()
        .map(|l| super::signing::SignedHead::from_json(l).unwrap())
        .collect();
    // One per close at least (the mailbox may skip one a later head covers).
    assert!(heads.len() >= 2, "{heads:?}");
    assert!(heads.iter().all(|h| h.verify_with(&key)));
    let last = heads.last().unwrap().clone();
    let with_anchor = |path: &Path| {
        verify::verify_file(
            path,
            &Options {
                trusted_key: Some(key),
                anchors: vec![last.clone()],
                ..Options::default()
            },
        )
        .unwrap()
    };
    let report = with_anchor(&cfg.path);
    assert!(report.ok(), "{:#?}", report.problems);
    // The older copy, in place of the database.
    for suffix in ["-wal", "-shm"] {
        let mut p = cfg.path.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(p);
    }
    std::fs::copy(&old, &cfg.path).unwrap();
    assert!(
        trusted(&cfg.path, key).ok(),
        "the old copy is a valid chain"
    );
    let report = with_anchor(&cfg.path);
    assert!(!report.ok());
    assert!(
        report.problems[0].what.contains("this is an older copy"),
        "{:#?}",
        report.problems
    );
    // The next gateway sees it too, and records it.
    drop(Ledger::open(&cfg).unwrap());
    let behind: String = raw(&cfg.path)
        .query_row(
            "SELECT detail FROM events WHERE kind = 'ledger_behind_signed_head'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(
        behind.contains(&format!("\"signed_seq\":{}", last.seq)),
        "{behind}"
    );
}

#[test]
fn a_failing_or_hanging_anchor_command_never_holds_the_ledger() {
    let dir = tempfile::tempdir().unwrap();
    for command in [
        vec!["false".to_string()],
        vec!["sleep".into(), "30".into()],
        vec!["/nonexistent/anchor".into()],
    ] {
        let cfg = LedgerConfig {
            anchor_command: Some(command.clone()),
            anchor_timeout_ms: 300,
            chain_flush_groups: 1,
            checkpoint_groups: 1,
            ..config(dir.path())
        };
        let started = std::time::Instant::now();
        let mut ledger = Ledger::open(&cfg).unwrap();
        for i in 0..20 {
            ledger.stage_event("tick", &serde_json::json!({ "i": i }));
            ledger.commit().unwrap();
        }
        drop(ledger);
        // Bounded by the command's timeout, not by the command (generous: a loaded machine).
        assert!(
            started.elapsed() < std::time::Duration::from_secs(15),
            "{command:?} held the ledger for {:?}",
            started.elapsed()
        );
        assert_verifies(&cfg.path);
    }
}

/// Retention moves old groups to an archive that verifies, and the live ledger starts
/// where the archive ends; a call open across the archive, and a body still used by newer
/// calls, stay live and in the chain.
#[test]
fn retention_archives_old_groups_and_both_halves_verify() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LedgerConfig {
        retain_secs: Some(1),
        retention_check_secs: 1,
        preview_bytes: 16,
        ..config(dir.path())
    };
    let archive_dir = cfg.archive_dir_path();
    let mut ledger = Ledger::open(&cfg).unwrap();
    let body = br#"{"text":"a body longer than the preview, stored as a blob"}"#;
    let mut ids = Vec::new();
    for _ in 0..50 {
        let id = ledger.new_call_id();
        ledger.stage_call(&start(id, body));
        ledger.stage_rule_event(id, 0, "ask-echo", "ask", "request", "config");
        ledger.commit().unwrap();
        ledger.stage_call_end(id, &end(b"{}"));
        ledger.commit().unwrap();
        ids.push(id);
    }
    // Open across the archive: started now, ended after.
    let open = ledger.new_call_id();
    ledger.stage_call(&start(open, b"{\"open\":true}"));
    ledger.commit().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1200));
    // Keep committing (as a live gateway does) until the archive is recorded and deleted.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut later = 0;
    loop {
        let id = ledger.new_call_id();
        // The same body again: the blob already stored belongs to a group being archived.
        ledger.stage_call(&start(id, body));
        ledger.stage_call_end(id, &end(b"{}"));
        ledger
            .commit()
            .expect("no commit fails while retention runs");
        later += 1;
        let conn = raw(&cfg.path);
        let archived: i64 = conn
            .query_row(
                "SELECT count(*) FROM events WHERE kind = 'ledger_archived'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        let oldest: i64 = conn
            .query_row("SELECT min(seq) FROM ledger_chain", [], |r| r.get(0))
            .unwrap();
        if archived > 0 && oldest > 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no archive in time");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    ledger.stage_call_end(open, &end(b"{\"late\":true}"));
    ledger
        .commit()
        .expect("the open call's outcome finds its row");
    drop(ledger);

    let conn = raw(&cfg.path);
    let live_calls: i64 = conn
        .query_row("SELECT count(*) FROM tool_calls", [], |r| r.get(0))
        .unwrap();
    let ended: Option<i64> = conn
        .query_row(
            "SELECT duration_us FROM tool_calls WHERE id = ?1",
            [open],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(ended, Some(1234));
    // The body newer calls use is still there.
    let blobs: i64 = conn
        .query_row("SELECT count(*) FROM event_body_blobs", [], |r| r.get(0))
        .unwrap();
    assert_eq!(blobs, 1);
    let report = verify_path(&cfg.path);
    assert!(report.ok(), "{:#?}", report.problems);
    assert!(
        report.notes.iter().any(|n| n.contains("archived")),
        "{:?}",
        report.notes
    );
    let with_archive = verify::verify_file(
        &cfg.path,
        &Options {
            archive_dir: Some(archive_dir.clone()),
            ..Options::default()
        },
    )
    .unwrap();
    assert!(with_archive.ok(), "{:#?}", with_archive.problems);
    let archived_rows = with_archive.signatures.archived_rows;
    assert!(archived_rows > 0);
    // Every call is in exactly one of the halves (the open one in both: its start in the
    // archive, its outcome live).
    let files = crate::ledger::retention::archive_file::list(&archive_dir).unwrap();
    let mut archived_calls = 0;
    for f in &files {
        let text = {
            use std::io::Read;
            let mut s = String::new();
            flate2::read::GzDecoder::new(std::fs::File::open(f).unwrap())
                .read_to_string(&mut s)
                .unwrap();
            s
        };
        archived_calls += text.matches("\"table\":\"tool_calls\"").count() as i64;
    }
    assert_eq!(
        archived_calls + live_calls,
        50 + 1 + later + 1,
        "{archived_calls} + {live_calls}"
    );

    // An archive edited after the fact fails, naming it.
    let first = &files[0];
    let text = {
        use std::io::Read;
        let mut s = String::new();
        flate2::read::GzDecoder::new(std::fs::File::open(first).unwrap())
            .read_to_string(&mut s)
            .unwrap();
        s
    };
    let edited = text.replacen("uid:1000", "uid:1001", 1);
    assert_ne!(edited, text);
    {
        use std::io::Write;
        let mut out = flate2::write::GzEncoder::new(
            std::fs::File::create(first).unwrap(),
            flate2::Compression::default(),
        );
        out.write_all(edited.as_bytes()).unwrap();
        out.finish().unwrap();
    }
    let report = verify::verify_file(
        &cfg.path,
        &Options {
            archive_dir: Some(archive_dir),
            ..Options::default()
        },
    )
    .unwrap();
    assert!(!report.ok());
    assert!(
        format!("{:?}", report.problems).contains("does not match what the group committed"),
        "{:#?}",
        report.problems
    );
}

/// Appends a group the way an attacker without the key can (the encoding is public): one
/// event row in group head + 1, its manifest entry, the linked hash. Returns its seq.
fn append_forged_group(path: &Path) -> i64 {
    use super::canonical::{self, Table};
    let conn = raw(path);
    let head = super::read_head(&conn).unwrap().unwrap();
    let seq = head.seq + 1;
    let ts = 1_700_000_100_000i64;
    conn.execute(
        "INSERT INTO events (ts_ms, kind, detail, chain_seq) VALUES (?1, 'connect', '{}', ?2)",
        rusqlite::params![ts, seq],
    )
    .unwrap();
    let id = conn.last_insert_rowid();
    let digest = conn
        .query_row(&Table::Events.select_by_key_sql(), [id], |row| {
            canonical::row_digest(Table::Events, row)
        })
        .unwrap();
    let mut records = Vec::new();
    canonical::push_entry(
        &mut records,
        Table::Events,
        canonical::OP_INSERT,
        &[rusqlite::types::ValueRef::Integer(id)],
        &digest,
    );
    let hash = canonical::group_hash(&head.hash, seq, ts, &records);
    conn.execute(
        "INSERT INTO ledger_chain (seq, ts_ms, records, hash) VALUES (?1, ?2, ?3, ?4)",
        rusqlite::params![seq, ts, records, &hash[..]],
    )
    .unwrap();
    seq
}

fn public_key_of(dir: &Path) -> [u8; 32] {
    super::signing::SigningKey::load(&config(dir).signing_key_path())
        .unwrap()
        .public_key()
}

/// Failed on the old code: a forged group appended to a closed ledger verified with
/// `--public-key`, and the next gateway signed over it.
#[test]
fn groups_appended_after_close_fail_verify_and_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = populated(dir.path());
    let key = public_key_of(dir.path());
    assert!(trusted(&path, key).ok());
    let forged = append_forged_group(&path);
    for report in [trusted(&path, key), verify_path(&path)] {
        assert!(!report.ok(), "the forged group verified");
        let text = first(&report);
        assert!(
            text.contains(&format!(
                "groups {forged}..{forged} come after the last valid signed"
            )),
            "{text}"
        );
    }
    let checkpoints_before: i64 = raw(&path)
        .query_row("SELECT count(*) FROM ledger_checkpoints", [], |r| r.get(0))
        .unwrap();
    // The next gateway refuses to continue it, every time (it did not mark it open).
    for _ in 0..2 {
        let err = Ledger::open(&config(dir.path()))
            .err()
            .expect("the gateway signed over a forged group");
        let text = err.to_string();
        assert!(
            text.contains(&format!("groups {forged}..{forged}")),
            "{text}"
        );
        assert!(text.contains("Refusing to continue"), "{text}");
    }
    let checkpoints_after: i64 = raw(&path)
        .query_row("SELECT count(*) FROM ledger_checkpoints", [], |r| r.get(0))
        .unwrap();
    assert_eq!(checkpoints_before, checkpoints_after, "nothing was signed");
}

/// Failed on the old code: the signatures removed, a closed ledger passed `--public-key`.
#[test]
fn removed_signatures_fail_a_closed_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let path = populated(dir.path());
    let key = public_key_of(dir.path());
    raw(&path)
        .execute_batch("DELETE FROM ledger_checkpoints")
        .unwrap();
    let report = trusted(&path, key);
    assert!(!report.ok());
    assert!(
        first(&report).contains("no valid signed checkpoint covers groups"),
        "{:#?}",
        report.problems
    );
    // The last one only: the head is unsigned.
    let dir = tempfile::tempdir().unwrap();
    let path = populated(dir.path());
    raw(&path)
        .execute_batch(
            "DELETE FROM ledger_checkpoints WHERE seq = (SELECT max(seq) FROM ledger_checkpoints)",
        )
        .unwrap();
    let report = trusted(&path, public_key_of(dir.path()));
    assert!(!report.ok());
    assert!(
        first(&report).contains("come after the last valid signed"),
        "{:#?}",
        report.problems
    );
    // The gateway refuses it too once the head file (which holds the head's signature) is
    // gone as well.
    std::fs::remove_file(config(dir.path()).head_file_path()).unwrap();
    assert!(Ledger::open(&config(dir.path())).is_err());
}

/// Failed on the old code: with `ledger_writer_state.open = 1`, rows re-pointed at a group
/// after the last one were "not written yet" for verify, and the next start sealed them
/// into a recovery group.
#[test]
fn chained_rows_pointed_past_the_chain_of_an_open_ledger_are_tampering() {
    for (attack, expected) in [
        (
            "UPDATE tool_calls SET principal = 'uid:0', decision = 'allowed', \
             chain_seq = (SELECT max(seq) + 1 FROM ledger_chain) WHERE id = 5",
            "tool_calls id 5 was written by group",
        ),
        (
            "UPDATE events SET detail = '{}', chain_seq = (SELECT max(seq) + 2 FROM ledger_chain) \
             WHERE id = 3",
            "events id 3 was written by group",
        ),
        (
            "UPDATE security_rule_events SET rule_id = 'nothing', \
             chain_seq = (SELECT max(seq) + 1 FROM ledger_chain) WHERE call_id = 2",
            "security_rule_events call_id 2",
        ),
        (
            "INSERT INTO events (id, ts_ms, kind, detail, chain_seq) \
             VALUES (-5, 0, 'connect', '{}', (SELECT max(seq) + 1 FROM ledger_chain))",
            "ids the chain already covers",
        ),
        (
            "INSERT INTO events (ts_ms, kind, detail, chain_seq) \
             VALUES (0, 'connect', '{}', (SELECT max(seq) + 5000 FROM ledger_chain))",
            "more than 4096 groups after the last",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = populated(dir.path());
        raw(&path)
            .execute_batch(&format!(
                "{attack}; UPDATE ledger_writer_state SET open = 1"
            ))
            .unwrap();
        let report = verify_path(&path);
        assert!(!report.ok(), "verify passed after {attack}");
        assert!(
            report.problems.iter().any(|p| p.what.contains(expected)),
            "{attack}: {:#?}",
            report.problems
        );
        let err = Ledger::open(&config(dir.path()))
            .err()
            .unwrap_or_else(|| panic!("recovery sealed {attack}"));
        let text = err.to_string();
        assert!(text.contains("refusing to seal"), "{text}");
        assert!(text.contains(expected), "{text}");
        let recoveries: i64 = raw(&path)
            .query_row(
                "SELECT count(*) FROM events WHERE kind = 'ledger_chain_recovered'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(recoveries, 0);
    }
}

/// What a crashed writer legitimately leaves after the chain still verifies and recovers:
/// new rows, and the outcome of a call whose start the chain holds.
#[test]
fn an_open_ledgers_unwritten_groups_still_verify_and_recover() {
    let dir = tempfile::tempdir().unwrap();
    let path = populated(dir.path());
    let conn = raw(&path);
    // As a writer that crashed before writing its last groups' chain rows leaves it: a new
    // call, a new event, and the outcome of call 3, which the chain holds only the start of
    // (populated() never ends it).
    conn.execute_batch(
        "UPDATE ledger_writer_state SET open = 1;
         INSERT INTO tool_calls (id, ts_ms, transport, principal, process_name, server_name, \
           tool_name, method, request_id, decision, bytes_received, arguments, chain_seq) \
         VALUES (1000, 1, 'unix', 'uid:1', 'p', 's', 't', 'tools/call', '1', 'pending', 1, '{}', \
           (SELECT max(seq) + 1 FROM ledger_chain));
         INSERT INTO events (ts_ms, kind, detail, chain_seq) \
         VALUES (2, 'connect', '{}', (SELECT max(seq) + 2 FROM ledger_chain));
         UPDATE tool_calls SET decision = 'allowed', duration_us = 5, \
           chain_seq = (SELECT max(seq) + 2 FROM ledger_chain) WHERE id = 3;",
    )
    .unwrap();
    let report = verify_path(&path);
    assert!(report.ok(), "{:#?}", report.problems);
    assert_eq!(report.waiting_rows, 3);
    drop(Ledger::open(&config(dir.path())).unwrap());
    let report = verify_path(&path);
    assert!(report.ok(), "{:#?}", report.problems);
    assert!(
        report
            .notes
            .iter()
            .any(|n| n.contains("recovered after an unclean stop")),
        "{:#?}",
        report.notes
    );
}

/// Failed on the old code: a `ledger_archived` event nobody archived for (added in the
/// window an open ledger leaves) made retention "resume" and delete the groups it named.
#[test]
fn a_forged_archive_event_deletes_nothing_and_fails_verify() {
    let dir = tempfile::tempdir().unwrap();
    let path = populated(dir.path());
    let conn = raw(&path);
    let head = super::read_head(&conn).unwrap().unwrap();
    let last = head.seq - 5;
    let last_hash: Vec<u8> = conn
        .query_row(
            "SELECT hash FROM ledger_chain WHERE seq = ?1",
            [last],
            |r| r.get(0),
        )
        .unwrap();
    let detail = serde_json::json!({
        "file": "ledger-000000000001-forged.jsonl.gz",
        "first_seq": 1,
        "last_seq": last,
        "prev_hash": super::canonical::hex(&super::canonical::GENESIS),
        "last_hash": super::canonical::hex(&last_hash.try_into().unwrap()),
        "rows": 10,
    })
    .to_string();
    conn.execute(
        "INSERT INTO events (ts_ms, kind, detail, chain_seq) \
         VALUES (1, 'ledger_archived', ?1, ?2)",
        rusqlite::params![detail, head.seq + 1],
    )
    .unwrap();
    conn.execute_batch("UPDATE ledger_writer_state SET open = 1")
        .unwrap();
    let count = |sql: &str| -> i64 { raw(&path).query_row(sql, [], |r| r.get(0)).unwrap() };
    let calls = count("SELECT count(*) FROM tool_calls");
    let cfg = LedgerConfig {
        retain_secs: Some(1_000_000),
        retention_check_secs: 1,
        ..config(dir.path())
    };
    let ledger = Ledger::open(&cfg).unwrap();
    // Retention's first pass runs 2 s after the start (where it resumed the deletion).
    std::thread::sleep(std::time::Duration::from_secs(5));
    drop(ledger);
    assert_eq!(count("SELECT min(seq) FROM ledger_chain"), 1);
    assert_eq!(count("SELECT count(*) FROM tool_calls"), calls);
    // verify, told where the archives are, says the recorded archive is not there.
    let report = verify::verify_file(
        &path,
        &Options {
            archive_home: Some(cfg.archive_dir_path()),
            ..Options::default()
        },
    )
    .unwrap();
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.what.contains("as archived to") && p.what.contains("which is not in")),
        "{:#?}",
        report.problems
    );
}

/// Failed on the old code: signatures were made only when the chain rows were flushed, so
/// `checkpoint_groups` below `chain_flush_groups` was not honored while groups kept coming.
#[test]
fn checkpoint_groups_holds_below_chain_flush_groups() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LedgerConfig {
        chain_flush_groups: 64,
        chain_flush_ms: 10_000,
        checkpoint_groups: 5,
        ..config(dir.path())
    };
    let mut ledger = Ledger::open(&cfg).unwrap();
    for i in 0..20 {
        ledger.stage_event("tick", &serde_json::json!({ "i": i }));
        ledger.commit().unwrap();
    }
    let signed: Vec<i64> = raw(&cfg.path)
        .prepare("SELECT seq FROM ledger_checkpoints ORDER BY seq")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    drop(ledger);
    assert_eq!(signed, [1, 6, 11, 16, 21], "{signed:?}");
}

/// A ledger left open with groups after the last signed head (a crash, or someone who set
/// `open = 1` and appended): nothing tells them apart, so the next gateway records them as
/// unvouched before its own signatures cover them. Failed on the old code (no record).
#[test]
fn an_unsigned_tail_of_an_open_ledger_is_recorded_as_unvouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = populated(dir.path());
    let forged = append_forged_group(&path);
    raw(&path)
        .execute_batch("UPDATE ledger_writer_state SET open = 1")
        .unwrap();
    drop(Ledger::open(&config(dir.path())).unwrap());
    let detail: String = raw(&path)
        .query_row(
            "SELECT detail FROM events WHERE kind = 'ledger_unsigned_tail'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(
        detail.contains(&format!("\"unsigned_groups\":[{forged},{forged}]")),
        "{detail}"
    );
    let report = verify_path(&path);
    assert!(report.ok(), "{:#?}", report.problems);
    assert!(
        report
            .notes
            .iter()
            .any(|n| n.contains("only an anchor vouches")),
        "{:#?}",
        report.notes
    );
}
