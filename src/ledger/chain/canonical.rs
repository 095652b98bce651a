//! The chain's canonical encoding, byte for byte as `src/ledger/README.md` ("The chain")
//! defines it, so an outside tool can recompute every digest.
//!
//! A row's digest covers every column of its table (the list below, `chain_seq` last) as
//! SQLite holds it, each value tagged with its storage class. The writer hashes the row
//! that `INSERT … RETURNING` / `UPDATE … RETURNING` gives back, and `verify` the row a
//! `SELECT` of the same columns gives back, so both read the stored values, never what was
//! meant to be stored.

use rusqlite::Row;
use rusqlite::types::{Value, ValueRef};
use sha2::{Digest as _, Sha256};

// The canonical column lists, as macros so the writer's SQL can be `concat!`ed at compile
// time.
macro_rules! tool_calls_columns {
    // The columns a call's start sets for good come first, then the ones its outcome
    // rewrites: the writer keeps the hash state after the first part while the call is
    // open, so hashing the outcome's row needs no read-back.
    () => {
        "id, ts_ms, transport, principal, process_name, server_name, tool_name, method, \
         request_id, bytes_received, arguments, request_body_hash, decision, policy_rule, \
         policy_reason, duration_us, error_message, bytes_sent, response_preview, \
         response_body_hash, rewritten_arguments_hash, original_response_hash, approved_by, \
         decided_at_ms, chain_seq"
    };
}
macro_rules! rule_events_columns {
    () => {
        "call_id, phase, seq, ts_ms, rule_id, action, layer, chain_seq"
    };
}
macro_rules! blobs_columns {
    () => {
        "hash, body, size, truncated, first_seen_ms, chain_seq"
    };
}
macro_rules! events_columns {
    () => {
        "id, ts_ms, kind, detail, chain_seq"
    };
}
pub(crate) use tool_calls_columns;

/// SHA-256 digest length.
pub const DIGEST_LEN: usize = 32;
pub type Digest = [u8; DIGEST_LEN];

/// Prefix of every row digest's input.
pub const ROW_DOMAIN: &[u8] = b"toolwall ledger row v1\0";
/// Prefix of every group hash's input.
pub const GROUP_DOMAIN: &[u8] = b"toolwall ledger group v1\0";
/// Prefix of the legacy seal's input (rows that predate the chain).
pub const LEGACY_DOMAIN: &[u8] = b"toolwall ledger legacy v1\0";

/// The previous hash of group 1.
pub const GENESIS: Digest = [0u8; DIGEST_LEN];

/// Storage-class tags of the value encoding.
const NULL: u8 = 0;
const INTEGER: u8 = 1;
const REAL: u8 = 2;
const TEXT: u8 = 3;
const BLOB: u8 = 4;

/// Manifest entry kinds.
pub const OP_INSERT: u8 = 1;
pub const OP_UPDATE: u8 = 2;
/// A row sealed after an unclean stop (see `recovery`).
pub const OP_RECOVERED: u8 = 3;
/// A row of an archived group that stays live, moved into this group (see `retention`).
pub const OP_CARRIED: u8 = 4;

/// A table whose rows are in the chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    ToolCalls,
    RuleEvents,
    Blobs,
    Events,
}

impl Table {
    /// Every chained table, in the order the legacy seal and `verify` visit them.
    pub const ALL: [Table; 4] = [
        Table::ToolCalls,
        Table::RuleEvents,
        Table::Blobs,
        Table::Events,
    ];

    pub fn tag(self) -> u8 {
        match self {
            Table::ToolCalls => 1,
            Table::RuleEvents => 2,
            Table::Blobs => 3,
            Table::Events => 4,
        }
    }

    pub fn from_tag(tag: u8) -> Option<Table> {
        Table::ALL.into_iter().find(|t| t.tag() == tag)
    }

