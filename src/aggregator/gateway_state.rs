//! What the gateway's core keeps about the upstream servers: which worker reaches each of
//! them (the aggregator worker for `url` servers, a host of its own for each local
//! server), each worker's `configure` setup (credentials included: they live only here
//! and in the RPC message), each server's state for `status`, when to list each of them again, the
//! listing intake (pins, off the loop), the tools their pins hide, and who owns which
//! resource URI. The core calls it at the points named in each method and applies what it
//! returns (`src/gateway/core/upstream_listings.rs`).

use serde_json::{Value, json};
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::Waker;

use super::config::ServersConfig;
use super::error::quote_upstream;
use super::relist::RelistSchedule;
use super::setup::AggregatorSetup;
use super::spec;
use super::status::{Relist, UpstreamBoard};
use crate::ledger::now_ms;
use crate::mcp::catalog::claims::ClaimChange;
use crate::mcp::catalog::listing::Refusal;
use crate::mcp::catalog::resource_owners::OwnerRules;
use crate::mcp::catalog::{Catalog, Kind, NAMESPACE_SEP, WorkerId, split_namespaced};
use crate::pins::intake::{Done, Intake, Job, ListingJob, ServerRules};
use crate::pins::store::PinStore;
use crate::pins::{PinMode, views};
use crate::workers::rpc::{Message, Op};

/// Conflicting URIs named per server in `status` (the rest are counted).
pub const CONFLICT_SAMPLE: usize = 10;

/// What applying one intake result produced, for the core to carry out.
#[derive(Debug, Default)]
pub struct Applied {
    /// Lists agents now see differently (broadcast `list_changed`).
    pub changed: Vec<Kind>,
    /// Ledger events (kind, detail).
    pub events: Vec<(&'static str, Value)>,
    /// Log lines (warning?, text).
    pub logs: Vec<(bool, String)>,
}

pub struct UpstreamsState {
    /// The worker that reaches each enabled server.
    routes: HashMap<String, WorkerId>,
    /// Each worker's `configure` setup (its servers only).
    setups: HashMap<WorkerId, AggregatorSetup>,
    config: ServersConfig,
    board: UpstreamBoard,
    rules: HashMap<String, Arc<ServerRules>>,
    schedule: RelistSchedule,
    intake: Intake,
    /// The loop's own connection: approvals (one row) and `pins list`.
    pins: Option<PinStore>,
    /// Per server: tools its pins hide, with the message their calls are refused with.
    hidden: HashMap<String, HashMap<String, String>>,
    owners: OwnerRules,
    /// Servers whose resources (and templates) have been listed in this run.
    resources_listed: BTreeSet<(String, Kind)>,
    /// URIs served alone since start, waiting for every other server to list before they
    /// are remembered (ownership does not depend on who answers first).
    candidates: crate::aggregator::owner_candidates::OwnerCandidates,
    /// Servers told (once) that they reached `max_remembered_uris`.
    owners_over_cap: BTreeSet<String>,
    /// Set while the first settling remembers what every server's first listing left alone.
    settling: bool,
    /// When each server's remembered URIs were last refreshed in the store.
    owners_refreshed: HashMap<String, Instant>,
    refresh: Option<Duration>,
    next_refresh: Option<Instant>,
    /// Local servers' last stderr lines.
    stderr: crate::stdio_server::stderr_board::StderrBoard,
    /// Log lines from events, for the core to write.
    logs: Vec<String>,
}

fn server_rules(config: &ServersConfig, name: &str) -> Arc<ServerRules> {
    let s = config.servers.get(name).cloned().unwrap_or_default();
    Arc::new(ServerRules {
        server: name.to_owned(),
        origin: crate::pins::origin::of_server(&s.url, s.command.as_deref()),
        mode: s.pin,
        new_tools: s.new_tools(),
        renamed_from: s.renamed_from.clone(),
        configured: config.servers.keys().cloned().collect(),
        retention_ms: i64::try_from(config.pin_retention_secs.saturating_mul(1000))
            .unwrap_or(i64::MAX),
        absent_cap: config.budget(name).max_tools,
        prefix: s.prefix,
    })
}

fn owns(config: &ServersConfig) -> Vec<(String, Vec<String>)> {
    config
        .servers
        .iter()
        .map(|(n, s)| (n.clone(), s.owns_resources.clone()))
        .collect()
}

impl UpstreamsState {
    /// `[servers] max_queued_bytes`.
    pub fn max_queued_bytes(&self) -> usize {
        self.config.max_queued_bytes
    }

