//! The servicer of admin connections: JSON lines to `gateway::admin`, never an agent.

use super::*;

impl Gateway {
    pub(super) fn service_admin(&mut self, slot: usize) {
        let mut requests = Vec::new();
        {
            let Some(Some(c)) = self.conns.get_mut(slot) else {
                return;
            };
            let mut buf = [0u8; 16 * 1024];
            loop {
                match c.io.read(&mut buf) {
                    Ok(0) => {
                        c.read_closed = true;
                        break;
                    }
                    Ok(n) => {
                        c.guard.on_read(n, Instant::now());
                        if let Wire::Admin(inb) = &mut c.wire {
                            inb.push(&buf[..n]);
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        c.broken = true;
                        break;
                    }
                }
            }
            if let Wire::Admin(inb) = &mut c.wire {
                while let Some(line) = inb.next_line() {
                    match line {
                        Line::Message(bytes) => requests.push(bytes.to_vec()),
                        Line::Refuse(_) => c.broken = true,
                    }
                }
            }
        }
        for request in requests {
            let principal = match &self.conns[slot] {
                Some(c) => c.peer.principal.clone(),
                None => return,
            };
            let mut reply = admin::handle(self, &principal, &request)
                .to_string()
                .into_bytes();
            reply.push(b'\n');
            if let Some(Some(c)) = self.conns.get_mut(slot) {
                c.out.extend_from_slice(&reply);
            }
            self.flush_conn(slot);
        }
    }
}