    pub fn name(self) -> &'static str {
        match self {
            Table::ToolCalls => "tool_calls",
            Table::RuleEvents => "security_rule_events",
            Table::Blobs => "event_body_blobs",
            Table::Events => "events",
        }
    }

    /// The canonical columns, comma-separated: every column of the table, the primary key
    /// first and `chain_seq` last (`tool_calls`: the start's columns, then the outcome's). A migration that adds a column to a
    /// chained table must add it here too (a test compares these lists with the schema).
    pub fn columns(self) -> &'static str {
        match self {
            Table::ToolCalls => tool_calls_columns!(),
            Table::RuleEvents => rule_events_columns!(),
            Table::Blobs => blobs_columns!(),
            Table::Events => events_columns!(),
        }
    }

    /// How many columns the table has (the length of [`columns`](Self::columns)).
    pub fn column_count(self) -> usize {
        match self {
            Table::ToolCalls => 25,
            Table::RuleEvents => 8,
            Table::Blobs => 6,
            Table::Events => 5,
        }
    }

    /// The primary key: the first `key_len` canonical columns.
    pub fn key_len(self) -> usize {
        match self {
            Table::RuleEvents => 3,
            Table::ToolCalls | Table::Blobs | Table::Events => 1,
        }
    }

    /// The primary key columns, comma-separated.
    pub fn key_columns(self) -> &'static str {
        match self {
            Table::ToolCalls | Table::Events => "id",
            Table::RuleEvents => "call_id, phase, seq",
            Table::Blobs => "hash",
        }
    }

    /// `SELECT <canonical columns> FROM <table> WHERE <key> = ?…`
    pub fn select_by_key_sql(self) -> String {
        let condition = self
            .key_columns()
            .split(", ")
            .enumerate()
            .map(|(i, column)| format!("{column} = ?{}", i + 1))
            .collect::<Vec<_>>()
            .join(" AND ");
        format!(
            "SELECT {} FROM {} WHERE {condition}",
            self.columns(),
            self.name()
        )
    }

    /// Index of `chain_seq` among the canonical columns.
    pub fn chain_seq_index(self) -> usize {
        self.column_count() - 1
    }
}

/// Where a value's encoding goes: a manifest's or key's buffer, a hasher, a row hasher.
pub trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

impl Sink for Sha256 {
    fn put(&mut self, bytes: &[u8]) {
        self.update(bytes);
    }
}

/// Lengths above `u32::MAX` cannot occur (SQLite's own limit is 1 GB); saturate anyway.
fn len_u32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

/// The value encoding of `value` (the one place it is written): its storage class and
/// fixed-size part as one piece, then a text's or blob's bytes.
pub fn encode_value(out: &mut impl Sink, value: ValueRef<'_>) {
    let mut head = [0u8; 9];
    let (head_len, payload): (usize, &[u8]) = match value {
        ValueRef::Null => {
            head[0] = NULL;
            (1, &[])
        }
        ValueRef::Integer(i) => {
            head[0] = INTEGER;
            head[1..].copy_from_slice(&i.to_be_bytes());
            (9, &[])
        }
        ValueRef::Real(f) => {
            head[0] = REAL;
            head[1..].copy_from_slice(&f.to_bits().to_be_bytes());
            (9, &[])
        }
        ValueRef::Text(t) => {
            head[0] = TEXT;
            head[1..5].copy_from_slice(&len_u32(t.len()).to_be_bytes());
            (5, t)
        }
        ValueRef::Blob(b) => {
            head[0] = BLOB;
            head[1..5].copy_from_slice(&len_u32(b.len()).to_be_bytes());
            (5, b)
        }
    };
    out.put(&head[..head_len]);
    if !payload.is_empty() {
        out.put(payload);
    }
}

/// Appends the value encoding of `value` (the manifest's keys use it).
pub fn push_value(out: &mut Vec<u8>, value: ValueRef<'_>) {
    encode_value(out, value);
}

/// A row digest computed value by value, in canonical column order, from the values the
/// writer binds (each bound as the storage class SQLite keeps for it: integers as INTEGER,
/// texts as TEXT, bodies as BLOB, absent values as NULL). Values are encoded into a buffer
/// and hashed in one pass (feeding SHA-256 three small slices per column cost more than
/// the hashing); the buffer is inline, so hashing a row allocates nothing.
#[derive(Clone)]
pub struct RowHasher {
    hasher: Sha256,
    buffer: [u8; ROW_BUFFER],
    len: usize,
}

/// Bytes a [`RowHasher`] gathers before it feeds SHA-256: a typical call row's columns.
const ROW_BUFFER: usize = 512;

impl RowHasher {
    pub fn new(table: Table) -> Self {
        let mut row = RowHasher::resume(Sha256::new());
        row.put(ROW_DOMAIN);
        row.put(&[table.tag()]);
        row
    }

    pub fn value(&mut self, value: ValueRef<'_>) -> &mut Self {
        encode_value(self, value);
        self
    }

    pub fn int(&mut self, value: i64) -> &mut Self {
        self.value(ValueRef::Integer(value))
    }

    pub fn text(&mut self, value: &[u8]) -> &mut Self {
        self.value(ValueRef::Text(value))
    }

