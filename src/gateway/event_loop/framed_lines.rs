//! The servicer of framed (unix, vsock) and line (stdio) connections: read, decode, hand
//! each message to the core while the in-flight and output bounds allow.

use super::*;

impl Gateway {
    /// Read and hand messages to the core while the bounds allow.
    pub(super) fn service_conn(&mut self, slot: usize, now: Instant) {
        let limits = self.config.gateway.clone();
        let Some(Some(c)) = self.conns.get_mut(slot) else {
            return;
        };
        let conn = ConnRef {
            slot,
            generation: c.generation,
        };
        let is_stdio = matches!(c.io, ConnIo::Stdio);
        // Lingering, or kept only to be refused: nothing it sends is served.
        if c.guard.lingering_since.is_some()
            || (c.guard.close_when_drained && !matches!(c.wire, Wire::Http(_)))
        {
            self.discard_input(slot);
            return;
        }
        if matches!(c.wire, Wire::Admin(_)) {
            self.service_admin(slot);
            return;
        }
        if matches!(c.wire, Wire::Http(_)) {
            self.service_http(slot, now);
            return;
        }
        // Fairness: this many messages and reads, then the other connections' turn.
        let mut budget = limits.max_messages_per_turn;
        // A read that returned less than it had room for emptied the socket: reading again
        // would only fetch `WouldBlock` (a system call per message at one message per
        // read). Data that arrives later raises a new readiness event (edge-triggered
        // epoll signals every arrival; see epoll(7) on short reads of stream sockets). A
        // hang-up may have come with the data in the same event, so a connection that
        // hung up is read to its end as before.
        let mut emptied = false;
        loop {
            let Some(Some(c)) = self.conns.get_mut(slot) else {
                return;
            };
            // The large frame a grant was for has been handed over: give it back.
            if let Wire::Framed(inb) = &c.wire {
                self.doors
                    .release_spent(Door::Framed, inb.needed(), &mut c.grant);
            }
            if !self.serving {
                c.paused = true;
                return;
            }
            if budget == 0 {
                c.paused = true;
                self.doors.yielded = true;
                return;
            }
            budget -= 1;
            // Bounds: in flight here, in flight everywhere, and output not drained.
            let queued = if is_stdio {
                self.stdio.as_ref().map_or(0, StdioSide::pending)
            } else {
                c.queued()
            };
            if self.core.in_flight(conn) >= limits.max_in_flight_per_connection
                || self.core.in_flight_total() >= limits.max_in_flight_total
                || queued > limits.max_write_buffer_bytes
            {
                c.paused = true;
                // The agent hung up while its calls fill a bound, so its EOF is not read
                // yet: its held asks can no longer be answered and end now, as at EOF
                // (what it sent before is still read once the bound clears).
                if c.hung_up && !c.hang_up_reported && !is_stdio {
                    c.hang_up_reported = true;
                    self.core.on_agent_eof(conn, now);
                }
                return;
            }
            c.paused = false;
            // Hand over one buffered message, if there is one.
            match &mut c.wire {
                Wire::Framed(inb) => match inb.next_inbound() {
                    Some(Inbound::Message {
                        stream,
                        expect,
                        process,
                        payload,
                    }) => {
                        let peer = &c.peer;
                        let process = if process.is_empty() {
                            peer.process.as_str()
                        } else {
                            process
                        };
                        self.core
                            .on_message(conn, peer, process, expect, stream, payload, now);
                        self.frame_handed_over(slot, now);
                        continue;
                    }
                    Some(Inbound::Refuse { stream, bytes }) => {
                        framed::encode_reply(&mut c.out, stream, false, &bytes);
                        self.flush_conn(slot);
                        self.frame_handed_over(slot, now);
                        continue;
                    }
                    Some(Inbound::Close(why)) => {
                        crate::warn!(
                            "closing {} connection of {}: {why}",
                            c.peer.transport.as_str(),
                            c.peer.principal
                        );
                        // The calls it sent before the broken frame were taken and are
                        // answered, however its writes were batched.
                        let message = crate::mcp::jsonrpc::error_response(
                            None,
                            crate::mcp::jsonrpc::INVALID_REQUEST,
                            &why,
                            None,
                        );
                        self.tell_framed_and_close(slot, &message);
                        return;
                    }
                    None => {}
                },
                Wire::Lines(inb) => match inb.next_line() {
                    Some(Line::Message(payload)) => {
                        let peer = &c.peer;
                        self.core.on_message(
                            conn,
                            peer,
                            &peer.process,
                            Expect::Any,
                            0,
                            payload,
                            now,
                        );
                        continue;
                    }
                    Some(Line::Refuse(bytes)) => {
                        self.core.push_raw(conn, bytes);
                        continue;
                    }
                    None => {}
                },
                Wire::Admin(_) | Wire::Http(_) => return,
            }
            // Nothing whole is buffered: read more.
            if c.read_closed || c.broken {
                return;
            }
            if emptied && !c.hung_up {
                // As at `WouldBlock`: every whole message is handed over.
                if let Wire::Framed(inb) = &c.wire
                    && !inb.has_partial()
                {
                    c.partial_since = None;
                }
                return;
            }
            if is_stdio {
                let Some(side) = self.stdio.as_mut() else {
                    return;
                };
                match side.try_input() {
                    Some(chunk) if chunk.is_empty() => {
                        c.read_closed = true;
                        return;
                    }
                    Some(chunk) => {
                        if let Wire::Lines(inb) = &mut c.wire {
                            inb.push(&chunk);
                        }
                    }
                    None => return,
                }
                continue;
            }
            let Wire::Framed(inb) = &mut c.wire else {
                return;
            };
            if inb.is_closed() {
                return;
            }
            // Room: the small allowance, or a grant for the whole frame arriving; without
            // one, reading pauses (the kernel holds the rest) until a grant is given back.
            let cap = match self.doors.room_for(
                Door::Framed,
                &c.peer.principal,
                inb.needed(),
                &mut c.grant,
                &mut c.awaiting_grant,
                now,
            ) {
                doors::Room::Small(cap) | doors::Room::Granted(cap) => cap,
                doors::Room::Wait => {
                    c.paused = true;
                    return;
                }
                doors::Room::Never(size) => {
                    crate::warn!(
                        "closing {} connection of {}: a frame of {size} bytes is larger than \
                         gateway.max_partial_bytes_per_peer allows",
                        c.peer.transport.as_str(),
                        c.peer.principal
                    );
                    c.broken = true;
                    return;
                }
            };
            let spare = inb.spare_within(cap);
            if spare.is_empty() {
                c.paused = true;
                return;
            }
            let spare_len = spare.len();
            match c.io.read(spare) {
                Ok(0) => {
                    inb.filled(0);
                    c.read_closed = true;
                    return;
                }
                Ok(n) => {
                    emptied = n < spare_len;
                    inb.filled(n);
                    c.guard.on_read(n, now);
                    if inb.has_partial() {
                        if c.partial_since.is_none() {
                            c.partial_since = Some(now);
                        }
                    } else {
                        c.partial_since = None;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    inb.filled(0);
                    if !inb.has_partial() {
                        c.partial_since = None;
                    }
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => inb.filled(0),
                Err(_) => {
                    inb.filled(0);
                    c.broken = true;
                    return;
                }
            }
        }
    }

    /// The frame deadline runs from the start of the frame now arriving, not of the first
    /// one of a run of reads that each end one frame and begin the next.
    fn frame_handed_over(&mut self, slot: usize, now: Instant) {
        if let Some(Some(c)) = self.conns.get_mut(slot)
            && let Wire::Framed(inb) = &c.wire
        {
            c.partial_since = inb.has_partial().then_some(now);
        }
    }
}
