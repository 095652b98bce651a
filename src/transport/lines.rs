//! Newline-delimited JSON-RPC (MCP's stdio transport), sans-IO: one message per line,
//! bounded like a frame. An overlong line is skipped to its end and answered with an
//! error; the stream goes on.

use toolwall_relay::frame::MAX_TOTAL;

use crate::mcp::jsonrpc;

/// Longest line accepted (the same bound as a frame's payload).
pub const MAX_LINE: usize = MAX_TOTAL;

/// Whether `message` can be written as one line: a message with a raw line break would
/// reach the agent as two (a forged second message). The core serializes every answer
/// itself, so this never fails in practice; the line writer checks it anyway.
pub fn is_one_line(message: &[u8]) -> bool {
    !message.iter().any(|&b| b == b'\n' || b == b'\r')
}

#[derive(Debug, PartialEq, Eq)]
pub enum Line<'a> {
    Message(&'a [u8]),
    /// An error to send back (the line was too long).
    Refuse(Vec<u8>),
}

#[derive(Debug, Default)]
pub struct LineInbound {
    buf: Vec<u8>,
    start: usize,
    /// Discarding the rest of an overlong line.
    skipping: bool,
}

impl LineInbound {
    pub fn new() -> Self {
        Self::default()
    }

    /// Append bytes read from the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.start > MAX_LINE {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes buffered and not yet returned.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    pub fn next_line(&mut self) -> Option<Line<'_>> {
        loop {
            let rest = &self.buf[self.start..];
            match rest.iter().position(|&b| b == b'\n') {
                Some(nl) => {
                    let line_start = self.start;
                    self.start += nl + 1;
                    if self.skipping {
                        self.skipping = false;
                        continue;
                    }
                    let mut line = &self.buf[line_start..line_start + nl];
                    if line.last() == Some(&b'\r') {
                        line = &line[..line.len() - 1];
                    }
                    if line.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    if line.len() > MAX_LINE {
                        return Some(Line::Refuse(too_long()));
                    }
                    return Some(Line::Message(line));
                }
                None if rest.len() > MAX_LINE => {
                    // Drop what we have; keep dropping until the newline.
                    self.start = self.buf.len();
                    let first = !self.skipping;
                    self.skipping = true;
                    if first {
                        return Some(Line::Refuse(too_long()));
                    }
                    return None;
                }
                None if self.skipping => {
                    self.start = self.buf.len();
                    return None;
                }
                None => return None,
            }
        }
    }
}

fn too_long() -> Vec<u8> {
    let message = format!("message exceeds the limit of {MAX_LINE} bytes");
    jsonrpc::error_response(None, jsonrpc::INVALID_REQUEST, &message, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_overlong() {
        let mut l = LineInbound::new();
        l.push(b"{\"a\":1}\r\n\n  \n{\"b\"");
        assert_eq!(l.next_line(), Some(Line::Message(b"{\"a\":1}")));
        assert_eq!(l.next_line(), None);
        l.push(b":2}\n");
        assert_eq!(l.next_line(), Some(Line::Message(b"{\"b\":2}")));
        let big = vec![b'x'; MAX_LINE + 10];
        l.push(&big);
        assert!(matches!(l.next_line(), Some(Line::Refuse(_))));
        l.push(&big);
        assert_eq!(l.next_line(), None);
        assert!(l.buffered() == 0);
        l.push(b"tail\n{\"c\":3}\n");
        assert_eq!(l.next_line(), Some(Line::Message(b"{\"c\":3}")));
    }
}
