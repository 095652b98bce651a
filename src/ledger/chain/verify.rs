//! `toolwall ledger verify`: recomputes the chain from its first group and checks every
//! chained row against the last group that wrote it, inside one read transaction (a
//! consistent snapshot of a live ledger; the gateway keeps writing meanwhile).
//!
//! What is checked, and what each failure means:
//! - each group's hash is recomputed from the previous group's hash and its own manifest,
//!   and the groups are numbered without gaps: an edited, removed or reordered group;
//! - each manifest entry's row exists and, unless a later group rewrote it (its
//!   `chain_seq` is later), has exactly the digest the group recorded: an edited, deleted
//!   or swapped row;
//! - every table holds exactly the rows some group's entry accounts for: a row added or
//!   re-pointed after the fact;
//! - the rows older than the chain still hash to the seal in the chain's first row.

use rusqlite::types::{Value, ValueRef};
use rusqlite::{Connection, OptionalExtension, params_from_iter};
use std::collections::{HashMap, HashSet};

use super::canonical::{self, Digest, Entry, GENESIS, Table};
use super::seal::{self, LegacySeal};
use super::signing::{PUBLIC_KEY_LEN, SignedHead, format_public_key};
use super::{EVENT_CHAIN_RECOVERED, EVENT_CHAIN_START, Head};

/// Problems listed in full; beyond it they are counted.
pub const DEFAULT_MAX_PROBLEMS: usize = 20;

/// Manifests kept parsed while looking for rows no group accounts for.
const MANIFEST_CACHE: usize = 256;

/// One thing that does not match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The group it was found in, when there is one.
    pub group: Option<i64>,
    /// When that group was committed (Unix ms).
    pub group_ts_ms: Option<i64>,
    pub what: String,
}

/// What `verify` found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub groups: u64,
    /// First and last group: (seq, committed at ms).
    pub first_group: Option<(i64, i64)>,
    pub last_group: Option<(i64, i64)>,
    /// The head the stored hashes end at.
    pub head: Option<Head>,
    /// Rows each table holds that the chain accounts for, in [`Table::ALL`] order.
    pub chained_rows: [u64; 4],
    /// Rows older than the chain, sealed by its first row.
    pub legacy_rows: [u64; 4],
    /// Everything that did not match, earliest group first (at most `max_problems`).
    pub problems: Vec<Problem>,
    /// Problems found beyond the listed ones.
    pub more_problems: u64,
    /// What an auditor should know that is not a failure: recoveries after an unclean
    /// stop, the seal of rows older than the chain.
    pub notes: Vec<String>,
    /// Rows committed by an open writer whose groups' chain rows are not written yet.
    pub waiting_rows: u64,
    pub signatures: Signatures,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.problems.is_empty() && self.more_problems == 0
    }
}

/// How to verify.
#[derive(Debug, Clone)]
pub struct Options {
    pub max_problems: usize,
    /// The key the checkpoints must be signed with (`--public-key`). Without it they are
    /// checked against the key each one names, which proves nothing about who signed.
    pub trusted_key: Option<[u8; PUBLIC_KEY_LEN]>,
    /// Signed heads shipped off the machine (`--anchor`): the ledger must hold each one's
    /// group with its hash.
    pub anchors: Vec<SignedHead>,
    /// Archives to check, and to tie to the live chain (`--archive DIR`).
    pub archive_dir: Option<std::path::PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_problems: DEFAULT_MAX_PROBLEMS,
            trusted_key: None,
            anchors: Vec::new(),
            archive_dir: None,
        }
    }
}

/// What the signatures showed.
#[derive(Debug, Clone, Default)]
pub struct Signatures {
    /// Checkpoints in the ledger, and the last one: (seq, signed at ms).
    pub checkpoints: u64,
    pub last: Option<(i64, i64)>,
    /// The key they were checked against, and whether the caller gave it.
    pub key: Option<[u8; PUBLIC_KEY_LEN]>,
    pub key_trusted: bool,
    /// Anchors checked.
    pub anchors: u64,
    /// Archive files checked, and their rows.
    pub archives: u64,
    pub archived_rows: u64,
}

/// A failure to read the ledger at all (not a verification failure).
#[derive(Debug)]
pub struct ReadError(pub String);

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<rusqlite::Error> for ReadError {
    fn from(e: rusqlite::Error) -> Self {
        ReadError(e.to_string())
    }
}

