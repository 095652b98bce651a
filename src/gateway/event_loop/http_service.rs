//! The servicer of HTTP connections: one request at a time to the core, `/health` and
//! `/metrics` answered here.

use super::*;

impl Gateway {
    /// An HTTP connection: read, parse, hand one request at a time to the core.
    pub(super) fn service_http(&mut self, slot: usize, now: Instant) {
        // Fairness: this many reads and answered requests, then the others' turn.
        let mut budget = self.config.gateway.max_messages_per_turn;
        let max_output = self.config.http.max_queued_output_bytes;
        let mut output_paused = false;
        loop {
            let step = 'step: {
                let (Some(door), Some(Some(c))) = (self.http.as_mut(), self.conns.get_mut(slot))
                else {
                    return;
                };
                let conn = ConnRef {
                    slot,
                    generation: c.generation,
                };
                let queued = c.queued();
                let Wire::Http(h) = &mut c.wire else { return };
                // The body a grant was for has been handed over: give it back.
                self.doors
                    .release_spent(Door::Http, h.body_need(), &mut c.grant);
                // The peer hung up while its call waits and its bytes are not read (a
                // bound, or pipelined bytes filling the room): it is gone all the same.
                if c.hung_up && h.is_waiting() && !c.read_closed {
                    c.read_closed = true;
                    c.broken = true;
                }
                if !self.serving
                    || self.core.in_flight_total() >= self.config.gateway.max_in_flight_total
                    || queued > max_output
                    || budget == 0
                {
                    c.paused = true;
                    if budget == 0 {
                        self.doors.yielded = true;
                    }
                    output_paused = queued > max_output;
                    // Output waits to be written: flushed below, so the write-stall clock
                    // runs and the drain resumes reading.
                    break 'step None;
                }
                c.paused = false;

                loop {
                    match door.process(h, &mut c.out, &mut self.core, conn, now) {
                        Step::NeedBytes => {}
                        // A call is with the core: still read (pipelined bytes, bounded),
                        // to see the client close, which cancels a modern-era call.
                        Step::Waiting if h.is_waiting() => {}
                        Step::Waiting => break None,
                        other => break Some(other),
                    }
                    // A large body reads into a grant for its whole size; without one,
                    // reading pauses (the kernel holds the rest) until one is given back.
                    match self.doors.room_for(
                        Door::Http,
                        h.principal().unwrap_or(""),
                        h.body_need(),
                        &mut c.grant,
                        &mut c.awaiting_grant,
                        now,
                    ) {
                        doors::Room::Wait => {
                            c.paused = true;
                            break None;
                        }
                        doors::Room::Never(size) => {
                            crate::warn!(
                                "closing http connection of {}: a request of {size} bytes is \
                                 larger than gateway.max_partial_bytes_per_peer allows",
                                c.peer.principal
                            );
                            c.broken = true;
                            break None;
                        }
                        doors::Room::Granted(_) => door.reserve_body(h),
                        doors::Room::Small(_) => {}
                    }
                    let room = door.read_room(h).min(16 * 1024);
                    if c.read_closed || c.broken || h.closing || room == 0 {
                        break None;
                    }
                    // Answers the client has not read: read no more requests until they
                    // drain; nor more than this turn's share.
                    if c.out.len() - c.out_pos > max_output || budget == 0 {
                        c.paused = true;
                        if budget == 0 {
                            self.doors.yielded = true;
                        }
                        output_paused = c.out.len() - c.out_pos > max_output;
                        break None;
                    }
                    budget -= 1;
                    let mut buf = [0u8; 16 * 1024];
                    match c.io.read(&mut buf[..room]) {
                        Ok(0) => {
                            c.read_closed = true;
                            // The end of its input while its call is pending: the client
                            // hung up (HTTP has no half-close to wait on an answer; a FIN
                            // is all a closed connection shows until a write fails). The
                            // connection closes now, which cancels its call in either era.
                            if h.is_waiting() {
                                c.broken = true;
                            }
                            break None;
                        }
                        Ok(n) => {
                            c.guard.on_read(n, now);
                            if let Err(e) = door.on_bytes(h, &buf[..n], &mut c.out, now) {
                                crate::debug!("http connection of {}: {e}", c.peer.principal);
                                h.closing = true;
                                break None;
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break None,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => {
                            c.broken = true;
                            break None;
                        }
                    }
                }
            };
            budget = budget.saturating_sub(1);
            match step {
                Some(Step::Health { keep_alive }) => {
                    let report = self.health_report();
                    if let (Some(door), Some(Some(c))) =
                        (self.http.as_mut(), self.conns.get_mut(slot))
                        && let Wire::Http(h) = &mut c.wire
                    {
                        door.write_health(h, &report, keep_alive, &mut c.out);
                    }
                }
                Some(Step::Metrics { keep_alive }) => {
                    let text = crate::transport::http::metrics::render(&self.metrics());
                    if let (Some(door), Some(Some(c))) =
                        (self.http.as_mut(), self.conns.get_mut(slot))
                        && let Wire::Http(h) = &mut c.wire
                    {
                        door.write_metrics(h, &text, keep_alive, &mut c.out);
                    }
                }
                Some(Step::Seat { principal }) => {
                    let seated = self.seat_http(slot, &principal, now);
                    if let (Some(door), Some(Some(c))) =
                        (self.http.as_mut(), self.conns.get_mut(slot))
                        && let Wire::Http(h) = &mut c.wire
                    {
                        door.seated(h, seated, &mut c.out, now);
                    }
                }
                Some(Step::CancelElsewhere {
                    target,
                    principal,
                    payload,
                }) => self.cancel_elsewhere(target, principal, &payload, now),
                _ => break,
            }
        }
        self.flush_conn(slot);
        // The socket took what waited: read on at once (no writable edge will come).
        if output_paused
            && self.conns[slot]
                .as_ref()
                .is_some_and(|c| c.queued() <= max_output)
        {
            self.doors.yielded = true;
        }
    }
}
