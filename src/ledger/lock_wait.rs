//! How the writer waits for a lock another connection holds.
//!
//! The checkpoint thread's RESTART holds the writer's lock for about a millisecond. SQLite's
//! own busy handler sleeps 1, 2, 5, 10 ms... between tries, so a commit that found the lock
//! taken waited at least a millisecond and often three. This handler retries every
//! [`RETRY_EVERY`] until the deadline of the operation that waits. The deadline is
//! thread-local because rusqlite hands SQLite's busy handler no context, and every write on
//! the writer's connection runs on the thread that asked for it.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Pause between two tries for a lock.
const RETRY_EVERY: Duration = Duration::from_micros(100);

thread_local! {
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Set while the writer waits for a lock another connection of this process holds: the
/// pin intake, which shares the file, starts no transaction meanwhile ([`writer_waiting`]),
/// so the writer waits for at most the one transaction in progress.
static WRITER_WAITING: AtomicBool = AtomicBool::new(false);

/// Whether the ledger's writer is waiting for the file's lock right now.
pub fn writer_waiting() -> bool {
    WRITER_WAITING.load(Ordering::Acquire)
}

/// While alive, writes on this thread wait for locks until `timeout` from its creation.
pub struct Waiting(());

impl Waiting {
    pub fn until(timeout: Duration) -> Waiting {
        DEADLINE.set(Some(Instant::now() + timeout));
        Waiting(())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        DEADLINE.set(None);
        WRITER_WAITING.store(false, Ordering::Release);
    }
}

/// SQLite's busy handler for the writer: true to try again. Without a [`Waiting`] on this
/// thread it gives up at once.
pub fn retry(_tries: i32) -> bool {
    let Some(deadline) = DEADLINE.get() else {
        return false;
    };
    let now = Instant::now();
    if now >= deadline {
        return false;
    }
    WRITER_WAITING.store(true, Ordering::Release);
    std::thread::sleep(RETRY_EVERY.min(deadline - now));
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_until_the_deadline_and_not_without_one() {
        assert!(!retry(0), "no operation is waiting");
        let waiting = Waiting::until(Duration::from_millis(20));
        assert!(retry(0));
        let started = Instant::now();
        let mut tries = 1;
        while retry(tries) {
            tries += 1;
        }
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(tries > 1);
        drop(waiting);
        assert!(!retry(0), "the deadline ends with the operation");
    }
}