struct Problems<'a> {
    report: &'a mut Report,
    max: usize,
}

impl Problems<'_> {
    fn add(&mut self, group: Option<(i64, i64)>, what: String) {
        if self.report.problems.len() < self.max {
            self.report.problems.push(Problem {
                group: group.map(|g| g.0),
                group_ts_ms: group.map(|g| g.1),
                what,
            });
        } else {
            self.report.more_problems += 1;
        }
    }
}

/// A row as found now: its digest and the group it says last wrote it.
struct Found {
    digest: Digest,
    chain_seq: Option<i64>,
}

fn lookup(conn: &Connection, table: Table, key: &[Value]) -> rusqlite::Result<Option<Found>> {
    let mut stmt = conn.prepare_cached(&table.select_by_key_sql())?;
    stmt.query_row(params_from_iter(key.iter()), |row| {
        let chain_seq = match row.get_ref(table.chain_seq_index())? {
            ValueRef::Integer(i) => Some(i),
            _ => None,
        };
        Ok(Found {
            digest: canonical::row_digest(table, row)?,
            chain_seq,
        })
    })
    .optional()
}

/// Verifies the ledger open on `conn` (read-only is enough). Runs in one read
/// transaction, which it ends before returning.
pub fn verify(conn: &Connection, options: &Options) -> Result<Report, ReadError> {
    let has_chain: i64 = conn.query_row(
        "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'ledger_chain'",
        [],
        |r| r.get(0),
    )?;
    if has_chain == 0 {
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        return Err(ReadError(format!(
            "this ledger has no chain (schema version {version}); the gateway adds it the \
             next time it opens the file"
        )));
    }
    conn.execute_batch("BEGIN")?;
    let result = verify_in_snapshot(conn, options);
    let _ = conn.execute_batch("COMMIT");
    result
}

/// A range of groups a `ledger_archived` event says moved to an archive file.
#[derive(Debug, Clone)]
pub struct Archived {
    pub file: String,
    pub first: i64,
    pub last: i64,
    pub prev_hash: Digest,
    pub last_hash: Digest,
}

/// Every `ledger_archived` event, oldest first.
pub fn archived_ranges(conn: &Connection) -> rusqlite::Result<Vec<Archived>> {
    let mut stmt =
        conn.prepare("SELECT detail FROM events WHERE kind = 'ledger_archived' ORDER BY id")?;
    let mut rows = stmt.query([])?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        let detail: String = r.get(0)?;
        let Ok(d) = serde_json::from_str::<serde_json::Value>(&detail) else {
            continue;
        };
        let parsed = (|| {
            Some(Archived {
                file: d["file"].as_str()?.to_owned(),
                first: d["first_seq"].as_i64()?,
                last: d["last_seq"].as_i64()?,
                prev_hash: canonical::from_hex(d["prev_hash"].as_str()?)?,
                last_hash: canonical::from_hex(d["last_hash"].as_str()?)?,
            })
        })();
        out.extend(parsed);
    }
    Ok(out)
}