    /// `setup` from [`super::prepare::build_setup`], for the aggregator `worker`; see
    /// [`UpstreamsState::empty`].
    pub fn new(
        worker: WorkerId,
        config: &ServersConfig,
        setup: AggregatorSetup,
        ledger_path: &Path,
        waker: Arc<Waker>,
        now: Instant,
    ) -> UpstreamsState {
        let mut state = UpstreamsState::empty(config, ledger_path, waker, now);
        state.route(worker, setup);
        state
    }

    /// No worker yet ([`UpstreamsState::route`] adds them); the pin store opens beside the
    /// ledger (after `Ledger::open` migrated it) and the intake thread starts; `waker`
    /// wakes the loop when a listing has been reviewed.
    pub fn empty(
        config: &ServersConfig,
        ledger_path: &Path,
        waker: Arc<Waker>,
        now: Instant,
    ) -> UpstreamsState {
        let refresh = (config.refresh_secs > 0).then(|| Duration::from_secs(config.refresh_secs));
        let pins = match PinStore::open(ledger_path) {
            Ok(s) => Some(s),
            Err(e) => {
                crate::error!("{e}; upstream tools under pin = \"enforce\" stay hidden");
                None
            }
        };
        let mut owners = OwnerRules::new(&owns(config));
        if let Some(store) = &pins {
            match store.owners() {
                Ok(mut rows) => {
                    // The ones seen last, at most `max_remembered_uris` per server (a file
                    // written by an older build may hold more).
                    rows.sort_unstable_by_key(|r| std::cmp::Reverse(r.2));
                    for (uri, server, _) in rows {
                        if owners.remembered_by(&server) < config.max_remembered_uris {
                            owners.remember(&uri, &server);
                        }
                    }
                }
                Err(e) => crate::error!("{e}"),
            }
        }
        let rules = config
            .servers
            .keys()
            .map(|n| (n.clone(), server_rules(config, n)))
            .collect();
        // Listings in flight are at most one per server and kind; owner updates one more.
        let capacity = config.servers.len() * (Kind::ALL.len() + 2) + 8;
        UpstreamsState {
            routes: HashMap::new(),
            setups: HashMap::new(),
            config: config.clone(),
            board: UpstreamBoard::new(config),
            rules,
            schedule: RelistSchedule::new(Duration::from_millis(config.relist_min_interval_ms)),
            intake: Intake::start(ledger_path, waker, capacity),
            pins,
            hidden: HashMap::new(),
            owners,
            resources_listed: BTreeSet::new(),
            candidates: crate::aggregator::owner_candidates::OwnerCandidates::new(
                config.max_remembered_uris,
            ),
            settling: false,
            owners_over_cap: BTreeSet::new(),
            owners_refreshed: HashMap::new(),
            refresh,
            next_refresh: refresh.map(|r| now + r),
            stderr: crate::stdio_server::stderr_board::StderrBoard::new(config.stderr_lines),
            logs: Vec::new(),
        }
    }

    /// `worker` reaches the servers of `setup` (the aggregator: every url server; a local
    /// server's host: that server).
    pub fn route(&mut self, worker: WorkerId, setup: AggregatorSetup) {
        for s in &setup.servers {
            self.routes.insert(s.name.clone(), worker);
        }
        self.setups.insert(worker, setup);
    }

    /// A worker that reaches upstream servers (the aggregator, or a local server's host).
    pub fn is_worker(&self, worker: WorkerId) -> bool {
        self.setups.contains_key(&worker)
    }

    /// The worker that reaches `server`.
    pub fn worker_of(&self, server: &str) -> Option<WorkerId> {
        self.routes.get(server).copied()
    }

    /// Whether `worker` may speak for `server` (events and answers naming another
    /// server are not its to give).
    pub fn speaks_for(&self, worker: WorkerId, server: &str) -> bool {
        self.worker_of(server) == Some(worker)
    }

    /// `on_worker_ready` of an upstream worker: the `configure` request, sent before any
    /// listing. Never log or ledger it (it holds credentials).
    pub fn configure_request(&self, worker: WorkerId, id: u64) -> Message {
        let empty = AggregatorSetup {
            limits: super::setup::Limits::from_config(&self.config),
            servers: Vec::new(),
        };
        spec::configure_request(id, self.setups.get(&worker).unwrap_or(&empty))
    }

    /// Replaces a local server's setup (its secrets were read again on reload); the host
    /// gets it when it is ready again.
    pub fn replace_setup(&mut self, worker: WorkerId, setup: AggregatorSetup) {
        if self.setups.contains_key(&worker) {
            self.setups.insert(worker, setup);
        }
    }

    /// The enabled servers, to list each one (start, refresh, worker restart).
    pub fn servers(&self) -> Vec<String> {
        self.board.enabled().map(str::to_owned).collect()
    }

