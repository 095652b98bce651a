//! State shared by the stdin thread and the socket reader: which connection is current and
//! which requests on it await a reply. The lock is never held across socket or stdout I/O.

use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::jsonrpc_error::{TRANSPORT_ERROR, error_line};
use super::{diag, stdout_line};

/// A request sent and not yet answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// The JSON-RPC id as raw JSON.
    pub id: String,
    pub method: String,
}

#[derive(Default)]
struct State {
    /// Bumped on every connection; replies read on an older one are stale.
    generation: u64,
    connected: bool,
    /// Stream id → request, for the current connection only.
    pending: BTreeMap<u32, Pending>,
    /// Lines taken from `pending` and not yet written to stdout.
    delivering: usize,
}

pub struct Session {
    state: Mutex<State>,
    changed: Condvar,
    max_pending: usize,
}

impl Session {
    pub fn new(max_pending: usize) -> Self {
        Self {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            max_pending,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent between statements, so a panicked holder leaves it usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Start a new connection; returns its generation.
    pub fn open_connection(&self) -> u64 {
        let mut st = self.lock();
        st.generation += 1;
        st.connected = true;
        st.generation
    }

    pub fn is_open(&self, generation: u64) -> bool {
        let st = self.lock();
        st.connected && st.generation == generation
    }

    /// Record a request about to be sent, waiting while `max_pending` are in flight.
    /// Gives it back when the connection is no longer open.
    pub fn register(
        &self,
        generation: u64,
        stream_id: u32,
        request: Pending,
    ) -> Result<(), Pending> {
        let mut st = self.lock();
        loop {
            if !(st.connected && st.generation == generation) {
                return Err(request);
            }
            if st.pending.len() < self.max_pending {
                st.pending.insert(stream_id, request);
                return Ok(());
            }
            st = self
                .changed
                .wait(st)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Write a reply from the gateway, if it answers a pending request of this connection.
    pub fn deliver_reply(&self, generation: u64, stream_id: u32, payload: &[u8]) {
        {
            let mut st = self.lock();
            if st.generation != generation {
                return;
            }
            if st.pending.remove(&stream_id).is_none() {
                drop(st);
                diag::warn(format_args!(
                    "dropped a reply on stream {stream_id}: no request awaits it"
                ));
                return;
            }
            st.delivering += 1;
        }
        stdout_line::write(payload);
        self.delivered(1);
    }

    /// Write a notification from the gateway, if read on the current connection.
    pub fn deliver_notification(&self, generation: u64, payload: &[u8]) {
        {
            let mut st = self.lock();
            if st.generation != generation {
                return;
            }
            st.delivering += 1;
        }
        stdout_line::write(payload);
        self.delivered(1);
    }

    /// Answer one pending request with a local error instead of the gateway's reply.
    pub fn fail_stream(&self, generation: u64, stream_id: u32, code: i32, message: &str) {
        let request = {
            let mut st = self.lock();
            if st.generation != generation {
                return;
            }
            let Some(request) = st.pending.remove(&stream_id) else {
                return;
            };
            st.delivering += 1;
            request
        };
        stdout_line::write(error_line(Some(&request.id), code, message).as_bytes());
        self.delivered(1);
    }

    /// The connection is gone: every request pending on it gets -32001, nothing is
    /// replayed. Returns whether this call closed it (it may be closed already).
    pub fn close_connection(&self, generation: u64) -> bool {
        let orphans = {
            let mut st = self.lock();
            if !(st.connected && st.generation == generation) {
                return false;
            }
            st.connected = false;
            let orphans = std::mem::take(&mut st.pending);
            st.delivering += 1;
            orphans
        };
        for request in orphans.values() {
            let message = format!("transport disconnected before {} response", request.method);
            stdout_line::write(error_line(Some(&request.id), TRANSPORT_ERROR, &message).as_bytes());
        }
        self.delivered(1);
        true
    }

    fn delivered(&self, count: usize) {
        self.lock().delivering -= count;
        self.changed.notify_all();
    }

    /// Wait until no request is pending and every reply is written, or `timeout` passes.
    /// Either way no later reply is delivered; returns the requests still unanswered.
    pub fn drain(&self, timeout: Duration) -> Vec<Pending> {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        loop {
            if st.pending.is_empty() && st.delivering == 0 {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            st = self
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        st.connected = false;
        st.generation += 1;
        std::mem::take(&mut st.pending).into_values().collect()
    }
}
