//! Admission at accept: a seat in the budgets, else room made by displacing a connection
//! that has not proven anything, else a refusal the client can read.

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::time::Instant;

use mio::Token;
use mio::unix::SourceFd;

use super::super::{CONN_BASE, ConnIo, Gateway, Wire};
use super::{DISPLACE_TRIES, admin_refusal, framed_refusal, out_of_descriptors};
use crate::gateway::core::Peer;
use crate::gateway::door_limits::{ConnGuard, Door, Full, Seat, Stage};
use crate::gateway::http_door::HttpDoor;
use crate::gateway::listeners::{self, Listener};
use crate::policy::Transport;
use crate::transport::framed::FramedInbound;
use crate::transport::lines::LineInbound;
use crate::transport::write_interest::WriteInterest;

impl Gateway {
    /// Accept every waiting connection of listener `index`.
    pub(in crate::gateway::event_loop) fn accept(&mut self, index: usize) {
        loop {
            let now = Instant::now();
            // A unix peer's pid: its process name is read only once it is admitted.
            let mut process_of = None;
            let accepted = match self.listeners.get_mut(index) {
                Some(Listener::Unix { socket, .. }) => match socket.accept() {
                    Ok((stream, _)) => {
                        let (peer, pid) = unix_peer(&stream);
                        process_of = pid;
                        Ok((ConnIo::Unix(stream), peer))
                    }
                    Err(e) => Err(e),
                },
                Some(Listener::Http { socket, .. }) => match socket.accept() {
                    Ok((stream, addr)) => {
                        let _ = stream.set_nodelay(true);
                        Ok((
                            ConnIo::Tcp(stream),
                            Peer {
                                transport: Transport::Http,
                                principal: format!("tcp:{addr}"),
                                process: "http".into(),
                            },
                        ))
                    }
                    Err(e) => Err(e),
                },
                Some(Listener::Vsock { socket, .. }) => match socket.accept() {
                    Ok((stream, addr)) => match stream.set_nonblocking(true) {
                        Ok(()) => Ok((
                            ConnIo::Vsock(stream),
                            Peer {
                                transport: Transport::Vsock,
                                principal: format!("cid:{}", addr.cid()),
                                process: "unknown".into(),
                            },
                        )),
                        Err(e) => {
                            crate::warn!("vsock connection: {e}");
                            continue;
                        }
                    },
                    Err(e) => Err(e),
                },
                None => return,
            };
            let (io, mut peer) = match accepted {
                Ok(a) => a,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    if out_of_descriptors(&e) {
                        self.doors.accept_retry.push(index);
                        self.doors.arm(now);
                    }
                    self.doors.note("accept_error", now, |more| {
                        format!("accept: {e} ({more} more since)")
                    });
                    return;
                }
            };
            let door = if matches!(io, ConnIo::Tcp(_)) {
                Door::Http
            } else {
                Door::Framed
            };
            // Framed peers are known at accept (uid, cid); HTTP principals once a head
            // names one.
            let key = (door == Door::Framed).then(|| peer.principal.clone());
            match self.admit_agent(door, key.as_deref(), now) {
                Ok(seat) => {
                    if let Some(name) = process_of.and_then(listeners::process_name) {
                        peer.process = name;
                    }
                    let wire = match &io {
                        ConnIo::Tcp(_) => match self.http.as_ref().map(HttpDoor::new_conn) {
                            Some(Ok(h)) => Wire::Http(Box::new(h)),
                            Some(Err(e)) => {
                                crate::warn!("http connection: {e}");
                                self.doors.budgets.release(seat);
                                continue;
                            }
                            None => {
                                self.doors.budgets.release(seat);
                                continue;
                            }
                        },
                        _ => Wire::Framed(FramedInbound::new()),
                    };
                    self.open_conn(io, wire, peer, ConnGuard::new(door, Some(seat), now));
                }
                Err(full) => self.refuse_new(io, peer, door, full, now),
            }
        }
    }

    /// Accept every waiting admin connection: its own reserve, never the agents'.
    pub(in crate::gateway::event_loop) fn accept_admin(&mut self) {
        loop {
            let now = Instant::now();
            let Some(l) = self.admin.as_mut() else { return };
            let stream = match l.accept() {
                Ok((stream, _)) => stream,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    if out_of_descriptors(&e) {
                        self.doors.accept_retry.push(usize::MAX);
                        self.doors.arm(now);
                    }
                    self.doors.note("admin_accept_error", now, |more| {
                        format!("accept on admin socket: {e} ({more} more since)")
                    });
                    return;
                }
            };
            let principal = listeners::unix_peer(&stream)
                .map(|(uid, _)| format!("uid:{uid}"))
                .unwrap_or_else(|| "unknown".into());
            let peer = Peer {
                transport: Transport::Unix,
                principal,
                process: "admin".into(),
            };
            // A full reserve first gives up its oldest connection that has said nothing: a
            // silent one cannot hold the operator's way in (it may read first).
            let seat = match self.doors.budgets.admit_admin() {
                Err(Full::Admin) if self.displace_silent_admin(now) => {
                    self.doors.budgets.admit_admin()
                }
                other => other,
            };
            match seat {
                Ok(seat) => {
                    self.open_conn(
                        ConnIo::Unix(stream),
                        Wire::Admin(LineInbound::new()),
                        peer,
                        ConnGuard::new(Door::Admin, Some(seat), now),
                    );
                }
                Err(full) => self.refuse_new(ConnIo::Unix(stream), peer, Door::Admin, full, now),
            }
        }
    }

    /// Insert and register a connection; arm the sweep.
    fn open_conn(&mut self, io: ConnIo, wire: Wire, peer: Peer, guard: ConnGuard) -> Option<usize> {
        let now = guard.opened;
        let slot = self.insert_conn(io, wire, peer, guard);
        let token = Token(CONN_BASE + slot);
        let registered = match self.conns[slot].as_mut().map(|c| &mut c.io) {
            Some(ConnIo::Unix(s)) => {
                self.poll
                    .registry()
                    .register(s, token, WriteInterest::INITIAL)
            }
            Some(ConnIo::Tcp(s)) => self
                .poll
                .registry()
                .register(s, token, WriteInterest::INITIAL),
            Some(ConnIo::Vsock(s)) => self.poll.registry().register(
                &mut SourceFd(&s.as_raw_fd()),
                token,
                WriteInterest::INITIAL,
            ),
            _ => Ok(()),
        };
        if let Err(e) = registered {
            crate::warn!("register connection: {e}");
            self.close_conn(slot);
            return None;
        }
        self.doors.arm(now);
        Some(slot)
    }

    /// A seat for a new agent connection, making room if a connection that has said
    /// nothing (or an idle HTTP keep-alive one) can give up its own.
    fn admit_agent(&mut self, door: Door, key: Option<&str>, now: Instant) -> Result<Seat, Full> {
        match self.doors.budgets.admit_agent(door, key) {
            Ok(seat) => Ok(seat),
            Err(full) => {
                let among = match full {
                    Full::FramedDoor => Some((Door::Framed, None)),
                    Full::HttpDoor => Some((Door::Http, None)),
                    _ => Some((door, key)),
                };
                if self.displace(among, None, full, now) {
                    self.doors.budgets.admit_agent(door, key)
                } else {
                    Err(full)
                }
            }
        }
    }

    /// Close one agent connection to make room: the oldest that has not proven anything
    /// yet — a framed one that sent no byte, an HTTP one with no head authenticated (silent, or a
    /// head still trickling in) — read first in case its bytes are already here; else the
    /// HTTP connection idle longest between requests. `among` narrows it to a door and a
    /// peer or principal; `except` is the connection asking; `full` is the limit that
    /// applied, which the displaced connection's refusal names (a peer's share, not the
    /// door's, when the peer's share was full). Returns whether one was closed.
    fn displace(
        &mut self,
        among: Option<(Door, Option<&str>)>,
        except: Option<usize>,
        full: Full,
        now: Instant,
    ) -> bool {
        let fits = |c: &super::super::Conn| {
            let Some(seat) = c.guard.seat.as_ref().filter(|s| s.is_agent()) else {
                return false;
            };
            match among {
                None => true,
                Some((door, None)) => seat.door() == door,
                Some((door, Some(key))) => seat.door() == door && seat.key() == Some(key),
            }
        };
        // Unproven ones, oldest first.
        let unproven = |c: &super::super::Conn| match &c.wire {
            Wire::Http(h) => !h.authenticated() && !h.is_waiting(),
            _ => !c.guard.read_any,
        };
        let mut silent: Vec<(Instant, usize)> = self
            .conns
            .iter()
            .enumerate()
            .filter_map(|(slot, c)| {
                let c = c.as_ref()?;
                (Some(slot) != except
                    && fits(c)
                    && unproven(c)
                    && c.guard.lingering_since.is_none()
                    && !c.broken)
                    .then_some((c.guard.opened, slot))
            })
            .collect();
        silent.sort_unstable();
        for (_, slot) in silent.into_iter().take(DISPLACE_TRIES) {
            self.service_conn(slot, now);
            let still_silent = self.conns[slot]
                .as_ref()
                .is_some_and(|c| unproven(c) && !c.broken && c.guard.lingering_since.is_none());
            if still_silent {
                self.retire(slot, Some(full), now);
                return true;
            }
        }
        // HTTP keep-alive connections idle between requests, longest idle first: closing
        // one is what HTTP expects of a server, and its client reconnects.
        let idle = self
            .conns
            .iter()
            .enumerate()
            .filter_map(|(slot, c)| {
                let c = c.as_ref()?;
                let Wire::Http(h) = &c.wire else { return None };
                let Stage::Idle { since } = h.stage() else {
                    return None;
                };
                (Some(slot) != except
                    && fits(c)
                    && c.queued() == 0
                    && c.guard.lingering_since.is_none()
                    && !c.broken)
                    .then_some((since, slot))
            })
            .min();
        if let Some((_, slot)) = idle {
            self.retire(slot, None, now);
            return true;
        }
        false
    }

    /// Make room in the admin reserve: close the admin connection that has waited
    /// longest with nothing to answer — one that sent no byte first, else the one idle
    /// longest (a partial line counts as idle: an operator's command is one short line).
    /// Each is read first, in case its command is here. Returns whether one was closed.
    fn displace_silent_admin(&mut self, now: Instant) -> bool {
        let silent = |c: &super::super::Conn| {
            c.guard.door == Door::Admin
                && c.queued() == 0
                && c.guard.lingering_since.is_none()
                && !c.broken
                && c.guard.seat.as_ref().is_some_and(|s| !s.is_agent())
        };
        let mut oldest: Vec<(bool, Instant, usize)> = self
            .conns
            .iter()
            .enumerate()
            .filter_map(|(slot, c)| {
                let c = c.as_ref()?;
                silent(c).then_some((c.guard.read_any, c.guard.last_activity, slot))
            })
            .collect();
        oldest.sort_unstable();
        for (_, _, slot) in oldest.into_iter().take(DISPLACE_TRIES) {
            self.service_conn(slot, now);
            if self.conns[slot].as_ref().is_some_and(silent) {
                self.retire(slot, Some(Full::Admin), now);
                return true;
            }
        }
        false
    }

    /// Give up a connection's seat now: with a refusal to read (it lingers) when `refusal`
    /// is set, else closed at once (an idle keep-alive connection: a clean close).
    fn retire(&mut self, slot: usize, refusal: Option<Full>, now: Instant) {
        let Some(Some(c)) = self.conns.get_mut(slot) else {
            return;
        };
        let door = c.guard.door;
        self.doors.tally.displaced(door);
        self.doors.note("displaced", now, |more| {
            format!(
                "closing a {} connection of {} that had not sent a request, to make room ({more} more since)",
                door.as_str(),
                c.peer.principal
            )
        });
        let Some(full) = refusal else {
            c.broken = true;
            self.close_conn(slot);
            return;
        };
        let retry = self.doors.budgets.limits().retry_after_secs;
        match &mut c.wire {
            Wire::Http(h) => {
                let busy = crate::transport::http::endpoint::busy_response(full.key(), retry);
                if let Some(d) = self.http.as_mut() {
                    d.count_response(busy.status);
                }
                c.out.extend_from_slice(&busy.bytes);
                h.closing = true;
            }
            Wire::Framed(_) => c.out.extend_from_slice(&framed_refusal(full, retry)),
            Wire::Admin(_) => c.out.extend_from_slice(&admin_refusal(full)),
            _ => {}
        }
        // It lingers once its refusal is written (close_finished); its seat is free now.
        c.guard.close_when_drained = true;
        if let Some(seat) = c.guard.seat.take() {
            self.doors.budgets.release(seat);
        }
        self.flush_conn(slot);
    }

    /// A new connection beyond a limit: told so in its own protocol, then closed after a
    /// linger (or at once when too many linger already).
    fn refuse_new(&mut self, mut io: ConnIo, peer: Peer, door: Door, full: Full, now: Instant) {
        self.doors.tally.refused(door, full);
        self.doors.note(full.reason(), now, |more| {
            format!(
                "refusing a {} connection from {}: {} ({more} more since)",
                door.as_str(),
                peer.principal,
                full.key()
            )
        });
        let retry = self.doors.budgets.limits().retry_after_secs;
        let seat = self.doors.budgets.admit_lingering(door);
        let Ok(seat) = seat else {
            // No room even to linger: say it, shut the write side, drop what already
            // arrived (so the close is not a reset for data we never read), close.
            self.doors.tally.refused(door, Full::Lingering);
            let bytes = match door {
                Door::Http => {
                    crate::transport::http::endpoint::busy_response(full.key(), retry).bytes
                }
                Door::Admin => admin_refusal(full),
                _ => framed_refusal(full, retry),
            };
            let _ = io.write(&bytes);
            io.shutdown_write();
            let mut sink = [0u8; 4096];
            while matches!(io.read(&mut sink), Ok(n) if n > 0) {}
            return;
        };
        let mut guard = ConnGuard::new(door, Some(seat), now);
        let wire = match door {
            // The door is full, but its client still gets an HTTP answer to its request:
            // `/health`, or 503 with Retry-After.
            Door::Http => match self.http.as_ref().map(|d| d.refusing_conn(full.key())) {
                Some(Ok(h)) => Wire::Http(Box::new(h)),
                _ => return,
            },
            Door::Admin => Wire::Admin(LineInbound::new()),
            _ => Wire::Framed(FramedInbound::new()),
        };
        if door != Door::Http {
            guard.close_when_drained = true;
        }
        let Some(slot) = self.open_conn(io, wire, peer, guard) else {
            return;
        };
        if let Some(Some(c)) = self.conns.get_mut(slot) {
            match door {
                Door::Admin => c.out.extend_from_slice(&admin_refusal(full)),
                Door::Framed => c.out.extend_from_slice(&framed_refusal(full, retry)),
                _ => {}
            }
        }
        self.flush_conn(slot);
        if door == Door::Http {
            self.service_conn(slot, now);
        }
    }

    /// An HTTP head authenticated `principal`: count the connection for it. Beyond the
    /// principal's share, one of its own idle keep-alive connections makes room if it can.
    pub(in crate::gateway::event_loop) fn seat_http(
        &mut self,
        slot: usize,
        principal: &str,
        now: Instant,
    ) -> bool {
        let Some(Some(c)) = self.conns.get_mut(slot) else {
            return false;
        };
        let Some(seat) = c.guard.seat.as_mut() else {
            return false;
        };
        if !seat.is_agent() {
            return false;
        }
        match self.doors.budgets.bind(seat, principal) {
            Ok(()) => true,
            Err(full) => {
                if self.displace(Some((Door::Http, Some(principal))), Some(slot), full, now)
                    && let Some(Some(c)) = self.conns.get_mut(slot)
                    && let Some(seat) = c.guard.seat.as_mut()
                    && self.doors.budgets.bind(seat, principal).is_ok()
                {
                    return true;
                }
                self.doors.tally.refused(Door::Http, full);
                self.doors.note(full.reason(), now, |more| {
                    format!(
                        "refusing a request of {principal}: {} ({more} more since)",
                        full.key()
                    )
                });
                false
            }
        }
    }
}

/// Who a unix peer is (`uid:N`, from SO_PEERCRED), and its pid.
fn unix_peer(stream: &mio::net::UnixStream) -> (Peer, Option<i32>) {
    let cred = listeners::unix_peer(stream);
    let peer = Peer {
        transport: Transport::Unix,
        principal: cred.map_or_else(|| "unknown".into(), |(uid, _)| format!("uid:{uid}")),
        process: "unknown".into(),
    };
    (peer, cred.map(|(_, pid)| pid))
}
