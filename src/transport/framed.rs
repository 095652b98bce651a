//! One framed agent connection's inbound side, sans-IO: bytes in, messages out, with the
//! stream-id rules of the frame contract. The loop reads into [`FramedInbound::spare`]
//! and drains [`FramedInbound::next`].

use toolwall_relay::frame::{self, Decoded, Decoder, FLAG_NOTIFICATION, MAX_TOTAL, PREFIX_LEN};

use crate::gateway::core::Expect;
use crate::mcp::jsonrpc;

/// Bytes asked of the socket per read: starts small (most connections carry small
/// messages, and every idle connection keeps its buffer) and doubles while reads fill it.
const MIN_READ_CHUNK: usize = 4 * 1024;
const READ_CHUNK: usize = 64 * 1024;

/// What the next bytes hold.
#[derive(Debug, PartialEq, Eq)]
pub enum Inbound<'a> {
    /// A payload for the core; `process` is the frame's name, else the meta line's (may
    /// be empty).
    Message {
        stream: u32,
        expect: Expect,
        process: &'a str,
        payload: &'a [u8],
    },
    /// A faulty frame whose stream id is readable: send `bytes` (a -32600) on `stream`.
    Refuse { stream: u32, bytes: Vec<u8> },
    /// The stream cannot go on; close the connection and say why.
    Close(String),
}

#[derive(Debug, Default)]
pub struct FramedInbound {
    decoder: Decoder,
    /// Zeroed once as it grows; `start..end` holds unread bytes.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// The next read's size, between MIN_READ_CHUNK and READ_CHUNK.
    chunk: usize,
    last_stream: u32,
    closed: bool,
    /// The client's name from the meta line, sanitised.
    pub meta_name: Option<String>,
}

/// Control characters and spaces become `_`; at most 128 bytes, cut on a char boundary.
pub fn sanitize_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len().min(frame::MAX_NAME));
    for c in name.chars() {
        let c = if c.is_control() || c.is_whitespace() {
            '_'
        } else {
            c
        };
        if out.len() + c.len_utf8() > frame::MAX_NAME {
            break;
        }
        out.push(c);
    }
    out
}

impl FramedInbound {
    pub fn new() -> Self {
        Self::default()
    }

    /// Room for the next read. The buffer never holds more than one maximal frame plus
    /// one read chunk, and gives memory back once a large frame is consumed.
    pub fn spare(&mut self) -> &mut [u8] {
        self.spare_within(usize::MAX)
    }

    /// Room for the next read, the buffer holding at most `cap` bytes (what the
    /// connection may hold: its small allowance, or a grant for the frame arriving). Empty
    /// when the buffer is at `cap`. A buffer left with nothing unread keeps no more than
    /// the first read chunk: a large frame's memory goes back once it is consumed.
    pub fn spare_within(&mut self, cap: usize) -> &mut [u8] {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == 0 && self.buf.capacity() > MIN_READ_CHUNK {
            self.buf = Vec::new();
            self.chunk = MIN_READ_CHUNK;
        }
        self.chunk = self.chunk.clamp(MIN_READ_CHUNK, READ_CHUNK);
        let cap = cap.min(PREFIX_LEN + MAX_TOTAL + READ_CHUNK);
        let want = (self.end + self.chunk).min(cap);
        if self.buf.len() < want {
            // A frame larger than a read chunk: room for exactly what it needs (within
            // the cap), once, rather than doubling (twice the memory) chunk after chunk.
            if let Some(need) = self.needed().filter(|n| *n > READ_CHUNK) {
                let target = need.min(cap);
                if self.buf.capacity() < target {
                    self.buf.reserve_exact(target - self.buf.len());
                }
            }
            self.buf.resize(want, 0);
        }
        let end = self.end.min(want);
        &mut self.buf[end..want.max(end)]
    }

    /// Bytes the frame at the head of the buffer needs in all (its prefix included), once
    /// its length prefix has arrived; None before, and for a meta line or an unframeable
    /// length (which the decoder refuses).
    pub fn needed(&self) -> Option<usize> {
        let rest = &self.buf[self.start..self.end];
        let prefix: [u8; PREFIX_LEN] = rest.get(..PREFIX_LEN)?.try_into().ok()?;
        let total = u32::from_be_bytes(prefix) as usize;
        (total <= MAX_TOTAL).then_some(PREFIX_LEN + total)
    }

