//! The hash chain over the ledger's rows: every commit is one group whose manifest lists
//! each row it inserted or updated (table, key, row digest), and whose hash covers the
//! previous group's hash and that manifest. `src/ledger/README.md` ("The chain") defines
//! the bytes; `verify` recomputes them.

pub mod anchor;
pub mod canonical;
pub mod checkpoints;
pub mod group;
pub mod recovery;
pub mod seal;
pub mod signing;
pub mod verify;

use rusqlite::{Connection, OptionalExtension};

use canonical::{Digest, GENESIS};

/// Event kind of the first row of a chain: it seals the rows older than the chain.
pub const EVENT_CHAIN_START: &str = "ledger_chain_start";
/// Event kind of a recovery group (see [`recovery`]).
pub const EVENT_CHAIN_RECOVERED: &str = "ledger_chain_recovered";
/// Event kind written when the database is behind (or beside) the last head signed for it.
pub const EVENT_BEHIND_SIGNED_HEAD: &str = "ledger_behind_signed_head";

/// The last committed group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    pub seq: i64,
    pub hash: Digest,
}

impl Head {
    /// Before the first group.
    pub const GENESIS: Head = Head {
        seq: 0,
        hash: GENESIS,
    };
}

/// The last group in `ledger_chain`, if any.
pub fn read_head(conn: &Connection) -> rusqlite::Result<Option<Head>> {
    conn.query_row(
        "SELECT seq, hash FROM ledger_chain ORDER BY seq DESC LIMIT 1",
        [],
        |row| {
            let seq: i64 = row.get(0)?;
            let hash: Vec<u8> = row.get(1)?;
            Ok((seq, hash))
        },
    )
    .optional()
    .map(|found| {
        found.map(|(seq, hash)| Head {
            seq,
            // A hash of the wrong length cannot be linked to: a zero hash makes the next
            // group's link (and verify) fail rather than hide it.
            hash: hash.try_into().unwrap_or([0; canonical::DIGEST_LEN]),
        })
    })
}

#[cfg(test)]
pub(crate) mod tests;
