//! Ledger tests on real SQLite files, a real competing connection and a real killed process.

use super::*;
use rusqlite::{Connection, OptionalExtension};
use sha2::{Digest, Sha256};
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

fn config(dir: &Path) -> LedgerConfig {
    LedgerConfig {
        path: dir.join("state").join("ledger.db"),
        ..LedgerConfig::default()
    }
}

fn sha_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A second, independent connection, as an operator's `sqlite3` would be.
fn raw(path: &Path) -> Connection {
    Connection::open(path).unwrap()
}

fn count(conn: &Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
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
        decision: decision::ALLOWED,
        policy_rule: Some("allow-local"),
        policy_reason: Some("local tools are allowed"),
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
        approved_by: None,
        decided_at_ms: None,
    }
}

#[test]
fn open_creates_private_dir_and_file_with_current_schema() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let ledger = Ledger::open(&cfg).unwrap();
    assert_eq!(ledger.path(), cfg.path);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(cfg.path.parent().unwrap()), 0o700);
    assert_eq!(mode(&cfg.path), 0o600);
    assert_eq!(mode(&lock_path(&cfg.path)), 0o600);
    let wal = cfg.path.with_extension("db-wal");
    assert!(wal.exists(), "WAL file expected next to the ledger");
    assert_eq!(mode(&wal), 0o600);

    let conn = raw(&cfg.path);
    let version: u32 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, schema_version());
    assert_eq!(version as usize, MIGRATIONS.len());
    let app: i32 = conn
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .unwrap();
    assert_eq!(app, APPLICATION_ID);
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    for table in [
        "tool_calls",
        "security_rule_events",
        "event_body_blobs",
        "events",
    ] {
        let n = conn
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = ?1",
                [table],
                |r| r.get::<_, i64>(0),
            )
            .unwrap();
        assert_eq!(n, 1, "table {table}");
    }
    for index in ["events_ts", "events_kind"] {
        let plan_uses = conn
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND name = ?1",
                [index],
                |r| r.get::<_, i64>(0),
            )
            .unwrap();
        assert_eq!(plan_uses, 1, "index {index}");
    }
}

#[test]
fn reopen_keeps_rows_and_continues_call_ids() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let mut ledger = Ledger::open(&cfg).unwrap();
    let first = ledger.new_call_id();
    let second = ledger.new_call_id();
    assert_eq!((first, second), (1, 2));
    ledger.stage_call(&start(first, b"{}"));
    ledger.stage_call(&start(second, b"{}"));
    ledger.commit().unwrap();
    drop(ledger);

    let mut ledger = Ledger::open(&cfg).unwrap();
    assert_eq!(ledger.new_call_id(), 3);
    drop(ledger);
    let conn = raw(&cfg.path);
    assert_eq!(count(&conn, "SELECT count(*) FROM tool_calls"), 2);
    let version: u32 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, schema_version());
}

#[test]
fn an_empty_file_is_migrated_from_version_zero() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    std::fs::create_dir_all(cfg.path.parent().unwrap()).unwrap();
    std::fs::write(&cfg.path, b"").unwrap();
    let ledger = Ledger::open(&cfg).unwrap();
    drop(ledger);
    let version: u32 = raw(&cfg.path)
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, schema_version());
}

#[test]
fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    drop(Ledger::open(&cfg).unwrap());
    let newer = schema_version() + 1;
    raw(&cfg.path)
        .execute_batch(&format!("PRAGMA user_version = {newer}"))
        .unwrap();
    let err = Ledger::open(&cfg)
        .err()
        .expect("newer schema must be refused");
    assert_eq!(err.kind(), LedgerErrorKind::SchemaTooNew);
    let text = err.to_string();
    assert!(text.contains(&cfg.path.display().to_string()), "{text}");
    assert!(text.contains(&format!("schema version {newer}")), "{text}");
    // Refusing changed nothing.
    let version: u32 = raw(&cfg.path)
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, newer);
}

#[test]
fn another_applications_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    std::fs::create_dir_all(cfg.path.parent().unwrap()).unwrap();
    raw(&cfg.path)
        .execute_batch("CREATE TABLE photos (id INTEGER PRIMARY KEY, name TEXT)")
        .unwrap();
    let err = Ledger::open(&cfg)
        .err()
        .expect("foreign database must be refused");
    assert_eq!(err.kind(), LedgerErrorKind::Open);
    assert!(err.to_string().contains("not a toolwall ledger"), "{err}");
    // Refused before anything was changed, journal mode included.
    let mode: String = raw(&cfg.path)
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "delete");
    assert_eq!(
        count(
            &raw(&cfg.path),
            "SELECT count(*) FROM sqlite_schema WHERE name = 'tool_calls'"
        ),
        0
    );
}

#[test]
fn a_file_that_is_not_sqlite_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    std::fs::create_dir_all(cfg.path.parent().unwrap()).unwrap();
    std::fs::write(&cfg.path, vec![0x5a; 8192]).unwrap();
    let err = Ledger::open(&cfg).err().expect("garbage must be refused");
    assert_eq!(err.kind(), LedgerErrorKind::Open);
    assert!(err.to_string().contains(&cfg.path.display().to_string()));
}

#[test]
fn a_second_writer_is_refused_until_the_first_closes() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let first = Ledger::open(&cfg).unwrap();
    let err = Ledger::open(&cfg)
        .err()
        .expect("second writer must be refused");
    assert_eq!(err.kind(), LedgerErrorKind::Locked);
    assert!(err.to_string().contains("another process"), "{err}");
    drop(first);
    Ledger::open(&cfg).unwrap();
}

