//! Finds the top-level `"id"` of a line too long to keep, fed in pieces, in constant memory,
//! so the local error for an oversized request can still carry its id. Best effort: it
//! reads JSON loosely and answers `None` for anything unusual.

use serde_json::Value;

/// Longest id kept, in raw JSON bytes; a longer one is reported as unknown.
pub const MAX_ID_BYTES: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    BeforeObject,
    BeforeKey,
    Key,
    AfterKey,
    BeforeValue,
    Value,
    AfterValue,
    Found,
    GaveUp,
}

#[derive(Debug)]
pub struct IdProbe {
    state: State,
    /// First bytes of the current key and its length, enough to tell `id` apart.
    key_head: [u8; 2],
    key_len: usize,
    /// Whether the value being read belongs to the key `id`.
    capturing: bool,
    captured: Vec<u8>,
    /// Nesting inside the current value.
    depth: u32,
    in_string: bool,
    escaped: bool,
    found: Option<String>,
}

impl Default for IdProbe {
    fn default() -> Self {
        Self::new()
    }
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

impl IdProbe {
    pub fn new() -> Self {
        Self {
            state: State::BeforeObject,
            key_head: [0; 2],
            key_len: 0,
            capturing: false,
            captured: Vec::new(),
            depth: 0,
            in_string: false,
            escaped: false,
            found: None,
        }
    }

    /// Whether more bytes can change the answer.
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Found | State::GaveUp)
    }

    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.is_done() {
                return;
            }
            self.step(b);
        }
    }

    /// The id as raw JSON, when one was found.
    pub fn finish(self) -> Option<String> {
        self.found
    }

    fn step(&mut self, b: u8) {
        match self.state {
            State::BeforeObject => match b {
                b'{' => self.state = State::BeforeKey,
                b if is_ws(b) => {}
                _ => self.state = State::GaveUp,
            },
            State::BeforeKey => match b {
                b'"' => {
                    self.state = State::Key;
                    self.key_len = 0;
                    self.escaped = false;
                }
                b if is_ws(b) => {}
                _ => self.state = State::GaveUp,
            },
            State::Key => {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.state = State::AfterKey;
                    return;
                }
                if let Some(slot) = self.key_head.get_mut(self.key_len) {
                    *slot = b;
                }
                self.key_len = self.key_len.saturating_add(1);
            }
            State::AfterKey => match b {
                b':' => self.state = State::BeforeValue,
                b if is_ws(b) => {}
                _ => self.state = State::GaveUp,
            },
            State::BeforeValue => {
                if !is_ws(b) {
                    self.state = State::Value;
                    self.capturing = self.key_len == 2 && self.key_head == *b"id";
                    self.captured.clear();
                    self.depth = 0;
                    self.in_string = false;
                    self.escaped = false;
                    self.value_byte(b);
                }
            }
            State::Value => self.value_byte(b),
            State::AfterValue => match b {
                b',' => self.state = State::BeforeKey,
                b if is_ws(b) => {}
                _ => self.state = State::GaveUp,
            },
            State::Found | State::GaveUp => {}
        }
    }

    fn value_byte(&mut self, b: u8) {
        if self.capturing && self.captured.len() >= MAX_ID_BYTES {
            self.state = State::GaveUp;
            return;
        }
        if self.in_string {
            self.capture(b);
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.in_string = false;
                if self.depth == 0 {
                    self.end_value(State::AfterValue);
                }
            }
            return;
        }
        match b {
            b'"' => {
                self.capture(b);
                self.in_string = true;
            }
            b'{' | b'[' => {
                self.capture(b);
                self.depth = self.depth.saturating_add(1);
            }
            b'}' | b']' if self.depth > 0 => {
                self.capture(b);
                self.depth -= 1;
                if self.depth == 0 {
                    self.end_value(State::AfterValue);
                }
            }
            // A scalar closed by the end of the object: no key after it.
            b'}' | b']' => self.end_value(State::GaveUp),
            b',' if self.depth == 0 => self.end_value(State::BeforeKey),
            b if self.depth == 0 && is_ws(b) => self.end_value(State::AfterValue),
            _ => self.capture(b),
        }
    }

    fn capture(&mut self, b: u8) {
        if self.capturing {
            self.captured.push(b);
        }
    }

    fn end_value(&mut self, next: State) {
        if !self.capturing {
            self.state = next;
            return;
        }
        self.state = State::GaveUp;
        if let Ok(id @ (Value::String(_) | Value::Number(_) | Value::Null)) =
            serde_json::from_slice::<Value>(&self.captured)
        {
            self.found = Some(id.to_string());
            self.state = State::Found;
        }
        self.captured = Vec::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe_whole(line: &str) -> Option<String> {
        let mut p = IdProbe::new();
        p.feed(line.as_bytes());
        p.finish()
    }

    fn probe_bytewise(line: &str) -> Option<String> {
        let mut p = IdProbe::new();
        for b in line.as_bytes() {
            p.feed(std::slice::from_ref(b));
        }
        p.finish()
    }

    fn probe(line: &str) -> Option<String> {
        let whole = probe_whole(line);
        assert_eq!(whole, probe_bytewise(line), "{line}");
        whole
    }

    #[test]
    fn id_first_or_last() {
        assert_eq!(
            probe(r#"{"jsonrpc":"2.0","id":12,"method":"x","params":{"#),
            Some("12".into())
        );
        let tail = r#"{"method":"tools/call","params":{"id":5,"s":"}\"{[","a":[{"id":6}]},"jsonrpc":"2.0","id":"req-9"}"#;
        assert_eq!(probe(tail), Some("\"req-9\"".into()));
        assert_eq!(
            probe(r#"{ "id" : -3.5e2 , "method":"m"}"#),
            Some("-350.0".into())
        );
        assert_eq!(probe(r#"{"method":"m","id":null}"#), Some("null".into()));
        assert_eq!(probe(r#"{"method":"m","id":7}"#), Some("7".into()));
    }

    #[test]
    fn no_usable_id() {
        assert_eq!(probe(r#"{"method":"m","params":{"id":1}}"#), None);
        assert_eq!(probe(r#"{"id":{"a":1},"method":"m"}"#), None);
        assert_eq!(probe(r#"{"idx":1,"i":2}"#), None);
        assert_eq!(probe(r#"[{"id":1}]"#), None);
        assert_eq!(probe("garbage"), None);
        assert_eq!(probe(r#"{"method":"m","params":{"text":"aaaa"#), None);
        let long = format!(r#"{{"id":"{}"}}"#, "a".repeat(MAX_ID_BYTES));
        assert_eq!(probe(&long), None);
    }

    #[test]
    fn escaped_key_text_is_not_mistaken() {
        assert_eq!(probe(r#"{"i\"":1,"id":2}"#), Some("2".into()));
    }
}
