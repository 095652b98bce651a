//! Bytes held for messages that have not arrived whole: a frame still coming in, an HTTP
//! body still arriving. Every connection may hold a small message's worth without asking
//! (`gateway.small_message_bytes` on the framed doors, one head on HTTP); a larger message
//! needs a grant for its whole size from the gateway's budget (`gateway.max_partial_bytes`)
//! and from its peer's share of it (`gateway.max_partial_bytes_per_peer`; a unix uid, a
//! vsock cid, an HTTP principal). Without one, reading from that connection pauses — the
//! kernel holds the rest, as TCP and unix sockets do — until a grant is given back; the
//! connection's own frame or body deadline still runs.
//!
//! Grants are all or nothing, for the whole message: a connection that holds one never
//! waits for more, so grants cannot deadlock each other and every granted message finishes
//! at its sender's pace. Counts never exceed their limits; a grant is given back exactly
//! once (the loop keeps it on the connection).

use std::collections::HashMap;

use super::settings::Door;
use crate::config::Config;

/// The budgets, from the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartialLimits {
    /// All connections together (`gateway.max_partial_bytes`).
    pub total: usize,
    /// One peer or principal (`gateway.max_partial_bytes_per_peer`).
    pub per_peer: usize,
    /// A framed message up to this size is read without a grant
    /// (`gateway.small_message_bytes`).
    pub small_framed: usize,
    /// What an HTTP connection holds without a grant: one head (`http.max_head_bytes`).
    pub small_http: usize,
}

impl PartialLimits {
    pub fn from_config(config: &Config) -> PartialLimits {
        PartialLimits {
            total: config.gateway.max_partial_bytes,
            per_peer: config.partial_bytes_per_peer(),
            small_framed: config.gateway.small_message_bytes,
            small_http: config.http.max_head_bytes + 1,
        }
    }

    /// What a connection of `door` holds without a grant.
    pub fn small(&self, door: Door) -> usize {
        match door {
            Door::Http => self.small_http,
            _ => self.small_framed,
        }
    }
}

/// Bytes granted to one connection for one message; give it back with
/// [`PartialBudget::release`] (it is not `Clone`, so it goes back once).
#[derive(Debug, PartialEq, Eq)]
pub struct Hold {
    door: Door,
    key: String,
    bytes: usize,
}

impl Hold {
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// What a connection may read into before its next read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Room {
    /// Its small allowance (bytes the buffer may hold).
    Small(usize),
    /// A grant for the message arriving (its whole size).
    Granted(usize),
    /// No room until a grant is given back: reading pauses.
    Wait,
    /// The message (of this size) is larger than any grant: it can never be read.
    Never(usize),
}

/// The answer to a request for a grant.
#[derive(Debug, PartialEq, Eq)]
pub enum Grant {
    /// Read on: the bytes are counted until the hold is given back.
    Given(Hold),
    /// The budget (or the peer's share) is taken: pause reading until some is given back.
    Wait,
    /// Larger than any grant can be: refuse the message.
    Never,
}

#[derive(Debug)]
pub struct PartialBudget {
    limits: PartialLimits,
    held: usize,
    /// Bytes granted per (door, peer or principal); entries at zero are removed.
    per_key: HashMap<(Door, String), usize>,
    /// Times a connection paused for want of a grant, by door.
    pub paused: std::collections::BTreeMap<&'static str, u64>,
    /// Messages refused as larger than any grant, by door.
    pub refused: std::collections::BTreeMap<&'static str, u64>,
}

impl PartialBudget {
    pub fn new(limits: PartialLimits) -> PartialBudget {
        PartialBudget {
            limits,
            held: 0,
            per_key: HashMap::new(),
            paused: Default::default(),
            refused: Default::default(),
        }
    }

    /// New limits (reload): grants already given stay; new ones follow the new limits.
    pub fn set_limits(&mut self, limits: PartialLimits) {
        self.limits = limits;
    }