#[test]
fn bad_limits_are_config_errors() {
    let dir = tempfile::tempdir().unwrap();
    for cfg in [
        LedgerConfig {
            max_staged_rows: 0,
            ..config(dir.path())
        },
        LedgerConfig {
            max_staged_bytes: 1000,
            ..config(dir.path())
        },
        LedgerConfig {
            body_cap_bytes: usize::MAX,
            ..config(dir.path())
        },
        LedgerConfig {
            wal_restart_bytes: 4096,
            ..config(dir.path())
        },
        LedgerConfig {
            busy_timeout_ms: u64::MAX,
            ..config(dir.path())
        },
        LedgerConfig {
            chain_flush_groups: 0,
            ..config(dir.path())
        },
        LedgerConfig {
            chain_flush_ms: u64::MAX,
            ..config(dir.path())
        },
        LedgerConfig {
            checkpoint_groups: 0,
            ..config(dir.path())
        },
        LedgerConfig {
            checkpoint_secs: u64::MAX,
            ..config(dir.path())
        },
        LedgerConfig {
            anchor_command: Some(vec![]),
            ..config(dir.path())
        },
        LedgerConfig {
            anchor_timeout_ms: u64::MAX,
            ..config(dir.path())
        },
        LedgerConfig {
            retention_batch_rows: 0,
            ..config(dir.path())
        },
        LedgerConfig {
            retention_check_secs: 0,
            ..config(dir.path())
        },
    ] {
        let err = Ledger::open(&cfg).err().expect("must be refused");
        assert_eq!(err.kind(), LedgerErrorKind::Config, "{err}");
        assert!(err.to_string().contains("ledger."), "{err}");
    }
}

#[test]
fn a_full_call_lifecycle_fills_every_column() {
    call_lifecycle(false);
}

#[test]
fn a_full_call_lifecycle_with_every_body_as_blob() {
    call_lifecycle(true);
}

