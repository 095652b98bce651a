//! Seats: who may hold a connection. An agent connection takes a seat of its door's budget
//! (framed and HTTP each have their own, so one door's clients never take the other's
//! seats) and of its peer's (unix uid, vsock cid) or, on HTTP once a head named one, of its
//! principal's; an admin connection one of the admin reserve, which agents
//! never touch; a connection kept only to be answered and closed, one of the lingering pool.
//! Every count is bounded by its limit; a seat given back is counted down exactly once.

use std::collections::HashMap;

use super::settings::{Door, DoorLimits};

/// Which budget a seat was taken from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pool {
    Agent,
    Admin,
    Lingering,
}

/// One connection's place in the budgets; give it back with [`Budgets::release`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seat {
    door: Door,
    pool: Pool,
    /// The peer (framed) or principal (HTTP) counted, if any.
    key: Option<String>,
}

impl Seat {
    pub fn door(&self) -> Door {
        self.door
    }

    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// Whether this seat is an agent's (and so could be displaced to make room).
    pub fn is_agent(&self) -> bool {
        self.pool == Pool::Agent
    }

    /// Whether this seat is in the lingering pool: the connection is kept only to be
    /// answered (a refusal) or drained before it closes.
    pub fn is_lingering(&self) -> bool {
        self.pool == Pool::Lingering
    }
}

/// Which limit a connection ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// The framed doors (unix, vsock) are full (`gateway.max_connections`).
    FramedDoor,
    /// The HTTP door is full (`http.max_connections`).
    HttpDoor,
    /// This peer holds its share (`gateway.max_connections_per_peer`).
    Peer,
    /// This principal holds its share (`http.max_connections_per_principal`).
    Principal,
    /// The admin reserve is taken (`admin.max_connections`).
    Admin,
    /// The lingering pool is full (`gateway.max_lingering`).
    Lingering,
}

impl Full {
    /// The config key of the limit, as refusals and logs name it.
    pub fn key(self) -> &'static str {
        match self {
            Full::FramedDoor => "gateway.max_connections",
            Full::HttpDoor => "http.max_connections",
            Full::Peer => "gateway.max_connections_per_peer",
            Full::Principal => "http.max_connections_per_principal",
            Full::Admin => "admin.max_connections",
            Full::Lingering => "gateway.max_lingering",
        }
    }

    /// The `reason` label of `toolwall_connections_refused_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Full::FramedDoor | Full::HttpDoor => "door_full",
            Full::Peer => "peer_full",
            Full::Principal => "principal_full",
            Full::Admin => "admin_full",
            Full::Lingering => "lingering_full",
        }
    }
}

#[derive(Debug)]
pub struct Budgets {
    limits: DoorLimits,
    framed: usize,
    http: usize,
    admin: usize,
    lingering: usize,
    /// Seats per (door, peer or principal); entries at zero are removed, so this holds at
    /// most one entry per agent connection.
    per_key: HashMap<(Door, String), usize>,
}

impl Budgets {
    pub fn new(limits: DoorLimits) -> Budgets {
        Budgets {
            limits,
            framed: 0,
            http: 0,
            admin: 0,
            lingering: 0,
            per_key: HashMap::new(),
        }
    }

    /// New limits (reload): seats already given stay; new ones follow the new limits.
    pub fn set_limits(&mut self, limits: DoorLimits) {
        self.limits = limits;
    }

    pub fn limits(&self) -> &DoorLimits {
        &self.limits
    }

    fn key_limit(&self, door: Door) -> usize {
        match door {
            Door::Http => self.limits.http_per_principal,
            _ => self.limits.framed_per_peer,
        }
    }

    fn key_count(&self, door: Door, key: &str) -> usize {
        self.per_key
            .get(&(door, key.to_owned()))
            .copied()
            .unwrap_or(0)
    }

