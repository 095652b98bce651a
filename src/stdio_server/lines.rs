//! Newline-delimited streams, sans-IO: bytes in, whole lines out, never more than a bound
//! held for one line.
//!
//! A server's stdout carries one JSON-RPC message per line; a line longer than the bound
//! is a fault of the server ([`Overflow::Fail`]). Its stderr is free text; a longer line
//! is cut and the rest of it dropped ([`Overflow::Cut`]), so a flood without line breaks
//! costs at most the bound.

/// What to do with a line longer than the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    /// Stop: the stream is broken (the caller reports it).
    Fail,
    /// Emit what fits, with `cut` set, and drop the rest of the line.
    Cut,
}

/// One piece of output.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece {
    /// A whole line without its line break (and without a final `\r`); `cut` when its end
    /// was dropped.
    Line { text: Vec<u8>, cut: bool },
    /// A line grew beyond the bound (only with [`Overflow::Fail`]): the stream is broken,
    /// and the splitter ignores everything after.
    TooLong,
}

#[derive(Debug)]
pub struct LineSplitter {
    buf: Vec<u8>,
    max: usize,
    overflow: Overflow,
    /// Dropping the rest of a line that was cut.
    skipping: bool,
    failed: bool,
}

impl LineSplitter {
    pub fn new(max: usize, overflow: Overflow) -> LineSplitter {
        LineSplitter {
            buf: Vec::new(),
            max: max.max(1),
            overflow,
            skipping: false,
            failed: false,
        }
    }

    /// Bytes held for the line in progress.
    pub fn held(&self) -> usize {
        self.buf.len()
    }

    /// Feed `data`; every whole line (or fault) goes to `out`.
    pub fn feed(&mut self, mut data: &[u8], out: &mut Vec<Piece>) {
        while !data.is_empty() && !self.failed {
            let newline = data.iter().position(|&b| b == b'\n');
            let (chunk, rest, ends) = match newline {
                Some(i) => (&data[..i], &data[i + 1..], true),
                None => (data, &data[data.len()..], false),
            };
            data = rest;
            if self.skipping {
                if ends {
                    self.skipping = false;
                }
                continue;
            }
            let room = self.max - self.buf.len();
            if chunk.len() > room {
                match self.overflow {
                    Overflow::Fail => {
                        self.failed = true;
                        self.buf = Vec::new();
                        out.push(Piece::TooLong);
                        return;
                    }
                    Overflow::Cut => {
                        self.buf.extend_from_slice(&chunk[..room]);
                        out.push(Piece::Line {
                            text: std::mem::take(&mut self.buf),
                            cut: true,
                        });
                        self.skipping = !ends;
                        continue;
                    }
                }
            }
            self.buf.extend_from_slice(chunk);
            if ends {
                let mut text = std::mem::take(&mut self.buf);
                if text.last() == Some(&b'\r') {
                    text.pop();
                }
                out.push(Piece::Line { text, cut: false });
            }
        }
    }

    /// End of the stream: a last line without a line break, if any.
    pub fn finish(&mut self, out: &mut Vec<Piece>) {
        if !self.failed && !self.skipping && !self.buf.is_empty() {
            out.push(Piece::Line {
                text: std::mem::take(&mut self.buf),
                cut: false,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(pieces: &[Piece]) -> Vec<(String, bool)> {
        pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Line { text, cut } => Some((String::from_utf8_lossy(text).into(), *cut)),
                Piece::TooLong => None,
            })
            .collect()
    }

    #[test]
    fn lines_across_reads_and_crlf() {
        let mut s = LineSplitter::new(100, Overflow::Fail);
        let mut out = Vec::new();
        s.feed(b"{\"a\":1}\r\n{\"b\"", &mut out);
        s.feed(b":2}\n\n", &mut out);
        s.feed(b"tail", &mut out);
        s.finish(&mut out);
        assert_eq!(
            lines(&out),
            vec![
                ("{\"a\":1}".into(), false),
                ("{\"b\":2}".into(), false),
                ("".into(), false),
                ("tail".into(), false)
            ]
        );
    }

    #[test]
    fn a_line_beyond_the_bound_fails_or_is_cut() {
        let mut s = LineSplitter::new(8, Overflow::Fail);
        let mut out = Vec::new();
        s.feed(b"12345", &mut out);
        s.feed(b"6789\nmore\n", &mut out);
        assert_eq!(out, vec![Piece::TooLong]);
        assert_eq!(s.held(), 0);
        s.feed(b"ignored\n", &mut out);
        assert_eq!(out.len(), 1);

        let mut s = LineSplitter::new(4, Overflow::Cut);
        let mut out = Vec::new();
        s.feed(b"abcdefgh", &mut out);
        s.feed(&[b'x'; 10_000], &mut out);
        assert!(s.held() <= 4);
        s.feed(b"yy\nok\n", &mut out);
        assert_eq!(
            lines(&out),
            vec![("abcd".into(), true), ("ok".into(), false)]
        );
    }
}
