//! Resource subscriptions of agent sessions. An agent's `resources/subscribe` crosses the
//! pipeline to the URI's owner; once the server accepted it, the session holds the URI
//! (with the server that owns it), and a `notifications/resources/updated` of that server
//! for that URI reaches the sessions that hold it, and no one else. An unsubscribe the
//! server accepted drops the URI; a session's subscriptions end with the session. Each
//! session holds at most `relay.max_subscriptions_per_session` URIs, each at most
//! `relay.max_subscribed_uri_bytes` long.
//!
//! The framed and stdio doors carry the updates as notifications (and declare
//! `resources.subscribe` when a server offers it). The HTTP door has no standing stream
//! for a legacy session, so there an update travels only on the SSE stream of a call of
//! that session in flight, and the capability is not declared (as `listChanged` is not).
//!
//! toolwall keeps one session with each server for all agents: it forwards every
//! subscribe, and forwards an unsubscribe only when no other session still holds the URI
//! (otherwise the server would stop telling the others); that unsubscribe is answered by
//! toolwall itself, after the same request phase and row.

use serde_json::{Value, json};
use std::collections::BTreeMap;

use super::exchange::{Exchange, Routed};
use super::{Action, ConnRef, Core, Recorder};
use crate::mcp::catalog::WorkerId;
use crate::mcp::jsonrpc;
use crate::workers::relay_wire::CallMeta;
use crate::workers::rpc::{self, Op, UpstreamCall};

/// The URIs one session is subscribed to, with the server that owns each and its worker.
pub type SessionSubscriptions = BTreeMap<String, (String, WorkerId)>;

pub const UPDATED: &str = "notifications/resources/updated";

/// Unsubscribes toolwall sent itself (a session went), by request id: server and URI, so a
/// failed one is said (no agent waits for its answer). At most `gateway.max_in_flight_total`
/// (the oldest is forgotten: a worker that never answers cannot grow it).
pub type PendingReleases = BTreeMap<u64, (String, String)>;

impl<R: Recorder> Core<R> {
    /// Why `conn` may not subscribe to one more URI, if it may not.
    pub(super) fn subscription_refusal(&self, conn: ConnRef, uri: &str) -> Option<String> {
        let longest = self.relay.config.max_subscribed_uri_bytes;
        if uri.len() > longest {
            return Some(format!(
                "a subscribed URI may be at most {longest} bytes (relay.max_subscribed_uri_bytes); this one is {}",
                uri.len()
            ));
        }
        let held = self.sessions.get(&conn)?;
        let max = self.relay.config.max_subscriptions_per_session;
        (held.subscribed.len() >= max && !held.subscribed.contains_key(uri)).then(|| {
            format!(
                "this session holds {max} resource subscriptions already \
                 (relay.max_subscriptions_per_session); unsubscribe from one first"
            )
        })
    }

    /// Another session than `conn` holds `uri` of `server`.
    pub(super) fn subscribed_elsewhere(
        &self,
        conn: Option<ConnRef>,
        uri: &str,
        server: &str,
    ) -> bool {
        self.sessions.iter().any(|(c, s)| {
            Some(*c) != conn
                && s.subscribed
                    .get(uri)
                    .is_some_and(|(owner, _)| owner == server)
        })
    }

    /// The server accepted `x` (a subscribe or unsubscribe): the session's table follows.
    pub(super) fn subscription_answered(&mut self, x: &Exchange) {
        let (Some(conn), Some(uri)) = (x.from.conn, x.target.resource.as_deref()) else {
            return;
        };
        let max = self.relay.config.max_subscriptions_per_session;
        let Some(session) = self.sessions.get_mut(&conn) else {
            return;
        };
        match x.routed {
            Routed::Subscribe
                if session.subscribed.len() < max || session.subscribed.contains_key(uri) =>
            {
                session
                    .subscribed
                    .insert(uri.to_owned(), (x.target.server.clone(), x.target.worker));
            }
            Routed::Unsubscribe => {
                session.subscribed.remove(uri);
            }
            _ => {}
        }
    }

