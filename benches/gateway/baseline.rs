//! The baselines' servers, each run as its own process (the bench binary re-executed with a
//! role argument), so each is measured through /proc like the gateway and its worker, and
//! the client threads compete with them for the CPUs exactly as with toolwall.
//!
//! - `echo`: one thread, one mio loop, a framed unix listener. Per frame: decode it with
//!   the same codec toolwall uses, parse the JSON-RPC request just enough to find the id and
//!   `arguments.text` (borrowed, like the gateway's envelope parse), write the echo result
//!   frame. One hop: no policy, no ledger, no worker.
//! - `forward`: one thread, one mio loop, the shape of toolwall without its work: agent
//!   connections in front, ONE connection to an echo server behind (as the gateway has one
//!   channel to its worker). Frames go through with their stream id renumbered, JSON
//!   untouched; replies are mapped back. Writes are gathered and flushed once per loop turn.

use mio::net::{UnixListener, UnixStream};
use mio::{Events, Interest, Poll, Token};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::path::Path;
use toolwall_relay::frame::{self, Decoded, Decoder};

pub const ECHO_ROLE: &str = "__bench-echo-server";
pub const FORWARD_ROLE: &str = "__bench-forwarder";

const LISTENER: Token = Token(0);
const BACKEND: Token = Token(1);
const CONN_BASE: usize = 2;
const READ_CHUNK: usize = 64 * 1024;

/// Run a baseline role when the arguments name one; `None` otherwise.
pub fn child_main(args: &[String]) -> Option<i32> {
    let role = args.get(1)?;
    let result = if role == ECHO_ROLE {
        args.get(2).map(|listen| echo_server(Path::new(listen)))
    } else if role == FORWARD_ROLE {
        match (args.get(2), args.get(3)) {
            (Some(listen), Some(backend)) => Some(forwarder(Path::new(listen), Path::new(backend))),
            _ => None,
        }
    } else {
        return None;
    };
    Some(match result {
        Some(Ok(())) => 0,
        Some(Err(e)) => {
            eprintln!("{role}: {e}");
            1
        }
        None => {
            eprintln!("{role}: missing socket paths");
            2
        }
    })
}

/// One connection's buffers.
struct Conn {
    stream: UnixStream,
    decoder: Decoder,
    inbuf: Vec<u8>,
    in_len: usize,
    out: Vec<u8>,
    out_pos: usize,
    closed: bool,
}

impl Conn {
    fn new(stream: UnixStream) -> Conn {
        Conn {
            stream,
            decoder: Decoder::new(),
            inbuf: vec![0; READ_CHUNK],
            in_len: 0,
            out: Vec::new(),
            out_pos: 0,
            closed: false,
        }
    }

    /// Read what is there (edge-triggered: until it would block).
    fn fill(&mut self) {
        loop {
            if self.in_len == self.inbuf.len() {
                if self.inbuf.len() >= 2 * frame::MAX_TOTAL {
                    return;
                }
                let grown = self.inbuf.len() * 2;
                self.inbuf.resize(grown, 0);
            }
            match self.stream.read(&mut self.inbuf[self.in_len..]) {
                Ok(0) => {
                    self.closed = true;
                    return;
                }
                Ok(n) => self.in_len += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    self.closed = true;
                    return;
                }
            }
        }
    }

    /// Hand each whole frame to `on_frame(stream_id, name, payload, raw_frame)`; keep the rest.
    fn frames(&mut self, mut on_frame: impl FnMut(u32, &[u8], &[u8])) {
        let mut pos = 0;
        loop {
            match self.decoder.decode(&self.inbuf[pos..self.in_len]) {
                Ok(Decoded::NeedMore) => break,
                Ok(Decoded::Meta { consumed, .. }) | Ok(Decoded::Invalid { consumed, .. }) => {
                    pos += consumed
                }
                Ok(Decoded::Frame {
                    header,
                    payload,
                    consumed,
                    ..
                }) => {
                    on_frame(header.stream_id, payload, &self.inbuf[pos..pos + consumed]);
                    pos += consumed;
                }
                Err(_) => {
                    self.closed = true;
                    break;
                }
            }
        }
        self.inbuf.copy_within(pos..self.in_len, 0);
        self.in_len -= pos;
    }

    fn flush(&mut self) {
        while self.out_pos < self.out.len() {
            match self.stream.write(&self.out[self.out_pos..]) {
                Ok(0) => {
                    self.closed = true;
                    return;
                }
                Ok(n) => self.out_pos += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    self.closed = true;
                    return;
                }
            }
        }
        self.out.clear();
        self.out_pos = 0;
    }
}

