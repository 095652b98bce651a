//! After a gateway stopped without closing the ledger (a crash, `kill -9`, a power loss),
//! the groups it committed last may have their rows on disk (each row names its group in
//! `chain_seq`) but not their `ledger_chain` rows, which are written in batches. This seals
//! those rows into one recovery group, with an event that says which groups were not
//! written and how many rows they held, so `verify` reports the unclean stop instead of
//! failing on rows no group accounts for, and never accepts it silently.
//!
//! Whether the last writer closed cleanly is in `ledger_writer_state.open`: set when a
//! writer opens the ledger, cleared once it has written every waiting group at close.
//! Recovery reads every chained table once, so after a crash opening a large ledger takes
//! a few seconds longer.

use rusqlite::types::ValueRef;
use rusqlite::{Connection, TransactionBehavior, params};

use super::canonical::{self, OP_RECOVERED, Table};
use super::{EVENT_CHAIN_RECOVERED, Head};
use crate::ledger::time::now_ms;

/// What a recovery sealed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovered {
    /// The recovery group.
    pub head: Head,
    /// The groups whose `ledger_chain` rows were never written (first, last).
    pub unwritten: (i64, i64),
    pub rows: u64,
}

/// Whether the last writer left the ledger open (did not close it cleanly), and marks it
/// open for this one.
pub fn mark_open(conn: &Connection) -> rusqlite::Result<bool> {
    let was_open: Option<i64> = conn
        .query_row(
            "SELECT open FROM ledger_writer_state WHERE id = 1",
            [],
            |r| r.get(0),
        )
        .or_else(|e| match e {
            rusqlite::Error::QueryReturnedNoRows => Ok(None),
            e => Err(e),
        })?;
    conn.execute(
        "INSERT INTO ledger_writer_state (id, open) VALUES (1, 1) \
         ON CONFLICT (id) DO UPDATE SET open = 1",
        [],
    )?;
    Ok(was_open == Some(1))
}

/// Records that the writer closed the ledger with nothing left unwritten.
pub const SQL_MARK_CLOSED: &str = "UPDATE ledger_writer_state SET open = 0 WHERE id = 1";

/// Seals the rows of groups after `head` that have no `ledger_chain` row, if any.
pub fn recover(conn: &mut Connection, head: Head) -> rusqlite::Result<Option<Recovered>> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut rows = 0u64;
    let mut last_unwritten = head.seq;
    let mut per_table = serde_json::Map::new();
    for table in Table::ALL {
        let (count, max): (i64, Option<i64>) = tx.query_row(
            &format!(
                "SELECT count(*), max(chain_seq) FROM {} WHERE chain_seq > ?1",
                table.name()
            ),
            [head.seq],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        rows += u64::try_from(count).unwrap_or(0);
        last_unwritten = last_unwritten.max(max.unwrap_or(0));
        per_table.insert(table.name().into(), count.into());
    }
    if rows == 0 {
        return Ok(None);
    }
    let seq = head.seq + 1;
    let ts_ms = now_ms();
    for table in Table::ALL {
        tx.execute(
            &format!(
                "UPDATE {} SET chain_seq = ?1 WHERE chain_seq > ?2",
                table.name()
            ),
            params![seq, head.seq],
        )?;
    }
    let detail = serde_json::json!({
        "unwritten_groups": [head.seq + 1, last_unwritten],
        "rows": per_table,
    })
    .to_string();
    tx.execute(
        "INSERT INTO events (ts_ms, kind, detail, chain_seq) VALUES (?1, ?2, ?3, ?4)",
        params![ts_ms, EVENT_CHAIN_RECOVERED, detail, seq],
    )?;
    let mut records = Vec::new();
    for table in Table::ALL {
        let sql = format!(
            "SELECT {} FROM {} WHERE chain_seq = ?1 ORDER BY {}",
            table.columns(),
            table.name(),
            table.key_columns()
        );
        let mut stmt = tx.prepare(&sql)?;
        let mut found = stmt.query([seq])?;
        while let Some(row) = found.next()? {
            let digest = canonical::row_digest(table, row)?;
            let key: Vec<ValueRef<'_>> = (0..table.key_len())
                .map(|i| row.get_ref(i))
                .collect::<Result<_, _>>()?;
            canonical::push_entry(&mut records, table, OP_RECOVERED, &key, &digest);
        }
    }
    let hash = canonical::group_hash(&head.hash, seq, ts_ms, &records);
    tx.execute(
        "INSERT INTO ledger_chain (seq, ts_ms, records, hash) VALUES (?1, ?2, ?3, ?4)",
        params![seq, ts_ms, records, &hash[..]],
    )?;
    tx.commit()?;
    Ok(Some(Recovered {
        head: Head { seq, hash },
        unwritten: (head.seq + 1, last_unwritten),
        rows,
    }))
}
