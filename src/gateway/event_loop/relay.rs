//! Delivering what a server sent during a call (the core's `Action::Relay`): framed doors
//! carry it on stream 0 as a notification frame (the relay writes it to its agent), line
//! doors as a line, the HTTP door in the event stream of the request it serves.

use super::{ConnIo, Gateway, Wire};
use crate::gateway::core::ConnRef;
use crate::transport::framed;

impl Gateway {
    pub(super) fn deliver_relay(&mut self, conn: ConnRef, bytes: &[u8], request_id: Option<&str>) {
        let Some(Some(c)) = self.conns.get_mut(conn.slot) else {
            return;
        };
        if c.generation != conn.generation || c.broken {
            return;
        }
        match (&c.io, &mut c.wire) {
            (ConnIo::Stdio, _) | (_, Wire::Lines(_)) => {
                if !crate::transport::lines::is_one_line(bytes) {
                    crate::error!("a relayed message with a raw line break was withheld");
                    return;
                }
                if matches!(c.io, ConnIo::Stdio) {
                    if let Some(side) = self.stdio.as_mut() {
                        side.write(bytes.to_vec());
                    }
                    return;
                }
                c.out.extend_from_slice(bytes);
                c.out.push(b'\n');
            }
            (_, Wire::Framed(_)) => framed::encode_reply(&mut c.out, 0, true, bytes),
            (_, Wire::Http(h)) => {
                let Some(door) = self.http.as_mut() else {
                    return;
                };
                door.relay(h, conn, bytes, request_id, &mut c.out);
            }
            (_, Wire::Admin(_)) => return,
        }
        self.to_flush.push(conn.slot);
    }
}
