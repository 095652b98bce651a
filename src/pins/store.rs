//! The `tool_pins` table of the ledger database (schema migration 2).
//!
//! The gateway opens its own connection to the ledger file for pins (after `Ledger::open`
//! created and migrated it): pin writes are rare (a new tool, a change, an approval), and
//! keeping them apart from the per-turn ledger commit means a pin is on disk before the
//! catalog shows the tool it protects. WAL mode lets both connections work on one file.
//! `toolwall pins list` can also read the table without the daemon ([`PinStore::open_read_only`]).

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use std::path::Path;
use std::time::Duration;

/// Milliseconds a pin write waits for the ledger's write lock.
pub const PIN_BUSY_TIMEOUT: Duration = Duration::from_millis(2000);

/// A different definition seen since the approved one.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PinChange {
    pub digest: String,
    pub definition: String,
    pub seen_ms: i64,
}

/// One row of `tool_pins`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PinRecord {
    /// `server__tool`.
    pub tool: String,
    pub server: String,
    /// Digest of the approved definition.
    pub digest: String,
    /// The approved pinned fields, canonical JSON.
    pub definition: String,
    pub first_seen_ms: i64,
    pub approved_ms: i64,
    /// Who approved the current definition; none when it was pinned on first sight.
    pub approved_by: Option<String>,
    pub changed: Option<PinChange>,
}

#[derive(Debug)]
pub struct PinStore {
    conn: Connection,
}

fn err(what: &str, e: rusqlite::Error) -> String {
    format!("pins: {what}: {e}")
}

const COLUMNS: &str = "tool, server, digest, definition, first_seen_ms, approved_ms, \
    approved_by, changed_digest, changed_definition, changed_seen_ms";

fn record(row: &rusqlite::Row) -> rusqlite::Result<PinRecord> {
    let changed_digest: Option<String> = row.get(7)?;
    let changed = match changed_digest {
        Some(digest) => Some(PinChange {
            digest,
            definition: row.get::<_, Option<String>>(8)?.unwrap_or_default(),
            seen_ms: row.get::<_, Option<i64>>(9)?.unwrap_or(0),
        }),
        None => None,
    };
    Ok(PinRecord {
        tool: row.get(0)?,
        server: row.get(1)?,
        digest: row.get(2)?,
        definition: row.get(3)?,
        first_seen_ms: row.get(4)?,
        approved_ms: row.get(5)?,
        approved_by: row.get(6)?,
        changed,
    })
}

