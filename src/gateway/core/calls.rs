//! The call table: every request the gateway is waiting on (an agent's exchange with a
//! server, or one of its own listings), each with one deadline, and the count of
//! unanswered requests per connection. Bounded by the in-flight limits the loop enforces.

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use super::ConnRef;
use super::exchange::Exchange;
use super::fair_lanes::{Admission, Bounds, LaneKey, Lanes};
use crate::mcp::catalog::{Kind, WorkerId};
use crate::workers::rpc;

/// Why the gateway waits on a worker.
#[derive(Debug)]
pub(super) enum Purpose {
    /// An agent's request to a server: crosses the pipeline both ways.
    Exchange(Box<Exchange>),
    /// A listing the gateway asked for itself (no agent behind it).
    Listing { kind: Kind, server: String },
    /// A fresh confinement report asked of a live worker.
    Attest,
    /// The aggregator's `configure` request (credentials).
    Configure,
}

/// Where a call stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// Held by an `ask` rule for a human decision.
    AwaitingApproval,
    /// Sent to its worker.
    AtWorker,
    /// Waiting in its lane for room at its worker (`fair_lanes.rs`).
    Queued,
}

#[derive(Debug)]
pub(super) struct Call {
    pub purpose: Purpose,
    pub worker: WorkerId,
    pub stage: Stage,
    pub started: Instant,
    pub deadline: Instant,
    /// The config key a timeout names.
    pub timeout_key: &'static str,
    /// The pool lane an agent's call runs or waits in (`fair_lanes.rs`).
    pub lane: Option<LaneKey>,
    /// The request a waiting call sends when its turn comes.
    pub unsent: Option<rpc::Message>,
}

impl Call {
    pub fn exchange(&self) -> Option<&Exchange> {
        match &self.purpose {
            Purpose::Exchange(x) => Some(x),
            _ => None,
        }
    }

