//! Fair lanes: the calls bound for one pool (the builtin worker's, or one upstream server's
//! in the aggregator) wait here, not in the pool's own first-come queue, so one principal's
//! queued calls cannot delay another's indefinitely.
//!
//! A lane sends at most `window` calls to its worker at once: one per thread, plus
//! `gateway.pool_prefetch` more per thread waiting in the worker's own queue, so a thread
//! that ends a call starts the next without waiting for the gateway's turn (with none,
//! answers came back in bursts of at most `threads` and every loop turn and ledger commit
//! carried that few). The rest wait in one queue per principal and leave in round-robin
//! order across principals as calls end. A lane holds at most `capacity` calls (threads + queue), and one principal at
//! most `share` of them (`gateway.pool_share_percent` of the capacity), so another
//! principal always finds room. Sans-IO: the core decides, the call table keeps the count.

use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};

use super::dispatch::RequestCtx;
use super::exchange::Routed;
use super::{Action, Core, Recorder};
use crate::mcp::catalog::WorkerId;

/// The config key of a principal's share of a pool.
pub const SHARE_KEY: &str = "gateway.pool_share_percent";

/// One pool: a worker, and the upstream server for the aggregator's (empty otherwise).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LaneKey {
    pub worker: WorkerId,
    pub server: String,
}

/// A lane's bounds, from its pool's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// The pool's threads.
    pub threads: usize,
    /// Calls sent to the worker at once (its threads and their prefetched calls).
    pub window: usize,
    /// Calls running or waiting (threads + queue).
    pub capacity: usize,
    /// Calls one principal may hold running or waiting.
    pub share: usize,
}

impl Bounds {
    /// Bounds of a pool of `threads` threads and a queue of `queue`, `prefetch` calls
    /// queued at the worker per thread, a principal taking at most `percent` of it (at
    /// least one call).
    pub fn of_pool(threads: usize, queue: usize, prefetch: usize, percent: usize) -> Bounds {
        let threads = threads.max(1);
        let capacity = threads.saturating_add(queue);
        let window = threads
            .saturating_mul(prefetch.saturating_add(1))
            .min(capacity);
        let share = (capacity.saturating_mul(percent.min(100)) / 100).max(1);
        Bounds {
            threads,
            window,
            capacity,
            share,
        }
    }
}

/// Where a new call goes.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    /// To the worker now.
    Run,
    /// Into its principal's queue.
    Wait,
    /// Refused: the principal holds its whole share.
    OverShare { held: usize },
    /// Refused: the lane is full.
    Full,
}

#[derive(Debug, Default)]
struct Lane {
    window: usize,
    running: usize,
    waiting: usize,
    /// Calls running or waiting, by principal.
    held: HashMap<String, usize>,
    /// Waiting calls, by principal, in arrival order.
    queues: HashMap<String, VecDeque<u64>>,
    /// Principals with waiting calls, in the order they are served next.
    turn: VecDeque<String>,
}

#[derive(Debug, Default)]
pub struct Lanes {
    lanes: HashMap<LaneKey, Lane>,
}

impl Lanes {
    /// Where a new call of `principal` goes (nothing is counted until [`Lanes::enter`]).
    pub fn admission(&mut self, key: &LaneKey, principal: &str, bounds: Bounds) -> Admission {
        let lane = self.lanes.entry(key.clone()).or_default();
        lane.window = bounds.window;
        let held = lane.held.get(principal).copied().unwrap_or(0);
        if held >= bounds.share {
            return Admission::OverShare { held };
        }
        if lane.running + lane.waiting >= bounds.capacity {
            return Admission::Full;
        }
        if lane.running < lane.window && lane.waiting == 0 {
            Admission::Run
        } else {
            Admission::Wait
        }
    }

    /// Count a call in: running, or waiting behind its principal's earlier calls.
    pub fn enter(&mut self, key: &LaneKey, principal: &str, call: u64, waiting: bool) {
        let lane = self.lanes.entry(key.clone()).or_default();
        *lane.held.entry(principal.to_owned()).or_insert(0) += 1;
        if !waiting {
            lane.running += 1;
            return;
        }
        lane.waiting += 1;
        let queue = lane.queues.entry(principal.to_owned()).or_default();
        if queue.is_empty() {
            lane.turn.push_back(principal.to_owned());
        }
        queue.push_back(call);
    }