    /// The enabled servers `worker` reaches.
    pub fn servers_of(&self, worker: WorkerId) -> Vec<String> {
        self.board
            .enabled()
            .filter(|s| self.worker_of(s) == Some(worker))
            .map(str::to_owned)
            .collect()
    }

    /// The `name` field of a request to the aggregator: `server` for listings and
    /// `read_resource`, `server__name` for `call_tool` and `get_prompt`.
    pub fn request_name(op: Op, server: &str, upstream: &str) -> String {
        match op {
            Op::CallTool | Op::GetPrompt => format!("{server}{NAMESPACE_SEP}{upstream}"),
            _ => server.to_owned(),
        }
    }

    // ---- relisting ------------------------------------------------------------------

    /// A listing of `kind` from `server` is wanted: true when it may start now.
    pub fn want(&mut self, server: &str, kind: Kind, now: Instant) -> bool {
        self.schedule.request(server, kind, now)
    }

    /// Listings whose turn came (pending, interval passed) of servers `ready` accepts.
    pub fn due(&mut self, now: Instant, ready: impl Fn(&str) -> bool) -> Vec<(String, Kind)> {
        self.schedule.due(now, ready)
    }

    /// The request for a listing: its budget travels with it, so a reload applies at once.
    pub fn listing_request(&self, id: u64, server: &str, kind: Kind) -> Message {
        let op = match kind {
            Kind::Tools => Op::ListTools,
            Kind::Resources => Op::ListResources,
            Kind::Prompts => Op::ListPrompts,
            Kind::Templates => Op::ListResourceTemplates,
        };
        let budget = self.config.budget(server).listing(server, kind);
        Message::Request {
            id,
            op,
            name: Some(server.to_owned()),
            args: serde_json::to_string(&budget).ok(),
            target: None,
            meta: None,
        }
    }

    /// The worker answered a listing. `Ok`: handed to the intake (the result comes back
    /// through [`Self::take_reviewed`]). `Err`: the listing is over; log it.
    pub fn listing_answered(
        &mut self,
        server: &str,
        kind: Kind,
        worker: WorkerId,
        ok: Option<String>,
        error: Option<String>,
        facts: Option<&str>,
    ) -> Result<(), Applied> {
        if let Some(f) = facts.and_then(|f| serde_json::from_str::<Value>(f).ok()) {
            let n = |k: &str| f.get(k).and_then(Value::as_u64).unwrap_or(0);
            self.board.add_counts(server, n("coalesced"), n("dropped"));
        }
        let Some(text) = ok else {
            let why = error.unwrap_or_else(|| "no result".into());
            return Err(self.listing_over(server, kind, Some(why)));
        };
        let Some(rules) = self.rules.get(server).cloned() else {
            return Err(self.listing_over(server, kind, Some("not a configured server".into())));
        };
        let job = Job::Listing(Box::new(ListingJob {
            server: server.to_owned(),
            kind,
            worker,
            text,
            budget: self.config.budget(server).listing(server, kind),
            rules,
            now_ms: now_ms(),
        }));
        match self.intake.submit(job) {
            Ok(()) => Ok(()),
            Err(_) => Err(self.listing_over(
                server,
                kind,
                Some("the listing intake is not running".into()),
            )),
        }
    }

    /// A listing of `kind` from `server` ended without a result (worker error, timeout).
    pub fn listing_failed(&mut self, server: &str, kind: Kind, why: &str) -> Applied {
        self.listing_over(server, kind, Some(why.to_owned()))
    }

    /// End of a listing; `Some(why)` when it was not applied.
    fn listing_over(&mut self, server: &str, kind: Kind, why: Option<String>) -> Applied {
        self.schedule.done(server, kind);
        // The reason may quote the upstream (or come from a misbehaving worker).
        let why = why.map(|w| quote_upstream(&w, 1000));
        let mut applied = Applied::default();
        let fresh = self.board.set_degraded(server, kind, why.clone());
        if fresh {
            match why {
                Some(why) => {
                    applied.logs.push((
                        true,
                        format!(
                            "server {server}: its {} listing was not applied, it keeps serving its last good catalog: {why}",
                            kind.word()
                        ),
                    ));
                    applied.events.push((
                        "upstream_degraded",
                        json!({"server": server, "kind": kind.list_key(), "reason": why}),
                    ));
                }
                None => {
                    applied.logs.push((
                        false,
                        format!("server {server}: its {} listing applies again", kind.word()),
                    ));
                    applied.events.push((
                        "upstream_recovered",
                        json!({"server": server, "kind": kind.list_key()}),
                    ));
                }
            }
        }
        applied
    }

