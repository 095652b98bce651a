//! Pooled upstream connections that follow the call using them. A call's HTTP requests
//! reuse the worker's keep-alive connections to the upstream (a new TCP connection per
//! call cost the upstream an accept and a handshake on every call), and a cancelled call
//! still shuts down the socket its request is on: each time a connection starts a request
//! on a thread that serves a call, it binds itself to that call's [`CallLink`], and leaves
//! the call it served before, whose later cancellation no longer touches it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use ureq::unversioned::transport::{Buffers, NextTimeout, ShutdownHandle, Transport};

use super::call_link::{CallLink, current_link};

/// One connection's tie to one call: shuts the socket down when that call is cancelled,
/// as long as the connection still serves it.
struct Binding {
    socket: Weak<dyn ShutdownHandle>,
    live: AtomicBool,
}

impl ShutdownHandle for Binding {
    fn shutdown(&self) {
        if self.live.load(Ordering::Acquire)
            && let Some(socket) = self.socket.upgrade()
        {
            socket.shutdown();
        }
    }
}

/// A connection of the calls' agent: ureq's transport, bound to the call of the thread
/// that writes a request on it.
pub struct CallBoundTransport {
    inner: Box<dyn Transport>,
    /// The socket's own shutdown handle (None: the connector gave none; then nothing can
    /// be shut down and the connection is never reused, see `is_open`).
    socket: Option<Weak<dyn ShutdownHandle>>,
    /// The call served now: a weak link (its address cannot be reused while held) and the
    /// binding it tracks.
    bound: Option<(Weak<CallLink>, Arc<Binding>)>,
}

impl std::fmt::Debug for CallBoundTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallBoundTransport")
            .field("inner", &self.inner)
            .finish()
    }
}

impl CallBoundTransport {
    pub fn new(
        inner: Box<dyn Transport>,
        socket: Option<Weak<dyn ShutdownHandle>>,
    ) -> CallBoundTransport {
        let mut t = CallBoundTransport {
            inner,
            socket,
            bound: None,
        };
        t.bind_current();
        t
    }

    /// Bind to the call the current thread serves (or to none).
    fn bind_current(&mut self) {
        let link = current_link();
        if let (Some(link), Some((was, _))) = (&link, &self.bound)
            && Weak::ptr_eq(was, &Arc::downgrade(link))
        {
            return;
        }
        if let Some((_, old)) = self.bound.take() {
            old.live.store(false, Ordering::Release);
        }
        let (Some(link), Some(socket)) = (link, &self.socket) else {
            return;
        };
        let binding = Arc::new(Binding {
            socket: socket.clone(),
            live: AtomicBool::new(true),
        });
        let handle: Arc<dyn ShutdownHandle> = Arc::clone(&binding) as Arc<dyn ShutdownHandle>;
        // A call cancelled already shuts the socket at once: its request fails.
        link.track(Arc::downgrade(&handle));
        self.bound = Some((Arc::downgrade(&link), binding));
    }
}

impl Transport for CallBoundTransport {
    fn buffers(&mut self) -> &mut dyn Buffers {
        self.inner.buffers()
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), ureq::Error> {
        // Every request starts by writing: the connection now serves this thread's call.
        self.bind_current();
        self.inner.transmit_output(amount, timeout)
    }

    fn maybe_await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        self.inner.maybe_await_input(timeout)
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        self.inner.await_input(timeout)
    }

    fn is_open(&mut self) -> bool {
        // Without a shutdown handle a call's cancellation could not reach a reused
        // connection: such a connection serves one request only.
        self.socket.is_some() && self.inner.is_open()
    }

    fn is_tls(&self) -> bool {
        self.inner.is_tls()
    }
}
