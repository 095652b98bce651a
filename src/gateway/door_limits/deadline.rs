//! Deadlines by stage. Every connection is always in a stage whose deadline is bounded, or
//! busy with work the core bounds itself (a call in flight has its own timeout), so no
//! state exists in which a quiet peer holds a seat forever. Output that the peer does not
//! take is bounded separately (write stall), whatever the stage.

use std::time::{Duration, Instant};

use super::budget::Seat;
use super::settings::{Door, DoorLimits};

/// What a connection is doing, as the loop sees it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Accepted; nothing read yet.
    Opening,
    /// HTTP: a request head (or the TLS handshake) arriving since `since`.
    Head { since: Instant },
    /// HTTP: the body of an accepted head arriving since `since`.
    Body { since: Instant },
    /// Framed: a frame arriving since `since`.
    Partial { since: Instant },
    /// Work in flight for it (a call with the core); the core's own deadlines bound it.
    Busy,
    /// Between requests since `since`.
    Idle { since: Instant },
    /// Its last answer is being written before a close.
    Closing,
    /// Half-closed after an error answer or a refusal; input is read and dropped.
    Lingering { since: Instant },
}

/// Which deadline passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Expiry {
    Accept,
    Auth,
    Head,
    Body,
    Frame,
    Idle,
    WriteStall,
    /// The lingering time is over (not a fault: the connection was ending anyway).
    Linger,
}

impl Expiry {
    /// The `reason` label of `toolwall_connections_closed_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Expiry::Accept => "accept_timeout",
            Expiry::Auth => "auth_timeout",
            Expiry::Head => "head_timeout",
            Expiry::Body => "body_timeout",
            Expiry::Frame => "frame_timeout",
            Expiry::Idle => "idle_timeout",
            Expiry::WriteStall => "write_stall",
            Expiry::Linger => "lingered",
        }
    }

    /// The config key that set the deadline, for the log line.
    pub fn key(self, door: Door) -> &'static str {
        match (self, door) {
            (Expiry::Accept, Door::Http) => "http.accept_timeout_secs",
            (Expiry::Accept, Door::Admin) | (Expiry::Idle, Door::Admin) => "admin.timeout_secs",
            (Expiry::WriteStall, Door::Admin) => "admin.timeout_secs",
            (Expiry::Accept, _) => "gateway.accept_timeout_secs",
            (Expiry::Auth, _) => "http.auth_timeout_secs",
            (Expiry::Head, _) => "http.head_timeout_secs",
            (Expiry::Body, _) => "http.body_timeout_secs",
            (Expiry::Frame, _) => "gateway.frame_timeout_secs",
            (Expiry::Idle, Door::Http) => "http.keepalive_idle_secs",
            (Expiry::Idle, _) => "gateway.idle_timeout_secs",
            (Expiry::WriteStall, Door::Http) => "http.write_stall_secs",
            (Expiry::WriteStall, _) => "gateway.write_stall_secs",
            (Expiry::Linger, _) => "gateway.linger_secs",
        }
    }
}

/// One connection's facts that outlive a loop turn: when it opened, when it last moved
/// bytes, since when its output is stuck, and its seat.
#[derive(Debug, Clone)]
pub struct ConnGuard {
    pub door: Door,
    pub seat: Option<Seat>,
    pub opened: Instant,
    /// Whether any byte was read.
    pub read_any: bool,
    /// The last byte read or written.
    pub last_activity: Instant,
    /// Output has waited since then with none of it taken by the peer.
    pub write_blocked_since: Option<Instant>,
    /// A refusal (or a last answer) is queued: close once it is written, lingering first.
    pub close_when_drained: bool,
    /// Half-closed at this time; input is read and dropped until EOF or the deadline.
    pub lingering_since: Option<Instant>,
    /// The core was told of this connection (an agent's), so it must hear of its end.
    pub announced: bool,
}

impl ConnGuard {
    pub fn new(door: Door, seat: Option<Seat>, now: Instant) -> ConnGuard {
        ConnGuard {
            door,
            seat,
            opened: now,
            read_any: false,
            last_activity: now,
            write_blocked_since: None,
            close_when_drained: false,
            lingering_since: None,
            announced: false,
        }
    }

    /// `n` bytes were read.
    pub fn on_read(&mut self, n: usize, now: Instant) {
        if n > 0 {
            self.read_any = true;
            self.last_activity = now;
        }
    }

    /// A write pass took `written` bytes; `pending` says whether output still waits.
    pub fn on_write(&mut self, written: usize, pending: bool, now: Instant) {
        if written > 0 {
            self.last_activity = now;
        }
        self.write_blocked_since = match (pending, written > 0, self.write_blocked_since) {
            (false, _, _) => None,
            (true, true, _) | (true, false, None) => Some(now),
            (true, false, Some(since)) => Some(since),
        };
    }
}