    pub fn exchange_mut(&mut self) -> Option<&mut Exchange> {
        match &mut self.purpose {
            Purpose::Exchange(x) => Some(x),
            _ => None,
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct CallTable {
    calls: HashMap<u64, Call>,
    /// Every call's deadline, removed with the call.
    deadlines: BTreeSet<(Instant, u64)>,
    /// Requests of each connection not yet answered.
    in_flight: HashMap<ConnRef, usize>,
    /// Agents' calls in the table, by principal (`gateway.max_in_flight_per_principal`).
    by_principal: HashMap<String, usize>,
    /// Request bytes of those calls, by principal
    /// (`gateway.max_bytes_in_flight_per_principal`).
    bytes_by_principal: HashMap<String, usize>,
    /// Their sum (`gateway.max_bytes_in_flight`).
    bytes_total: usize,
    /// Agents' calls running or waiting in each pool's lane.
    lanes: Lanes,
    /// Cancelled calls a worker may still be running: each keeps its lane's slot (and its
    /// principal's share) until the worker says the call ended or its deadline passes, so
    /// cancelling does not make room the pool does not have.
    lingering: HashMap<u64, (LaneKey, String, Instant)>,
    next_key: u64,
}

/// Add `n` to (or take it from) `principal`'s count; a count of zero is forgotten.
fn tally(counts: &mut HashMap<String, usize>, principal: &str, n: usize, add: bool) {
    if add {
        if n > 0 {
            *counts.entry(principal.to_owned()).or_insert(0) += n;
        }
    } else if let Some(c) = counts.get_mut(principal) {
        *c = c.saturating_sub(n);
        if *c == 0 {
            counts.remove(principal);
        }
    }
}

impl CallTable {
    /// A fresh key: worker request ids and approval ids.
    pub fn new_key(&mut self) -> u64 {
        self.next_key += 1;
        self.next_key
    }

    pub fn insert(&mut self, key: u64, call: Call) {
        if let Some(old) = self.calls.remove(&key) {
            self.deadlines.remove(&(old.deadline, key));
            self.count(&old, false);
            self.count_lane(key, &old, false);
        }
        self.deadlines.insert((call.deadline, key));
        self.count(&call, true);
        self.count_lane(key, &call, true);
        self.calls.insert(key, call);
    }

    /// Count `call` in (or out of) its principal's calls.
    fn count(&mut self, call: &Call, add: bool) {
        let Some(x) = call.exchange() else { return };
        let principal = &x.from.principal;
        tally(&mut self.by_principal, principal, 1, add);
        tally(
            &mut self.bytes_by_principal,
            principal,
            x.arrived_bytes,
            add,
        );
        self.bytes_total = if add {
            self.bytes_total.saturating_add(x.arrived_bytes)
        } else {
            self.bytes_total.saturating_sub(x.arrived_bytes)
        };
    }

    /// Count `call` (key `key`) in or out of its lane.
    fn count_lane(&mut self, key: u64, call: &Call, add: bool) {
        let (Some(lane), Some(x)) = (&call.lane, call.exchange()) else {
            return;
        };
        let waiting = call.stage == Stage::Queued;
        if add {
            self.lanes.enter(lane, &x.from.principal, key, waiting);
        } else {
            self.lanes.leave(lane, &x.from.principal, key, waiting);
        }
    }

    /// `call` (key `key`, just taken out) was cancelled while at its worker: its lane's
    /// slot stays taken until [`CallTable::end_lingering`] (the worker's answer) or
    /// `until`.
    pub fn linger(&mut self, key: u64, call: &Call, until: Instant) {
        let (Some(lane), Some(x)) = (&call.lane, call.exchange()) else {
            return;
        };
        if call.stage != Stage::AtWorker {
            return;
        }
        let principal = x.from.principal.clone();
        self.lanes.enter(lane, &principal, key, false);
        self.deadlines.insert((until, key));
        self.lingering.insert(key, (lane.clone(), principal, until));
    }

    /// The worker is done with cancelled call `key` (or its deadline passed): its lane's
    /// slot is free. False when `key` was not lingering.
    pub fn end_lingering(&mut self, key: u64) -> bool {
        let Some((lane, principal, deadline)) = self.lingering.remove(&key) else {
            return false;
        };
        self.deadlines.remove(&(deadline, key));
        self.lanes.leave(&lane, &principal, key, false);
        true
    }

    /// Calls of `principal` running or waiting in `lane`.
    pub fn lane_held(&self, lane: &LaneKey, principal: &str) -> usize {
        self.lanes.held(lane, principal)
    }

    /// Where a new call of `principal` in `lane` goes.
    pub fn admission(&mut self, lane: &LaneKey, principal: &str, bounds: Bounds) -> Admission {
        self.lanes.admission(lane, principal, bounds)
    }

    /// The next waiting calls whose turn has come, marked as sent: their keys, workers and
    /// requests.
    pub fn start_waiting(&mut self) -> Vec<(u64, WorkerId, rpc::Message)> {
        let mut started = Vec::new();
        for lane in self.lanes.with_waiting() {
            while let Some(key) = self.lanes.next(&lane) {
                let Some(call) = self.calls.get_mut(&key) else {
                    continue;
                };
                call.stage = Stage::AtWorker;
                if let Some(msg) = call.unsent.take() {
                    started.push((key, call.worker, msg));
                }
            }
        }
        started
    }

    /// Request bytes of the agents' calls of `principal` in the table.
    /// Request bytes of every agent's calls in the table.
    pub fn bytes_total(&self) -> usize {
        self.bytes_total
    }

    pub fn bytes_of_principal(&self, principal: &str) -> usize {
        self.bytes_by_principal.get(principal).copied().unwrap_or(0)
    }

    /// Agents' calls of `principal` in the table (held asks included).
    pub fn of_principal(&self, principal: &str) -> usize {
        self.by_principal.get(principal).copied().unwrap_or(0)
    }

    pub fn get(&self, key: u64) -> Option<&Call> {
        self.calls.get(&key)
    }

    pub fn get_mut(&mut self, key: u64) -> Option<&mut Call> {
        self.calls.get_mut(&key)
    }

    pub fn take(&mut self, key: u64) -> Option<Call> {
        let call = self.calls.remove(&key)?;
        self.deadlines.remove(&(call.deadline, key));
        self.count(&call, false);
        self.count_lane(key, &call, false);
        Some(call)
    }

    pub fn len(&self) -> usize {
        self.calls.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, &Call)> {
        self.calls.iter().map(|(k, c)| (*k, c))
    }

    pub fn keys_where(&self, keep: impl Fn(&Call) -> bool) -> Vec<u64> {
        let mut keys: Vec<u64> = self
            .calls
            .iter()
            .filter(|(_, c)| keep(c))
            .map(|(k, _)| *k)
            .collect();
        keys.sort_unstable();
        keys
    }

    /// The earliest deadline, if any call waits.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|(t, _)| *t)
    }

    /// The key of a call whose deadline has passed, removed from the deadline set (the call
    /// itself stays until the caller ends it).
    pub fn pop_expired(&mut self, now: Instant) -> Option<u64> {
        let (t, key) = *self.deadlines.first()?;
        if t > now {
            return None;
        }
        self.deadlines.pop_first();
        Some(key)
    }

    /// Forget everything a closed connection is owed; its calls stay (their rows end).
    pub fn detach(&mut self, conn: ConnRef) {
        self.in_flight.remove(&conn);
        for call in self.calls.values_mut() {
            if let Purpose::Exchange(x) = &mut call.purpose
                && x.from.conn == Some(conn)
            {
                x.from.conn = None;
            }
        }
    }

    pub fn opened(&mut self, conn: ConnRef) {
        *self.in_flight.entry(conn).or_insert(0) += 1;
    }

    pub fn answered(&mut self, conn: ConnRef) {
        if let Some(n) = self.in_flight.get_mut(&conn) {
            *n = n.saturating_sub(1);
        }
    }

    pub fn in_flight(&self, conn: ConnRef) -> usize {
        self.in_flight.get(&conn).copied().unwrap_or(0)
    }
}