fn verify_in_snapshot(conn: &Connection, options: &Options) -> Result<Report, ReadError> {
    let mut report = Report::default();
    let archived = archived_ranges(conn)?;
    let mut finals = [0u64; 4];
    let mut seal_in_chain: Option<LegacySeal> = None;
    let mut problems_found: Vec<(Option<(i64, i64)>, String)> = Vec::new();
    let mut add = |group: Option<(i64, i64)>, what: String| problems_found.push((group, what));
    {
        let mut groups =
            conn.prepare("SELECT seq, ts_ms, records, hash FROM ledger_chain ORDER BY seq")?;
        let mut rows = groups.query([])?;
        let mut prev: Option<Head> = None;
        while let Some(row) = rows.next()? {
            let seq: i64 = row.get(0)?;
            let ts_ms: i64 = row.get::<_, Option<i64>>(1)?.unwrap_or(0);
            let at = Some((seq, ts_ms));
            let records: Vec<u8> = match row.get_ref(2)? {
                ValueRef::Blob(b) => b.to_vec(),
                _ => {
                    add(at, format!("group {seq}: its manifest is not a blob"));
                    Vec::new()
                }
            };
            let stored: Digest = match row.get_ref(3)? {
                ValueRef::Blob(b) if b.len() == canonical::DIGEST_LEN => {
                    b.try_into().unwrap_or(GENESIS)
                }
                _ => {
                    add(at, format!("group {seq}: its hash is not 32 bytes"));
                    GENESIS
                }
            };
            report.groups += 1;
            if report.first_group.is_none() {
                report.first_group = at;
            }
            report.last_group = at;
            // The first group links to the one an archive ended with, if the groups
            // before it were archived; while an archive's rows are being deleted, the
            // chain may start inside its range.
            let mut start_unlinked = false;
            let prev_hash = match prev {
                None if seq == 1 => GENESIS,
                None => match archived.iter().find(|a| a.last == seq - 1) {
                    Some(a) => {
                        report.notes.push(format!(
                            "groups 1..{} are archived (the last archive: {}, groups {}..{}); \
                             pass --archive DIR to check them",
                            a.last, a.file, a.first, a.last
                        ));
                        a.last_hash
                    }
                    None => match archived.iter().find(|a| a.first <= seq && seq <= a.last) {
                        Some(a) if a.first == seq => a.prev_hash,
                        Some(a) => {
                            report.notes.push(format!(
                                "groups {}..{} are being deleted after their archive ({}); the \
                                 chain is checked from group {seq}",
                                a.first, a.last, a.file
                            ));
                            start_unlinked = true;
                            GENESIS
                        }
                        None => {
                            add(
                                at,
                                format!(
                                    "the chain starts at group {seq}: groups 1..{} are not in \
                                     this ledger and no archive took them (removed)",
                                    seq - 1
                                ),
                            );
                            GENESIS
                        }
                    },
                },
                Some(p) => {
                    if seq != p.seq + 1 {
                        add(
                            at,
                            format!(
                                "groups {}..{} are missing between group {} and group {seq} \
                                 (removed)",
                                p.seq + 1,
                                seq - 1,
                                p.seq
                            ),
                        );
                    }
                    p.hash
                }
            };
            // A gap is reported above; the link across it says nothing more.
            let linked = match prev {
                None => !start_unlinked,
                Some(p) => seq == p.seq + 1,
            };
            if linked && canonical::group_hash(&prev_hash, seq, ts_ms, &records) != stored {
                add(
                    at,
                    format!(
                        "group {seq}: its hash does not match its manifest and the group before \
                         it (the ledger_chain row was edited, or the groups were reordered)"
                    ),
                );
            }
            prev = Some(Head { seq, hash: stored });
            let entries = match canonical::parse_manifest(&records) {
                Ok(entries) => entries,
                Err(bad) => {
                    add(
                        at,
                        format!(
                            "group {seq}: its manifest cannot be read ({} at byte {})",
                            bad.what, bad.offset
                        ),
                    );
                    Vec::new()
                }
            };
            if seq == 1 {
                seal_in_chain = chain_start_seal(conn, &entries, &mut |w| add(at, w))?;
            }
            let deleting = archived.iter().any(|a| a.first <= seq && seq <= a.last);
            check_entries(conn, seq, &entries, deleting, &mut finals, &mut |w| {
                add(at, w)
            })?;
        }
        report.head = prev;
    }
    if report.groups == 0 {
        add(
            None,
            "the ledger has no chain groups (ledger_chain is empty: removed)".into(),
        );
    }
    // Rows of groups after the last one: a writer that is open (or stopped without
    // closing) has committed them and not yet written their chain rows.
    let writer_open: bool = conn
        .query_row(
            "SELECT open FROM ledger_writer_state WHERE id = 1",
            [],
            |r| r.get::<_, i64>(0),
        )
        .optional()?
        == Some(1);
    let last_seq = report.head.map_or(0, |h| h.seq);
    let mut waiting_rows = 0u64;
    // Every row must be accounted for by exactly one entry.
    for (index, table) in Table::ALL.into_iter().enumerate() {
        let (chained, legacy, after): (i64, i64, i64) = conn.query_row(
            &format!(
                "SELECT count(chain_seq) FILTER (WHERE chain_seq <= ?1), \
                 count(*) - count(chain_seq), count(*) FILTER (WHERE chain_seq > ?1) FROM {}",
                table.name()
            ),
            [last_seq],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )?;
        let after = u64::try_from(after).unwrap_or(0);
        if writer_open {
            waiting_rows += after;
        } else if after > 0 {
            add(
                None,
                format!(
                    "{}: {after} rows name groups after the last one ({last_seq}), and the \
                     ledger was closed (added after the fact)",
                    table.name()
                ),
            );
        }
        let chained = u64::try_from(chained).unwrap_or(0);
        report.chained_rows[index] = finals[index];
        report.legacy_rows[index] = u64::try_from(legacy).unwrap_or(0);
        if chained != finals[index] {
            let extra = chained.abs_diff(finals[index]);
            let found = unaccounted_rows(conn, table, options.max_problems)?;
            if found.is_empty() {
                add(
                    None,
                    format!(
                        "{}: {chained} chained rows, but the groups account for {} ({extra} \
                         rows differ)",
                        table.name(),
                        finals[index]
                    ),
                );
            }
            for (group, what) in found {
                add(group, what);
            }
        }
    }
    let legacy_total: u64 = report.legacy_rows.iter().sum();
    let legacy_archived = archived.iter().any(|a| a.first == 1);
    match &seal_in_chain {
        _ if legacy_archived => {}
        Some(sealed) if legacy_total > 0 || sealed.total() > 0 => {
            let now = seal::compute(conn)?;
            if now != *sealed {
                add(
                    report.first_group,
                    format!(
                        "the {} rows older than the chain no longer match the seal in its \
                         first row (now {} rows): a row without chain_seq was edited, added \
                         or deleted",
                        sealed.total(),
                        now.total()
                    ),
                );
            }
        }
        Some(_) => {}
        None if legacy_total > 0 && !legacy_archived => add(
            None,
            format!(
                "{legacy_total} rows have no chain group and no seal covers them (added after \
                 the fact)"
            ),
        ),
        None => {}
    }
    let mut recoveries =
        conn.prepare("SELECT chain_seq, ts_ms, detail FROM events WHERE kind = ?1 ORDER BY id")?;
    let mut found = recoveries.query([EVENT_CHAIN_RECOVERED])?;
    while let Some(row) = found.next()? {
        let seq: Option<i64> = row.get(0)?;
        let ts_ms: i64 = row.get(1)?;
        let detail: String = row.get(2).unwrap_or_default();
        report.notes.push(format!(
            "group {} ({}) recovered after an unclean stop: {detail}",
            seq.map_or("?".into(), |s| s.to_string()),
            crate::ledger::format_utc_ms(ts_ms)
        ));
    }
    if waiting_rows > 0 {
        report.waiting_rows = waiting_rows;
        report.notes.push(format!(
            "{waiting_rows} rows of groups after group {last_seq} are committed but their \
             chain rows are not written yet (the gateway writes them within \
             ledger.chain_flush_ms, or seals them at its next start after a crash); not \
             checked"
        ));
    }
    if let Some(seal) = &seal_in_chain
        && seal.total() > 0
    {
        report.notes.push(format!(
            "{} rows older than the chain are covered by the seal in its first group",
            seal.total()
        ));
    }
    check_signatures(conn, options, &mut report, &mut add)?;
    if let Some(dir) = &options.archive_dir {
        check_archives(dir, options, &archived, &mut report, &mut add);
    }
    problems_found.sort_by_key(|(group, _)| group.map_or(i64::MAX, |g| g.0));
    let mut problems = Problems {
        report: &mut report,
        max: options.max_problems,
    };
    for (group, what) in problems_found {
        problems.add(group, what);
    }
    Ok(report)
}

