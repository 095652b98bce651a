//! The loop's side of the doors' budgets and deadlines: admission at accept (a seat, else
//! room made by displacing a connection that has not said anything, else a refusal the
//! client can read), the sweep that closes connections past their stage deadline, and
//! lingering closes. The decisions are the sans-IO [`door_limits`](crate::gateway::door_limits);
//! this file only applies them to sockets.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use mio::Token;
use mio::unix::SourceFd;

use super::{CONN_BASE, ConnIo, Gateway, Wire};
use crate::gateway::core::{ConnRef, Expect, Peer};
use crate::gateway::door_limits::{
    Budgets, Check, ConnGuard, Door, DoorLimits, Expiry, Facts, Finish, FinishFacts, Full, Seat,
    Stage, Tally, deadline, finish,
};
use crate::gateway::http_door::HttpDoor;
use crate::gateway::listeners::{self, Listener};
use crate::mcp::jsonrpc;
use crate::policy::Transport;
use crate::transport::framed::{self, FramedInbound};
use crate::transport::lines::LineInbound;
use crate::transport::write_interest::WriteInterest;

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
    pub tally: Tally,
    /// The next sweep of every connection's deadlines: armed by the first accept.
    pub check_at: Option<Instant>,
    /// Listeners (by index; `usize::MAX` is the admin socket) whose accept ran out of
    /// descriptors: accepted again at the next sweep, since no new readiness edge may come.
    accept_retry: Vec<usize>,
    /// Per limit: when its refusals were last logged, and how many since.
    logged: std::collections::HashMap<&'static str, (Instant, u64)>,
}

impl DoorState {
    pub fn new(limits: DoorLimits) -> DoorState {
        DoorState {
            budgets: Budgets::new(limits),
            tally: Tally::default(),
            check_at: None,
            accept_retry: Vec::new(),
            logged: std::collections::HashMap::new(),
        }
    }

    fn arm(&mut self, now: Instant) {
        let at = now + SWEEP_EVERY;
        if self.check_at.is_none_or(|t| t > at) {
            self.check_at = Some(at);
        }
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
             (gateway.max_connections + admin.max_connections + gateway.max_lingering + \
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
    // ---- accept -------------------------------------------------------------------

    /// Accept every waiting connection of listener `index`.
    pub(super) fn accept(&mut self, index: usize) {
        loop {
            let now = Instant::now();
            let accepted = match self.listeners.get_mut(index) {
                Some(Listener::Unix { socket, .. }) => match socket.accept() {
                    Ok((stream, _)) => {
                        let peer = unix_peer(&stream);
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
            let (io, peer) = match accepted {
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
    pub(super) fn accept_admin(&mut self) {
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
            match self.doors.budgets.admit_admin() {
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
                    Full::Agents => None,
                    Full::HttpDoor => Some((Door::Http, None)),
                    _ => Some((door, key)),
                };
                if self.displace(among, None, now) {
                    self.doors.budgets.admit_agent(door, key)
                } else {
                    Err(full)
                }
            }
        }
    }

    /// Close one agent connection to make room: the oldest that has not proven anything
    /// yet — a framed one that sent no byte, an HTTP one with no head judged (silent, or a
    /// head still trickling in) — read first in case its bytes are already here; else the
    /// HTTP connection idle longest between requests. `among` narrows it to a door and a
    /// peer or principal; `except` is the connection asking. Returns whether one was closed.
    fn displace(
        &mut self,
        among: Option<(Door, Option<&str>)>,
        except: Option<usize>,
        now: Instant,
    ) -> bool {
        let fits = |c: &super::Conn| {
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
        let unproven = |c: &super::Conn| match &c.wire {
            Wire::Http(h) => !h.judged() && !h.is_waiting(),
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
                self.retire(slot, Some(Full::Agents), now);
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
            _ => {}
        }
        c.guard.close_when_drained = true;
        if let Some(seat) = c.guard.seat.take() {
            self.doors.budgets.release(seat);
        }
        self.flush_conn(slot);
        self.begin_linger(slot, now);
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
    pub(super) fn seat_http(&mut self, slot: usize, principal: &str, now: Instant) -> bool {
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
                if self.displace(Some((Door::Http, Some(principal))), Some(slot), now)
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

    /// A legacy cancel (or an answer to a relayed request) arrived on one connection for a
    /// call another connection of the same session holds: the core hears it as from that
    /// connection. If it cancelled the call, that connection owes no answer: its event
    /// stream ends without one.
    pub(super) fn cancel_elsewhere(
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

    /// Seats taken and their limits, for `toolwall status`.
    pub fn door_seats(&self) -> serde_json::Value {
        let (agents, http, admin, lingering) = self.doors.budgets.counts();
        let l = self.doors.budgets.limits();
        serde_json::json!({
            "agents": {"taken": agents, "limit": l.agents},
            "http": {"taken": http, "limit": l.http},
            "admin": {"taken": admin, "limit": l.admin},
            "lingering": {"taken": lingering, "limit": l.lingering},
        })
    }

    // ---- deadlines ----------------------------------------------------------------

    /// What [`deadline::check`] needs about connection `slot`.
    fn facts(&self, slot: usize, c: &super::Conn) -> Facts {
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
                // Not read this turn by our choice (a bound, or the answer just written).
                Wire::Http(h) if c.paused && !h.closing => Stage::Busy,
                Wire::Http(h) => h.stage(),
                Wire::Framed(_) if !c.guard.read_any => Stage::Opening,
                Wire::Framed(_) => match c.partial_since {
                    Some(since) if !c.paused => Stage::Partial { since },
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
            judged: matches!(&c.wire, Wire::Http(h) if h.judged()),
            write_blocked_since: c.guard.write_blocked_since,
        }
    }

    /// Close every connection past its stage's deadline; retry accepts that ran out of
    /// descriptors. Armed from the first accept, then at least once a second while any
    /// connection is open.
    pub(super) fn sweep_doors(&mut self, now: Instant) {
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
        let answer_408 = matches!(why, Expiry::Head | Expiry::Body | Expiry::Auth)
            && c.guard.lingering_since.is_none();
        match (&mut c.wire, self.http.as_mut()) {
            (Wire::Http(h), Some(d)) if answer_408 => {
                d.time_out(h, &mut c.out);
                self.flush_conn(slot);
            }
            _ => c.broken = true,
        }
    }

    // ---- closing ------------------------------------------------------------------

    /// Close the connections that are done; connections whose last answer was written
    /// linger first.
    pub(super) fn close_finished(&mut self) {
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
            let facts = FinishFacts {
                broken: c.broken,
                read_closed: c.read_closed,
                idle: self.core.in_flight(conn) == 0,
                drained: c.queued() == 0,
                last_answer: c.guard.close_when_drained
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
    pub(super) fn discard_input(&mut self, slot: usize) {
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
    pub(super) fn on_conn_closing(&mut self, slot: usize, now: Instant) {
        let Some(Some(c)) = self.conns.get_mut(slot) else {
            return;
        };
        if let Some(seat) = c.guard.seat.take() {
            self.doors.budgets.release(seat);
        }
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

/// Who a unix peer is: `uid:N` and its process name, from SO_PEERCRED.
fn unix_peer(stream: &mio::net::UnixStream) -> Peer {
    let (principal, process) = match listeners::unix_peer(stream) {
        Some((uid, pid)) => (
            format!("uid:{uid}"),
            listeners::process_name(pid).unwrap_or_else(|| "unknown".into()),
        ),
        None => ("unknown".into(), "unknown".into()),
    };
    Peer {
        transport: Transport::Unix,
        principal,
        process,
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
