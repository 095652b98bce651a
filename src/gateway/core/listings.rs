//! What the workers serve: each worker's listings (asked when it is ready, on reload, on a
//! refresh and on an upstream's `list_changed`), applied to the catalog, and agents told
//! when it changed. The upstream servers' state (eras, pins) is in `UpstreamsState`.

use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::Instant;

use super::calls::{Call, Purpose, Stage};
use super::{Action, ConnRef, Core, Recorder, WorkerView};
use crate::aggregator::gateway_state::UpstreamsState;
use crate::log::Level;
use crate::mcp::catalog::{Kind, WorkerId};
use crate::mcp::jsonrpc;
use crate::workers::rpc::{self, Op};

impl<R: Recorder> Core<R> {
    /// The upstream servers and the workers that reach them; the core lists and routes
    /// them.
    pub fn set_upstreams(&mut self, upstreams: UpstreamsState) {
        self.upstreams = Some(upstreams);
    }

    pub fn upstreams(&self) -> Option<&UpstreamsState> {
        self.upstreams.as_ref()
    }

    pub fn upstreams_mut(&mut self) -> Option<&mut UpstreamsState> {
        self.upstreams.as_mut()
    }

    /// The parameters tool `name` (as `peer` calls it) binds to `Mcp-Param-*` headers,
    /// for the HTTP door to check a call's headers against. None for a tool the catalog
    /// does not serve or policy hides from `peer`: the call is refused as such later, and
    /// the door's answer must not tell more about it than a listing would.
    pub fn header_bindings(
        &self,
        name: &str,
        peer: &super::Peer,
    ) -> &[crate::mcp::param_headers::Binding] {
        match self.catalog.get(Kind::Tools, name) {
            Some(e)
                if !self.policy.hides_tool(
                    &e.name,
                    &e.server,
                    &peer.principal,
                    peer.transport,
                    &peer.process,
                ) =>
            {
                &e.header_bindings
            }
            _ => &[],
        }
    }

    pub(super) fn is_aggregator(&self, worker: WorkerId) -> bool {
        self.upstreams.as_ref().is_some_and(|u| u.is_worker(worker))
    }

    /// Serve the `ws` server: its tools are in the catalog from the start (ready or not),
    /// and calls are routed by the caller's workspaces.
    pub fn set_workspaces(
        &mut self,
        directory: crate::workspace::WorkspaceDirectory,
        workers: HashMap<String, WorkerId>,
    ) {
        if let Some(&any) = workers.values().next() {
            let _ = self.catalog.set(
                Kind::Tools,
                crate::workspace::tools::SERVER,
                any,
                crate::workspace::routing::catalog_definitions(),
            );
        }
        self.workspaces = Some((directory, workers));
    }

    /// Register a worker slot; returns its id.
    pub fn add_worker(&mut self, name: &str, server: &str) -> WorkerId {
        self.workers.push(WorkerView {
            name: name.to_owned(),
            server: server.to_owned(),
            ready: false,
        });
        self.workers.len() - 1
    }

    pub fn workers(&self) -> &[WorkerView] {
        &self.workers
    }

    /// Listings the gateway asked of its workers and has not had answered.
    pub fn listings_pending(&self) -> usize {
        let upstream = self
            .upstreams
            .as_ref()
            .map_or(0, UpstreamsState::listings_pending);
        self.calls
            .iter()
            .filter(|(_, c)| matches!(c.purpose, Purpose::Listing { .. }))
            .count()
            .max(upstream)
    }

    /// As [`Core::listings_pending`], of the workers `counted` accepts.
    pub fn listings_pending_where(&self, counted: impl Fn(WorkerId) -> bool) -> usize {
        let upstream = self
            .upstreams
            .as_ref()
            .map_or(0, |u| u.listings_pending_where(&counted));
        self.calls
            .iter()
            .filter(|(_, c)| matches!(c.purpose, Purpose::Listing { .. }) && counted(c.worker))
            .count()
            .max(upstream)
    }

