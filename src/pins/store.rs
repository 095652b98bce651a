//! The pin store: tables of the ledger database that belong to pinning (`tool_pins`,
//! `pin_servers`, `resource_owners`), with their own versioned migrations.
//!
//! The ledger's schema (migration 2) created `tool_pins`; everything since is migrated here,
//! recorded in `pin_store_schema`, so the pin tables evolve without touching the ledger's
//! own migration list. A file whose pin schema is newer than this build knows is refused.
//!
//! Connections: the gateway's listing intake thread writes reviews in short transactions
//! (bounded chunks, so the ledger's per-turn commit never waits long); the gateway's loop
//! approves (one conditional row update) and lists. WAL mode lets them share the file.

use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};
use std::path::Path;
use std::time::{Duration, Instant};

use super::digest::SCHEME;

/// How long a pin write waits for the ledger file's write lock.
pub const PIN_BUSY_TIMEOUT: Duration = Duration::from_millis(2000);

/// Pause after each pin transaction of the listing intake. The ledger's writer retries a
/// taken lock every 100 µs; a thread that takes the lock again at once can win that race
/// for a whole listing, until the writer's wait (`ledger.busy_timeout_ms`) runs out and a
/// call is refused `ledger_unavailable`. Pausing hands the lock over between transactions.
pub const PIN_TX_PAUSE: Duration = Duration::from_millis(2);
/// Longest a review transaction of the intake goes on before it commits the tools it has
/// reviewed and leaves the rest to the next one (however large each definition).
pub const PIN_TX_BUDGET: Duration = Duration::from_millis(10);

/// Longest a pin transaction waits for the ledger's writer to have its turn.
pub const PIN_YIELD_MAX: Duration = Duration::from_secs(2);

/// Times one pin transaction is tried when the ledger file stays locked.
pub const PIN_WRITE_ATTEMPTS: u32 = 5;
/// Pause before trying again (times the attempt number).
pub const PIN_RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Whether a pin store error is the file's write lock being taken (worth trying again).
fn is_busy(e: &str) -> bool {
    e.contains("database is locked") || e.contains("database is busy")
}

/// The pin schema this build writes (`pin_store_schema.version`).
pub const PIN_SCHEMA_VERSION: i64 = 2;

/// Version 1 is `tool_pins` as the ledger's migration 2 made it. Version 2: definitions
/// may be pending without an approved one (a held new tool), the digest scheme of each pin,
/// when each tool was last listed (pruning), which servers have been listed and from where
/// (`new_tools`, renames), and who owns a resource URI.
const PIN_MIGRATION_2: &str = "
CREATE TABLE tool_pins_v2 (
    tool               TEXT PRIMARY KEY,
    server             TEXT NOT NULL,
    digest             TEXT,
    definition         TEXT,
    digest_scheme      INTEGER NOT NULL DEFAULT 2,
    first_seen_ms      INTEGER NOT NULL,
    approved_ms        INTEGER,
    approved_by        TEXT,
    changed_digest     TEXT,
    changed_definition TEXT,
    changed_seen_ms    INTEGER,
    last_seen_ms       INTEGER NOT NULL
);
INSERT INTO tool_pins_v2 (tool, server, digest, definition, digest_scheme, first_seen_ms,
    approved_ms, approved_by, changed_digest, changed_definition, changed_seen_ms, last_seen_ms)
SELECT tool, server, digest, definition, 1, first_seen_ms, approved_ms, approved_by,
    changed_digest, changed_definition, changed_seen_ms,
    max(first_seen_ms, approved_ms, coalesce(changed_seen_ms, 0))