/// What [`check`] needs about a connection now.
#[derive(Debug, Clone, Copy)]
pub struct Facts {
    pub door: Door,
    pub opened: Instant,
    pub stage: Stage,
    /// HTTP: a head authenticated a principal on this connection (the auth deadline no
    /// longer applies). `/health`, refused tokens and wrong routes do not count.
    pub authenticated: bool,
    /// HTTP, authenticated: the end of its last request that did authenticated work. The
    /// keep-alive deadline runs from it while the connection idles, and (plus the head
    /// deadline) while a head arrives, so requests that do no such work — `/health` sent
    /// again and again, or trickled — never keep the seat.
    pub last_work: Option<Instant>,
    pub write_blocked_since: Option<Instant>,
}

/// The outcome of [`check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// A deadline passed: close the connection.
    Expired(Expiry),
    /// The next deadline, if the stage has one.
    Due(Option<Instant>),
}

/// The earliest deadline a connection has now, or the one that passed.
pub fn check(f: &Facts, limits: &DoorLimits, now: Instant) -> Check {
    let Some(t) = limits.stages(f.door) else {
        return Check::Due(None);
    };
    let mut due: Vec<(Instant, Expiry)> = Vec::with_capacity(3);
    let mut add = |at: Instant, base: Duration, why: Expiry| due.push((at + base, why));
    if let Some(since) = f.write_blocked_since
        && !matches!(f.stage, Stage::Lingering { .. })
    {
        add(since, t.write_stall, Expiry::WriteStall);
    }
    let unauthenticated = f.door == Door::Http && !f.authenticated;
    match f.stage {
        Stage::Opening => add(f.opened, t.accept, Expiry::Accept),
        Stage::Head { since } => {
            if let Some(h) = t.head {
                add(since, h, Expiry::Head);
                if let Some(work) = f.last_work {
                    add(work, t.idle + h, Expiry::Idle);
                }
            }
        }
        Stage::Body { since } => {
            if let Some(b) = t.body {
                add(since, b, Expiry::Body);
            }
        }
        Stage::Partial { since } => {
            if let Some(fr) = t.frame {
                add(since, fr, Expiry::Frame);
            }
        }
        Stage::Idle { since } => add(since, t.idle, Expiry::Idle),
        Stage::Busy | Stage::Closing => {}
        Stage::Lingering { since } => add(since, limits.linger, Expiry::Linger),
    }
    // Until a head authenticates, the auth deadline holds whatever the stage (a TLS
    // handshake that completed and then went quiet is idle, yet unauthenticated; so is a
    // client that only asks for `/health` or keeps sending a refused token).
    if unauthenticated
        && matches!(
            f.stage,
            Stage::Opening | Stage::Head { .. } | Stage::Idle { .. }
        )
        && let Some(a) = t.auth
    {
        add(f.opened, a, Expiry::Auth);
    }
    match due.into_iter().min() {
        Some((at, why)) if at <= now => Check::Expired(why),
        Some((at, _)) => Check::Due(Some(at)),
        None => Check::Due(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn limits() -> DoorLimits {
        DoorLimits::from_config(
            &Config::from_toml(
                "[http]\naccept_timeout_secs = 5\nhead_timeout_secs = 7\nauth_timeout_secs = 9\n\
                 body_timeout_secs = 20\nkeepalive_idle_secs = 60\nwrite_stall_secs = 30\n\
                 [gateway]\naccept_timeout_secs = 4\nframe_timeout_secs = 11\nidle_timeout_secs = 100\n\
                 write_stall_secs = 50\nlinger_secs = 2\n[admin]\ntimeout_secs = 3\n",
                "t",
            )
            .unwrap(),
        )
    }

    fn facts(door: Door, t0: Instant, stage: Stage) -> Facts {
        Facts {
            door,
            opened: t0,
            stage,
            authenticated: false,
            last_work: None,
            write_blocked_since: None,
        }
    }

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn a_silent_connection_expires_at_the_accept_deadline_of_its_door() {
        let l = limits();
        let t0 = Instant::now();
        for (door, secs) in [(Door::Http, 5), (Door::Framed, 4), (Door::Admin, 3)] {
            let f = facts(door, t0, Stage::Opening);
            assert_eq!(check(&f, &l, t0), Check::Due(Some(t0 + s(secs))));
            assert_eq!(check(&f, &l, t0 + s(secs)), Check::Expired(Expiry::Accept));
        }
        assert_eq!(
            check(&facts(Door::Stdio, t0, Stage::Opening), &l, t0 + s(10_000)),
            Check::Due(None)
        );
    }

    #[test]
    fn a_slow_head_meets_the_head_deadline_or_the_auth_deadline_first() {
        let l = limits();
        let t0 = Instant::now();
        // Head started late: the auth deadline (accept + 9) comes before head start + 7.
        let f = facts(Door::Http, t0, Stage::Head { since: t0 + s(4) });
        assert_eq!(check(&f, &l, t0 + s(9)), Check::Expired(Expiry::Auth));
        // Quiet after the TLS handshake, still unjudged: the auth deadline.
        let quiet = facts(Door::Http, t0, Stage::Idle { since: t0 + s(1) });
        assert_eq!(check(&quiet, &l, t0 + s(9)), Check::Expired(Expiry::Auth));
        // Once a head authenticated, only the head deadline applies.
        let f = Facts {
            authenticated: true,
            ..f
        };
        assert_eq!(check(&f, &l, t0 + s(9)), Check::Due(Some(t0 + s(11))));
        assert_eq!(check(&f, &l, t0 + s(11)), Check::Expired(Expiry::Head));
    }

    #[test]
    fn requests_without_authenticated_work_never_push_the_keep_alive_deadline() {
        let l = limits();
        let t0 = Instant::now();
        // Never authenticated: the auth deadline ends it, whatever it sends in between
        // (here: a /health head arriving, then idle after its answer).
        let head = facts(Door::Http, t0, Stage::Head { since: t0 + s(8) });
        assert_eq!(check(&head, &l, t0 + s(9)), Check::Expired(Expiry::Auth));
        let idle = facts(Door::Http, t0, Stage::Idle { since: t0 });
        assert_eq!(check(&idle, &l, t0 + s(9)), Check::Expired(Expiry::Auth));
        // Authenticated once at t0 + 1, then only heads trickling in one after another:
        // the keep-alive deadline plus one head's time from that work, no more.
        let trickle = Facts {
            authenticated: true,
            last_work: Some(t0 + s(1)),
            ..facts(Door::Http, t0, Stage::Head { since: t0 + s(64) })
        };
        assert_eq!(
            check(&trickle, &l, t0 + s(67)),
            Check::Due(Some(t0 + s(68)))
        );
        assert_eq!(
            check(&trickle, &l, t0 + s(68)),
            Check::Expired(Expiry::Idle)
        );
    }

    #[test]
    fn bodies_frames_idle_and_lingering_have_their_own_deadlines() {
        let l = limits();
        let t0 = Instant::now();
        let cases = [
            (Door::Http, Stage::Body { since: t0 }, 20, Expiry::Body),
            (
                Door::Framed,
                Stage::Partial { since: t0 },
                11,
                Expiry::Frame,
            ),
            (Door::Framed, Stage::Idle { since: t0 }, 100, Expiry::Idle),
            (Door::Http, Stage::Idle { since: t0 }, 60, Expiry::Idle),
            (Door::Admin, Stage::Idle { since: t0 }, 3, Expiry::Idle),
            (
                Door::Http,
                Stage::Lingering { since: t0 },
                2,
                Expiry::Linger,
            ),
        ];
        for (door, stage, secs, why) in cases {
            let f = Facts {
                authenticated: true,
                ..facts(door, t0, stage)
            };
            assert_eq!(
                check(&f, &l, t0 + s(secs) - Duration::from_millis(1)),
                Check::Due(Some(t0 + s(secs))),
                "{door:?} {stage:?}"
            );
            assert_eq!(
                check(&f, &l, t0 + s(secs)),
                Check::Expired(why),
                "{door:?} {stage:?}"
            );
        }
    }

    #[test]
    fn busy_connections_wait_for_the_core_but_not_for_a_stuck_reader() {
        let l = limits();
        let t0 = Instant::now();
        let busy = Facts {
            authenticated: true,
            ..facts(Door::Framed, t0, Stage::Busy)
        };
        assert_eq!(check(&busy, &l, t0 + s(86_400)), Check::Due(None));
        let stuck = Facts {
            write_blocked_since: Some(t0 + s(1)),
            ..busy
        };
        assert_eq!(
            check(&stuck, &l, t0 + s(51)),
            Check::Expired(Expiry::WriteStall)
        );
        let http_stuck = Facts {
            door: Door::Http,
            stage: Stage::Closing,
            ..stuck
        };
        assert_eq!(
            check(&http_stuck, &l, t0 + s(31)),
            Check::Expired(Expiry::WriteStall)
        );
    }

    #[test]
    fn write_progress_restarts_the_stall_clock() {
        let t0 = Instant::now();
        let mut g = ConnGuard::new(Door::Framed, None, t0);
        g.on_write(0, true, t0);
        assert_eq!(g.write_blocked_since, Some(t0));
        g.on_write(0, true, t0 + s(5));
        assert_eq!(
            g.write_blocked_since,
            Some(t0),
            "no progress: the clock runs on"
        );
        g.on_write(10, true, t0 + s(6));
        assert_eq!(g.write_blocked_since, Some(t0 + s(6)));
        g.on_write(10, false, t0 + s(7));
        assert_eq!(g.write_blocked_since, None);
        assert_eq!(g.last_activity, t0 + s(7));
        g.on_read(0, t0 + s(8));
        assert!(!g.read_any);
        g.on_read(3, t0 + s(9));
        assert!(g.read_any);
        assert_eq!(g.last_activity, t0 + s(9));
    }

    #[test]
    fn every_expiry_names_a_key_and_a_label() {
        for door in [Door::Framed, Door::Http, Door::Admin] {
            for e in [
                Expiry::Accept,
                Expiry::Auth,
                Expiry::Head,
                Expiry::Body,
                Expiry::Frame,
                Expiry::Idle,
                Expiry::WriteStall,
                Expiry::Linger,
            ] {
                assert!(e.key(door).ends_with("_secs"), "{e:?} {door:?}");
                assert!(!e.as_str().is_empty());
            }
        }
    }
}