    /// Count a call out (it ended, was cancelled or timed out), running or waiting.
    pub fn leave(&mut self, key: &LaneKey, principal: &str, call: u64, waiting: bool) {
        let Some(lane) = self.lanes.get_mut(key) else {
            return;
        };
        if let Some(n) = lane.held.get_mut(principal) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                lane.held.remove(principal);
            }
        }
        if waiting {
            if let Some(queue) = lane.queues.get_mut(principal)
                && let Some(at) = queue.iter().position(|c| *c == call)
            {
                queue.remove(at);
                lane.waiting = lane.waiting.saturating_sub(1);
                if queue.is_empty() {
                    lane.queues.remove(principal);
                    lane.turn.retain(|p| p != principal);
                }
            }
        } else {
            lane.running = lane.running.saturating_sub(1);
        }
        if lane.held.is_empty() && lane.running == 0 && lane.waiting == 0 {
            self.lanes.remove(key);
        }
    }

    /// The next waiting call to send, when the window has room: the first call of the
    /// principal whose turn it is (who then goes to the back). Counted as running.
    pub fn next(&mut self, key: &LaneKey) -> Option<u64> {
        let lane = self.lanes.get_mut(key)?;
        if lane.running >= lane.window {
            return None;
        }
        let principal = lane.turn.pop_front()?;
        let queue = lane.queues.get_mut(&principal)?;
        let call = queue.pop_front()?;
        if queue.is_empty() {
            lane.queues.remove(&principal);
        } else {
            lane.turn.push_back(principal);
        }
        lane.waiting = lane.waiting.saturating_sub(1);
        lane.running += 1;
        Some(call)
    }

    /// Calls of `principal` running or waiting in a lane.
    pub fn held(&self, key: &LaneKey, principal: &str) -> usize {
        self.lanes
            .get(key)
            .and_then(|l| l.held.get(principal))
            .copied()
            .unwrap_or(0)
    }

    /// Lanes with waiting calls.
    pub fn with_waiting(&self) -> Vec<LaneKey> {
        self.lanes
            .iter()
            .filter(|(_, l)| l.waiting > 0 && l.running < l.window)
            .map(|(k, _)| k.clone())
            .collect()
    }
}

impl<R: Recorder> Core<R> {
    /// The lane of a call to `worker` for `server`, its bounds, and the keys that name
    /// its pool; None for the workspaces' workers (routed per caller, no shared pool).
    pub(super) fn lane_of(
        &self,
        worker: WorkerId,
        server: &str,
    ) -> Option<(LaneKey, Bounds, &'static str)> {
        let percent = self.limits.pool_share_percent;
        let prefetch = self.limits.pool_prefetch;
        if let Some(u) = self.upstreams.as_ref().filter(|u| u.is_worker(worker)) {
            let (threads, queue) = u.pool();
            let key = LaneKey {
                worker,
                server: server.to_owned(),
            };
            let bounds = Bounds::of_pool(threads, queue, prefetch, percent);
            return Some((key, bounds, "servers.threads, servers.queue"));
        }
        if server == crate::workspace::tools::SERVER {
            return None;
        }
        let (threads, queue) = self.builtin_pool;
        let key = LaneKey {
            worker,
            server: String::new(),
        };
        let bounds = Bounds::of_pool(threads, queue, prefetch, percent);
        Some((key, bounds, "builtin.threads, builtin.queue"))
    }