/// Checks every archive file in `dir`, that they continue each other, and that each
/// archive the live ledger recorded is there with the hashes it recorded.
fn check_archives(
    dir: &std::path::Path,
    options: &Options,
    archived: &[Archived],
    report: &mut Report,
    add: &mut dyn FnMut(Option<(i64, i64)>, String),
) {
    let files = match crate::ledger::retention::archive_file::list(dir) {
        Ok(files) => files,
        Err(e) => {
            add(None, e);
            return;
        }
    };
    let key = options.trusted_key.or(report.signatures.key);
    let mut previous: Option<(i64, Digest)> = None;
    let mut by_name = std::collections::HashMap::new();
    for file in &files {
        match crate::ledger::retention::archive_file::check(file, key.as_ref()) {
            Ok((summary, problems)) => {
                report.signatures.archives += 1;
                report.signatures.archived_rows += summary.rows;
                for p in problems {
                    add(None, p);
                }
                match previous {
                    None if summary.first_seq != 1 => report.notes.push(format!(
                        "the archives start at group {} ({}): older ones are not in the directory",
                        summary.first_seq,
                        file.display()
                    )),
                    Some((last, _)) if summary.first_seq != last + 1 => add(
                        None,
                        format!(
                            "{}: starts at group {}, but the archive before it ends at group {last}",
                            file.display(),
                            summary.first_seq
                        ),
                    ),
                    Some((_, hash)) if summary.prev_hash != hash => add(
                        None,
                        format!(
                            "{}: does not continue the archive before it (its first group's link \
                             differs)",
                            file.display()
                        ),
                    ),
                    _ => {}
                }
                previous = Some((summary.last_seq, summary.last_hash));
                if let Some(name) = file.file_name() {
                    by_name.insert(name.to_string_lossy().into_owned(), summary);
                }
            }
            Err(e) => add(None, e),
        }
    }
    for a in archived {
        match by_name.get(&a.file) {
            None => add(
                None,
                format!(
                    "the ledger archived groups {}..{} to {}, which is not in {}",
                    a.first,
                    a.last,
                    a.file,
                    dir.display()
                ),
            ),
            Some(s)
                if s.first_seq != a.first
                    || s.last_seq != a.last
                    || s.prev_hash != a.prev_hash
                    || s.last_hash != a.last_hash =>
            {
                add(
                    None,
                    format!(
                        "{}: not the archive the ledger recorded (its groups or hashes differ)",
                        a.file
                    ),
                )
            }
            Some(_) => {}
        }
    }
}

