//! Retention that keeps the proof: groups older than `retain_days` (or the oldest ones while
//! the ledger's data outgrows `max_bytes`) move to archive files, one per UTC day at most,
//! and then leave the live database in small batches, on a thread of their own.
//!
//! One run, for groups A..B (the oldest ones):
//! 1. The thread tells the writer it is archiving up to B (`Shared::archiving_upto`) and
//!    waits for the writer's next commit: from then on a body the writer finds already
//!    stored (a deduplicated blob of an archived group) is moved into the writer's group.
//! 2. It writes the archive (`archive_file`): the groups, the rows they last wrote, their
//!    checkpoints, anchored at both ends by hashes; synced, then renamed into place.
//! 3. It hands the writer the bodies still referenced by newer calls. In its next commit
//!    the writer moves them, and the calls still open, into that commit's group (so they
//!    stay in the live chain), and records a `ledger_archived` event (file, A, B, the hash
//!    before A and the hash of B): the live chain then starts after B.
//! 4. It deletes the archived rows by key, `batch_rows` per transaction with a pause
//!    between, then the groups and checkpoints; a commit of the gateway waits for at most
//!    one batch.
//!
//! A run interrupted (crash, stop) resumes its deletions at the next start.

pub mod archive_file;

use rusqlite::types::{Value, ValueRef};
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::ledger::chain::canonical::{self, Digest, GENESIS, Table};
use crate::ledger::chain::signing::SignedHead;
use archive_file::{ArchiveWriter, value_json};

/// Event kind recording an archive; its detail says where the live chain now starts.
pub const EVENT_ARCHIVED: &str = "ledger_archived";

/// Most groups one run archives (a day of heavy traffic takes several runs).
const MAX_GROUPS_PER_RUN: i64 = 200_000;
/// Longest the thread waits for the writer to take a request.
const WRITER_WAIT: Duration = Duration::from_secs(30);

/// `[ledger]` retention keys, resolved.
#[derive(Debug, Clone)]
pub struct RetentionConfig {
    pub ledger: PathBuf,
    /// Groups older than this are archived (`retain_days`).
    pub retain: Option<Duration>,
    /// Archive the oldest day while the live data is larger than this (`max_bytes`).
    pub max_bytes: Option<u64>,
    pub archive_dir: PathBuf,
    pub batch_rows: usize,
    pub pause: Duration,
    pub every: Duration,
    pub busy_timeout: Duration,
}

/// What the thread asks the writer to do in its next commit.
#[derive(Debug, Clone)]
pub struct ArchiveRequest {
    pub file: String,
    pub first: i64,
    pub last: i64,
    pub prev_hash: Digest,
    pub last_hash: Digest,
    pub rows: u64,
    /// Blobs of archived groups that newer calls still refer to.
    pub keep_blobs: Vec<String>,
}

/// State shared by the writer and the retention thread.
#[derive(Default)]
pub struct Shared {
    /// Groups up to this are being archived (0: none).
    pub archiving_upto: AtomicI64,
    /// Commits the writer finished.
    pub commits: AtomicU64,
    pub request: Mutex<Option<ArchiveRequest>>,
    /// The writer's answer to the request it took.
    pub answer: Mutex<Option<Result<(), String>>>,
    pub answered: Condvar,
    pub stop: AtomicBool,
    pub stop_lock: Mutex<()>,
    pub wake: Condvar,
}

