//! When to list an upstream server again. Whatever a server announces (one
//! `list_changed` or a hundred thousand), each of its lists has at most one listing in
//! flight (from the request to the worker until the catalog applied the result), and two
//! listings of one list start at least `[servers] relist_min_interval_ms` apart. Requests
//! meanwhile are folded into one pending relisting and counted. Pure: the gateway's core
//! asks it and sends what it says.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::mcp::catalog::Kind;

#[derive(Debug, Default, Clone)]
struct Slot {
    in_flight: bool,
    /// Another listing was asked for while this one could not start.
    pending: bool,
    /// The earliest start of the next listing.
    not_before: Option<Instant>,
}

/// Default of `[servers] relist_loop_share_percent`.
pub const DEFAULT_RELIST_LOOP_SHARE_PERCENT: u32 = 5;
/// Longest wait one listing's cost imposes on the next (a single slow turn does not keep
/// a server's catalog stale for long).
pub const RELIST_CHARGE_MAX: Duration = Duration::from_secs(60);

#[derive(Debug, Default)]
pub struct RelistSchedule {
    min_interval: Duration,
    /// Most of the loop's time one list of one server may take (percent): after applying
    /// a listing that cost the loop `c`, the next waits at least `c * (100 - p) / p`.
    loop_share_percent: u32,
    slots: BTreeMap<(String, Kind), Slot>,
    /// Requests folded into one already pending or in flight, per server.
    coalesced: BTreeMap<String, u64>,
}

impl RelistSchedule {
    pub fn new(min_interval: Duration) -> RelistSchedule {
        RelistSchedule {
            min_interval,
            loop_share_percent: DEFAULT_RELIST_LOOP_SHARE_PERCENT,
            ..RelistSchedule::default()
        }
    }

    pub fn set_loop_share_percent(&mut self, p: u32) {
        self.loop_share_percent = p.clamp(1, 100);
    }

    /// Applying the listing of `kind` from `server` cost the loop `cost`: its next listing
    /// waits long enough that this list takes at most its share of the loop, whatever
    /// the upstream lists (a rotating catalog is all new at every listing).
    pub fn charge(&mut self, server: &str, kind: Kind, cost: Duration, now: Instant) {
        let p = self.loop_share_percent.clamp(1, 100);
        if p >= 100 {
            return;
        }
        let wait = (cost.saturating_mul(100 - p) / p).min(RELIST_CHARGE_MAX);
        if let Some(slot) = self.slots.get_mut(&(server.to_owned(), kind)) {
            let until = now + wait;
            if slot.not_before.is_none_or(|t| t < until) {
                slot.not_before = Some(until);
            }
        }
    }

    pub fn set_min_interval(&mut self, d: Duration) {
        self.min_interval = d;
    }

    /// A listing of `kind` from `server` is wanted. True: start it now (it is then in
    /// flight); false: it is pending (counted when it joins one already pending).
    pub fn request(&mut self, server: &str, kind: Kind, now: Instant) -> bool {
        let slot = self.slots.entry((server.to_owned(), kind)).or_default();
        let ready = !slot.in_flight && slot.not_before.is_none_or(|t| t <= now);
        if ready {
            slot.in_flight = true;
            slot.pending = false;
            slot.not_before = Some(now + self.min_interval);
            return true;
        }
        if slot.pending || slot.in_flight {
            *self.coalesced.entry(server.to_owned()).or_default() += 1;
        }
        slot.pending = true;
        false
    }

    /// A listing of `kind` from `server` is wanted at its next turn (see [`Self::due`]),
    /// without counting it as coalesced.
    pub fn pend(&mut self, server: &str, kind: Kind) {
        self.slots
            .entry((server.to_owned(), kind))
            .or_default()
            .pending = true;
    }

    /// The listing of `kind` from `server` is over (applied, refused or failed).
    pub fn done(&mut self, server: &str, kind: Kind) {
        if let Some(slot) = self.slots.get_mut(&(server.to_owned(), kind)) {
            slot.in_flight = false;
        }
    }

    /// Listings to start now: pending, not in flight, interval passed. Each returned one is
    /// in flight.
    pub fn due(&mut self, now: Instant, ready: impl Fn(&str) -> bool) -> Vec<(String, Kind)> {
        let mut out = Vec::new();
        for ((server, kind), slot) in self.slots.iter_mut() {
            if slot.pending
                && !slot.in_flight
                && slot.not_before.is_none_or(|t| t <= now)
                && ready(server)
            {
                slot.pending = false;
                slot.in_flight = true;
                slot.not_before = Some(now + self.min_interval);
                out.push((server.clone(), *kind));
            }
        }
        out
    }