    /// A server's `notifications/resources/updated`: to the sessions subscribed to its
    /// URI at that server; nobody else hears of it.
    pub(super) fn relay_resource_updated(&mut self, server: &str, params: Option<&Value>) {
        let Some(uri) = params.and_then(|p| p.get("uri")).and_then(Value::as_str) else {
            self.counters.relay_dropped += 1;
            return;
        };
        let conns: Vec<ConnRef> = self
            .sessions
            .iter()
            .filter(|(_, s)| {
                s.subscribed
                    .get(uri)
                    .is_some_and(|(owner, _)| owner == server)
            })
            .map(|(c, _)| *c)
            .collect();
        if conns.is_empty() {
            self.counters.relay_dropped += 1;
            return;
        }
        // Only the URI travels: whatever else the server put in is not the agent's to read.
        let bytes = jsonrpc::notification(UPDATED, &json!({"uri": uri}));
        for conn in conns {
            // On the HTTP door no standing stream carries notifications: the stream of a
            // legacy call of that session in flight does, if there is one. Elsewhere the
            // connection itself.
            let in_call = self
                .calls
                .keys_where(|c| {
                    c.exchange()
                        .is_some_and(|x| x.from.conn == Some(conn) && !x.relay.modern)
                })
                .first()
                .copied()
                .and_then(|k| {
                    let x = self.calls.get(k)?.exchange()?;
                    Some((k, x.from.stream))
                });
            let action = match in_call {
                Some((call, stream)) => Action::Relay {
                    conn,
                    stream,
                    call,
                    bytes: bytes.clone(),
                    request_id: None,
                },
                None => Action::Notify {
                    conn,
                    bytes: bytes.clone(),
                },
            };
            self.actions.push(action);
        }
    }

    /// The answer to request `id`, which no call owns: if it is an unsubscribe toolwall
    /// sent, a failure is logged and recorded (the server may go on sending updates that
    /// now reach no one).
    pub(super) fn release_answered(&mut self, id: u64, error: Option<&rpc::RpcError>) {
        let Some((server, uri)) = self.releases.remove(&id) else {
            return;
        };
        let Some(e) = error else {
            return;
        };
        self.event(
            "subscription_release_failed",
            json!({"server": server, "uri": uri, "code": e.kind, "message": e.message}),
        );
        self.log(
            crate::log::Level::Warn,
            format!(
                "server {server}: the unsubscribe from {uri:?} toolwall sent for a session that went failed ({}): {}",
                e.kind, e.message
            ),
        );
    }

    /// `conn` is going: a URI it held that no other session holds is unsubscribed at its
    /// server, so the server stops sending its updates (and a 2026-07-28 server's watched
    /// set shrinks). toolwall's own request: no agent waits for it, its answer is dropped.
    pub(super) fn release_subscriptions(&mut self, conn: ConnRef) {
        let Some(held) = self.sessions.get(&conn).map(|s| s.subscribed.clone()) else {
            return;
        };
        for (uri, (server, worker)) in held {
            if self.subscribed_elsewhere(Some(conn), &uri, &server) || !self.is_aggregator(worker) {
                continue;
            }
            let c = &self.relay.config;
            let meta = CallMeta {
                max_message_bytes: c.max_message_bytes,
                max_answer_bytes: self.limits.max_answer_bytes,
                max_json_nodes: self.limits.max_json_nodes,
                ..CallMeta::default()
            };
            let key = self.calls.new_key();
            if self.releases.len() >= self.limits.max_in_flight_total.max(1) {
                self.releases.pop_first();
            }
            self.releases.insert(key, (server.clone(), uri.clone()));
            self.event(
                "subscription_released",
                json!({"server": server, "uri": uri,
                       "reason": "the last session subscribed to it is gone"}),
            );
            self.actions.push(Action::ToWorker {
                worker,
                call: None,
                msg: rpc::Message::Request {
                    id: key,
                    op: Op::Forward {
                        method: "resources/unsubscribe".into(),
                        params: json!({ "uri": uri }).to_string(),
                        upstream: Some(UpstreamCall {
                            server,
                            meta: Box::new(meta),
                        }),
                    },
                },
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::Harness;
    use super::*;

    /// The unsubscribe toolwall sent for a session that went has no agent to tell: its
    /// failure is logged (once), its success is not.
    #[test]
    fn a_failed_release_is_said_once() {
        let mut h = Harness::new("");
        h.core.take_logs();
        let answer = |h: &mut Harness, id: u64, failed: bool| {
            let msg = rpc::Message::Response {
                id,
                ok: (!failed).then(|| "{}".into()),
                error: failed.then(|| rpc::RpcError {
                    kind: "connect_failed".into(),
                    message: "server old: Peer disconnected".into(),
                }),
                facts: None,
            };
            h.core.on_worker_message(0, msg, h.now);
        };
        for id in [900_001, 900_002] {
            h.core
                .releases
                .insert(id, ("old".into(), "test://watched".into()));
        }
        answer(&mut h, 900_001, false);
        assert!(h.core.take_logs().is_empty());
        answer(&mut h, 900_002, true);
        let logs = h.core.take_logs();
        assert_eq!(logs.len(), 1, "{logs:?}");
        assert!(
            logs[0].1.contains("server old")
                && logs[0].1.contains("test://watched")
                && logs[0].1.contains("Peer disconnected"),
            "{logs:?}"
        );
        // Said once: the entry is gone.
        answer(&mut h, 900_002, true);
        assert!(h.core.take_logs().is_empty());
        assert!(h.core.releases.is_empty());
    }
}
