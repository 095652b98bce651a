//! The gateway's writer: stage rows during a loop turn, commit them in one transaction.

use rusqlite::types::{ToSqlOutput, Value, ValueRef};
use rusqlite::{Connection, ErrorCode, OpenFlags, ToSql, params};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::LedgerConfig;
use super::body::{self, Preview};
use super::chain::anchor::{self, Anchor, AnchorConfig};
use super::chain::canonical::{self, Table};
use super::chain::checkpoints::{self, Checkpoints};
use super::chain::group::{ChainWriter, FlushPolicy};
use super::chain::signing::SigningKey;
use super::chain::{self, Head, recovery};
use super::checkpointer::Checkpointer;
use super::error::{LedgerError, LedgerErrorKind};
use super::file::{self, WriterLock};
use super::lock_wait::{self, Waiting};
use super::record::{CallEnd, CallStart};
use super::retention::{self, ArchiveRequest, Retention, RetentionConfig};
use super::schema;
use super::staged::{Op, Span, Staged};
use super::time::now_ms;

/// Largest accepted `body_cap_bytes`.
pub const MAX_BODY_CAP_BYTES: usize = 256 << 20;
/// Largest accepted `preview_bytes` and `text_cap_bytes`.
pub const MAX_TEXT_BYTES: usize = 1 << 20;
/// Largest accepted `max_staged_bytes` (keeps arena offsets within `u32`).
pub const MAX_STAGED_BYTES: usize = 1 << 30;

/// Event kind written when staged rows were dropped by the staging bound.
pub const EVENT_ROWS_DROPPED: &str = "ledger_rows_dropped";
/// Event kind written when SQLite refused single staged rows.
pub const EVENT_ROWS_REJECTED: &str = "ledger_rows_rejected";

// Every row a commit writes names its chain group in `chain_seq` (`src/ledger/chain/`).
const SQL_INSERT_BLOB: &str = "INSERT OR IGNORE INTO event_body_blobs \
    (hash, body, size, truncated, first_seen_ms, chain_seq) VALUES (?1, ?2, ?3, ?4, ?5, ?6)";
const SQL_INSERT_CALL: &str = "INSERT INTO tool_calls \
    (id, ts_ms, transport, principal, process_name, server_name, tool_name, method, \
     request_id, decision, policy_rule, policy_reason, bytes_received, arguments, \
     request_body_hash, chain_seq) \
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)";
const SQL_END_CALL: &str = "UPDATE tool_calls SET decision = ?2, \
    policy_rule = COALESCE(?3, policy_rule), policy_reason = COALESCE(?4, policy_reason), \
    duration_us = ?5, error_message = ?6, bytes_sent = ?7, response_preview = ?8, \
    response_body_hash = ?9, rewritten_arguments_hash = ?10, original_response_hash = ?11, \
    approved_by = ?12, decided_at_ms = ?13, chain_seq = ?14 WHERE id = ?1";
const SQL_INSERT_RULE_EVENT: &str = "INSERT INTO security_rule_events \
    (call_id, phase, seq, ts_ms, rule_id, action, layer, chain_seq) \
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";
const SQL_INSERT_EVENT: &str =
    "INSERT INTO events (ts_ms, kind, detail, chain_seq) VALUES (?1, ?2, ?3, ?4)";

/// Arena bytes bound as SQLite TEXT without re-checking UTF-8 (staging only stores text
/// that came from `&str` or was cut on a char boundary).
struct Text<'a>(&'a [u8]);

impl ToSql for Text<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(ValueRef::Text(self.0)))
    }
}

/// A digest bound as its lowercase hex text.
struct DigestHex([u8; body::DIGEST_HEX_LEN]);

impl ToSql for DigestHex {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(ValueRef::Text(&self.0)))
    }
}

fn saturating_i64(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

/// Errors a single statement can hit that say nothing about the disk: retrying the same
/// row would fail forever, so the row is skipped (and reported) instead.
fn is_row_refusal(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::ConstraintViolation | ErrorCode::TooBig | ErrorCode::TypeMismatch)
    )
}

/// The writer's page cache: inserts append to the rightmost leaves and updates touch recent
/// rows, so a small cache holds the working set; SQLite's default (2 MiB) mostly held old
/// pages and showed in the gateway's RSS as the ledger grew.
const WRITER_CACHE_KIB: u32 = 1024;

/// Longest `busy_timeout_ms`: the gateway's loop stands still while a commit waits.
const MAX_BUSY_TIMEOUT_MS: u64 = 60_000;

/// Smallest `wal_restart_bytes`.
const MIN_WAL_RESTART_BYTES: u64 = 64 << 10;

/// Page size of a new ledger file.
pub const PAGE_SIZE: u32 = 1024;

/// The open ledger. One per gateway; a second writer on the same file is refused.
pub struct Ledger {
    // Declared before the lock so the connection closes first.
    conn: Connection,
    path: PathBuf,
    staged: Staged,
    next_call_id: i64,
    preview_bytes: usize,
    body_cap_bytes: usize,
    text_cap_bytes: usize,
    blob_every_body: bool,
    /// Folds the WAL back on its own thread; stopped (joined) before the connection closes.
    checkpointer: Option<Checkpointer>,
    /// How long a write waits for another connection's lock (`busy_timeout_ms`).
    busy_timeout: Duration,
    /// The hash chain: the group being written, groups waiting for their rows.
    chain: ChainWriter,
    /// Signed heads.
    checkpoints: Checkpoints,
    /// Archives old groups on a thread of its own (when configured).
    retention: Option<Retention>,
    /// The archive request the commit being written records.
    archive_taken: Option<ArchiveRequest>,
    _writer_lock: WriterLock,
}

