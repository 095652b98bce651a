//! One principal's share of the calls in flight (`gateway.max_in_flight_per_principal`):
//! a principal (an HTTP token's, a unix uid, a vsock cid) with that many calls in the table
//! — held asks included — has its next call refused at once, so it cannot take every seat
//! of `gateway.max_in_flight_total` and leave the other agents waiting.
//!
//! And its share of the bytes (`gateway.max_bytes_in_flight_per_principal`): the requests
//! of its calls in the table plus the answers waiting to be written to its connections.
//! An agent that pipelines large calls and never reads its answers is refused once it
//! holds that much, instead of growing the gateway's memory by everything it sends.

use serde_json::json;
use std::collections::HashMap;

use super::dispatch::RequestCtx;
use super::{Core, Recorder};

/// JSON-RPC code of a call refused for a full share (the implementation-defined range, as
/// the doors' refusals for a full budget).
pub const BUSY_CODE: i64 = -32000;

/// The config key the refusal names.
pub const KEY: &str = "gateway.max_in_flight_per_principal";

/// The config key a refusal for bytes names.
pub const BYTES_KEY: &str = "gateway.max_bytes_in_flight_per_principal";

/// The config key a refusal for all principals' bytes names.
pub const TOTAL_BYTES_KEY: &str = "gateway.max_bytes_in_flight";

/// Whether a request of `incoming` bytes passes a principal's byte share: it does when the
/// principal holds nothing (one call larger than the bound still runs alone), or when what
/// it holds plus the request stays within `max`.
pub fn within_bytes(held: usize, incoming: usize, max: usize) -> bool {
    held == 0 || held.saturating_add(incoming) <= max
}

impl<R: Recorder> Core<R> {
    /// The loop tells, once per turn, how many answer bytes wait to be written to each
    /// principal's connections (principals with none are left out).
    pub fn set_output_waiting(&mut self, waiting: HashMap<String, usize>) {
        self.output_waiting = waiting;
    }

    /// Bytes `principal` holds: its calls' requests plus its answers not yet written.
    fn bytes_held(&self, principal: &str) -> usize {
        let waiting = self.output_waiting.get(principal).copied().unwrap_or(0);
        self.calls
            .bytes_of_principal(principal)
            .saturating_add(waiting)
    }

    /// Refuse the call when its principal holds its whole share of calls or of bytes;
    /// true when refused.
    pub(super) fn refuse_over_share(&mut self, ctx: &RequestCtx, method: &str) -> bool {
        if self.refuse_over_bytes(ctx, method) {
            return true;
        }
        let share = self.limits.in_flight_per_principal();
        let held = self.calls.of_principal(&ctx.peer.principal);
        if held < share {
            return false;
        }
        // Not logged or recorded one by one: a flood of refusals must not become a flood
        // of lines or rows; `toolwall_share_refusals_total` counts them.
        self.counters.share_refusals += 1;
        let message = format!(
            "too many calls in flight for {} ({KEY} = {share}); try again when one ends",
            ctx.peer.principal
        );
        self.answer_error(
            ctx,
            method,
            BUSY_CODE,
            &message,
            Some(&json!({"limit": KEY, "inFlight": held, "share": share})),
        );
        true
    }

