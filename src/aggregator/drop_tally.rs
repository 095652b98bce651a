//! Notifications a worker dropped outside a call's thread, summed by the progress token
//! they named and told to the gateway as `relay_dropped` events: at most one event per
//! token per [`FLUSH_EVERY`] while a flood lasts, so counting a flood is no flood itself.

use serde_json::json;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::upstream::EventSink;
use crate::workers::relay_wire::RELAY_DROPPED;

/// How often sums are sent while drops go on.
pub const FLUSH_EVERY: Duration = Duration::from_millis(250);
/// Tokens summed apart; beyond, their drops are summed without a token.
const MAX_TOKENS: usize = 64;

#[derive(Default)]
pub struct DropTally {
    counts: HashMap<Option<String>, u64>,
    last_flush: Option<Instant>,
}

impl DropTally {
    pub fn add(&mut self, token: Option<String>, count: u64) {
        let token = token.filter(|t| {
            self.counts.contains_key(&Some(t.clone())) || self.counts.len() < MAX_TOKENS
        });
        let n = self.counts.entry(token).or_insert(0);
        *n = n.saturating_add(count);
    }

    /// Send the sums if [`FLUSH_EVERY`] passed since the last time.
    pub fn flush_due(&mut self, server: &str, events: &EventSink) {
        let now = Instant::now();
        if self
            .last_flush
            .is_none_or(|t| now.saturating_duration_since(t) >= FLUSH_EVERY)
        {
            self.flush(server, events);
        }
    }

    /// Send the sums now.
    pub fn flush(&mut self, server: &str, events: &EventSink) {
        self.last_flush = Some(Instant::now());
        for (token, count) in self.counts.drain() {
            events(
                RELAY_DROPPED,
                json!({"server": server, "progress_token": token, "count": count}),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn sums_by_token_and_sends_them_once() {
        let sent = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&sent);
        let events: EventSink = Arc::new(move |kind: &str, detail: serde_json::Value| {
            seen.lock().unwrap().push((kind.to_owned(), detail));
        });
        let mut t = DropTally::default();
        t.add(Some("toolwall-3".into()), 2);
        t.add(Some("toolwall-3".into()), 5);
        t.add(None, 1);
        t.flush_due("s", &events);
        // Nothing new, and not due: nothing sent.
        t.add(Some("toolwall-3".into()), 1);
        t.flush_due("s", &events);
        let got = sent.lock().unwrap().clone();
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got.iter().all(|(k, _)| k == RELAY_DROPPED));
        let three = got
            .iter()
            .find(|(_, d)| d["progress_token"] == "toolwall-3")
            .unwrap();
        assert_eq!(three.1["count"], 7);
        t.flush("s", &events);
        assert_eq!(sent.lock().unwrap().len(), 3);
        // Tokens beyond the bound are summed without one.
        let mut t = DropTally::default();
        for i in 0..(MAX_TOKENS + 10) {
            t.add(Some(format!("t{i}")), 1);
        }
        assert_eq!(t.counts.len(), MAX_TOKENS + 1);
        assert_eq!(t.counts[&None], 10);
    }
}
