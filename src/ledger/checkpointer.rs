//! WAL checkpoints off the gateway's loop thread.
//!
//! SQLite's automatic checkpoint runs inside the commit that crosses its threshold, fsync
//! included, on whatever thread commits: the loop. Measured at 64 calls in flight it was
//! about 30% of the loop's CPU and set the p99. The writer connection turns it off
//! (`wal_autocheckpoint = 0`) and this thread, with a connection of its own, runs passive
//! checkpoints (they never block the writer) every [`CHECKPOINT_PERIOD`]. The WAL stays
//! bounded because a passive checkpoint that caught up lets the next commit restart it
//! from the beginning; `journal_size_limit` then truncates the file.

use rusqlite::{Connection, OpenFlags};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the WAL is folded back into the database.
pub const CHECKPOINT_PERIOD: Duration = Duration::from_millis(100);

pub struct Checkpointer {
    stop: Arc<(Mutex<bool>, Condvar)>,
    failing: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    pub fn start(path: &Path, busy_timeout: Duration) -> std::io::Result<Checkpointer> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let failing = Arc::new(AtomicBool::new(false));
        let path: PathBuf = path.to_path_buf();
        let (stop2, failing2) = (Arc::clone(&stop), Arc::clone(&failing));
        let thread = std::thread::Builder::new()
            .name("ledger-checkpoint".into())
            .spawn(move || run(&path, busy_timeout, &stop2, &failing2))?;
        Ok(Checkpointer {
            stop,
            failing,
            thread: Some(thread),
        })
    }

    /// Whether the last checkpoint attempt failed (for health and logs).
    pub fn failing(&self) -> bool {
        self.failing.load(Ordering::Relaxed)
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        let (lock, cv) = &*self.stop;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(path: &Path, busy_timeout: Duration, stop: &(Mutex<bool>, Condvar), failing: &AtomicBool) {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = match Connection::open_with_flags(path, flags) {
        Ok(c) => c,
        Err(e) => {
            crate::error!(
                "ledger {}: checkpoint thread cannot open: {e}",
                path.display()
            );
            failing.store(true, Ordering::Relaxed);
            return;
        }
    };
    let _ = conn.busy_timeout(busy_timeout);
    // It copies pages from the WAL to the database: nothing to keep cached.
    let _ = conn.execute_batch("PRAGMA cache_size = -256;");
    let (lock, cv) = stop;
    let mut stopped = lock.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let (guard, _) = cv
            .wait_timeout(stopped, CHECKPOINT_PERIOD)
            .unwrap_or_else(|p| p.into_inner());
        stopped = guard;
        if *stopped {
            return;
        }
        let result = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
            row.get::<_, i64>(0)
        });
        match result {
            Ok(_) => {
                if failing.swap(false, Ordering::Relaxed) {
                    crate::info!("ledger {}: checkpoints work again", path.display());
                }
            }
            Err(e) => {
                if !failing.swap(true, Ordering::Relaxed) {
                    crate::warn!("ledger {}: checkpoint failed: {e}", path.display());
                }
            }
        }
    }
}