impl Ledger {
    /// Opens (creating if needed) and migrates the ledger for writing.
    pub fn open(cfg: &LedgerConfig) -> Result<Ledger, LedgerError> {
        let path = cfg.path.as_path();
        validate(cfg)?;
        file::prepare(path)?;
        let writer_lock = WriterLock::acquire(path)?;
        let open_err = |what: &str, e: rusqlite::Error| {
            LedgerError::new(LedgerErrorKind::Open, path, format!("{what}: {e}"))
        };
        // No SQLITE_OPEN_URI: the configured path is a file name, never a URI.
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut conn = Connection::open_with_flags(path, flags).map_err(|e| open_err("open", e))?;
        conn.busy_timeout(Duration::from_millis(cfg.busy_timeout_ms))
            .map_err(|e| open_err("busy_timeout", e))?;
        // Before changing anything: is this a ledger, and one we understand?
        let found = schema::inspect(&conn, path)?;
        if found == 0 {
            // Small pages: a call's commit rewrites a few b-tree leaves, and every page it
            // touches goes whole into the WAL (measured: 4 KiB pages made the WAL writes
            // the larger part of a commit). Only a fresh file can take a page size.
            conn.execute_batch(&format!("PRAGMA page_size = {PAGE_SIZE};"))
                .map_err(|e| open_err("page_size", e))?;
        }
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
            .map_err(|e| open_err("journal_mode=WAL", e))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(LedgerError::new(
                LedgerErrorKind::Open,
                path,
                format!("cannot use WAL mode (journal_mode stays {mode})"),
            ));
        }
        // Checkpoints run on the checkpointer's thread, never inside a commit.
        conn.execute_batch(&format!(
            "PRAGMA synchronous = NORMAL; PRAGMA journal_size_limit = {}; \
             PRAGMA wal_autocheckpoint = 0; PRAGMA cache_size = -{WRITER_CACHE_KIB};",
            cfg.wal_size_limit_bytes
        ))
        .map_err(|e| open_err("pragmas", e))?;
        schema::migrate(&mut conn, path, found)?;
        let version = schema::current_version();
        if found == 0 {
            crate::info!(
                "ledger {}: created (schema version {version})",
                path.display()
            );
        } else if found != version {
            crate::info!(
                "ledger {}: schema migrated from version {found} to {version}",
                path.display()
            );
        }
        let next_call_id: i64 = conn
            .query_row(
                "SELECT COALESCE(MAX(id), 0) + 1 FROM tool_calls",
                [],
                |row| row.get(0),
            )
            .map_err(|e| open_err("reading the last call id", e))?;
        // The five staging statements, BEGIN and COMMIT, and a few for readers.
        conn.set_prepared_statement_cache_capacity(16);
        // From here on, writes wait for locks in short steps (migrations above used
        // SQLite's own handler with the same timeout).
        conn.busy_handler(Some(lock_wait::retry))
            .map_err(|e| open_err("busy handler", e))?;
        let checkpointer = Checkpointer::start(
            path,
            Duration::from_millis(cfg.busy_timeout_ms),
            cfg.wal_restart_bytes,
        )
        .map_err(|e| {
            LedgerError::new(
                LedgerErrorKind::Open,
                path,
                format!("checkpoint thread: {e}"),
            )
        })?;
        let key = SigningKey::load_or_create(&cfg.signing_key_path())
            .map_err(|e| LedgerError::new(LedgerErrorKind::Open, path, e))?;
        let (head, unsigned_tail) = open_chain(&mut conn, cfg, &key)?;
        let checkpoints = open_checkpoints(&conn, cfg, key)?;
        let behind = compare_signed_head(&conn, cfg, &checkpoints);
        let mut ledger = Ledger {
            conn,
            path: path.to_path_buf(),
            staged: Staged::new(cfg.max_staged_rows, cfg.max_staged_bytes),
            next_call_id,
            preview_bytes: cfg.preview_bytes,
            body_cap_bytes: cfg.body_cap_bytes,
            text_cap_bytes: cfg.text_cap_bytes,
            blob_every_body: cfg.blob_every_body,
            checkpointer: Some(checkpointer),
            busy_timeout: Duration::from_millis(cfg.busy_timeout_ms),
            chain: ChainWriter::new(
                head,
                FlushPolicy {
                    groups: cfg.chain_flush_groups,
                    bytes: CHAIN_FLUSH_BYTES,
                    age: Duration::from_millis(cfg.chain_flush_ms),
                },
            ),
            checkpoints,
            retention: None,
            archive_taken: None,
            _writer_lock: writer_lock,
        };
        if head == Head::GENESIS {
            ledger.start_chain()?;
        }
        if let Some(detail) = behind {
            ledger.stage_event(chain::EVENT_BEHIND_SIGNED_HEAD, &detail);
            ledger.commit()?;
        }
        if let Some(detail) = unsigned_tail {
            ledger.stage_event(chain::EVENT_UNSIGNED_TAIL, &detail);
            ledger.commit()?;
        }
        if cfg.retention_enabled() {
            let retention = Retention::start(RetentionConfig {
                ledger: path.to_path_buf(),
                retain: cfg
                    .retain_secs
                    .or((cfg.retain_days > 0).then(|| cfg.retain_days.saturating_mul(86_400)))
                    .map(Duration::from_secs),
                max_bytes: (cfg.max_bytes > 0).then_some(cfg.max_bytes),
                archive_dir: cfg.archive_dir_path(),
                batch_rows: cfg.retention_batch_rows,
                pause: Duration::from_millis(cfg.retention_pause_ms),
                every: Duration::from_secs(cfg.retention_check_secs),
                busy_timeout: Duration::from_millis(cfg.busy_timeout_ms),
                max_line: super::retention::archive_file::max_line(cfg),
            })
            .map_err(|e| {
                LedgerError::new(
                    LedgerErrorKind::Open,
                    path,
                    format!("retention thread: {e}"),
                )
            })?;
            ledger.retention = Some(retention);
        }
        Ok(ledger)
    }

    /// Commits the chain's first group: one event that seals the rows written before the
    /// ledger had a chain (none in a new file).
    fn start_chain(&mut self) -> Result<(), LedgerError> {
        let seal = chain::seal::compute(&self.conn).map_err(|e| {
            LedgerError::new(
                LedgerErrorKind::Open,
                &self.path,
                format!("sealing the rows older than the chain: {e}"),
            )
        })?;
        if seal.total() > 0 {
            crate::info!(
                "ledger {}: chain started; {} existing rows sealed into its first group",
                self.path.display(),
                seal.total()
            );
        }
        let mut detail = seal.to_json();
        detail["schema_version"] = schema::current_version().into();
        self.stage_event(chain::EVENT_CHAIN_START, &detail);
        self.commit()?;
        self.flush_chain(true)
    }

    /// The last committed chain group.
    pub fn chain_head(&self) -> Head {
        self.chain.head()
    }

    /// Whether the retention thread waits for this writer to record an archive.
    fn archive_pending(&self) -> bool {
        self.retention
            .as_ref()
            .is_some_and(|r| r.shared.request.lock().is_ok_and(|slot| slot.is_some()))
    }

    /// Groups up to this are being archived (0: none).
    fn archiving_upto(&self) -> i64 {
        self.retention.as_ref().map_or(0, |r| {
            r.shared
                .archiving_upto
                .load(std::sync::atomic::Ordering::SeqCst)
        })
    }

    /// Whether a commit has something to do: staged rows, chain rows or a signature due,
    /// an archive to record.
    pub fn has_work(&self) -> bool {
        let now = Instant::now();
        self.staged.len() > 0
            || self.staged.dropped_rows() > 0
            || self.archive_pending()
            || self.chain.flush_due(now)
            || (self.chain.waiting() == 0 && self.checkpoints.due(self.chain.head().seq, now))
    }

    /// When waiting chain rows or a signature are due even if nothing else is written (the
    /// gateway's loop wakes up for it and calls [`commit`](Self::commit)).
    pub fn next_deadline(&self) -> Option<Instant> {
        let sign = self.checkpoints.deadline(self.chain.head().seq);
        // The retention thread's requests are looked for a few times a second.
        let retention = self
            .retention
            .as_ref()
            .map(|_| Instant::now() + RETENTION_POLL);
        self.chain
            .deadline()
            .into_iter()
            .chain(sign)
            .chain(retention)
            .min()
    }

    /// The public key that signs this ledger's checkpoints.
    pub fn public_key(&self) -> [u8; chain::signing::PUBLIC_KEY_LEN] {
        self.checkpoints.public_key()
    }

    /// Writes the chain rows still waiting and signs the head when due (always, with
    /// `sign_now`), in a transaction of their own.
    pub fn flush_chain(&mut self, sign_now: bool) -> Result<(), LedgerError> {
        let now = Instant::now();
        let head = self.chain.newest();
        let sign = if sign_now {
            self.checkpoints.deadline(head.seq).is_some()
        } else {
            self.checkpoints.due(head.seq, now)
        };
        if self.chain.waiting() == 0 && !sign {
            return Ok(());
        }
        let _waiting = Waiting::until(self.busy_timeout);
        let result = (|| -> rusqlite::Result<()> {
            self.conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
            self.chain.write_pending(&self.conn)?;
            if sign {
                self.checkpoints.sign_in(&self.conn, head, now_ms())?;
            }
            self.conn.prepare_cached("COMMIT")?.execute([])?;
            Ok(())
        })();
        match result {
            Ok(()) => {
                let now = Instant::now();
                self.chain.committed(now);
                self.checkpoints.committed(now);
                Ok(())
            }
            Err(e) => {
                if !self.conn.is_autocommit() {
                    let _ = self.conn.execute_batch("ROLLBACK");
                }
                self.chain.rolled_back();
                self.checkpoints.rolled_back();
                Err(LedgerError::new(
                    LedgerErrorKind::Write,
                    &self.path,
                    format!("writing the chain's waiting groups failed: {e}"),
                ))
            }
        }
    }

    /// Writes what waits, signs the head, and records that this writer closed the ledger
    /// cleanly (the next one then skips recovery).
    fn close_chain(&mut self) -> Result<(), LedgerError> {
        self.flush_chain(true)?;
        self.conn
            .execute(recovery::SQL_MARK_CLOSED, [])
            .map(drop)
            .map_err(|e| {
                LedgerError::new(
                    LedgerErrorKind::Write,
                    &self.path,
                    format!("marking the ledger closed: {e}"),
                )
            })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the background checkpoints are failing (the WAL then grows).
    pub fn checkpoints_failing(&self) -> bool {
        self.checkpointer
            .as_ref()
            .is_some_and(Checkpointer::failing)
    }

    /// A fresh `tool_calls` id, usable in staged rows before any commit.
    pub fn new_call_id(&mut self) -> i64 {
        let id = self.next_call_id;
        self.next_call_id = self.next_call_id.saturating_add(1);
        id
    }

    /// Rows staged and not yet committed.
    pub fn staged(&self) -> usize {
        self.staged.len()
    }

    /// Bytes held by staged rows.
    pub fn staged_bytes(&self) -> usize {
        self.staged.live_bytes()
    }

    /// Rows dropped by the staging bound since the last commit reported them.
    pub fn dropped_rows(&self) -> u64 {
        self.staged.dropped_rows()
    }

    fn text(&mut self, text: &str) -> Span {
        self.staged
            .push_bytes(body::cut_str(text, self.text_cap_bytes).as_bytes())
    }

    fn opt_text(&mut self, text: Option<&str>) -> Option<Span> {
        text.map(|t| self.text(t))
    }

    /// The digest of a body, staging the body (capped) as a blob row unless its preview
    /// column already holds it whole. The row that refers to the blob stores its own copy of
    /// the digest (ops own disjoint arena bytes), pushed after every blob op.
    fn body(
        &mut self,
        ts_ms: i64,
        bytes: &[u8],
        preview: Option<&Preview>,
    ) -> Option<[u8; body::DIGEST_LEN]> {
        if bytes.is_empty() {
            return None;
        }
        let digest_bytes = body::sha256(bytes);
        let whole_in_preview = matches!(preview, Some(Preview::Prefix(len)) if *len == bytes.len());
        if self.blob_every_body || !whole_in_preview {
            let digest = self.staged.push_bytes(&digest_bytes);
            let kept = &bytes[..bytes.len().min(self.body_cap_bytes)];
            let body = self.staged.push_bytes(kept);
            self.staged.push_op(Op::Blob {
                ts_ms,
                digest,
                body,
                size: saturating_i64(bytes.len()),
                truncated: kept.len() < bytes.len(),
            });
        }
        Some(digest_bytes)
    }

    fn digest_copy(&mut self, digest: Option<[u8; body::DIGEST_LEN]>) -> Option<Span> {
        digest.map(|d| self.staged.push_bytes(&d))
    }

    fn push_preview(&mut self, bytes: &[u8], preview: Preview) -> Span {
        match preview {
            Preview::Prefix(len) => self.staged.push_bytes(&bytes[..len]),
            Preview::Lossy(text) => self.staged.push_bytes(text.as_bytes()),
        }
    }

    /// Stages the `tool_calls` row of a dispatched call (and its arguments blob).
    pub fn stage_call(&mut self, call: &CallStart) {
        let preview = body::preview(call.arguments, self.preview_bytes);
        let request_digest = self.body(call.ts_ms, call.arguments, Some(&preview));
        let request_digest = self.digest_copy(request_digest);
        let op = Op::CallStart {
            id: call.id,
            ts_ms: call.ts_ms,
            bytes_received: saturating_i64(call.bytes_received),
            transport: self.text(call.transport),
            principal: self.text(call.principal),
            process_name: self.text(call.process_name),
            server_name: self.text(call.server_name),
            tool_name: self.text(call.tool_name),
            method: self.text(call.method),
            request_id: self.text(call.request_id),
            decision: self.text(call.decision),
            policy_rule: self.opt_text(call.policy_rule),
            policy_reason: self.opt_text(call.policy_reason),
            arguments_preview: self.push_preview(call.arguments, preview),
            request_digest,
        };
        self.staged.push_op(op);
    }

    /// Stages the outcome of call `id` (and the blobs of its bodies).
    pub fn stage_call_end(&mut self, id: i64, end: &CallEnd) {
        let ts_ms = now_ms();
        let preview = body::preview(end.response, self.preview_bytes);
        let response_digest = self.body(ts_ms, end.response, Some(&preview));
        let rewritten_digest = end
            .rewritten_arguments
            .and_then(|b| self.body(ts_ms, b, None));
        let original_digest = end
            .original_response
            .and_then(|b| self.body(ts_ms, b, None));
        let response_digest = self.digest_copy(response_digest);
        let rewritten_digest = self.digest_copy(rewritten_digest);
        let original_digest = self.digest_copy(original_digest);
        let op = Op::CallEnd {
            id,
            duration_us: saturating_i64(end.duration_us),
            bytes_sent: saturating_i64(end.bytes_sent),
            decided_at_ms: end.decided_at_ms,
            decision: self.text(end.decision),
            policy_rule: self.opt_text(end.policy_rule),
            policy_reason: self.opt_text(end.policy_reason),
            error_message: self.opt_text(end.error_message),
            approved_by: self.opt_text(end.approved_by),
            response_preview: self.push_preview(end.response, preview),
            response_digest,
            rewritten_digest,
            original_digest,
        };
        self.staged.push_op(op);
    }

    /// Stages one `security_rule_events` row: rule `rule_id` matched call `call_id`, as the
    /// `seq`-th match (from 0) of that call's decision in `phase`. One decision per phase
    /// and call makes `(call_id, phase, seq)` unique.
    pub fn stage_rule_event(
        &mut self,
        call_id: i64,
        seq: u32,
        rule_id: &str,
        action: &str,
        phase: &str,
        layer: &str,
    ) {
        let op = Op::RuleEvent {
            call_id,
            seq,
            ts_ms: now_ms(),
            rule_id: self.text(rule_id),
            action: self.text(action),
            phase: self.text(phase),
            layer: self.text(layer),
        };
        self.staged.push_op(op);
    }

    /// Stages one `events` row. A detail whose JSON exceeds `body_cap_bytes` is replaced by
    /// `{"truncated":true,"size":N,"prefix":"<first text_cap_bytes of the JSON>"}`.
    pub fn stage_event(&mut self, kind: &str, detail: &serde_json::Value) {
        let ts_ms = now_ms();
        let kind = self.text(kind);
        let mut detail_span = self.staged.push_with(|out| {
            // Writing a Value into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut *out, detail);
        });
        let size = self.staged.bytes(detail_span).len();
        if size > self.body_cap_bytes {
            // serde_json writes UTF-8; cut before copying.
            let written = std::str::from_utf8(self.staged.bytes(detail_span)).unwrap_or_default();
            let prefix = body::cut_str(written, self.text_cap_bytes).to_owned();
            self.staged.truncate_to(detail_span);
            let short = serde_json::json!({
                "truncated": true,
                "size": size,
                "prefix": prefix,
            });
            detail_span = self.staged.push_with(|out| {
                let _ = serde_json::to_writer(&mut *out, &short);
            });
        }
        self.staged.push_op(Op::Event {
            ts_ms,
            kind,
            detail: detail_span,
        });
    }

    /// Writes everything staged in one transaction and returns the rows it changed.
    ///
    /// On failure the transaction is rolled back and every staged row is kept for the next
    /// commit (up to `max_staged_rows` / `max_staged_bytes`; beyond them the oldest are
    /// dropped). When rows were lost — dropped by that bound, or refused one by one by
    /// SQLite — the rest is committed together with an `events` row saying so, and the
    /// result is still an error of kind `RowsLost`, so a caller that only checks `is_ok()`
    /// fails closed.
    pub fn commit(&mut self) -> Result<usize, LedgerError> {
        let dropped = self.staged.dropped_rows();
        if self.staged.len() == 0 && dropped == 0 && !self.archive_pending() {
            self.flush_chain(false)?;
            return Ok(0);
        }
        match self.write_staged(dropped) {
            Ok((written, rejected, first_refusal)) => {
                self.staged.clear_committed();
                if dropped == 0 && rejected == 0 {
                    return Ok(written);
                }
                let mut what = format!(
                    "rows lost: {written} rows committed, {dropped} dropped by the staging bound"
                );
                what.push_str(&format!(", {rejected} refused by SQLite"));
                if let Some(first) = first_refusal {
                    what.push_str(&format!(" (first: {first})"));
                }
                Err(
                    LedgerError::new(LedgerErrorKind::RowsLost, &self.path, what)
                        .with_losses(dropped, rejected),
                )
            }
            Err(e) => Err(LedgerError::new(
                LedgerErrorKind::Write,
                &self.path,
                format!(
                    "commit failed and was rolled back: {e}; {} staged rows kept for the next \
                     commit, {dropped} dropped by the staging bound so far",
                    self.staged.len()
                ),
            )
            .with_losses(dropped, 0)),
        }
    }

    /// The transaction of [`commit`](Self::commit): rows changed, rows refused, and the
    /// first refusal.
    fn write_staged(&mut self, dropped: u64) -> rusqlite::Result<(usize, u64, Option<String>)> {
        // Cached statements rather than rusqlite's transaction guard, which parses
        // `BEGIN IMMEDIATE` and `COMMIT` again on every commit (two per call at one call in
        // flight).
        let _waiting = Waiting::until(self.busy_timeout);
        self.conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        let seq = self.chain.begin();
        let carry_upto = self.archiving_upto();
        self.archive_taken = self.retention.as_ref().and_then(|r| {
            r.shared
                .request
                .lock()
                .ok()
                .and_then(|mut slot| slot.take())
        });
        let result = write_rows(
            &self.conn,
            &self.staged,
            dropped,
            &mut self.chain,
            seq,
            carry_upto,
        )
        .and_then(|done| {
            if let Some(request) = &self.archive_taken {
                record_archive(&self.conn, &mut self.chain, request, seq)?;
            }
            let now = Instant::now();
            // A signature due writes the waiting chain rows now, so checkpoint_groups holds
            // even when it is below chain_flush_groups.
            let sign_due = self.checkpoints.due(seq, now);
            self.chain
                .close_group(&self.conn, now_ms(), now, sign_due)?;
            let newest = self.chain.newest();
            if self.chain.flushing() && self.checkpoints.due(newest.seq, now) {
                self.checkpoints.sign_in(&self.conn, newest, now_ms())?;
            }
            self.conn.prepare_cached("COMMIT")?.execute([])?;
            Ok(done)
        });
        match result {
            Ok(done) => {
                let now = Instant::now();
                self.chain.committed(now);
                self.checkpoints.committed(now);
                self.answer_archive(Ok(()));
                Ok(done)
            }
            Err(e) => {
                if !self.conn.is_autocommit() {
                    // Nothing of a failed commit stays: its rows are retried whole next
                    // time, as a group of the same number.
                    let _ = self.conn.execute_batch("ROLLBACK");
                }
                self.chain.rolled_back();
                self.checkpoints.rolled_back();
                self.answer_archive(Err(e.to_string()));
                Err(e)
            }
        }
    }

    /// Tells the retention thread how the commit that recorded its archive went, and
    /// counts the commit (the thread waits for one before it reads what to archive).
    fn answer_archive(&mut self, outcome: Result<(), String>) {
        let Some(retention) = &self.retention else {
            return;
        };
        retention
            .shared
            .commits
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if self.archive_taken.take().is_some() {
            if let Ok(mut answer) = retention.shared.answer.lock() {
                *answer = Some(outcome);
            }
            retention.shared.answered.notify_all();
        }
    }

    /// Folds the WAL back into the database file and truncates it (for shutdown, after
    /// the last commit).
    pub fn checkpoint(&mut self) -> Result<(), LedgerError> {
        self.close_chain()?;
        // The background checkpointer would hold the WAL open against TRUNCATE.
        self.checkpointer.take();
        let _waiting = Waiting::until(self.busy_timeout);
        let (busy, wal_pages, checkpointed): (i64, i64, i64) = self
            .conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?))
            })
            .map_err(|e| {
                LedgerError::new(
                    LedgerErrorKind::Checkpoint,
                    &self.path,
                    format!("checkpoint: {e}"),
                )
            })?;
        if busy != 0 {
            return Err(LedgerError::new(
                LedgerErrorKind::Checkpoint,
                &self.path,
                format!(
                    "checkpoint could not finish ({checkpointed} of {wal_pages} WAL pages): \
                     another connection holds the WAL"
                ),
            ));
        }
        Ok(())
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        if let Err(e) = self.close_chain() {
            crate::warn!("{e}; the next start recovers the chain");
        }
        self.checkpointer.take();
        if self.staged.len() > 0 {
            crate::warn!(
                "ledger {}: closed with {} staged rows not committed",
                self.path.display(),
                self.staged.len()
            );
        }
    }
}

