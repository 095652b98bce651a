//! The `[builtin.http]` table: limits and exceptions of the built-in HTTP tools.

use crate::config::MAX_TIMEOUT_SECS;
use serde::{Deserialize, Serialize};

use super::address_policy::AddressPolicy;

#[derive(Deserialize, Serialize, Clone, Debug)]
#[serde(deny_unknown_fields, default)]
pub struct HttpToolsConfig {
    /// Seconds to resolve and connect (TCP and TLS), shared by a host's addresses.
    pub connect_timeout_secs: u64,
    /// Seconds for a whole tool call: every redirect hop, headers and body.
    pub timeout_secs: u64,
    /// Bytes of (decompressed) body read at most; more is `too_large`.
    pub max_body_bytes: u64,
    /// Redirects followed at most; one more is an `http_error`.
    pub max_redirects: u32,
    /// Exceptions on purpose: "host:port", "IP", "IP:port", "[IPv6]:port", "CIDR".
    pub allow: Vec<String>,
    /// TCP ports beyond 80 and 443 that public addresses may be reached on.
    pub extra_ports: Vec<u16>,
    /// The User-Agent header sent.
    pub user_agent: String,
    /// Longest URL accepted, in bytes.
    pub max_url_bytes: usize,
    /// Largest `max_length` an agent may ask for, in characters; larger asks are clamped.
    pub max_output_chars: usize,
    /// Longest `grep_http` pattern, in characters.
    pub max_pattern_chars: usize,
    /// Longest line `grep_http` shows whole; longer ones are cut around the match.
    pub max_grep_line_chars: usize,
    /// Deepest element nesting kept when converting HTML; deeper elements are flattened.
    pub max_html_depth: usize,
}

impl Default for HttpToolsConfig {
    fn default() -> Self {
        HttpToolsConfig {
            connect_timeout_secs: 10,
            timeout_secs: 30,
            max_body_bytes: 10 * 1024 * 1024,
            max_redirects: 5,
            allow: Vec::new(),
            extra_ports: Vec::new(),
            user_agent: format!("toolwall/{}", env!("CARGO_PKG_VERSION")),
            max_url_bytes: 8192,
            max_output_chars: 100_000,
            max_pattern_chars: 1000,
            max_grep_line_chars: 1000,
            max_html_depth: 256,
        }
    }
}

impl HttpToolsConfig {
    /// Check values serde cannot: positive limits, parsable `allow` entries, a header-safe
    /// user agent. The error names the key under `builtin.http`.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("connect_timeout_secs", self.connect_timeout_secs),
            ("timeout_secs", self.timeout_secs),
            ("max_body_bytes", self.max_body_bytes),
            ("max_url_bytes", self.max_url_bytes as u64),
            ("max_output_chars", self.max_output_chars as u64),
            ("max_pattern_chars", self.max_pattern_chars as u64),
            ("max_grep_line_chars", self.max_grep_line_chars as u64),
            ("max_html_depth", self.max_html_depth as u64),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(format!("builtin.http.{key} must be greater than 0"));
            }
        }
        if self.connect_timeout_secs > MAX_TIMEOUT_SECS || self.timeout_secs > MAX_TIMEOUT_SECS {
            return Err(format!(
                "builtin.http timeouts must be at most {MAX_TIMEOUT_SECS} seconds"
            ));
        }
        if self.user_agent.is_empty()
            || !self
                .user_agent
                .bytes()
                .all(|b| (0x20..0x7f).contains(&b) || b == b'\t')
        {
            return Err("builtin.http.user_agent must be non-empty printable ASCII".into());
        }
        AddressPolicy::new(&self.extra_ports, &self.allow)
            .map_err(|e| format!("builtin.http.allow: {e}"))?;
        Ok(())
    }
}

/// Every TCP port the worker may need to connect to: 80, 443, `extra_ports` and the ports
/// named in `allow` entries. The sandbox grants exactly these. An invalid config (which
/// `validate` refuses) yields the standard ports only.
pub fn tool_ports(cfg: &HttpToolsConfig) -> Vec<u16> {
    match AddressPolicy::new(&cfg.extra_ports, &cfg.allow) {
        Ok(policy) => policy.all_ports(),
        Err(_) => super::address_policy::STANDARD_PORTS.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_grant_standard_ports() {
        let c = HttpToolsConfig::default();
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(tool_ports(&c), vec![80, 443]);
        assert!(c.user_agent.starts_with("toolwall/"));
    }

    #[test]
    fn bad_values_are_named() {
        let c = HttpToolsConfig {
            timeout_secs: 0,
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().contains("timeout_secs"));
        let c = HttpToolsConfig {
            allow: vec!["10.0.0.1/8".into()],
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().contains("allow"));
        let c = HttpToolsConfig {
            user_agent: "a\r\nX-Evil: 1".into(),
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().contains("user_agent"));
    }

    #[test]
    fn ports_come_from_extra_ports_and_allow() {
        let c = HttpToolsConfig {
            extra_ports: vec![8443, 443],
            allow: vec![
                "127.0.0.1:8080".into(),
                "svc.internal:9000".into(),
                "10.0.0.0/8".into(),
            ],
            ..Default::default()
        };
        assert_eq!(tool_ports(&c), vec![80, 443, 8080, 8443, 9000]);
    }

    #[test]
    fn toml_keys() {
        let c: HttpToolsConfig =
            toml::from_str("timeout_secs = 5\nallow = [\"127.0.0.1:1234\"]\n").unwrap();
        assert_eq!(c.timeout_secs, 5);
        assert_eq!(c.max_redirects, 5);
        assert!(toml::from_str::<HttpToolsConfig>("bogus = 1\n").is_err());
    }
}
