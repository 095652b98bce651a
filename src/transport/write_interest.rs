//! Write interest only while output waits.
//!
//! A socket registered WRITABLE for good (edge-triggered) is still woken whenever its peer
//! reads: the kernel signals write space each time the peer consumes a message, and epoll
//! wakes a sleeping poller for it. Measured at one call in flight: the worker woke twice per
//! call instead of once, and the gateway paid for that cross-CPU wake-up inside its own
//! reads. So sockets are registered READABLE, and WRITABLE only while a write would block.

use mio::Interest;
use std::io;

/// What a socket is registered for: readable always, writable while output is queued.
#[derive(Debug, Default)]
pub struct WriteInterest {
    writable: bool,
}

impl WriteInterest {
    /// The interest to register a fresh socket with.
    pub const INITIAL: Interest = Interest::READABLE;

    /// After a flush, with `pending` saying whether output is still queued: re-registers
    /// (through `reregister`) only when that changed. Re-registering re-arms the edge, so a
    /// socket that became writable or readable meanwhile is reported at once.
    pub fn update(
        &mut self,
        pending: bool,
        reregister: impl FnOnce(Interest) -> io::Result<()>,
    ) -> io::Result<()> {
        if pending == self.writable {
            return Ok(());
        }
        let interest = if pending {
            Interest::READABLE | Interest::WRITABLE
        } else {
            Interest::READABLE
        };
        reregister(interest)?;
        self.writable = pending;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mio::net::UnixStream;
    use mio::{Events, Poll, Token};
    use std::io::{Read, Write};
    use std::time::Duration;

    /// Whether `token` shows up writable within a short wait.
    fn writable_event(poll: &mut Poll, token: Token) -> bool {
        let mut events = Events::with_capacity(8);
        poll.poll(&mut events, Some(Duration::from_millis(50)))
            .unwrap();
        events.iter().any(|e| e.token() == token && e.is_writable())
    }

    #[test]
    fn writable_is_asked_for_only_while_output_waits() {
        let mut poll = Poll::new().unwrap();
        let (mut ours, mut peer) = UnixStream::pair().unwrap();
        let token = Token(7);
        poll.registry()
            .register(&mut ours, token, WriteInterest::INITIAL)
            .unwrap();
        let mut interest = WriteInterest::default();
        assert!(
            !writable_event(&mut poll, token),
            "registered readable only"
        );

        // Output queued: the socket is writable, and says so as soon as it is asked for.
        let registry = poll.registry().try_clone().unwrap();
        interest
            .update(true, |i| registry.reregister(&mut ours, token, i))
            .unwrap();
        assert!(writable_event(&mut poll, token));

        // Drained: the peer's reads no longer wake us.
        interest
            .update(false, |i| registry.reregister(&mut ours, token, i))
            .unwrap();
        ours.write_all(b"hello").unwrap();
        let mut buf = [0u8; 5];
        peer.read_exact(&mut buf).unwrap();
        assert!(!writable_event(&mut poll, token));

        // No change, no system call.
        let mut called = false;
        interest
            .update(false, |_| {
                called = true;
                Ok(())
            })
            .unwrap();
        assert!(!called);
    }
}
