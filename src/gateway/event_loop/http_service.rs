//! The servicer of HTTP connections: one request at a time to the core, `/health` and
//! `/metrics` answered here.

use super::*;

impl Gateway {
    /// An HTTP connection: read, parse, hand one request at a time to the core.
    pub(super) fn service_http(&mut self, slot: usize, now: Instant) {
        loop {
            let step = {
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
                if !self.serving
                    || self.core.in_flight_total() >= self.config.gateway.max_in_flight_total
                    || queued > self.config.gateway.max_write_buffer_bytes
                {
                    c.paused = true;
                    return;
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
                    let room = door.read_room(h).min(16 * 1024);
                    if c.read_closed || c.broken || h.closing || room == 0 {
                        break None;
                    }
                    let mut buf = [0u8; 16 * 1024];
                    match c.io.read(&mut buf[..room]) {
                        Ok(0) => {
                            c.read_closed = true;
                            if h.is_waiting() && h.pending_is_modern() {
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
    }
}