/// The stored hash and time of group `seq`, if the ledger has it.
fn stored_group(conn: &Connection, seq: i64) -> rusqlite::Result<Option<(Vec<u8>, i64)>> {
    conn.prepare_cached("SELECT hash, ts_ms FROM ledger_chain WHERE seq = ?1")?
        .query_row([seq], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
}

/// Every checkpoint's signature and group, then every anchor's.
fn check_signatures(
    conn: &Connection,
    options: &Options,
    report: &mut Report,
    add: &mut dyn FnMut(Option<(i64, i64)>, String),
) -> rusqlite::Result<()> {
    let mut key = options.trusted_key;
    report.signatures.key_trusted = key.is_some();
    let mut stmt = conn.prepare(
        "SELECT seq, signed_at_ms, hash, public_key, signature FROM ledger_checkpoints \
         ORDER BY seq",
    )?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let seq: i64 = row.get(0)?;
        let signed_at_ms: i64 = row.get(1)?;
        let parsed = (|| {
            Some(SignedHead {
                seq,
                signed_at_ms,
                hash: row.get::<_, Vec<u8>>(2).ok()?.try_into().ok()?,
                public_key: row.get::<_, Vec<u8>>(3).ok()?.try_into().ok()?,
                signature: row.get::<_, Vec<u8>>(4).ok()?.try_into().ok()?,
            })
        })();
        report.signatures.checkpoints += 1;
        report.signatures.last = Some((seq, signed_at_ms));
        let Some(head) = parsed else {
            add(None, format!("checkpoint of group {seq}: malformed row"));
            continue;
        };
        let check_key = *key.get_or_insert(head.public_key);
        if !head.verify_with(&check_key) {
            add(
                None,
                format!(
                    "checkpoint of group {seq} (signed {}): the signature is not {}'s",
                    crate::ledger::format_utc_ms(signed_at_ms),
                    format_public_key(&check_key)
                ),
            );
            continue;
        }
        match stored_group(conn, seq)? {
            Some((hash, ts)) if hash != head.hash => add(
                Some((seq, ts)),
                format!(
                    "group {seq}: its hash is not the one signed at {} (the group was rewritten)",
                    crate::ledger::format_utc_ms(signed_at_ms)
                ),
            ),
            Some(_) => {}
            None => add(
                None,
                format!(
                    "a checkpoint signed group {seq} at {}, which this ledger does not hold \
                     (its last groups were removed)",
                    crate::ledger::format_utc_ms(signed_at_ms)
                ),
            ),
        }
    }
    report.signatures.key = key;
    for anchor in &options.anchors {
        report.signatures.anchors += 1;
        let check_key = options.trusted_key.unwrap_or(anchor.public_key);
        if !anchor.verify_with(&check_key) {
            add(
                None,
                format!(
                    "the anchor for group {} is not signed by {}",
                    anchor.seq,
                    format_public_key(&check_key)
                ),
            );
            continue;
        }
        let when = crate::ledger::format_utc_ms(anchor.signed_at_ms);
        match stored_group(conn, anchor.seq)? {
            Some((hash, _)) if hash == anchor.hash => {}
            Some((_, ts)) => add(
                Some((anchor.seq, ts)),
                format!(
                    "group {}: not the group the anchor signed at {when} (the ledger was \
                     replaced or rewritten)",
                    anchor.seq
                ),
            ),
            None => add(
                None,
                format!(
                    "the ledger ends at group {}, but the anchor signed group {} at {when}: \
                     its last groups were removed, or this is an older copy",
                    report.head.map_or(0, |h| h.seq),
                    anchor.seq
                ),
            ),
        }
    }
    Ok(())
}

