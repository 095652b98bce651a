//! The ledger schema and its forward migrations.
//!
//! `PRAGMA user_version` holds how many entries of [`MIGRATIONS`] have been applied. To
//! change the schema, append a migration; never edit or reorder a released one. Each runs in
//! its own transaction together with the `user_version` bump, so a crash mid-way leaves the
//! previous version intact. A file whose version is above `MIGRATIONS.len()` was written by
//! a newer toolwall and is refused rather than misread.

use rusqlite::{Connection, TransactionBehavior};
use std::path::Path;

use super::error::{LedgerError, LedgerErrorKind};

/// `PRAGMA application_id` of a toolwall ledger ("TWLG"), so a wrong path that points at
/// some other SQLite database is refused instead of having tables added to it.
pub const APPLICATION_ID: i32 = i32::from_be_bytes(*b"TWLG");

/// One forward step of the schema.
pub struct Migration {
    /// What the step adds, for logs and errors.
    pub what: &'static str,
    pub sql: &'static str,
}

/// Applied in order; the version of a file is how many of these it has had.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        what: "tool_calls, security_rule_events, event_body_blobs, events, tool_call_bodies",
        sql: MIGRATION_1,
    },
    Migration {
        what: "tool_pins",
        sql: MIGRATION_2,
    },
    Migration {
        what: "security_rule_events kept in call order; indexes no call needs dropped",
        sql: MIGRATION_3,
    },
    Migration {
        what: "the hash chain: chain_seq on every chained row, ledger_chain",
        sql: MIGRATION_4,
    },
];

/// The schema version this build writes.
pub fn current_version() -> u32 {
    // MIGRATIONS is a short constant list; it cannot approach u32::MAX.
    MIGRATIONS.len() as u32
}

const MIGRATION_1: &str = "
CREATE TABLE tool_calls (
    id                       INTEGER PRIMARY KEY,
    ts_ms                    INTEGER NOT NULL,
    transport                TEXT NOT NULL,
    principal                TEXT NOT NULL,
    process_name             TEXT NOT NULL,
    server_name              TEXT NOT NULL,
    tool_name                TEXT NOT NULL,
    method                   TEXT NOT NULL,
    request_id               TEXT NOT NULL,
    decision                 TEXT NOT NULL,
    policy_rule              TEXT,
    policy_reason            TEXT,
    duration_us              INTEGER,
    error_message            TEXT,
    bytes_received           INTEGER NOT NULL,
    bytes_sent               INTEGER,
    arguments                TEXT,
    response_preview         TEXT,
    request_body_hash        TEXT,
    response_body_hash       TEXT,
    rewritten_arguments_hash TEXT,
    original_response_hash   TEXT,
    approved_by              TEXT,
    decided_at_ms            INTEGER
);
CREATE INDEX tool_calls_tool ON tool_calls(server_name, tool_name, ts_ms);

CREATE TABLE security_rule_events (
    id      INTEGER PRIMARY KEY,
    call_id INTEGER NOT NULL,
    ts_ms   INTEGER NOT NULL,
    rule_id TEXT NOT NULL,
    action  TEXT NOT NULL,
    phase   TEXT NOT NULL,
    layer   TEXT NOT NULL
);
CREATE INDEX security_rule_events_call ON security_rule_events(call_id);
CREATE INDEX security_rule_events_rule ON security_rule_events(rule_id, ts_ms);

CREATE TABLE event_body_blobs (
    hash          TEXT PRIMARY KEY,
    body          BLOB NOT NULL,
    size          INTEGER NOT NULL,
    truncated     INTEGER NOT NULL,
    first_seen_ms INTEGER NOT NULL
);