#[derive(Deserialize)]
struct EchoRequest<'a> {
    #[serde(borrow)]
    id: &'a RawValue,
    #[serde(borrow)]
    params: EchoParams<'a>,
}

#[derive(Deserialize)]
struct EchoParams<'a> {
    #[serde(borrow)]
    arguments: EchoArgs<'a>,
}

#[derive(Deserialize)]
struct EchoArgs<'a> {
    #[serde(borrow)]
    text: Cow<'a, str>,
}

/// The echo's JSON-RPC reply to one request payload.
pub fn echo_reply(payload: &[u8], out: &mut Vec<u8>) {
    out.clear();
    match serde_json::from_slice::<EchoRequest>(payload) {
        Ok(req) => {
            out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
            out.extend_from_slice(req.id.get().as_bytes());
            out.extend_from_slice(b",\"result\":{\"content\":[{\"type\":\"text\",\"text\":");
            // A string always serializes.
            let _ = serde_json::to_writer(&mut *out, &req.params.arguments.text);
            out.extend_from_slice(b"}]}}");
        }
        Err(_) => out.extend_from_slice(
            b"{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32600,\"message\":\"bad request\"}}",
        ),
    }
}

fn bind(path: &Path) -> std::io::Result<UnixListener> {
    let _ = std::fs::remove_file(path);
    UnixListener::bind(path)
}

/// Tell the parent we listen: one line on stdout.
fn announce() {
    let mut out = std::io::stdout();
    let _ = out.write_all(b"ready\n");
    let _ = out.flush();
}