    pub fn limits(&self) -> &PartialLimits {
        &self.limits
    }

    /// Bytes granted now, all connections together.
    pub fn held(&self) -> usize {
        self.held
    }

    /// How many bytes a message of `need` bytes (head and body, or a whole frame) needs
    /// granted on a connection of `door`: 0 when it fits in what the connection holds
    /// anyway.
    pub fn to_grant(&self, door: Door, need: usize) -> usize {
        if need <= self.limits.small(door) {
            0
        } else {
            need
        }
    }

    /// A grant of `bytes` for one message of `key` on `door`.
    pub fn grant(&mut self, door: Door, key: &str, bytes: usize) -> Grant {
        if bytes > self.limits.per_peer.min(self.limits.total) {
            *self.refused.entry(door.as_str()).or_insert(0) += 1;
            return Grant::Never;
        }
        let slot = (door, key.to_owned());
        let of_key = self.per_key.get(&slot).copied().unwrap_or(0);
        if self.held + bytes > self.limits.total || of_key + bytes > self.limits.per_peer {
            return Grant::Wait;
        }
        self.held += bytes;
        *self.per_key.entry(slot).or_insert(0) += bytes;
        Grant::Given(Hold {
            door,
            key: key.to_owned(),
            bytes,
        })
    }

    /// Give back a connection's grant once the message it was for is no longer the one
    /// arriving (`need`: what the message at the head of its buffer needs in all, if
    /// known). Returns whether one was given back (waiting connections may try again).
    pub fn release_spent(
        &mut self,
        door: Door,
        need: Option<usize>,
        grant: &mut Option<Hold>,
    ) -> bool {
        let to_grant = need.map_or(0, |n| self.to_grant(door, n));
        match grant.take_if(|h| h.bytes != to_grant) {
            Some(hold) => {
                self.release(hold);
                true
            }
            None => false,
        }
    }

    /// How much a connection of `door` and `key` may hold before its next read: its small
    /// allowance, or the grant for the large message arriving (`need`), asked for here and
    /// kept in `grant`. A new wait sets `awaiting` and is counted once. Also returns
    /// whether a spent grant was given back.
    pub fn room(
        &mut self,
        door: Door,
        key: &str,
        need: Option<usize>,
        grant: &mut Option<Hold>,
        awaiting: &mut bool,
    ) -> (Room, bool) {
        let released = self.release_spent(door, need, grant);
        let to_grant = need.map_or(0, |n| self.to_grant(door, n));
        if to_grant == 0 {
            *awaiting = false;
            return (Room::Small(self.limits.small(door)), released);
        }
        if let Some(hold) = grant {
            return (Room::Granted(hold.bytes), released);
        }
        let room = match self.grant(door, key, to_grant) {
            Grant::Given(hold) => {
                *awaiting = false;
                *grant = Some(hold);
                Room::Granted(to_grant)
            }
            Grant::Wait => {
                if !*awaiting {
                    *awaiting = true;
                    self.count_pause(door);
                }
                Room::Wait
            }
            Grant::Never => Room::Never(to_grant),
        };
        (room, released)
    }

    /// A connection of `door` began waiting for a grant.
    pub fn count_pause(&mut self, door: Door) {
        *self.paused.entry(door.as_str()).or_insert(0) += 1;
    }

