//! A command's output kept within a cap: the head and the tail of the stream, the middle
//! dropped and counted. Builds print their errors last, so the tail matters as much as
//! the head.

use std::collections::VecDeque;

#[derive(Debug, Clone)]
pub struct CappedOutput {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    head_cap: usize,
    tail_cap: usize,
    /// Every byte the stream produced.
    total: u64,
}

impl CappedOutput {
    /// Keeps at most `cap` bytes: half from the start, half from the end.
    pub fn new(cap: usize) -> CappedOutput {
        let head_cap = cap / 2;
        CappedOutput {
            head: Vec::new(),
            tail: VecDeque::new(),
            head_cap,
            tail_cap: cap - head_cap,
            total: 0,
        }
    }

    pub fn push(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len() as u64;
        let room = self.head_cap - self.head.len();
        if room > 0 {
            let take = room.min(bytes.len());
            self.head.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
        }
        if bytes.is_empty() || self.tail_cap == 0 {
            return;
        }
        if bytes.len() >= self.tail_cap {
            self.tail.clear();
            self.tail
                .extend(bytes[bytes.len() - self.tail_cap..].iter().copied());
            return;
        }
        let overflow = (self.tail.len() + bytes.len()).saturating_sub(self.tail_cap);
        self.tail.drain(..overflow);
        self.tail.extend(bytes.iter().copied());
    }

    /// Bytes the stream produced in all.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Bytes dropped from the middle.
    pub fn omitted(&self) -> u64 {
        self.total - (self.head.len() + self.tail.len()) as u64
    }

    pub fn truncated(&self) -> bool {
        self.omitted() > 0
    }

    /// The kept text (invalid UTF-8 replaced), with a marker where bytes were dropped.
    pub fn render(&self) -> String {
        let mut bytes = self.head.clone();
        if self.truncated() {
            bytes.extend_from_slice(
                format!(
                    "\n[... {} bytes omitted (output_cap_bytes) ...]\n",
                    self.omitted()
                )
                .as_bytes(),
            );
        }
        bytes.extend(self.tail.iter().copied());
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The last `n` bytes kept, for a preview of a running command.
    pub fn last(&self, n: usize) -> String {
        let kept = self.head.len() + self.tail.len();
        let skip = kept.saturating_sub(n);
        let bytes: Vec<u8> = self
            .head
            .iter()
            .chain(self.tail.iter())
            .skip(skip)
            .copied()
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_output_is_kept_whole() {
        let mut out = CappedOutput::new(16);
        out.push(b"hello ");
        out.push(b"world");
        assert_eq!(out.render(), "hello world");
        assert!(!out.truncated());
        assert_eq!(out.total(), 11);
    }

    #[test]
    fn large_output_keeps_head_and_tail_within_the_cap() {
        let mut out = CappedOutput::new(10);
        for chunk in [&b"0123"[..], b"456789abcdef", b"ghij", b"k"] {
            out.push(chunk);
        }
        // 21 bytes: head 5, tail 5, 11 omitted.
        assert_eq!(out.total(), 21);
        assert_eq!(out.omitted(), 11);
        let text = out.render();
        assert!(text.starts_with("01234\n[... 11 bytes omitted"), "{text}");
        assert!(text.ends_with("ghijk"), "{text}");
        assert_eq!(out.last(3), "ijk");
        // Byte by byte gives the same result as big chunks.
        let mut one = CappedOutput::new(10);
        for b in b"0123456789abcdefghijk" {
            one.push(&[*b]);
        }
        assert_eq!(one.render(), text);
    }

    #[test]
    fn a_zero_cap_keeps_nothing_but_counts() {
        let mut out = CappedOutput::new(0);
        out.push(b"abc");
        assert_eq!(out.total(), 3);
        assert!(out.truncated());
        assert_eq!(out.last(10), "");
    }
}
