//! The sweep: every connection's stage and its deadline, from the first accept; a
//! connection past its deadline is counted and closed.

use std::time::Instant;

use super::super::{Gateway, Wire};
use super::{SWEEP_EVERY, frame_timeout_error};
use crate::gateway::core::ConnRef;
use crate::gateway::door_limits::{Check, Door, Expiry, Facts, Seat, Stage, deadline};

impl Gateway {
    /// What [`deadline::check`] needs about connection `slot`.
    fn facts(&self, slot: usize, c: &super::super::Conn) -> Facts {
        let conn = ConnRef {
            slot,
            generation: c.generation,
        };
        let refusing = c.guard.seat.as_ref().is_some_and(Seat::is_lingering);
        let stage = if let Some(since) = c.guard.lingering_since {
            Stage::Lingering { since }
        } else if refusing {
            // Kept only to be answered: its whole life is bounded by the linger time.
            Stage::Lingering {
                since: c.guard.opened,
            }
        } else if !self.serving && c.guard.door != Door::Admin {
            // Agents are not read until the workers are ready: nobody is late yet.
            Stage::Busy
        } else {
            match &c.wire {
                // Not read by our choice (every seat in flight is taken): nobody is late.
                // Paused by its own unread answers or its turn's share, its deadlines run.
                Wire::Http(h)
                    if c.paused
                        && !h.closing
                        && self.core.in_flight_total()
                            >= self.config.gateway.max_in_flight_total =>
                {
                    Stage::Busy
                }
                Wire::Http(h) => h.stage(),
                Wire::Framed(_) if !c.guard.read_any => Stage::Opening,
                // Waiting for room for its large frame (`gateway.max_partial_bytes`) is
                // still being late: the frame deadline runs, so a sender that never
                // finishes cannot keep its seat.
                Wire::Framed(_) => match c.partial_since {
                    Some(since) if !c.paused || c.awaiting_grant => Stage::Partial { since },
                    _ if self.core.in_flight(conn) > 0 => Stage::Busy,
                    _ if c.guard.close_when_drained => Stage::Closing,
                    _ => Stage::Idle {
                        since: c.guard.last_activity,
                    },
                },
                Wire::Admin(_) if !c.guard.read_any => Stage::Opening,
                Wire::Admin(_) => Stage::Idle {
                    since: c.guard.last_activity,
                },
                Wire::Lines(_) => Stage::Busy,
            }
        };
        Facts {
            door: c.guard.door,
            opened: c.guard.opened,
            stage,
            authenticated: matches!(&c.wire, Wire::Http(h) if h.authenticated()),
            last_work: match &c.wire {
                Wire::Http(h) if h.authenticated() => Some(h.idle_since),
                _ => None,
            },
            write_blocked_since: c.guard.write_blocked_since,
        }
    }

    /// Close every connection past its stage's deadline; retry accepts that ran out of
    /// descriptors. Armed from the first accept, then at least once a second while any
    /// connection is open.
    pub(in crate::gateway::event_loop) fn sweep_doors(&mut self, now: Instant) {
        if self.doors.check_at.is_none_or(|t| t > now) {
            return;
        }
        self.doors.check_at = None;
        if let Some(door) = self.http.as_mut() {
            door.sweep(now);
        }
        for index in std::mem::take(&mut self.doors.accept_retry) {
            if index == usize::MAX {
                self.accept_admin();
            } else {
                self.accept(index);
            }
        }
        let limits = self.doors.budgets.limits().clone();
        let mut expired = Vec::new();
        let mut next: Option<Instant> = None;
        let mut any = false;
        for slot in 0..self.conns.len() {
            let Some(c) = self.conns[slot].as_ref() else {
                continue;
            };
            if Some(slot) == self.stdio_slot || c.broken {
                continue;
            }
            any = true;
            match deadline::check(&self.facts(slot, c), &limits, now) {
                Check::Expired(why) => expired.push((slot, why)),
                Check::Due(Some(at)) => next = Some(next.map_or(at, |n: Instant| n.min(at))),
                Check::Due(None) => {}
            }
        }
        for (slot, why) in expired {
            self.expire(slot, why, now);
        }
        if any || !self.doors.accept_retry.is_empty() {
            let cap = now + SWEEP_EVERY;
            self.doors.check_at = Some(next.map_or(cap, |n| n.clamp(now, cap)));
        }
    }

    /// A connection missed its deadline: counted, then closed (an HTTP request caught
    /// mid-way gets 408 first and lingers).
    fn expire(&mut self, slot: usize, why: Expiry, now: Instant) {
        let Some(Some(c)) = self.conns.get_mut(slot) else {
            return;
        };
        let door = c.guard.door;
        if why != Expiry::Linger {
            self.doors.tally.closed(door, why);
            let who = c.peer.principal.clone();
            self.doors.note(why.as_str(), now, |more| {
                format!(
                    "closing a {} connection of {who}: {} ({}; {more} more since)",
                    door.as_str(),
                    why.as_str().replace('_', " "),
                    why.key(door)
                )
            });
        }
        // A 408 behind answers the client is not reading would never be seen.
        let answer_408 = matches!(why, Expiry::Head | Expiry::Body | Expiry::Auth)
            && c.guard.lingering_since.is_none()
            && c.queued() == 0;
        // A framed peer cut off mid-frame is told so in its protocol, like the 408 above:
        // an error frame naming the deadline, then a lingering close (never a bare reset).
        let answer_frame = why == Expiry::Frame
            && door == Door::Framed
            && c.guard.lingering_since.is_none()
            && !c.guard.close_when_drained
            && c.queued() == 0;
        match (&mut c.wire, self.http.as_mut()) {
            (Wire::Http(h), Some(d)) if answer_408 => {
                d.time_out(h, &mut c.out);
                self.flush_conn(slot);
            }
            (Wire::Framed(_), _) if answer_frame => {
                // The half frame is dropped with the rest of what it sends.
                let secs = self.config.gateway.frame_timeout_secs;
                self.tell_framed_and_close(slot, &frame_timeout_error(secs));
            }
            _ => c.broken = true,
        }
    }
}