    /// Listings reviewed by the intake since the last call, applied to `catalog` (each at
    /// once), and owner updates taken in.
    pub fn take_reviewed(&mut self, catalog: &mut Catalog, now: Instant) -> Applied {
        let mut applied = Applied::default();
        for done in self.intake.poll() {
            match done {
                Done::Listing {
                    server,
                    kind,
                    outcome,
                } => self.apply(catalog, &server, kind, *outcome, now, &mut applied),
                Done::Owners {
                    server,
                    pruned,
                    error,
                } => {
                    if let Some(e) = error {
                        applied
                            .logs
                            .push((true, format!("server {server}: resource owners: {e}")));
                    }
                    if !pruned.is_empty() {
                        for uri in &pruned {
                            self.owners.forget(uri);
                        }
                        applied.events.push((
                            "resource_owner_pruned",
                            json!({"server": server, "count": pruned.len(),
                                   "uris": pruned.iter().take(CONFLICT_SAMPLE).collect::<Vec<_>>()}),
                        ));
                        let (r, t) = catalog.recheck_claims(&self.owners);
                        self.claims_changed(catalog, Kind::Resources, r, &mut applied);
                        self.claims_changed(catalog, Kind::Templates, t, &mut applied);
                    }
                }
            }
        }
        applied
    }

    fn apply(
        &mut self,
        catalog: &mut Catalog,
        server: &str,
        kind: Kind,
        outcome: Result<crate::pins::intake::Reviewed, Refusal>,
        now: Instant,
        applied: &mut Applied,
    ) {
        let reviewed = match outcome {
            Ok(r) => r,
            Err(refusal) => {
                let more = self.listing_over(server, kind, Some(refusal.message));
                applied.logs.extend(more.logs);
                applied.events.extend(more.events);
                return;
            }
        };
        let more = self.listing_over(server, kind, None);
        applied.logs.extend(more.logs);
        applied.events.extend(more.events);
        let count = reviewed.entries.len();
        if let Some(summary) = &reviewed.summary {
            if summary.eventful() {
                applied.events.push(("pin", summary.event()));
            }
            applied.logs.extend(summary.log_lines());
        }
        let changed = match kind {
            Kind::Tools | Kind::Prompts => {
                if kind == Kind::Tools {
                    self.hidden
                        .insert(server.to_owned(), reviewed.hidden.into_iter().collect());
                }
                let change = catalog.replace(kind, server, reviewed.entries);
                name_clashes(kind, &change.new_clashes, applied);
                change.changed
            }
            Kind::Resources | Kind::Templates => {
                self.resources_listed.insert((server.to_owned(), kind));
                self.candidates.heard(server, kind);
                let change = catalog.claim(kind, server, reviewed.entries, &self.owners);
                let changed = change.changed;
                self.claims_changed(catalog, kind, change, applied);
                self.settle(catalog, applied);
                self.remember_ripe(catalog);
                self.refresh_owners(catalog, server, now);
                changed
            }
        };
        // Recorded when agents see something different: a server that lists the same
        // again and again (however often it says it changed) writes no row for it.
        if changed {
            applied.events.push((
                "catalog",
                json!({"server": server, "kind": kind.list_key(), "count": count,
                       "hidden": self.hidden.get(server).map_or(0, HashMap::len)}),
            ));
            if !applied.changed.contains(&kind) {
                applied.changed.push(kind);
            }
        }
    }

    /// Report new conflicts (once each) and remember sole owners once settled.
    fn claims_changed(
        &mut self,
        catalog: &Catalog,
        kind: Kind,
        mut change: ClaimChange,
        applied: &mut Applied,
    ) {
        if change.changed && !applied.changed.contains(&kind) {
            applied.changed.push(kind);
        }
        if kind == Kind::Resources {
            // A URI inside another server's template is not served alone: not remembered,
            // and reported as a conflict (reads of it are refused, see `resource_route`).
            let (inside, alone) = crate::aggregator::template_claims::split(
                catalog,
                std::mem::take(&mut change.unremembered),
            );
            change.unremembered = alone;
            change.new_conflicts.extend(inside);
        }
        if !change.new_conflicts.is_empty() {
            let n = change.new_conflicts.len();
            let sample: Vec<Value> = change
                .new_conflicts
                .iter()
                .take(CONFLICT_SAMPLE)
                .map(|(k, why)| json!({"uri": k, "why": why}))
                .collect();
            applied.events.push((
                "resource_conflict",
                json!({"kind": kind.list_key(), "count": n, "sample": sample}),
            ));
            for (_, why) in change.new_conflicts.iter().take(3) {
                applied
                    .logs
                    .push((true, format!("resource conflict: {why}")));
            }
            if n > 3 {
                applied.logs.push((
                    true,
                    format!(
                        "resource conflict: {} more {} (see `toolwall status`)",
                        n - 3,
                        kind.word()
                    ),
                ));
            }
        }
        if self.settling {
            self.remember(change.unremembered);
        } else if self.owners.settled {
            self.candidates.add(kind, change.unremembered);
        }
    }

