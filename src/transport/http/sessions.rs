//! Legacy-era sessions: what `initialize` starts and `Mcp-Session-Id` names afterwards.
//!
//! A session id is 32 bytes from the kernel's CSPRNG in lowercase hex (visible ASCII, as
//! the spec requires), bound to the principal that opened it: the same id presented with
//! another principal's token is unknown. Sessions are bounded in number, per principal and
//! in total, and end after an idle time.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::config::HttpConfig;
use crate::tokens::random::random_bytes;

/// Hex characters of a session id.
pub const SESSION_ID_LEN: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    pub max_sessions: usize,
    pub max_per_principal: usize,
    pub idle: Duration,
}

impl From<&HttpConfig> for SessionLimits {
    fn from(c: &HttpConfig) -> Self {
        SessionLimits {
            max_sessions: c.max_sessions,
            max_per_principal: c.max_sessions_per_principal,
            idle: Duration::from_secs(c.session_idle_secs),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub principal: String,
    /// The protocol version `initialize` negotiated.
    pub version: &'static str,
    pub created: Instant,
    pub last_seen: Instant,
    /// The client capabilities its `initialize` declared (what server requests may reach
    /// it).
    pub caps: crate::mcp::client_caps::ClientCaps,
    /// The level its `logging/setLevel` asked for.
    pub log_level: Option<crate::mcp::log_level::LogLevel>,
}

/// Why a session could not be opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenError {
    /// `max_sessions` are alive and none has expired.
    Full,
    /// The kernel gave no random bytes.
    Random(String),
}

#[derive(Debug)]
pub struct Sessions {
    limits: SessionLimits,
    by_id: HashMap<String, Session>,
}

impl Sessions {
    pub fn new(limits: SessionLimits) -> Sessions {
        Sessions {
            limits,
            by_id: HashMap::new(),
        }
    }

