//! The ledger's place on disk: its directory (created 0700), the database file (created
//! 0600 before SQLite opens it; SQLite gives the `-wal` and `-shm` files the same mode), and
//! the writer lock that keeps a second gateway from writing the same ledger.

use nix::fcntl::{Flock, FlockArg};
use std::fs::{DirBuilder, File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::error::{LedgerError, LedgerErrorKind};

/// Mode of directories the ledger creates.
pub const DIR_MODE: u32 = 0o700;
/// Mode of the files the ledger creates.
pub const FILE_MODE: u32 = 0o600;

/// Creates the parent directory (0700, with any missing ancestors) and the database file
/// (0600) when they do not exist. Existing ones keep their modes: an operator may have
/// chosen a group for auditors.
pub fn prepare(path: &Path) -> Result<(), LedgerError> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(parent)
            .map_err(|e| {
                LedgerError::new(
                    LedgerErrorKind::Open,
                    path,
                    format!("cannot create directory {}: {e}", parent.display()),
                )
            })?;
    }
    // Never open an existing database file outside SQLite: closing that descriptor would
    // drop the POSIX locks of every SQLite connection of this process to it.
    match OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(LedgerError::new(
            LedgerErrorKind::Open,
            path,
            format!("cannot create: {e}"),
        )),
    }
}

/// The lock file next to the database.
pub fn lock_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// An exclusive `flock` on `<ledger>.lock`, held while the ledger is open for writing. Call
/// ids are assigned in memory from `MAX(id)+1`, which is only sound with one writer. The
/// kernel releases the lock when the process dies, so a crash never leaves it stale. (A
/// separate file, because closing any other descriptor of the database file itself would
/// release SQLite's own POSIX locks.)
#[derive(Debug)]
pub struct WriterLock {
    _lock: Flock<File>,
}

impl WriterLock {
    pub fn acquire(path: &Path) -> Result<WriterLock, LedgerError> {
        let lock_path = lock_path(path);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(FILE_MODE)
            .open(&lock_path)
            .map_err(|e| {
                LedgerError::new(
                    LedgerErrorKind::Open,
                    path,
                    format!("cannot open lock file {}: {e}", lock_path.display()),
                )
            })?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => Ok(WriterLock { _lock: lock }),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(LedgerError::new(
                LedgerErrorKind::Locked,
                path,
                format!(
                    "already open for writing by another process (lock {} is held)",
                    lock_path.display()
                ),
            )),
            Err((_, errno)) => Err(LedgerError::new(
                LedgerErrorKind::Open,
                path,
                format!("cannot lock {}: {errno}", lock_path.display()),
            )),
        }
    }
}