/// The statements of one commit, each looked up in the connection's cache when first
/// used: a commit at one call in flight writes one or two kinds of row, and every lookup
/// (and the reset when it is handed back) costs on the path of every call.
struct Statements<'c> {
    conn: &'c Connection,
    prepared: [Option<rusqlite::CachedStatement<'c>>; ROW_SQL.len()],
}

/// What a commit writes, by [`Statements::get`]'s index.
const ROW_SQL: [&str; 5] = [
    SQL_INSERT_BLOB,
    SQL_INSERT_CALL,
    SQL_END_CALL,
    SQL_INSERT_RULE_EVENT,
    SQL_INSERT_EVENT,
];
const INSERT_BLOB: usize = 0;
const INSERT_CALL: usize = 1;
const END_CALL: usize = 2;
const INSERT_RULE_EVENT: usize = 3;
const INSERT_EVENT: usize = 4;

impl<'c> Statements<'c> {
    fn new(conn: &'c Connection) -> Statements<'c> {
        Statements {
            conn,
            prepared: Default::default(),
        }
    }

    /// The statement of `ROW_SQL[which]`.
    fn get(&mut self, which: usize) -> rusqlite::Result<&mut rusqlite::CachedStatement<'c>> {
        let slot = &mut self.prepared[which];
        if slot.is_none() {
            *slot = Some(self.conn.prepare_cached(ROW_SQL[which])?);
        }
        slot.as_mut().ok_or(rusqlite::Error::InvalidQuery)
    }
}

