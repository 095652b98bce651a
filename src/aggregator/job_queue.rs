//! The bounded queue between an upstream's worker loop and its pool threads.
//!
//! The pool used to share one `Receiver` behind a mutex: the thread holding the mutex
//! slept in `recv` while the others slept on the mutex, so every job woke two threads —
//! the receiver, and, once it let go of the mutex, the next thread to take it and sleep in
//! `recv` in its place. Here the idle threads wait on one condition variable and a job
//! wakes exactly one of them (`notify_one`): one context switch fewer per call, which on a
//! local server at one call in flight is a measurable share of its round trip.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

struct State<T> {
    jobs: VecDeque<T>,
    /// Threads waiting in [`JobReceiver::recv`] (a job handed to one of them is not
    /// queued: `capacity` counts the jobs nobody has taken yet).
    idle: usize,
    closed: bool,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
    capacity: usize,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Why [`JobSender::try_send`] refused a job (given back).
#[derive(Debug)]
pub enum SendRefused<T> {
    /// `capacity` jobs wait already.
    Full(T),
    /// Every pool thread is gone.
    Closed(T),
}

/// The loop's end: dropping it closes the queue, and the pool threads end once it is
/// empty.
pub struct JobSender<T> {
    shared: Arc<Shared<T>>,
}

/// A pool thread's end (one clone per thread).
pub struct JobReceiver<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Clone for JobReceiver<T> {
    fn clone(&self) -> Self {
        JobReceiver {
            shared: Arc::clone(&self.shared),
        }
    }
}

/// A queue holding at most `capacity` jobs not yet taken by a thread.
pub fn job_queue<T>(capacity: usize) -> (JobSender<T>, JobReceiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            jobs: VecDeque::new(),
            idle: 0,
            closed: false,
        }),
        ready: Condvar::new(),
        capacity,
    });
    (
        JobSender {
            shared: Arc::clone(&shared),
        },
        JobReceiver { shared },
    )
}

impl<T> JobSender<T> {
    /// Queues `job` and wakes one idle thread; never blocks.
    pub fn try_send(&self, job: T) -> Result<(), SendRefused<T>> {
        let mut st = self.shared.lock();
        if st.closed || Arc::strong_count(&self.shared) == 1 {
            return Err(SendRefused::Closed(job));
        }
        // Jobs an idle thread will take at once do not count against the queue.
        if st.jobs.len() >= self.shared.capacity + st.idle {
            return Err(SendRefused::Full(job));
        }
        st.jobs.push_back(job);
        drop(st);
        self.shared.ready.notify_one();
        Ok(())
    }
}

impl<T> Drop for JobSender<T> {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.ready.notify_all();
    }
}

impl<T> JobReceiver<T> {
    /// The next job; None once the sender is gone and the queue is empty.
    pub fn recv(&self) -> Option<T> {
        let mut st = self.shared.lock();
        loop {
            if let Some(job) = st.jobs.pop_front() {
                return Some(job);
            }
            if st.closed {
                return None;
            }
            st.idle += 1;
            st = self
                .shared
                .ready
                .wait(st)
                .unwrap_or_else(|p| p.into_inner());
            st.idle -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_beyond_the_idle_threads_and_the_capacity_are_refused_and_a_drop_ends_the_pool() {
        let (tx, rx) = job_queue::<u32>(2);
        // No thread waits: the capacity alone.
        tx.try_send(1).unwrap();
        tx.try_send(2).unwrap();
        assert!(matches!(tx.try_send(3), Err(SendRefused::Full(3))));
        assert_eq!(rx.recv(), Some(1));
        assert_eq!(rx.recv(), Some(2));
        // Every job reaches exactly one thread.
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let rx = rx.clone();
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    while let Some(j) = rx.recv() {
                        got.push(j);
                    }
                    got
                })
            })
            .collect();
        let mut sent = 0;
        let mut n = 0;
        while sent < 1000 {
            match tx.try_send(n) {
                Ok(()) => {
                    sent += 1;
                    n += 1;
                }
                Err(SendRefused::Full(_)) => std::thread::yield_now(),
                Err(SendRefused::Closed(_)) => panic!("closed"),
            }
        }
        drop(tx);
        let mut all: Vec<u32> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        all.sort_unstable();
        assert_eq!(all, (0..1000).collect::<Vec<_>>());
        // With every receiver gone, a sender is told so.
        let (tx, rx) = job_queue::<u32>(1);
        drop(rx);
        assert!(matches!(tx.try_send(1), Err(SendRefused::Closed(1))));
    }
}