    /// Bytes the buffer holds (allocated), for its memory bound.
    pub fn held(&self) -> usize {
        self.buf.capacity()
    }

    /// After a read of `n` bytes into the last `spare()`.
    pub fn filled(&mut self, n: usize) {
        if n >= self.chunk {
            self.chunk = (self.chunk * 2).min(READ_CHUNK);
        }
        self.end = (self.end + n).min(self.buf.len());
    }

    /// Bytes of a frame that has started but not arrived whole.
    pub fn has_partial(&self) -> bool {
        self.start < self.end
    }

    /// Whether a read can make progress (false once the stream is unframeable).
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    pub fn next_inbound(&mut self) -> Option<Inbound<'_>> {
        if self.closed {
            return None;
        }
        loop {
            let rest = &self.buf[self.start..self.end];
            match self.decoder.decode(rest) {
                Ok(Decoded::NeedMore) => return None,
                Err(fatal) => {
                    self.closed = true;
                    return Some(Inbound::Close(fatal.to_string()));
                }
                Ok(Decoded::Meta { name, consumed }) => {
                    self.meta_name = Some(sanitize_name(name));
                    self.start += consumed;
                    continue;
                }
                Ok(Decoded::Invalid {
                    stream_id,
                    fault,
                    consumed,
                    ..
                }) => {
                    self.start += consumed;
                    if stream_id != 0 && stream_id <= self.last_stream {
                        self.closed = true;
                        return Some(Inbound::Close(format!(
                            "stream id {stream_id} reused or decreasing (last {})",
                            self.last_stream
                        )));
                    }
                    self.last_stream = self.last_stream.max(stream_id);
                    let message = fault.to_string();
                    return Some(Inbound::Refuse {
                        stream: stream_id,
                        bytes: jsonrpc::error_response(
                            None,
                            jsonrpc::INVALID_REQUEST,
                            &message,
                            None,
                        ),
                    });
                }
                Ok(Decoded::Frame {
                    header, consumed, ..
                }) => {
                    let at = self.start;
                    self.start += consumed;
                    let stream = header.stream_id;
                    let notification = header.flags & FLAG_NOTIFICATION != 0;
                    let refuse = |message: &str| {
                        Some(Inbound::Refuse {
                            stream,
                            bytes: jsonrpc::error_response(
                                None,
                                jsonrpc::INVALID_REQUEST,
                                message,
                                None,
                            ),
                        })
                    };
                    if notification {
                        if stream != 0 {
                            return refuse("a notification frame must use stream id 0");
                        }
                    } else if stream == 0 {
                        return refuse("a request frame must use a non-zero stream id");
                    } else if stream <= self.last_stream {
                        self.closed = true;
                        return Some(Inbound::Close(format!(
                            "stream id {stream} reused or decreasing (last {})",
                            self.last_stream
                        )));
                    } else {
                        self.last_stream = stream;
                    }
                    let name_at = at + PREFIX_LEN + frame::HEADER_LEN;
                    let payload_at = name_at + header.name_len as usize;
                    let end = at + consumed;
                    // The decoder checked the name is UTF-8. A frame without a name is
                    // the meta line's client.
                    let process = match std::str::from_utf8(&self.buf[name_at..payload_at]) {
                        Ok(name) if !name.is_empty() => name,
                        _ => self.meta_name.as_deref().unwrap_or(""),
                    };
                    return Some(Inbound::Message {
                        stream,
                        expect: if notification {
                            Expect::Notification
                        } else {
                            Expect::Request
                        },
                        process,
                        payload: &self.buf[payload_at..end],
                    });
                }
            }
        }
    }
}

