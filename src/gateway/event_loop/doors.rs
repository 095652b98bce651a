//! The loop's side of the doors' budgets and deadlines. The decisions are the sans-IO
//! [`door_limits`](crate::gateway::door_limits); these files only apply them to sockets:
//! `admission` (a seat at accept, else room made by displacing a connection that has not
//! proven anything, else a refusal the client can read), `deadlines` (the sweep that closes
//! connections past their stage deadline), `closing` (lingering closes, seats given back)
//! and `cancellation` (HTTP cancels across connections, and by a connection's end). This
//! file holds their shared state, constants and refusal messages.

use std::io;
use std::net::Shutdown;
use std::time::{Duration, Instant};

use super::{ConnIo, Gateway};
pub(super) use crate::gateway::door_limits::partial::Room;
use crate::gateway::door_limits::{
    Budgets, Door, DoorLimits, Full, Hold, PartialBudget, PartialLimits, Tally,
};
use crate::gateway::listeners;
use crate::mcp::jsonrpc;
use crate::transport::framed;

mod admission;
mod cancellation;
mod closing;
mod deadlines;

/// JSON-RPC code of a refusal for a full door (the implementation-defined server range).
pub const BUSY_CODE: i64 = -32000;
/// Longest between two sweeps while any connection is open: a stage that starts between
/// sweeps is looked at within this.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// Bytes read and dropped from one lingering connection per loop turn (the rest next turn).
const LINGER_READ_PER_TURN: usize = 1024 * 1024;
/// Connections looked at (and read, in case their bytes are already here) before one that
/// has not sent a byte is displaced.
const DISPLACE_TRIES: usize = 8;
/// A limit's refusals are logged at most this often (with the count between).
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Budgets, tallies and the sweep timer.
pub struct DoorState {
    pub budgets: Budgets,
    /// Bytes held for messages not yet whole, beyond each connection's small allowance.
    pub partial: PartialBudget,
    pub tally: Tally,
    /// The next sweep of every connection's deadlines: armed by the first accept.
    pub check_at: Option<Instant>,
    /// Listeners (by index; `usize::MAX` is the admin socket) whose accept ran out of
    /// descriptors: accepted again at the next sweep, since no new readiness edge may come.
    accept_retry: Vec<usize>,
    /// A connection gave up its turn with work left (`gateway.max_messages_per_turn`): the
    /// next poll does not wait.
    pub yielded: bool,
    /// Per limit: when its refusals were last logged, and how many since.
    logged: std::collections::HashMap<&'static str, (Instant, u64)>,
}

impl DoorState {
    pub fn new(limits: DoorLimits, partial: PartialLimits) -> DoorState {
        DoorState {
            budgets: Budgets::new(limits),
            partial: PartialBudget::new(partial),
            tally: Tally::default(),
            check_at: None,
            accept_retry: Vec::new(),
            yielded: false,
            logged: std::collections::HashMap::new(),
        }
    }

    fn arm(&mut self, now: Instant) {
        let at = now + SWEEP_EVERY;
        if self.check_at.is_none_or(|t| t > at) {
            self.check_at = Some(at);
        }
    }

    /// Give back a connection's grant once the message it was for is no longer arriving
    /// (`need`: what the message at the head of its buffer needs in all, if known).
    pub(super) fn release_spent(
        &mut self,
        door: Door,
        need: Option<usize>,
        grant: &mut Option<Hold>,
    ) {
        if self.partial.release_spent(door, need, grant) {
            // Connections waiting for a grant try again at once.
            self.yielded = true;
        }
    }

    /// How much a connection may hold before its next read (see [`PartialBudget::room`]);
    /// a new wait is logged (at most once per `LOG_EVERY`).
    pub(super) fn room_for(
        &mut self,
        door: Door,
        key: &str,
        need: Option<usize>,
        grant: &mut Option<Hold>,
        awaiting: &mut bool,
        now: Instant,
    ) -> Room {
        let was_awaiting = *awaiting;
        let (room, released) = self.partial.room(door, key, need, grant, awaiting);
        if released {
            self.yielded = true;
        }
        if let Room::Wait = room
            && !was_awaiting
        {
            let held = self.partial.held();
            self.note("partial_wait", now, |more| {
                format!(
                    "a {} message of {key} waits for room ({held} bytes held in messages not \
                     yet whole: gateway.max_partial_bytes, gateway.max_partial_bytes_per_peer) \
                     ({more} more since)",
                    door.as_str()
                )
            });
        }
        room
    }

