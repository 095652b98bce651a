//! The load driver: a few client threads, each running one mio loop over its share of the
//! connections, keep `depth` echo calls in flight on every connection until the measured
//! window closes, then wait for every answer. An event loop rather than a thread per
//! connection, so that at 64 connections the client costs the 2 shared cores as little as
//! possible; the same driver serves the baselines and every door.
//!
//! Latency is taken client-side from just before the request's write to the read that
//! delivered its reply. Calls sent inside the window give the latency samples; replies read
//! inside the window give the throughput.

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::wire::{self, ReplyKey, Wire};

/// How long after the window closes the client waits for the last answers.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(30);
/// Bytes read per `read` call.
const READ_CHUNK: usize = 64 * 1024;

/// One client connection as a door hands it over: where to read replies, where to write
/// requests (the same socket twice, or two pipes), and how they are delimited.
pub struct ClientConn {
    pub rx: File,
    pub tx: File,
    pub wire: Wire,
    /// The echo tool called (`local__echo`, or a stdio server's own name for it).
    pub tool: &'static str,
}

impl ClientConn {
    /// A connection over one socket (read and write through two descriptors of it).
    pub fn from_socket(fd: OwnedFd, wire: Wire) -> std::io::Result<ClientConn> {
        let tx = fd.try_clone()?;
        Ok(ClientConn {
            rx: File::from(fd),
            tx: File::from(tx),
            wire,
            tool: crate::wire::ECHO_TOOL,
        })
    }
}

/// When to send and when to measure, shared by all client threads.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// Measurement starts (warm-up before it).
    pub start: Instant,
    /// Measurement ends; no request is sent after it.
    pub end: Instant,
}

/// What one run of the driver saw.
#[derive(Debug, Default)]
pub struct LoadResult {
    /// Latency of every call sent inside the window, in nanoseconds, sorted.
    pub latencies_ns: Vec<u64>,
    /// Replies read inside the window.
    pub window_replies: u64,
    /// Every successful answer, warm-up and drain included (what the ledger must hold).
    pub answered: u64,
    /// Answers that were not the expected echo, and protocol faults.
    pub errors: u64,
    pub first_error: Option<String>,
    /// Calls never answered within [`DRAIN_LIMIT`].
    pub unanswered: u64,
}

impl LoadResult {
    fn merge(&mut self, other: LoadResult) {
        self.latencies_ns.extend(other.latencies_ns);
        self.window_replies += other.window_replies;
        self.answered += other.answered;
        self.errors += other.errors;
        self.unanswered += other.unanswered;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }

    fn fail(&mut self, why: String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(why);
        }
    }
}

/// Drive `conns` with `depth` calls in flight each, on `threads` threads, over `window`.
/// The connections come back open, so the processes behind them can still be looked at.
pub fn drive(
    conns: Vec<ClientConn>,
    depth: usize,
    threads: usize,
    window: Window,
) -> (LoadResult, Vec<ClientConn>) {
    let threads = threads.clamp(1, conns.len().max(1));
    let mut shares: Vec<Vec<(usize, ClientConn)>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, c) in conns.into_iter().enumerate() {
        shares[i % threads].push((i, c));
    }
    let handles: Vec<_> = shares
        .into_iter()
        .enumerate()
        .map(|(t, share)| {
            std::thread::Builder::new()
                .name(format!("client-{t}"))
                .spawn(move || ClientThread::new(share, depth, window).run())
                .expect("spawn a client thread")
        })
        .collect();
    let mut total = LoadResult::default();
    let mut open = Vec::new();
    for h in handles {
        match h.join() {
            Ok((r, conns)) => {
                total.merge(r);
                open.extend(conns);
            }
            Err(_) => total.fail("a client thread panicked".into()),
        }
    }
    total.latencies_ns.sort_unstable();
    (total, open)
}

