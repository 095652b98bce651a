//! The archive file: groups moved out of the live ledger, with their rows and signed
//! checkpoints, gzip-compressed JSON lines, so an auditor can read one with `zcat` and
//! `verify --archive DIR` can check it without SQLite.
//!
//! ```text
//! {"toolwall_ledger_archive":1,"first_seq":A,"last_seq":B,"prev_hash":"<hex>","created_ms":T}
//! {"group":{"seq":A,"ts_ms":..,"records":"<hex>","hash":"<hex>"}}        one per group
//! {"row":{"table":"tool_calls","values":[..]}}                           rows last written by A..B
//! {"checkpoint":{"seq":..,"signed_at_ms":..,"hash":..,"public_key":..,"signature":..}}
//! {"end":{"groups":N,"rows":M,"last_hash":"<hex>"}}
//! ```
//!
//! `prev_hash` is the hash of group A−1 (zeros for group 1), `last_hash` that of group B: the
//! anchors at both ends by which archives and the live ledger continue each other. Values
//! keep SQLite's storage classes: JSON null, integers, strings for TEXT, `{"blob":"<hex>"}`,
//! `{"real":x}`; a row's digest is recomputed from them exactly as from the database.
//! Rows older than the chain travel with group 1's archive (`chain_seq` null).

use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use rusqlite::types::{Value, ValueRef};
use serde_json::json;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use crate::ledger::chain::canonical::{self, Digest, GENESIS, Table};
use crate::ledger::chain::signing::SignedHead;

/// Largest line read from an archive (a row holds at most a capped body, hex-encoded).
const MAX_LINE: usize = 600 << 20;

pub fn value_json(value: ValueRef<'_>) -> serde_json::Value {
    match value {
        ValueRef::Null => serde_json::Value::Null,
        ValueRef::Integer(i) => i.into(),
        ValueRef::Real(f) => json!({ "real": f }),
        ValueRef::Text(t) => match std::str::from_utf8(t) {
            Ok(s) => s.into(),
            Err(_) => json!({ "text_hex": hex(t) }),
        },
        ValueRef::Blob(b) => json!({ "blob": hex(b) }),
    }
}

fn json_value(v: &serde_json::Value) -> Option<Value> {
    Some(match v {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Number(n) => Value::Integer(n.as_i64()?),
        serde_json::Value::String(s) => Value::Text(s.clone()),
        serde_json::Value::Object(o) => {
            if let Some(b) = o.get("blob") {
                Value::Blob(unhex(b.as_str()?)?)
            } else if let Some(f) = o.get("real") {
                Value::Real(f.as_f64()?)
            } else if let Some(t) = o.get("text_hex") {
                // Not UTF-8: kept as the bytes SQLite held.
                Value::Blob(unhex(t.as_str()?)?)
            } else {
                return None;
            }
        }
        _ => return None,
    })
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

/// Writes an archive to `<dir>/<name>.tmp`, then renames it into place once it is whole
/// and synced.
pub struct ArchiveWriter {
    // Buffered in front of the encoder too: it zeroes its 32 KiB output buffer on every
    // write it gets, and JSON is written in small pieces (measured: 45% of the export's
    // CPU in memset without this buffer).
    out: BufWriter<GzEncoder<BufWriter<std::fs::File>>>,
    tmp: PathBuf,
    path: PathBuf,
    groups: u64,
    rows: u64,
    last_hash: Digest,
}

impl ArchiveWriter {
    pub fn create(
        dir: &Path,
        name: &str,
        first: i64,
        last: i64,
        prev_hash: &Digest,
    ) -> std::io::Result<ArchiveWriter> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let path = dir.join(name);
        let tmp = dir.join(format!("{name}.tmp"));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        let mut writer = ArchiveWriter {
            // The fastest level: archiving runs beside a live gateway on the same CPUs.
            out: BufWriter::with_capacity(
                1 << 18,
                GzEncoder::new(BufWriter::new(file), Compression::fast()),
            ),
            tmp,
            path,
            groups: 0,
            rows: 0,
            last_hash: *prev_hash,
        };
        writer.line(&json!({
            "toolwall_ledger_archive": 1,
            "first_seq": first,
            "last_seq": last,
            "prev_hash": canonical::hex(prev_hash),
            "created_ms": crate::ledger::now_ms(),
        }))?;
        Ok(writer)
    }

    fn line(&mut self, value: &serde_json::Value) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.out, value)?;
        self.out.write_all(b"\n")
    }

    pub fn group(
        &mut self,
        seq: i64,
        ts_ms: i64,
        records: &[u8],
        hash: &Digest,
    ) -> std::io::Result<()> {
        self.groups += 1;
        self.last_hash = *hash;
        self.line(&json!({"group": {
            "seq": seq, "ts_ms": ts_ms, "records": hex(records), "hash": canonical::hex(hash),
        }}))
    }

    pub fn row(&mut self, table: Table, values: Vec<serde_json::Value>) -> std::io::Result<()> {
        self.rows += 1;
        self.line(&json!({"row": {"table": table.name(), "values": values}}))
    }

    pub fn checkpoint(&mut self, head: &SignedHead) -> std::io::Result<()> {
        let v: serde_json::Value = serde_json::from_str(&head.to_json()).unwrap_or_default();
        self.line(&json!({ "checkpoint": v }))
    }

    /// Ends the file, syncs it and moves it into place; returns its path, rows and bytes.
    pub fn finish(mut self) -> std::io::Result<(PathBuf, u64, u64)> {
        let end = json!({"end": {"groups": self.groups, "rows": self.rows,
            "last_hash": canonical::hex(&self.last_hash)}});
        self.line(&end)?;
        let file = self
            .out
            .into_inner()
            .map_err(|e| std::io::Error::other(e.to_string()))?
            .finish()?
            .into_inner()
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        file.sync_all()?;
        let bytes = file.metadata()?.len();
        std::fs::rename(&self.tmp, &self.path)?;
        if let Some(dir) = self.path.parent()
            && let Ok(d) = std::fs::File::open(dir)
        {
            let _ = d.sync_all();
        }
        Ok((self.path, self.rows, bytes))
    }
}