    /// Log a refusal or a close, at most once per `LOG_EVERY` per kind.
    fn note(&mut self, kind: &'static str, now: Instant, line: impl FnOnce(u64) -> String) {
        let entry = self.logged.entry(kind).or_insert((now - LOG_EVERY, 0));
        entry.1 += 1;
        if now.saturating_duration_since(entry.0) >= LOG_EVERY {
            crate::warn!("{}", line(entry.1 - 1));
            *entry = (now, 0);
        }
    }
}

/// Make the descriptor limit room for every seat the budgets grant; say which keys to
/// lower when the hard limit is below that.
pub(super) fn ensure_descriptors(config: &crate::config::Config) {
    let seats = DoorLimits::from_config(config).max_descriptors() as u64;
    let wanted = seats + listeners::DESCRIPTORS_BESIDES_CONNECTIONS;
    match listeners::raise_descriptor_limit(wanted) {
        Ok(have) if have >= wanted => {}
        Ok(have) => crate::warn!(
            "open-file limit {have} is below the {wanted} the door budgets need \
             (gateway.max_connections + http.max_connections + admin.max_connections + \
             gateway.max_lingering + \
             {}): raise LimitNOFILE or lower those keys",
            listeners::DESCRIPTORS_BESIDES_CONNECTIONS
        ),
        Err(e) => crate::warn!("cannot raise the open-file limit to {wanted}: {e}"),
    }
}

/// `accept()` ran out of descriptors (or the kernel's): try again later rather than spin.
fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
        || e.kind() == io::ErrorKind::OutOfMemory
}

/// A framed refusal: a JSON-RPC error (id null) on stream 0 with the notification flag,
/// which the relay writes to its agent's stdout.
fn framed_refusal(full: Full, retry_after_secs: u64) -> Vec<u8> {
    let key = full.key();
    let msg = jsonrpc::error_response(
        None,
        BUSY_CODE,
        &format!("too many connections ({key}); try again in {retry_after_secs} s"),
        Some(&serde_json::json!({"limit": key, "retryAfterSecs": retry_after_secs})),
    );
    let mut out = Vec::new();
    framed::encode_reply(&mut out, 0, true, &msg);
    out
}

/// What a framed peer that left a frame half-sent for `gateway.frame_timeout_secs` is told
/// before its connection closes: a JSON-RPC error (id null) on stream 0, like a refusal.
fn frame_timeout_error(secs: u64) -> Vec<u8> {
    let key = "gateway.frame_timeout_secs";
    jsonrpc::error_response(
        None,
        jsonrpc::TRANSPORT_ERROR,
        &format!("a frame was not completed within {secs} s ({key}); closing the connection"),
        Some(&serde_json::json!({"limit": key, "timeoutSecs": secs})),
    )
}

fn admin_refusal(full: Full) -> Vec<u8> {
    let mut line = serde_json::json!({"ok": false, "error": format!("too many admin connections ({})", full.key())})
        .to_string()
        .into_bytes();
    line.push(b'\n');
    line
}

impl ConnIo {
    fn shutdown_write(&self) {
        let _ = match self {
            ConnIo::Unix(s) => s.shutdown(Shutdown::Write),
            ConnIo::Tcp(s) => s.shutdown(Shutdown::Write),
            ConnIo::Vsock(s) => s.shutdown(Shutdown::Write),
            ConnIo::Stdio => Ok(()),
        };
    }
}

impl Gateway {
    /// Seats taken and their limits, for `toolwall status`.
    pub fn door_seats(&self) -> serde_json::Value {
        let (framed, http, admin, lingering) = self.doors.budgets.counts();
        let l = self.doors.budgets.limits();
        serde_json::json!({
            "framed": {"taken": framed, "limit": l.framed},
            "http": {"taken": http, "limit": l.http},
            "admin": {"taken": admin, "limit": l.admin},
            "lingering": {"taken": lingering, "limit": l.lingering},
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_name_their_limit_in_each_protocol() {
        let bytes = framed_refusal(Full::Peer, 5);
        let Ok(toolwall_relay::frame::Decoded::Frame {
            header, payload, ..
        }) = toolwall_relay::frame::decode_frame(&bytes)
        else {
            panic!("a whole frame")
        };
        assert_eq!(header.stream_id, 0);
        assert!(header.is_notification());
        let v: serde_json::Value = serde_json::from_slice(payload).unwrap();
        assert_eq!(v["error"]["code"], BUSY_CODE);
        assert_eq!(v["id"], serde_json::Value::Null);
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("gateway.max_connections_per_peer")
        );
        let line = admin_refusal(Full::Admin);
        assert!(line.ends_with(b"\n"));
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["ok"], false);
        assert!(
            v["error"]
                .as_str()
                .unwrap()
                .contains("admin.max_connections")
        );
    }
}
