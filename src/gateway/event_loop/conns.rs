//! The connection table: one entry per agent or admin connection (unix, vsock, TCP or
//! the stdio slot), its wire state and its output; answers are delivered and written here.

use super::*;

pub(super) enum ConnIo {
    Unix(UnixStream),
    Vsock(vsock::VsockStream),
    Tcp(mio::net::TcpStream),
    /// Slot of the stdio connection: bytes move through [`StdioSide`].
    Stdio,
}

pub(super) enum Wire {
    Framed(FramedInbound),
    Lines(LineInbound),
    /// The admin socket: JSON lines, never an agent.
    Admin(LineInbound),
    /// The Streamable HTTP door.
    Http(Box<HttpConn>),
}

pub(super) struct Conn {
    pub(super) generation: u64,
    pub(super) io: ConnIo,
    pub(super) wire: Wire,
    pub(super) peer: Peer,
    pub(super) out: Vec<u8>,
    pub(super) out_pos: usize,
    pub(super) read_closed: bool,
    /// The peer hung up (an edge seen once, kept here): a call it waits for while its
    /// bytes are not read ends as for any closed connection.
    pub(super) hung_up: bool,
    /// The core was told of the hang-up while a bound kept this connection unread.
    pub(super) hang_up_reported: bool,
    /// The core was told the agent stopped sending (its held asks end then).
    pub(super) eof_reported: bool,
    /// Set when the stream became unframeable or a write failed: close now.
    pub(super) broken: bool,
    pub(super) partial_since: Option<Instant>,
    /// A grant of `gateway.max_partial_bytes` for the large message arriving.
    pub(super) grant: Option<crate::gateway::door_limits::Hold>,
    /// Reading waits for such a grant (counted once per wait).
    pub(super) awaiting_grant: bool,
    /// Reading stopped by a bound (in-flight, queued output); resume when it clears.
    pub(super) paused: bool,
    /// Registered writable only while output waits.
    pub(super) write_interest: WriteInterest,
    /// Its seat in the doors' budgets and the facts its deadlines are measured from.
    pub(super) guard: ConnGuard,
}

impl Conn {
    pub(super) fn queued(&self) -> usize {
        self.out.len() - self.out_pos
    }
}