    /// A worker attested and may get work: ask it what it serves.
    pub fn on_worker_ready(&mut self, worker: WorkerId, now: Instant) {
        self.now = now;
        self.workers[worker].ready = true;
        if self.is_aggregator(worker) {
            // Credentials first (only over this channel), then every server's lists.
            let key = self.calls.new_key();
            let Some(msg) = self
                .upstreams
                .as_ref()
                .map(|u| u.configure_request(worker, key))
            else {
                return;
            };
            self.internal_request(key, worker, Purpose::Configure, msg);
            self.refresh_upstreams_of(worker, now);
            return;
        }
        let server = self.workers[worker].server.clone();
        self.list_server(
            worker,
            &server,
            &[Kind::Tools, Kind::Resources, Kind::Prompts],
        );
    }

    fn list_server(&mut self, worker: WorkerId, server: &str, kinds: &[Kind]) {
        for kind in kinds {
            let key = self.calls.new_key();
            let msg = rpc::Message::Request {
                id: key,
                op: Op::List {
                    kind: (*kind).into(),
                },
            };
            let purpose = Purpose::Listing {
                kind: *kind,
                server: server.to_owned(),
            };
            self.internal_request(key, worker, purpose, msg);
        }
    }

    /// A request the gateway itself makes of a worker (configure, listings, attest): a
    /// call with no agent behind it, under the request timeout.
    pub(super) fn internal_request(
        &mut self,
        key: u64,
        worker: WorkerId,
        purpose: Purpose,
        msg: rpc::Message,
    ) {
        let deadline = self.now + self.timeout("gateway.request_timeout_secs");
        self.calls.insert(
            key,
            Call {
                purpose,
                worker,
                stage: Stage::AtWorker,
                started: self.now,
                deadline,
                timeout_key: "gateway.request_timeout_secs",
                lane: None,
                unsent: None,
            },
        );
        self.actions.push(Action::ToWorker {
            worker,
            call: Some(key),
            msg,
        });
    }

    /// Ask a live worker to run its confinement probes again (with its threads running).
    /// The fresh report lands in the ledger as a `worker_reattested` event.
    pub fn request_attest(&mut self, worker: WorkerId, now: Instant) -> bool {
        self.now = now;
        if !self.workers[worker].ready {
            return false;
        }
        let key = self.calls.new_key();
        let msg = rpc::Message::Request {
            id: key,
            op: Op::Attest,
        };
        self.internal_request(key, worker, Purpose::Attest, msg);
        true
    }

    /// An event from a worker other than the aggregator: recorded.
    pub(super) fn on_worker_event(&mut self, worker: WorkerId, kind: &str, detail: &str) {
        self.event(
            "worker_event",
            json!({"worker": self.workers[worker].name, "kind": kind, "detail": detail}),
        );
    }

    /// A listing came back: the catalog takes it (pins reviewed first), agents are told.
    pub(super) fn complete_listing(
        &mut self,
        worker: WorkerId,
        kind: Kind,
        server: &str,
        ok: Option<String>,
        error: Option<rpc::RpcError>,
    ) {
        let items = ok
            .as_deref()
            .and_then(|t| serde_json::from_str::<Vec<Value>>(t).ok());
        let Some(items) = items else {
            let why = error
                .map(|e| e.message)
                .unwrap_or_else(|| "not a JSON array".into());
            self.log(
                Level::Warn,
                format!("server {server}: listing failed: {why}"),
            );
            return;
        };
        match self.catalog.set(kind, server, worker, items) {
            Ok(changed) => {
                let count = self.catalog.len(kind);
                self.event(
                    "catalog",
                    json!({"server": server, "kind": kind.list_key(), "count": count}),
                );
                if changed {
                    self.broadcast_list_changed(kind);
                }
            }
            Err(e) => self.log(Level::Warn, format!("catalog: {}", e.0)),
        }
    }

    pub(super) fn broadcast_list_changed(&mut self, kind: Kind) {
        let method = match kind {
            Kind::Tools => "notifications/tools/list_changed",
            Kind::Resources | Kind::Templates => "notifications/resources/list_changed",
            Kind::Prompts => "notifications/prompts/list_changed",
        };
        let bytes = jsonrpc::notification(method, &json!({}));
        let conns: Vec<ConnRef> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.protocol_version.is_some())
            .map(|(c, _)| *c)
            .collect();
        for conn in conns {
            self.actions.push(Action::Notify {
                conn,
                bytes: bytes.clone(),
            });
        }
    }
}