FROM tool_pins;
DROP TABLE tool_pins;
ALTER TABLE tool_pins_v2 RENAME TO tool_pins;
CREATE INDEX tool_pins_server ON tool_pins(server);
CREATE TABLE pin_servers (
    server          TEXT PRIMARY KEY,
    origin          TEXT NOT NULL,
    first_listed_ms INTEGER NOT NULL
);
INSERT INTO pin_servers (server, origin, first_listed_ms)
SELECT server, '', min(first_seen_ms) FROM tool_pins GROUP BY server;
CREATE TABLE resource_owners (
    uri          TEXT PRIMARY KEY,
    server       TEXT NOT NULL,
    first_ms     INTEGER NOT NULL,
    last_seen_ms INTEGER NOT NULL
);
CREATE INDEX resource_owners_server ON resource_owners(server);
";

/// An approved definition.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Approved {
    pub digest: String,
    /// Canonical JSON of what the digest covers.
    pub definition: String,
    /// 2: the whole definition; 1: four fields (an old pin, upgraded when seen again).
    pub scheme: i64,
    pub approved_ms: i64,
    /// Who approved it; none when it was pinned on first sight.
    pub approved_by: Option<String>,
}

/// A definition seen and not approved: a change of an approved tool, or a held new tool.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Pending {
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
    pub approved: Option<Approved>,
    pub pending: Option<Pending>,
    pub first_seen_ms: i64,
    pub last_seen_ms: i64,
}

/// One row of `pin_servers`: a server whose tools have been listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerRecord {
    pub server: String,
    /// Where it was reached (its URL, or its command for a local server); empty when it
    /// was pinned before origins were kept.
    pub origin: String,
    pub first_listed_ms: i64,
}

#[derive(Debug)]
pub struct PinStore {
    conn: Connection,
    /// Slept after each committed transaction ([`PIN_TX_PAUSE`] for the intake).
    pause_after_commit: Option<Duration>,
}

fn err(what: &str, e: rusqlite::Error) -> String {
    format!("pins: {what}: {e}")
}

const COLUMNS: &str = "tool, server, digest, definition, digest_scheme, first_seen_ms, \
    approved_ms, approved_by, changed_digest, changed_definition, changed_seen_ms, last_seen_ms";

fn record(row: &rusqlite::Row) -> rusqlite::Result<PinRecord> {
    let digest: Option<String> = row.get(2)?;
    let approved = match digest {
        Some(digest) => Some(Approved {
            digest,
            definition: row.get::<_, Option<String>>(3)?.unwrap_or_default(),
            scheme: row.get(4)?,
            approved_ms: row.get::<_, Option<i64>>(6)?.unwrap_or(0),
            approved_by: row.get(7)?,
        }),
        None => None,
    };
    let pending = match row.get::<_, Option<String>>(8)? {
        Some(digest) => Some(Pending {
            digest,
            definition: row.get::<_, Option<String>>(9)?.unwrap_or_default(),
            seen_ms: row.get::<_, Option<i64>>(10)?.unwrap_or(0),
        }),
        None => None,
    };
    Ok(PinRecord {
        tool: row.get(0)?,
        server: row.get(1)?,
        approved,
        pending,
        first_seen_ms: row.get(5)?,
        last_seen_ms: row.get(11)?,
    })
}

fn schema_version(conn: &Connection) -> Result<i64, String> {
    let has_pins: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'tool_pins'",
            [],
            |r| r.get(0),
        )
        .map_err(|e| err("reading the schema", e))?;
    if has_pins != 1 {
        return Err(
            "has no tool_pins table (not a ledger of this toolwall, or not migrated yet)".into(),
        );
    }
    let has_meta: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'pin_store_schema'",
            [],
            |r| r.get(0),
        )
        .map_err(|e| err("reading the schema", e))?;
    if has_meta == 0 {
        return Ok(1);
    }
    conn.query_row("SELECT version FROM pin_store_schema", [], |r| r.get(0))
        .map_err(|e| err("reading pin_store_schema", e))
}

