//! WAL checkpoints off the gateway's loop thread.
//!
//! SQLite's automatic checkpoint runs inside the commit that crosses its threshold, fsync
//! included, on whatever thread commits: the loop. Measured at 64 calls in flight it was
//! about 30% of the loop's CPU and set the p99. The writer connection turns it off
//! (`wal_autocheckpoint = 0`) and this thread, with a connection of its own, runs passive
//! checkpoints (they never block the writer) every [`CHECKPOINT_PERIOD`].
//!
//! A passive checkpoint alone does not bound the WAL under steady load: SQLite restarts the
//! WAL from its beginning only when a write transaction starts while every frame has been
//! copied back, and a writer that commits every few hundred microseconds always adds frames
//! while a checkpoint (two fsyncs) runs. Measured at one call in flight: the WAL grew by
//! 40 MB/s without end, and appending to it cost the loop a fifth of its CPU (the kernel
//! zeroes every new page-cache page). So once the WAL holds more than `wal_restart_bytes`,
//! the passive checkpoint that did the bulk of the copying is followed by a RESTART one,
//! which holds the writer back only while it copies the few frames written meanwhile and
//! syncs; the next commit then writes the WAL from its start again, over pages the page
//! cache already holds. A reader with a transaction open (an operator's query) pins the
//! WAL; the RESTART waits for it only [`RESTART_WAIT`] and then backs off, because it holds
//! the writer's lock while it waits.

use rusqlite::{Connection, OpenFlags};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the WAL is folded back into the database.
pub const CHECKPOINT_PERIOD: Duration = Duration::from_millis(100);

/// Most passive rounds before a restart; a writer that outpaces copying gets its restart
/// (and the longer hold) anyway.
const CATCH_UP_ROUNDS: usize = 4;

/// New frames per round below which the WAL counts as caught up.
const CAUGHT_UP_FRAMES: u64 = 64;

/// How long a RESTART waits for the writer's lock and for readers. It holds the writer
/// lock while it waits for readers, so a reader with a long transaction open (an
/// operator's query) would otherwise hold every commit back for the whole busy timeout.
const RESTART_WAIT: Duration = Duration::from_millis(5);

/// Periods to skip restart attempts after one found the WAL busy: a long reader keeps it
/// busy, and each attempt holds commits back for up to [`RESTART_WAIT`].
const RESTART_BACKOFF_PERIODS: u32 = 10;

pub struct Checkpointer {
    stop: Arc<(Mutex<bool>, Condvar)>,
    failing: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// `restart_bytes`: WAL size beyond which a checkpoint also restarts the WAL.
    pub fn start(
        path: &Path,
        busy_timeout: Duration,
        restart_bytes: u64,
    ) -> std::io::Result<Checkpointer> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let failing = Arc::new(AtomicBool::new(false));
        let path: PathBuf = path.to_path_buf();
        let (stop2, failing2) = (Arc::clone(&stop), Arc::clone(&failing));
        let thread = std::thread::Builder::new()
            .name("ledger-checkpoint".into())
            .spawn(move || run(&path, busy_timeout, restart_bytes, &stop2, &failing2))?;
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

fn run(
    path: &Path,
    busy_timeout: Duration,
    restart_bytes: u64,
    stop: &(Mutex<bool>, Condvar),
    failing: &AtomicBool,
) {
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
    let page_size: u64 = conn
        .query_row("PRAGMA page_size", [], |row| row.get::<_, i64>(0))
        .ok()
        .and_then(|n| u64::try_from(n).ok())
        .filter(|&n| n > 0)
        .unwrap_or(u64::from(super::writer::PAGE_SIZE));
    let restart_frames = (restart_bytes / page_size).max(1);
    let mut backoff = 0u32;
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
        backoff = backoff.saturating_sub(1);
        let result = checkpoint(&conn, "PASSIVE").and_then(|(_, wal_frames)| {
            if wal_frames < restart_frames || backoff > 0 {
                return Ok(());
            }
            let restarted = catch_up_and_restart(&conn, wal_frames, busy_timeout)?;
            if !restarted {
                backoff = RESTART_BACKOFF_PERIODS;
            }
            Ok(())
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

/// After a passive checkpoint found a WAL of `wal_frames` frames worth restarting: more
/// passive rounds copy what the writer added meanwhile (each round is shorter than the last
/// while copying outpaces writing), then RESTART copies the last few frames and syncs while
/// it holds the writer back. Straight to RESTART, it held a busy writer back for tens of
/// milliseconds while it copied everything written during the first round. Returns whether
/// the restart went through (false: the writer or a reader was busy).
fn catch_up_and_restart(
    conn: &Connection,
    wal_frames: u64,
    busy_timeout: Duration,
) -> rusqlite::Result<bool> {
    let mut seen = wal_frames;
    for _ in 0..CATCH_UP_ROUNDS {
        let (_, now) = checkpoint(conn, "PASSIVE")?;
        let added = now.saturating_sub(seen);
        seen = now;
        if added <= CAUGHT_UP_FRAMES {
            break;
        }
    }
    conn.busy_timeout(RESTART_WAIT)?;
    let restart = checkpoint(conn, "RESTART");
    conn.busy_timeout(busy_timeout)?;
    restart.map(|(busy, _)| !busy)
}

/// Runs one checkpoint of `mode`: whether it stopped short because another connection was
/// busy (not an error: the next period tries again), and how many frames the WAL holds.
fn checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<(bool, u64)> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |row| {
        Ok((row.get::<_, i64>(0)? != 0, row.get::<_, i64>(1)?))
    })
    .map(|(busy, frames)| (busy, u64::try_from(frames).unwrap_or(0)))
}
