//! Resource subscriptions at a 2026-07-28 server. That era has no `resources/subscribe`:
//! a client names the URIs it wants `notifications/resources/updated` for in the
//! `resourceSubscriptions` of its `subscriptions/listen` stream, and changes them by
//! opening the stream again. toolwall keeps one set per server for all its agents (the
//! gateway forwards a session's unsubscribe only when no other session holds the URI), so
//! an agent's subscribe or unsubscribe to such a server changes the set and is answered
//! `{}` here; the listening stream is opened again with the new set (see
//! `Upstream::stay_connected`: while a set is held, the stream is re-opened after
//! `[servers] subscription_recheck_secs` without traffic, so a change applies within that
//! time). One server is asked to watch at most `[servers] max_server_subscriptions` URIs.

use serde_json::Value;
use std::collections::BTreeSet;

use super::error::{UpstreamError, UpstreamErrorCode};

/// Whether `method` is converted for a modern server.
pub fn converted(method: &str) -> bool {
    matches!(method, "resources/subscribe" | "resources/unsubscribe")
}

/// Apply `method` with `params` (the agent's, as judged) to `set`, which may hold `max`
/// URIs (`[servers] max_server_subscriptions`; beyond, a subscribe is refused as `busy`;
/// the gateway bounds each session with `relay.max_subscriptions_per_session`). Ok(true)
/// when the set changed.
pub fn apply(
    set: &mut BTreeSet<String>,
    max: usize,
    server: &str,
    method: &str,
    params: &Value,
) -> Result<bool, UpstreamError> {
    let Some(uri) = params.get("uri").and_then(Value::as_str) else {
        return Err(UpstreamError::new(
            UpstreamErrorCode::InvalidArguments,
            format!("{method} needs a string uri"),
        ));
    };
    if method == "resources/unsubscribe" {
        return Ok(set.remove(uri));
    }
    if set.contains(uri) {
        return Ok(false);
    }
    if set.len() >= max {
        return Err(UpstreamError::new(
            UpstreamErrorCode::Busy,
            format!(
                "server {server}: {max} resources are watched already (servers.max_server_subscriptions); unsubscribe from one first"
            ),
        ));
    }
    set.insert(uri.to_owned());
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_set_follows_subscribes_and_is_bounded() {
        const MAX: usize = 16;
        let mut set = BTreeSet::new();
        let sub = |set: &mut BTreeSet<String>, uri: &str| {
            apply(set, MAX, "s", "resources/subscribe", &json!({"uri": uri}))
        };
        assert_eq!(sub(&mut set, "test://a"), Ok(true));
        assert_eq!(sub(&mut set, "test://a"), Ok(false));
        let un = apply(
            &mut set,
            MAX,
            "s",
            "resources/unsubscribe",
            &json!({"uri": "test://a"}),
        );
        assert_eq!(un, Ok(true));
        assert!(set.is_empty());
        assert!(apply(&mut set, MAX, "s", "resources/subscribe", &json!({})).is_err());
        for n in 0..MAX {
            sub(&mut set, &format!("test://{n}")).unwrap();
        }
        let e = sub(&mut set, "test://one-more").unwrap_err();
        assert_eq!(e.code, UpstreamErrorCode::Busy);
        assert!(
            e.message.contains("servers.max_server_subscriptions"),
            "{e:?}"
        );
        // A URI held already is no new one; an unsubscribe makes room.
        assert_eq!(sub(&mut set, "test://0"), Ok(false));
        let un = apply(
            &mut set,
            MAX,
            "s",
            "resources/unsubscribe",
            &json!({"uri": "test://0"}),
        );
        assert_eq!(un, Ok(true));
        assert_eq!(sub(&mut set, "test://one-more"), Ok(true));
        assert!(converted("resources/subscribe") && !converted("resources/read"));
    }
}
