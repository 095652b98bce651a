//! `[http]`: the limits and knobs of the Streamable HTTP door. Where the door listens, its
//! certificate, `public_url`, `http_auth` and `metrics_public` live under `[listen]`; see
//! [`DoorSettings`](super::endpoint::DoorSettings).

use serde::Deserialize;

/// Bytes of a request head (request line and headers) before 431.
pub const DEFAULT_MAX_HEAD_BYTES: usize = 16 * 1024;
/// Bytes of answers queued for one connection before reading its pipelined requests stops.
pub const DEFAULT_MAX_QUEUED_OUTPUT_BYTES: usize = 64 * 1024;
/// Headers in one request before 431.
pub const DEFAULT_MAX_HEADERS: usize = 64;
/// Most connections any door may be configured to hold (each is a file descriptor).
pub const MAX_CONNECTIONS: usize = 1 << 20;
/// Bytes of a request body before 413: one JSON-RPC message, the same bound as a frame.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024 + 4096;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Bytes of a request head (request line and headers); beyond it, 431.
    pub max_head_bytes: usize,
    /// Headers in one request; beyond it, 431.
    pub max_headers: usize,
    /// Bytes of a request body; beyond it, 413 and the connection closes.
    pub max_body_bytes: usize,
    /// Seconds from accept to the first byte; a silent connection is closed after it.
    pub accept_timeout_secs: u64,
    /// Seconds from the first byte of a request head (or of the TLS handshake) to its end;
    /// a slower client gets 408 and is closed.
    pub head_timeout_secs: u64,
    /// Seconds from accept until the connection's first request head has been judged (its
    /// token checked), TLS handshake included; else closed.
    pub auth_timeout_secs: u64,
    /// Seconds from an accepted head to the end of its body; a slower client gets 408.
    /// (`request_timeout_secs` is the older name of this key.)
    #[serde(alias = "request_timeout_secs")]
    pub body_timeout_secs: u64,
    /// Seconds an idle keep-alive connection stays open between requests.
    pub keepalive_idle_secs: u64,
    /// Seconds an answer may wait with none of it taken by the client; then closed.
    pub write_stall_secs: u64,
    /// Open HTTP connections. When full, a new connection takes the place of one that has
    /// not sent a whole head yet or sits idle between requests; else it gets 503 with
    /// `Retry-After` (while `/health` is still answered).
    pub max_connections: usize,
    /// Open HTTP connections of one principal (counted from its first accepted head);
    /// beyond it, 503. Default: half of `max_connections`.
    pub max_connections_per_principal: Option<usize>,
    /// The `Retry-After` seconds of a 503 for a full door.
    pub retry_after_secs: u64,
    /// Bytes of answers queued for one connection before its next pipelined request is
    /// read: a client that sends requests without reading the answers stops being read
    /// (and is closed at `write_stall_secs`). One answer may exceed it alone.
    pub max_queued_output_bytes: usize,
    /// Legacy-era sessions (`Mcp-Session-Id`) alive at once; beyond it `initialize` gets 503.
    pub max_sessions: usize,
    /// Legacy-era sessions of one principal; a new one beyond it ends that principal's
    /// least recently used session.
    pub max_sessions_per_principal: usize,
    /// Seconds a legacy-era session lives without a request.
    pub session_idle_secs: u64,
    /// `ttlMs` on cacheable results of the modern era (lists, reads, discover). 0 tells
    /// clients to fetch again whenever they need the list, so a policy reload or a worker
    /// restart is seen at once.
    pub cache_ttl_ms: u64,
    /// More `Host` values to accept besides the listen address and `public_url`, as
    /// `name` (any port) or `name:port`; for example the name a load balancer uses.
    pub allowed_hosts: Vec<String>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            max_head_bytes: DEFAULT_MAX_HEAD_BYTES,
            max_headers: DEFAULT_MAX_HEADERS,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            accept_timeout_secs: 10,
            head_timeout_secs: 10,
            auth_timeout_secs: 15,
            body_timeout_secs: 30,
            keepalive_idle_secs: 60,
            write_stall_secs: 30,
            max_connections: 256,
            max_connections_per_principal: None,
            retry_after_secs: 5,
            max_queued_output_bytes: DEFAULT_MAX_QUEUED_OUTPUT_BYTES,
            max_sessions: 1024,
            max_sessions_per_principal: 64,
            session_idle_secs: 3600,
            cache_ttl_ms: 0,
            allowed_hosts: Vec::new(),
        }
    }
}

impl HttpConfig {
    /// `max_connections_per_principal`, or its default: half the door, at least 1.
    pub fn connections_per_principal(&self) -> usize {
        self.max_connections_per_principal
            .unwrap_or(self.max_connections / 2)
            .max(1)
    }

