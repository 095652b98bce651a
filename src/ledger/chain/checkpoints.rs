//! When the writer signs the chain's head, and where the signature goes: the
//! `ledger_checkpoints` row is written in the same transaction as the groups it covers,
//! and once that commits the head goes to the anchor thread (head file, `anchor_command`).
//! Signing costs a few tens of microseconds on the loop, every `checkpoint_groups` groups or
//! `checkpoint_secs`, and when the ledger closes.

use rusqlite::{Connection, params};
use std::time::{Duration, Instant};

use super::Head;
use super::anchor::Anchor;
use super::signing::{SignedHead, SigningKey};

const SQL_INSERT_CHECKPOINT: &str = "INSERT INTO ledger_checkpoints \
    (seq, signed_at_ms, hash, public_key, signature) VALUES (?1, ?2, ?3, ?4, ?5)";

pub struct Checkpoints {
    key: SigningKey,
    every_groups: i64,
    every: Duration,
    /// The last group signed, and when.
    last_seq: i64,
    last_at: Instant,
    anchor: Anchor,
    /// Signed by the commit being written; shipped once it commits.
    signed: Option<SignedHead>,
}

/// The last signed group in `ledger_checkpoints` (0: none).
pub fn last_signed(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row(
        "SELECT COALESCE(max(seq), 0) FROM ledger_checkpoints",
        [],
        |r| r.get(0),
    )
}

impl Checkpoints {
    pub fn new(
        key: SigningKey,
        every_groups: u64,
        every: Duration,
        last_seq: i64,
        anchor: Anchor,
    ) -> Self {
        Checkpoints {
            key,
            every_groups: i64::try_from(every_groups).unwrap_or(i64::MAX),
            every,
            last_seq,
            last_at: Instant::now(),
            anchor,
            signed: None,
        }
    }

    pub fn public_key(&self) -> [u8; super::signing::PUBLIC_KEY_LEN] {
        self.key.public_key()
    }

    /// Whether `head` (written to `ledger_chain`) is due for a signature.
    pub fn due(&self, head_seq: i64, now: Instant) -> bool {
        head_seq > self.last_seq
            && (head_seq - self.last_seq >= self.every_groups || now >= self.last_at + self.every)
    }

    /// When the next signature is due by time, if a group waits for one.
    pub fn deadline(&self, head_seq: i64) -> Option<Instant> {
        (head_seq > self.last_seq).then(|| self.last_at + self.every)
    }

    /// Signs `head` and stores the signature in `tx`.
    pub fn sign_in(&mut self, tx: &Connection, head: Head, now_ms: i64) -> rusqlite::Result<()> {
        let signed = self.key.sign(head.seq, now_ms, &head.hash);
        tx.prepare_cached(SQL_INSERT_CHECKPOINT)?.execute(params![
            signed.seq,
            signed.signed_at_ms,
            &signed.hash[..],
            &signed.public_key[..],
            &signed.signature[..],
        ])?;
        self.signed = Some(signed);
        Ok(())
    }

    /// The transaction committed: ship what it signed.
    pub fn committed(&mut self, now: Instant) {
        if let Some(signed) = self.signed.take() {
            self.last_seq = signed.seq;
            self.last_at = now;
            self.anchor.send(signed);
        }
    }

    pub fn rolled_back(&mut self) {
        self.signed = None;
    }
}
