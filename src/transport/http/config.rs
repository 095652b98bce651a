//! `[http]`: the limits and knobs of the Streamable HTTP door. Where the door listens, its
//! certificate, `public_url`, `http_auth` and `metrics_public` live under `[listen]`; see
//! [`DoorSettings`](super::endpoint::DoorSettings).

use serde::Deserialize;

/// Bytes of a request head (request line and headers) before 431.
pub const DEFAULT_MAX_HEAD_BYTES: usize = 16 * 1024;
/// Headers in one request before 431.
pub const DEFAULT_MAX_HEADERS: usize = 64;
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
    /// Seconds a started request may take to arrive whole; a slower client is closed.
    pub request_timeout_secs: u64,
    /// Seconds an idle keep-alive connection stays open between requests.
    pub keepalive_idle_secs: u64,
    /// Open HTTP connections; beyond it, new ones are closed at once.
    pub max_connections: usize,
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
            request_timeout_secs: 30,
            keepalive_idle_secs: 60,
            max_connections: 256,
            max_sessions: 1024,
            max_sessions_per_principal: 64,
            session_idle_secs: 3600,
            cache_ttl_ms: 0,
            allowed_hosts: Vec::new(),
        }
    }
}

impl HttpConfig {
    /// Every limit that must be positive is; `origin` names the config file in errors.
    pub fn validate(&self, origin: &str) -> Result<(), String> {
        let positive = [
            ("http.max_head_bytes", self.max_head_bytes as u64),
            ("http.max_headers", self.max_headers as u64),
            ("http.max_body_bytes", self.max_body_bytes as u64),
            ("http.request_timeout_secs", self.request_timeout_secs),
            ("http.keepalive_idle_secs", self.keepalive_idle_secs),
            ("http.max_connections", self.max_connections as u64),
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
            ("http.request_timeout_secs", self.request_timeout_secs),
            ("http.keepalive_idle_secs", self.keepalive_idle_secs),
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
        let c: HttpConfig = toml::from_str("max_sessions = 0").unwrap();
        assert!(c.validate("t").unwrap_err().contains("http.max_sessions"));
        let c: HttpConfig = toml::from_str("allowed_hosts = [\"bad host\"]").unwrap();
        assert!(c.validate("t").is_err());
        let c: HttpConfig =
            toml::from_str("allowed_hosts = [\"mcp.example.com\", \"10.0.0.5:9210\"]").unwrap();
        assert!(c.validate("t").is_ok());
    }
}