    /// The lane of a call as routed (`forward`): [`Core::lane_of`], and for a workspace
    /// worker the lane of its file-tool threads when `tool` runs on them (the shell and
    /// task tools hold no thread: their bound is the workspace's `max_tasks`).
    pub(super) fn lane_of_call(
        &self,
        worker: WorkerId,
        server: &str,
        tool: &str,
    ) -> Option<(LaneKey, Bounds, &'static str)> {
        if server != crate::workspace::tools::SERVER {
            // The builtin worker answers echo on its loop thread: it holds no pool thread,
            // so it takes no place in the pool's lane either (slow fetches cannot hold it).
            if tool == crate::tools::echo::NAME && !self.is_aggregator(worker) {
                return None;
            }
            return self.lane_of(worker, server);
        }
        let tool = tool.strip_prefix("ws__").unwrap_or(tool);
        if !crate::workspace::tools::on_file_threads(tool) {
            return None;
        }
        let &(threads, queue) = self.workspace_pools.get(&worker)?;
        let key = LaneKey {
            worker,
            server: String::new(),
        };
        let bounds = Bounds::of_pool(
            threads,
            queue,
            self.limits.pool_prefetch,
            self.limits.pool_share_percent,
        );
        Some((
            key,
            bounds,
            "workspaces.NAME.threads, workspaces.NAME.queue",
        ))
    }

    /// [`lane_of_call`](Self::lane_of_call), except for a workspace call: its worker is
    /// known only once its arguments are routed, so its share is checked there (after its
    /// row).
    fn lane_outside_workspaces(
        &self,
        worker: WorkerId,
        server: &str,
        tool: &str,
    ) -> Option<(LaneKey, Bounds, &'static str)> {
        if server == crate::workspace::tools::SERVER {
            return None;
        }
        self.lane_of_call(worker, server, tool)
    }

    /// A workspace worker's file-tool threads and queue (`[workspaces.NAME] threads`,
    /// `queue`): its file tools' calls go through a lane of that size.
    pub fn set_workspace_pool(&mut self, worker: WorkerId, threads: usize, queue: usize) {
        self.workspace_pools.insert(worker, (threads, queue));
    }

    /// What a lane's refusal calls its pool.
    pub(super) fn pool_name(&self, key: &LaneKey) -> String {
        if key.server.is_empty() {
            let name = self
                .workers
                .get(key.worker)
                .map_or("?", |w| w.name.as_str());
            format!("the worker {name}")
        } else {
            format!("server {}", key.server)
        }
    }

    /// Refuse at once, before any row is staged, a call (a tool, a prompt, a resource by its
    /// URI) whose principal holds its whole share of the pool the call would go to: counted in `toolwall_share_refusals_total`,
    /// not recorded one by one, so an agent that keeps its share full and retries cannot
    /// fill the ledger with refusals. True when refused.
    pub(super) fn refuse_over_pool_share(
        &mut self,
        ctx: &RequestCtx,
        method: &str,
        routed: Routed,
        params: Option<&RawValue>,
    ) -> bool {
        #[derive(Deserialize)]
        struct Named<'a> {
            #[serde(borrow, default)]
            name: Option<Cow<'a, str>>,
            #[serde(borrow, default)]
            uri: Option<Cow<'a, str>>,
        }
        let named = params.and_then(|p| serde_json::from_str::<Named>(p.get()).ok());
        // A resource goes by its URI to the server that owns it (the same rule the
        // pipeline routes by), so a read is refused here too, before any row.
        let lane = if routed.target_field() == "uri" {
            let Some(uri) = named.and_then(|n| n.uri) else {
                return false;
            };
            match self.resource_entry(&uri) {
                Ok(Some(route)) => self.lane_outside_workspaces(route.worker, &route.server, ""),
                _ => return false,
            }
        } else {
            let Some(name) = named.and_then(|n| n.name) else {
                return false;
            };
            let Some(entry) = self.catalog.get(routed.kind(), &name) else {
                return false;
            };
            let upstream = if routed.target_field() == "name" && method == "tools/call" {
                entry.upstream.as_str()
            } else {
                ""
            };
            self.lane_outside_workspaces(entry.worker, &entry.server, upstream)
        };
        let Some((key, bounds, keys)) = lane else {
            return false;
        };
        let held = self.calls.lane_held(&key, &ctx.peer.principal);
        if held < bounds.share {
            return false;
        }
        self.counters.share_refusals += 1;
        let who = self.pool_name(&key);
        let message = refusal(
            &Admission::OverShare { held },
            &who,
            &ctx.peer.principal,
            bounds,
            keys,
        );
        self.answer_error(
            ctx,
            method,
            super::principal_share::BUSY_CODE,
            &message,
            Some(&json!({"limit": SHARE_KEY, "held": held, "share": bounds.share})),
        );
        true
    }

    /// The builtin worker's pool (`builtin.threads`, `builtin.queue`).
    pub fn set_builtin_pool(&mut self, threads: usize, queue: usize) {
        self.builtin_pool = (threads, queue);
    }

    /// Send the waiting calls whose turn has come (calls ended since the last turn).
    pub(super) fn start_waiting_calls(&mut self) {
        for (key, worker, msg) in self.calls.start_waiting() {
            self.actions.push(Action::ToWorker {
                worker,
                call: Some(key),
                msg,
            });
        }
    }
}

