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
pub const MIGRATIONS: &[Migration] = &[Migration {
    what: "tool_calls, security_rule_events, event_body_blobs, events",
    sql: MIGRATION_1,
}];

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
CREATE INDEX tool_calls_ts ON tool_calls(ts_ms);
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
";

fn read_i64(conn: &Connection, sql: &str, path: &Path) -> Result<i64, LedgerError> {
    conn.query_row(sql, [], |row| row.get::<_, i64>(0))
        .map_err(|e| LedgerError::new(LedgerErrorKind::Open, path, format!("{sql}: {e}")))
}

/// Brings the file to [`current_version`]. Returns the version found before migrating.
pub fn migrate(conn: &mut Connection, path: &Path) -> Result<u32, LedgerError> {
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
    for (index, step) in MIGRATIONS.iter().enumerate().skip(found as usize) {
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
    Ok(found)
}