/// What one archive file holds, once checked.
#[derive(Debug, Clone)]
pub struct ArchiveSummary {
    pub path: PathBuf,
    pub first_seq: i64,
    pub last_seq: i64,
    pub prev_hash: Digest,
    pub last_hash: Digest,
    pub first_ts_ms: Option<i64>,
    pub last_ts_ms: Option<i64>,
    pub rows: u64,
    pub checkpoints: u64,
    pub bytes: u64,
}

/// Reads and checks one archive: the header, every group's hash from `prev_hash`, every
/// row against the last entry for it in its group, the footer, and (with `key`) every
/// checkpoint. Problems are returned, not raised; an unreadable file is an error.
pub fn check(path: &Path, key: Option<&[u8; 32]>) -> Result<(ArchiveSummary, Vec<String>), String> {
    let name = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|e| format!("{name}: {e}"))?;
    let bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut reader = BufReader::with_capacity(1 << 18, GzDecoder::new(BufReader::new(file)));
    let mut problems = Vec::new();
    let mut line = String::new();
    let mut next = |reader: &mut BufReader<GzDecoder<BufReader<std::fs::File>>>| -> Result<Option<serde_json::Value>, String> {
        line.clear();
        let n = Read::by_ref(reader)
            .take(MAX_LINE as u64)
            .read_line(&mut line)
            .map_err(|e| format!("{name}: cannot read (cut short or not gzip): {e}"))?;
        if n == 0 {
            return Ok(None);
        }
        serde_json::from_str(&line)
            .map(Some)
            .map_err(|e| format!("{name}: a line is not JSON: {e}"))
    };
    let header = next(&mut reader)?.ok_or_else(|| format!("{name}: empty"))?;
    if header["toolwall_ledger_archive"] != 1 {
        return Err(format!("{name}: not a toolwall ledger archive"));
    }
    let digest = |v: &serde_json::Value| -> Option<Digest> { canonical::from_hex(v.as_str()?) };
    let first_seq = header["first_seq"]
        .as_i64()
        .ok_or(format!("{name}: bad header"))?;
    let last_seq = header["last_seq"]
        .as_i64()
        .ok_or(format!("{name}: bad header"))?;
    let prev_hash = digest(&header["prev_hash"]).ok_or(format!("{name}: bad header"))?;
    let mut summary = ArchiveSummary {
        path: path.to_path_buf(),
        first_seq,
        last_seq,
        prev_hash,
        last_hash: prev_hash,
        first_ts_ms: None,
        last_ts_ms: None,
        rows: 0,
        checkpoints: 0,
        bytes,
    };
    let mut expect_seq = first_seq;
    // (table tag, key bytes) -> (group, digest) of the last entry for it.
    let mut entries: HashMap<(u8, Vec<u8>), (i64, Digest)> = HashMap::new();
    let mut group_hashes: HashMap<i64, Digest> = HashMap::new();
    let mut ended = false;
    while let Some(v) = next(&mut reader)? {
        if ended {
            problems.push(format!("{name}: lines after the end"));
            break;
        }
        if let Some(g) = v.get("group") {
            let seq = g["seq"].as_i64().unwrap_or(-1);
            let ts = g["ts_ms"].as_i64().unwrap_or(0);
            let records = g["records"].as_str().and_then(unhex).unwrap_or_default();
            let stored = digest(&g["hash"]).unwrap_or(GENESIS);
            if seq != expect_seq {
                problems.push(format!(
                    "{name}: group {seq} where group {expect_seq} was due"
                ));
            }
            expect_seq = seq + 1;
            if canonical::group_hash(&summary.last_hash, seq, ts, &records) != stored {
                problems.push(format!("{name}: group {seq}: its hash does not match its manifest and the group before it"));
            }
            summary.last_hash = stored;
            summary.first_ts_ms.get_or_insert(ts);
            summary.last_ts_ms = Some(ts);
            group_hashes.insert(seq, stored);
            match canonical::parse_manifest(&records) {
                Ok(list) => {
                    for e in list {
                        entries.insert((e.table.tag(), e.key_bytes), (seq, e.digest));
                    }
                }
                Err(bad) => {
                    problems.push(format!("{name}: group {seq}: bad manifest ({})", bad.what))
                }
            }
        } else if let Some(r) = v.get("row") {
            summary.rows += 1;
            let table = Table::ALL
                .into_iter()
                .find(|t| Some(t.name()) == r["table"].as_str());
            let values: Option<Vec<Value>> = r["values"]
                .as_array()
                .and_then(|a| a.iter().map(json_value).collect());
            let (Some(table), Some(values)) = (table, values) else {
                problems.push(format!("{name}: a row cannot be read"));
                continue;
            };
            if values.len() != table.column_count() {
                problems.push(format!(
                    "{name}: a {} row has {} values",
                    table.name(),
                    values.len()
                ));
                continue;
            }
            let mut hasher = canonical::RowHasher::new(table);
            let mut key = Vec::new();
            for (i, value) in values.iter().enumerate() {
                hasher.value(ValueRef::from(value));
                if i < table.key_len() {
                    canonical::push_value(&mut key, ValueRef::from(value));
                }
            }
            let row_digest = hasher.finish();
            let chain_seq = match values.last() {
                Some(Value::Integer(s)) => Some(*s),
                _ => None,
            };
            let describe = || format!("{} {}", table.name(), describe_key(table, &values));
            match chain_seq {
                None if first_seq == 1 => {} // older than the chain: sealed by group 1
                None => problems.push(format!("{name}: {} has no group", describe())),
                Some(seq) => match entries.get(&(table.tag(), key)) {
                    Some((g, d)) if *g == seq && *d == row_digest => {}
                    Some((g, _)) if *g == seq => problems.push(format!(
                        "{name}: group {seq}: {} does not match what the group committed",
                        describe()
                    )),
                    _ => problems.push(format!(
                        "{name}: {} names group {seq}, which did not write it",
                        describe()
                    )),
                },
            }
        } else if let Some(c) = v.get("checkpoint") {
            summary.checkpoints += 1;
            match SignedHead::from_json(&c.to_string()) {
                Ok(head) => {
                    if let Some(key) = key
                        && !head.verify_with(key)
                    {
                        problems.push(format!(
                            "{name}: checkpoint of group {}: not signed by the key",
                            head.seq
                        ));
                    }
                    if group_hashes.get(&head.seq).is_some_and(|h| *h != head.hash) {
                        problems.push(format!(
                            "{name}: group {}: not the group its checkpoint signed",
                            head.seq
                        ));
                    }
                }
                Err(e) => problems.push(format!("{name}: {e}")),
            }
        } else if let Some(end) = v.get("end") {
            ended = true;
            if end["rows"].as_u64() != Some(summary.rows) {
                problems.push(format!(
                    "{name}: the end says {} rows, the file holds {}",
                    end["rows"], summary.rows
                ));
            }
            if digest(&end["last_hash"]) != Some(summary.last_hash) {
                problems.push(format!("{name}: the end's hash is not the last group's"));
            }
        } else {
            problems.push(format!("{name}: an unknown line"));
        }
    }
    if !ended {
        problems.push(format!("{name}: cut short (no end line)"));
    }
    if expect_seq != last_seq + 1 {
        problems.push(format!(
            "{name}: holds groups up to {}, the header says {last_seq}",
            expect_seq - 1
        ));
    }
    Ok((summary, problems))
}

fn describe_key(table: Table, values: &[Value]) -> String {
    table
        .key_columns()
        .split(", ")
        .zip(values)
        .map(|(n, v)| format!("{n} {}", canonical::describe_value(v)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The archive files in `dir`, by their first group.
pub fn list(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("archive directory {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "gz"))
        .collect();
    files.sort();
    Ok(files)
}