/// The seal in the chain start event that must open group 1.
fn chain_start_seal(
    conn: &Connection,
    entries: &[Entry],
    add: &mut dyn FnMut(String),
) -> rusqlite::Result<Option<LegacySeal>> {
    let first = entries
        .first()
        .filter(|e| e.table == Table::Events && e.op == canonical::OP_INSERT);
    let Some(first) = first else {
        add("group 1 does not start with the chain start event".into());
        return Ok(None);
    };
    let row: Option<(String, String)> = conn
        .prepare_cached("SELECT kind, detail FROM events WHERE id = ?1")?
        .query_row(params_from_iter(first.key.iter()), |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()
        .unwrap_or(None);
    let Some((kind, detail)) = row else {
        // The missing row is reported by the entry check.
        return Ok(None);
    };
    if kind != EVENT_CHAIN_START {
        add(format!(
            "group 1 starts with a {kind:?} event, not the chain start"
        ));
        return Ok(None);
    }
    let seal = serde_json::from_str(&detail)
        .ok()
        .and_then(|d: serde_json::Value| LegacySeal::from_json(&d));
    if seal.is_none() {
        add("the chain start event's seal cannot be read".into());
    }
    Ok(seal)
}

/// Checks the rows a group's entries name. Within a group only the last entry for a row
/// counts (an insert followed by an update in the same commit).
fn check_entries(
    conn: &Connection,
    seq: i64,
    entries: &[Entry],
    archived: bool,
    finals: &mut [u64; 4],
    add: &mut dyn FnMut(String),
) -> rusqlite::Result<()> {
    let mut last: HashMap<(u8, &[u8]), usize> = HashMap::with_capacity(entries.len());
    for (index, entry) in entries.iter().enumerate() {
        last.insert((entry.table.tag(), &entry.key_bytes), index);
    }
    for (index, entry) in entries.iter().enumerate() {
        if last.get(&(entry.table.tag(), entry.key_bytes.as_slice())) != Some(&index) {
            continue;
        }
        let what = || format!("{} {}", entry.table.name(), entry.describe_key());
        match lookup(conn, entry.table, &entry.key)? {
            // An archived group's rows leave the live ledger one batch at a time.
            None if archived => {}
            None => add(format!(
                "group {seq}: {} is missing (deleted after it was committed)",
                what()
            )),
            Some(found) if found.digest == entry.digest => {
                finals[table_index(entry.table)] += 1;
            }
            Some(found) if found.chain_seq.is_some_and(|later| later > seq) => {
                // Rewritten by a later group, whose own entry covers the row now.
            }
            Some(found) => add(format!(
                "group {seq}: {} does not match what the group committed (edited after the \
                 commit{})",
                what(),
                match found.chain_seq {
                    Some(s) if s < seq => format!("; it now claims group {s}"),
                    Some(_) => String::new(),
                    None => "; its chain_seq was cleared".into(),
                }
            )),
        }
    }
    Ok(())
}

fn table_index(table: Table) -> usize {
    Table::ALL.iter().position(|t| *t == table).unwrap_or(0)
}

/// A problem found, with the group it was found in: (seq, committed at).
type Located = (Option<(i64, i64)>, String);

/// A group's entries for one table, parsed: (committed at, (key, digest) of each).
type GroupRows = Option<(i64, HashSet<(Vec<u8>, Digest)>)>;

/// Rows of `table` that the group their `chain_seq` names did not write as they are now
/// (added, or pointed at another group): looked for only when the counts disagree.
fn unaccounted_rows(conn: &Connection, table: Table, max: usize) -> rusqlite::Result<Vec<Located>> {
    let mut out = Vec::new();
    let mut cache: HashMap<i64, GroupRows> = HashMap::new();
    let sql = format!(
        "SELECT {} FROM {} WHERE chain_seq <= (SELECT max(seq) FROM ledger_chain) \
         ORDER BY {}",
        table.columns(),
        table.name(),
        table.key_columns()
    );
    let mut stmt = conn.prepare(&sql)?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        if out.len() >= max {
            break;
        }
        let seq = match row.get_ref(table.chain_seq_index())? {
            ValueRef::Integer(i) => i,
            _ => continue,
        };
        let key = canonical::row_key_bytes(table, row)?;
        let digest = canonical::row_digest(table, row)?;
        if cache.len() >= MANIFEST_CACHE && !cache.contains_key(&seq) {
            cache.clear();
        }
        if let std::collections::hash_map::Entry::Vacant(slot) = cache.entry(seq) {
            let group: Option<(i64, Vec<u8>)> = conn
                .prepare_cached("SELECT ts_ms, records FROM ledger_chain WHERE seq = ?1")?
                .query_row([seq], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
                .unwrap_or(None);
            slot.insert(group.map(|(ts, records)| {
                let set = canonical::parse_manifest(&records)
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|e| e.table == table)
                    .map(|e| (e.key_bytes, e.digest))
                    .collect();
                (ts, set)
            }));
        }
        let describe = || {
            let key: Vec<Value> = (0..table.key_len())
                .map(|i| row.get::<_, Value>(i).unwrap_or(Value::Null))
                .collect();
            let names = table.key_columns().split(", ");
            names
                .zip(&key)
                .map(|(n, v)| format!("{n} {}", canonical::describe_value(v)))
                .collect::<Vec<_>>()
                .join(" ")
        };
        match cache.get(&seq).and_then(Option::as_ref) {
            None => out.push((
                None,
                format!(
                    "{} {} names group {seq}, which does not exist (added after the fact)",
                    table.name(),
                    describe()
                ),
            )),
            Some((ts, set)) if !set.contains(&(key, digest)) => out.push((
                Some((seq, *ts)),
                format!(
                    "group {seq}: {} {} is not a row this group wrote (added or altered after \
                     the fact)",
                    table.name(),
                    describe()
                ),
            )),
            Some(_) => {}
        }
    }
    Ok(out)
}

