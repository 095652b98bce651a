//! Bounded line reading from stdin: a line over the limit is skipped without being kept.

use std::io::{self, BufRead};

use super::id_probe::IdProbe;

/// Line buffer capacity kept between lines; a larger one (left by a big line) is released.
const KEPT_CAPACITY: usize = 64 * 1024;

/// One item read from stdin.
#[derive(Debug, PartialEq, Eq)]
pub enum Line<'a> {
    /// A line within the limit, without its newline.
    Complete(&'a [u8]),
    /// A line over the limit, read to its end and discarded.
    Oversized {
        /// The line's length without its newline.
        bytes: u64,
        /// Its top-level JSON-RPC id, when one could be found.
        id: Option<String>,
    },
    Eof,
}

pub struct LineReader<R> {
    input: R,
    line: Vec<u8>,
    limit: usize,
}

impl<R: BufRead> LineReader<R> {
    /// `limit`: the longest line passed on, newline excluded.
    pub fn new(input: R, limit: usize) -> Self {
        Self {
            input,
            line: Vec::new(),
            limit,
        }
    }

    pub fn next_line(&mut self) -> io::Result<Line<'_>> {
        self.line.clear();
        if self.line.capacity() > KEPT_CAPACITY {
            self.line.shrink_to(KEPT_CAPACITY);
        }
        loop {
            let available = match self.input.fill_buf() {
                Ok(available) => available,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if available.is_empty() {
                // A last line without a newline still counts.
                return Ok(if self.line.is_empty() {
                    Line::Eof
                } else {
                    Line::Complete(&self.line)
                });
            }
            let newline = available.iter().position(|&b| b == b'\n');
            let take = newline.unwrap_or(available.len());
            if self.line.len() + take > self.limit {
                return self.discard_rest();
            }
            self.line.extend_from_slice(&available[..take]);
            match newline {
                Some(at) => {
                    self.input.consume(at + 1);
                    return Ok(Line::Complete(&self.line));
                }
                None => self.input.consume(take),
            }
        }
    }

    /// Skip to the end of an oversized line, looking for its id on the way.
    fn discard_rest(&mut self) -> io::Result<Line<'_>> {
        let mut probe = IdProbe::new();
        probe.feed(&self.line);
        let mut bytes = self.line.len() as u64;
        self.line.clear();
        loop {
            let available = match self.input.fill_buf() {
                Ok(available) => available,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if available.is_empty() {
                break;
            }
            let newline = available.iter().position(|&b| b == b'\n');
            let take = newline.unwrap_or(available.len());
            probe.feed(&available[..take]);
            bytes = bytes.saturating_add(take as u64);
            self.input.consume(newline.map_or(take, |at| at + 1));
            if newline.is_some() {
                break;
            }
        }
        Ok(Line::Oversized {
            bytes,
            id: probe.finish(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufReader;

    fn read_all(input: &[u8], limit: usize, chunk: usize) -> Vec<String> {
        let mut reader = LineReader::new(BufReader::with_capacity(chunk, input), limit);
        let mut out = Vec::new();
        loop {
            match reader.next_line().unwrap() {
                Line::Eof => return out,
                Line::Complete(l) => out.push(String::from_utf8_lossy(l).into_owned()),
                Line::Oversized { bytes, id } => out.push(format!("oversized {bytes} {id:?}")),
            }
        }
    }

    #[test]
    fn lines_at_any_chunk_size() {
        let long = r#"{"id":4,"x":"0123456789"}"#;
        let input = format!("abc\n\n12345\n{long}\nlast");
        let oversized = format!("oversized {} Some(\"4\")", long.len());
        for chunk in 1..8 {
            assert_eq!(
                read_all(input.as_bytes(), 5, chunk),
                ["abc", "", "12345", &oversized, "last"],
                "chunk {chunk}"
            );
        }
    }

    #[test]
    fn oversized_at_eof_without_newline() {
        assert_eq!(read_all(b"123456", 5, 2), ["oversized 6 None"]);
    }
}
