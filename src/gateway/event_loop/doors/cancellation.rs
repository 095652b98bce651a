//! HTTP cancellation across connections: a legacy-era cancel handed to the core as from
//! the connection holding its call, and a modern-era call cancelled by its connection's end.

use std::time::Instant;

use super::super::{Gateway, Wire};
use crate::gateway::core::{ConnRef, Expect, Peer};
use crate::policy::Transport;

impl Gateway {
    /// A legacy cancel (or an answer to a relayed request) arrived on one connection for a
    /// call another connection of the same session holds: the core hears it as from that
    /// connection. If it cancelled the call, that connection owes no answer: its event
    /// stream ends without one.
    pub(in crate::gateway::event_loop) fn cancel_elsewhere(
        &mut self,
        target: ConnRef,
        principal: String,
        payload: &[u8],
        now: Instant,
    ) {
        let live = self.conns.get(target.slot).and_then(Option::as_ref);
        if live.is_none_or(|c| c.generation != target.generation) {
            return;
        }
        let before = self.core.in_flight(target);
        let peer = Peer {
            transport: Transport::Http,
            principal,
            process: "http".into(),
        };
        self.core
            .on_message(target, &peer, "http", Expect::Notification, 0, payload, now);
        let cancel = matches!(
            crate::mcp::jsonrpc::parse(payload),
            Ok(crate::mcp::jsonrpc::Message::Notification { ref method, .. })
                if method == "notifications/cancelled"
        );
        if cancel
            && self.core.in_flight(target) < before
            && let Some(Some(c)) = self.conns.get_mut(target.slot)
            && let Wire::Http(h) = &mut c.wire
            && let Some(door) = self.http.as_mut()
        {
            door.abandon(h, &mut c.out);
            // The connection may carry the next request.
            c.paused = true;
            self.flush_conn(target.slot);
        }
    }

    /// A closing HTTP connection's modern-era call is cancelled (closing is how that era
    /// cancels); the core hears it before it hears of the disconnect.
    pub(super) fn cancel_on_close(&mut self, slot: usize, now: Instant) {
        let Some(Some(c)) = self.conns.get_mut(slot) else {
            return;
        };
        let conn = ConnRef {
            slot,
            generation: c.generation,
        };
        let cancel = match (&mut c.wire, self.http.as_mut()) {
            (Wire::Http(h), Some(d)) => d.on_close(h),
            _ => None,
        };
        if let Some((principal, note)) = cancel {
            let peer = Peer {
                transport: Transport::Http,
                principal,
                process: "http".into(),
            };
            self.core
                .on_message(conn, &peer, "http", Expect::Notification, 0, &note, now);
        }
    }
}
