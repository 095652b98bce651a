//! What each door lets a connection hold, and for how long, sans-IO.
//!
//! - [`settings`]: the budgets and deadlines of every door, read from the config once.
//! - [`budget`]: seats — who may hold a connection: each agent door (framed, HTTP) its own,
//!   each peer (unix uid, vsock cid) and each HTTP principal, the admin socket's own
//!   reserve, and a small pool of connections kept only to be answered and closed.
//! - [`deadline`]: the stage a connection is in (opening, head, body, frame, idle, busy,
//!   lingering) and the deadline that stage has; a connection past it is closed.
//! - [`finish`]: when a connection ends, and whether it lingers first (half-closed, its
//!   input read and dropped for a bounded time, so the client reads the refusal it was sent).
//! - [`partial`]: bytes held for messages not yet whole, beyond each connection's small
//!   allowance: a global budget and each peer's share; without a grant, reading pauses.
//! - [`tally`]: closes and refusals by door and reason, for `/metrics`.
//!
//! The loop keeps one [`ConnGuard`] per connection and asks these modules; nothing here
//! touches a socket or a clock.

pub mod budget;
pub mod deadline;
pub mod finish;
pub mod partial;
pub mod settings;
pub mod tally;

pub use budget::{Budgets, Full, Seat};
pub use deadline::{Check, ConnGuard, Expiry, Facts, Stage};
pub use finish::{Finish, FinishFacts};
pub use partial::{Grant, Hold, PartialBudget, PartialLimits};
pub use settings::{Door, DoorLimits};
pub use tally::Tally;

/// `toolwall status`'s line for the seats object of the admin status answer.
pub fn seats_line(seats: &serde_json::Map<String, serde_json::Value>) -> String {
    ["framed", "http", "admin", "lingering"]
        .iter()
        .filter_map(|k| {
            let v = seats.get(*k)?;
            Some(format!("{k} {}/{}", v["taken"], v["limit"]))
        })
        .collect::<Vec<_>>()
        .join("  ")
}
