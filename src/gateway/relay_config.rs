//! `[relay]`: the bounds on what a server sends an agent during a call besides its answer
//! (progress, log messages, its own requests), and how long a 2026-07-28 client has to
//! come back with the input a server asked for.

use serde::Deserialize;

/// Largest `relay.max_message_bytes`: a relayed message must fit one agent frame.
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;
/// Largest `relay.max_subscriptions_per_session`.
pub const MAX_SUBSCRIPTIONS_PER_SESSION: usize = 4096;
/// Largest `relay.max_subscribed_uri_bytes`: a session holds up to
/// `max_subscriptions_per_session` of them.
pub const MAX_SUBSCRIBED_URI_BYTES: usize = 65_536;
/// Largest `relay.max_requests_per_call`.
pub const MAX_REQUESTS_PER_CALL: u32 = 1024;

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct RelayConfig {
    /// Notifications relayed per call and second (sustained); beyond, dropped and counted.
    pub notifications_per_sec: u32,
    /// Notifications a call may relay at once before the rate applies.
    pub notification_burst: u32,
    /// A relayed message (notification or server request) whose params are larger is
    /// dropped (a notification, counted) or refused (a request: the server gets an error).
    pub max_message_bytes: usize,
    /// Server requests (elicitation, sampling, roots) relayed per call; beyond, the server
    /// gets an error.
    pub max_requests_per_call: u32,
    /// Seconds a `requestState` toolwall issues in an `input_required` result stays good.
    pub input_state_ttl_secs: u64,
    /// Log lines per second for server log messages that belong to no call (the rest are
    /// counted and dropped).
    pub unrouted_logs_per_sec: u32,
    /// Resource URIs one agent session may be subscribed to (`resources/subscribe`);
    /// beyond, a subscribe is refused. The session's subscriptions end with it.
    pub max_subscriptions_per_session: usize,
    /// Longest resource URI a session may subscribe to: the session's table holds what
    /// it is given, and a URI a template matches can be as long as a request.
    pub max_subscribed_uri_bytes: usize,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            notifications_per_sec: 20,
            notification_burst: 50,
            max_message_bytes: 256 * 1024,
            max_requests_per_call: 16,
            input_state_ttl_secs: 600,
            unrouted_logs_per_sec: 5,
            max_subscriptions_per_session: 64,
            max_subscribed_uri_bytes: 2048,
        }
    }
}

impl RelayConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.notification_burst == 0 {
            return Err("relay.notification_burst must be greater than 0".into());
        }
        if self.max_message_bytes == 0 || self.max_message_bytes > MAX_MESSAGE_BYTES {
            return Err(format!(
                "relay.max_message_bytes must be between 1 and {MAX_MESSAGE_BYTES}"
            ));
        }
        if self.max_requests_per_call == 0 || self.max_requests_per_call > MAX_REQUESTS_PER_CALL {
            return Err(format!(
                "relay.max_requests_per_call must be between 1 and {MAX_REQUESTS_PER_CALL}"
            ));
        }
        if self.input_state_ttl_secs == 0
            || self.input_state_ttl_secs > crate::config::MAX_TIMEOUT_SECS
        {
            return Err(format!(
                "relay.input_state_ttl_secs must be between 1 and {}",
                crate::config::MAX_TIMEOUT_SECS
            ));
        }
        if self.max_subscriptions_per_session == 0
            || self.max_subscriptions_per_session > MAX_SUBSCRIPTIONS_PER_SESSION
        {
            return Err(format!(
                "relay.max_subscriptions_per_session must be between 1 and {MAX_SUBSCRIPTIONS_PER_SESSION}"
            ));
        }
        if self.max_subscribed_uri_bytes == 0
            || self.max_subscribed_uri_bytes > MAX_SUBSCRIBED_URI_BYTES
        {
            return Err(format!(
                "relay.max_subscribed_uri_bytes must be between 1 and {MAX_SUBSCRIBED_URI_BYTES}"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<RelayConfig, String> {
        let c: RelayConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        c.validate().map(|()| c)
    }

    #[test]
    fn the_subscribed_uri_bound_is_a_key_with_bounds() {
        assert_eq!(load("").unwrap().max_subscribed_uri_bytes, 2048);
        assert_eq!(
            load("max_subscribed_uri_bytes = 100\n")
                .unwrap()
                .max_subscribed_uri_bytes,
            100
        );
        assert!(load("max_subscribed_uri_bytes = 65536\n").is_ok());
        for bad in ["0", "65537"] {
            let err = load(&format!("max_subscribed_uri_bytes = {bad}\n")).unwrap_err();
            assert!(
                err.contains("relay.max_subscribed_uri_bytes"),
                "{bad}: {err}"
            );
        }
    }
}
