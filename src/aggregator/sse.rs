//! A Server-Sent Events parser, sans-IO: bytes in, events out.
//!
//! Follows the WHATWG event-stream rules: lines end in CRLF, LF or CR; a line starting with
//! `:` is a comment; `field: value` (one optional space after the colon); `data` lines are
//! joined with `\n`; an empty line dispatches the event (an event with no data is not
//! dispatched, but its `id` still becomes the last event id); `retry` takes digits only;
//! unknown fields are ignored; a leading byte-order mark is dropped. Every buffer is
//! bounded: a line or an event larger than the limit is a fault, never an allocation.

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// `event:` (default `message`).
    pub event: String,
    /// The `data:` lines joined with `\n`.
    pub data: String,
    /// The last event id seen so far on the stream (`id:` persists across events).
    pub id: Option<String>,
}

/// The stream cannot be read further.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseFault {
    /// One line or one event's data exceeded the limit (bytes).
    TooLarge(usize),
    /// Not UTF-8.
    NotText,
}

impl std::fmt::Display for SseFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SseFault::TooLarge(n) => write!(f, "an event-stream event exceeds {n} bytes"),
            SseFault::NotText => f.write_str("the event stream is not UTF-8 text"),
        }
    }
}

#[derive(Debug)]
pub struct SseParser {
    max_event_bytes: usize,
    /// Bytes of the current, unfinished line.
    line: Vec<u8>,
    /// The previous chunk ended in CR: a following LF belongs to that line end.
    after_cr: bool,
    /// Nothing read yet (a BOM may come first).
    at_start: bool,
    data: String,
    has_data: bool,
    event: String,
    last_id: Option<String>,
    /// Server-suggested reconnection delay in milliseconds.
    pub retry_ms: Option<u64>,
    /// Comment lines seen (keep-alives).
    pub comments: u64,
    fault: Option<SseFault>,
}

impl SseParser {
    /// A parser whose lines and events may hold at most `max_event_bytes` bytes.
    pub fn new(max_event_bytes: usize) -> SseParser {
        SseParser {
            max_event_bytes,
            line: Vec::new(),
            after_cr: false,
            at_start: true,
            data: String::new(),
            has_data: false,
            event: String::new(),
            last_id: None,
            retry_ms: None,
            comments: 0,
            fault: None,
        }
    }

    /// The last event id seen (for `Last-Event-ID`).
    pub fn last_id(&self) -> Option<&str> {
        self.last_id.as_deref()
    }

    /// Feed bytes; complete events are appended to `out`. After a fault every call returns
    /// it again.
    pub fn push(&mut self, mut bytes: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseFault> {
        if let Some(f) = &self.fault {
            return Err(f.clone());
        }
        if self.at_start && !bytes.is_empty() {
            // A BOM may arrive split; wait for three bytes before deciding.
            let mut head = std::mem::take(&mut self.line);
            head.extend_from_slice(bytes);
            if head.len() < 3 && [0xEF, 0xBB, 0xBF].starts_with(&head) {
                self.line = head;
                return Ok(());
            }
            self.at_start = false;
            let start = if head.starts_with(&[0xEF, 0xBB, 0xBF]) {
                3
            } else {
                0
            };
            let rest = head[start..].to_vec();
            return self.push_bytes(&rest, out);
        }
        if bytes.is_empty() {
            return Ok(());
        }
        if self.after_cr && bytes[0] == b'\n' {
            bytes = &bytes[1..];
        }
        self.after_cr = false;
        self.push_bytes(bytes, out)
    }

    fn push_bytes(&mut self, bytes: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseFault> {
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i..].iter().position(|b| *b == b'\n' || *b == b'\r') {
                None => {
                    self.grow_line(&bytes[i..])?;
                    break;
                }
                Some(off) => {
                    self.grow_line(&bytes[i..i + off])?;
                    let end = i + off;
                    let crlf = bytes[end] == b'\r';
                    i = end + 1;
                    if crlf {
                        if i < bytes.len() {
                            if bytes[i] == b'\n' {
                                i += 1;
                            }
                        } else {
                            self.after_cr = true;
                        }
                    }
                    let line = std::mem::take(&mut self.line);
                    let result = self.line_done(&line, out);
                    self.line = line;
                    self.line.clear();
                    if let Err(f) = result {
                        self.fault = Some(f.clone());
                        return Err(f);
                    }
                }
            }
        }
        Ok(())
    }

    fn grow_line(&mut self, part: &[u8]) -> Result<(), SseFault> {
        if self.line.len() + part.len() > self.max_event_bytes {
            let f = SseFault::TooLarge(self.max_event_bytes);
            self.fault = Some(f.clone());
            return Err(f);
        }
        self.line.extend_from_slice(part);
        Ok(())
    }