pub struct Retention {
    pub shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Retention {
    pub fn start(config: RetentionConfig) -> std::io::Result<Retention> {
        let shared = Arc::new(Shared::default());
        let theirs = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("ledger-retention".into())
            .spawn(move || run(&config, &theirs))?;
        Ok(Retention {
            shared,
            thread: Some(thread),
        })
    }
}

impl Drop for Retention {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let _guard = self.shared.stop_lock.lock();
            self.shared.wake.notify_all();
        }
        self.shared.answered.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn stopping(shared: &Shared) -> bool {
    shared.stop.load(Ordering::SeqCst)
}

/// Sleeps `period` unless stopped; false when stopped.
fn sleep(shared: &Shared, period: Duration) -> bool {
    let Ok(guard) = shared.stop_lock.lock() else {
        return false;
    };
    if stopping(shared) {
        return false;
    }
    let _ = shared.wake.wait_timeout(guard, period);
    !stopping(shared)
}

fn run(config: &RetentionConfig, shared: &Shared) {
    // A first pass soon after start (it resumes an interrupted run), then periodically.
    let mut period = Duration::from_secs(2);
    while sleep(shared, period) {
        period = config.every;
        loop {
            match run_once(config, shared) {
                Ok(true) if !stopping(shared) => continue, // more to do
                Ok(_) => break,
                Err(e) => {
                    crate::warn!(
                        "ledger retention: {e}; retrying in {} s",
                        config.every.as_secs()
                    );
                    break;
                }
            }
        }
        shared.archiving_upto.store(0, Ordering::SeqCst);
    }
}

fn open(config: &RetentionConfig) -> Result<Connection, String> {
    let conn = Connection::open_with_flags(
        &config.ledger,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| format!("open: {e}"))?;
    conn.busy_timeout(config.busy_timeout)
        .map_err(|e| e.to_string())?;
    // The ledger's checkpoint thread folds the WAL back; an automatic checkpoint here would
    // run (fsync included) at the end of a deletion transaction.
    conn.execute_batch("PRAGMA wal_autocheckpoint = 0;")
        .map_err(|e| e.to_string())?;
    Ok(conn)
}

/// The archived range whose deletions may be unfinished: (first, last) of the newest
/// `ledger_archived` event, if groups of it are still in `ledger_chain`.
fn unfinished(conn: &Connection) -> rusqlite::Result<Option<(i64, i64)>> {
    let detail: Option<String> = conn
        .query_row(
            "SELECT detail FROM events WHERE kind = ?1 ORDER BY id DESC LIMIT 1",
            [EVENT_ARCHIVED],
            |r| r.get(0),
        )
        .optional()?;
    let Some(range) = detail
        .and_then(|d| serde_json::from_str::<serde_json::Value>(&d).ok())
        .and_then(|d| Some((d["first_seq"].as_i64()?, d["last_seq"].as_i64()?)))
    else {
        return Ok(None);
    };
    let oldest: Option<i64> =
        conn.query_row("SELECT min(seq) FROM ledger_chain", [], |r| r.get(0))?;
    Ok(oldest.filter(|o| *o <= range.1).map(|_| range))
}

/// Bytes of live data (pages in use).
fn live_bytes(conn: &Connection) -> rusqlite::Result<u64> {
    let (pages, free, size): (i64, i64, i64) = conn.query_row(
        "SELECT (SELECT page_count FROM pragma_page_count), (SELECT freelist_count FROM \
         pragma_freelist_count), (SELECT page_size FROM pragma_page_size)",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    Ok(u64::try_from((pages - free).max(0) * size).unwrap_or(0))
}

/// The groups to archive now: from the oldest one, those older than the cutoff and on
/// the oldest one's UTC day, never the newest group.
fn plan(config: &RetentionConfig, conn: &Connection) -> Result<Option<(i64, i64)>, String> {
    let e = |e: rusqlite::Error| e.to_string();
    let bounds: (Option<i64>, Option<i64>, Option<i64>) = conn
        .query_row(
            "SELECT (SELECT min(seq) FROM ledger_chain), (SELECT max(seq) FROM ledger_chain), \
             (SELECT ts_ms FROM ledger_chain ORDER BY seq LIMIT 1)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .map_err(e)?;
    let (Some(first), Some(newest), Some(first_ts)) = bounds else {
        return Ok(None);
    };
    let now = crate::ledger::now_ms();
    let day_end = (first_ts.div_euclid(86_400_000) + 1) * 86_400_000;
    let mut cutoff = config.retain.map_or(i64::MIN, |r| {
        now - i64::try_from(r.as_millis()).unwrap_or(i64::MAX)
    });
    if let Some(max) = config.max_bytes
        && live_bytes(conn).map_err(e)? > max
    {
        cutoff = cutoff.max(day_end);
    }
    let cutoff = cutoff.min(day_end);
    let last: Option<i64> = conn
        .query_row(
            "SELECT max(seq) FROM ledger_chain WHERE seq BETWEEN ?1 AND ?2 AND ts_ms < ?3",
            params![
                first,
                (first + MAX_GROUPS_PER_RUN - 1).min(newest - 1),
                cutoff
            ],
            |r| r.get(0),
        )
        .map_err(e)?;
    Ok(last.map(|last| (first, last)))
}

/// One run; `Ok(true)` when it archived something (there may be more).
fn run_once(config: &RetentionConfig, shared: &Shared) -> Result<bool, String> {
    let conn = open(config)?;
    if let Some((first, last)) = unfinished(&conn).map_err(|e| e.to_string())? {
        shared.archiving_upto.store(last, Ordering::SeqCst);
        delete(config, shared, &conn, first, last)?;
        return Ok(true);
    }
    let Some((first, last)) = plan(config, &conn)? else {
        return Ok(false);
    };
    // 1. From the writer's next commit on, a reused body of these groups moves forward.
    let seen = shared.commits.load(Ordering::SeqCst);
    shared.archiving_upto.store(last, Ordering::SeqCst);
    let waited = Instant::now();
    while shared.commits.load(Ordering::SeqCst) == seen
        && waited.elapsed() < Duration::from_millis(500)
    {
        if !sleep(shared, Duration::from_millis(5)) {
            return Ok(false);
        }
    }
    // 2. The archive.
    let started = Instant::now();
    let request = export(config, &conn, first, last)?;
    let exported = started.elapsed();
    // 3. The writer moves what stays live and records the archive.
    if let Ok(mut answer) = shared.answer.lock() {
        *answer = None;
    }
    if let Ok(mut slot) = shared.request.lock() {
        *slot = Some(request.clone());
    }
    let answer = {
        let Ok(mut answer) = shared.answer.lock() else {
            return Err("lock poisoned".into());
        };
        let deadline = Instant::now() + WRITER_WAIT;
        while answer.is_none() && !stopping(shared) && Instant::now() < deadline {
            answer = match shared
                .answered
                .wait_timeout(answer, Duration::from_millis(100))
            {
                Ok((a, _)) => a,
                Err(_) => return Err("lock poisoned".into()),
            };
        }
        answer.take()
    };
    match answer {
        Some(Ok(())) => {}
        Some(Err(e)) => return Err(format!("the writer could not record the archive: {e}")),
        None => {
            if let Ok(mut slot) = shared.request.lock() {
                slot.take();
            }
            let _ = std::fs::remove_file(config.archive_dir.join(&request.file));
            return Err("the gateway did not take the archive request in time".into());
        }
    }
    // 4. Out of the live database.
    let deleting = Instant::now();
    LONGEST_HOLD_US.store(0, Ordering::Relaxed);
    let deleted = delete(config, shared, &conn, first, last)?;
    crate::info!(
        "ledger retention: groups {first}..{last} ({} rows) archived to {} in {:.1} s, {deleted} \
         rows deleted in {:.1} s (the write lock held at most {:.1} ms at a time)",
        request.rows,
        config.archive_dir.join(&request.file).display(),
        exported.as_secs_f64(),
        deleting.elapsed().as_secs_f64(),
        LONGEST_HOLD_US.load(Ordering::Relaxed) as f64 / 1000.0
    );
    Ok(true)
}

/// Writes groups `first..=last`, the rows they last wrote and their checkpoints; returns
/// what the writer must record.
fn export(
    config: &RetentionConfig,
    conn: &Connection,
    first: i64,
    last: i64,
) -> Result<ArchiveRequest, String> {
    let e = |e: rusqlite::Error| format!("reading the groups to archive: {e}");
    let io = |e: std::io::Error| format!("writing the archive: {e}");
    // No transaction around the whole export: one would keep the WAL from restarting for
    // as long as the export runs. The groups do not change; a row the writer moves forward
    // meanwhile (an open call ending, a body reused) is then exported in its older state
    // or not at all, and the live chain covers it either way.
    (|| {
        let prev_hash: Digest = if first == 1 {
            GENESIS
        } else {
            archived_hash_before(conn, first)
                .map_err(e)?
                .ok_or_else(|| {
                    format!(
                        "the hash of group {} (before the oldest one) is not recorded",
                        first - 1
                    )
                })?
        };
        let first_ts: i64 = conn
            .query_row(
                "SELECT ts_ms FROM ledger_chain WHERE seq = ?1",
                [first],
                |r| r.get(0),
            )
            .map_err(e)?;
        let name = format!(
            "ledger-{first:012}-{last:012}-{}.jsonl.gz",
            &crate::ledger::format_utc_ms(first_ts)[..10]
        );
        let mut out = ArchiveWriter::create(&config.archive_dir, &name, first, last, &prev_hash)
            .map_err(io)?;
        let mut last_hash = prev_hash;
        let mut blobs = Vec::new();
        let mut groups = conn
            .prepare("SELECT seq, ts_ms, records, hash FROM ledger_chain WHERE seq BETWEEN ?1 AND ?2 ORDER BY seq")
            .map_err(e)?;
        let mut rows = groups.query([first, last]).map_err(e)?;
        let selects: Vec<String> = Table::ALL.iter().map(|t| t.select_by_key_sql()).collect();
        while let Some(g) = rows.next().map_err(e)? {
            let seq: i64 = g.get(0).map_err(e)?;
            let records: Vec<u8> = g.get(2).map_err(e)?;
            let hash: Digest = g
                .get::<_, Vec<u8>>(3)
                .map_err(e)?
                .try_into()
                .map_err(|_| format!("group {seq}: hash is not 32 bytes"))?;
            out.group(seq, g.get(1).map_err(e)?, &records, &hash)
                .map_err(io)?;
            last_hash = hash;
            // The rows this group wrote last (an entry repeated in the group counts once).
            let entries = canonical::parse_manifest(&records).unwrap_or_default();
            let mut seen = std::collections::HashSet::new();
            for entry in entries.iter().rev() {
                if !seen.insert((entry.table, entry.key_bytes.clone())) {
                    continue;
                }
                let index = Table::ALL
                    .iter()
                    .position(|t| *t == entry.table)
                    .unwrap_or(0);
                let row: Option<Vec<serde_json::Value>> = conn
                    .prepare_cached(&selects[index])
                    .map_err(e)?
                    .query_row(rusqlite::params_from_iter(entry.key.iter()), |r| {
                        if !matches!(r.get_ref(entry.table.chain_seq_index())?, ValueRef::Integer(s) if s == seq) {
                            return Ok(None);
                        }
                        (0..entry.table.column_count())
                            .map(|i| r.get_ref(i).map(value_json))
                            .collect::<Result<Vec<_>, _>>()
                            .map(Some)
                    })
                    .optional()
                    .map_err(e)?
                    .flatten();
                if let Some(values) = row {
                    if entry.table == Table::Blobs
                        && let Some(h) = values.first().and_then(|v| v.as_str())
                    {
                        blobs.push(h.to_owned());
                    }
                    out.row(entry.table, values).map_err(io)?;
                }
            }
        }
        drop(rows);
        if first == 1 {
            // The rows older than the chain, sealed by group 1.
            for table in Table::ALL {
                let mut stmt = conn
                    .prepare(&format!(
                        "SELECT {} FROM {} WHERE chain_seq IS NULL ORDER BY {}",
                        table.columns(),
                        table.name(),
                        table.key_columns()
                    ))
                    .map_err(e)?;
                let mut found = stmt.query([]).map_err(e)?;
                while let Some(r) = found.next().map_err(e)? {
                    let values = (0..table.column_count())
                        .map(|i| r.get_ref(i).map(value_json))
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(e)?;
                    out.row(table, values).map_err(io)?;
                }
            }
        }
        let mut stmt = conn
            .prepare("SELECT seq, signed_at_ms, hash, public_key, signature FROM ledger_checkpoints WHERE seq BETWEEN ?1 AND ?2 ORDER BY seq")
            .map_err(e)?;
        let mut found = stmt.query([first, last]).map_err(e)?;
        while let Some(r) = found.next().map_err(e)? {
            let head = (|| -> Option<SignedHead> {
                Some(SignedHead {
                    seq: r.get(0).ok()?,
                    signed_at_ms: r.get(1).ok()?,
                    hash: r.get::<_, Vec<u8>>(2).ok()?.try_into().ok()?,
                    public_key: r.get::<_, Vec<u8>>(3).ok()?.try_into().ok()?,
                    signature: r.get::<_, Vec<u8>>(4).ok()?.try_into().ok()?,
                })
            })();
            if let Some(head) = head {
                out.checkpoint(&head).map_err(io)?;
            }
        }
        // Bodies newer calls still refer to stay live.
        let keep = still_referenced(conn, last, &blobs).map_err(e)?;
        let (path, rows, _bytes) = out.finish().map_err(io)?;
        Ok(ArchiveRequest {
            file: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            first,
            last,
            prev_hash,
            last_hash,
            rows,
            keep_blobs: keep,
        })
    })()
}

/// The hash of group `first - 1`, from the `ledger_archived` event that moved it.
pub fn archived_hash_before(conn: &Connection, first: i64) -> rusqlite::Result<Option<Digest>> {
    let mut stmt = conn.prepare("SELECT detail FROM events WHERE kind = ?1 ORDER BY id DESC")?;
    let mut rows = stmt.query([EVENT_ARCHIVED])?;
    while let Some(r) = rows.next()? {
        let detail: String = r.get(0)?;
        let Ok(d) = serde_json::from_str::<serde_json::Value>(&detail) else {
            continue;
        };
        if d["last_seq"].as_i64() == Some(first - 1) {
            return Ok(d["last_hash"].as_str().and_then(canonical::from_hex));
        }
    }
    Ok(None)
}

/// Of `blobs`, those a call row of a later group refers to.
fn still_referenced(
    conn: &Connection,
    last: i64,
    blobs: &[String],
) -> rusqlite::Result<Vec<String>> {
    if blobs.is_empty() {
        return Ok(Vec::new());
    }
    let wanted: std::collections::HashSet<&str> = blobs.iter().map(String::as_str).collect();
    let mut keep = std::collections::HashSet::new();
    let mut stmt = conn.prepare(
        "SELECT request_body_hash, response_body_hash, rewritten_arguments_hash, \
         original_response_hash FROM tool_calls WHERE chain_seq > ?1 OR chain_seq IS NULL",
    )?;
    let mut rows = stmt.query([last])?;
    while let Some(r) = rows.next()? {
        for i in 0..4 {
            if let ValueRef::Text(t) = r.get_ref(i)?
                && let Ok(t) = std::str::from_utf8(t)
                && wanted.contains(t)
            {
                keep.insert(t.to_owned());
            }
        }
    }
    Ok(keep.into_iter().collect())
}

/// Deletes the rows groups `first..=last` last wrote (by key, `batch_rows` per
/// transaction), then the groups and their checkpoints. Returns the rows deleted.
fn delete(
    config: &RetentionConfig,
    shared: &Shared,
    conn: &Connection,
    first: i64,
    last: i64,
) -> Result<u64, String> {
    let e = |e: rusqlite::Error| format!("deleting archived rows: {e}");
    let mut deleted = 0u64;
    let mut keys: Vec<(Table, Vec<Value>)> = Vec::new();
    let mut seq = first;
    let statements: Vec<String> = Table::ALL
        .iter()
        .map(|t| {
            let condition = t
                .key_columns()
                .split(", ")
                .enumerate()
                .map(|(i, c)| format!("{c} = ?{}", i + 1))
                .collect::<Vec<_>>()
                .join(" AND ");
            format!(
                "DELETE FROM {} WHERE {condition} AND (chain_seq BETWEEN {first} AND {last} \
                 OR ({first} = 1 AND chain_seq IS NULL))",
                t.name()
            )
        })
        .collect();
    let flush = |keys: &mut Vec<(Table, Vec<Value>)>| -> Result<u64, String> {
        if keys.is_empty() {
            return Ok(0);
        }
        in_write_transaction(conn, || {
            let mut n = 0u64;
            for (table, key) in keys.drain(..) {
                let index = Table::ALL.iter().position(|t| *t == table).unwrap_or(0);
                n += conn
                    .prepare_cached(&statements[index])?
                    .execute(rusqlite::params_from_iter(key.iter()))? as u64;
            }
            Ok(n)
        })
        .map_err(e)
    };
    while seq <= last {
        if stopping(shared) {
            return Err("stopped; the deletion resumes at the next start".into());
        }
        let records: Option<Vec<u8>> = conn
            .query_row(
                "SELECT records FROM ledger_chain WHERE seq = ?1",
                [seq],
                |r| r.get(0),
            )
            .optional()
            .map_err(e)?;
        seq += 1;
        for entry in canonical::parse_manifest(&records.unwrap_or_default()).unwrap_or_default() {
            keys.push((entry.table, entry.key));
            if keys.len() >= config.batch_rows {
                deleted += flush(&mut keys)?;
                std::thread::sleep(config.pause);
            }
        }
    }
    if first == 1 {
        // The rows older than the chain, sealed by group 1: their keys are read first, so
        // no write transaction scans a table.
        for table in Table::ALL {
            let mut stmt = conn
                .prepare(&format!(
                    "SELECT {} FROM {} WHERE chain_seq IS NULL",
                    table.key_columns(),
                    table.name()
                ))
                .map_err(e)?;
            let legacy: Vec<Vec<Value>> = stmt
                .query_map([], |r| {
                    (0..table.key_len()).map(|i| r.get::<_, Value>(i)).collect()
                })
                .map_err(e)?
                .collect::<Result<_, _>>()
                .map_err(e)?;
            for key in legacy {
                keys.push((table, key));
                if keys.len() >= config.batch_rows {
                    deleted += flush(&mut keys)?;
                    std::thread::sleep(config.pause);
                }
            }
        }
    }
    deleted += flush(&mut keys)?;
    // The groups and their checkpoints go last: until then a reader sees which groups the
    // remaining rows belong to.
    let mut from = first;
    // A group's row holds its manifest (a few pages): fewer groups than rows per batch.
    let groups_per_batch = i64::try_from((config.batch_rows / 10).max(1)).unwrap_or(10);
    while from <= last {
        let to = (from + groups_per_batch - 1).min(last);
        in_write_transaction(conn, || {
            conn.execute(
                "DELETE FROM ledger_checkpoints WHERE seq BETWEEN ?1 AND ?2",
                [from, to],
            )?;
            conn.execute(
                "DELETE FROM ledger_chain WHERE seq BETWEEN ?1 AND ?2",
                [from, to],
            )
        })
        .map_err(e)?;
        from = to + 1;
        std::thread::sleep(config.pause);
    }
    Ok(deleted)
}

/// The longest a deletion transaction held the write lock, in microseconds (for the log).
static LONGEST_HOLD_US: AtomicU64 = AtomicU64::new(0);

/// Runs `f` in a `BEGIN IMMEDIATE` transaction (the write lock taken up front, waiting with
/// the busy timeout), rolled back if it fails.
fn in_write_transaction<T>(
    conn: &Connection,
    f: impl FnOnce() -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let held = Instant::now();
    let result = f().and_then(|v| conn.execute_batch("COMMIT").map(|()| v));
    LONGEST_HOLD_US.fetch_max(
        u64::try_from(held.elapsed().as_micros()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
    match result {
        Ok(v) => Ok(v),
        Err(err) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(err)
        }
    }
}