/// The rows of one commit, inside the transaction [`Ledger::write_staged`] opened: rows
/// changed, rows refused, and the first refusal.
fn write_rows(
    tx: &Connection,
    staged: &Staged,
    dropped: u64,
    chain: &mut ChainWriter,
    seq: i64,
    carry_upto: i64,
) -> rusqlite::Result<(usize, u64, Option<String>)> {
    let mut written = 0usize;
    let mut rejected = 0u64;
    let mut first_refusal = None;
    {
        let mut statements = Statements::new(tx);
        let text = |span: Span| Text(staged.bytes(span));
        let opt_text = |span: Option<Span>| span.map(text);
        let hex = |span: Span| DigestHex(body::hex(&staged.digest(span)));
        let opt_hex = |span: Option<Span>| span.map(hex);
        for op in staged.ops() {
            let result = match *op {
                Op::Blob {
                    ts_ms,
                    digest,
                    body,
                    size,
                    truncated,
                } => statements.get(INSERT_BLOB)?.execute(params![
                    hex(digest),
                    staged.bytes(body),
                    size,
                    truncated,
                    ts_ms,
                    seq
                ]),
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
                } => statements.get(INSERT_CALL)?.execute(params![
                    id,
                    ts_ms,
                    text(transport),
                    text(principal),
                    text(process_name),
                    text(server_name),
                    text(tool_name),
                    text(method),
                    text(request_id),
                    text(decision),
                    opt_text(policy_rule),
                    opt_text(policy_reason),
                    bytes_received,
                    text(arguments_preview),
                    opt_hex(request_digest),
                    seq,
                ]),
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
                } => statements.get(END_CALL)?.execute(params![
                    id,
                    text(decision),
                    opt_text(policy_rule),
                    opt_text(policy_reason),
                    duration_us,
                    opt_text(error_message),
                    bytes_sent,
                    text(response_preview),
                    opt_hex(response_digest),
                    opt_hex(rewritten_digest),
                    opt_hex(original_digest),
                    opt_text(approved_by),
                    decided_at_ms,
                    seq,
                ]),
                Op::RuleEvent {
                    call_id,
                    seq: match_seq,
                    ts_ms,
                    rule_id,
                    action,
                    phase,
                    layer,
                } => statements.get(INSERT_RULE_EVENT)?.execute(params![
                    call_id,
                    text(phase),
                    match_seq,
                    ts_ms,
                    text(rule_id),
                    text(action),
                    text(layer),
                    seq
                ]),
                Op::Event {
                    ts_ms,
                    kind,
                    detail,
                } => statements.get(INSERT_EVENT)?.execute(params![
                    ts_ms,
                    text(kind),
                    text(detail),
                    seq
                ]),
            };
            match result {
                // An outcome whose call row does not exist (its start was dropped, or
                // the id is wrong) is lost too: say so.
                Ok(0) if matches!(op, Op::CallEnd { .. }) => {
                    rejected += 1;
                    if first_refusal.is_none()
                        && let Op::CallEnd { id, .. } = op
                    {
                        first_refusal = Some(format!("no tool_calls row {id} for its outcome"));
                    }
                }
                // A body already stored by a group being archived moves into this one.
                Ok(0) if carry_upto > 0 => {
                    if let Op::Blob { digest, .. } = op {
                        let hash = body::hex(&staged.digest(*digest));
                        let hash = String::from_utf8_lossy(&hash).into_owned();
                        carry(
                            tx,
                            chain,
                            Table::Blobs,
                            &[Value::Text(hash)],
                            carry_upto,
                            seq,
                        )?;
                    }
                }
                Ok(0) => {}
                Ok(changed) => {
                    chain.record(tx, staged, op)?;
                    written += changed;
                }
                Err(e) if is_row_refusal(&e) => {
                    rejected += 1;
                    if first_refusal.is_none() {
                        first_refusal = Some(e.to_string());
                    }
                }
                Err(e) => return Err(e),
            }
        }
        let now = now_ms();
        let mut loss_event = |kind: &str, detail: String| -> rusqlite::Result<()> {
            written += statements
                .get(INSERT_EVENT)?
                .execute(params![now, kind, detail, seq])?;
            chain.event(
                tx.last_insert_rowid(),
                now,
                kind.as_bytes(),
                detail.as_bytes(),
            );
            Ok(())
        };
        if dropped > 0 {
            loss_event(
                EVENT_ROWS_DROPPED,
                serde_json::json!({ "rows": dropped }).to_string(),
            )?;
        }
        if rejected > 0 {
            loss_event(
                EVENT_ROWS_REJECTED,
                serde_json::json!({ "rows": rejected, "first_error": first_refusal }).to_string(),
            )?;
        }
    }
    Ok((written, rejected, first_refusal))
}