    /// New limits (on reload); live sessions stay until they expire.
    pub fn set_limits(&mut self, limits: SessionLimits) {
        self.limits = limits;
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    fn expired(&self, session: &Session, now: Instant) -> bool {
        now.saturating_duration_since(session.last_seen) >= self.limits.idle
    }

    /// Whether `open` for `principal` would succeed now (checked before `initialize` is
    /// handed to the core, so a refusal costs nothing).
    pub fn has_room(&mut self, principal: &str, now: Instant) -> bool {
        if self.by_id.len() < self.limits.max_sessions {
            return true;
        }
        self.sweep(now);
        // A principal at its own cap replaces its oldest session, so it always has room.
        self.by_id.len() < self.limits.max_sessions
            || self.count_of(principal) >= self.limits.max_per_principal
    }

    fn count_of(&self, principal: &str) -> usize {
        self.by_id
            .values()
            .filter(|s| s.principal == principal)
            .count()
    }

    /// Start a session for `principal` at `version`; returns its id. At the principal's cap
    /// its least recently used session ends; at the global cap, after dropping expired
    /// sessions, the open fails.
    pub fn open(
        &mut self,
        principal: &str,
        version: &'static str,
        now: Instant,
    ) -> Result<String, OpenError> {
        self.open_with(principal, version, Default::default(), now)
    }

    /// [`Sessions::open`] remembering the client's declared capabilities.
    pub fn open_with(
        &mut self,
        principal: &str,
        version: &'static str,
        caps: crate::mcp::client_caps::ClientCaps,
        now: Instant,
    ) -> Result<String, OpenError> {
        if self.count_of(principal) >= self.limits.max_per_principal {
            let oldest = self
                .by_id
                .iter()
                .filter(|(_, s)| s.principal == principal)
                .min_by_key(|(_, s)| s.last_seen)
                .map(|(id, _)| id.clone());
            if let Some(id) = oldest {
                self.by_id.remove(&id);
            }
        }
        if self.by_id.len() >= self.limits.max_sessions {
            self.sweep(now);
            if self.by_id.len() >= self.limits.max_sessions {
                return Err(OpenError::Full);
            }
        }
        let id = new_session_id().map_err(|e| OpenError::Random(e.to_string()))?;
        self.by_id.insert(
            id.clone(),
            Session {
                principal: principal.to_owned(),
                version,
                created: now,
                last_seen: now,
                caps,
                log_level: None,
            },
        );
        Ok(id)
    }

    /// The live session `id` of `principal`, marked as used now. An expired session is
    /// removed and reported as unknown, like one that never existed.
    /// A session's `logging/setLevel`.
    pub fn set_log_level(&mut self, id: &str, level: crate::mcp::log_level::LogLevel) {
        if let Some(s) = self.by_id.get_mut(id) {
            s.log_level = Some(level);
        }
    }

    pub fn touch(&mut self, id: &str, principal: &str, now: Instant) -> Option<&Session> {
        let expired = match self.by_id.get(id) {
            None => return None,
            Some(s) if s.principal != principal => return None,
            Some(s) => self.expired(s, now),
        };
        if expired {
            self.by_id.remove(id);
            return None;
        }
        let session = self.by_id.get_mut(id)?;
        session.last_seen = now;
        Some(session)
    }

    /// End session `id` of `principal` (HTTP DELETE). False when there was none.
    pub fn close(&mut self, id: &str, principal: &str, now: Instant) -> bool {
        if self.touch(id, principal, now).is_none() {
            return false;
        }
        self.by_id.remove(id).is_some()
    }

    /// Drop every session idle for too long; returns how many ended.
    pub fn sweep(&mut self, now: Instant) -> usize {
        let before = self.by_id.len();
        let idle = self.limits.idle;
        self.by_id
            .retain(|_, s| now.saturating_duration_since(s.last_seen) < idle);
        before - self.by_id.len()
    }

    /// When the next session would expire if left alone (for the loop's sweep timer).
    pub fn next_expiry(&self) -> Option<Instant> {
        self.by_id
            .values()
            .map(|s| s.last_seen + self.limits.idle)
            .min()
    }
}

/// Whether a presented `Mcp-Session-Id` has the shape of one of ours.
pub fn well_formed_id(id: &[u8]) -> bool {
    id.len() == SESSION_ID_LEN && id.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn new_session_id() -> std::io::Result<String> {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes: [u8; SESSION_ID_LEN / 2] = random_bytes()?;
    let mut id = String::with_capacity(SESSION_ID_LEN);
    for b in bytes {
        id.push(HEX[usize::from(b >> 4)] as char);
        id.push(HEX[usize::from(b & 0x0f)] as char);
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize, per: usize) -> SessionLimits {
        SessionLimits {
            max_sessions: max,
            max_per_principal: per,
            idle: Duration::from_secs(60),
        }
    }

    #[test]
    fn open_touch_close() {
        let t0 = Instant::now();
        let mut s = Sessions::new(limits(8, 8));
        let id = s.open("alice", "2025-11-25", t0).unwrap();
        assert!(well_formed_id(id.as_bytes()));
        assert!(id.bytes().all(|b| (0x21..=0x7e).contains(&b)));
        assert_eq!(
            s.touch(&id, "alice", t0 + Duration::from_secs(59))
                .unwrap()
                .version,
            "2025-11-25"
        );
        // Bound to its principal.
        assert!(s.touch(&id, "mallory", t0).is_none());
        assert!(!s.close(&id, "mallory", t0));
        assert!(s.close(&id, "alice", t0));
        assert!(s.touch(&id, "alice", t0).is_none());
        assert!(!s.close(&id, "alice", t0));
    }

    #[test]
    fn idle_expiry_counts_from_last_use() {
        let t0 = Instant::now();
        let mut s = Sessions::new(limits(8, 8));
        let id = s.open("a", "2025-06-18", t0).unwrap();
        let other = s.open("a", "2025-06-18", t0).unwrap();
        assert!(s.touch(&id, "a", t0 + Duration::from_secs(50)).is_some());
        assert_eq!(s.next_expiry(), Some(t0 + Duration::from_secs(60)));
        assert_eq!(s.sweep(t0 + Duration::from_secs(100)), 1);
        assert!(
            s.touch(&other, "a", t0 + Duration::from_secs(100))
                .is_none()
        );
        assert!(s.touch(&id, "a", t0 + Duration::from_secs(100)).is_some());
        assert!(s.touch(&id, "a", t0 + Duration::from_secs(160)).is_none());
        assert!(s.is_empty());
    }

    #[test]
    fn caps() {
        let t0 = Instant::now();
        let mut s = Sessions::new(limits(3, 2));
        let a1 = s.open("a", "v", t0).unwrap();
        let a2 = s.open("a", "v", t0 + Duration::from_secs(1)).unwrap();
        // The principal's cap ends its least recently used session.
        s.touch(&a1, "a", t0 + Duration::from_secs(2));
        let a3 = s.open("a", "v", t0 + Duration::from_secs(3)).unwrap();
        assert!(s.touch(&a2, "a", t0 + Duration::from_secs(3)).is_none());
        assert!(s.touch(&a1, "a", t0 + Duration::from_secs(3)).is_some());
        assert!(s.touch(&a3, "a", t0 + Duration::from_secs(3)).is_some());
        // The global cap refuses others until sessions expire.
        s.open("b", "v", t0).unwrap();
        assert!(!s.has_room("c", t0 + Duration::from_secs(4)));
        assert_eq!(
            s.open("c", "v", t0 + Duration::from_secs(4)),
            Err(OpenError::Full)
        );
        assert!(
            s.has_room("a", t0 + Duration::from_secs(4)),
            "a replaces its own"
        );
        // b's session (last used at t0) expires first.
        assert!(s.has_room("c", t0 + Duration::from_secs(61)));
        assert!(s.open("c", "v", t0 + Duration::from_secs(61)).is_ok());
    }

    #[test]
    fn id_shapes() {
        assert!(!well_formed_id(b""));
        assert!(!well_formed_id(&[b'A'; 64]));
        assert!(!well_formed_id(&[b'a'; 63]));
        assert!(well_formed_id(&[b'a'; 64]));
    }
}