/// Opens `path` read-only (a live ledger or a copy) and verifies it.
pub fn verify_file(path: &std::path::Path, options: &Options) -> Result<Report, ReadError> {
    if !path.exists() {
        return Err(ReadError(format!(
            "ledger {}: no such file (pass --ledger FILE)",
            path.display()
        )));
    }
    // No SQLITE_OPEN_URI: the path is a file name, never a URI.
    let conn = Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| ReadError(format!("ledger {}: open read-only: {e}", path.display())))?;
    verify(&conn, options).map_err(|e| ReadError(format!("ledger {}: {e}", path.display())))
}

/// Checks one row against the group that last wrote it (for `ledger show`): a sentence
/// saying whether it matches. Verifying the whole chain is `verify`'s job.
pub fn check_one(conn: &Connection, table: Table, key: &[Value]) -> rusqlite::Result<String> {
    let Some(found) = lookup(conn, table, key)? else {
        return Ok("row not found".into());
    };
    let Some(seq) = found.chain_seq else {
        return Ok(
            "older than the chain: covered by the seal in its first group (run verify)".into(),
        );
    };
    let group: Option<(i64, Vec<u8>)> = conn
        .prepare_cached("SELECT ts_ms, records FROM ledger_chain WHERE seq = ?1")?
        .query_row([seq], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let Some((ts_ms, records)) = group else {
        return Ok(format!(
            "written by group {seq}, whose chain row is not in the ledger (not written yet by a \
             running gateway, or removed): NOT VERIFIED"
        ));
    };
    let mut key_bytes = Vec::new();
    for value in key {
        canonical::push_value(&mut key_bytes, ValueRef::from(value));
    }
    let entry = canonical::parse_manifest(&records)
        .unwrap_or_default()
        .into_iter()
        .rev()
        .find(|e| e.table == table && e.key_bytes == key_bytes);
    Ok(match entry {
        Some(e) if e.digest == found.digest => format!(
            "matches what group {seq} committed at {}",
            crate::ledger::format_utc_ms(ts_ms)
        ),
        Some(_) => format!("DOES NOT MATCH what group {seq} committed: edited after the commit"),
        None => format!("group {seq} did not write this row: added or altered after the fact"),
    })
}