impl Read for ConnIo {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            ConnIo::Unix(s) => s.read(buf),
            ConnIo::Vsock(s) => s.read(buf),
            ConnIo::Tcp(s) => s.read(buf),
            ConnIo::Stdio => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

impl ConnIo {
    /// Re-registers the socket for `interest`; the stdio slot has no socket.
    pub(super) fn reregister(
        &mut self,
        registry: &Registry,
        token: Token,
        interest: Interest,
    ) -> io::Result<()> {
        match self {
            ConnIo::Unix(s) => registry.reregister(s, token, interest),
            ConnIo::Tcp(s) => registry.reregister(s, token, interest),
            ConnIo::Vsock(s) => registry.reregister(&mut SourceFd(&s.as_raw_fd()), token, interest),
            ConnIo::Stdio => Ok(()),
        }
    }
}

impl Write for ConnIo {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            ConnIo::Unix(s) => s.write(buf),
            ConnIo::Vsock(s) => s.write(buf),
            ConnIo::Tcp(s) => s.write(buf),
            ConnIo::Stdio => Ok(buf.len()),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Frames of the current turn, for [`Gateway::deliver`].
pub(super) enum Outgoing<'a> {
    Reply(u32, &'a [u8]),
    Notification(&'a [u8]),
}

impl Gateway {
    /// Tell the core how many answer bytes wait to be written to each principal's
    /// connections (`gateway.max_bytes_in_flight_per_principal`): once before a batch of
    /// messages is handed over, so it judges them by what is queued now.
    pub(super) fn tell_output_waiting(&mut self) {
        let mut waiting: std::collections::HashMap<String, usize> = Default::default();
        for c in self.conns.iter().flatten() {
            let queued = c.queued();
            if queued > 0 {
                *waiting.entry(c.peer.principal.clone()).or_insert(0) += queued;
            }
        }
        self.core.set_output_waiting(waiting);
    }

    pub(super) fn insert_conn(
        &mut self,
        io: ConnIo,
        wire: Wire,
        peer: Peer,
        guard: ConnGuard,
    ) -> usize {
        self.generation += 1;
        let conn = Conn {
            generation: self.generation,
            io,
            wire,
            peer,
            out: Vec::new(),
            out_pos: 0,
            read_closed: false,
            hung_up: false,
            hang_up_reported: false,
            eof_reported: false,
            broken: false,
            partial_since: None,
            grant: None,
            awaiting_grant: false,
            paused: false,
            write_interest: WriteInterest::default(),
            guard,
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.conns[slot] = Some(conn);
                slot
            }
            None => {
                self.conns.push(Some(conn));
                self.conns.len() - 1
            }
        };
        self.live_conns += 1;
        if let Some(c) = self.conns[slot].as_ref()
            && !matches!(c.wire, Wire::Admin(_))
            && c.guard.seat.as_ref().is_none_or(Seat::is_agent)
        {
            let r = ConnRef {
                slot,
                generation: c.generation,
            };
            let peer = c.peer.clone();
            if let Some(Some(c)) = self.conns.get_mut(slot) {
                c.guard.announced = true;
            }
            self.core.on_connect(r, &peer);
        }
        slot
    }

    pub(super) fn deliver(&mut self, conn: ConnRef, out: Outgoing) {
        let Some(Some(c)) = self.conns.get_mut(conn.slot) else {
            return;
        };
        if c.generation != conn.generation || c.broken {
            return;
        }
        // A line transport carries one message per line: a message with a raw line break
        // (which the core never produces) is dropped rather than split into two.
        let unframed = matches!(c.io, ConnIo::Stdio) || matches!(c.wire, Wire::Lines(_));
        if unframed {
            let (Outgoing::Reply(_, bytes) | Outgoing::Notification(bytes)) = &out;
            if !crate::transport::lines::is_one_line(bytes) {
                crate::error!("a message with a raw line break was withheld from a line transport");
                return;
            }
        }
        match (&c.io, &c.wire) {
            (ConnIo::Stdio, _) => {
                let bytes = match out {
                    Outgoing::Reply(_, b) | Outgoing::Notification(b) => b,
                };
                if let Some(side) = self.stdio.as_mut() {
                    side.write(bytes.to_vec());
                }
                return;
            }
            (_, Wire::Framed(_)) => match out {
                Outgoing::Reply(stream, b) => framed::encode_reply(&mut c.out, stream, false, b),
                Outgoing::Notification(b) => framed::encode_reply(&mut c.out, 0, true, b),
            },
            (_, Wire::Http(_)) => {
                // An HTTP answer is the response to the one request the core holds; no
                // stream carries notifications (no SSE), so those are dropped.
                let Outgoing::Reply(_, bytes) = out else {
                    return;
                };
                let (Some(door), Wire::Http(h)) = (self.http.as_mut(), &mut c.wire) else {
                    return;
                };
                door.answer(h, bytes, &mut c.out, Instant::now());
                // The next pipelined request, if any, is parsed by resume_paused.
                c.paused = true;
            }
            _ => {
                let b = match out {
                    Outgoing::Reply(_, b) | Outgoing::Notification(b) => b,
                };
                c.out.extend_from_slice(b);
                c.out.push(b'\n');
            }
        }
        self.to_flush.push(conn.slot);
    }

    pub(super) fn flush_conn(&mut self, slot: usize) {
        let Some(Some(c)) = self.conns.get_mut(slot) else {
            return;
        };
        let mut written = 0;
        while c.out_pos < c.out.len() {
            match c.io.write(&c.out[c.out_pos..]) {
                Ok(0) => {
                    c.broken = true;
                    break;
                }
                Ok(n) => {
                    c.out_pos += n;
                    written += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    c.broken = true;
                    break;
                }
            }
        }
        if c.out_pos == c.out.len() {
            c.out.clear();
            c.out_pos = 0;
            if c.out.capacity() > 1 << 20 {
                c.out.shrink_to(64 * 1024);
            }
        } else if c.out_pos > c.out.len() / 2 {
            c.out.drain(..c.out_pos);
            c.out_pos = 0;
        }
        let pending = c.out_pos < c.out.len();
        if written > 0 || pending || c.guard.write_blocked_since.is_some() {
            c.guard.on_write(written, pending, Instant::now());
        }
        let token = Token(CONN_BASE + slot);
        let registry = self.poll.registry();
        if c.write_interest
            .update(pending, |interest| {
                c.io.reregister(registry, token, interest)
            })
            .is_err()
        {
            c.broken = true;
        }
    }

    /// An agent that closed its sending side (EOF) can no longer act on a held call: the
    /// core ends its asks (calls already at a worker still finish and are answered).
    pub(super) fn report_eofs(&mut self, now: Instant) {
        for (slot, c) in self.conns.iter_mut().enumerate() {
            let Some(c) = c.as_mut() else { continue };
            if c.read_closed && !c.eof_reported && !matches!(c.wire, Wire::Admin(_)) {
                c.eof_reported = true;
                let conn = ConnRef {
                    slot,
                    generation: c.generation,
                };
                self.core.on_agent_eof(conn, now);
            }
        }
    }

    /// The peer closed its side (or the socket failed): an edge that comes once, kept.
    pub(super) fn on_hang_up(&mut self, slot: usize) {
        if let Some(Some(c)) = self.conns.get_mut(slot) {
            c.hung_up = true;
        }
    }

    /// The peer closed both ways: its calls end as cancelled (see `Core::on_peer_gone`).
    pub(super) fn on_peer_gone(&mut self, slot: usize, now: Instant) {
        if Some(slot) == self.stdio_slot {
            return;
        }
        let Some(Some(c)) = self.conns.get(slot) else {
            return;
        };
        if matches!(c.wire, Wire::Admin(_)) {
            return;
        }
        let conn = ConnRef {
            slot,
            generation: c.generation,
        };
        self.core.on_peer_gone(conn, now);
    }

    pub(super) fn resume_paused(&mut self, now: Instant) {
        // Set again by any connection that gives up its turn with work left.
        self.doors.yielded = false;
        for slot in 0..self.conns.len() {
            if self.conns[slot]
                .as_ref()
                .is_some_and(|c| c.paused && !c.broken)
            {
                self.service_conn(slot, now);
            }
        }
        if let Some(slot) = self.stdio_slot {
            // stdin chunks may be waiting in the channel without a new wake.
            self.service_conn(slot, now);
        }
    }

    pub(super) fn close_conn(&mut self, slot: usize) {
        self.on_conn_closing(slot, Instant::now());
        let Some(mut c) = self.conns[slot].take() else {
            return;
        };
        if let Some(hold) = c.grant.take() {
            self.doors.partial.release(hold);
            self.doors.yielded = true;
        }
        match &mut c.io {
            ConnIo::Unix(s) => {
                let _ = self.poll.registry().deregister(s);
            }
            ConnIo::Tcp(s) => {
                let _ = self.poll.registry().deregister(s);
            }
            ConnIo::Vsock(s) => {
                let _ = self
                    .poll
                    .registry()
                    .deregister(&mut SourceFd(&s.as_raw_fd()));
            }
            ConnIo::Stdio => {}
        }
        if c.guard.announced {
            self.core.on_disconnect(
                ConnRef {
                    slot,
                    generation: c.generation,
                },
                &c.peer,
                Instant::now(),
            );
        }
        self.free.push(slot);
        self.live_conns -= 1;
    }
}
