//! What went wrong with the ledger, always naming the file.

use std::fmt;
use std::path::{Path, PathBuf};

/// Which step failed. The gateway fails closed on every kind; `RowsLost` is the one kind
/// where the commit did write (the rest of) the staged rows, yet some rows never will be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LedgerErrorKind {
    /// The configuration is unusable (a limit out of range).
    Config,
    /// The file or its directory could not be created or opened, or is not a ledger.
    Open,
    /// Another process holds the writer lock of this ledger.
    Locked,
    /// The file's schema is newer than this build knows.
    SchemaTooNew,
    /// Migrating the schema forward failed; nothing was changed.
    Migrate,
    /// A commit failed and was rolled back; the staged rows are kept for the next commit.
    Write,
    /// Rows were lost: dropped from the staging bound, or refused by SQLite one by one
    /// (a constraint). Everything else was committed.
    RowsLost,
    /// A WAL checkpoint failed or could not complete.
    Checkpoint,
    /// Reading the ledger failed.
    Read,
}

/// A ledger failure. `Display` says what failed, on which file, and why.
#[derive(Debug)]
pub struct LedgerError {
    kind: LedgerErrorKind,
    path: PathBuf,
    what: String,
    dropped_rows: u64,
    rejected_rows: u64,
}

impl LedgerError {
    pub(crate) fn new(kind: LedgerErrorKind, path: &Path, what: impl Into<String>) -> Self {
        LedgerError {
            kind,
            path: path.to_path_buf(),
            what: what.into(),
            dropped_rows: 0,
            rejected_rows: 0,
        }
    }

    pub(crate) fn with_losses(mut self, dropped_rows: u64, rejected_rows: u64) -> Self {
        self.dropped_rows = dropped_rows;
        self.rejected_rows = rejected_rows;
        self
    }

    pub fn kind(&self) -> LedgerErrorKind {
        self.kind
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Staged rows dropped (oldest first) because the staging bound was reached.
    pub fn dropped_rows(&self) -> u64 {
        self.dropped_rows
    }

    /// Staged rows SQLite refused one by one (e.g. a duplicate call id) and that were
    /// therefore skipped so they cannot block every later commit.
    pub fn rejected_rows(&self) -> u64 {
        self.rejected_rows
    }
}

impl fmt::Display for LedgerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ledger {}: {}", self.path.display(), self.what)
    }
}

impl std::error::Error for LedgerError {}