    /// When the next pending listing may start.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.slots
            .values()
            .filter(|s| s.pending && !s.in_flight)
            .filter_map(|s| s.not_before)
            .min()
    }

    /// The worker reaching `servers` is gone: nothing of theirs is in flight any more;
    /// what was pending stays.
    pub fn worker_gone(&mut self, servers: &[String]) {
        for ((server, _), slot) in self.slots.iter_mut() {
            if slot.in_flight && servers.contains(server) {
                slot.in_flight = false;
                slot.pending = true;
            }
        }
    }

    /// `server` left the config (a reload): nothing of it is pending or in flight.
    pub fn forget(&mut self, server: &str) {
        self.slots.retain(|(s, _), _| s != server);
        self.coalesced.remove(server);
    }

    /// Listings in flight.
    pub fn in_flight(&self) -> usize {
        self.slots.values().filter(|s| s.in_flight).count()
    }

    /// Listings in flight of the servers `counted` accepts.
    pub fn in_flight_where(&self, counted: impl Fn(&str) -> bool) -> usize {
        self.slots
            .iter()
            .filter(|((server, _), s)| s.in_flight && counted(server))
            .count()
    }

    /// Requests folded into another, for `server`.
    pub fn coalesced(&self, server: &str) -> u64 {
        self.coalesced.get(server).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_costly_listing_delays_the_next_by_its_share_of_the_loop() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = RelistSchedule::new(ms(100));
        assert!(s.request("a", Kind::Resources, t0));
        s.done("a", Kind::Resources);
        // 50 ms of the loop at 5 %: the next listing waits 950 ms, not 100.
        s.charge("a", Kind::Resources, ms(50), t0);
        assert!(!s.request("a", Kind::Resources, t0 + ms(500)));
        assert!(s.due(t0 + ms(900), |_| true).is_empty());
        assert_eq!(s.due(t0 + ms(950), |_| true).len(), 1);
        // Bounded, and a cheap listing costs no more than the interval.
        s.done("a", Kind::Resources);
        s.charge("a", Kind::Resources, Duration::from_secs(3600), t0);
        assert_eq!(s.next_deadline(), None);
        assert!(s.request("a", Kind::Resources, t0 + RELIST_CHARGE_MAX));
        s.set_loop_share_percent(100);
        s.done("a", Kind::Resources);
        s.charge("a", Kind::Resources, ms(50), t0 + RELIST_CHARGE_MAX);
        assert!(s.request("a", Kind::Resources, t0 + RELIST_CHARGE_MAX + ms(100)));
    }

    #[test]
    fn one_in_flight_and_a_minimum_interval() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = RelistSchedule::new(ms(100));
        assert!(s.request("a", Kind::Tools, t0));
        // A flood while in flight: one pending, the rest counted.
        for _ in 0..1000 {
            assert!(!s.request("a", Kind::Tools, t0));
        }
        assert_eq!(s.coalesced("a"), 1000);
        // Other lists and servers are independent.
        assert!(s.request("a", Kind::Resources, t0));
        assert!(s.request("b", Kind::Tools, t0));
        assert!(s.due(t0 + ms(500), |_| true).is_empty(), "still in flight");
        s.done("a", Kind::Tools);
        assert_eq!(s.next_deadline(), Some(t0 + ms(100)));
        assert!(
            s.due(t0 + ms(50), |_| true).is_empty(),
            "not before the interval"
        );
        assert_eq!(
            s.due(t0 + ms(100), |_| true),
            vec![("a".to_string(), Kind::Tools)]
        );
        assert_eq!(s.in_flight(), 3);
        s.done("a", Kind::Tools);
        // Nothing pending: nothing due.
        assert!(s.due(t0 + ms(1000), |_| true).is_empty());
        // A request right after: waits for the interval.
        assert!(!s.request("a", Kind::Tools, t0 + ms(150)));
        assert_eq!(s.due(t0 + ms(200), |_| true).len(), 1);
    }

    #[test]
    fn worker_gone_keeps_what_was_wanted() {
        let t0 = Instant::now();
        let mut s = RelistSchedule::new(Duration::ZERO);
        assert!(s.request("a", Kind::Tools, t0));
        s.worker_gone(&["a".to_string()]);
        assert_eq!(s.in_flight(), 0);
        assert_eq!(s.due(t0, |_| true).len(), 1);
    }
}