fn call_lifecycle(blob_every_body: bool) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LedgerConfig {
        blob_every_body,
        ..config(dir.path())
    };
    let mut ledger = Ledger::open(&cfg).unwrap();
    // Arguments and response fit their previews: blobs only with blob_every_body.
    let small_blobs = if blob_every_body { 1 } else { 0 };
    let id = ledger.new_call_id();
    let arguments = br#"{"text":"rm -rf /"}"#;
    let rewritten = br#"{"text":"ls /"}"#;
    let response = br#"{"content":[{"type":"text","text":"refused"}],"isError":true}"#;
    let original = br#"{"content":[{"type":"text","text":"secret"}]}"#;
    let call = CallStart {
        decision: decision::PENDING,
        policy_rule: Some("ask-shell"),
        policy_reason: Some("shell commands need a human"),
        request_id: "\"req-1\"",
        ..start(id, arguments)
    };
    ledger.stage_call(&call);
    ledger.stage_rule_event(id, 0, "ask-shell", "ask", "request", "config");
    ledger.stage_rule_event(id, 1, "rewrite-rm", "rewrite", "request", "corp");
    // Call row, two rule events, maybe the arguments blob.
    assert_eq!(ledger.staged(), 3 + small_blobs);
    assert_eq!(ledger.commit().unwrap(), 3 + small_blobs);
    assert_eq!(ledger.staged(), 0);

    let conn = raw(&cfg.path);
    let pending: (String, Option<i64>, Option<String>) = conn
        .query_row(
            "SELECT decision, duration_us, response_preview FROM tool_calls WHERE id = ?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!(pending, ("pending".to_string(), None, None));

    ledger.stage_call_end(
        id,
        &CallEnd {
            decision: decision::DENIED,
            policy_rule: Some("block-secret"),
            policy_reason: Some("response holds a secret"),
            duration_us: 98_765,
            error_message: Some("blocked by policy"),
            bytes_sent: 321,
            response,
            rewritten_arguments: Some(rewritten),
            original_response: Some(original),
            approved_by: Some("uid:0"),
            decided_at_ms: Some(1_700_000_000_500),
        },
    );
    // The update, rewritten and original bodies, maybe the response blob.
    assert_eq!(ledger.staged(), 3 + small_blobs);
    assert_eq!(ledger.commit().unwrap(), 3 + small_blobs);

    let row = conn
        .query_row("SELECT * FROM tool_calls WHERE id = ?1", [id], |r| {
            let s = |name: &str| r.get::<_, Option<String>>(name);
            let i = |name: &str| r.get::<_, Option<i64>>(name);
            Ok(vec![
                ("id", i("id")?.map(|v| v.to_string())),
                ("ts_ms", i("ts_ms")?.map(|v| v.to_string())),
                ("transport", s("transport")?),
                ("principal", s("principal")?),
                ("process_name", s("process_name")?),
                ("server_name", s("server_name")?),
                ("tool_name", s("tool_name")?),
                ("method", s("method")?),
                ("request_id", s("request_id")?),
                ("decision", s("decision")?),
                ("policy_rule", s("policy_rule")?),
                ("policy_reason", s("policy_reason")?),
                ("duration_us", i("duration_us")?.map(|v| v.to_string())),
                ("error_message", s("error_message")?),
                (
                    "bytes_received",
                    i("bytes_received")?.map(|v| v.to_string()),
                ),
                ("bytes_sent", i("bytes_sent")?.map(|v| v.to_string())),
                ("arguments", s("arguments")?),
                ("response_preview", s("response_preview")?),
                ("request_body_hash", s("request_body_hash")?),
                ("response_body_hash", s("response_body_hash")?),
                ("rewritten_arguments_hash", s("rewritten_arguments_hash")?),
                ("original_response_hash", s("original_response_hash")?),
                ("approved_by", s("approved_by")?),
                ("decided_at_ms", i("decided_at_ms")?.map(|v| v.to_string())),
                ("chain_seq", i("chain_seq")?.map(|v| v.to_string())),
            ])
        })
        .unwrap();
    let text = |s: &[u8]| Some(String::from_utf8(s.to_vec()).unwrap());
    let expected = vec![
        ("id", Some(id.to_string())),
        ("ts_ms", Some(call.ts_ms.to_string())),
        ("transport", text(b"unix")),
        ("principal", text(b"uid:1000")),
        ("process_name", text(b"claude")),
        ("server_name", text(b"local")),
        ("tool_name", text(b"echo")),
        ("method", text(b"tools/call")),
        ("request_id", text(b"\"req-1\"")),
        ("decision", text(b"denied")),
        ("policy_rule", text(b"block-secret")),
        ("policy_reason", text(b"response holds a secret")),
        ("duration_us", Some("98765".into())),
        ("error_message", text(b"blocked by policy")),
        ("bytes_received", Some(call.bytes_received.to_string())),
        ("bytes_sent", Some("321".into())),
        ("arguments", text(arguments)),
        ("response_preview", text(response)),
        ("request_body_hash", Some(sha_hex(arguments))),
        ("response_body_hash", Some(sha_hex(response))),
        ("rewritten_arguments_hash", Some(sha_hex(rewritten))),
        ("original_response_hash", Some(sha_hex(original))),
        ("approved_by", text(b"uid:0")),
        ("decided_at_ms", Some("1700000000500".into())),
        // Group 1 is the chain start; the start was group 2, the outcome group 3.
        ("chain_seq", Some("3".into())),
    ];
    assert_eq!(row, expected);
    // Every column of the table is covered above.
    let columns = count(
        &conn,
        "SELECT count(*) FROM pragma_table_info('tool_calls')",
    );
    assert_eq!(columns as usize, expected.len());

    // Bodies without a preview column, and with blob_every_body all bodies, are stored
    // whole under their hash.
    let mut blobbed = vec![rewritten.as_slice(), original];
    if blob_every_body {
        blobbed.extend([&arguments[..], response]);
    }
    for body in &blobbed {
        let (stored, size, truncated): (Vec<u8>, i64, bool) = conn
            .query_row(
                "SELECT body, size, truncated FROM event_body_blobs WHERE hash = ?1",
                [sha_hex(body)],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        assert_eq!(
            (stored.as_slice(), size, truncated),
            (*body, body.len() as i64, false)
        );
    }
    assert_eq!(
        count(&conn, "SELECT count(*) FROM event_body_blobs"),
        blobbed.len() as i64
    );
    // The view gives every body whole, wherever it is stored.
    let bodies: (String, i64, String, i64, String, String) = conn
        .query_row(
            "SELECT request_body, request_truncated, response_body, response_truncated, \
             rewritten_arguments, original_response FROM tool_call_bodies WHERE id = ?1",
            [id],
            |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            },
        )
        .unwrap();
    let utf8 = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
    assert_eq!(
        bodies,
        (
            utf8(arguments),
            0,
            utf8(response),
            0,
            utf8(rewritten),
            utf8(original)
        )
    );

    let rules: Vec<(i64, String, String, String, String)> = conn
        .prepare(
            "SELECT call_id, rule_id, action, phase, layer FROM security_rule_events \
             WHERE call_id = ?1 ORDER BY phase, seq",
        )
        .unwrap()
        .query_map([id], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        rules,
        [
            (
                id,
                "ask-shell".into(),
                "ask".into(),
                "request".into(),
                "config".into()
            ),
            (
                id,
                "rewrite-rm".into(),
                "rewrite".into(),
                "request".into(),
                "corp".into()
            ),
        ]
    );
    let stamped = count(
        &conn,
        "SELECT count(*) FROM security_rule_events WHERE ts_ms > 0",
    );
    assert_eq!(stamped, 2);
}

#[test]
fn an_end_without_rule_keeps_the_rule_recorded_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let mut ledger = Ledger::open(&cfg).unwrap();
    let id = ledger.new_call_id();
    ledger.stage_call(&start(id, b"{}"));
    ledger.commit().unwrap();
    ledger.stage_call_end(id, &end(b""));
    ledger.commit().unwrap();
    let (rule, reason, response_hash): (String, String, Option<String>) = raw(&cfg.path)
        .query_row(
            "SELECT policy_rule, policy_reason, response_body_hash FROM tool_calls",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!(rule, "allow-local");
    assert_eq!(reason, "local tools are allowed");
    assert_eq!(response_hash, None, "an empty response has no blob");
}