    /// Give back a grant.
    pub fn release(&mut self, hold: Hold) {
        self.held = self.held.saturating_sub(hold.bytes);
        let slot = (hold.door, hold.key);
        if let Some(n) = self.per_key.get_mut(&slot) {
            *n = n.saturating_sub(hold.bytes);
            if *n == 0 {
                self.per_key.remove(&slot);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(total: usize, per_peer: usize) -> PartialBudget {
        PartialBudget::new(PartialLimits {
            total,
            per_peer,
            small_framed: 16,
            small_http: 32,
        })
    }

    #[test]
    fn small_messages_need_no_grant() {
        let b = budget(100, 50);
        assert_eq!(b.to_grant(Door::Framed, 16), 0);
        assert_eq!(b.to_grant(Door::Framed, 17), 17);
        assert_eq!(b.to_grant(Door::Http, 32), 0);
        assert_eq!(b.to_grant(Door::Http, 33), 33);
    }

    fn given(g: Grant) -> Hold {
        match g {
            Grant::Given(h) => h,
            other => panic!("not given: {other:?}"),
        }
    }

    #[test]
    fn one_peer_waits_at_its_share_and_others_read_on() {
        let mut b = budget(100, 50);
        let a = given(b.grant(Door::Framed, "uid:1", 30));
        assert_eq!(b.grant(Door::Framed, "uid:1", 30), Grant::Wait);
        let c = given(b.grant(Door::Framed, "uid:2", 50));
        // The same name on another door is another peer.
        let d = given(b.grant(Door::Http, "uid:1", 20));
        assert_eq!(b.held(), 100);
        assert_eq!(
            b.grant(Door::Http, "bob", 1),
            Grant::Wait,
            "the total holds"
        );
        b.release(c);
        let e = given(b.grant(Door::Framed, "uid:1", 20));
        assert_eq!(b.grant(Door::Framed, "uid:3", 60), Grant::Never);
        assert_eq!(b.refused.get("framed"), Some(&1));
        for h in [a, d, e] {
            b.release(h);
        }
        assert_eq!(b.held(), 0);
        assert!(b.per_key.is_empty(), "no entry outlives its grants");
    }

    #[test]
    fn a_connection_reads_small_waits_once_and_reads_its_grant_whole() {
        let mut b = budget(100, 60);
        let (mut g1, mut w1) = (None, false);
        let (mut g2, mut w2) = (None, false);
        // Small, or its length not known yet: the allowance.
        assert_eq!(
            b.room(Door::Framed, "uid:1", None, &mut g1, &mut w1),
            (Room::Small(16), false)
        );
        assert_eq!(
            b.room(Door::Framed, "uid:1", Some(10), &mut g1, &mut w1).0,
            Room::Small(16)
        );
        // A large frame: a grant for all of it, kept while it arrives.
        assert_eq!(
            b.room(Door::Framed, "uid:1", Some(50), &mut g1, &mut w1).0,
            Room::Granted(50)
        );
        assert_eq!(
            b.room(Door::Framed, "uid:1", Some(50), &mut g1, &mut w1).0,
            Room::Granted(50)
        );
        // The same peer's next one waits (past its share), counted once however often asked.
        for _ in 0..3 {
            assert_eq!(
                b.room(Door::Framed, "uid:1", Some(40), &mut g2, &mut w2).0,
                Room::Wait
            );
        }
        assert!(w2);
        assert_eq!(b.paused.get("framed"), Some(&1));
        // The first is handed over: its grant goes back, and the waiter is given room.
        assert_eq!(
            b.room(Door::Framed, "uid:1", None, &mut g1, &mut w1),
            (Room::Small(16), true)
        );
        assert!(g1.is_none());
        assert_eq!(
            b.room(Door::Framed, "uid:1", Some(40), &mut g2, &mut w2).0,
            Room::Granted(40)
        );
        assert!(!w2);
        assert_eq!(
            b.room(Door::Framed, "uid:9", Some(70), &mut g1, &mut w1).0,
            Room::Never(70)
        );
        assert!(b.release_spent(Door::Framed, None, &mut g2));
        assert_eq!(b.held(), 0);
    }

    #[test]
    fn defaults_bound_a_thousand_connections_per_door() {
        let l = PartialLimits::from_config(&Config::default());
        let worst = 1000 * l.small_framed + 1000 * l.small_http + l.total;
        assert!(worst < 64 * 1024 * 1024, "{worst}");
        assert!(l.per_peer >= toolwall_relay::frame::PREFIX_LEN + toolwall_relay::frame::MAX_TOTAL);
        assert!(l.per_peer <= l.total);
    }
}
