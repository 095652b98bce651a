//! One principal's share of the calls in flight (`gateway.max_in_flight_per_principal`):
//! a principal (an HTTP token's, a unix uid, a vsock cid) with that many calls in the table
//! — held asks included — has its next call refused at once, so it cannot take every seat
//! of `gateway.max_in_flight_total` and leave the other agents waiting.

use serde_json::json;

use super::dispatch::RequestCtx;
use super::{Core, Recorder};

/// JSON-RPC code of a call refused for a full share (the implementation-defined range, as
/// the doors' refusals for a full budget).
pub const BUSY_CODE: i64 = -32000;

/// The config key the refusal names.
pub const KEY: &str = "gateway.max_in_flight_per_principal";

impl<R: Recorder> Core<R> {
    /// Refuse the call when its principal holds its whole share; true when refused.
    pub(super) fn refuse_over_share(&mut self, ctx: &RequestCtx, method: &str) -> bool {
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
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::tests::{Harness, reply};
    use super::KEY;

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