    /// A seat for an agent connection of `door`; `key` is the peer (framed) or, for HTTP,
    /// None until a head names a principal ([`Budgets::bind`]).
    pub fn admit_agent(&mut self, door: Door, key: Option<&str>) -> Result<Seat, Full> {
        match door {
            Door::Http if self.http >= self.limits.http => return Err(Full::HttpDoor),
            Door::Http => {}
            _ if self.framed >= self.limits.framed => return Err(Full::FramedDoor),
            _ => {}
        }
        if let Some(k) = key
            && self.key_count(door, k) >= self.key_limit(door)
        {
            return Err(if door == Door::Http {
                Full::Principal
            } else {
                Full::Peer
            });
        }
        if door == Door::Http {
            self.http += 1;
        } else {
            self.framed += 1;
        }
        if let Some(k) = key {
            *self.per_key.entry((door, k.to_owned())).or_insert(0) += 1;
        }
        Ok(Seat {
            door,
            pool: Pool::Agent,
            key: key.map(str::to_owned),
        })
    }

    /// Count an agent seat for `key` (an HTTP principal) instead of the one it had. On
    /// refusal the seat is unchanged.
    pub fn bind(&mut self, seat: &mut Seat, key: &str) -> Result<(), Full> {
        if seat.pool != Pool::Agent || seat.key.as_deref() == Some(key) {
            return Ok(());
        }
        if self.key_count(seat.door, key) >= self.key_limit(seat.door) {
            return Err(if seat.door == Door::Http {
                Full::Principal
            } else {
                Full::Peer
            });
        }
        if let Some(old) = seat.key.take() {
            self.count_down(seat.door, old);
        }
        *self.per_key.entry((seat.door, key.to_owned())).or_insert(0) += 1;
        seat.key = Some(key.to_owned());
        Ok(())
    }

    pub fn admit_admin(&mut self) -> Result<Seat, Full> {
        if self.admin >= self.limits.admin {
            return Err(Full::Admin);
        }
        self.admin += 1;
        Ok(Seat {
            door: Door::Admin,
            pool: Pool::Admin,
            key: None,
        })
    }

    /// A seat in the lingering pool, for a connection of `door` kept only to be answered
    /// (a refusal) or drained (after an error answer) before it closes.
    pub fn admit_lingering(&mut self, door: Door) -> Result<Seat, Full> {
        if self.lingering >= self.limits.lingering {
            return Err(Full::Lingering);
        }
        self.lingering += 1;
        Ok(Seat {
            door,
            pool: Pool::Lingering,
            key: None,
        })
    }

    fn count_down(&mut self, door: Door, key: String) {
        let slot = (door, key);
        if let Some(n) = self.per_key.get_mut(&slot) {
            *n -= 1;
            if *n == 0 {
                self.per_key.remove(&slot);
            }
        }
    }

    pub fn release(&mut self, seat: Seat) {
        match seat.pool {
            Pool::Agent => {
                if seat.door == Door::Http {
                    self.http -= 1;
                } else {
                    self.framed -= 1;
                }
                if let Some(k) = seat.key {
                    self.count_down(seat.door, k);
                }
            }
            Pool::Admin => self.admin -= 1,
            Pool::Lingering => self.lingering -= 1,
        }
    }