    /// Remember the waiting URIs every other server has listed after, that are still
    /// served alone by their server.
    fn remember_ripe(&mut self, catalog: &Catalog) {
        if !self.owners.settled || self.candidates.is_empty() {
            return;
        }
        let ripe = self.candidates.ripe(&self.servers());
        let mut sole = Vec::new();
        for (uri, server, kind) in ripe {
            if catalog
                .claims(kind)
                .is_some_and(|c| c.serves(&uri, &server))
            {
                sole.push((uri, server, kind));
            }
        }
        let (resources, templates): (Vec<_>, Vec<_>) = sole
            .into_iter()
            .partition(|(_, _, k)| *k == Kind::Resources);
        let strip = |v: Vec<(String, String, Kind)>| -> Vec<(String, String)> {
            v.into_iter().map(|(u, s, _)| (u, s)).collect()
        };
        let (_, alone) = crate::aggregator::template_claims::split(catalog, strip(resources));
        self.remember(alone);
        self.remember(strip(templates));
    }

    /// Once every enabled server has listed its resources, URIs served alone are
    /// remembered as their server's.
    fn settle(&mut self, catalog: &mut Catalog, applied: &mut Applied) {
        if self.owners.settled {
            return;
        }
        let all = self.servers().iter().all(|s| {
            self.resources_listed
                .contains(&(s.clone(), Kind::Resources))
                && self
                    .resources_listed
                    .contains(&(s.clone(), Kind::Templates))
        });
        if !all {
            return;
        }
        self.owners.settled = true;
        // Every server's first listing is in: what is alone now is alone whoever answered
        // first, so it is remembered at once.
        self.settling = true;
        let (r, t) = catalog.recheck_claims(&self.owners);
        self.claims_changed(catalog, Kind::Resources, r, applied);
        self.claims_changed(catalog, Kind::Templates, t, applied);
        self.settling = false;
    }

    fn remember(&mut self, sole: Vec<(String, String)>) {
        let cap = self.config.max_remembered_uris;
        let mut by_server: HashMap<String, Vec<String>> = HashMap::new();
        let mut over: HashMap<String, usize> = HashMap::new();
        for (uri, server) in sole {
            if self.owners.remembered(&uri) != Some(server.as_str())
                && self.owners.remembered_by(&server) >= cap
            {
                *over.entry(server).or_default() += 1;
                continue;
            }
            self.owners.remember(&uri, &server);
            by_server.entry(server).or_default().push(uri);
        }
        for (server, n) in over {
            // Once per server and run: a server rotating its URIs would log on every listing.
            if self.owners_over_cap.insert(server.clone()) {
                crate::warn!(
                    "server {server}: {n} resource URIs served but not remembered as its own: it has max_remembered_uris = {cap} already"
                );
            }
        }
        for (server, uris) in by_server {
            self.submit_owners(server, uris);
        }
    }

    fn submit_owners(&mut self, server: String, uris: Vec<String>) {
        let retention = self.config.pin_retention_secs.saturating_mul(1000);
        let now = now_ms();
        let job = Job::Owners {
            server: server.clone(),
            uris,
            prune_before_ms: now.saturating_sub(i64::try_from(retention).unwrap_or(i64::MAX)),
            now_ms: now,
            keep: self.config.max_remembered_uris,
        };
        if self.intake.submit(job).is_err() {
            crate::warn!("server {server}: resource owners not recorded (the intake is busy)");
        }
    }

    /// Now and then, tell the store that `server` still lists the URIs it owns (so they
    /// are not pruned) and prune the ones it stopped listing long ago.
    fn refresh_owners(&mut self, catalog: &Catalog, server: &str, now: Instant) {
        let every = Duration::from_secs((self.config.pin_retention_secs / 4).clamp(1, 3600));
        if self
            .owners_refreshed
            .get(server)
            .is_some_and(|t| now.saturating_duration_since(*t) < every)
        {
            return;
        }
        self.owners_refreshed.insert(server.to_owned(), now);
        let mut owned = Vec::new();
        for kind in [Kind::Resources, Kind::Templates] {
            if let Some(c) = catalog.claims(kind) {
                owned.extend(
                    c.listed_by(server)
                        .filter(|u| self.owners.remembered(u) == Some(server))
                        .map(str::to_owned),
                );
            }
        }
        self.submit_owners(server.to_owned(), owned);
    }

