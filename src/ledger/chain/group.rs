//! The writer's side of the chain: the manifest of the group a commit is writing, the
//! groups committed whose `ledger_chain` rows wait to be written, and the hash state of
//! every open call.
//!
//! Two things keep the chain off the cost of a call (measured at one call in flight: a
//! `ledger_chain` row in every commit cost ~3.6 µs of a ~16 µs commit, one page more in
//! the WAL; reading an outcome's row back to hash it ~1.5 µs):
//! - A group's `ledger_chain` row is written with a later commit, every
//!   `chain_flush_groups` groups or `chain_flush_ms`, whichever comes first, and when the
//!   ledger closes. The rows themselves are committed as before, each carrying its group in
//!   `chain_seq`. After a crash the groups not yet written are rebuilt from those rows (see
//!   [`super::recovery`]), and the recovery is recorded.
//! - A call's start hashes the columns it sets for good first; that hash state is kept
//!   until the outcome arrives, which only adds the columns it rewrites. A call whose state
//!   is not kept (opened before a restart, or beyond [`MAX_OPEN_CALLS`]) has its row read
//!   back instead.

use rusqlite::types::ValueRef;
use rusqlite::{Connection, params};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use super::Head;
use super::canonical::{self, Digest, OP_INSERT, OP_UPDATE, RowHasher, Table};
use crate::ledger::body;
use crate::ledger::staged::{Op, Span, Staged};

/// Open calls whose start hash state is kept; beyond it the oldest are forgotten (their
/// outcome then reads the row back).
pub const MAX_OPEN_CALLS: usize = 65_536;

/// Capacity of the manifests' buffer kept across flushes.
const RECORDS_KEEP_BYTES: usize = 256 << 10;

const SQL_INSERT_GROUP: &str =
    "INSERT INTO ledger_chain (seq, ts_ms, records, hash) VALUES (?1, ?2, ?3, ?4)";

const SQL_CALL_ROW: &str = concat!(
    "SELECT ",
    canonical::tool_calls_columns!(),
    " FROM tool_calls WHERE id = ?1"
);

/// When the waiting `ledger_chain` rows are written.
#[derive(Debug, Clone, Copy)]
pub struct FlushPolicy {
    /// Groups waiting at most.
    pub groups: usize,
    /// Bytes of manifests waiting at most.
    pub bytes: usize,
    /// Longest a committed group waits.
    pub age: Duration,
}

/// A committed group whose `ledger_chain` row is not written yet; its manifest is
/// `records[start..end]` of the writer's buffer.
struct PendingGroup {
    seq: i64,
    ts_ms: i64,
    start: usize,
    end: usize,
    hash: Digest,
}

/// What a call's start hashed: the state after its lasting columns, and the rule and
/// reason an outcome without its own keeps.
struct OpenCall {
    after_start: sha2::Sha256,
    policy_rule: Option<Box<[u8]>>,
    policy_reason: Option<Box<[u8]>>,
}

pub struct ChainWriter {
    /// The last committed group (its `ledger_chain` row may still wait).
    head: Head,
    /// The group a commit is writing; its manifest is `records[group_start..]`.
    seq: i64,
    group_start: usize,
    /// The manifests of the waiting groups, then of the group being written.
    records: Vec<u8>,
    /// Committed groups waiting for their `ledger_chain` rows, oldest first.
    pending: Vec<PendingGroup>,
    oldest_pending: Option<Instant>,
    /// Whether a commit is writing a group (`begin` was called and it has not ended).
    writing_group: bool,
    /// Whether the commit being written also writes the waiting rows.
    flushing: bool,
    open_calls: BTreeMap<i64, OpenCall>,
    /// Calls the commit being written opened (kept once it commits), and calls it ended
    /// (put back if it fails).
    opened: HashMap<i64, OpenCall>,
    closed: Vec<(i64, OpenCall)>,
    policy: FlushPolicy,
}

impl ChainWriter {
    /// After `head`, the last group in `ledger_chain` (or [`Head::GENESIS`]).
    pub fn new(head: Head, policy: FlushPolicy) -> Self {
        ChainWriter {
            head,
            seq: head.seq,
            group_start: 0,
            records: Vec::new(),
            pending: Vec::new(),
            oldest_pending: None,
            writing_group: false,
            flushing: false,
            open_calls: BTreeMap::new(),
            opened: HashMap::new(),
            closed: Vec::new(),
            policy,
        }
    }

    /// The last committed group.
    pub fn head(&self) -> Head {
        self.head
    }

    /// The newest group closed, committed or not (what a signature written with the
    /// current transaction covers).
    pub fn newest(&self) -> Head {
        self.pending.last().map_or(self.head, |p| Head {
            seq: p.seq,
            hash: p.hash,
        })
    }

    /// Whether the transaction being written also writes the waiting `ledger_chain` rows.
    pub fn flushing(&self) -> bool {
        self.flushing
    }

    /// Groups committed whose rows wait.
    pub fn waiting(&self) -> usize {
        self.pending.len()
    }