impl PinStore {
    /// Open the ledger file for pin writes, migrating the pin tables forward. The file must
    /// already be a migrated ledger (open it with `Ledger::open` first).
    pub fn open(ledger_path: &Path) -> Result<PinStore, String> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut store = Self::open_with(ledger_path, flags)?;
        store.migrate(ledger_path)?;
        Ok(store)
    }

    /// Open read-only (reading pins without the daemon). The pin schema must be current.
    pub fn open_read_only(ledger_path: &Path) -> Result<PinStore, String> {
        if !ledger_path.exists() {
            return Err(format!(
                "pins: no ledger at {} (run the gateway first, or pass --ledger FILE)",
                ledger_path.display()
            ));
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let store = Self::open_with(ledger_path, flags)?;
        let version = schema_version(&store.conn)?;
        if version != PIN_SCHEMA_VERSION {
            return Err(format!(
                "pins: {} has pin schema {version}, this toolwall reads {PIN_SCHEMA_VERSION} (start the gateway once to migrate it)",
                ledger_path.display()
            ));
        }
        Ok(store)
    }

    fn open_with(ledger_path: &Path, flags: OpenFlags) -> Result<PinStore, String> {
        let conn = Connection::open_with_flags(ledger_path, flags)
            .map_err(|e| err(&format!("open {}", ledger_path.display()), e))?;
        conn.busy_timeout(PIN_BUSY_TIMEOUT)
            .map_err(|e| err("busy_timeout", e))?;
        schema_version(&conn).map_err(|e| format!("pins: {} {e}", ledger_path.display()))?;
        Ok(PinStore {
            conn,
            pause_after_commit: None,
        })
    }

    fn migrate(&mut self, ledger_path: &Path) -> Result<(), String> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| err("migrating", e))?;
        let version = schema_version(&tx)?;
        if version > PIN_SCHEMA_VERSION {
            return Err(format!(
                "pins: {} has pin schema {version}, newer than this toolwall's {PIN_SCHEMA_VERSION}; refusing to touch it",
                ledger_path.display()
            ));
        }
        if version < 2 {
            tx.execute_batch(PIN_MIGRATION_2)
                .map_err(|e| err("migrating the pin tables to version 2", e))?;
            crate::info!(
                "pins: {}: pin tables migrated to version 2 (whole-definition digests, held new tools, servers, resource owners)",
                ledger_path.display()
            );
        }
        if version < PIN_SCHEMA_VERSION || version == 1 {
            tx.execute_batch(
                "CREATE TABLE IF NOT EXISTS pin_store_schema (version INTEGER NOT NULL);
                 DELETE FROM pin_store_schema;",
            )
            .map_err(|e| err("migrating", e))?;
            tx.execute(
                "INSERT INTO pin_store_schema (version) VALUES (?1)",
                [PIN_SCHEMA_VERSION],
            )
            .map_err(|e| err("migrating", e))?;
        }
        tx.commit().map_err(|e| err("migrating", e))
    }

    /// Commits of this connection wait for the disk only as the ledger's do (WAL,
    /// `synchronous = NORMAL`): a pin lost to a power cut is a tool seen again as new.
    pub fn relaxed_sync(&self) -> Result<(), String> {
        self.conn
            .pragma_update(None, "synchronous", "NORMAL")
            .map_err(|e| err("synchronous", e))
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
        get(&self.conn, tool)
    }

    /// Every remembered resource owner: (URI, server, last seen).
    pub fn owners(&self) -> Result<Vec<(String, String, i64)>, String> {
        let mut stmt = self
            .conn
            .prepare("SELECT uri, server, last_seen_ms FROM resource_owners")
            .map_err(|e| err("reading resource owners", e))?;
        let rows = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .map_err(|e| err("reading resource owners", e))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(|e| err("reading resource owners", e))
    }

    /// Run `f` in one write transaction (taken at once, so what it reads is what it
    /// writes over).
    ///
    /// The ledger's writer shares the file: when the write lock stays taken beyond
    /// [`PIN_BUSY_TIMEOUT`] the whole transaction is tried again, up to
    /// [`PIN_WRITE_ATTEMPTS`] times, rather than failing a listing's review.
    pub fn write<R>(
        &mut self,
        mut f: impl FnMut(&PinTx) -> Result<R, String>,
    ) -> Result<R, String> {
        let mut attempt = 1;
        loop {
            match self.write_once(&mut f) {
                Err(e) if attempt < PIN_WRITE_ATTEMPTS && is_busy(&e) => {
                    std::thread::sleep(PIN_RETRY_PAUSE * attempt);
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    fn write_once<R>(
        &mut self,
        f: &mut impl FnMut(&PinTx) -> Result<R, String>,
    ) -> Result<R, String> {
        // The ledger's writer goes first: a call's commit never waits behind a queue of
        // pin transactions (bounded: a writer stuck for long does not stop the pins).
        let yield_until = Instant::now() + PIN_YIELD_MAX;
        while crate::ledger::lock_wait::writer_waiting() && Instant::now() < yield_until {
            std::thread::sleep(Duration::from_millis(1));
        }
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| err("starting a write", e))?;
        let out = f(&PinTx { tx: &tx })?;
        tx.commit().map_err(|e| err("committing", e))?;
        if let Some(pause) = self.pause_after_commit {
            std::thread::sleep(pause);
        }
        Ok(out)
    }

    /// Sleep `pause` after every committed transaction: for a thread that writes many in a
    /// row while the ledger's writer shares the file.
    pub fn pause_after_commit(&mut self, pause: Duration) {
        self.pause_after_commit = Some(pause);
    }

    /// The operator approves the pending definition of `tool`, exactly the one whose digest
    /// is `digest`: refused when another definition is waiting now, or none is.
    pub fn approve(
        &mut self,
        tool: &str,
        digest: &str,
        by: &str,
        now_ms: i64,
    ) -> Result<(PinRecord, PinRecord), String> {
        self.write(|t| {
            let Some(before) = t.get(tool)? else {
                return Err(format!(
                    "no pinned or held tool is named {}",
                    super::visible::visible(tool).0
                ));
            };
            let after = super::review::approve(&before, digest, by, now_ms)?;
            t.put(&after)?;
            Ok((before, after))
        })
    }
}

fn get(conn: &Connection, tool: &str) -> Result<Option<PinRecord>, String> {
    conn.prepare_cached(&format!("SELECT {COLUMNS} FROM tool_pins WHERE tool = ?1"))
        .and_then(|mut s| s.query_row([tool], record).optional())
        .map_err(|e| err("reading a pin", e))
}

/// Reads and writes inside one transaction of [`PinStore::write`].
pub struct PinTx<'a> {
    tx: &'a rusqlite::Transaction<'a>,
}

impl PinTx<'_> {
    pub fn get(&self, tool: &str) -> Result<Option<PinRecord>, String> {
        get(self.tx, tool)
    }

    /// Insert or replace a pin.
    pub fn put(&self, r: &PinRecord) -> Result<(), String> {
        let a = r.approved.as_ref();
        let p = r.pending.as_ref();
        self.tx
            .prepare_cached(&format!(
                "INSERT OR REPLACE INTO tool_pins ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
            ))
            .and_then(|mut s| {
                s.execute(params![
                    r.tool,
                    r.server,
                    a.map(|a| &a.digest),
                    a.map(|a| &a.definition),
                    a.map(|a| a.scheme).unwrap_or(SCHEME),
                    r.first_seen_ms,
                    a.map(|a| a.approved_ms),
                    a.and_then(|a| a.approved_by.as_ref()),
                    p.map(|p| &p.digest),
                    p.map(|p| &p.definition),
                    p.map(|p| p.seen_ms),
                    r.last_seen_ms,
                ])
            })
            .map(drop)
            .map_err(|e| err("storing a pin", e))
    }

    pub fn touch(&self, tool: &str, last_seen_ms: i64) -> Result<(), String> {
        self.tx
            .prepare_cached("UPDATE tool_pins SET last_seen_ms = ?2 WHERE tool = ?1")
            .and_then(|mut s| s.execute(params![tool, last_seen_ms]))
            .map(drop)
            .map_err(|e| err("updating a pin", e))
    }

    pub fn delete(&self, tool: &str) -> Result<(), String> {
        self.tx
            .prepare_cached("DELETE FROM tool_pins WHERE tool = ?1")
            .and_then(|mut s| s.execute([tool]))
            .map(drop)
            .map_err(|e| err("deleting a pin", e))
    }

    /// Delete `tool` if nothing of it is approved (a held new tool; an approval made since
    /// it was found absent keeps it).
    pub fn delete_held(&self, tool: &str) -> Result<(), String> {
        self.tx
            .prepare_cached("DELETE FROM tool_pins WHERE tool = ?1 AND digest IS NULL")
            .and_then(|mut s| s.execute([tool]))
            .map(drop)
            .map_err(|e| err("deleting a pin", e))
    }

    /// Every pin of `server`: (tool, last seen, approved, pending) without definitions.
    pub fn summaries(&self, server: &str) -> Result<Vec<PinSummary>, String> {
        let mut stmt = self
            .tx
            .prepare_cached(
                "SELECT tool, last_seen_ms, digest IS NOT NULL, changed_digest IS NOT NULL \
                 FROM tool_pins WHERE server = ?1",
            )
            .map_err(|e| err("reading pins", e))?;
        let rows = stmt
            .query_map([server], |r| {
                Ok(PinSummary {
                    tool: r.get(0)?,
                    last_seen_ms: r.get(1)?,
                    approved: r.get(2)?,
                    pending: r.get(3)?,
                })
            })
            .map_err(|e| err("reading pins", e))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(|e| err("reading pins", e))
    }

    /// The digests `server` has approved (whole-definition ones: a four-field pin vouches
    /// for nothing it did not cover).
    pub fn approved_digests(&self, server: &str) -> Result<Vec<String>, String> {
        let mut stmt = self
            .tx
            .prepare_cached(
                "SELECT digest FROM tool_pins WHERE server = ?1 AND digest IS NOT NULL AND digest_scheme = ?2",
            )
            .map_err(|e| err("reading pins", e))?;
        let rows = stmt
            .query_map(params![server, SCHEME], |r| r.get(0))
            .map_err(|e| err("reading pins", e))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(|e| err("reading pins", e))
    }

    pub fn server(&self, server: &str) -> Result<Option<ServerRecord>, String> {
        self.tx
            .prepare_cached(
                "SELECT server, origin, first_listed_ms FROM pin_servers WHERE server = ?1",
            )
            .and_then(|mut s| {
                s.query_row([server], |r| {
                    Ok(ServerRecord {
                        server: r.get(0)?,
                        origin: r.get(1)?,
                        first_listed_ms: r.get(2)?,
                    })
                })
                .optional()
            })
            .map_err(|e| err("reading pin_servers", e))
    }

    /// Servers other than `server` listed before from `origin`, however either was spelled
    /// (see [`super::origin`]).
    pub fn servers_from(&self, origin: &str, server: &str) -> Result<Vec<String>, String> {
        let mut stmt = self
            .tx
            .prepare_cached(
                "SELECT server, origin FROM pin_servers WHERE origin != '' AND server != ?1 ORDER BY server",
            )
            .map_err(|e| err("reading pin_servers", e))?;
        let rows = stmt
            .query_map(params![server], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
            })
            .map_err(|e| err("reading pin_servers", e))?;
        let mut out = Vec::new();
        for row in rows {
            let (name, at) = row.map_err(|e| err("reading pin_servers", e))?;
            if super::origin::same(&at, origin) {
                out.push(name);
            }
        }
        Ok(out)
    }

    pub fn put_server(&self, r: &ServerRecord) -> Result<(), String> {
        self.tx
            .prepare_cached("INSERT OR REPLACE INTO pin_servers (server, origin, first_listed_ms) VALUES (?1, ?2, ?3)")
            .and_then(|mut s| s.execute(params![r.server, r.origin, r.first_listed_ms]))
            .map(drop)
            .map_err(|e| err("storing pin_servers", e))
    }

    /// Move every pin of `from` to `to` (`from__x` becomes `to__x`): a rename the operator
    /// declared. A tool `to` already has approved keeps its own pin; one it only holds as
    /// new gives way. Returns how many pins moved.
    pub fn move_server(&self, from: &str, to: &str) -> Result<usize, String> {
        let sep = crate::mcp::catalog::NAMESPACE_SEP;
        let mut moved = 0;
        let mut stmt = self
            .tx
            .prepare(&format!(
                "SELECT {COLUMNS} FROM tool_pins WHERE server = ?1"
            ))
            .map_err(|e| err("reading pins", e))?;
        let rows: Vec<PinRecord> = stmt
            .query_map([from], record)
            .map_err(|e| err("reading pins", e))?
            .collect::<Result<_, _>>()
            .map_err(|e| err("reading pins", e))?;
        for mut r in rows {
            let target = super::kinds::renamed(&r.tool, from, to).unwrap_or_else(|| {
                let bare = r.tool.split_once(sep).map_or("", |(_, t)| t);
                format!("{to}{sep}{bare}")
            });
            let keep_existing = self.get(&target)?.is_some_and(|e| e.approved.is_some());
            self.delete(&r.tool)?;
            if keep_existing {
                continue;
            }
            r.tool = target;
            r.server = to.to_owned();
            self.put(&r)?;
            moved += 1;
        }
        let old = self.server(from)?;
        self.tx
            .execute("DELETE FROM pin_servers WHERE server = ?1", [from])
            .map_err(|e| err("storing pin_servers", e))?;
        // The kinds other than tools it had listed (their first sight is over).
        for kind in crate::mcp::catalog::Kind::ALL {
            let (was, now) = (
                super::kinds::marker(kind, from),
                super::kinds::marker(kind, to),
            );
            if was != from {
                self.tx
                    .execute(
                        "UPDATE OR REPLACE pin_servers SET server = ?2 WHERE server = ?1",
                        params![was, now],
                    )
                    .map_err(|e| err("storing pin_servers", e))?;
            }
        }
        if let Some(old) = old {
            self.put_server(&ServerRecord {
                server: to.to_owned(),
                origin: old.origin,
                first_listed_ms: old.first_listed_ms,
            })?;
        }
        self.tx
            .execute(
                "UPDATE resource_owners SET server = ?2 WHERE server = ?1",
                params![from, to],
            )
            .map_err(|e| err("moving resource owners", e))?;
        Ok(moved)
    }

    /// Remember `server` as the owner of `uri` (or refresh when it last listed it).
    pub fn own(&self, uri: &str, server: &str, now_ms: i64) -> Result<(), String> {
        self.tx
            .prepare_cached(
                "INSERT INTO resource_owners (uri, server, first_ms, last_seen_ms) VALUES (?1, ?2, ?3, ?3) \
                 ON CONFLICT(uri) DO UPDATE SET last_seen_ms = ?3 WHERE server = ?2",
            )
            .and_then(|mut s| s.execute(params![uri, server, now_ms]))
            .map(drop)
            .map_err(|e| err("storing a resource owner", e))
    }

    /// Forget the owners of `server` beyond the `keep` seen last; returns their URIs.
    pub fn trim_owners(&self, server: &str, keep: usize) -> Result<Vec<String>, String> {
        let keep = i64::try_from(keep).unwrap_or(i64::MAX);
        let mut stmt = self
            .tx
            .prepare_cached(
                "DELETE FROM resource_owners WHERE uri IN (SELECT uri FROM resource_owners \
                 WHERE server = ?1 ORDER BY last_seen_ms DESC, uri LIMIT -1 OFFSET ?2) RETURNING uri",
            )
            .map_err(|e| err("trimming resource owners", e))?;
        let rows = stmt
            .query_map(params![server, keep], |r| r.get(0))
            .map_err(|e| err("trimming resource owners", e))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(|e| err("trimming resource owners", e))
    }

    /// Forget the owners of `server` not seen since `before_ms`; returns their URIs.
    pub fn prune_owners(&self, server: &str, before_ms: i64) -> Result<Vec<String>, String> {
        let mut stmt = self
            .tx
            .prepare_cached(
                "DELETE FROM resource_owners WHERE server = ?1 AND last_seen_ms < ?2 RETURNING uri",
            )
            .map_err(|e| err("pruning resource owners", e))?;
        let rows = stmt
            .query_map(params![server, before_ms], |r| r.get(0))
            .map_err(|e| err("pruning resource owners", e))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(|e| err("pruning resource owners", e))
    }
}