    /// After a reload: new `owns_resources` may change who serves what.
    pub fn recheck_owners(&mut self, catalog: &mut Catalog) -> Applied {
        let mut applied = Applied::default();
        self.owners.set_configured(&owns(&self.config));
        let (r, t) = catalog.recheck_claims(&self.owners);
        self.claims_changed(catalog, Kind::Resources, r, &mut applied);
        self.claims_changed(catalog, Kind::Templates, t, &mut applied);
        applied
    }

    /// Who a `resources/read` of `uri` goes to (a served resource, or the one server whose
    /// template matches); `Err` says why nobody may serve it.
    pub fn resource_route<'a>(
        &self,
        catalog: &'a Catalog,
        uri: &str,
    ) -> Result<Option<&'a crate::mcp::catalog::Entry>, String> {
        catalog.resource_route(uri, &self.owners)
    }

    /// An event from an upstream worker (`on_worker_message`): what to list again.
    /// Counted, not recorded, when it is a `list_changed`. An event about a server the
    /// worker does not reach is ignored (a local server's host speaks for that server
    /// alone).
    pub fn on_event(
        &mut self,
        worker: WorkerId,
        kind: &str,
        detail: &str,
        now: Instant,
    ) -> Option<Relist> {
        let parsed = serde_json::from_str::<Value>(detail).ok()?;
        let server = parsed.get("server").and_then(Value::as_str)?.to_owned();
        if !self.speaks_for(worker, &server) {
            return None;
        }
        if kind == "stderr" {
            let logs = self.stderr.on_event(&server, &parsed, now);
            self.logs.extend(logs);
            return None;
        }
        self.board.on_event(kind, detail)
    }

    /// Log lines the events brought (stderr, rate-limited), for the core to write.
    pub fn take_logs(&mut self) -> Vec<String> {
        std::mem::take(&mut self.logs)
    }

    /// `toolwall status NAME`: the server's entry with its last stderr lines.
    pub fn server_json(&self, server: &str, catalog: &Catalog) -> Option<Value> {
        let all = self.status_json(catalog);
        let mut entry = all
            .as_array()?
            .iter()
            .find(|s| s["server"] == server)?
            .clone();
        entry["stderr"] = self.stderr.json(server);
        Some(entry)
    }

    /// `worker` is gone: its servers are unreachable, their listings in flight are over.
    pub fn on_worker_gone(&mut self, worker: WorkerId, why: &str) {
        let servers = self.servers_of(worker);
        self.board.on_worker_gone(&servers, why);
        self.schedule.worker_gone(&servers);
    }

    /// Listings asked of the worker or the intake and not applied yet (readiness).
    pub fn listings_pending(&self) -> usize {
        self.schedule.in_flight()
    }

    // ---- pins -------------------------------------------------------------------------

    /// `tools/call` of `tool` (`server__tool`) before "unknown tool": the refusal message
    /// when its pin hides it (changed, or new and held). A name without `__` is looked up
    /// among the servers with `prefix = false` (one of theirs alone may hide it).
    pub fn pin_refusal(&self, tool: &str) -> Option<String> {
        if let Some((server, _)) = split_namespaced(tool) {
            return self.hidden.get(server)?.get(tool).cloned();
        }
        let mut found = self.rules.values().filter(|r| !r.prefix).filter_map(|r| {
            let qualified = format!("{}{NAMESPACE_SEP}{tool}", r.server);
            self.hidden.get(&r.server)?.get(&qualified).cloned()
        });
        match (found.next(), found.next()) {
            (Some(message), None) => Some(message),
            _ => None,
        }
    }

    /// `toolwall pins approve TOOL --digest D` (admin socket): approves exactly that
    /// definition. Returns the server to list again and what was approved.
    pub fn approve_pin(
        &mut self,
        tool: &str,
        digest: &str,
        by: &str,
    ) -> Result<(String, String), String> {
        let store = self
            .pins
            .as_mut()
            .ok_or_else(|| "the pin store is not open".to_string())?;
        let (before, after) = store.approve(tool, digest, by, now_ms())?;
        let server = after.server.clone();
        if let Some(h) = self.hidden.get_mut(&server) {
            h.remove(tool);
        }
        let what = match before.approved {
            Some(old) => format!(
                "approved {tool} sha256:{digest} (it replaces sha256:{}: {})",
                old.digest,
                crate::pins::digest::changed_fields(
                    &old.definition,
                    &after
                        .approved
                        .as_ref()
                        .map(|a| a.definition.clone())
                        .unwrap_or_default()
                )
                .join(", ")
            ),
            None => format!("approved {tool} sha256:{digest} (a new tool)"),
        };
        Ok((server, what))
    }

    /// `toolwall pins list` (admin socket).
    pub fn pins_json(&self) -> Value {
        let Some(store) = &self.pins else {
            return json!({"ok": false, "error": "the pin store is not open"});
        };
        match store.load_all() {
            Ok(all) => {
                let list: Vec<Value> = all
                    .iter()
                    .map(|r| {
                        let mode = self
                            .config
                            .servers
                            .get(&r.server)
                            .map(|s| s.pin)
                            .unwrap_or(PinMode::Enforce);
                        json!(views::PinView::of(
                            r,
                            mode,
                            self.pin_refusal(&r.tool).is_some()
                        ))
                    })
                    .collect();
                json!({"ok": true, "pins": list})
            }
            Err(e) => json!({"ok": false, "error": e}),
        }
    }

    /// `toolwall status`: each server's state, era, last error, tool count, what is
    /// degraded, hidden, coalesced and in conflict.
    pub fn status_json(&self, catalog: &Catalog) -> Value {
        self.board.to_json(|server| {
            let tools = catalog
                .entries(Kind::Tools)
                .filter(|e| e.server == server)
                .count();
            let (conflicts, sample) = catalog
                .claims(Kind::Resources)
                .map(|c| c.conflicts_of(server, CONFLICT_SAMPLE))
                .unwrap_or_default();
            let (tconflicts, tsample) = catalog
                .claims(Kind::Templates)
                .map(|c| c.conflicts_of(server, CONFLICT_SAMPLE))
                .unwrap_or_default();
            let sample: Vec<Value> = sample
                .into_iter()
                .chain(tsample)
                .take(CONFLICT_SAMPLE)
                .map(|(uri, why)| json!({"uri": uri, "why": why}))
                .collect();
            json!({
                "tools": tools,
                "tools_hidden": self.hidden.get(server).map_or(0, HashMap::len),
                "resource_conflicts": conflicts + tconflicts,
                "name_clashes": name_clashes_json(catalog, server),
                "resource_conflict_sample": sample,
                "list_changed_coalesced": self.board.get(server).map_or(0, |b| b.list_changed_coalesced) + self.schedule.coalesced(server),
            })
        })
    }

    // ---- timers and reloads -----------------------------------------------------------

    /// The next periodic refresh or pending relisting, for the loop's timeout.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.next_refresh
            .into_iter()
            .chain(self.schedule.next_deadline())
            .chain(self.stderr.next_deadline())
            .min()
    }

    /// On timers: local servers' counts of stderr lines not logged, when due.
    pub fn on_timer(&mut self, now: Instant) {
        let logs = self.stderr.on_timer(now);
        self.logs.extend(logs);
    }

    /// On timers: true when every server should be listed again now (and the next
    /// refresh is scheduled).
    pub fn refresh_due(&mut self, now: Instant) -> bool {
        match (self.next_refresh, self.refresh) {
            (Some(t), Some(every)) if t <= now => {
                self.next_refresh = Some(now + every);
                true
            }
            _ => false,
        }
    }

    /// After a reload whose `[servers]` did not change the set of servers: new pin modes,
    /// `new_tools`, budgets, owners and refresh period. (A changed set of servers needs a
    /// new worker: its grant and setup change.)
    pub fn reconfigure(&mut self, config: &ServersConfig, now: Instant) {
        self.config = config.clone();
        self.rules = config
            .servers
            .keys()
            .map(|n| (n.clone(), server_rules(config, n)))
            .collect();
        self.schedule
            .set_min_interval(Duration::from_millis(config.relist_min_interval_ms));
        self.refresh = (config.refresh_secs > 0).then(|| Duration::from_secs(config.refresh_secs));
        self.next_refresh = self.refresh.map(|r| now + r);
        self.stderr.set_capacity(config.stderr_lines);
    }
}