    fn line_done(&mut self, line: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseFault> {
        if line.is_empty() {
            self.dispatch(out);
            return Ok(());
        }
        let line = std::str::from_utf8(line).map_err(|_| SseFault::NotText)?;
        if line.starts_with(':') {
            self.comments += 1;
            return Ok(());
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "data" => {
                let extra = value.len() + usize::from(self.has_data);
                if self.data.len() + extra > self.max_event_bytes {
                    return Err(SseFault::TooLarge(self.max_event_bytes));
                }
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.event = value.to_owned(),
            // An id holding NUL is ignored, as the standard says.
            "id" if !value.contains('\0') => self.last_id = Some(value.to_owned()),
            "retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                self.retry_ms = value.parse().ok();
            }
            _ => {}
        }
        Ok(())
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        let event = std::mem::take(&mut self.event);
        if !self.has_data {
            return;
        }
        self.has_data = false;
        out.push(SseEvent {
            event: if event.is_empty() {
                "message".to_owned()
            } else {
                event
            },
            data: std::mem::take(&mut self.data),
            id: self.last_id.clone(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(text: &[u8], max: usize) -> Result<Vec<SseEvent>, SseFault> {
        let mut p = SseParser::new(max);
        let mut out = Vec::new();
        p.push(text, &mut out)?;
        Ok(out)
    }

    fn one_byte_at_a_time(text: &[u8], max: usize) -> Result<Vec<SseEvent>, SseFault> {
        let mut p = SseParser::new(max);
        let mut out = Vec::new();
        for b in text {
            p.push(std::slice::from_ref(b), &mut out)?;
        }
        Ok(out)
    }

    #[test]
    fn multi_line_data_comments_ids_and_events() {
        let text = b": keep-alive\n\
            id: 7\n\
            event: message\n\
            data: {\"jsonrpc\":\"2.0\",\n\
            data:  \"method\":\"notifications/progress\"}\n\
            \n\
            : another comment\n\
            data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\
            \n";
        for events in [parse_all(text, 4096), one_byte_at_a_time(text, 4096)] {
            let events = events.unwrap();
            assert_eq!(events.len(), 2);
            assert_eq!(
                events[0].data,
                "{\"jsonrpc\":\"2.0\",\n \"method\":\"notifications/progress\"}"
            );
            assert_eq!(events[0].id.as_deref(), Some("7"));
            assert_eq!(events[0].event, "message");
            // The id persists to the next event.
            assert_eq!(events[1].id.as_deref(), Some("7"));
            assert_eq!(
                events[1].data,
                "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}"
            );
        }
    }

    #[test]
    fn every_line_ending_and_a_split_crlf() {
        let text = b"data: a\r\ndata: b\rdata: c\n\r\ndata: d\r\r";
        for events in [parse_all(text, 64), one_byte_at_a_time(text, 64)] {
            let events = events.unwrap();
            assert_eq!(events.len(), 2, "{events:?}");
            assert_eq!(events[0].data, "a\nb\nc");
            assert_eq!(events[1].data, "d");
        }
        // CR at the end of one chunk, LF at the start of the next: one line end.
        let mut p = SseParser::new(64);
        let mut out = Vec::new();
        p.push(b"data: x\r", &mut out).unwrap();
        p.push(b"\ndata: y\n\n", &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].data, "x\ny");
    }

    #[test]
    fn fields_without_values_bom_retry_and_unknown_fields() {
        let text = b"\xEF\xBB\xBFdata\nretry: 1500\nretry: x1\nfoo: bar\nevent\n\n";
        for events in [parse_all(text, 64), one_byte_at_a_time(text, 64)] {
            let events = events.unwrap();
            assert_eq!(events.len(), 1);
            assert_eq!(events[0].data, "");
            assert_eq!(events[0].event, "message");
        }
        let mut p = SseParser::new(64);
        let mut out = Vec::new();
        p.push(b"retry: 1500\n\n", &mut out).unwrap();
        assert_eq!(p.retry_ms, Some(1500));
        assert!(out.is_empty(), "no data, no event");
    }

    #[test]
    fn an_event_without_its_blank_line_is_not_dispatched() {
        let events = parse_all(b"data: half", 64).unwrap();
        assert!(events.is_empty());
        let events = parse_all(b"data: whole\n", 64).unwrap();
        assert!(events.is_empty());
    }

    #[test]
    fn limits_and_garbage_are_faults_not_panics() {
        assert_eq!(
            parse_all(&[b'x'; 100], 10),
            Err(SseFault::TooLarge(10)),
            "one long line"
        );
        let mut many = Vec::new();
        for _ in 0..20 {
            many.extend_from_slice(b"data: 12345\n");
        }
        assert_eq!(parse_all(&many, 50), Err(SseFault::TooLarge(50)));
        assert_eq!(parse_all(b"data: \xff\xfe\n\n", 50), Err(SseFault::NotText));
        // A fault sticks.
        let mut p = SseParser::new(4);
        let mut out = Vec::new();
        assert!(p.push(b"data: long\n", &mut out).is_err());
        assert!(p.push(b"\n", &mut out).is_err());
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..300 {
            let mut p = SseParser::new(256);
            let mut out = Vec::new();
            for _ in 0..64 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let n = (seed % 17) as usize;
                let chunk: Vec<u8> = (0..n)
                    .map(|i| {
                        let b = (seed >> (i % 8 * 8)) as u8;
                        match b % 6 {
                            0 => b'\n',
                            1 => b'\r',
                            2 => b':',
                            _ => b,
                        }
                    })
                    .collect();
                if p.push(&chunk, &mut out).is_err() {
                    break;
                }
            }
        }
    }
}