/// Accept every waiting connection; returns the slots they took.
fn accept_all(
    listener: &UnixListener,
    poll: &Poll,
    conns: &mut Vec<Option<Conn>>,
) -> std::io::Result<Vec<usize>> {
    let mut accepted = Vec::new();
    loop {
        match listener.accept() {
            Ok((mut stream, _)) => {
                let slot = conns.iter().position(Option::is_none).unwrap_or_else(|| {
                    conns.push(None);
                    conns.len() - 1
                });
                poll.registry().register(
                    &mut stream,
                    Token(CONN_BASE + slot),
                    Interest::READABLE | Interest::WRITABLE,
                )?;
                conns[slot] = Some(Conn::new(stream));
                accepted.push(slot);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(accepted),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

fn drop_closed(poll: &Poll, conns: &mut [Option<Conn>], slot: usize) {
    if conns[slot].as_ref().is_some_and(|c| c.closed)
        && let Some(mut c) = conns[slot].take()
    {
        let _ = poll.registry().deregister(&mut c.stream);
    }
}

fn echo_server(listen: &Path) -> std::io::Result<()> {
    let mut listener = bind(listen)?;
    let mut poll = Poll::new()?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)?;
    let mut conns: Vec<Option<Conn>> = Vec::new();
    let mut events = Events::with_capacity(1024);
    let mut reply = Vec::new();
    announce();
    loop {
        match poll.poll(&mut events, None) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        for event in events.iter() {
            if event.token() == LISTENER {
                accept_all(&listener, &poll, &mut conns)?;
                continue;
            }
            let slot = event.token().0 - CONN_BASE;
            let Some(Some(c)) = conns.get_mut(slot) else {
                continue;
            };
            if event.is_readable() || event.is_read_closed() {
                c.fill();
                let mut out = std::mem::take(&mut c.out);
                c.frames(|stream, payload, _| {
                    echo_reply(payload, &mut reply);
                    // Replies are small; a failure here would mean a bug in the harness.
                    let _ = frame::encode(&mut out, stream, 0, "", &reply);
                });
                c.out = out;
            }
            c.flush();
            drop_closed(&poll, &mut conns, slot);
        }
    }
}

/// Where a forwarded request came from.
struct Origin {
    slot: usize,
    generation: u64,
    stream: u32,
}

/// Byte offset of the stream id in an encoded frame: u32 length, u16 magic, u8, u8.
const STREAM_ID_AT: usize = 8;

fn forwarder(listen: &Path, backend_path: &Path) -> std::io::Result<()> {
    let mut backend = Conn::new(UnixStream::connect(backend_path)?);
    let mut listener = bind(listen)?;
    let mut poll = Poll::new()?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)?;
    poll.registry().register(
        &mut backend.stream,
        BACKEND,
        Interest::READABLE | Interest::WRITABLE,
    )?;
    let mut conns: Vec<Option<Conn>> = Vec::new();
    let mut generations: Vec<u64> = Vec::new();
    let mut next_generation = 0u64;
    let mut waiting: HashMap<u32, Origin> = HashMap::new();
    let mut next_id = 1u32;
    let mut dirty: Vec<usize> = Vec::new();
    let mut events = Events::with_capacity(1024);
    announce();
    loop {
        match poll.poll(&mut events, None) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        for event in events.iter() {
            match event.token() {
                LISTENER => {
                    for slot in accept_all(&listener, &poll, &mut conns)? {
                        generations.resize(conns.len(), 0);
                        next_generation += 1;
                        generations[slot] = next_generation;
                    }
                }
                BACKEND => {
                    if event.is_readable() {
                        backend.fill();
                        backend.frames(|id, _, raw| {
                            let Some(origin) = waiting.remove(&id) else {
                                return;
                            };
                            let Some(Some(c)) = conns.get_mut(origin.slot) else {
                                return;
                            };
                            if generations[origin.slot] != origin.generation {
                                return;
                            }
                            let at = c.out.len();
                            c.out.extend_from_slice(raw);
                            c.out[at + STREAM_ID_AT..at + STREAM_ID_AT + 4]
                                .copy_from_slice(&origin.stream.to_be_bytes());
                            dirty.push(origin.slot);
                        });
                        if backend.closed {
                            return Err(std::io::Error::other("the echo server went away"));
                        }
                    }
                }
                Token(t) => {
                    let slot = t - CONN_BASE;
                    let Some(Some(c)) = conns.get_mut(slot) else {
                        continue;
                    };
                    if event.is_readable() || event.is_read_closed() {
                        c.fill();
                        let generation = generations[slot];
                        c.frames(|stream, _, raw| {
                            let id = next_id;
                            next_id = next_id.wrapping_add(1).max(1);
                            waiting.insert(
                                id,
                                Origin {
                                    slot,
                                    generation,
                                    stream,
                                },
                            );
                            let at = backend.out.len();
                            backend.out.extend_from_slice(raw);
                            backend.out[at + STREAM_ID_AT..at + STREAM_ID_AT + 4]
                                .copy_from_slice(&id.to_be_bytes());
                        });
                    }
                    if event.is_writable() {
                        c.flush();
                    }
                    if c.closed {
                        generations[slot] = 0;
                        drop_closed(&poll, &mut conns, slot);
                    }
                }
            }
        }
        // End of the turn: one write per connection that has something to send.
        backend.flush();
        dirty.sort_unstable();
        dirty.dedup();
        for slot in dirty.drain(..) {
            if let Some(Some(c)) = conns.get_mut(slot) {
                c.flush();
                if c.closed {
                    generations[slot] = 0;
                    drop_closed(&poll, &mut conns, slot);
                }
            }
        }
    }
}
