//! The legacy seal: rows written before the ledger had a chain (schema version 3 and
//! older, `chain_seq` NULL) are hashed once, when the chain starts, and the digest goes
//! into the chain's first row, so they are covered from then on too.

use rusqlite::Connection;
use sha2::{Digest as _, Sha256};

use super::canonical::{self, Digest, LEGACY_DOMAIN, Table};

/// Rows without a chain group, per table (in [`Table::ALL`] order), and their digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LegacySeal {
    pub counts: [u64; 4],
    pub digest: Digest,
}

impl LegacySeal {
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The seal as the chain start event's detail holds it.
    pub fn to_json(&self) -> serde_json::Value {
        let mut rows = serde_json::Map::new();
        for (table, count) in Table::ALL.iter().zip(self.counts) {
            rows.insert(table.name().into(), count.into());
        }
        serde_json::json!({
            "legacy_rows": rows,
            "legacy_digest": canonical::hex(&self.digest),
        })
    }

    /// Reads a seal back from a chain start event's detail.
    pub fn from_json(detail: &serde_json::Value) -> Option<LegacySeal> {
        let mut counts = [0u64; 4];
        for (slot, table) in counts.iter_mut().zip(Table::ALL) {
            *slot = detail["legacy_rows"][table.name()].as_u64()?;
        }
        let digest = canonical::from_hex(detail["legacy_digest"].as_str()?)?;
        Some(LegacySeal { counts, digest })
    }
}

/// Hashes every row whose `chain_seq` is NULL: SHA-256 of the legacy domain, then per
/// table (in [`Table::ALL`] order) its tag, its row count (u64 BE) and the SHA-256 of its
/// row digests in primary key order.
pub fn compute(conn: &Connection) -> rusqlite::Result<LegacySeal> {
    let mut outer = Sha256::new();
    outer.update(LEGACY_DOMAIN);
    let mut counts = [0u64; 4];
    for (slot, table) in counts.iter_mut().zip(Table::ALL) {
        let sql = format!(
            "SELECT {} FROM {} WHERE chain_seq IS NULL ORDER BY {}",
            table.columns(),
            table.name(),
            table.key_columns()
        );
        let mut stmt = conn.prepare(&sql)?;
        let mut rows = stmt.query([])?;
        let mut inner = Sha256::new();
        let mut count = 0u64;
        while let Some(row) = rows.next()? {
            inner.update(canonical::row_digest(table, row)?);
            count += 1;
        }
        outer.update([table.tag()]);
        outer.update(count.to_be_bytes());
        outer.update(inner.finalize());
        *slot = count;
    }
    Ok(LegacySeal {
        counts,
        digest: outer.finalize().into(),
    })
}