impl PinStore {
    /// Open the ledger file for pin writes. The file must already be a migrated ledger
    /// (open it with `Ledger::open` first).
    pub fn open(ledger_path: &Path) -> Result<PinStore, String> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        Self::open_with(ledger_path, flags)
    }

    /// Open read-only (the CLI without the daemon).
    pub fn open_read_only(ledger_path: &Path) -> Result<PinStore, String> {
        if !ledger_path.exists() {
            return Err(format!(
                "pins: no ledger at {} (run the gateway first, or pass --ledger FILE)",
                ledger_path.display()
            ));
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        Self::open_with(ledger_path, flags)
    }

    fn open_with(ledger_path: &Path, flags: OpenFlags) -> Result<PinStore, String> {
        let conn = Connection::open_with_flags(ledger_path, flags)
            .map_err(|e| err(&format!("open {}", ledger_path.display()), e))?;
        conn.busy_timeout(PIN_BUSY_TIMEOUT)
            .map_err(|e| err("busy_timeout", e))?;
        let has_table: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'tool_pins'",
                [],
                |r| r.get(0),
            )
            .map_err(|e| err("reading the schema", e))?;
        if has_table != 1 {
            return Err(format!(
                "pins: {} has no tool_pins table (not a ledger of this toolwall, or not migrated yet)",
                ledger_path.display()
            ));
        }
        Ok(PinStore { conn })
    }

    /// Every pin, by tool name.
    pub fn load_all(&self) -> Result<Vec<PinRecord>, String> {
        let mut stmt = self
            .conn
            .prepare(&format!("SELECT {COLUMNS} FROM tool_pins ORDER BY tool"))
            .map_err(|e| err("reading pins", e))?;
        let rows = stmt
            .query_map([], record)
            .map_err(|e| err("reading pins", e))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(|e| err("reading pins", e))
    }

    pub fn get(&self, tool: &str) -> Result<Option<PinRecord>, String> {
        self.conn
            .query_row(
                &format!("SELECT {COLUMNS} FROM tool_pins WHERE tool = ?1"),
                [tool],
                record,
            )
            .optional()
            .map_err(|e| err("reading a pin", e))
    }

    /// Pin a tool seen for the first time.
    pub fn insert(&self, r: &PinRecord) -> Result<(), String> {
        self.conn
            .execute(
                "INSERT INTO tool_pins (tool, server, digest, definition, first_seen_ms, approved_ms, approved_by) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![r.tool, r.server, r.digest, r.definition, r.first_seen_ms, r.approved_ms, r.approved_by],
            )
            .map(drop)
            .map_err(|e| err("storing a pin", e))
    }

    /// Record a different definition (or clear it with `None`: the upstream went back to
    /// the approved one).
    pub fn set_change(&self, tool: &str, change: Option<&PinChange>) -> Result<(), String> {
        self.conn
            .execute(
                "UPDATE tool_pins SET changed_digest = ?2, changed_definition = ?3, changed_seen_ms = ?4 \
                 WHERE tool = ?1",
                params![
                    tool,
                    change.map(|c| c.digest.as_str()),
                    change.map(|c| c.definition.as_str()),
                    change.map(|c| c.seen_ms)
                ],
            )
            .map(drop)
            .map_err(|e| err("recording a change", e))
    }

    /// Make the waiting change the approved definition. Returns the updated record.
    pub fn approve(&self, tool: &str, by: &str, now_ms: i64) -> Result<PinRecord, String> {
        let Some(current) = self.get(tool)? else {
            return Err(format!("no pinned tool is named {tool}"));
        };
        let Some(change) = current.changed.clone() else {
            return Err(format!("{tool} has no change waiting for approval"));
        };
        // Approve exactly the change that was listed: the WHERE clause fails if another
        // change replaced it meanwhile.
        let n = self
            .conn
            .execute(
                "UPDATE tool_pins SET digest = changed_digest, definition = changed_definition, \
                 approved_ms = ?2, approved_by = ?3, changed_digest = NULL, changed_definition = NULL, \
                 changed_seen_ms = NULL WHERE tool = ?1 AND changed_digest = ?4",
                params![tool, now_ms, by, change.digest],
            )
            .map_err(|e| err("approving", e))?;
        if n != 1 {
            return Err(format!(
                "{tool} changed again while being approved; list the pins again"
            ));
        }
        self.get(tool)?
            .ok_or_else(|| format!("{tool} vanished while being approved"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{Ledger, LedgerConfig};

    fn ledger() -> (tempfile::TempDir, std::path::PathBuf, Ledger) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let cfg = LedgerConfig {
            path: path.clone(),
            ..LedgerConfig::default()
        };
        let ledger = Ledger::open(&cfg).unwrap();
        (dir, path, ledger)
    }

    fn rec(tool: &str) -> PinRecord {
        PinRecord {
            tool: tool.into(),
            server: "s".into(),
            digest: "d1".into(),
            definition: "{}".into(),
            first_seen_ms: 1,
            approved_ms: 1,
            approved_by: None,
            changed: None,
        }
    }

    #[test]
    fn pin_change_approve_round_trip_beside_the_ledger() {
        let (_dir, path, mut ledger) = ledger();
        let store = PinStore::open(&path).unwrap();
        store.insert(&rec("s__a")).unwrap();
        assert!(store.insert(&rec("s__a")).is_err(), "one pin per tool");
        // The ledger's own writer keeps working beside the pin connection.
        ledger.stage_event("test", &serde_json::json!({}));
        ledger.commit().unwrap();
        let change = PinChange {
            digest: "d2".into(),
            definition: "{\"x\":1}".into(),
            seen_ms: 5,
        };
        store.set_change("s__a", Some(&change)).unwrap();
        assert_eq!(store.get("s__a").unwrap().unwrap().changed, Some(change));
        let approved = store.approve("s__a", "admin uid:0", 9).unwrap();
        assert_eq!(approved.digest, "d2");
        assert_eq!(approved.approved_by.as_deref(), Some("admin uid:0"));
        assert!(approved.changed.is_none());
        assert!(
            store
                .approve("s__a", "x", 10)
                .unwrap_err()
                .contains("no change")
        );
        assert!(
            store
                .approve("s__zz", "x", 10)
                .unwrap_err()
                .contains("no pinned tool")
        );
        let ro = PinStore::open_read_only(&path).unwrap();
        assert_eq!(ro.load_all().unwrap().len(), 1);
        assert!(ro.insert(&rec("s__b")).is_err(), "read-only");
    }

    #[test]
    fn a_file_without_the_table_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("other.db");
        Connection::open(&path)
            .unwrap()
            .execute_batch("CREATE TABLE x (a)")
            .unwrap();
        assert!(PinStore::open(&path).unwrap_err().contains("tool_pins"));
        assert!(PinStore::open_read_only(&dir.path().join("none.db")).is_err());
    }
}