struct Slot {
    index: usize,
    conn: ClientConn,
    out: Vec<u8>,
    out_pos: usize,
    inbuf: Vec<u8>,
    in_len: usize,
    next_seq: u32,
    /// (sequence number, send time) of the calls waiting, oldest first.
    pending: Vec<(u32, Instant)>,
    closed: bool,
    /// The write side is registered with the poll (only while output waits).
    tx_registered: bool,
}

struct ClientThread {
    slots: Vec<Slot>,
    depth: usize,
    window: Window,
    result: LoadResult,
    text: String,
    json: Vec<u8>,
    registry: Option<mio::Registry>,
}

fn set_nonblocking(file: &File) -> std::io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor this File owns.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

impl ClientThread {
    fn new(share: Vec<(usize, ClientConn)>, depth: usize, window: Window) -> ClientThread {
        let slots = share
            .into_iter()
            .map(|(index, conn)| Slot {
                index,
                out: conn.wire.preamble(),
                conn,
                out_pos: 0,
                inbuf: vec![0; READ_CHUNK],
                in_len: 0,
                next_seq: 1,
                pending: Vec::with_capacity(depth),
                closed: false,
                tx_registered: false,
            })
            .collect();
        ClientThread {
            slots,
            depth,
            window,
            result: LoadResult::default(),
            text: String::new(),
            json: Vec::new(),
            registry: None,
        }
    }

    fn run(mut self) -> (LoadResult, Vec<ClientConn>) {
        if let Err(e) = self.setup_and_loop() {
            self.result.fail(format!("client loop: {e}"));
        }
        self.result.unanswered += self
            .slots
            .iter()
            .map(|s| s.pending.len() as u64)
            .sum::<u64>();
        let conns = self.slots.into_iter().map(|s| s.conn).collect();
        (self.result, conns)
    }

    fn setup_and_loop(&mut self) -> std::io::Result<()> {
        let mut poll = Poll::new()?;
        for (i, s) in self.slots.iter().enumerate() {
            set_nonblocking(&s.conn.rx)?;
            set_nonblocking(&s.conn.tx)?;
            poll.registry().register(
                &mut SourceFd(&s.conn.rx.as_raw_fd()),
                Token(2 * i),
                Interest::READABLE,
            )?;
        }
        self.registry = Some(poll.registry().try_clone()?);
        let now = Instant::now();
        for i in 0..self.slots.len() {
            for _ in 0..self.depth {
                self.send(i, now);
            }
            self.flush(i);
        }
        let mut events = Events::with_capacity(256);
        loop {
            let now = Instant::now();
            let sending = now < self.window.end;
            let waiting = self
                .slots
                .iter()
                .any(|s| !s.pending.is_empty() && !s.closed);
            if !sending && !waiting {
                return Ok(());
            }
            if now > self.window.end + DRAIN_LIMIT {
                return Ok(());
            }
            let timeout = if sending {
                (self.window.end - now).min(Duration::from_millis(100))
            } else {
                Duration::from_millis(100)
            };
            match poll.poll(&mut events, Some(timeout)) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            for event in events.iter() {
                let i = event.token().0 / 2;
                if event.token().0 % 2 == 1 {
                    self.flush(i);
                } else {
                    self.read(i);
                }
            }
        }
    }

    /// Queue one more call on slot `i` (not written until `flush`).
    fn send(&mut self, i: usize, now: Instant) {
        let s = &mut self.slots[i];
        let seq = s.next_seq;
        s.next_seq += 1;
        wire::call_text(s.index, seq, &mut self.text);
        wire::request_json(seq, s.conn.tool, &self.text, &mut self.json);
        if let Err(e) = s.conn.wire.encode(seq, &self.json, &mut s.out) {
            self.result.fail(e);
            return;
        }
        s.pending.push((seq, now));
    }