    fn refuse_over_bytes(&mut self, ctx: &RequestCtx, method: &str) -> bool {
        let total_max = self.limits.max_bytes_in_flight;
        let total = self
            .calls
            .bytes_total()
            .saturating_add(self.output_waiting.values().sum());
        // Like the share, a principal holding nothing is let in: a few principals filling
        // the total cannot shut every other one out.
        let own = self.bytes_held(&ctx.peer.principal);
        if own > 0 && !within_bytes(total, ctx.bytes_received, total_max) {
            self.counters.share_refusals += 1;
            let message = format!(
                "too many bytes in flight for all agents: {total} bytes of calls and unread answers, and this call's {} would pass {TOTAL_BYTES_KEY} ({total_max}); try again when a call ends",
                ctx.bytes_received
            );
            self.answer_error(
                ctx,
                method,
                BUSY_CODE,
                &message,
                Some(
                    &json!({"limit": TOTAL_BYTES_KEY, "bytesInFlight": total, "share": total_max}),
                ),
            );
            return true;
        }
        let max = self.limits.max_bytes_in_flight_per_principal;
        let held = self.bytes_held(&ctx.peer.principal);
        if within_bytes(held, ctx.bytes_received, max) {
            return false;
        }
        self.counters.share_refusals += 1;
        let message = format!(
            "too many bytes in flight for {}: {held} bytes of calls and unread answers, and this call's {} would pass {BYTES_KEY} ({max}); read the answers or try again when a call ends",
            ctx.peer.principal, ctx.bytes_received
        );
        self.answer_error(
            ctx,
            method,
            BUSY_CODE,
            &message,
            Some(&json!({"limit": BYTES_KEY, "bytesInFlight": held, "share": max})),
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::tests::{Harness, reply};
    use super::{BYTES_KEY, KEY, TOTAL_BYTES_KEY, within_bytes};
    use std::collections::HashMap;

    #[test]
    fn the_byte_share_lets_in_a_lone_call_and_bounds_the_rest() {
        assert!(within_bytes(0, 10_000, 100), "nothing held: let in");
        assert!(within_bytes(40, 60, 100));
        assert!(!within_bytes(41, 60, 100));
        assert!(!within_bytes(usize::MAX, 1, 100), "no overflow");
    }

    #[test]
    fn held_requests_and_unread_answers_count_in_the_byte_share() {
        let mut h = Harness::new(
            "[[policy.rules]]\nid = \"ask-echo\"\naction = \"ask\"\ntool = \"local__echo\"\n",
        );
        h.core.limits.max_bytes_in_flight_per_principal = 300;
        let big = json!({"name": "local__echo", "arguments": {"text": "x".repeat(120)}});
        h.send("tools/call", big.clone());
        assert!(
            h.turn().is_empty(),
            "held: the first call is within the share"
        );
        h.send("tools/call", big.clone());
        let (_, v) = reply(&h.turn()).expect("refused: two would pass 300 bytes");
        assert_eq!(v["error"]["data"]["limit"], BYTES_KEY, "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(BYTES_KEY));
        // Another principal has its own share...
        h.peer.principal = "uid:1001".into();
        h.send("tools/call", big.clone());
        assert!(h.turn().is_empty(), "another principal's call is held");
        // ...until answers wait unread on its connections.
        h.core
            .set_output_waiting(HashMap::from([("uid:1001".to_owned(), 250)]));
        h.send("tools/call", big);
        let (_, v) = reply(&h.turn()).expect("refused: unread answers count");
        assert_eq!(v["error"]["data"]["limit"], BYTES_KEY, "{v}");
        assert_eq!(h.core.counters.share_refusals, 2);
    }

    #[test]
    fn many_principals_within_their_shares_are_bounded_together() {
        let mut h = Harness::new(
            "[[policy.rules]]\nid = \"ask-echo\"\naction = \"ask\"\ntool = \"local__echo\"\n",
        );
        h.core.limits.max_bytes_in_flight_per_principal = 1000;
        h.core.limits.max_bytes_in_flight = 500;
        let big = json!({"name": "local__echo", "arguments": {"text": "x".repeat(120)}});
        for who in ["uid:1", "uid:2"] {
            h.peer.principal = who.into();
            h.send("tools/call", big.clone());
            assert!(h.turn().is_empty(), "{who} is held within both bounds");
        }
        // Within its own share, but a second call of uid:1 would pass the total.
        h.peer.principal = "uid:1".into();
        h.send("tools/call", big.clone());
        let (_, v) = reply(&h.turn()).expect("refused: the total would pass 500 bytes");
        assert_eq!(v["error"]["data"]["limit"], TOTAL_BYTES_KEY, "{v}");
        // Unread answers of anyone count toward the total too.
        h.core.set_output_waiting(HashMap::from([
            ("uid:9".to_owned(), 10_000),
            ("uid:2".to_owned(), 10),
        ]));
        h.peer.principal = "uid:2".into();
        h.send("tools/call", big.clone());
        let (_, v) = reply(&h.turn()).expect("refused: answers wait unread");
        assert_eq!(v["error"]["data"]["limit"], TOTAL_BYTES_KEY, "{v}");
        // A principal holding nothing is let in, however full the total: a few cannot
        // shut every other one out.
        h.peer.principal = "uid:4".into();
        h.send("tools/call", big);
        assert!(h.turn().is_empty(), "held, not refused");
    }

    #[test]
    fn a_principal_over_its_share_is_refused_and_others_are_not() {
        let mut h = Harness::new(
            "[[policy.rules]]\nid = \"ask-echo\"\naction = \"ask\"\ntool = \"local__echo\"\n",
        );
        h.core.limits.max_in_flight_per_principal = Some(2);
        let echo = json!({"name": "local__echo", "arguments": {"text": "x"}});
        for _ in 0..2 {
            h.send("tools/call", echo.clone());
            assert!(h.turn().is_empty(), "held within the share");
        }
        h.send("tools/call", echo.clone());
        let (_, v) = reply(&h.turn()).expect("refused at once");
        assert_eq!(v["error"]["code"], super::BUSY_CODE);
        assert_eq!(v["error"]["data"]["limit"], KEY);
        assert!(v["error"]["message"].as_str().unwrap().contains(KEY), "{v}");
        assert_eq!(h.core.counters.share_refusals, 1);
        // Another principal has a share of its own.
        h.peer.principal = "uid:1001".into();
        h.send("tools/call", echo.clone());
        assert!(
            h.turn().is_empty(),
            "another principal's call is held, not refused"
        );
        assert_eq!(h.core.pending_approvals(h.now).len(), 3);
        // When one of the first principal's calls ends, it may call again.
        h.peer.principal = "uid:1000".into();
        let first = h.core.pending_approvals(h.now)[0].id;
        let now = h.now;
        h.core
            .decide_approval(first, false, "admin", Some("no"), now)
            .expect("deny");
        h.turn();
        h.send("tools/call", echo);
        assert!(h.turn().is_empty(), "held again within the share");
        assert_eq!(h.core.pending_approvals(h.now).len(), 3);
    }
}