    /// Seats taken: (framed, http, admin, lingering).
    pub fn counts(&self) -> (usize, usize, usize, usize) {
        (self.framed, self.http, self.admin, self.lingering)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn budgets(toml: &str) -> Budgets {
        Budgets::new(DoorLimits::from_config(
            &Config::from_toml(toml, "t").unwrap(),
        ))
    }

    #[test]
    fn one_peer_cannot_take_every_agent_seat() {
        let mut b = budgets("[gateway]\nmax_connections = 8\nmax_connections_per_peer = 3\n");
        let mut seats: Vec<Seat> = (0..3)
            .map(|_| b.admit_agent(Door::Framed, Some("uid:1")).unwrap())
            .collect();
        assert_eq!(b.admit_agent(Door::Framed, Some("uid:1")), Err(Full::Peer));
        for _ in 0..3 {
            seats.push(b.admit_agent(Door::Framed, Some("uid:2")).unwrap());
        }
        seats.push(b.admit_agent(Door::Framed, Some("cid:3")).unwrap());
        seats.push(b.admit_agent(Door::Framed, Some("cid:3")).unwrap());
        assert_eq!(
            b.admit_agent(Door::Framed, Some("uid:4")),
            Err(Full::FramedDoor)
        );
        // The operator's reserve is apart.
        let admin = b.admit_admin().unwrap();
        b.release(seats.remove(0));
        assert!(b.admit_agent(Door::Framed, Some("uid:1")).is_ok());
        b.release(admin);
        assert_eq!(b.counts().2, 0);
    }

    #[test]
    fn http_seats_bind_to_principals_and_move_between_them() {
        let mut b = budgets("[http]\nmax_connections = 4\nmax_connections_per_principal = 2\n");
        let mut seats: Vec<Seat> = (0..4)
            .map(|_| b.admit_agent(Door::Http, None).unwrap())
            .collect();
        assert_eq!(b.admit_agent(Door::Http, None), Err(Full::HttpDoor));
        b.bind(&mut seats[0], "alice").unwrap();
        b.bind(&mut seats[1], "alice").unwrap();
        assert_eq!(b.bind(&mut seats[2], "alice"), Err(Full::Principal));
        assert_eq!(
            seats[2].key(),
            None,
            "a refused bind leaves the seat as it was"
        );
        b.bind(&mut seats[2], "bob").unwrap();
        // A connection whose next request is another principal's moves its count.
        b.bind(&mut seats[1], "bob").unwrap();
        b.bind(&mut seats[3], "alice").unwrap();
        for s in seats {
            b.release(s);
        }
        assert_eq!(b.counts(), (0, 0, 0, 0));
        assert!(b.per_key.is_empty(), "no entry outlives its seats");
    }

    #[test]
    fn each_door_has_its_own_seats() {
        let mut b = budgets(
            "[gateway]\nmax_connections = 2\nmax_connections_per_peer = 2\n[http]\nmax_connections = 2\n",
        );
        let framed: Vec<Seat> = (0..2)
            .map(|_| b.admit_agent(Door::Framed, Some("uid:1")).unwrap())
            .collect();
        assert_eq!(
            b.admit_agent(Door::Framed, Some("uid:2")),
            Err(Full::FramedDoor)
        );
        // A full framed door leaves every HTTP seat free, and the other way round.
        let http: Vec<Seat> = (0..2)
            .map(|_| b.admit_agent(Door::Http, None).unwrap())
            .collect();
        assert_eq!(b.admit_agent(Door::Http, None), Err(Full::HttpDoor));
        assert_eq!(b.counts(), (2, 2, 0, 0));
        for s in framed.into_iter().chain(http) {
            b.release(s);
        }
        assert_eq!(b.counts(), (0, 0, 0, 0));
    }

    #[test]
    fn admin_and_lingering_pools_are_bounded() {
        let mut b = budgets("[admin]\nmax_connections = 1\n[gateway]\nmax_lingering = 1\n");
        let a = b.admit_admin().unwrap();
        assert_eq!(b.admit_admin(), Err(Full::Admin));
        let l = b.admit_lingering(Door::Http).unwrap();
        assert_eq!(b.admit_lingering(Door::Framed), Err(Full::Lingering));
        b.release(a);
        b.release(l);
        assert_eq!(b.counts(), (0, 0, 0, 0));
        for f in [
            Full::FramedDoor,
            Full::HttpDoor,
            Full::Peer,
            Full::Principal,
            Full::Admin,
            Full::Lingering,
        ] {
            assert!(f.key().contains('.'), "{f:?} names its key");
        }
    }
}
