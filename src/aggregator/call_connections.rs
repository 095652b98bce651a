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

#[cfg(test)]
mod tests {
    use super::super::call_link::{CallLink, Serving, TrackingConnector};
    use std::io::{BufRead, BufReader, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    use ureq::Agent;
    use ureq::unversioned::resolver::DefaultResolver;

    /// A keep-alive HTTP server on loopback that counts its connections; `/slow` is never
    /// answered (the client must give up or be shut down).
    fn server() -> (u16, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                count.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || serve(conn));
            }
        });
        (port, accepted)
    }

    fn serve(conn: TcpStream) {
        let mut out = conn.try_clone().unwrap();
        let mut lines = BufReader::new(conn);
        loop {
            let mut first = String::new();
            if lines.read_line(&mut first).unwrap_or(0) == 0 {
                return;
            }
            loop {
                let mut header = String::new();
                if lines.read_line(&mut header).unwrap_or(0) == 0 {
                    return;
                }
                if header == "\r\n" {
                    break;
                }
            }
            if first.contains("/slow") {
                // Held until the client's socket goes away.
                let mut rest = String::new();
                let _ = lines.read_line(&mut rest);
                return;
            }
            if out
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                .is_err()
            {
                return;
            }
        }
    }

    fn agent() -> Agent {
        Agent::with_parts(
            Agent::config_builder()
                .timeout_global(Some(Duration::from_secs(60)))
                .build(),
            TrackingConnector::default(),
            DefaultResolver::default(),
        )
    }

    fn get(agent: &Agent, port: u16, path: &str) -> Result<String, ureq::Error> {
        agent
            .get(format!("http://127.0.0.1:{port}{path}"))
            .call()?
            .body_mut()
            .read_to_string()
    }

    #[test]
    fn calls_reuse_a_connection_and_a_cancel_reaches_only_the_call_using_it() {
        let (port, accepted) = server();
        let agent = agent();
        let first = CallLink::new(1);
        {
            let _serving = Serving::start(&first);
            assert_eq!(get(&agent, port, "/a").unwrap(), "ok");
        }
        let second = CallLink::new(2);
        let _serving = Serving::start(&second);
        assert_eq!(get(&agent, port, "/b").unwrap(), "ok");
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "the second call reused it"
        );
        // The first call's cancellation comes late: the connection serves the second now.
        first.cancel();
        assert_eq!(get(&agent, port, "/c").unwrap(), "ok");
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "still the one connection"
        );
        drop(_serving);

        // A call blocked on the reused connection is freed by its cancellation.
        let third = CallLink::new(3);
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let (agent2, link) = (agent.clone(), Arc::clone(&third));
        std::thread::spawn(move || {
            let _serving = Serving::start(&link);
            let _ = done_tx.send(get(&agent2, port, "/slow"));
        });
        // Cancel once the request is on the wire (the server holds it); cancelling earlier
        // fails the request as well, so the check below holds either way.
        std::thread::sleep(Duration::from_millis(200));
        third.cancel();
        let outcome = done_rx
            .recv_timeout(Duration::from_secs(50))
            .expect("the cancelled request returned (a hang means the socket was not shut)");
        assert!(outcome.is_err(), "{outcome:?}");
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "it was the pooled one");
    }
}
