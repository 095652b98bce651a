//! Every door's budgets and deadlines, from the config keys that name them.

use std::time::Duration;

use crate::config::Config;

/// Which door a connection came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Door {
    /// The framed agent sockets (unix and vsock).
    Framed,
    /// The Streamable HTTP door.
    Http,
    /// The admin socket (the operator's way in).
    Admin,
    /// `toolwall stdio`: one agent on the process's own stdin and stdout; no limits.
    Stdio,
}

impl Door {
    pub fn as_str(self) -> &'static str {
        match self {
            Door::Framed => "framed",
            Door::Http => "http",
            Door::Admin => "admin",
            Door::Stdio => "stdio",
        }
    }
}

/// How long each stage of one door may last; `None` where the door has no such stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageTimeouts {
    /// From accept to the first byte (`*.accept_timeout_secs`).
    pub accept: Duration,
    /// From the first byte of a request head to its end (`http.head_timeout_secs`).
    pub head: Option<Duration>,
    /// From accept to the first head that authenticates, TLS handshake included
    /// (`http.auth_timeout_secs`).
    pub auth: Option<Duration>,
    /// From an accepted head to the end of its body (`http.body_timeout_secs`).
    pub body: Option<Duration>,
    /// From the first byte of a frame to its end (`gateway.frame_timeout_secs`).
    pub frame: Option<Duration>,
    /// With nothing in flight, nothing read and nothing written (`http.keepalive_idle_secs`,
    /// `gateway.idle_timeout_secs`, `admin.timeout_secs`).
    pub idle: Duration,
    /// Output waiting and none of it taken by the peer (`*.write_stall_secs`).
    pub write_stall: Duration,
}

/// The budgets and deadlines of every door.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoorLimits {
    /// Framed connections (unix and vsock), the framed doors' own seats
    /// (`gateway.max_connections`).
    pub framed: usize,
    /// Framed connections of one peer: a unix uid or a vsock cid
    /// (`gateway.max_connections_per_peer`).
    pub framed_per_peer: usize,
    /// HTTP connections, the HTTP door's own seats (`http.max_connections`).
    pub http: usize,
    /// HTTP connections of one principal (`http.max_connections_per_principal`).
    pub http_per_principal: usize,
    /// Admin connections, kept apart from the agents' doors (`admin.max_connections`).
    pub admin: usize,
    /// Connections kept only to answer them and close: a refusal, an error answer before
    /// the close (`gateway.max_lingering`).
    pub lingering: usize,
    pub framed_stages: StageTimeouts,
    pub http_stages: StageTimeouts,
    pub admin_stages: StageTimeouts,
    /// After an error answer or a refusal: how long input is read and dropped before the
    /// close (`gateway.linger_secs`); also how long a refused HTTP connection may take to
    /// send the head it is answered for.
    pub linger: Duration,
    /// The `Retry-After` of a 503 for a full door (`http.retry_after_secs`).
    pub retry_after_secs: u64,
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

impl DoorLimits {
    pub fn from_config(config: &Config) -> DoorLimits {
        let g = &config.gateway;
        let h = &config.http;
        let a = &config.admin;
        DoorLimits {
            framed: g.max_connections,
            framed_per_peer: g.connections_per_peer(),
            http: h.max_connections,
            http_per_principal: h.connections_per_principal(),
            admin: a.max_connections,
            lingering: g.max_lingering,
            framed_stages: StageTimeouts {
                accept: secs(g.accept_timeout_secs),
                head: None,
                auth: None,
                body: None,
                frame: Some(secs(g.frame_timeout_secs)),
                idle: secs(g.idle_timeout_secs),
                write_stall: secs(g.write_stall_secs),
            },
            http_stages: StageTimeouts {
                accept: secs(h.accept_timeout_secs),
                head: Some(secs(h.head_timeout_secs)),
                auth: Some(secs(h.auth_timeout_secs)),
                body: Some(secs(h.body_timeout_secs)),
                frame: None,
                idle: secs(h.keepalive_idle_secs),
                write_stall: secs(h.write_stall_secs),
            },
            admin_stages: StageTimeouts {
                accept: secs(a.timeout_secs),
                head: None,
                auth: None,
                body: None,
                frame: None,
                idle: secs(a.timeout_secs),
                write_stall: secs(a.timeout_secs),
            },
            linger: secs(g.linger_secs),
            retry_after_secs: h.retry_after_secs,
        }
    }

    pub fn stages(&self, door: Door) -> Option<&StageTimeouts> {
        match door {
            Door::Framed => Some(&self.framed_stages),
            Door::Http => Some(&self.http_stages),
            Door::Admin => Some(&self.admin_stages),
            Door::Stdio => None,
        }
    }

    /// File descriptors the doors may hold at once, all budgets full.
    pub fn max_descriptors(&self) -> usize {
        self.framed + self.http + self.admin + self.lingering
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_give_every_door_its_own_limits() {
        let l = DoorLimits::from_config(&Config::default());
        assert_eq!(l.framed, 1024);
        assert_eq!(l.framed_per_peer, 512, "half the framed door");
        assert_eq!(l.http, 256);
        assert_eq!(l.http_per_principal, 128, "half the door");
        assert_eq!(l.admin, 8);
        assert!(l.framed_stages.accept <= l.framed_stages.idle);
        assert!(l.http_stages.head.unwrap() <= l.http_stages.auth.unwrap());
    }

    #[test]
    fn per_peer_and_per_principal_follow_their_keys() {
        let c = Config::from_toml(
            "[gateway]\nmax_connections = 10\nmax_connections_per_peer = 7\n[http]\nmax_connections = 3\n",
            "t",
        )
        .unwrap();
        let l = DoorLimits::from_config(&c);
        assert_eq!(l.framed_per_peer, 7);
        assert_eq!(l.http_per_principal, 1, "never below one");
    }
}
