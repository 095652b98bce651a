//! The calls a worker's own pool holds (queued or running) and which of them the gateway
//! cancelled. A cancelled call still in the queue is skipped when a thread takes it (it
//! never runs); a cancelled call's answer is replaced by word that it ended
//! ([`cancelled_end`](super::worker_main::cancelled_end)), which frees its slot at the
//! gateway. A cancel for a call the pool no longer holds (its answer already left) is not
//! kept: both sets are bounded by the calls the pool holds, its threads plus its queue.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// The cancelled calls, shared with the pool threads (they look before running a job).
pub type CancelledCalls = Arc<Mutex<HashSet<u64>>>;

#[derive(Debug, Default)]
pub struct PoolCalls {
    /// Calls handed to the pool whose answer has not been taken back yet (the loop's own).
    held: HashSet<u64>,
    /// Those of them (or of calls another part of the worker holds) the gateway cancelled.
    cancelled: CancelledCalls,
}

impl PoolCalls {
    /// The set the pool threads consult ([`PoolCalls::skips`]).
    pub fn shared(&self) -> CancelledCalls {
        Arc::clone(&self.cancelled)
    }

    /// Call `id` was handed to the pool.
    pub fn held(&mut self, id: u64) {
        self.held.insert(id);
    }

    /// The gateway cancelled `id`. Kept only while the call is still to answer: held by
    /// the pool, or `elsewhere` (known to another part of the worker, which answers it
    /// through [`PoolCalls::ended`] too). True when kept.
    pub fn cancel(&mut self, id: u64, elsewhere: bool) -> bool {
        if !(elsewhere || self.held.contains(&id)) {
            return false;
        }
        lock(&self.cancelled).insert(id);
        true
    }

    /// Call `id`'s answer came back: true when it was cancelled (send word that it ended,
    /// not the answer). Both sets forget it.
    pub fn ended(&mut self, id: u64) -> bool {
        self.held.remove(&id);
        lock(&self.cancelled).remove(&id)
    }

    /// Calls held now (the bound of both sets).
    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Cancelled calls not answered yet.
    pub fn cancelled_len(&self) -> usize {
        lock(&self.cancelled).len()
    }
}

/// For a pool thread about to run `id`: true when it was cancelled while it waited in the
/// queue (the thread answers with word that it ended instead of running it).
pub fn skips(cancelled: &CancelledCalls, id: u64) -> bool {
    lock(cancelled).contains(&id)
}

fn lock(set: &CancelledCalls) -> std::sync::MutexGuard<'_, HashSet<u64>> {
    set.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queued_call_cancelled_is_skipped_and_ends_as_cancelled() {
        let mut p = PoolCalls::default();
        let shared = p.shared();
        p.held(1);
        p.held(2);
        assert!(p.cancel(2, false));
        assert!(!skips(&shared, 1));
        assert!(skips(&shared, 2), "the thread skips it");
        assert!(!p.ended(1), "an answer that was not cancelled goes out");
        assert!(p.ended(2), "the cancelled one ends as cancelled");
        assert!(p.is_empty());
        assert_eq!(p.cancelled_len(), 0);
    }

    #[test]
    fn a_cancel_after_the_answer_left_is_forgotten() {
        let mut p = PoolCalls::default();
        p.held(7);
        assert!(!p.ended(7));
        // The cancel crossed the answer on the way: nothing is kept for it.
        assert!(!p.cancel(7, false));
        assert!(!p.cancel(8, false), "never held");
        assert_eq!(p.cancelled_len(), 0);
        // Another part of the worker still holds it: kept until its answer comes.
        assert!(p.cancel(9, true));
        assert!(p.ended(9));
        assert_eq!(p.cancelled_len(), 0);
    }
}