/// How often the loop looks for the retention thread's requests.
const RETENTION_POLL: Duration = Duration::from_millis(250);

/// Moves a row of a group being archived (`chain_seq` up to `upto`) into group `seq`, so
/// it stays in the live chain. Returns whether it did.
fn carry(
    tx: &Connection,
    chain: &mut ChainWriter,
    table: Table,
    key: &[Value],
    upto: i64,
    seq: i64,
) -> rusqlite::Result<bool> {
    let condition = table
        .key_columns()
        .split(", ")
        .enumerate()
        .map(|(i, c)| format!("{c} = ?{}", i + 3))
        .collect::<Vec<_>>()
        .join(" AND ");
    let sql = format!(
        "UPDATE {} SET chain_seq = ?1 WHERE chain_seq <= ?2 AND {condition}",
        table.name()
    );
    let mut values: Vec<Value> = vec![Value::Integer(seq), Value::Integer(upto)];
    values.extend_from_slice(key);
    if tx
        .prepare_cached(&sql)?
        .execute(rusqlite::params_from_iter(values.iter()))?
        == 0
    {
        return Ok(false);
    }
    let digest = tx
        .prepare_cached(&table.select_by_key_sql())?
        .query_row(rusqlite::params_from_iter(key.iter()), |row| {
            canonical::row_digest(table, row)
        })?;
    let key_refs: Vec<ValueRef<'_>> = key.iter().map(ValueRef::from).collect();
    chain.carried(table, &key_refs, &digest);
    Ok(true)
}