/// Tool or prompt names in clash now that were not before: an event and a warning each
/// (the first few; `toolwall status` has them all counted).
fn name_clashes(kind: Kind, new: &[(String, String)], applied: &mut Applied) {
    if new.is_empty() {
        return;
    }
    let sample: Vec<Value> = new
        .iter()
        .take(CONFLICT_SAMPLE)
        .map(|(name, why)| json!({"name": name, "why": why}))
        .collect();
    applied.events.push((
        "name_clash",
        json!({"kind": kind.list_key(), "count": new.len(), "sample": sample}),
    ));
    for (_, why) in new.iter().take(3) {
        applied.logs.push((true, format!("name clash: {why}")));
    }
    if new.len() > 3 {
        applied.logs.push((
            true,
            format!(
                "name clash: {} more {} (see `toolwall status`)",
                new.len() - 3,
                kind.word()
            ),
        ));
    }
}

/// `toolwall status`: the tool and prompt name clashes of `server`.
fn name_clashes_json(catalog: &Catalog, server: &str) -> Value {
    let (tools, mut sample) = catalog.clashes(Kind::Tools, server, CONFLICT_SAMPLE);
    let (prompts, psample) = catalog.clashes(Kind::Prompts, server, CONFLICT_SAMPLE);
    sample.extend(psample);
    sample.truncate(CONFLICT_SAMPLE);
    let sample: Vec<Value> = sample
        .into_iter()
        .map(|(name, why)| json!({"name": name, "why": why}))
        .collect();
    json!({"count": tools + prompts, "sample": sample})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregator::config::ServerConfig;
    use crate::aggregator::setup::Limits;

    #[test]
    fn names_refresh_budgets_and_status() {
        assert_eq!(
            UpstreamsState::request_name(Op::CallTool, "gh", "search"),
            "gh__search"
        );
        assert_eq!(
            UpstreamsState::request_name(Op::GetPrompt, "gh", "p"),
            "gh__p"
        );
        assert_eq!(UpstreamsState::request_name(Op::ListTools, "gh", ""), "gh");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        drop(
            crate::ledger::Ledger::open(&crate::ledger::LedgerConfig {
                path: path.clone(),
                ..Default::default()
            })
            .unwrap(),
        );
        let mut config = ServersConfig {
            refresh_secs: 10,
            ..ServersConfig::default()
        };
        config.servers.insert(
            "gh".into(),
            ServerConfig {
                url: "http://127.0.0.1:1/".into(),
                max_tools: Some(3),
                ..ServerConfig::default()
            },
        );
        let setup = AggregatorSetup {
            limits: Limits::from_config(&config),
            servers: vec![],
        };
        let poll = mio::Poll::new().unwrap();
        let waker = Arc::new(Waker::new(poll.registry(), mio::Token(0)).unwrap());
        let t0 = Instant::now();
        let mut s = UpstreamsState::new(3, &config, setup, &path, waker, t0);
        s.route(
            3,
            AggregatorSetup {
                limits: Limits::from_config(&config),
                servers: vec![crate::aggregator::setup::UpstreamSetup {
                    name: "gh".into(),
                    url: "http://127.0.0.1:1/".into(),
                    headers: vec![],
                    bearer_token: None,
                    timeout_secs: 1,
                    era: Default::default(),
                    addresses: vec![],
                    unusable: None,
                    secret_env: vec![],
                }],
            },
        );
        assert!(s.is_worker(3));
        assert!(!s.is_worker(4));
        assert!(s.speaks_for(3, "gh"));
        assert!(!s.speaks_for(4, "gh"));
        assert!(
            s.on_event(
                4,
                "list_changed",
                r#"{"server":"gh","kinds":["tools"]}"#,
                t0
            )
            .is_none()
        );
        assert_eq!(s.servers(), vec!["gh".to_string()]);
        assert!(!s.refresh_due(t0));
        assert!(s.refresh_due(t0 + Duration::from_secs(10)));
        let Message::Request { args, op, .. } = s.listing_request(7, "gh", Kind::Tools) else {
            panic!()
        };
        assert_eq!(op, Op::ListTools);
        assert!(args.unwrap().contains("servers.gh.max_tools"));
        // A listing goes through the intake and comes back applied.
        assert!(s.want("gh", Kind::Tools, t0));
        s.listing_answered(
            "gh",
            Kind::Tools,
            3,
            Some(r#"[{"name":"search"}]"#.into()),
            None,
            None,
        )
        .map_err(|_| "refused")
        .unwrap();
        let mut catalog = Catalog::default();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut applied = Applied::default();
        while applied.changed.is_empty() {
            assert!(Instant::now() < deadline, "the intake answered");
            std::thread::sleep(Duration::from_millis(5));
            applied = s.take_reviewed(&mut catalog, t0);
        }
        assert_eq!(applied.changed, vec![Kind::Tools]);
        assert!(applied.events.iter().any(|(k, _)| *k == "pin"));
        assert_eq!(s.status_json(&catalog)[0]["tools"], 1);
        assert_eq!(s.pins_json()["pins"][0]["tool"], "gh__search");
        // Over budget: refused, degraded, the catalog stays.
        assert!(s.want("gh", Kind::Tools, t0 + Duration::from_secs(5)));
        let four = r#"[{"name":"a"},{"name":"b"},{"name":"c"},{"name":"d"}]"#;
        s.listing_answered("gh", Kind::Tools, 3, Some(four.into()), None, None)
            .map_err(|_| "refused")
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let a = s.take_reviewed(&mut catalog, t0);
            if a.events.iter().any(|(k, _)| *k == "upstream_degraded") {
                break;
            }
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(catalog.len(Kind::Tools), 1);
        let status = s.status_json(&catalog);
        assert!(
            status[0]["degraded"]
                .as_str()
                .unwrap()
                .contains("servers.gh.max_tools"),
            "{status}"
        );
    }
}