    pub fn opt_text(&mut self, value: Option<&[u8]>) -> &mut Self {
        self.value(value.map_or(ValueRef::Null, ValueRef::Text))
    }

    pub fn opt_int(&mut self, value: Option<i64>) -> &mut Self {
        self.value(value.map_or(ValueRef::Null, ValueRef::Integer))
    }

    pub fn blob(&mut self, value: &[u8]) -> &mut Self {
        self.value(ValueRef::Blob(value))
    }

    pub fn null(&mut self) -> &mut Self {
        self.value(ValueRef::Null)
    }

    /// The hash state after the values so far, without the buffer (to keep while a call
    /// is open).
    pub fn midstate(&mut self) -> Sha256 {
        self.hasher.update(&self.buffer[..self.len]);
        self.len = 0;
        self.hasher.clone()
    }

    /// Continues from a [`midstate`](Self::midstate).
    pub fn resume(hasher: Sha256) -> Self {
        RowHasher {
            hasher,
            buffer: [0; ROW_BUFFER],
            len: 0,
        }
    }

    pub fn finish(&mut self) -> Digest {
        self.hasher.update(&self.buffer[..self.len]);
        self.len = 0;
        std::mem::take(&mut self.hasher).finalize().into()
    }
}

impl Sink for RowHasher {
    /// Appends `bytes` to what is hashed, in order: through the buffer, or straight to
    /// SHA-256 once the buffer is emptied when they do not fit in it.
    fn put(&mut self, bytes: &[u8]) {
        if self.len + bytes.len() > ROW_BUFFER {
            self.hasher.update(&self.buffer[..self.len]);
            self.len = 0;
            if bytes.len() > ROW_BUFFER {
                self.hasher.update(bytes);
                return;
            }
        }
        self.buffer[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }
}

/// The encoded key of a row of `table` whose canonical columns are the row's first columns.
pub fn row_key_bytes(table: Table, row: &Row<'_>) -> rusqlite::Result<Vec<u8>> {
    let mut out = Vec::new();
    for index in 0..table.key_len() {
        push_value(&mut out, row.get_ref(index)?);
    }
    Ok(out)
}

/// The digest of a row of `table` whose canonical columns are the row's first columns.
pub fn row_digest(table: Table, row: &Row<'_>) -> rusqlite::Result<Digest> {
    let mut hasher = Sha256::new();
    hasher.update(ROW_DOMAIN);
    hasher.update([table.tag()]);
    for index in 0..table.column_count() {
        encode_value(&mut hasher, row.get_ref(index)?);
    }
    Ok(hasher.finalize().into())
}

/// The hash of a group: what links it to the one before.
pub fn group_hash(prev: &Digest, seq: i64, ts_ms: i64, records: &[u8]) -> Digest {
    let mut hasher = Sha256::new();
    hasher.update(GROUP_DOMAIN);
    hasher.update(prev);
    hasher.update(seq.to_be_bytes());
    hasher.update(ts_ms.to_be_bytes());
    hasher.update(len_u32(records.len()).to_be_bytes());
    hasher.update(records);
    hasher.finalize().into()
}

/// Appends one manifest entry: table tag, op, the key values, the row digest.
pub fn push_entry(out: &mut Vec<u8>, table: Table, op: u8, key: &[ValueRef<'_>], digest: &Digest) {
    out.push(table.tag());
    out.push(op);
    for value in key {
        push_value(out, *value);
    }
    out.extend_from_slice(digest);
}

/// One parsed manifest entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub table: Table,
    pub op: u8,
    pub key: Vec<Value>,
    /// The key's encoded bytes, as in the manifest (for comparing keys).
    pub key_bytes: Vec<u8>,
    pub digest: Digest,
}

impl Entry {
    /// The key as printed: `id 42`, `call_id 7 phase request seq 0`, `hash ab12…`.
    pub fn describe_key(&self) -> String {
        let names = self.table.key_columns().split(", ");
        let mut out = String::new();
        for (name, value) in names.zip(&self.key) {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(name);
            out.push(' ');
            out.push_str(&describe_value(value));
        }
        out
    }
}

/// A value as printed in messages: integers as is, text quoted and cut, blobs as hex.
pub fn describe_value(value: &Value) -> String {
    match value {
        Value::Null => "NULL".into(),
        Value::Integer(i) => i.to_string(),
        Value::Real(f) => f.to_string(),
        Value::Text(t) => {
            let cut: String = t.chars().take(80).collect();
            format!("{cut:?}")
        }
        Value::Blob(b) => b.iter().take(40).map(|x| format!("{x:02x}")).collect(),
    }
}

/// Why a manifest could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadManifest {
    pub offset: usize,
    pub what: &'static str,
}

