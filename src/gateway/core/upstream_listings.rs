//! The core's side of upstream listings: when to list a server (through the relisting
//! schedule: one listing in flight per list, a minimum interval, floods folded and
//! counted), staging each listing for the intake thread (the loop hands the jobs over,
//! [`Core::take_intake_jobs`], and feeds back what the thread did, [`Core::on_intake_done`]),
//! applying that to the catalog at once, and telling agents. Pin approvals and `pins list`
//! read and write the pin store in the loop, which hands the rows in
//! ([`Core::pin_approved`], [`Core::pins_json`]). Everything that decides lives in
//! `aggregator::gateway_state` and the modules it uses; this file only connects it to the
//! call table, the ledger staging and the agents' notifications.

use serde_json::json;
use std::time::Instant;

use super::calls::Purpose;
use super::{Core, Recorder};
use crate::aggregator::config::ServersConfig;
use crate::aggregator::gateway_state::Applied;
use crate::log::Level;
use crate::mcp::catalog::{Entry, Kind, Route, WorkerId};
use crate::pins::intake::{Done, Job};
use crate::pins::store::PinRecord;
use crate::workers::rpc;

impl<R: Recorder> Core<R> {
    /// List every list of every upstream server again (start, reload, refresh, worker
    /// back), through the schedule.
    pub fn refresh_upstreams(&mut self, now: Instant) {
        self.now = now;
        let Some(u) = &self.upstreams else { return };
        for server in u.servers() {
            for kind in Kind::ALL {
                self.want_listing(&server, kind, now);
            }
        }
    }

    /// List every list of the servers `worker` reaches (it is ready, again).
    pub(super) fn refresh_upstreams_of(&mut self, worker: WorkerId, now: Instant) {
        self.now = now;
        let Some(u) = &self.upstreams else { return };
        for server in u.servers_of(worker) {
            for kind in Kind::ALL {
                self.want_listing(&server, kind, now);
            }
        }
    }

    /// Whether the worker that reaches `server` is ready.
    fn upstream_ready(&self, server: &str) -> bool {
        self.upstreams
            .as_ref()
            .and_then(|u| u.worker_of(server))
            .is_some_and(|w| self.workers[w].ready)
    }

    /// A listing is wanted: started now, or left pending (and counted) by the schedule.
    fn want_listing(&mut self, server: &str, kind: Kind, now: Instant) {
        if !self.upstream_ready(server) {
            return;
        }
        let Some(u) = self.upstreams.as_mut() else {
            return;
        };
        if u.want(server, kind, now) {
            self.send_listing(server, kind, now);
        }
    }

    fn send_listing(&mut self, server: &str, kind: Kind, now: Instant) {
        self.now = now;
        let key = self.calls.new_key();
        let Some(u) = &self.upstreams else { return };
        let Some(worker) = u.worker_of(server) else {
            return;
        };
        let msg = u.listing_request(key, server, kind);
        let listing = Purpose::Listing {
            kind,
            server: server.to_owned(),
        };
        self.internal_request(key, worker, listing, msg);
    }

    /// The aggregator answered a listing: off to the intake, or over (logged).
    pub(super) fn upstream_listing_answered(
        &mut self,
        worker: WorkerId,
        kind: Kind,
        server: &str,
        ok: Option<String>,
        error: Option<rpc::RpcError>,
        facts: Option<String>,
    ) {
        let wall_ms = self.wall_ms();
        let Some(u) = self.upstreams.as_mut() else {
            return;
        };
        let error = error.map(|e| format!("{}: {}", e.kind, e.message));
        if let Err(applied) =
            u.listing_answered(server, kind, worker, ok, error, facts.as_deref(), wall_ms)
        {
            self.carry_out(applied);
        }
        self.drain_upstream_logs();
    }

    /// Jobs for the intake thread (listings to review, owners to record), staged since
    /// the last call: the loop hands them over.
    pub fn take_intake_jobs(&mut self) -> Vec<Job> {
        self.upstreams
            .as_mut()
            .map(|u| u.take_jobs())
            .unwrap_or_default()
    }

    /// The intake thread would not take `job` (gone, or its queue full).
    pub fn intake_refused(&mut self, job: Job, now: Instant) {
        self.now = now;
        if let Some(u) = self.upstreams.as_mut() {
            let applied = u.intake_refused(job);
            self.carry_out(applied);
        }
    }

    /// What the intake thread finished: reviewed listings go into the catalog at once.
    pub fn on_intake_done(&mut self, done: Vec<Done>, now: Instant) {
        self.now = now;
        let wall_ms = self.wall_ms();
        let Some(u) = self.upstreams.as_mut() else {
            return;
        };
        let applied = u.apply_reviewed(&mut self.catalog, done, now, wall_ms);
        self.carry_out(applied);
    }

    /// Applying a listing of `kind` from `server` cost the loop `cost` (measured by the
    /// loop): its next listing waits in proportion.
    pub fn listing_cost(
        &mut self,
        server: &str,
        kind: Kind,
        cost: std::time::Duration,
        now: Instant,
    ) {
        if let Some(u) = self.upstreams.as_mut() {
            u.charge_listing(server, kind, cost, now);
        }
    }

