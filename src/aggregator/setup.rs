//! What the gateway hands the aggregator worker once it has attested: the `configure`
//! request. It carries what the worker may not find by itself (it has no files and no
//! DNS): every enabled server's credential, read by the gateway, and its addresses,
//! resolved by the gateway and checked by the address policy. It travels only over the RPC
//! channel, after confinement; never in the settings pipe, a log line or a ledger row.

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

use super::config::{EraChoice, ServersConfig};

/// A credential. Its `Debug` never shows it; only [`Secret::expose`] does, where the
/// header is built.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Secret {
        Secret(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// The worker-wide limits, from `[servers]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Limits {
    pub threads: usize,
    pub queue: usize,
    pub max_body_bytes: usize,
    pub connect_timeout_secs: u64,
    pub retry_max_secs: u64,
    /// `[servers] max_server_subscriptions` (see `resource_subscriptions.rs`).
    #[serde(default = "default_max_server_subscriptions")]
    pub max_server_subscriptions: usize,
    /// `[servers] subscription_recheck_secs` (see `resource_subscriptions.rs`).
    #[serde(default = "default_subscription_recheck_secs")]
    pub subscription_recheck_secs: u64,
    /// `[servers] reuse_idle_ms`: see `exchange.rs`.
    #[serde(default = "default_reuse_idle_ms")]
    pub reuse_idle_ms: u64,
}

fn default_reuse_idle_ms() -> u64 {
    super::config::DEFAULT_REUSE_IDLE_MS
}

fn default_max_server_subscriptions() -> usize {
    super::config::DEFAULT_MAX_SERVER_SUBSCRIPTIONS
}

fn default_subscription_recheck_secs() -> u64 {
    super::config::DEFAULT_SUBSCRIPTION_RECHECK_SECS
}

impl Limits {
    pub fn from_config(servers: &ServersConfig) -> Limits {
        Limits {
            threads: servers.threads,
            queue: servers.queue,
            max_body_bytes: servers.max_body_bytes,
            connect_timeout_secs: servers.connect_timeout_secs,
            retry_max_secs: servers.retry_max_secs,
            max_server_subscriptions: servers.max_server_subscriptions,
            subscription_recheck_secs: servers.subscription_recheck_secs,
            reuse_idle_ms: servers.reuse_idle_ms,
        }
    }
}

/// One server, ready to be reached.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct UpstreamSetup {
    pub name: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub bearer_token: Option<Secret>,
    pub timeout_secs: u64,
    #[serde(default)]
    pub era: EraChoice,
    /// The addresses the gateway resolved and the address policy allowed.
    pub addresses: Vec<SocketAddr>,
    /// Why the server cannot be reached at all (its credential could not be read, its
    /// name did not resolve, its address was refused): reported as its state.
    pub unusable: Option<String>,
    /// A local server's secret variables (`secret_env`, `secret_env_from`), read by the
    /// gateway: they reach the server's environment and nowhere else.
    #[serde(default)]
    pub secret_env: Vec<(String, Secret)>,
}

/// The `args` of the `configure` request.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct AggregatorSetup {
    pub limits: Limits,
    pub servers: Vec<UpstreamSetup>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_do_not_debug_print() {
        let s = UpstreamSetup {
            name: "a".into(),
            url: "http://127.0.0.1:1/".into(),
            headers: vec![],
            bearer_token: Some(Secret::new("hunter2-token".into())),
            timeout_secs: 1,
            era: EraChoice::Auto,
            addresses: vec![],
            unusable: None,
            secret_env: vec![("K".into(), Secret::new("hunter2-env".into()))],
        };
        let text = format!("{s:?}");
        assert!(!text.contains("hunter2"), "{text}");
        assert!(!text.contains("hunter2-env"), "{text}");
        // But it travels (the worker needs it).
        let json = serde_json::to_string(&s).unwrap();
        assert!(json.contains("hunter2-token"));
        let back: UpstreamSetup = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
    }
}
