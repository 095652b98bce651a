//! `list` events, coalesced. A listing (`tools/list`, `prompts/list`, `resources/list`,
//! `resources/templates/list`) is a read of the catalog, not a call: recording each one
//! lets a client that lists in a loop write a row per request and slow every commit. So the
//! first listing of a (principal, transport, method) in a window of
//! `gateway.list_event_secs` is recorded as a `list` event as it comes; the others of that
//! window are counted, and when the window ends one `list_summary` event says how many
//! (and since when). A flood costs two rows per principal and method per window, whatever
//! its rate. Calls are untouched: every call keeps its own row.
//!
//! Bounded: at most [`MAX_WINDOWS`] windows are open; beyond, a listing is recorded as it
//! comes (as with `list_event_secs = 0`), never dropped.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Windows open at once (principals × methods listing in one window).
pub const MAX_WINDOWS: usize = 4096;

#[derive(Debug)]
struct Window {
    ends: Instant,
    started_ms: i64,
    /// Listings after the first, in this window.
    more: u64,
}

#[derive(Debug, Default)]
pub struct ListEvents {
    every: Duration,
    windows: HashMap<(String, &'static str, String), Window>,
    /// Summaries of windows that ended and were replaced before a sweep (at most one per
    /// window): recorded at the next [`ListEvents::due`].
    pending: Vec<Value>,
    /// Listings counted into a summary rather than recorded one by one.
    pub coalesced: u64,
}

impl ListEvents {
    pub fn new(every_secs: u64) -> ListEvents {
        ListEvents {
            every: Duration::from_secs(every_secs),
            ..ListEvents::default()
        }
    }

    /// A new window length (reload); open windows keep their end.
    pub fn set_every(&mut self, every_secs: u64) {
        self.every = Duration::from_secs(every_secs);
    }

    /// A listing: the detail of the `list` event to record now, or None when it is counted
    /// into its window's summary.
    pub fn on_list(
        &mut self,
        now: Instant,
        wall_ms: i64,
        principal: &str,
        transport: &'static str,
        method: &str,
    ) -> Option<Value> {
        let detail = json!({"method": method, "principal": principal, "transport": transport});
        if self.every.is_zero() {
            return Some(detail);
        }
        let key = (principal.to_owned(), transport, method.to_owned());
        if let Some(w) = self.windows.get_mut(&key)
            && now < w.ends
        {
            w.more += 1;
            self.coalesced += 1;
            return None;
        }
        if self.windows.len() >= MAX_WINDOWS && !self.windows.contains_key(&key) {
            return Some(detail);
        }
        // A window that ended but was not yet swept is replaced; its count is not lost.
        let ended = self.windows.insert(
            key.clone(),
            Window {
                ends: now + self.every,
                started_ms: wall_ms,
                more: 0,
            },
        );
        if let Some(w) = ended
            && w.more > 0
        {
            self.pending.push(summary(&key, &w, wall_ms));
        }
        Some(detail)
    }

    /// When the next window ends.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.windows.values().map(|w| w.ends).min()
    }

    /// Windows that ended by `now`: the `list_summary` details to record (windows with
    /// nothing beyond their first listing end quietly).
    pub fn due(&mut self, now: Instant, wall_ms: i64) -> Vec<Value> {
        let mut out = std::mem::take(&mut self.pending);
        if self.windows.values().any(|w| w.ends <= now) {
            self.windows.retain(|key, w| {
                if w.ends > now {
                    return true;
                }
                if w.more > 0 {
                    out.push(summary(key, w, wall_ms));
                }
                false
            });
        }
        out
    }

    /// Every open window, ended now (the gateway stops).
    pub fn flush(&mut self, wall_ms: i64) -> Vec<Value> {
        let mut out = std::mem::take(&mut self.pending);
        for (key, w) in self.windows.drain() {
            if w.more > 0 {
                out.push(summary(&key, &w, wall_ms));
            }
        }
        out
    }
}

fn summary(key: &(String, &'static str, String), w: &Window, wall_ms: i64) -> Value {
    json!({"method": key.2, "principal": key.0, "transport": key.1, "count": w.more,
           "since_ms": w.started_ms, "until_ms": wall_ms})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_one_row_and_one_summary_per_window() {
        let t0 = Instant::now();
        let mut l = ListEvents::new(60);
        assert!(l.on_list(t0, 1000, "uid:1", "unix", "tools/list").is_some());
        for i in 0..30_000 {
            let t = t0 + Duration::from_millis(i);
            assert!(l.on_list(t, 1000, "uid:1", "unix", "tools/list").is_none());
        }
        // Another method, another principal: their own first rows.
        assert!(
            l.on_list(t0, 1000, "uid:1", "unix", "prompts/list")
                .is_some()
        );
        assert!(l.on_list(t0, 1000, "bob", "http", "tools/list").is_some());
        assert_eq!(l.coalesced, 30_000);
        assert!(l.due(t0 + Duration::from_secs(59), 2000).is_empty());
        let rows = l.due(t0 + Duration::from_secs(60), 61_000);
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0]["count"], 30_000);
        assert_eq!(rows[0]["principal"], "uid:1");
        assert_eq!(rows[0]["since_ms"], 1000);
        assert!(l.windows.is_empty());
        // The next listing opens a new window with its own row.
        let t1 = t0 + Duration::from_secs(61);
        assert!(
            l.on_list(t1, 62_000, "uid:1", "unix", "tools/list")
                .is_some()
        );
        assert!(
            l.on_list(t1, 62_000, "uid:1", "unix", "tools/list")
                .is_none()
        );
        let rows = l.flush(63_000);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0]["count"], 1);
    }

    #[test]
    fn zero_records_every_listing_and_windows_are_bounded() {
        let t0 = Instant::now();
        let mut l = ListEvents::new(0);
        for _ in 0..3 {
            assert!(l.on_list(t0, 0, "a", "unix", "tools/list").is_some());
        }
        assert!(l.next_deadline().is_none());
        let mut l = ListEvents::new(60);
        for i in 0..MAX_WINDOWS + 10 {
            assert!(
                l.on_list(t0, 0, &format!("p{i}"), "http", "tools/list")
                    .is_some()
            );
        }
        assert_eq!(l.windows.len(), MAX_WINDOWS);
        // Beyond the bound a listing is recorded, not dropped.
        assert!(l.on_list(t0, 0, "p4100", "http", "tools/list").is_some());
        // An ended window not yet swept is replaced, its count kept.
        assert!(l.on_list(t0, 0, "p0", "http", "tools/list").is_none());
        let later = t0 + Duration::from_secs(61);
        assert!(l.on_list(later, 9, "p0", "http", "tools/list").is_some());
        let rows = l.due(later, 9);
        assert!(
            rows.iter()
                .any(|r| r["principal"] == "p0" && r["count"] == 1),
            "{rows:?}"
        );
    }
}