    /// When the waiting rows must be written even if nothing else is committed.
    pub fn deadline(&self) -> Option<Instant> {
        self.oldest_pending.map(|t| t + self.policy.age)
    }

    /// Whether the waiting rows are due.
    pub fn flush_due(&self, now: Instant) -> bool {
        !self.pending.is_empty()
            && (self.pending.len() >= self.policy.groups
                || self.group_start >= self.policy.bytes
                || self.deadline().is_some_and(|d| now >= d))
    }

    /// Starts writing the next group (a retried commit starts over with the same number).
    pub fn begin(&mut self) -> i64 {
        self.seq = self.head.seq.saturating_add(1);
        self.records.truncate(self.group_start);
        self.opened.clear();
        self.closed.clear();
        self.flushing = false;
        self.writing_group = true;
        self.seq
    }

    fn entry(&mut self, table: Table, op: u8, key: &[ValueRef<'_>], digest: &Digest) {
        canonical::push_entry(&mut self.records, table, op, key, digest);
    }

    /// Records a staged op that wrote its row (`tx` is the writer's open transaction; an
    /// `events` row's id is its last rowid).
    pub fn record(&mut self, tx: &Connection, staged: &Staged, op: &Op) -> rusqlite::Result<()> {
        let b = |span: Span| staged.bytes(span);
        let hex = |span: Span| body::hex(&staged.digest(span));
        let seq = self.seq;
        match *op {
            Op::Blob {
                ts_ms,
                digest,
                body,
                size,
                truncated,
            } => {
                let hash = hex(digest);
                let row = RowHasher::new(Table::Blobs)
                    .text(&hash)
                    .blob(b(body))
                    .int(size)
                    .int(i64::from(truncated))
                    .int(ts_ms)
                    .int(seq)
                    .finish();
                self.entry(Table::Blobs, OP_INSERT, &[ValueRef::Text(&hash)], &row);
            }
            Op::CallStart {
                id,
                ts_ms,
                bytes_received,
                transport,
                principal,
                process_name,
                server_name,
                tool_name,
                method,
                request_id,
                decision,
                policy_rule,
                policy_reason,
                arguments_preview,
                request_digest,
            } => {
                let request_hash = request_digest.map(hex);
                let mut after_start = RowHasher::new(Table::ToolCalls);
                after_start
                    .int(id)
                    .int(ts_ms)
                    .text(b(transport))
                    .text(b(principal))
                    .text(b(process_name))
                    .text(b(server_name))
                    .text(b(tool_name))
                    .text(b(method))
                    .text(b(request_id))
                    .int(bytes_received)
                    .text(b(arguments_preview))
                    .opt_text(request_hash.as_ref().map(|h| &h[..]));
                let midstate = after_start.midstate();
                let row = after_start
                    .text(b(decision))
                    .opt_text(policy_rule.map(b))
                    .opt_text(policy_reason.map(b))
                    .null() // duration_us
                    .null() // error_message
                    .null() // bytes_sent
                    .null() // response_preview
                    .null() // response_body_hash
                    .null() // rewritten_arguments_hash
                    .null() // original_response_hash
                    .null() // approved_by
                    .null() // decided_at_ms
                    .int(seq)
                    .finish();
                self.entry(Table::ToolCalls, OP_INSERT, &[ValueRef::Integer(id)], &row);
                self.opened.insert(
                    id,
                    OpenCall {
                        after_start: midstate,
                        policy_rule: policy_rule.map(|s| b(s).into()),
                        policy_reason: policy_reason.map(|s| b(s).into()),
                    },
                );
            }
            Op::CallEnd {
                id,
                duration_us,
                bytes_sent,
                decided_at_ms,
                decision,
                policy_rule,
                policy_reason,
                error_message,
                approved_by,
                response_preview,
                response_digest,
                rewritten_digest,
                original_digest,
            } => {
                // A call ends once: its state leaves the table either way (and comes back
                // if the commit fails).
                let (open, from_table) = match self.opened.remove(&id) {
                    Some(call) => (Some(call), false),
                    None => (self.open_calls.remove(&id), true),
                };
                let row = match &open {
                    Some(open) => {
                        let rule = policy_rule.map(b).or(open.policy_rule.as_deref());
                        let reason = policy_reason.map(b).or(open.policy_reason.as_deref());
                        let hash = |s: Option<Span>| s.map(hex);
                        let (response_hash, rewritten_hash, original_hash) = (
                            hash(response_digest),
                            hash(rewritten_digest),
                            hash(original_digest),
                        );
                        fn as_text(h: &Option<[u8; body::DIGEST_HEX_LEN]>) -> Option<&[u8]> {
                            h.as_ref().map(|h| &h[..])
                        }
                        RowHasher::resume(open.after_start.clone())
                            .text(b(decision))
                            .opt_text(rule)
                            .opt_text(reason)
                            .int(duration_us)
                            .opt_text(error_message.map(b))
                            .int(bytes_sent)
                            .text(b(response_preview))
                            .opt_text(as_text(&response_hash))
                            .opt_text(as_text(&rewritten_hash))
                            .opt_text(as_text(&original_hash))
                            .opt_text(approved_by.map(b))
                            .opt_int(decided_at_ms)
                            .int(seq)
                            .finish()
                    }
                    // Not kept: hash the row as the update left it.
                    None => tx
                        .prepare_cached(SQL_CALL_ROW)?
                        .query_row([id], |row| canonical::row_digest(Table::ToolCalls, row))?,
                };
                if from_table && let Some(call) = open {
                    self.closed.push((id, call));
                }
                self.entry(Table::ToolCalls, OP_UPDATE, &[ValueRef::Integer(id)], &row);
            }
            Op::RuleEvent {
                call_id,
                seq: match_seq,
                ts_ms,
                rule_id,
                action,
                phase,
                layer,
            } => {
                let row = RowHasher::new(Table::RuleEvents)
                    .int(call_id)
                    .text(b(phase))
                    .int(i64::from(match_seq))
                    .int(ts_ms)
                    .text(b(rule_id))
                    .text(b(action))
                    .text(b(layer))
                    .int(seq)
                    .finish();
                self.entry(
                    Table::RuleEvents,
                    OP_INSERT,
                    &[
                        ValueRef::Integer(call_id),
                        ValueRef::Text(b(phase)),
                        ValueRef::Integer(i64::from(match_seq)),
                    ],
                    &row,
                );
            }
            Op::Event {
                ts_ms,
                kind,
                detail,
            } => self.event(tx.last_insert_rowid(), ts_ms, b(kind), b(detail)),
        }
        Ok(())
    }

    /// Records a row this commit moved into its group (`chain_seq` rewritten).
    pub fn carried(&mut self, table: Table, key: &[ValueRef<'_>], digest: &Digest) {
        self.entry(table, canonical::OP_CARRIED, key, digest);
    }

    /// The calls whose start was committed and whose outcome was not.
    pub fn open_call_ids(&self) -> Vec<i64> {
        self.open_calls.keys().copied().collect()
    }

    /// Records the `events` row `id` this commit inserted.
    pub fn event(&mut self, id: i64, ts_ms: i64, kind: &[u8], detail: &[u8]) {
        let row = RowHasher::new(Table::Events)
            .int(id)
            .int(ts_ms)
            .text(kind)
            .text(detail)
            .int(self.seq)
            .finish();
        self.entry(Table::Events, OP_INSERT, &[ValueRef::Integer(id)], &row);
    }

    /// Closes the group being written: its hash links it to the head. The `ledger_chain`
    /// rows waiting (this one included) are written in `tx` when due or when `flush_all`.
    pub fn close_group(
        &mut self,
        tx: &Connection,
        ts_ms: i64,
        now: Instant,
        flush_all: bool,
    ) -> rusqlite::Result<()> {
        let hash = canonical::group_hash(
            &self.head.hash,
            self.seq,
            ts_ms,
            &self.records[self.group_start..],
        );
        self.pending.push(PendingGroup {
            seq: self.seq,
            ts_ms,
            start: self.group_start,
            end: self.records.len(),
            hash,
        });
        if flush_all || self.flush_due(now) {
            self.write_pending(tx)?;
        }
        Ok(())
    }

    /// Writes every waiting `ledger_chain` row in `tx` (kept waiting until it commits).
    pub fn write_pending(&mut self, tx: &Connection) -> rusqlite::Result<()> {
        let mut insert = tx.prepare_cached(SQL_INSERT_GROUP)?;
        for group in &self.pending {
            insert.execute(params![
                group.seq,
                group.ts_ms,
                &self.records[group.start..group.end],
                &group.hash[..]
            ])?;
        }
        self.flushing = true;
        Ok(())
    }

    /// The commit succeeded: the group it wrote (if any) becomes the head, and what it
    /// wrote is final.
    pub fn committed(&mut self, now: Instant) {
        if self.writing_group
            && let Some(last) = self.pending.last()
            && last.seq == self.seq
        {
            self.head = Head {
                seq: last.seq,
                hash: last.hash,
            };
            self.group_start = self.records.len();
            if self.oldest_pending.is_none() {
                self.oldest_pending = Some(now);
            }
        }
        if self.flushing {
            self.pending.clear();
            self.records.clear();
            if self.records.capacity() > RECORDS_KEEP_BYTES {
                self.records.shrink_to(RECORDS_KEEP_BYTES);
            }
            self.group_start = 0;
            self.oldest_pending = None;
            self.flushing = false;
        }
        self.writing_group = false;
        for (id, call) in self.opened.drain() {
            self.open_calls.insert(id, call);
        }
        self.closed.clear();
        while self.open_calls.len() > MAX_OPEN_CALLS {
            self.open_calls.pop_first();
        }
    }

    /// The commit was rolled back: forget the group it was writing, put back the calls
    /// it ended.
    pub fn rolled_back(&mut self) {
        if self.writing_group && self.pending.last().is_some_and(|p| p.seq == self.seq) {
            self.pending.pop();
        }
        self.writing_group = false;
        self.records.truncate(self.group_start);
        self.flushing = false;
        self.opened.clear();
        for (id, call) in self.closed.drain(..) {
            self.open_calls.insert(id, call);
        }
    }
}
