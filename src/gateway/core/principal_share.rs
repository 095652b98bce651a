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
        // Not logged one by one: a flood of refusals must not become a flood of lines;
        // `toolwall_requests_total{outcome="error"}` counts them.
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