/// Reads a manifest (untrusted bytes: every length is checked before use).
pub fn parse_manifest(records: &[u8]) -> Result<Vec<Entry>, BadManifest> {
    let mut entries = Vec::new();
    let mut at = 0usize;
    let bad = |offset: usize, what: &'static str| BadManifest { offset, what };
    while at < records.len() {
        let start = at;
        let table = Table::from_tag(records[at]).ok_or(bad(start, "unknown table tag"))?;
        at += 1;
        let op = *records.get(at).ok_or(bad(start, "entry cut short"))?;
        if !matches!(op, OP_INSERT | OP_UPDATE | OP_RECOVERED | OP_CARRIED) {
            return Err(bad(start, "unknown entry kind"));
        }
        at += 1;
        let mut key = Vec::with_capacity(table.key_len());
        let key_start = at;
        for _ in 0..table.key_len() {
            let (value, next) = read_value(records, at).ok_or(bad(start, "bad key value"))?;
            key.push(value);
            at = next;
        }
        let key_bytes = records[key_start..at].to_vec();
        let digest: Digest = records
            .get(at..at + DIGEST_LEN)
            .and_then(|d| d.try_into().ok())
            .ok_or(bad(start, "digest cut short"))?;
        at += DIGEST_LEN;
        entries.push(Entry {
            table,
            op,
            key,
            key_bytes,
            digest,
        });
    }
    Ok(entries)
}

fn read_value(bytes: &[u8], at: usize) -> Option<(Value, usize)> {
    let tag = *bytes.get(at)?;
    let at = at + 1;
    let fixed = |at: usize| -> Option<[u8; 8]> { bytes.get(at..at + 8)?.try_into().ok() };
    let var = |at: usize| -> Option<(&[u8], usize)> {
        let len = u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?) as usize;
        let start = at + 4;
        let end = start.checked_add(len)?;
        Some((bytes.get(start..end)?, end))
    };
    match tag {
        NULL => Some((Value::Null, at)),
        INTEGER => Some((Value::Integer(i64::from_be_bytes(fixed(at)?)), at + 8)),
        REAL => Some((
            Value::Real(f64::from_bits(u64::from_be_bytes(fixed(at)?))),
            at + 8,
        )),
        TEXT => {
            let (text, end) = var(at)?;
            Some((Value::Text(std::str::from_utf8(text).ok()?.to_owned()), end))
        }
        BLOB => {
            let (blob, end) = var(at)?;
            Some((Value::Blob(blob.to_vec()), end))
        }
        _ => None,
    }
}

/// Lowercase hex of a digest.
pub fn hex(digest: &Digest) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A digest from 64 hex characters.
pub fn from_hex(text: &str) -> Option<Digest> {
    let text = text.trim();
    if text.len() != 2 * DIGEST_LEN || !text.is_ascii() {
        return None;
    }
    let mut out = [0u8; DIGEST_LEN];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The writer and `verify` share one encoder, so they cannot catch its mistakes for
    /// each other: the bytes are pinned here as `src/ledger/README.md` documents them, by
    /// hand, for every storage class, with a text long enough to cross the row hasher's
    /// buffer.
    #[test]
    fn values_encode_as_the_readme_documents() {
        let long = vec![b'x'; ROW_BUFFER + 88];
        let values = [
            ValueRef::Null,
            ValueRef::Integer(-2),
            ValueRef::Real(1.5),
            ValueRef::Text(b"ab"),
            ValueRef::Blob(&[0xff]),
            ValueRef::Text(&long),
        ];
        let mut documented: Vec<u8> = vec![0x00];
        documented.extend([0x01, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe]);
        documented.extend([0x02, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0]);
        documented.extend([0x03, 0, 0, 0, 2, b'a', b'b']);
        documented.extend([0x04, 0, 0, 0, 1, 0xff]);
        documented.extend([0x03, 0, 0, 0x02, 0x58]);
        documented.extend(&long);

        let mut pushed = Vec::new();
        for v in values {
            push_value(&mut pushed, v);
        }
        assert_eq!(pushed, documented);

        let mut row = RowHasher::new(Table::Events);
        for v in values {
            row.value(v);
        }
        let mut input = ROW_DOMAIN.to_vec();
        input.push(Table::Events.tag());
        input.extend(&documented);
        let want: Digest = Sha256::digest(&input).into();
        assert_eq!(row.finish(), want);
    }
}