#[test]
fn identical_bodies_are_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LedgerConfig {
        preview_bytes: 8,
        ..config(dir.path())
    };
    let mut ledger = Ledger::open(&cfg).unwrap();
    let body = br#"{"text":"same, and longer than the preview"}"#;
    for _ in 0..3 {
        let id = ledger.new_call_id();
        ledger.stage_call(&start(id, body));
    }
    // Dedupe also across commits.
    ledger.commit().unwrap();
    let id = ledger.new_call_id();
    ledger.stage_call(&start(id, body));
    ledger.commit().unwrap();
    let conn = raw(&cfg.path);
    assert_eq!(count(&conn, "SELECT count(*) FROM event_body_blobs"), 1);
    assert_eq!(
        count(
            &conn,
            &format!(
                "SELECT count(*) FROM tool_calls WHERE request_body_hash = '{}'",
                sha_hex(body)
            )
        ),
        4
    );
}

#[test]
fn long_bodies_are_capped_and_flagged() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LedgerConfig {
        body_cap_bytes: 1000,
        preview_bytes: 100,
        ..config(dir.path())
    };
    let mut ledger = Ledger::open(&cfg).unwrap();
    let long = format!(r#"{{"text":"{}"}}"#, "x".repeat(5000));
    let short = br#"{"text":"fits"}"#;
    let id = ledger.new_call_id();
    ledger.stage_call(&start(id, long.as_bytes()));
    let id2 = ledger.new_call_id();
    ledger.stage_call(&start(id2, short));
    let medium = format!(r#"{{"text":"{}"}}"#, "m".repeat(500));
    let id3 = ledger.new_call_id();
    ledger.stage_call(&start(id3, medium.as_bytes()));
    ledger.commit().unwrap();
    let conn = raw(&cfg.path);
    let (body, size, truncated): (Vec<u8>, i64, bool) = conn
        .query_row(
            "SELECT body, size, truncated FROM event_body_blobs WHERE hash = ?1",
            [sha_hex(long.as_bytes())],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!(body.len(), 1000);
    assert_eq!(body.as_slice(), &long.as_bytes()[..1000]);
    assert_eq!(size, long.len() as i64);
    assert!(truncated);
    // Fits the preview: kept there only, whole.
    assert_eq!(
        count(
            &conn,
            &format!(
                "SELECT count(*) FROM event_body_blobs WHERE hash = '{}'",
                sha_hex(short)
            )
        ),
        0
    );
    let (short_body, short_truncated): (String, bool) = conn
        .query_row(
            "SELECT request_body, request_truncated FROM tool_call_bodies WHERE id = ?1",
            [id2],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(
        (short_body.as_bytes(), short_truncated),
        (&short[..], false)
    );
    // Longer than the preview, shorter than the cap: a whole blob.
    let (medium_size, medium_truncated): (i64, bool) = conn
        .query_row(
            "SELECT size, truncated FROM event_body_blobs WHERE hash = ?1",
            [sha_hex(medium.as_bytes())],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(
        (medium_size, medium_truncated),
        (medium.len() as i64, false)
    );
    let long_truncated: bool = conn
        .query_row(
            "SELECT request_truncated FROM tool_call_bodies WHERE id = ?1",
            [id],
            |r| r.get(0),
        )
        .unwrap();
    assert!(long_truncated);
    let preview: String = conn
        .query_row(
            "SELECT arguments FROM tool_calls WHERE id = ?1",
            [id],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(preview, long[..100]);
}

#[test]
fn previews_and_texts_are_cut_on_a_char_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LedgerConfig {
        preview_bytes: 11,
        text_cap_bytes: 5,
        ..config(dir.path())
    };
    let mut ledger = Ledger::open(&cfg).unwrap();
    // {"t":" is 6 bytes, then 3-byte euros: a cut at 11 falls inside the second euro.
    let arguments = r#"{"t":"€€€€"}"#;
    let response = "🦀🦀🦀"; // 4 bytes each: a cut at 11 keeps two.
    let id = ledger.new_call_id();
    ledger.stage_call(&CallStart {
        tool_name: "ééé", // 6 bytes: a cut at 5 keeps two.
        ..start(id, arguments.as_bytes())
    });
    ledger.stage_call_end(id, &end(response.as_bytes()));
    ledger.commit().unwrap();
    let (preview, response_preview, tool): (String, String, String) = raw(&cfg.path)
        .query_row(
            "SELECT arguments, response_preview, tool_name FROM tool_calls",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!(preview, r#"{"t":"€"#);
    assert_eq!(response_preview, "🦀🦀");
    assert_eq!(tool, "éé");
}

#[test]
fn oversized_event_details_are_replaced_by_a_bounded_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LedgerConfig {
        body_cap_bytes: 200,
        text_cap_bytes: 50,
        ..config(dir.path())
    };
    let mut ledger = Ledger::open(&cfg).unwrap();
    ledger.stage_event(
        "worker_log",
        &serde_json::json!({ "line": "y".repeat(1000) }),
    );
    ledger.stage_event(
        "connect",
        &serde_json::json!({ "transport": "unix", "conn": 3 }),
    );
    ledger.commit().unwrap();
    let details: Vec<(String, String)> = raw(&cfg.path)
        .prepare("SELECT kind, detail FROM events WHERE kind != 'ledger_chain_start' ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let long: serde_json::Value = serde_json::from_str(&details[0].1).unwrap();
    assert_eq!(details[0].0, "worker_log");
    assert_eq!(long["truncated"], true);
    assert_eq!(long["size"], 1000 + r#"{"line":""}"#.len());
    assert_eq!(long["prefix"].as_str().unwrap().len(), 50);
    let short: serde_json::Value = serde_json::from_str(&details[1].1).unwrap();
    assert_eq!(short, serde_json::json!({ "transport": "unix", "conn": 3 }));
}

/// Holds SQLite's write lock from a second connection, as another writer would.
fn hold_write_lock(path: &Path) -> Connection {
    let blocker = raw(path);
    blocker
        .execute_batch("BEGIN IMMEDIATE; INSERT INTO events (ts_ms, kind, detail) VALUES (0, 'blocker', '{}');")
        .unwrap();
    blocker
}

#[test]
fn a_failed_commit_keeps_the_rows_for_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LedgerConfig {
        busy_timeout_ms: 20,
        preview_bytes: 4,
        ..config(dir.path())
    };
    let mut ledger = Ledger::open(&cfg).unwrap();
    let id = ledger.new_call_id();
    ledger.stage_call(&start(id, br#"{"a":1}"#)); // longer than the preview: a blob too
    ledger.stage_event("connect", &serde_json::json!({ "conn": 1 }));
    let blocker = hold_write_lock(&cfg.path);

    let err = ledger.commit().expect_err("commit must fail while locked");
    assert_eq!(err.kind(), LedgerErrorKind::Write);
    assert_eq!(err.dropped_rows(), 0);
    let text = err.to_string();
    assert!(text.contains(&cfg.path.display().to_string()), "{text}");
    assert!(text.contains("3 staged rows kept"), "{text}");
    assert_eq!(ledger.staged(), 3);
    // Still failing: nothing lost, nothing doubled.
    assert!(ledger.commit().is_err());
    assert_eq!(ledger.staged(), 3);

    blocker.execute_batch("ROLLBACK").unwrap();
    assert_eq!(ledger.commit().unwrap(), 3);
    assert_eq!(ledger.staged(), 0);
    let conn = raw(&cfg.path);
    assert_eq!(count(&conn, "SELECT count(*) FROM tool_calls"), 1);
    assert_eq!(count(&conn, "SELECT count(*) FROM event_body_blobs"), 1);
    assert_eq!(
        count(
            &conn,
            "SELECT count(*) FROM events WHERE kind != 'ledger_chain_start'"
        ),
        1
    );
}

#[test]
fn the_staging_bound_drops_the_oldest_rows_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LedgerConfig {
        busy_timeout_ms: 10,
        max_staged_rows: 5,
        ..config(dir.path())
    };
    let mut ledger = Ledger::open(&cfg).unwrap();
    let blocker = hold_write_lock(&cfg.path);
    for i in 0..12 {
        ledger.stage_event("tick", &serde_json::json!({ "i": i }));
    }
    assert_eq!(ledger.staged(), 5);
    assert_eq!(ledger.dropped_rows(), 7);
    let err = ledger.commit().err().unwrap();
    assert_eq!(err.kind(), LedgerErrorKind::Write);
    assert_eq!(err.dropped_rows(), 7);
    assert!(err.to_string().contains("7 dropped"), "{err}");

    blocker.execute_batch("ROLLBACK").unwrap();
    let err = ledger.commit().expect_err("lost rows must be reported");
    assert_eq!(err.kind(), LedgerErrorKind::RowsLost);
    assert_eq!(err.dropped_rows(), 7);
    assert_eq!(ledger.staged(), 0);
    // The newest five rows and one event recording the loss were written.
    let conn = raw(&cfg.path);
    let kept: Vec<i64> = conn
        .prepare("SELECT json_extract(detail, '$.i') FROM events WHERE kind = 'tick' ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(kept, [7, 8, 9, 10, 11]);
    let loss: String = conn
        .query_row(
            "SELECT detail FROM events WHERE kind = ?1",
            [EVENT_ROWS_DROPPED],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(loss, r#"{"rows":7}"#);
    // Reported once; the next commit is clean.
    assert_eq!(ledger.commit().unwrap(), 0);
    assert_eq!(ledger.dropped_rows(), 0);
}

#[test]
fn the_byte_bound_keeps_memory_bounded_while_commits_fail() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LedgerConfig {
        busy_timeout_ms: 1,
        body_cap_bytes: 64 << 10,
        max_staged_bytes: 1 << 20,
        ..config(dir.path())
    };
    let mut ledger = Ledger::open(&cfg).unwrap();
    let _blocker = hold_write_lock(&cfg.path);
    let body = vec![b'z'; 60 << 10];
    for _ in 0..100 {
        let id = ledger.new_call_id();
        ledger.stage_call(&start(id, &body));
        assert!(ledger.staged_bytes() <= cfg.max_staged_bytes);
    }
    assert!(ledger.dropped_rows() > 0);
    assert!(ledger.commit().is_err());
}

#[test]
fn a_row_sqlite_refuses_is_skipped_not_retried_forever() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let mut ledger = Ledger::open(&cfg).unwrap();
    let id = ledger.new_call_id();
    ledger.stage_call(&start(id, b"{}"));
    ledger.stage_call(&start(id, b"{}")); // a gateway bug: the same id twice
    ledger.stage_event("connect", &serde_json::json!({}));
    let err = ledger
        .commit()
        .expect_err("the refused row must be reported");
    assert_eq!(err.kind(), LedgerErrorKind::RowsLost);
    assert_eq!(err.rejected_rows(), 1);
    assert!(err.to_string().contains("UNIQUE"), "{err}");
    assert_eq!(ledger.staged(), 0);
    let conn = raw(&cfg.path);
    assert_eq!(count(&conn, "SELECT count(*) FROM tool_calls"), 1);
    assert_eq!(
        count(
            &conn,
            "SELECT count(*) FROM events WHERE kind = 'ledger_rows_rejected'"
        ),
        1
    );
    assert_eq!(
        count(&conn, "SELECT count(*) FROM events WHERE kind = 'connect'"),
        1
    );
    let id = ledger.new_call_id();
    ledger.stage_call(&start(id, b"{}"));
    assert_eq!(ledger.commit().unwrap(), 1); // the call row; its blob was already there
}

#[test]
fn an_outcome_without_its_call_row_is_reported_lost() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let mut ledger = Ledger::open(&cfg).unwrap();
    ledger.stage_call_end(99, &end(b"{}"));
    let err = ledger
        .commit()
        .expect_err("a lost outcome must be reported");
    assert_eq!(err.kind(), LedgerErrorKind::RowsLost);
    assert_eq!(err.rejected_rows(), 1);
    assert!(err.to_string().contains("no tool_calls row 99"), "{err}");
    assert_eq!(ledger.commit().unwrap(), 0);
}

#[test]
fn checkpoint_empties_the_wal() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let mut ledger = Ledger::open(&cfg).unwrap();
    for _ in 0..50 {
        let id = ledger.new_call_id();
        ledger.stage_call(&start(id, b"{}"));
    }
    ledger.commit().unwrap();
    let wal = cfg.path.with_extension("db-wal");
    assert!(std::fs::metadata(&wal).unwrap().len() > 0);
    ledger.checkpoint().unwrap();
    assert_eq!(std::fs::metadata(&wal).unwrap().len(), 0);
    assert_eq!(
        count(&raw(&cfg.path), "SELECT count(*) FROM tool_calls"),
        50
    );
}

/// A writer that commits without pause, as the gateway does under steady load, never gives a
/// passive checkpoint the moment it needs to restart the WAL: without the restart the file
/// grew by tens of MB per second here and held every frame ever written.
#[test]
fn a_steadily_written_wal_is_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LedgerConfig {
        wal_restart_bytes: 256 << 10,
        ..config(dir.path())
    };
    let mut ledger = Ledger::open(&cfg).unwrap();
    let wal = cfg.path.with_extension("db-wal");
    let arguments = br#"{"text":"a steady stream of calls, each committed twice"}"#;
    let response = br#"{"content":[{"type":"text","text":"a steady stream of calls"}]}"#;
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut calls = 0u64;
    let mut wal_max = 0u64;
    while calls < 20_000 && std::time::Instant::now() < until {
        let id = ledger.new_call_id();
        ledger.stage_call(&start(id, arguments));
        ledger
            .commit()
            .expect("a commit held back by the restart still succeeds");
        ledger.stage_call_end(id, &end(response));
        ledger.commit().unwrap();
        calls += 1;
        // A breath between calls, as the gateway's loop takes while it waits for workers
        // and agents (the checkpointer needs a moment without the write lock).
        std::thread::sleep(std::time::Duration::from_micros(20));
        if calls.is_multiple_of(128) {
            wal_max = wal_max.max(std::fs::metadata(&wal).unwrap().len());
        }
    }
    let wal_max = wal_max.max(std::fs::metadata(&wal).unwrap().len());
    // Bytes 12..16 of the WAL header count its restarts (the checkpoint sequence).
    let header = std::fs::read(&wal).unwrap();
    let restarts = u32::from_be_bytes(header[12..16].try_into().unwrap());
    assert!(
        restarts >= 2,
        "the WAL was restarted {restarts} times over {calls} calls"
    );
    // Each commit writes at least one page (plus a frame header): a WAL that is never
    // restarted holds them all. How far it grows between restarts depends on when the
    // checkpoint thread gets a CPU, so on a loaded machine only "less than all" is sure.
    let written = calls * 2 * u64::from(writer::PAGE_SIZE);
    assert!(
        wal_max < written,
        "WAL reached {wal_max} bytes for {written} bytes of frames written ({restarts} restarts)"
    );
    assert_eq!(
        count(&raw(&cfg.path), "SELECT count(*) FROM tool_calls"),
        calls as i64
    );
}

/// A reader with a transaction open pins the WAL, and a RESTART checkpoint waits for it
/// while it holds the writer's lock. That wait is kept short: otherwise an operator's long
/// query held every commit (and with it every call) back for the whole busy timeout, once
/// per checkpoint period. Measured by the longest commit against a busy timeout far above
/// anything else a commit waits for.
#[test]
fn a_long_reader_does_not_hold_commits_back() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LedgerConfig {
        wal_restart_bytes: 64 << 10,
        busy_timeout_ms: 3000,
        ..config(dir.path())
    };
    let mut ledger = Ledger::open(&cfg).unwrap();
    let arguments = br#"{"text":"calls while an operator's query runs"}"#;
    let response = br#"{"content":[{"type":"text","text":"answered"}]}"#;
    let longest = std::cell::Cell::new(std::time::Duration::ZERO);
    let call = |ledger: &mut Ledger| {
        let id = ledger.new_call_id();
        ledger.stage_call(&start(id, arguments));
        let t = std::time::Instant::now();
        ledger.commit().unwrap();
        longest.set(longest.get().max(t.elapsed()));
        ledger.stage_call_end(id, &end(response));
        let t = std::time::Instant::now();
        ledger.commit().unwrap();
        longest.set(longest.get().max(t.elapsed()));
    };
    call(&mut ledger);
    let reader = raw(&cfg.path);
    reader.execute_batch("BEGIN").unwrap();
    assert_eq!(count(&reader, "SELECT count(*) FROM tool_calls"), 1);
    let until = std::time::Instant::now() + std::time::Duration::from_millis(1500);
    while std::time::Instant::now() < until {
        call(&mut ledger);
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
    // The reader still sees its snapshot.
    assert_eq!(count(&reader, "SELECT count(*) FROM tool_calls"), 1);
    reader.execute_batch("COMMIT").unwrap();
    let longest = longest.get();
    assert!(
        longest < std::time::Duration::from_millis(1500),
        "a commit waited {longest:?} while a reader held the WAL"
    );
    // Once the reader is gone, the WAL is restarted again.
    let wal = cfg.path.with_extension("db-wal");
    let restarts = || {
        let header = std::fs::read(&wal).unwrap();
        u32::from_be_bytes(header[12..16].try_into().unwrap())
    };
    let before = restarts();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while restarts() == before && std::time::Instant::now() < until {
        call(&mut ledger);
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
    assert!(
        restarts() > before,
        "the WAL was not restarted after the reader ended"
    );
}

#[test]
fn tail_prints_the_newest_calls_last() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let mut ledger = Ledger::open(&cfg).unwrap();
    for n in 0..3 {
        let id = ledger.new_call_id();
        let args = format!(r#"{{"n":{n}}}"#);
        ledger.stage_call(&CallStart {
            process_name: if n == 2 { "evil\u{1b}[2J" } else { "claude" },
            ..start(id, args.as_bytes())
        });
        if n < 2 {
            ledger.stage_call_end(
                id,
                &CallEnd {
                    decision: if n == 1 {
                        decision::ERROR
                    } else {
                        decision::ALLOWED
                    },
                    error_message: (n == 1).then_some("worker builtin exited"),
                    ..end(br#"{"content":[]}"#)
                },
            );
        }
    }
    ledger.commit().unwrap();
    // Read while the writer is still open.
    let text = tail(&cfg.path, 2, false).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].contains("#2 error"), "{text}");
    assert!(lines[0].contains("local__echo"), "{text}");
    assert!(lines[0].contains("1.234ms"), "{text}");
    assert!(
        lines[0].contains(r#"error="worker builtin exited""#),
        "{text}"
    );
    assert!(lines[0].starts_with("2023-11-14T22:13:20.002Z"), "{text}");
    assert!(lines[1].contains("#3 allowed"), "{text}");
    assert!(lines[1].contains(r#""evil\u{1b}[2J""#), "{text}");
    assert!(
        !text.contains('\u{1b}'),
        "raw escape reached the terminal: {text}"
    );

    let json = tail(&cfg.path, 10, true).unwrap();
    let rows: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 3);
    let ids: Vec<i64> = rows.iter().map(|r| r["id"].as_i64().unwrap()).collect();
    assert_eq!(ids, [1, 2, 3]);
    let columns = count(
        &raw(&cfg.path),
        "SELECT count(*) FROM pragma_table_info('tool_calls')",
    );
    for row in &rows {
        assert_eq!(row.as_object().unwrap().len() as i64, columns);
    }
    assert_eq!(rows[1]["decision"], "error");
    assert_eq!(rows[1]["error_message"], "worker builtin exited");
    assert_eq!(rows[1]["duration_us"], 1234);
    assert_eq!(rows[2]["process_name"], "evil\u{1b}[2J");
    assert_eq!(rows[2]["duration_us"], serde_json::Value::Null);
    assert_eq!(rows[0]["arguments"], r#"{"n":0}"#);
    assert_eq!(rows[0]["request_body_hash"], sha_hex(br#"{"n":0}"#));

    assert_eq!(tail(&cfg.path, 0, true).unwrap(), "");
}

#[test]
fn tail_reads_a_closed_ledger_and_names_a_missing_one() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let mut ledger = Ledger::open(&cfg).unwrap();
    let id = ledger.new_call_id();
    ledger.stage_call(&start(id, b"{}"));
    ledger.commit().unwrap();
    drop(ledger);
    assert_eq!(tail(&cfg.path, 5, false).unwrap().lines().count(), 1);

    let missing = dir.path().join("nope.db");
    let err = tail(&missing, 5, false).err().unwrap();
    assert_eq!(err.kind(), LedgerErrorKind::Read);
    assert!(err.to_string().contains("nope.db"), "{err}");
    assert!(!missing.exists(), "tail must not create a ledger");
}

const CRASH_CHILD_ENV: &str = "TOOLWALL_LEDGER_CRASH_CHILD";

/// The child half of `rows_survive_kill_9`: commits calls in a loop and reports each
/// commit on stdout until it is killed. A no-op unless the parent set the variable.
#[test]
#[ignore = "run by rows_survive_kill_9 as a child process"]
fn crash_child_commits_until_killed() {
    let Some(path) = std::env::var_os(CRASH_CHILD_ENV) else {
        return;
    };
    let mut ledger = Ledger::open(&LedgerConfig {
        path: path.into(),
        // Chain rows wait as long as they may: the kill leaves groups without them.
        chain_flush_groups: 4096,
        chain_flush_ms: 10_000,
        ..LedgerConfig::default()
    })
    .unwrap();
    let started = std::time::Instant::now();
    let mut committed = 0u64;
    // Bounded, in case the parent is gone without killing us.
    while started.elapsed() < std::time::Duration::from_secs(60) {
        for _ in 0..16 {
            let id = ledger.new_call_id();
            let args = format!(r#"{{"call":{id}}}"#);
            ledger.stage_call(&start(id, args.as_bytes()));
            ledger.stage_call_end(id, &end(args.as_bytes()));
        }
        committed += 16;
        ledger.commit().unwrap();
        // Printed only after the commit returned: every reported call is durable.
        println!("committed {committed}");
    }
}

#[test]
fn rows_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.db");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "ledger::tests::crash_child_commits_until_killed",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CRASH_CHILD_ENV, &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let mut reported = 0u64;
    for line in stdout.lines() {
        let line = line.unwrap();
        if let Some(n) = line.strip_prefix("committed ") {
            reported = n.parse().unwrap();
            if reported >= 2000 {
                break;
            }
        }
    }
    assert!(
        reported >= 2000,
        "child stopped early after {reported} calls"
    );
    child.kill().unwrap(); // SIGKILL: no destructor, no checkpoint, maybe mid-commit
    let status = child.wait().unwrap();
    assert!(!status.success());

    // Reopening recovers from the WAL and takes the (released) writer lock.
    let mut ledger = Ledger::open(&LedgerConfig {
        path: path.clone(),
        ..LedgerConfig::default()
    })
    .unwrap();
    let conn = raw(&path);
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(integrity, "ok");
    let rows = count(&conn, "SELECT count(*) FROM tool_calls");
    assert!(
        rows as u64 >= reported,
        "{rows} rows, {reported} reported committed"
    );
    // Every committed call has its outcome: starts and ends were in the same transactions.
    assert_eq!(
        count(
            &conn,
            "SELECT count(*) FROM tool_calls WHERE duration_us IS NULL"
        ),
        0
    );
    let last_reported: Option<i64> = conn
        .query_row(
            "SELECT id FROM tool_calls WHERE id = ?1",
            [reported as i64],
            |r| r.get(0),
        )
        .optional()
        .unwrap();
    assert_eq!(last_reported, Some(reported as i64));
    assert_eq!(ledger.new_call_id(), rows + 1);
    // The groups whose chain rows were still waiting were sealed by a recovery group,
    // which says so; the whole ledger verifies up to its last committed row.
    let recovered: String = conn
        .query_row(
            "SELECT detail FROM events WHERE kind = 'ledger_chain_recovered'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let recovered: serde_json::Value = serde_json::from_str(&recovered).unwrap();
    assert_eq!(recovered["unwritten_groups"][0], 2, "{recovered}");
    assert!(
        recovered["rows"]["tool_calls"].as_i64().unwrap() >= reported as i64,
        "{recovered}"
    );
    drop(ledger);
    let report = chain::verify::verify_file(&path, &Default::default()).unwrap();
    assert!(report.ok(), "{:#?}", report.problems);
    assert_eq!(report.chained_rows[0], rows as u64);
    assert!(
        report.notes.iter().any(|n| n.contains("recover")),
        "{:?}",
        report.notes
    );
}

/// Prints what a commit costs on a real file: `cargo test --release --lib
/// ledger::tests::measure_commit_cost -- --ignored --nocapture`. Each workload gets a fresh
/// ledger; `LEDGER_MEASURE_ROUNDS=N` repeats the whole set, `LEDGER_MEASURE_ONLY=4 KiB`
/// keeps the call workloads whose label contains that text.
#[test]
#[ignore = "measurement, run by hand"]
fn measure_commit_cost() {
    let rounds: u64 = std::env::var("LEDGER_MEASURE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for round in 0..rounds {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = measure::open_in(dir.path(), false).unwrap();
        measure::commit_one_row(&mut ledger, 500).unwrap();
        let one = measure::commit_one_row(&mut ledger, 20_000).unwrap();
        println!(
            "round {round}: 1 row per commit: {:.1} us/commit ({:.1} us CPU), {:.0} commits/s",
            one.us_per_turn(),
            one.cpu_us_per_turn(),
            1e6 / one.us_per_turn()
        );
        for (label, blob_every_body, body_bytes) in [
            ("small bodies, kept in previews", false, 0),
            ("small bodies, blob_every_body", true, 0),
            ("4 KiB bodies, blobbed", false, 4096),
        ] {
            if let Ok(only) = std::env::var("LEDGER_MEASURE_ONLY")
                && !label.contains(only.as_str())
            {
                continue;
            }
            for calls in [1usize, 64, 256] {
                let dir = tempfile::tempdir().unwrap();
                let mut ledger = measure::open_in(dir.path(), blob_every_body).unwrap();
                let commits = (100_000 / calls).clamp(200, 5000) as u64;
                let m = measure::commit_calls(&mut ledger, calls, commits, body_bytes).unwrap();
                println!(
                    "round {round}: {label}: {calls} calls per commit: {:.1} us/commit, \
                     {:.1} us/turn with staging ({:.1} us CPU): {:.0} calls/s ({:.0} calls per \
                     CPU second)",
                    m.us_per_commit(),
                    m.us_per_turn(),
                    m.cpu_us_per_turn(),
                    m.calls_per_sec(),
                    m.calls as f64 / m.cpu.as_secs_f64().max(1e-9)
                );
            }
        }
    }
}
