//! Each local server's last stderr lines in the gateway, for `toolwall status NAME`, and
//! the few of them that go to the log: at most [`LOG_LINES_PER_SEC`] a second per server
//! (a burst of [`LOG_BURST`]); the rest are counted, and the count is logged once the
//! budget allows. Lines arrive already redacted and rate-limited by the host (stderr
//! events); here they are bounded again, by count and by length.

use serde_json::{Value, json};
use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use crate::aggregator::error::quote_upstream;

/// stderr lines logged per second and server, at most.
pub const LOG_LINES_PER_SEC: f64 = 5.0;
/// Lines a server may log at once after a quiet spell.
pub const LOG_BURST: f64 = 20.0;
/// Longest line kept (the host cuts at 1000 bytes already).
const MAX_LINE_CHARS: usize = 1000;
/// Most lines one event may bring.
const MAX_EVENT_LINES: usize = 1000;

#[derive(Debug)]
struct Ring {
    lines: VecDeque<String>,
    /// Lines the host dropped (its rate limit) or this ring overwrote.
    dropped: u64,
    tokens: f64,
    refilled: Instant,
    not_logged: u64,
}

#[derive(Debug)]
pub struct StderrBoard {
    capacity: usize,
    rings: BTreeMap<String, Ring>,
}

impl StderrBoard {
    pub fn new(capacity: usize) -> StderrBoard {
        StderrBoard {
            capacity: capacity.max(1),
            rings: BTreeMap::new(),
        }
    }

    pub fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity.max(1);
        for r in self.rings.values_mut() {
            while r.lines.len() > self.capacity {
                r.lines.pop_front();
            }
        }
    }

    /// A `stderr` event's detail (`lines`, `dropped`) for `server`. Returns the log lines
    /// to write now.
    pub fn on_event(&mut self, server: &str, detail: &Value, now: Instant) -> Vec<String> {
        let capacity = self.capacity;
        let ring = self.rings.entry(server.to_owned()).or_insert_with(|| Ring {
            lines: VecDeque::new(),
            dropped: 0,
            tokens: LOG_BURST,
            refilled: now,
            not_logged: 0,
        });
        let elapsed = now.saturating_duration_since(ring.refilled).as_secs_f64();
        ring.refilled = now;
        ring.tokens = (ring.tokens + elapsed * LOG_LINES_PER_SEC).min(LOG_BURST);
        let mut logs = Vec::new();
        if ring.not_logged > 0 && ring.tokens >= 1.0 {
            ring.tokens -= 1.0;
            logs.push(format!(
                "server {server}: {} stderr lines not logged (`toolwall status {server}` shows the last ones)",
                std::mem::take(&mut ring.not_logged)
            ));
        }
        ring.dropped = ring
            .dropped
            .saturating_add(detail.get("dropped").and_then(Value::as_u64).unwrap_or(0));
        let lines = detail
            .get("lines")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        for line in lines.iter().take(MAX_EVENT_LINES) {
            let Some(text) = line.as_str() else { continue };
            let text = quote_upstream(text, MAX_LINE_CHARS);
            if ring.tokens >= 1.0 {
                ring.tokens -= 1.0;
                logs.push(format!("server {server} stderr: {text}"));
            } else {
                ring.not_logged += 1;
            }
            if ring.lines.len() == capacity {
                ring.lines.pop_front();
                ring.dropped += 1;
            }
            ring.lines.push_back(text);
        }
        logs
    }

    /// `toolwall status NAME`: the last lines and how many were dropped.
    pub fn json(&self, server: &str) -> Value {
        match self.rings.get(server) {
            Some(r) => json!({"lines": r.lines, "dropped": r.dropped}),
            None => json!({"lines": [], "dropped": 0}),
        }
    }

    /// The last `n` lines of `server`, for an error message.
    pub fn tail(&self, server: &str, n: usize) -> Vec<String> {
        self.rings
            .get(server)
            .map(|r| {
                let skip = r.lines.len().saturating_sub(n);
                r.lines.iter().skip(skip).cloned().collect()
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn bounded_and_rate_limited() {
        let t0 = Instant::now();
        let mut b = StderrBoard::new(3);
        let lines: Vec<String> = (0..100).map(|i| format!("l{i}")).collect();
        let logs = b.on_event("fs", &json!({"lines": lines, "dropped": 7}), t0);
        assert_eq!(logs.len(), LOG_BURST as usize);
        let j = b.json("fs");
        assert_eq!(j["lines"], json!(["l97", "l98", "l99"]));
        assert_eq!(j["dropped"], 7 + 97);
        // A second later: the count of what was not logged comes first.
        let logs = b.on_event(
            "fs",
            &json!({"lines": ["\u{1b}[31mred"]}),
            t0 + Duration::from_secs(1),
        );
        assert!(logs[0].contains("80 stderr lines not logged"), "{logs:?}");
        assert!(!logs[1].contains('\u{1b}'), "escaped: {logs:?}");
        assert_eq!(b.tail("fs", 2).len(), 2);
        assert!(b.tail("nope", 2).is_empty());
    }
}