/// Frame an answer (flags 0) or a notification (stream 0, flag 0x0001) for the agent.
pub fn encode_reply(out: &mut Vec<u8>, stream: u32, notification: bool, payload: &[u8]) {
    let flags = if notification { FLAG_NOTIFICATION } else { 0 };
    if frame::encode(out, stream, flags, "", payload).is_err() {
        // An answer larger than a frame can carry: the agent gets an error in its place.
        let msg = jsonrpc::error_response(
            None,
            jsonrpc::INTERNAL_ERROR,
            "the answer exceeds the frame limit of 1 MiB + 4 KiB",
            None,
        );
        let _ = frame::encode(out, stream, flags, "", &msg);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(inb: &mut FramedInbound, bytes: &[u8]) {
        let mut rest = bytes;
        while !rest.is_empty() {
            let spare = inb.spare();
            let n = spare.len().min(rest.len());
            spare[..n].copy_from_slice(&rest[..n]);
            inb.filled(n);
            rest = &rest[n..];
        }
    }

    fn frame(sid: u32, flags: u16, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        frame::encode(&mut out, sid, flags, "p", payload).unwrap();
        out
    }

    #[test]
    fn stream_rules() {
        let mut inb = FramedInbound::new();
        let mut bytes = frame::meta_line_for("cli ent\x07");
        bytes.extend(frame(1, 0, b"{}"));
        bytes.extend(frame(0, FLAG_NOTIFICATION, b"{}"));
        bytes.extend(frame(5, FLAG_NOTIFICATION, b"{}"));
        bytes.extend(frame(0, 0, b"{}"));
        bytes.extend(frame(3, 0, b"{}"));
        bytes.extend(frame(3, 0, b"{}"));
        feed(&mut inb, &bytes);
        assert!(matches!(
            inb.next_inbound(),
            Some(Inbound::Message {
                stream: 1,
                expect: Expect::Request,
                process: "p",
                ..
            })
        ));
        assert_eq!(inb.meta_name.as_deref(), Some("cli_ent_"));
        assert!(matches!(
            inb.next_inbound(),
            Some(Inbound::Message {
                stream: 0,
                expect: Expect::Notification,
                ..
            })
        ));
        assert!(matches!(
            inb.next_inbound(),
            Some(Inbound::Refuse { stream: 5, .. })
        ));
        assert!(matches!(
            inb.next_inbound(),
            Some(Inbound::Refuse { stream: 0, .. })
        ));
        assert!(matches!(
            inb.next_inbound(),
            Some(Inbound::Message { stream: 3, .. })
        ));
        assert!(matches!(inb.next_inbound(), Some(Inbound::Close(_))));
        assert!(inb.next_inbound().is_none());
    }

    #[test]
    fn partial_and_bounded() {
        let mut inb = FramedInbound::new();
        let f = frame(1, 0, &vec![b' '; 600_000]);
        feed(&mut inb, &f[..100_000]);
        assert!(inb.next_inbound().is_none());
        assert!(inb.has_partial());
        feed(&mut inb, &f[100_000..]);
        assert!(matches!(inb.next_inbound(), Some(Inbound::Message { .. })));
        // Consumed: the next spare() compacts and gives the large buffer back.
        let _ = inb.spare();
        assert_eq!(inb.end, 0);
        assert!(inb.buf.capacity() <= MIN_READ_CHUNK);
    }

    #[test]
    fn a_cap_bounds_the_buffer_and_a_grant_is_taken_at_once() {
        let mut inb = FramedInbound::new();
        let f = frame(1, 0, &vec![b' '; 300_000]);
        // Only the small allowance: the frame stops at the cap.
        let mut fed = 0;
        loop {
            let spare = inb.spare_within(16 * 1024);
            if spare.is_empty() {
                break;
            }
            let n = spare.len().min(f.len() - fed);
            spare[..n].copy_from_slice(&f[fed..fed + n]);
            inb.filled(n);
            fed += n;
        }
        assert_eq!(fed, 16 * 1024);
        assert_eq!(inb.needed(), Some(f.len()));
        assert!(inb.next_inbound().is_none());
        // A grant for the whole frame: one allocation of that size.
        while fed < f.len() {
            let spare = inb.spare_within(f.len());
            assert!(!spare.is_empty());
            let n = spare.len().min(f.len() - fed);
            spare[..n].copy_from_slice(&f[fed..fed + n]);
            inb.filled(n);
            fed += n;
        }
        assert!(inb.held() <= f.len() + MIN_READ_CHUNK, "{}", inb.held());
        assert!(
            inb.spare_within(f.len()).is_empty(),
            "nothing read past the frame"
        );
        assert!(matches!(inb.next_inbound(), Some(Inbound::Message { .. })));
        let _ = inb.spare_within(16 * 1024);
        assert!(inb.held() <= MIN_READ_CHUNK);
    }

    #[test]
    fn sanitize() {
        assert_eq!(sanitize_name("a b\tc"), "a_b_c");
        let long = "é".repeat(100);
        assert!(sanitize_name(&long).len() <= 128);
    }
}