/// Records an archive in group `seq`: the bodies newer calls still use and the calls still
/// open move into the group, and a `ledger_archived` event says where the chain now starts.
fn record_archive(
    tx: &Connection,
    chain: &mut ChainWriter,
    request: &ArchiveRequest,
    seq: i64,
) -> rusqlite::Result<()> {
    let upto = request.last;
    for hash in &request.keep_blobs {
        carry(
            tx,
            chain,
            Table::Blobs,
            &[Value::Text(hash.clone())],
            upto,
            seq,
        )?;
    }
    for id in chain.open_call_ids() {
        if carry(
            tx,
            chain,
            Table::ToolCalls,
            &[Value::Integer(id)],
            upto,
            seq,
        )? {
            let blob: Option<String> = tx
                .prepare_cached("SELECT request_body_hash FROM tool_calls WHERE id = ?1")?
                .query_row([id], |r| r.get(0))?;
            if let Some(hash) = blob {
                carry(tx, chain, Table::Blobs, &[Value::Text(hash)], upto, seq)?;
            }
        }
    }
    let now = now_ms();
    let detail = serde_json::json!({
        "file": request.file,
        "first_seq": request.first,
        "last_seq": request.last,
        "prev_hash": canonical::hex(&request.prev_hash),
        "last_hash": canonical::hex(&request.last_hash),
        "rows": request.rows,
    })
    .to_string();
    tx.prepare_cached(SQL_INSERT_EVENT)?.execute(params![
        now,
        retention::EVENT_ARCHIVED,
        detail,
        seq
    ])?;
    chain.event(
        tx.last_insert_rowid(),
        now,
        retention::EVENT_ARCHIVED.as_bytes(),
        detail.as_bytes(),
    );
    Ok(())
}

