//! The SQLite ledger: every audited request and its outcome, matched rules, full bodies
//! (deduplicated by sha256) and lifecycle events, in one WAL-mode file owned by the gateway.
//!
//! The gateway stages rows while it handles a loop turn and commits them once per turn,
//! before any worker request leaves and before any answer is written; a failed commit keeps
//! the rows for the next one so the gateway can refuse calls (fail closed) and retry.
//! Schema and queries: `src/ledger/README.md`.

mod body;
pub mod chain;
mod checkpointer;
pub mod cli;
mod error;
mod file;
pub(crate) mod lock_wait;
pub mod measure;
pub mod query;
mod record;
pub mod retention;
mod schema;
mod staged;
mod tail;
pub(crate) mod time;
mod writer;

#[cfg(test)]
mod tests;

pub use error::{LedgerError, LedgerErrorKind};
pub use file::lock_path;
pub use record::{CallEnd, CallStart, decision};
pub use schema::{APPLICATION_ID, MIGRATIONS, Migration, current_version as schema_version};
pub use tail::tail;
pub use time::{format_utc_ms, now_ms, parse_time};
pub use writer::{EVENT_ROWS_DROPPED, EVENT_ROWS_REJECTED, Ledger};

use serde::Deserialize;
use std::path::PathBuf;

/// `[ledger]` in the config file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LedgerConfig {
    /// The database file. Its directory is created 0700 and the file 0600 when missing.
    pub path: PathBuf,
    /// Bytes of arguments / response kept in the `arguments` and `response_preview`
    /// columns (cut on a UTF-8 character boundary).
    pub preview_bytes: usize,
    /// Bytes of a full body kept in `event_body_blobs`; longer bodies are cut here and
    /// flagged `truncated`. Also the largest `events.detail` kept whole.
    pub body_cap_bytes: usize,
    /// Also store bodies that fit whole in their preview column as blobs. Off by default:
    /// every small body would then be written twice, and each blob insert touches a random
    /// page of the hash index, which costs about one 4 KiB page write per call.
    pub blob_every_body: bool,
    /// Bytes kept of every other text column (names, rule ids, reasons, error messages).
    pub text_cap_bytes: usize,
    /// Rows waiting for a commit (e.g. while the disk fails); beyond it the oldest are
    /// dropped, counted and reported.
    pub max_staged_rows: usize,
    /// Bytes held by rows waiting for a commit; beyond it the oldest are dropped likewise.
    pub max_staged_bytes: usize,
    /// Milliseconds a commit waits for another connection's write lock before failing.
    /// The gateway loop waits with it, so keep it short.
    pub busy_timeout_ms: u64,
    /// Size the WAL file is truncated back to after a checkpoint (`journal_size_limit`).
    pub wal_size_limit_bytes: u64,
    /// WAL size beyond which the background checkpoint also restarts the WAL, holding
    /// commits back for the moment it takes (without it a steadily written WAL never
    /// restarts and grows without bound).
    pub wal_restart_bytes: u64,
    /// Chain groups whose `ledger_chain` rows may wait to be written with a later commit
    /// (1: every commit writes its own; each one costs a WAL page).
    pub chain_flush_groups: usize,
    /// Longest a committed group's `ledger_chain` row waits, in milliseconds.
    pub chain_flush_ms: u64,
    /// The Ed25519 key that signs the chain's head (PKCS#8, 0600; created when missing).
    /// Default: `ledger-signing.key` next to the ledger.
    pub signing_key: Option<PathBuf>,
    /// Sign the head every this many groups …
    pub checkpoint_groups: u64,
    /// … or this many seconds, whichever comes first (and when the ledger closes).
    pub checkpoint_secs: u64,
    /// Program and arguments (no shell) that get each signed head as one JSON line on
    /// stdin, run off the gateway's loop.
    pub anchor_command: Option<Vec<String>>,
    /// Longest `anchor_command` may run before it is killed.
    pub anchor_timeout_ms: u64,
    /// Groups older than this many days move to archive files (0: keep everything).
    pub retain_days: u64,
    /// The same in seconds, for short retention in tests; overrides `retain_days`.
    pub retain_secs: Option<u64>,
    /// While the live data (pages in use) is larger, the oldest day is archived (0: no cap).
    pub max_bytes: u64,
    /// Where archives go. Default: `archive/` next to the ledger.
    pub archive_dir: Option<PathBuf>,
    /// Rows deleted per transaction after an archive.
    pub retention_batch_rows: usize,
    /// Pause between those transactions, in milliseconds.
    pub retention_pause_ms: u64,
    /// How often retention looks for groups to archive, in seconds.
    pub retention_check_secs: u64,
}

impl LedgerConfig {
    /// The signing key's path.
    pub fn signing_key_path(&self) -> PathBuf {
        self.signing_key
            .clone()
            .unwrap_or_else(|| self.state_dir().join("ledger-signing.key"))
    }

    /// Where archives go.
    pub fn archive_dir_path(&self) -> PathBuf {
        self.archive_dir
            .clone()
            .unwrap_or_else(|| self.state_dir().join("archive"))
    }

    /// Whether retention runs.
    pub fn retention_enabled(&self) -> bool {
        self.retain_days > 0 || self.retain_secs.is_some() || self.max_bytes > 0
    }

    /// The last signed head, rewritten next to the ledger for each checkpoint.
    pub fn head_file_path(&self) -> PathBuf {
        let mut name = self.path.as_os_str().to_owned();
        name.push(".head");
        PathBuf::from(name)
    }

    fn state_dir(&self) -> PathBuf {
        self.path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map(std::path::Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."))
    }
}

impl Default for LedgerConfig {
    fn default() -> Self {
        LedgerConfig {
            path: PathBuf::from("toolwall-data/ledger.db"),
            preview_bytes: 2048,
            body_cap_bytes: (1 << 20) + 4096,
            blob_every_body: false,
            text_cap_bytes: 4096,
            max_staged_rows: 100_000,
            max_staged_bytes: 256 << 20,
            busy_timeout_ms: 500,
            wal_size_limit_bytes: 64 << 20,
            wal_restart_bytes: 16 << 20,
            chain_flush_groups: 64,
            chain_flush_ms: 100,
            signing_key: None,
            checkpoint_groups: 1000,
            checkpoint_secs: 60,
            anchor_command: None,
            anchor_timeout_ms: 10_000,
            retain_days: 0,
            retain_secs: None,
            max_bytes: 0,
            archive_dir: None,
            retention_batch_rows: 100,
            retention_pause_ms: 10,
            retention_check_secs: 600,
        }
    }
}