    /// Every limit that must be positive is; `origin` names the config file in errors.
    pub fn validate(&self, origin: &str) -> Result<(), String> {
        let positive = [
            ("http.max_head_bytes", self.max_head_bytes as u64),
            ("http.max_headers", self.max_headers as u64),
            ("http.max_body_bytes", self.max_body_bytes as u64),
            ("http.accept_timeout_secs", self.accept_timeout_secs),
            ("http.head_timeout_secs", self.head_timeout_secs),
            ("http.auth_timeout_secs", self.auth_timeout_secs),
            ("http.body_timeout_secs", self.body_timeout_secs),
            ("http.keepalive_idle_secs", self.keepalive_idle_secs),
            ("http.write_stall_secs", self.write_stall_secs),
            ("http.max_connections", self.max_connections as u64),
            (
                "http.max_connections_per_principal",
                self.connections_per_principal() as u64,
            ),
            ("http.retry_after_secs", self.retry_after_secs),
            (
                "http.max_queued_output_bytes",
                self.max_queued_output_bytes as u64,
            ),
            ("http.max_sessions", self.max_sessions as u64),
            (
                "http.max_sessions_per_principal",
                self.max_sessions_per_principal as u64,
            ),
            ("http.session_idle_secs", self.session_idle_secs),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(format!("{origin}: {key} must be greater than 0"));
            }
        }
        for (key, value) in [
            ("http.accept_timeout_secs", self.accept_timeout_secs),
            ("http.head_timeout_secs", self.head_timeout_secs),
            ("http.auth_timeout_secs", self.auth_timeout_secs),
            ("http.body_timeout_secs", self.body_timeout_secs),
            ("http.keepalive_idle_secs", self.keepalive_idle_secs),
            ("http.write_stall_secs", self.write_stall_secs),
            ("http.retry_after_secs", self.retry_after_secs),
            ("http.session_idle_secs", self.session_idle_secs),
        ] {
            if value > crate::config::MAX_TIMEOUT_SECS {
                return Err(format!(
                    "{origin}: {key} must be at most {}",
                    crate::config::MAX_TIMEOUT_SECS
                ));
            }
        }
        // A request body travels to a worker as one RPC message.
        if self.max_body_bytes > crate::aggregator::config::MAX_BODY_BYTES_LIMIT {
            return Err(format!(
                "{origin}: http.max_body_bytes must be at most {} (a call must fit one worker message)",
                crate::aggregator::config::MAX_BODY_BYTES_LIMIT
            ));
        }
        if self.max_connections_per_principal == Some(0) {
            return Err(format!(
                "{origin}: http.max_connections_per_principal must be greater than 0"
            ));
        }
        // One process holds every connection's descriptor.
        if self.max_connections > MAX_CONNECTIONS {
            return Err(format!(
                "{origin}: http.max_connections must be at most {MAX_CONNECTIONS}"
            ));
        }
        // httparse needs a header slot per header; a huge count is a memory lever.
        if self.max_headers > 1024 {
            return Err(format!("{origin}: http.max_headers must be at most 1024"));
        }
        if self.max_head_bytes > 1024 * 1024 {
            return Err(format!(
                "{origin}: http.max_head_bytes must be at most 1048576"
            ));
        }
        for host in &self.allowed_hosts {
            super::authority::Authority::parse(host.as_bytes()).map_err(|e| {
                format!("{origin}: http.allowed_hosts: {host:?} is not a host[:port]: {e}")
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_keys() {
        let c: HttpConfig = toml::from_str("").unwrap();
        assert_eq!(c, HttpConfig::default());
        assert_eq!(c.max_body_bytes, 1_052_672);
        assert!(c.validate("t").is_ok());
        let err = toml::from_str::<HttpConfig>("bogus = 1").unwrap_err();
        assert!(err.to_string().contains("bogus"));
        // The older name of body_timeout_secs is still read.
        let c: HttpConfig = toml::from_str("request_timeout_secs = 7").unwrap();
        assert_eq!(c.body_timeout_secs, 7);
        assert_eq!(c.connections_per_principal(), 128);
        let c: HttpConfig = toml::from_str("max_connections_per_principal = 0").unwrap();
        assert!(c.validate("t").unwrap_err().contains("per_principal"));
        let c: HttpConfig = toml::from_str("head_timeout_secs = 0").unwrap();
        assert!(
            c.validate("t")
                .unwrap_err()
                .contains("http.head_timeout_secs")
        );
        let c: HttpConfig = toml::from_str("max_sessions = 0").unwrap();
        assert!(c.validate("t").unwrap_err().contains("http.max_sessions"));
        let c: HttpConfig = toml::from_str("allowed_hosts = [\"bad host\"]").unwrap();
        assert!(c.validate("t").is_err());
        let c: HttpConfig =
            toml::from_str("allowed_hosts = [\"mcp.example.com\", \"10.0.0.5:9210\"]").unwrap();
        assert!(c.validate("t").is_ok());
    }
}