/// Bytes of manifests that may wait for their `ledger_chain` rows.
const CHAIN_FLUSH_BYTES: usize = 256 << 10;

/// Longest `chain_flush_ms`, and most `chain_flush_groups`.
const MAX_CHAIN_FLUSH_MS: u64 = 10_000;
const MAX_CHAIN_FLUSH_GROUPS: usize = 4096;

/// Reads the chain's head, marks the ledger open for this writer, and seals what a writer
/// that did not close cleanly left without `ledger_chain` rows.
fn open_chain(
    conn: &mut Connection,
    cfg: &LedgerConfig,
    key: &SigningKey,
) -> Result<(Head, Option<serde_json::Value>), LedgerError> {
    let path = cfg.path.as_path();
    let fail = |what: &str, e: rusqlite::Error| {
        LedgerError::new(LedgerErrorKind::Open, path, format!("{what}: {e}"))
    };
    let head = chain::read_head(conn)
        .map_err(|e| fail("reading the chain head", e))?
        .unwrap_or(Head::GENESIS);
    // Before marking the ledger open (which would make the next start take an unsigned
    // tail for a crash's): a cleanly closed ledger ends at a signed head.
    let left_open =
        recovery::was_left_open(conn).map_err(|e| fail("reading the writer state", e))?;
    let signed = refuse_unsigned_tail(conn, cfg, key, head, !left_open)?;
    // Left open: a crash can leave written but unsigned groups, and so can someone who
    // set `open = 1` and appended groups; nothing here tells them apart. The groups are
    // recorded as unvouched (verify lists them) before this gateway's signatures cover them.
    let unsigned = (left_open && head.seq > signed).then(|| {
        crate::error!(
            "ledger {}: groups {}..{} were written after the last head this gateway signed \
             (group {signed}) and the last gateway did not close the ledger: only an anchor \
             shipped off the machine vouches for them; recorded as a {} event",
            path.display(),
            signed + 1,
            head.seq,
            chain::EVENT_UNSIGNED_TAIL
        );
        serde_json::json!({ "unsigned_groups": [signed + 1, head.seq], "signed_seq": signed })
    });
    let unclean = recovery::mark_open(conn).map_err(|e| fail("marking the ledger open", e))?;
    let head = if unclean {
        match recovery::recover(conn, head).map_err(|e| fail("recovering the chain", e))? {
            Err(refused) => {
                return Err(LedgerError::new(
                    LedgerErrorKind::Open,
                    path,
                    format!(
                        "the last gateway did not close the ledger, and rows after the chain's \
                         last group (group {}) are not what its unwritten groups could hold; \
                         refusing to seal them into the chain: {}. Run `toolwall ledger \
                         verify`, keep the file as evidence and move it aside to start a new \
                         ledger",
                        head.seq,
                        refused.join("; ")
                    ),
                ));
            }
            Ok(Some(found)) => {
                crate::warn!(
                    "ledger {}: the last gateway stopped without closing it; the {} rows of \
                     groups {}..{} (committed, their chain rows not yet written) were sealed \
                     by recovery group {} and the recovery recorded",
                    path.display(),
                    found.rows,
                    found.unwritten.0,
                    found.unwritten.1,
                    found.head.seq
                );
                found.head
            }
            Ok(None) => head,
        }
    } else {
        head
    };
    Ok((head, unsigned))
}

/// A ledger the last gateway closed ends at the head it signed at close: groups after the
/// last head signed by this key (in `ledger_checkpoints`, or the head file) were added by
/// someone else, and signing over them would vouch for them. Refuses to continue such a
/// chain (fails closed), naming the groups.
fn refuse_unsigned_tail(
    conn: &Connection,
    cfg: &LedgerConfig,
    key: &SigningKey,
    head: Head,
    refuse: bool,
) -> Result<i64, LedgerError> {
    let path = cfg.path.as_path();
    if head == Head::GENESIS {
        return Ok(0);
    }
    let public_key = key.public_key();
    let in_db = checkpoints::last_valid_signed(conn, &public_key).map_err(|e| {
        LedgerError::new(
            LedgerErrorKind::Open,
            path,
            format!("reading the checkpoints: {e}"),
        )
    })?;
    let in_file = match anchor::read_head_file(&cfg.head_file_path()) {
        Ok(Some(signed)) if signed.verify_with(&public_key) => {
            let stored: Option<Vec<u8>> = conn
                .query_row(
                    "SELECT hash FROM ledger_chain WHERE seq = ?1",
                    [signed.seq],
                    |r| r.get(0),
                )
                .ok();
            if stored.as_deref() == Some(&signed.hash[..]) {
                signed.seq
            } else {
                0
            }
        }
        _ => 0,
    };
    let signed = in_db.max(in_file);
    if head.seq <= signed || !refuse {
        return Ok(signed);
    }
    Err(LedgerError::new(
        LedgerErrorKind::Open,
        path,
        format!(
            "the ledger was closed cleanly, but groups {}..{} come after the last head this              gateway signed (group {signed}; key {}): they were added after it closed, or              their signatures were removed. Refusing to continue (and sign) this chain; run              `toolwall ledger verify`, keep the file as evidence and move it aside to start              a new ledger",
            signed + 1,
            head.seq,
            chain::signing::format_public_key(&public_key)
        ),
    ))
}

/// Starts the anchor thread that ships what `key` signs.
fn open_checkpoints(
    conn: &Connection,
    cfg: &LedgerConfig,
    key: SigningKey,
) -> Result<Checkpoints, LedgerError> {
    let path = cfg.path.as_path();
    let last = checkpoints::last_signed(conn).map_err(|e| {
        LedgerError::new(
            LedgerErrorKind::Open,
            path,
            format!("reading the last checkpoint: {e}"),
        )
    })?;
    let anchor = Anchor::start(AnchorConfig {
        head_file: cfg.head_file_path(),
        command: cfg.anchor_command.clone(),
        timeout: Duration::from_millis(cfg.anchor_timeout_ms),
    })
    .map_err(|e| LedgerError::new(LedgerErrorKind::Open, path, format!("anchor thread: {e}")))?;
    Ok(Checkpoints::new(
        key,
        cfg.checkpoint_groups,
        Duration::from_secs(cfg.checkpoint_secs),
        last,
        anchor,
    ))
}