    /// A listing call ended without an answer (timeout, worker gone).
    pub(super) fn upstream_listing_failed(&mut self, kind: Kind, server: &str, why: &str) {
        if let Some(u) = self.upstreams.as_mut() {
            let applied = u.listing_failed(server, kind, why);
            self.carry_out(applied);
        }
    }

    /// Every loop turn: stderr counts due, relistings whose turn came.
    pub(super) fn upstream_tick(&mut self, now: Instant) {
        let Some(u) = self.upstreams.as_mut() else {
            return;
        };
        u.on_timer(now);
        self.drain_upstream_logs();
        // Listings of a server whose worker is down stay pending until it is back.
        let ready: Vec<String> = self
            .upstreams
            .as_ref()
            .map(|u| {
                u.servers()
                    .into_iter()
                    .filter(|s| self.upstream_ready(s))
                    .collect()
            })
            .unwrap_or_default();
        let Some(u) = self.upstreams.as_mut() else {
            return;
        };
        let due = u.due(now, |s| ready.iter().any(|r| r == s));
        for (server, kind) in due {
            self.send_listing(&server, kind, now);
        }
    }

    /// An event of the aggregator: state changes are recorded; `list_changed` is counted
    /// and folded into the schedule, never recorded or logged one by one.
    pub(super) fn on_upstream_event(
        &mut self,
        worker: WorkerId,
        kind: &str,
        detail: &str,
        now: Instant,
    ) {
        if kind == "upstream_state" {
            self.offers.note(detail);
        }
        if !matches!(kind, "list_changed" | "stderr") {
            self.event(
                "worker_event",
                json!({"worker": self.workers[worker].name, "kind": kind, "detail": detail}),
            );
        }
        let Some(u) = self.upstreams.as_mut() else {
            return;
        };
        let relist = u.on_event(worker, kind, detail, now);
        self.drain_upstream_logs();
        let Some(relist) = relist else {
            return;
        };
        for kind in relist.kinds {
            self.want_listing(&relist.server, kind, now);
            // Templates live under the resources capability: they change with them.
            if kind == Kind::Resources {
                self.want_listing(&relist.server, Kind::Templates, now);
            }
        }
    }

    /// A reload kept the servers: new pin modes, budgets, `new_tools`, owners apply now.
    pub fn reconfigure_upstreams(&mut self, servers: &ServersConfig, now: Instant) {
        self.now = now;
        let wall_ms = self.wall_ms();
        let names: std::collections::BTreeSet<&String> =
            servers.enabled().map(|(n, _)| n).collect();
        self.offers.retain(|s| names.contains(&s.to_owned()));
        let Some(u) = self.upstreams.as_mut() else {
            return;
        };
        u.reconfigure(servers, now);
        let applied = u.recheck_owners(&mut self.catalog, wall_ms);
        self.carry_out(applied);
    }

    /// `toolwall pins approve TOOL --digest D`: the loop approved exactly that definition
    /// in the pin store (`before` and `after`: the tool's row around the write). Its calls
    /// are served again, the tool's server is listed again, and the answer says what was
    /// approved.
    pub fn pin_approved(
        &mut self,
        tool: &str,
        digest: &str,
        who: &str,
        (before, after): (&PinRecord, &PinRecord),
        now: Instant,
    ) -> Result<String, String> {
        self.now = now;
        let Some(u) = self.upstreams.as_mut() else {
            return Err("no upstream servers are configured".into());
        };
        let (server, what) = u.pin_approved(tool, digest, before, after);
        self.event(
            "pin",
            json!({"what": "approved", "tool": tool, "digest": digest, "by": who}),
        );
        self.log(Level::Info, format!("pin: {what}, by {who}"));
        self.want_listing(&server, crate::pins::kinds::kind_of(tool), now);
        Ok(format!("{what}; server {server} is being listed again"))
    }

    /// Where a `resources/read` of `uri` goes; `Err` says why nobody serves it.
    pub(super) fn resource_entry(&self, uri: &str) -> Result<Option<Route>, String> {
        match &self.upstreams {
            Some(u) => u
                .resource_route(&self.catalog, uri)
                .map(|e| e.map(Entry::route)),
            None => Ok(self.catalog.get(Kind::Resources, uri).map(Entry::route)),
        }
    }

    /// `toolwall pins list`: the rows the loop read from the pin store, as the admin
    /// answer.
    pub fn pins_json(&self, rows: Result<Vec<PinRecord>, String>) -> serde_json::Value {
        match &self.upstreams {
            Some(u) => u.pins_json(rows),
            None => json!({"ok": true, "pins": []}),
        }
    }

    fn drain_upstream_logs(&mut self) {
        let Some(u) = self.upstreams.as_mut() else {
            return;
        };
        for (warn, line) in u.take_logs() {
            self.log(if warn { Level::Warn } else { Level::Info }, line);
        }
    }

    pub(super) fn carry_out(&mut self, applied: Applied) {
        for (warn, line) in applied.logs {
            self.log(if warn { Level::Warn } else { Level::Info }, line);
        }
        for (kind, detail) in applied.events {
            self.event(kind, detail);
        }
        for kind in applied.changed {
            self.broadcast_list_changed(kind);
        }
    }
}
