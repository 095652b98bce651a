//! Ends of connections: when they close, lingering first after a last answer (half-closed,
//! input read and dropped), and giving their seats back.

use std::io::{self, Read};
use std::time::Instant;

use super::super::{Gateway, Wire};
use super::LINGER_READ_PER_TURN;
use crate::gateway::core::ConnRef;
use crate::gateway::door_limits::{Finish, FinishFacts, Seat, finish};
use crate::transport::framed;

impl Gateway {
    /// Close the connections that are done; connections whose last answer was written
    /// linger first.
    pub(in crate::gateway::event_loop) fn close_finished(&mut self) {
        let now = Instant::now();
        for slot in 0..self.conns.len() {
            if Some(slot) == self.stdio_slot {
                continue;
            }
            let Some(c) = self.conns[slot].as_ref() else {
                continue;
            };
            let conn = ConnRef {
                slot,
                generation: c.generation,
            };
            let idle = self.core.in_flight(conn) == 0;
            let facts = FinishFacts {
                broken: c.broken,
                read_closed: c.read_closed,
                idle,
                drained: c.queued() == 0,
                // A connection told it is closed (`tell_framed_and_close`, a refusal at
                // admission) still gets the answers of the calls it had sent before.
                last_answer: (c.guard.close_when_drained && idle)
                    || matches!(&c.wire, Wire::Http(h) if h.closing),
                lingering: c.guard.lingering_since.is_some(),
            };
            match finish::finish(facts) {
                Finish::Keep => {}
                Finish::Close => self.close_conn(slot),
                Finish::Linger => self.begin_linger(slot, now),
            }
        }
    }

    /// A framed peer is told in its protocol why it is closed (`message`, a JSON-RPC error
    /// on stream 0): nothing more it sends is read, the calls it sent before are still
    /// answered, then it lingers (`close_when_drained`, see `close_finished`). A grant for
    /// a frame it was sending goes back now, not at the end of the linger.
    pub(in crate::gateway::event_loop) fn tell_framed_and_close(
        &mut self,
        slot: usize,
        message: &[u8],
    ) {
        let Some(Some(c)) = self.conns.get_mut(slot) else {
            return;
        };
        framed::encode_reply(&mut c.out, 0, true, message);
        c.partial_since = None;
        c.guard.close_when_drained = true;
        if let Some(hold) = c.grant.take() {
            self.doors.partial.release(hold);
            self.doors.yielded = true;
        }
        self.flush_conn(slot);
    }

    /// Half-close and read the rest away (bounded by `gateway.linger_secs`); the seat moves
    /// to the lingering pool, or the connection closes now when that is full.
    fn begin_linger(&mut self, slot: usize, now: Instant) {
        let Some(Some(c)) = self.conns.get_mut(slot) else {
            return;
        };
        if c.guard.lingering_since.is_some() {
            return;
        }
        let door = c.guard.door;
        if !c.guard.seat.as_ref().is_some_and(Seat::is_lingering) {
            if let Some(seat) = c.guard.seat.take() {
                self.doors.budgets.release(seat);
            }
            match self.doors.budgets.admit_lingering(door) {
                Ok(seat) => c.guard.seat = Some(seat),
                Err(_) => {
                    c.io.shutdown_write();
                    self.close_conn(slot);
                    return;
                }
            }
        }
        c.io.shutdown_write();
        c.guard.lingering_since = Some(now);
        self.doors.arm(now);
        self.discard_input(slot);
    }

    /// A lingering connection: read and drop what it sends until EOF.
    pub(in crate::gateway::event_loop) fn discard_input(&mut self, slot: usize) {
        let Some(Some(c)) = self.conns.get_mut(slot) else {
            return;
        };
        let mut sink = [0u8; 16 * 1024];
        let mut dropped = 0;
        while dropped < LINGER_READ_PER_TURN {
            match c.io.read(&mut sink) {
                Ok(0) => {
                    c.read_closed = true;
                    return;
                }
                Ok(n) => dropped += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    c.broken = true;
                    return;
                }
            }
        }
        // More waits: come back next turn rather than hold the loop.
        c.paused = true;
    }

    /// Called by `close_conn` before the core hears of the disconnect: the seat goes back,
    /// and a modern-era HTTP call still in flight is cancelled (closing is how that era
    /// cancels).
    pub(in crate::gateway::event_loop) fn on_conn_closing(&mut self, slot: usize, now: Instant) {
        let Some(Some(c)) = self.conns.get_mut(slot) else {
            return;
        };
        if let Some(seat) = c.guard.seat.take() {
            self.doors.budgets.release(seat);
        }
        self.cancel_on_close(slot, now);
    }
}
