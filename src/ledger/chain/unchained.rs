//! Rows that name a group after the chain's last one (`chain_seq` above the last
//! `ledger_chain` row). A running gateway writes its groups' chain rows in batches, and a
//! crashed one leaves the last batch unwritten, so such rows are legitimate only as what
//! those groups could have written: rows newer than the chain, a call's outcome whose
//! start the chain holds, a body moved into an archive's commit unchanged. Anything else
//! (a chained row edited or re-pointed to a future group, an event slipped in below the ids
//! the chain covers, a group number far beyond the flush window) is tampering: `verify`
//! reports it, and recovery refuses to seal it.

use rusqlite::Connection;
use rusqlite::types::{Value, ValueRef};
use std::collections::HashMap;

use super::canonical::{self, Digest, Entry, OP_CARRIED, OP_INSERT, RowHasher, Table};

/// Most groups a gateway may leave without chain rows (`ledger.chain_flush_groups` at most).
pub const MAX_UNWRITTEN_GROUPS: i64 = 4096;

/// Most waiting rows looked at one by one; more than a gateway's unwritten groups can hold
/// at the manifest-bytes bound, so more is itself a finding.
pub const MAX_PENDING_ROWS: usize = 1 << 20;

struct PendingRow {
    table: Table,
    key: Vec<Value>,
    chain_seq: i64,
    /// The last chained entry for this key: (group, op, digest).
    last: Option<(i64, u8, Digest)>,
}

/// The rows after the chain's last group, and what the chain holds for their keys.
pub struct Pending {
    last_seq: i64,
    rows: HashMap<(u8, Vec<u8>), PendingRow>,
    too_many: u64,
    /// Largest id the chained entries of `events` name (at `index(Table::Events)`).
    max_chained_id: [i64; 4],
}

fn index(table: Table) -> usize {
    Table::ALL.iter().position(|t| *t == table).unwrap_or(0)
}

impl Pending {
    /// Reads every row whose `chain_seq` is above `last_seq`.
    pub fn collect(conn: &Connection, last_seq: i64) -> rusqlite::Result<Pending> {
        let mut pending = Pending {
            last_seq,
            rows: HashMap::new(),
            too_many: 0,
            max_chained_id: [i64::MIN; 4],
        };
        for table in Table::ALL {
            let sql = format!(
                "SELECT {} FROM {} WHERE chain_seq > ?1",
                table.columns(),
                table.name()
            );
            let mut stmt = conn.prepare(&sql)?;
            let mut rows = stmt.query([last_seq])?;
            while let Some(row) = rows.next()? {
                if pending.rows.len() >= MAX_PENDING_ROWS {
                    pending.too_many += 1;
                    continue;
                }
                let chain_seq = match row.get_ref(table.chain_seq_index())? {
                    ValueRef::Integer(i) => i,
                    _ => continue,
                };
                let key_bytes = canonical::row_key_bytes(table, row)?;
                let key = (0..table.key_len())
                    .map(|i| row.get::<_, Value>(i))
                    .collect::<Result<_, _>>()?;
                pending.rows.insert(
                    (table.tag(), key_bytes),
                    PendingRow {
                        table,
                        key,
                        chain_seq,
                        last: None,
                    },
                );
            }
        }
        Ok(pending)
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty() && self.too_many == 0
    }

    /// Takes note of one chained group's entries (call for every group, in order).
    pub fn note(&mut self, seq: i64, entries: &[Entry]) {
        for entry in entries {
            if let (Table::Events, Some(Value::Integer(id))) = (entry.table, entry.key.first()) {
                let max = &mut self.max_chained_id[index(entry.table)];
                *max = (*max).max(*id);
            }
            if self.rows.is_empty() {
                continue;
            }
            if let Some(row) = self
                .rows
                .get_mut(&(entry.table.tag(), entry.key_bytes.clone()))
            {
                row.last = Some((seq, entry.op, entry.digest));
            }
        }
    }