CREATE TABLE events (
    id     INTEGER PRIMARY KEY,
    ts_ms  INTEGER NOT NULL,
    kind   TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX events_ts ON events(ts_ms);
CREATE INDEX events_kind ON events(kind, ts_ms);

CREATE VIEW tool_call_bodies AS
SELECT c.id                                             AS id,
       COALESCE(CAST(req.body AS TEXT), c.arguments)        AS request_body,
       COALESCE(req.truncated, 0)                           AS request_truncated,
       COALESCE(CAST(res.body AS TEXT), c.response_preview) AS response_body,
       COALESCE(res.truncated, 0)                           AS response_truncated,
       CAST(rew.body AS TEXT)                               AS rewritten_arguments,
       CAST(orig.body AS TEXT)                              AS original_response
FROM tool_calls c
LEFT JOIN event_body_blobs req  ON req.hash  = c.request_body_hash
LEFT JOIN event_body_blobs res  ON res.hash  = c.response_body_hash
LEFT JOIN event_body_blobs rew  ON rew.hash  = c.rewritten_arguments_hash
LEFT JOIN event_body_blobs orig ON orig.hash = c.original_response_hash;
";

/// Tool pins against "rug pulls" (`crate::pins`): per upstream tool, the digest of the
/// definition the operator accepted, and a different one seen since, waiting for approval.
const MIGRATION_2: &str = "
CREATE TABLE tool_pins (
    tool               TEXT PRIMARY KEY,
    server             TEXT NOT NULL,
    digest             TEXT NOT NULL,
    definition         TEXT NOT NULL,
    first_seen_ms      INTEGER NOT NULL,
    approved_ms        INTEGER NOT NULL,
    approved_by        TEXT,
    changed_digest     TEXT,
    changed_definition TEXT,
    changed_seen_ms    INTEGER
);
CREATE INDEX tool_pins_server ON tool_pins(server);
";

/// Every index a call's commit has to update is one more page written per commit, on the
/// path of every call (measured at one call in flight: the three indexes below made each
/// commit 14 → 26 µs). `security_rule_events` becomes a table clustered by call, so "the
/// rules of call N" stays a key lookup without an index of its own and a call's rule rows
/// land on the same, rightmost page; its `id` gives way to `seq`, the match's place in its
/// phase's decision. Lookups by tool or by rule scan; an operator who runs them often can
/// add an index, at that cost per call.
const MIGRATION_3: &str = "
DROP INDEX tool_calls_tool;
DROP INDEX security_rule_events_call;
DROP INDEX security_rule_events_rule;
CREATE TABLE security_rule_events_v3 (
    call_id INTEGER NOT NULL,
    phase   TEXT NOT NULL,
    seq     INTEGER NOT NULL,
    ts_ms   INTEGER NOT NULL,
    rule_id TEXT NOT NULL,
    action  TEXT NOT NULL,
    layer   TEXT NOT NULL,
    PRIMARY KEY (call_id, phase, seq)
) WITHOUT ROWID;
INSERT INTO security_rule_events_v3 (call_id, phase, seq, ts_ms, rule_id, action, layer)
SELECT call_id, phase,
       row_number() OVER (PARTITION BY call_id, phase ORDER BY id) - 1,
       ts_ms, rule_id, action, layer
FROM security_rule_events;
DROP TABLE security_rule_events;
ALTER TABLE security_rule_events_v3 RENAME TO security_rule_events;
";

/// The hash chain (`src/ledger/chain/`). Every chained row says which commit group last
/// wrote it (`chain_seq`); `ledger_chain` holds one row per group: what it wrote and the
/// hash that links it to the group before. Rows already in the file keep `chain_seq` NULL
/// and are sealed by the chain's first row when the gateway next opens the ledger. Adding
/// a column is O(1) in SQLite: no row is rewritten. `ledger_writer_state` says whether the
/// last writer closed the ledger cleanly (see `chain::recovery`); `ledger_checkpoints` holds
/// the signed heads (see `chain::signing`).
const MIGRATION_4: &str = "
ALTER TABLE tool_calls ADD COLUMN chain_seq INTEGER;
ALTER TABLE security_rule_events ADD COLUMN chain_seq INTEGER;
ALTER TABLE event_body_blobs ADD COLUMN chain_seq INTEGER;
ALTER TABLE events ADD COLUMN chain_seq INTEGER;
CREATE TABLE ledger_chain (
    seq     INTEGER PRIMARY KEY,
    ts_ms   INTEGER NOT NULL,
    records BLOB NOT NULL,
    hash    BLOB NOT NULL
);
CREATE TABLE ledger_writer_state (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    open INTEGER NOT NULL
);
CREATE TABLE ledger_checkpoints (
    seq          INTEGER PRIMARY KEY,
    signed_at_ms INTEGER NOT NULL,
    hash         BLOB NOT NULL,
    public_key   BLOB NOT NULL,
    signature    BLOB NOT NULL
);
";

fn read_i64(conn: &Connection, sql: &str, path: &Path) -> Result<i64, LedgerError> {
    conn.query_row(sql, [], |row| row.get::<_, i64>(0))
        .map_err(|e| LedgerError::new(LedgerErrorKind::Open, path, format!("{sql}: {e}")))
}

/// Reads which schema version the file has, without changing anything. Refuses a file
/// that is some other application's database, or was written by a newer toolwall.
pub fn inspect(conn: &Connection, path: &Path) -> Result<u32, LedgerError> {
    let application_id = read_i64(conn, "PRAGMA application_id", path)?;
    let found = read_i64(conn, "PRAGMA user_version", path)?;
    let objects = read_i64(conn, "SELECT count(*) FROM sqlite_schema", path)?;
    let fresh = application_id == 0 && found == 0 && objects == 0;
    if !fresh && application_id != i64::from(APPLICATION_ID) {
        return Err(LedgerError::new(
            LedgerErrorKind::Open,
            path,
            format!(
                "not a toolwall ledger (application_id {application_id}, user_version {found}, \
                 {objects} schema objects); refusing to touch it"
            ),
        ));
    }
    let known = current_version();
    let found = u32::try_from(found).map_err(|_| {
        LedgerError::new(
            LedgerErrorKind::Open,
            path,
            format!("invalid schema version {found}"),
        )
    })?;
    if found > known {
        return Err(LedgerError::new(
            LedgerErrorKind::SchemaTooNew,
            path,
            format!(
                "schema version {found} is newer than this toolwall knows ({known}); \
                 use a newer toolwall or another ledger path"
            ),
        ));
    }
    Ok(found)
}

/// Brings a file at version `found` (from [`inspect`]) to [`current_version`].
pub fn migrate(conn: &mut Connection, path: &Path, found: u32) -> Result<(), LedgerError> {
    apply(conn, path, found, MIGRATIONS)
}

/// Applies `steps[found..]`, each in its own transaction with its version bump.
fn apply(
    conn: &mut Connection,
    path: &Path,
    found: u32,
    steps: &[Migration],
) -> Result<(), LedgerError> {
    for (index, step) in steps.iter().enumerate().skip(found as usize) {
        let target = index + 1;
        let fail = |e: rusqlite::Error| {
            LedgerError::new(
                LedgerErrorKind::Migrate,
                path,
                format!("migration to schema version {target} ({}): {e}", step.what),
            )
        };
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(fail)?;
        tx.execute_batch(step.sql).map_err(fail)?;
        // Both header fields are part of the transaction.
        tx.execute_batch(&format!(
            "PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {target};"
        ))
        .map_err(fail)?;
        tx.commit().map_err(fail)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(conn: &Connection) -> i64 {
        conn.query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap()
    }

    fn has_table(conn: &Connection, name: &str) -> bool {
        conn.query_row(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = ?1",
            [name],
            |r| r.get::<_, i64>(0),
        )
        .unwrap()
            == 1
    }

    /// Version 3 rebuilds `security_rule_events` clustered by call: every row survives,
    /// numbered in its call and phase in the order it was written, and no index a call's
    /// commit would have to update is left.
    #[test]
    fn version_3_keeps_every_rule_event_in_call_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let mut conn = Connection::open(&path).unwrap();
        apply(&mut conn, &path, 0, &MIGRATIONS[..2]).unwrap();
        conn.execute_batch(
            "INSERT INTO security_rule_events (call_id, ts_ms, rule_id, action, phase, layer)
             VALUES (7, 1, 'a', 'allow', 'request', 'config'),
                    (8, 2, 'b', 'block', 'request', 'corp'),
                    (7, 3, 'c', 'block', 'response', 'builtin'),
                    (7, 1, 'd', 'ask', 'request', 'config');",
        )
        .unwrap();
        apply(&mut conn, &path, 2, &MIGRATIONS[..3]).unwrap();
        assert_eq!(version(&conn), 3);
        let rows: Vec<(i64, String, i64, String)> = conn
            .prepare("SELECT call_id, phase, seq, rule_id FROM security_rule_events")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let row = |c: i64, p: &str, s: i64, r: &str| (c, p.to_string(), s, r.to_string());
        assert_eq!(
            rows,
            [
                row(7, "request", 0, "a"),
                row(7, "request", 1, "d"),
                row(7, "response", 0, "c"),
                row(8, "request", 0, "b"),
            ]
        );
        let indexes: Vec<String> = conn
            .prepare(
                "SELECT name FROM sqlite_schema WHERE type = 'index' \
                 AND tbl_name IN ('tool_calls', 'security_rule_events') \
                 AND name NOT LIKE 'sqlite_autoindex%'",
            )
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(indexes.is_empty(), "left: {indexes:?}");
        // The call's rows are found by key, not by a scan.
        let plan: String = conn
            .query_row(
                "EXPLAIN QUERY PLAN SELECT * FROM security_rule_events WHERE call_id = 7",
                [],
                |r| r.get(3),
            )
            .unwrap();
        assert!(plan.contains("PRIMARY KEY"), "{plan}");
    }

    #[test]
    fn an_appended_migration_runs_once_and_a_failing_one_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let mut conn = Connection::open(&path).unwrap();
        let found = inspect(&conn, &path).unwrap();
        assert_eq!(found, 0);
        migrate(&mut conn, &path, found).unwrap();
        assert_eq!(version(&conn), i64::from(current_version()));

        // A later release appends a step: only that step runs on an existing file.
        let later: Vec<Migration> = MIGRATIONS
            .iter()
            .map(|m| Migration {
                what: m.what,
                sql: m.sql,
            })
            .chain([Migration {
                what: "pins",
                sql: "CREATE TABLE pins (tool TEXT PRIMARY KEY, digest TEXT NOT NULL);",
            }])
            .collect();
        let found = inspect(&conn, &path).unwrap();
        apply(&mut conn, &path, found, &later).unwrap();
        assert_eq!(version(&conn), later.len() as i64);
        assert!(has_table(&conn, "pins"));
        // This build does not know that version: the file is now refused.
        let err = inspect(&conn, &path).unwrap_err();
        assert_eq!(err.kind(), LedgerErrorKind::SchemaTooNew);

        // A step that fails half-way leaves the previous version intact.
        let broken: Vec<Migration> = later
            .iter()
            .map(|m| Migration {
                what: m.what,
                sql: m.sql,
            })
            .chain([Migration {
                what: "tokens",
                sql: "CREATE TABLE tokens (name TEXT); CREATE TABLE pins (again TEXT);",
            }])
            .collect();
        let err = apply(&mut conn, &path, later.len() as u32, &broken).unwrap_err();
        assert_eq!(err.kind(), LedgerErrorKind::Migrate);
        assert!(err.to_string().contains("tokens"), "{err}");
        assert_eq!(version(&conn), later.len() as i64);
        assert!(!has_table(&conn, "tokens"));
    }
}