/// The words of a refusal by a lane: `who` is the pool ("server x", "the builtin
/// worker"), `keys` the keys that size it.
pub fn refusal(
    admission: &Admission,
    who: &str,
    principal: &str,
    bounds: Bounds,
    keys: &str,
) -> String {
    match admission {
        Admission::OverShare { held } => format!(
            "{who} is busy for {principal}: it holds {held} of the {} calls its pool runs or queues, its share ({SHARE_KEY}; {keys}); try again when one ends",
            bounds.capacity
        ),
        _ => format!(
            "{who} is busy: {} threads and a queue of {} are in use ({keys})",
            bounds.threads,
            bounds.capacity - bounds.threads
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> LaneKey {
        LaneKey {
            worker: 0,
            server: "local".into(),
        }
    }

    /// Admit and count in, as the core does; the admission.
    fn add(l: &mut Lanes, who: &str, call: u64, b: Bounds) -> Admission {
        let a = l.admission(&key(), who, b);
        match a {
            Admission::Run => l.enter(&key(), who, call, false),
            Admission::Wait => l.enter(&key(), who, call, true),
            _ => {}
        }
        a
    }

    #[test]
    fn bounds_of_a_pool() {
        assert_eq!(
            Bounds::of_pool(16, 256, 0, 50),
            Bounds {
                threads: 16,
                window: 16,
                capacity: 272,
                share: 136
            }
        );
        assert_eq!(Bounds::of_pool(0, 0, 0, 1).share, 1);
        assert_eq!(
            Bounds::of_pool(2, 2, 0, 500).share,
            4,
            "at most the whole pool"
        );
        // Prefetch widens the window, never past the pool.
        assert_eq!(Bounds::of_pool(16, 256, 1, 50).window, 32);
        assert_eq!(Bounds::of_pool(4, 2, 3, 50).window, 6);
        assert_eq!(Bounds::of_pool(4, 2, 3, 50).threads, 4);
    }

    #[test]
    fn prefetched_calls_wait_at_the_worker_and_the_rest_still_take_turns() {
        let b = Bounds::of_pool(2, 100, 1, 90);
        let mut l = Lanes::default();
        for call in 1..=10 {
            let a = add(&mut l, "hog", call, b);
            let expect = if call <= 4 {
                Admission::Run
            } else {
                Admission::Wait
            };
            assert_eq!(a, expect, "call {call}");
        }
        assert_eq!(add(&mut l, "probe", 100, b), Admission::Wait);
        l.leave(&key(), "hog", 1, false);
        assert_eq!(l.next(&key()), Some(5));
        l.leave(&key(), "hog", 2, false);
        assert_eq!(
            l.next(&key()),
            Some(100),
            "the probe goes next, ahead of the hog's queue"
        );
    }

    #[test]
    fn another_principal_is_served_next_however_many_the_first_queued() {
        let b = Bounds::of_pool(2, 100, 0, 90);
        let mut l = Lanes::default();
        for call in 1..=50 {
            let a = add(&mut l, "hog", call, b);
            assert_eq!(
                a,
                if call <= 2 {
                    Admission::Run
                } else {
                    Admission::Wait
                }
            );
        }
        assert_eq!(add(&mut l, "probe", 100, b), Admission::Wait);
        // Turns alternate: the hog's first waiting call, then the probe's, then the hog's
        // again, however many the hog has waiting.
        l.leave(&key(), "hog", 1, false);
        assert_eq!(l.next(&key()), Some(3));
        assert_eq!(l.next(&key()), None, "the window is full again");
        l.leave(&key(), "hog", 2, false);
        assert_eq!(l.next(&key()), Some(100));
        l.leave(&key(), "probe", 100, false);
        assert_eq!(l.next(&key()), Some(4));
    }

    #[test]
    fn a_principal_holds_at_most_its_share_and_the_lane_its_capacity() {
        let b = Bounds::of_pool(1, 3, 0, 50);
        let mut l = Lanes::default();
        assert_eq!(add(&mut l, "hog", 1, b), Admission::Run);
        assert_eq!(add(&mut l, "hog", 2, b), Admission::Wait);
        assert_eq!(add(&mut l, "hog", 3, b), Admission::OverShare { held: 2 });
        assert_eq!(add(&mut l, "b", 4, b), Admission::Wait);
        assert_eq!(add(&mut l, "c", 5, b), Admission::Wait);
        assert_eq!(add(&mut l, "d", 6, b), Admission::Full);
    }

    #[test]
    fn a_waiting_call_that_leaves_never_runs() {
        let b = Bounds::of_pool(1, 10, 0, 100);
        let mut l = Lanes::default();
        add(&mut l, "a", 1, b);
        add(&mut l, "a", 2, b);
        add(&mut l, "a", 3, b);
        l.leave(&key(), "a", 2, true);
        l.leave(&key(), "a", 1, false);
        assert_eq!(l.next(&key()), Some(3));
        l.leave(&key(), "a", 3, false);
        assert_eq!(l.next(&key()), None);
        assert!(l.lanes.is_empty(), "an idle lane is forgotten");
    }

    mod core {
        use serde_json::json;

        use super::super::super::Action;
        use super::super::super::tests::{AGENT, Harness, reply, to_worker};
        use crate::workers::rpc::{Message, Op};

        /// A harness whose lanes send no call ahead of a thread (`pool_prefetch = 0`): the
        /// strict turns these tests pin down.
        fn strict() -> Harness {
            let mut h = Harness::new("");
            h.core.set_limits(crate::config::GatewayConfig {
                pool_prefetch: 0,
                ..Default::default()
            });
            h
        }

        /// A call that runs on one of the builtin pool's threads (the harness's `leak`;
        /// echo holds none, see `echo_takes_no_place_in_the_pool`).
        fn pooled(h: &mut Harness) -> Vec<Action> {
            h.send(
                "tools/call",
                json!({"name": "local__leak", "arguments": {"text": "x"}}),
            );
            h.turn()
        }

        #[test]
        fn echo_takes_no_place_in_the_pool() {
            let mut h = strict();
            h.core.set_builtin_pool(1, 9);
            to_worker(&pooled(&mut h)).expect("the first call runs");
            assert!(to_worker(&pooled(&mut h)).is_none(), "the second waits");
            h.send(
                "tools/call",
                json!({"name": "local__echo", "arguments": {"text": "x"}}),
            );
            assert!(
                to_worker(&h.turn()).is_some(),
                "echo goes to the worker at once: it answers on its loop thread"
            );
        }

        fn cancels(actions: &[Action]) -> Vec<u64> {
            actions
                .iter()
                .filter_map(|a| match a {
                    Action::ToWorker {
                        msg:
                            Message::Request {
                                op: Op::Cancel { target },
                                ..
                            },
                        ..
                    } => Some(*target),
                    _ => None,
                })
                .collect()
        }

        #[test]
        fn calls_beyond_the_threads_wait_and_go_in_turn_across_principals() {
            let mut h = strict();
            h.core.set_builtin_pool(1, 9);
            let (first, ..) = to_worker(&pooled(&mut h)).expect("the first call runs");
            assert!(to_worker(&pooled(&mut h)).is_none(), "the second waits");
            assert!(to_worker(&pooled(&mut h)).is_none(), "the third waits");
            h.peer.principal = "uid:1001".into();
            assert!(to_worker(&pooled(&mut h)).is_none(), "another's waits too");
            // The running call ends: the hog's second goes, then the other principal's,
            // ahead of the hog's third.
            h.worker_ok(first, r#"{"content":[]}"#);
            let actions = h.turn();
            assert!(reply(&actions).is_some());
            let (second, ..) = to_worker(&actions).expect("the next waiting call goes");
            h.worker_ok(second, r#"{"content":[]}"#);
            let (third, ..) = to_worker(&h.turn()).expect("and the next");
            let Some(super::super::super::calls::Call { purpose, .. }) = h.core.calls.get(third)
            else {
                panic!("the third call is in the table");
            };
            let super::super::super::calls::Purpose::Exchange(x) = purpose else {
                panic!("an exchange");
            };
            assert_eq!(x.from.principal, "uid:1001", "the other principal's turn");
        }

        #[test]
        fn a_call_over_the_pool_share_is_refused_before_any_row() {
            let mut h = strict();
            h.core.set_builtin_pool(1, 1);
            assert!(to_worker(&pooled(&mut h)).is_some(), "the first call runs");
            let (_, v) = reply(&pooled(&mut h)).expect("the second is refused at once");
            assert_eq!(v["error"]["data"]["limit"], super::super::SHARE_KEY, "{v}");
            assert_eq!(h.rows().len(), 1, "the refusal is not recorded");
            assert_eq!(h.core.counters.share_refusals, 1);
            // Another principal still has room in the pool.
            h.peer.principal = "uid:1001".into();
            let actions = pooled(&mut h);
            assert!(
                reply(&actions).is_none() && to_worker(&actions).is_none(),
                "it waits"
            );
            assert_eq!(h.rows().len(), 2);
        }

        #[test]
        fn a_resource_read_over_the_pool_share_is_refused_before_any_row() {
            let mut h = Harness::new("");
            h.core.set_builtin_pool(1, 1);
            assert!(to_worker(&pooled(&mut h)).is_some(), "the first call runs");
            h.send("resources/read", json!({"uri": "file:///report"}));
            let (_, v) = reply(&h.turn()).expect("the read is refused at once");
            assert_eq!(v["error"]["data"]["limit"], super::super::SHARE_KEY, "{v}");
            assert_eq!(
                h.rows().len(),
                1,
                "the refusal is not recorded, as for tools"
            );
            assert_eq!(h.core.counters.share_refusals, 1);
        }

        #[test]
        fn a_cancelled_call_keeps_its_slot_until_the_worker_says_it_ended() {
            let mut h = strict();
            h.core.set_builtin_pool(1, 9);
            let (first, ..) = to_worker(&pooled(&mut h)).expect("the first call runs");
            let hog_request = h.next_id;
            h.peer.principal = "uid:1001".into();
            assert!(to_worker(&pooled(&mut h)).is_none(), "another's call waits");
            h.peer.principal = "uid:1000".into();
            h.send_raw(&format!(
                r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{hog_request}}}}}"#
            ));
            let actions = h.turn();
            assert_eq!(cancels(&actions), vec![first], "the worker is told");
            assert!(
                to_worker(&actions).is_none(),
                "the worker may still run the cancelled call: no room yet"
            );
            // The worker's word that the cancelled call's thread ended frees its slot.
            h.core
                .on_worker_message(0, crate::workers::worker_main::cancelled_end(first), h.now);
            assert!(to_worker(&h.turn()).is_some(), "now the waiting call goes");
        }

        #[test]
        fn a_hang_up_cancels_running_calls_and_waiting_ones_never_start() {
            let mut h = strict();
            h.core.set_builtin_pool(1, 9);
            let (first, ..) = to_worker(&pooled(&mut h)).expect("the first call runs");
            assert!(to_worker(&pooled(&mut h)).is_none(), "the second waits");
            let now = h.now;
            h.core.on_peer_gone(AGENT, now);
            let actions = h.turn();
            assert_eq!(cancels(&actions), vec![first], "the worker is told");
            assert!(
                to_worker(&actions).is_none(),
                "the waiting call never starts"
            );
            assert!(reply(&actions).is_none(), "nobody is answered");
            let rows = h.rows();
            assert_eq!(rows.len(), 2);
            assert!(rows.values().all(|r| r.decision == "cancelled"), "{rows:?}");
            assert_eq!(h.core.in_flight(AGENT), 0);
        }
    }
}