    /// Reads every chained group's manifest and takes note of it (for recovery, which
    /// has not walked the chain).
    pub fn note_whole_chain(&mut self, conn: &Connection) -> rusqlite::Result<()> {
        let mut stmt = conn.prepare("SELECT seq, records FROM ledger_chain ORDER BY seq")?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let seq: i64 = match row.get_ref(0)? {
                ValueRef::Integer(i) => i,
                _ => continue,
            };
            if let ValueRef::Blob(records) = row.get_ref(1)? {
                // A manifest that does not parse is verify's to report.
                if let Ok(entries) = canonical::parse_manifest(records) {
                    self.note(seq, &entries);
                }
            }
        }
        Ok(())
    }

    /// The waiting rows a gateway could not have written, one sentence each (at most
    /// `max`).
    pub fn problems(&self, conn: &Connection, max: usize) -> rusqlite::Result<Vec<String>> {
        let mut out = Vec::new();
        if self.too_many > 0 {
            out.push(format!(
                "more than {MAX_PENDING_ROWS} rows name groups after the last one ({}): more \
                 than a gateway leaves unwritten",
                self.last_seq
            ));
        }
        let mut rows: Vec<&PendingRow> = self.rows.values().collect();
        rows.sort_by_key(|r| r.chain_seq);
        for row in rows {
            if out.len() >= max {
                break;
            }
            let what = || {
                let names = row.table.key_columns().split(", ");
                let key = names
                    .zip(&row.key)
                    .map(|(n, v)| format!("{n} {}", canonical::describe_value(v)))
                    .collect::<Vec<_>>()
                    .join(" ");
                format!("{} {key}", row.table.name())
            };
            if row.chain_seq > self.last_seq + MAX_UNWRITTEN_GROUPS {
                out.push(format!(
                    "{} names group {}, more than {MAX_UNWRITTEN_GROUPS} groups after the last \
                     one ({}): no gateway leaves that many unwritten (added or re-pointed after \
                     the fact)",
                    what(),
                    row.chain_seq,
                    self.last_seq
                ));
                continue;
            }
            match row.last {
                // A call's outcome after the start (or the carry) the chain holds.
                Some((_, op, _))
                    if row.table == Table::ToolCalls && (op == OP_INSERT || op == OP_CARRIED) => {}
                // A body moved into an archive's commit: unchanged but for chain_seq.
                Some((seq, _, digest))
                    if row.table == Table::Blobs
                        && self.digest_as_of(conn, row, seq)? == Some(digest) => {}
                Some((seq, _, _)) => out.push(format!(
                    "{} was written by group {seq} and now names group {}, whose chain row is \
                     not written: edited or re-pointed after the commit",
                    what(),
                    row.chain_seq
                )),
                None => {
                    // Events get their ids at insert, in commit order; a call's id is taken
                    // before its start may be staged, so calls are not held to it.
                    let below = match (row.table, row.key.first()) {
                        (Table::Events, Some(Value::Integer(id))) => {
                            *id <= self.max_chained_id[index(row.table)]
                        }
                        _ => false,
                    };
                    if below {
                        out.push(format!(
                            "{} names group {}, whose chain row is not written, but its id is \
                             below ids the chain already covers: added after the fact",
                            what(),
                            row.chain_seq
                        ));
                    }
                }
            }
        }
        Ok(out)
    }

    /// The digest of the row as it is now, but naming group `seq`.
    fn digest_as_of(
        &self,
        conn: &Connection,
        row: &PendingRow,
        seq: i64,
    ) -> rusqlite::Result<Option<Digest>> {
        use rusqlite::OptionalExtension;
        let table = row.table;
        conn.prepare_cached(&table.select_by_key_sql())?
            .query_row(rusqlite::params_from_iter(row.key.iter()), |found| {
                let mut hasher = RowHasher::new(table);
                for i in 0..table.column_count() {
                    if i == table.chain_seq_index() {
                        hasher.int(seq);
                    } else {
                        hasher.value(found.get_ref(i)?);
                    }
                }
                Ok(hasher.finish())
            })
            .optional()
    }
}