/// A pin without its definitions (for pruning and dropping held tools).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinSummary {
    pub tool: String,
    pub last_seen_ms: i64,
    pub approved: bool,
    pub pending: bool,
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

    fn rec(tool: &str, approved: Option<&str>, pending: Option<&str>) -> PinRecord {
        PinRecord {
            tool: tool.into(),
            server: tool.split("__").next().unwrap().into(),
            approved: approved.map(|d| Approved {
                digest: d.into(),
                definition: "{}".into(),
                scheme: SCHEME,
                approved_ms: 1,
                approved_by: None,
            }),
            pending: pending.map(|d| Pending {
                digest: d.into(),
                definition: "{\"x\":1}".into(),
                seen_ms: 5,
            }),
            first_seen_ms: 1,
            last_seen_ms: 1,
        }
    }

    #[test]
    fn approve_takes_exactly_the_digest_waiting() {
        let (_dir, path, mut ledger) = ledger();
        let mut store = PinStore::open(&path).unwrap();
        store
            .write(|t| {
                t.put(&rec("s__a", Some("d1"), Some("d2")))?;
                t.put(&rec("s__new", None, Some("n1")))
            })
            .unwrap();
        // The ledger's own writer keeps working beside the pin connection.
        ledger.stage_event("test", &serde_json::json!({}));
        ledger.commit().unwrap();
        let e = store.approve("s__a", "d3", "admin", 9).unwrap_err();
        assert!(
            e.contains("sha256:d2") && e.contains("nothing was approved"),
            "{e}"
        );
        let (before, after) = store.approve("s__a", "d2", "admin uid:0", 9).unwrap();
        assert_eq!(before.approved.unwrap().digest, "d1");
        let a = after.approved.unwrap();
        assert_eq!(
            (a.digest.as_str(), a.approved_by.as_deref()),
            ("d2", Some("admin uid:0"))
        );
        assert!(after.pending.is_none());
        assert!(
            store
                .approve("s__a", "d2", "x", 10)
                .unwrap_err()
                .contains("already approved")
        );
        assert!(
            store
                .approve("s__zz", "d", "x", 10)
                .unwrap_err()
                .contains("no pinned")
        );
        // A held new tool becomes approved the same way.
        let (_, after) = store.approve("s__new", "n1", "admin", 11).unwrap();
        assert_eq!(after.approved.unwrap().digest, "n1");
        let ro = PinStore::open_read_only(&path).unwrap();
        assert_eq!(ro.load_all().unwrap().len(), 2);
        assert!(ro.get("s__a").unwrap().is_some());
    }

    #[test]
    fn version_one_pins_migrate_and_a_newer_schema_is_refused() {
        let (_dir, path, _ledger) = ledger();
        {
            // A ledger written before: tool_pins as migration 2 made it, one pin.
            let conn = Connection::open(&path).unwrap();
            conn.execute(
                "INSERT INTO tool_pins (tool, server, digest, definition, first_seen_ms, approved_ms, changed_digest, changed_definition, changed_seen_ms) \
                 VALUES ('up__t', 'up', 'old', '{}', 5, 6, 'chg', '{\"a\":1}', 7)",
                [],
            )
            .unwrap();
        }
        assert!(
            PinStore::open_read_only(&path)
                .unwrap_err()
                .contains("migrate")
        );
        let mut store = PinStore::open(&path).unwrap();
        let r = store.get("up__t").unwrap().unwrap();
        let a = r.approved.clone().unwrap();
        assert_eq!((a.digest.as_str(), a.scheme), ("old", 1));
        assert_eq!(r.pending.as_ref().unwrap().digest, "chg");
        assert_eq!(r.last_seen_ms, 7);
        let known = store.write(|t| t.server("up")).unwrap().unwrap();
        assert_eq!(known.origin, "");
        drop(store);
        // Opening again migrates nothing more.
        PinStore::open(&path).unwrap();
        Connection::open(&path)
            .unwrap()
            .execute("UPDATE pin_store_schema SET version = 99", [])
            .unwrap();
        assert!(PinStore::open(&path).unwrap_err().contains("newer"));
    }

    #[test]
    fn a_rename_moves_pins_and_owners() {
        let (_dir, path, _ledger) = ledger();
        let mut store = PinStore::open(&path).unwrap();
        let moved = store
            .write(|t| {
                t.put(&rec("old__a", Some("d1"), None))?;
                t.put(&rec("old__b", Some("d1"), Some("d2")))?;
                t.put(&rec("new__b", None, Some("n")))?;
                t.put_server(&ServerRecord {
                    server: "old".into(),
                    origin: "http://x/".into(),
                    first_listed_ms: 3,
                })?;
                t.own("r://1", "old", 4)?;
                t.move_server("old", "new")
            })
            .unwrap();
        assert_eq!(moved, 2);
        let all = store.load_all().unwrap();
        assert_eq!(
            all.iter().map(|r| r.tool.as_str()).collect::<Vec<_>>(),
            vec!["new__a", "new__b"]
        );
        assert_eq!(all[1].pending.as_ref().unwrap().digest, "d2");
        assert_eq!(store.owners().unwrap()[0].1, "new");
        let pruned = store.write(|t| t.prune_owners("new", 5)).unwrap();
        assert_eq!(pruned, vec!["r://1".to_string()]);
    }

    #[test]
    fn owners_beyond_the_cap_are_trimmed_oldest_first() {
        let (_dir, path, _ledger) = ledger();
        let mut store = PinStore::open(&path).unwrap();
        let trimmed = store
            .write(|t| {
                for i in 0..10 {
                    t.own(&format!("r://{i}"), "up", i)?;
                }
                t.own("o://x", "other", 0)?;
                t.trim_owners("up", 3)
            })
            .unwrap();
        assert_eq!(trimmed.len(), 7);
        let mut kept: Vec<String> = store
            .owners()
            .unwrap()
            .into_iter()
            .map(|(u, _, _)| u)
            .collect();
        kept.sort();
        assert_eq!(kept, vec!["o://x", "r://7", "r://8", "r://9"]);
    }

    #[test]
    fn a_write_waits_out_a_lock_held_longer_than_the_busy_timeout() {
        let (_dir, path, _ledger) = ledger();
        let mut store = PinStore::open(&path).unwrap();
        // Another writer of the file (the ledger, a checkpoint) holds the write lock for
        // longer than one busy timeout.
        let other = Connection::open(&path).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let (locked_tx, locked) = std::sync::mpsc::channel();
        let holder = std::thread::spawn(move || {
            locked_tx.send(()).unwrap();
            std::thread::sleep(PIN_BUSY_TIMEOUT + PIN_BUSY_TIMEOUT / 2);
            other.execute_batch("COMMIT").unwrap();
        });
        locked.recv().unwrap();
        let written = store.write(|t| t.own("r://1", "up", 1));
        holder.join().unwrap();
        assert_eq!(written, Ok(()));
        assert_eq!(store.owners().unwrap().len(), 1);
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