    /// Write what slot `i` has queued. The write side is registered with the poll only
    /// while output waits: registered for good, every read the server makes would wake this
    /// thread for nothing (the kernel signals write space on each consumed message), and
    /// the server would pay for that wake-up inside its reads.
    fn flush(&mut self, i: usize) {
        let s = &mut self.slots[i];
        while s.out_pos < s.out.len() {
            match s.conn.tx.write(&s.out[s.out_pos..]) {
                Ok(0) => {
                    s.closed = true;
                    break;
                }
                Ok(n) => s.out_pos += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    s.closed = true;
                    let why = format!("write on connection {}: {e}", s.index);
                    self.result.fail(why);
                    return;
                }
            }
        }
        let pending = s.out_pos < s.out.len() && !s.closed;
        if !pending {
            s.out.clear();
            s.out_pos = 0;
        }
        if pending != s.tx_registered
            && let Some(registry) = &self.registry
        {
            let fd = s.conn.tx.as_raw_fd();
            let changed = if pending {
                registry.register(&mut SourceFd(&fd), Token(2 * i + 1), Interest::WRITABLE)
            } else {
                registry.deregister(&mut SourceFd(&fd))
            };
            match changed {
                Ok(()) => s.tx_registered = pending,
                Err(e) => {
                    s.closed = true;
                    let why = format!("poll registration of connection {}: {e}", s.index);
                    self.result.fail(why);
                }
            }
        }
    }

    fn read(&mut self, i: usize) {
        loop {
            let s = &mut self.slots[i];
            if s.in_len == s.inbuf.len() {
                let grown = s.inbuf.len() * 2;
                s.inbuf.resize(grown, 0);
            }
            match s.conn.rx.read(&mut s.inbuf[s.in_len..]) {
                Ok(0) => {
                    s.closed = true;
                    if !s.pending.is_empty() {
                        let why = format!(
                            "connection {} closed with {} calls waiting",
                            s.index,
                            s.pending.len()
                        );
                        self.result.fail(why);
                    }
                    return;
                }
                Ok(n) => {
                    s.in_len += n;
                    let now = Instant::now();
                    self.take_replies(i, now);
                    self.flush(i);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    self.slots[i].closed = true;
                    let why = format!("read on connection {}: {e}", self.slots[i].index);
                    self.result.fail(why);
                    return;
                }
            }
        }
    }

    /// Match every whole reply in slot `i`'s buffer to its call, record it, and send the
    /// next call while the window is open.
    fn take_replies(&mut self, i: usize, now: Instant) {
        let mut pos = 0;
        loop {
            let s = &mut self.slots[i];
            let decoded = s.conn.wire.decode(&s.inbuf[pos..s.in_len]);
            let reply = match decoded {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(e) => {
                    s.closed = true;
                    let why = format!("connection {}: {e}", s.index);
                    self.result.fail(why);
                    return;
                }
            };
            let at = match reply.key {
                ReplyKey::Seq(seq) => s.pending.iter().position(|p| p.0 == seq),
                ReplyKey::Oldest => (!s.pending.is_empty()).then_some(0),
            };
            let Some(at) = at else {
                let why = format!(
                    "connection {}: a reply to no waiting call: {}",
                    s.index,
                    String::from_utf8_lossy(&reply.payload[..reply.payload.len().min(300)])
                );
                pos += reply.consumed;
                self.result.fail(why);
                continue;
            };
            let (seq, sent) = s.pending.remove(at);
            wire::call_text(s.index, seq, &mut self.text);
            if wire::echoes(reply.payload, &self.text) {
                self.result.answered += 1;
                if sent >= self.window.start && sent < self.window.end {
                    self.result
                        .latencies_ns
                        .push(now.duration_since(sent).as_nanos() as u64);
                }
                if now >= self.window.start && now <= self.window.end {
                    self.result.window_replies += 1;
                }
            } else {
                let why = format!(
                    "connection {}: not the echo of call {seq}: {}",
                    s.index,
                    String::from_utf8_lossy(&reply.payload[..reply.payload.len().min(300)])
                );
                self.result.fail(why);
            }
            pos += reply.consumed;
            if now < self.window.end {
                self.send(i, now);
            }
        }
        let s = &mut self.slots[i];
        if pos > 0 {
            s.inbuf.copy_within(pos..s.in_len, 0);
            s.in_len -= pos;
        }
    }
}
