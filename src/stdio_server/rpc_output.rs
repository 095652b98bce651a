//! The host's output to the gateway, shared by its loop and the pool threads that answer
//! calls. A pool thread writes its answer itself (the loop is not woken for it: one thread
//! wake-up less per call); the loop writes its own replies and whatever the socket did not
//! take. One lock keeps the bytes whole and in order: whoever writes first moves what the
//! threads left in the outbox (a call's relayed messages come before its answer), and
//! answers of cancelled calls are dropped here, by either.

use mio::Waker;
use std::collections::HashSet;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::aggregator::worker::{DirectAnswer, Outbox};
use crate::workers::rpc::Message;
use crate::workers::worker_main::{flush, push};

pub struct RpcOutput {
    /// A second handle on the RPC socket (non-blocking, close-on-exec), for writing.
    stream: UnixStream,
    /// Encoded messages the socket has not taken yet.
    out: Vec<u8>,
    /// Calls the gateway cancelled whose answer has not come: it is dropped.
    cancelled: HashSet<u64>,
}

pub type SharedOutput = Arc<Mutex<RpcOutput>>;

impl RpcOutput {
    pub fn new(stream: UnixStream) -> SharedOutput {
        Arc::new(Mutex::new(RpcOutput {
            stream,
            out: Vec::new(),
            cancelled: HashSet::new(),
        }))
    }

    pub fn lock(shared: &SharedOutput) -> MutexGuard<'_, RpcOutput> {
        shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The answer of call `id` is not wanted any more.
    pub fn cancel(&mut self, id: u64) {
        self.cancelled.insert(id);
    }

    /// Call `id` is no longer held here (its answer already went, or will go as an
    /// answer): its cancel mark goes.
    pub fn forget(&mut self, id: u64) {
        self.cancelled.remove(&id);
    }

    /// Queue `msg` (an answer of a cancelled call is dropped instead).
    pub fn queue(&mut self, msg: &Message) {
        if let Message::Response { id, .. } = msg
            && self.cancelled.remove(id)
        {
            // Word that the call ended, not its answer (see `worker_main::cancelled_end`).
            push(
                &mut self.out,
                &crate::workers::worker_main::cancelled_end(*id),
            );
            return;
        }
        push(&mut self.out, msg);
    }

    /// Queue what the threads left in `outbox`, in their order.
    pub fn queue_outbox(&mut self, outbox: &Outbox) {
        let earlier = std::mem::take(&mut *outbox.lock().unwrap_or_else(|p| p.into_inner()));
        for msg in &earlier {
            self.queue(msg);
        }
    }

    /// Write what the socket takes now; true when something is left.
    pub fn flush(&mut self) -> std::io::Result<bool> {
        flush(&mut self.stream, &mut self.out)?;
        Ok(!self.out.is_empty())
    }

    /// The pool threads' way out: the outbox first, then the answer, written at once;
    /// the loop is woken only when the socket left something (or failed).
    pub fn direct(shared: &SharedOutput, outbox: &Outbox, waker: &Arc<Waker>) -> DirectAnswer {
        let (shared, outbox, waker) = (Arc::clone(shared), Arc::clone(outbox), Arc::clone(waker));
        Arc::new(move |msg: Message| {
            let mut o = RpcOutput::lock(&shared);
            o.queue_outbox(&outbox);
            o.queue(&msg);
            if !matches!(o.flush(), Ok(false)) {
                drop(o);
                let _ = waker.wake();
            }
        })
    }
}