/// Compares the database with the last head signed for it (the head file next to it). A
/// database without that group, or with another hash there, was cut off or replaced by
/// an older copy: logged as an error, and returned as the detail of the event recording it.
fn compare_signed_head(
    conn: &Connection,
    cfg: &LedgerConfig,
    checkpoints: &Checkpoints,
) -> Option<serde_json::Value> {
    let file = cfg.head_file_path();
    let signed = match anchor::read_head_file(&file) {
        Ok(Some(signed)) => signed,
        Ok(None) => return None,
        Err(e) => {
            crate::warn!("ledger: head file {} unreadable: {e}", file.display());
            return None;
        }
    };
    if !signed.verify_with(&checkpoints.public_key()) {
        crate::warn!(
            "ledger: head file {} is not signed by this ledger's key; ignored",
            file.display()
        );
        return None;
    }
    let found: Option<Vec<u8>> = conn
        .query_row(
            "SELECT hash FROM ledger_chain WHERE seq = ?1",
            [signed.seq],
            |r| r.get(0),
        )
        .ok();
    let what = match found {
        Some(hash) if hash == signed.hash => return None,
        Some(_) => "holds another group under that number (replaced or rewritten)",
        None => "does not reach that group (its last groups were lost, or it is an older copy)",
    };
    crate::error!(
        "ledger {}: the last signed head ({}) is group {} signed at {}; this database {what}",
        cfg.path.display(),
        file.display(),
        signed.seq,
        super::format_utc_ms(signed.signed_at_ms)
    );
    Some(serde_json::json!({
        "signed_seq": signed.seq,
        "signed_hash": chain::canonical::hex(&signed.hash),
        "signed_at_ms": signed.signed_at_ms,
        "problem": what,
    }))
}

fn validate(cfg: &LedgerConfig) -> Result<(), LedgerError> {
    let bad = |what: String| Err(LedgerError::new(LedgerErrorKind::Config, &cfg.path, what));
    if cfg.path.as_os_str().is_empty() {
        return bad("ledger.path is empty".into());
    }
    if cfg.max_staged_rows == 0 {
        return bad("ledger.max_staged_rows must be at least 1".into());
    }
    if cfg.chain_flush_groups == 0 || cfg.chain_flush_groups > MAX_CHAIN_FLUSH_GROUPS {
        return bad(format!(
            "ledger.chain_flush_groups {} must be between 1 and {MAX_CHAIN_FLUSH_GROUPS}",
            cfg.chain_flush_groups
        ));
    }
    if cfg.checkpoint_groups == 0 || cfg.checkpoint_secs == 0 {
        return bad(
            "ledger.checkpoint_groups and ledger.checkpoint_secs must be at least 1".into(),
        );
    }
    if cfg.checkpoint_secs > crate::config::MAX_TIMEOUT_SECS
        || cfg.anchor_timeout_ms > crate::config::MAX_TIMEOUT_SECS * 1000
    {
        return bad(format!(
            "ledger.checkpoint_secs and ledger.anchor_timeout_ms must be at most a day ({} s)",
            crate::config::MAX_TIMEOUT_SECS
        ));
    }
    if cfg
        .anchor_command
        .as_ref()
        .is_some_and(|c| c.first().is_none_or(String::is_empty))
    {
        return bad(
            "ledger.anchor_command must name a program (an array: program, arguments)".into(),
        );
    }
    if cfg.retention_batch_rows == 0 || cfg.retention_batch_rows > 100_000 {
        return bad(format!(
            "ledger.retention_batch_rows {} must be between 1 and 100000",
            cfg.retention_batch_rows
        ));
    }
    if cfg.retention_check_secs == 0
        || cfg.retention_check_secs > crate::config::MAX_TIMEOUT_SECS
        || cfg.retention_pause_ms > 60_000
    {
        return bad(
            "ledger.retention_check_secs must be between 1 and 86400, retention_pause_ms at \
             most 60000"
                .into(),
        );
    }
    if cfg.chain_flush_ms > MAX_CHAIN_FLUSH_MS {
        return bad(format!(
            "ledger.chain_flush_ms {} is above {MAX_CHAIN_FLUSH_MS}",
            cfg.chain_flush_ms
        ));
    }
    if cfg.busy_timeout_ms > MAX_BUSY_TIMEOUT_MS {
        return bad(format!(
            "ledger.busy_timeout_ms {} is above {MAX_BUSY_TIMEOUT_MS} (the gateway's loop waits \
             with a commit)",
            cfg.busy_timeout_ms
        ));
    }
    if cfg.wal_restart_bytes < MIN_WAL_RESTART_BYTES {
        return bad(format!(
            "ledger.wal_restart_bytes {} is below {MIN_WAL_RESTART_BYTES} (a restart per \
             handful of commits would hold the writer back all the time)",
            cfg.wal_restart_bytes
        ));
    }
    if cfg.body_cap_bytes > MAX_BODY_CAP_BYTES {
        return bad(format!(
            "ledger.body_cap_bytes {} is above {MAX_BODY_CAP_BYTES}",
            cfg.body_cap_bytes
        ));
    }
    for (key, value) in [
        ("preview_bytes", cfg.preview_bytes),
        ("text_cap_bytes", cfg.text_cap_bytes),
    ] {
        if value > MAX_TEXT_BYTES {
            return bad(format!("ledger.{key} {value} is above {MAX_TEXT_BYTES}"));
        }
    }
    // The largest single staged op must fit: a capped body (blob, or an event's detail
    // and kind), or a call row's texts, digests and preview.
    let largest_op = (cfg.body_cap_bytes + cfg.text_cap_bytes)
        .max(cfg.preview_bytes + 16 * cfg.text_cap_bytes)
        + 1024;
    if cfg.max_staged_bytes < largest_op || cfg.max_staged_bytes > MAX_STAGED_BYTES {
        return bad(format!(
            "ledger.max_staged_bytes {} must be between {largest_op} (one full row) and \
             {MAX_STAGED_BYTES}",
            cfg.max_staged_bytes
        ));
    }
    Ok(())
}
