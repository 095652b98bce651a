//! What the gateway's core keeps about the upstream servers: which worker reaches each of
//! them (the aggregator worker for `url` servers, a host of its own for each local
//! server), each worker's `configure` setup (credentials included: they live only here
//! and in the RPC message), each server's state for `status`, when to list each of them again, the
//! tools their pins hide, and who owns which resource URI. The core calls it at the points
//! named in each method and applies what it returns (`src/gateway/core/upstream_listings.rs`).
//!
//! Like the core it is a state machine: no clock is read (monotonic and wall time come in
//! as arguments), nothing is logged (lines are staged, see [`UpstreamsState::take_logs`]),
//! and no file is touched. Pin-store work is staged as intake [`Job`]s the loop hands to the
//! intake thread ([`UpstreamsState::take_jobs`]); what the thread did comes back as input
//! ([`UpstreamsState::apply_reviewed`], [`UpstreamsState::intake_refused`]). The loop
//! performs an operator's approval and `pins list` on its own connection and hands the
//! rows in ([`UpstreamsState::pin_approved`], [`UpstreamsState::pins_json`]).

use serde_json::{Value, json};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::config::ServersConfig;
use super::error::quote_upstream;
use super::relist::RelistSchedule;
use super::setup::AggregatorSetup;
use super::spec;
use super::status::{Relist, UpstreamBoard};
use crate::mcp::catalog::claims::ClaimChange;
use crate::mcp::catalog::delta::{self, Delta, Fingerprints};
use crate::mcp::catalog::listing::Refusal;
use crate::mcp::catalog::resource_owners::OwnerRules;
use crate::mcp::catalog::{Catalog, Kind, NAMESPACE_SEP, WorkerId, split_namespaced};
use crate::pins::intake::{Done, Job, ListingJob, ServerRules};
use crate::pins::store::PinRecord;
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
    /// Intake jobs staged for the loop to hand to the intake thread (at most
    /// `jobs_cap`: listings in flight are one per server and kind, owner updates few).
    jobs: Vec<Job>,
    jobs_cap: usize,
    /// Per server: tools its pins hide, with the message their calls are refused with.
    hidden: HashMap<String, HashMap<String, String>>,
    /// Per server: resource URIs its pins hide (a changed definition under enforce), with
    /// the message their reads are refused with.
    hidden_uris: HashMap<String, HashMap<String, String>>,
    owners: OwnerRules,
    /// Servers whose resources (and templates) have been listed in this run.
    resources_listed: BTreeSet<(String, Kind)>,
    /// The digest of the resources (templates) listing last applied per server: the same
    /// listing again changes nothing and is not applied entry by entry.
    applied_text: HashMap<(String, Kind), [u8; 32]>,
    /// What the catalog holds of each server and kind, as the intake diffs listings
    /// against it (`crate::mcp::catalog::delta`).
    bases: HashMap<(String, Kind), Arc<Fingerprints>>,
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
    /// Log lines (warning?, text) from events and timers, for the core to write.
    logs: Vec<(bool, String)>,
    /// What listings did that is logged once per change (items left out, text escaped).
    notes: crate::aggregator::listing_notes::ListingNotes,
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
        max_resource_pins: config.max_resource_pins,
    })
}

fn owns(config: &ServersConfig) -> Vec<(String, Vec<String>)> {
    config
        .servers
        .iter()
        .map(|(n, s)| (n.clone(), s.owns_resources.clone()))
        .collect()
}

/// Intake jobs in flight at most for `config`: listings are at most one per server and
/// kind, owner updates one or two more per server. The intake thread's queue is this big.
pub fn intake_capacity(config: &ServersConfig) -> usize {
    config.servers.len() * (Kind::ALL.len() + 2) + 8
}

impl UpstreamsState {
    /// `[servers] max_queued_bytes`.
    pub fn max_queued_bytes(&self) -> usize {
        self.config.max_queued_bytes
    }

    /// `[servers] threads` and `queue`: each server's pool.
    pub fn pool(&self) -> (usize, usize) {
        (self.config.threads, self.config.queue)
    }

    /// `setup` from [`super::prepare::build_setup`], for the aggregator `worker`; see
    /// [`UpstreamsState::empty`].
    pub fn new(
        worker: WorkerId,
        config: &ServersConfig,
        setup: AggregatorSetup,
        owners: Vec<(String, String, i64)>,
        now: Instant,
    ) -> UpstreamsState {
        let mut state = UpstreamsState::empty(config, owners, now);
        state.route(worker, setup);
        state
    }

    /// No worker yet ([`UpstreamsState::route`] adds them). `owners`: the resource owners
    /// the pin store remembers (URI, server, last seen ms), read by the loop at start.
    pub fn empty(
        config: &ServersConfig,
        mut owners_rows: Vec<(String, String, i64)>,
        now: Instant,
    ) -> UpstreamsState {
        let refresh = (config.refresh_secs > 0).then(|| Duration::from_secs(config.refresh_secs));
        let mut owners = OwnerRules::new(&owns(config));
        // The ones seen last, at most `max_remembered_uris` per server (a file written by
        // an older build may hold more).
        owners_rows.sort_unstable_by_key(|r| std::cmp::Reverse(r.2));
        for (uri, server, _) in owners_rows {
            if owners.remembered_by(&server) < config.max_remembered_uris {
                owners.remember(&uri, &server);
            }
        }
        let rules = config
            .servers
            .keys()
            .map(|n| (n.clone(), server_rules(config, n)))
            .collect();
        UpstreamsState {
            routes: HashMap::new(),
            setups: HashMap::new(),
            config: config.clone(),
            board: UpstreamBoard::new(config),
            rules,
            schedule: {
                let mut s =
                    RelistSchedule::new(Duration::from_millis(config.relist_min_interval_ms));
                s.set_loop_share_percent(config.relist_loop_share_percent);
                s
            },
            jobs: Vec::new(),
            jobs_cap: intake_capacity(config),
            hidden: HashMap::new(),
            hidden_uris: HashMap::new(),
            bases: HashMap::new(),
            owners,
            resources_listed: BTreeSet::new(),
            applied_text: HashMap::new(),
            notes: Default::default(),
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

    // ---- servers added or removed by a reload ---------------------------------------

    /// A local server added by a reload, reached through its own host `worker`: shown as
    /// starting, listed once the host is ready. Its rules come with the next
    /// [`UpstreamsState::reconfigure`].
    pub fn add_local_server(
        &mut self,
        server: &str,
        config: &super::config::ServerConfig,
        worker: WorkerId,
        setup: AggregatorSetup,
    ) {
        self.board.insert(server, config);
        self.route(worker, setup);
    }

    /// A server taken out of the config by a reload: no route, no setup, no status entry,
    /// nothing pending, and nothing of it left in `catalog` (tools, prompts, resources,
    /// templates). A listing of it the intake is still reviewing is dropped when it comes
    /// back (see [`UpstreamsState::take_reviewed`]). Returns its worker when no other
    /// server shares it (a local server's host, to stop).
    pub fn remove_server(
        &mut self,
        server: &str,
        catalog: &mut Catalog,
        wall_ms: i64,
        applied: &mut Applied,
    ) -> Option<WorkerId> {
        let worker = self.routes.remove(server);
        self.board.remove(server);
        self.schedule.forget(server);
        self.hidden.remove(server);
        self.hidden_uris.remove(server);
        self.rules.remove(server);
        self.owners_refreshed.remove(server);
        self.resources_listed.retain(|(s, _)| s != server);
        self.applied_text.retain(|(s, _), _| s != server);
        self.notes.forget(server);
        crate::mcp::catalog::unservable::forget(server);
        self.bases.retain(|(s, _), _| s != server);
        for kind in [Kind::Tools, Kind::Prompts] {
            if catalog.replace(kind, server, Vec::new()).changed && !applied.changed.contains(&kind)
            {
                applied.changed.push(kind);
            }
        }
        for kind in [Kind::Resources, Kind::Templates] {
            let change = catalog.claim(kind, server, Vec::new(), &self.owners);
            self.claims_changed(catalog, kind, change, wall_ms, applied);
        }
        let worker = worker.filter(|w| !self.routes.values().any(|o| o == w))?;
        self.setups.remove(&worker);
        Some(worker)
    }

    // ---- relisting ------------------------------------------------------------------

    /// A listing of `kind` from `server` is wanted: true when it may start now.
    pub fn want(&mut self, server: &str, kind: Kind, now: Instant) -> bool {
        self.schedule.request(server, kind, now)
    }

    /// Applying a listing cost the loop `cost`: see [`RelistSchedule::charge`].
    pub fn charge_listing(&mut self, server: &str, kind: Kind, cost: Duration, now: Instant) {
        self.schedule.charge(server, kind, cost, now);
    }

    /// Listings whose turn came (pending, interval passed) of servers `ready` accepts.
    pub fn due(&mut self, now: Instant, ready: impl Fn(&str) -> bool) -> Vec<(String, Kind)> {
        self.schedule.due(now, ready)
    }

    /// The request for a listing: its budget travels with it, so a reload applies at once.
    pub fn listing_request(&self, id: u64, server: &str, kind: Kind) -> Message {
        Message::Request {
            id,
            op: Op::ListUpstream {
                kind: kind.into(),
                server: server.to_owned(),
                budget: self.config.budget(server).listing(server, kind),
            },
        }
    }

    /// The worker answered a listing at wall time `wall_ms`. `Ok`: staged for the intake
    /// (the result comes back through [`Self::apply_reviewed`]). `Err`: the listing is
    /// over; log it.
    #[allow(clippy::too_many_arguments)]
    pub fn listing_answered(
        &mut self,
        server: &str,
        kind: Kind,
        worker: WorkerId,
        ok: Option<String>,
        error: Option<String>,
        facts: Option<&str>,
        wall_ms: i64,
    ) -> Result<(), Applied> {
        if let Some(f) = facts.and_then(|f| serde_json::from_str::<Value>(f).ok()) {
            let n = |k: &str| f.get(k).and_then(Value::as_u64).unwrap_or(0);
            self.board.add_counts(server, n("coalesced"), n("dropped"));
            if ok.is_some()
                && let Some(line) = self.notes.left_out(server, kind, &f, wall_ms)
            {
                self.logs.push((true, line));
            }
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
            now_ms: wall_ms,
            base: Arc::clone(
                self.bases
                    .entry((server.to_owned(), kind))
                    .or_insert_with(delta::fresh),
            ),
        }));
        match self.stage(job) {
            Ok(()) => Ok(()),
            Err(job) => Err(self.intake_refused(job)),
        }
    }

    /// Stage a job for the intake; `Err` gives it back when `jobs_cap` are waiting.
    fn stage(&mut self, job: Job) -> Result<(), Job> {
        if self.jobs.len() >= self.jobs_cap {
            return Err(job);
        }
        self.jobs.push(job);
        Ok(())
    }

    /// Jobs for the intake thread, staged since the last call: the loop hands them over
    /// and reports each one the thread would not take ([`Self::intake_refused`]).
    pub fn take_jobs(&mut self) -> Vec<Job> {
        std::mem::take(&mut self.jobs)
    }

    /// The intake did not take `job` (its thread is gone or its queue is full): a listing
    /// is over, not applied; owners are not recorded this time.
    pub fn intake_refused(&mut self, job: Job) -> Applied {
        match job {
            Job::Listing(l) => self.listing_over(
                &l.server,
                l.kind,
                Some("the listing intake is not running".into()),
            ),
            Job::Owners { server, .. } => Applied {
                logs: vec![(
                    true,
                    format!("server {server}: resource owners not recorded (the intake is busy)"),
                )],
                ..Applied::default()
            },
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

    /// What the intake thread finished (listings reviewed, owner updates), applied to
    /// `catalog` (each listing at once). `now` and `wall_ms`: the time of this input.
    pub fn apply_reviewed(
        &mut self,
        catalog: &mut Catalog,
        done: Vec<Done>,
        now: Instant,
        wall_ms: i64,
    ) -> Applied {
        let mut applied = Applied::default();
        for done in done {
            match done {
                Done::Listing {
                    server,
                    kind,
                    outcome,
                } => {
                    // A server a reload removed while the intake reviewed its listing.
                    if self.board.get(&server).is_some() {
                        let at = (now, wall_ms);
                        self.apply(catalog, &server, kind, *outcome, at, &mut applied)
                    }
                }
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
                        self.claims_changed(catalog, Kind::Resources, r, wall_ms, &mut applied);
                        self.claims_changed(catalog, Kind::Templates, t, wall_ms, &mut applied);
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
        (now, wall_ms): (Instant, i64),
        applied: &mut Applied,
    ) {
        let mut reviewed = match outcome {
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
        let base_key = (server.to_owned(), kind);
        // The change was computed off the loop against the base this job carried; applied
        // only if the catalog still holds that base (else list again, in full).
        let mut count = reviewed.entries.len();
        let mut removed: Option<Vec<String>> = None;
        if let Some(d) = reviewed.delta.take() {
            let Delta {
                full,
                removed: gone,
                base,
                after,
            } = d;
            if !full
                && !self
                    .bases
                    .get(&base_key)
                    .is_some_and(|c| Arc::ptr_eq(c, &base))
            {
                self.bases.insert(base_key.clone(), delta::fresh());
                self.applied_text.remove(&base_key);
                self.schedule.pend(server, kind);
                return;
            }
            count = after.len();
            self.bases.insert(base_key, after);
            if !full {
                removed = Some(gone);
            }
        }
        for line in self
            .notes
            .escaped(server, kind, &reviewed.text_tally, wall_ms)
        {
            applied.logs.push((true, line));
        }
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
                let change = match removed {
                    Some(gone) => {
                        catalog
                            .apply_delta(kind, server, reviewed.entries, gone, &self.owners)
                            .0
                    }
                    None => catalog.replace(kind, server, reviewed.entries),
                };
                name_clashes(kind, &change.new_clashes, applied);
                change.changed
            }
            Kind::Resources | Kind::Templates => {
                if kind == Kind::Resources {
                    let prefix = format!("resource/{server}{NAMESPACE_SEP}");
                    let uris: HashMap<String, String> = reviewed
                        .hidden
                        .into_iter()
                        .filter_map(|(key, why)| Some((key.strip_prefix(&prefix)?.to_owned(), why)))
                        .collect();
                    if uris.is_empty() {
                        self.hidden_uris.remove(server);
                    } else {
                        self.hidden_uris.insert(server.to_owned(), uris);
                    }
                }
                self.resources_listed.insert((server.to_owned(), kind));
                self.candidates.heard(server, kind);
                let key = (server.to_owned(), kind);
                let same = reviewed
                    .text_digest
                    .is_some_and(|d| self.applied_text.get(&key) == Some(&d));
                let changed = if same {
                    false
                } else {
                    match reviewed.text_digest {
                        Some(d) => self.applied_text.insert(key, d),
                        None => self.applied_text.remove(&key),
                    };
                    let change = match removed {
                        Some(gone) => {
                            catalog
                                .apply_delta(kind, server, reviewed.entries, gone, &self.owners)
                                .1
                        }
                        None => catalog.claim(kind, server, reviewed.entries, &self.owners),
                    };
                    let changed = change.changed;
                    self.claims_changed(catalog, kind, change, wall_ms, applied);
                    changed
                };
                self.settle(catalog, wall_ms, applied);
                self.remember_ripe(catalog, wall_ms, applied);
                self.refresh_owners(catalog, server, (now, wall_ms), applied);
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
        wall_ms: i64,
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
                // `why` names URIs as servers listed them: escaped for the log.
                applied.logs.push((
                    true,
                    format!("resource conflict: {}", quote_upstream(why, 2000)),
                ));
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
            self.remember(change.unremembered, wall_ms, applied);
        } else if self.owners.settled {
            self.candidates.add(kind, change.unremembered);
        }
    }

    /// Remember the waiting URIs every other server has listed after, that are still
    /// served alone by their server.
    fn remember_ripe(&mut self, catalog: &Catalog, wall_ms: i64, applied: &mut Applied) {
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
        self.remember(alone, wall_ms, applied);
        self.remember(strip(templates), wall_ms, applied);
    }

    /// Once every enabled server has listed its resources, URIs served alone are
    /// remembered as their server's.
    fn settle(&mut self, catalog: &mut Catalog, wall_ms: i64, applied: &mut Applied) {
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
        self.claims_changed(catalog, Kind::Resources, r, wall_ms, applied);
        self.claims_changed(catalog, Kind::Templates, t, wall_ms, applied);
        self.settling = false;
    }

    fn remember(&mut self, sole: Vec<(String, String)>, wall_ms: i64, applied: &mut Applied) {
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
                applied.logs.push((true, format!(
                    "server {server}: {n} resource URIs served but not remembered as its own: it has max_remembered_uris = {cap} already"
                )));
            }
        }
        for (server, uris) in by_server {
            self.submit_owners(server, uris, wall_ms, applied);
        }
    }

    fn submit_owners(
        &mut self,
        server: String,
        uris: Vec<String>,
        now: i64,
        applied: &mut Applied,
    ) {
        let retention = self.config.pin_retention_secs.saturating_mul(1000);
        let job = Job::Owners {
            server: server.clone(),
            uris,
            prune_before_ms: now.saturating_sub(i64::try_from(retention).unwrap_or(i64::MAX)),
            now_ms: now,
            keep: self.config.max_remembered_uris,
        };
        if let Err(job) = self.stage(job) {
            let refused = self.intake_refused(job);
            applied.logs.extend(refused.logs);
        }
    }

    /// Now and then, tell the store that `server` still lists the URIs it owns (so they
    /// are not pruned) and prune the ones it stopped listing long ago.
    fn refresh_owners(
        &mut self,
        catalog: &Catalog,
        server: &str,
        (now, wall_ms): (Instant, i64),
        applied: &mut Applied,
    ) {
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
        self.submit_owners(server.to_owned(), owned, wall_ms, applied);
    }

    /// After a reload (at wall time `wall_ms`): new `owns_resources` may change who serves
    /// what.
    pub fn recheck_owners(&mut self, catalog: &mut Catalog, wall_ms: i64) -> Applied {
        let mut applied = Applied::default();
        self.owners.set_configured(&owns(&self.config));
        let (r, t) = catalog.recheck_claims(&self.owners);
        self.claims_changed(catalog, Kind::Resources, r, wall_ms, &mut applied);
        self.claims_changed(catalog, Kind::Templates, t, wall_ms, &mut applied);
        applied
    }

    /// Who a `resources/read` of `uri` goes to (a served resource, or the one server whose
    /// template matches); `Err` says why nobody may serve it.
    pub fn resource_route<'a>(
        &self,
        catalog: &'a Catalog,
        uri: &str,
    ) -> Result<Option<&'a crate::mcp::catalog::Entry>, String> {
        // A pinned resource whose definition changed is refused whoever else lists it.
        if let Some(why) = self.hidden_uris.values().find_map(|h| h.get(uri)) {
            return Err(why.clone());
        }
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
            self.logs.extend(logs.into_iter().map(|l| (false, l)));
            return None;
        }
        self.board.on_event(kind, detail)
    }

    /// Log lines (warning?, text) the events and timers brought (stderr, rate-limited),
    /// for the core to write.
    pub fn take_logs(&mut self) -> Vec<(bool, String)> {
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

    /// As [`UpstreamsState::listings_pending`], of the servers whose worker `counted`
    /// accepts (readiness leaves out local servers: each starts on its own time).
    pub fn listings_pending_where(&self, counted: impl Fn(WorkerId) -> bool) -> usize {
        self.schedule
            .in_flight_where(|server| self.worker_of(server).is_some_and(&counted))
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

    /// `toolwall pins approve TOOL --digest D` (admin socket): the loop approved exactly
    /// that definition in the pin store (`before` and `after` are the tool's row around
    /// the write): its calls are no longer refused. Returns the server to list again and
    /// what was approved.
    pub fn pin_approved(
        &mut self,
        tool: &str,
        digest: &str,
        before: &PinRecord,
        after: &PinRecord,
    ) -> (String, String) {
        let server = after.server.clone();
        if let Some(h) = self.hidden.get_mut(&server) {
            h.remove(tool);
        }
        if let Some(uri) = tool.strip_prefix(&format!("resource/{server}{NAMESPACE_SEP}"))
            && let Some(h) = self.hidden_uris.get_mut(&server)
        {
            h.remove(uri);
        }
        // The key and field names are the upstream's text: shown as `pins list` shows
        // them (the operator's terminal and the log never get a raw bidi or tag character).
        let shown = crate::pins::visible::visible(tool).0;
        let what = match &before.approved {
            Some(old) => format!(
                "approved {shown} sha256:{digest} (it replaces sha256:{}: {})",
                old.digest,
                crate::pins::visible::visible(
                    &crate::pins::digest::changed_fields(
                        &old.definition,
                        &after
                            .approved
                            .as_ref()
                            .map(|a| a.definition.clone())
                            .unwrap_or_default()
                    )
                    .join(", ")
                )
                .0
            ),
            None => format!("approved {shown} sha256:{digest} (a new tool)"),
        };
        (server, what)
    }

    /// `toolwall pins list` (admin socket): every pin the loop read from the store (or
    /// why it could not), with its mode and whether its calls are refused now.
    pub fn pins_json(&self, rows: Result<Vec<PinRecord>, String>) -> Value {
        match rows {
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
                        // Tools: refused calls; other kinds: not listed (held, or
                        // changed under enforce).
                        let hidden = match crate::pins::kinds::kind_of(&r.tool) {
                            Kind::Tools => self.pin_refusal(&r.tool).is_some(),
                            _ => {
                                mode != PinMode::Off
                                    && (r.approved.is_none()
                                        || (r.pending.is_some() && mode == PinMode::Enforce))
                            }
                        };
                        json!(views::PinView::of(r, mode, hidden))
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
        self.logs.extend(logs.into_iter().map(|l| (false, l)));
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
        self.schedule
            .set_loop_share_percent(config.relist_loop_share_percent);
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
        let waker = Arc::new(mio::Waker::new(poll.registry(), mio::Token(0)).unwrap());
        // The loop's part: the intake thread and the store's own connection.
        let mut intake = crate::pins::intake::Intake::start(&path, waker, 8);
        let store = crate::pins::store::PinStore::open(&path).unwrap();
        let t0 = Instant::now();
        let mut s = UpstreamsState::new(3, &config, setup, Vec::new(), t0);
        // Hand the staged jobs over, wait for the first result, apply it.
        let mut round = |s: &mut UpstreamsState, catalog: &mut Catalog| {
            for job in s.take_jobs() {
                assert!(intake.submit(job).is_ok());
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let done = intake.poll();
                if !done.is_empty() {
                    return s.apply_reviewed(catalog, done, t0, 1);
                }
                assert!(Instant::now() < deadline, "the intake answered");
                std::thread::sleep(Duration::from_millis(5));
            }
        };
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
        let Message::Request {
            op:
                Op::ListUpstream {
                    kind,
                    server,
                    budget,
                },
            ..
        } = s.listing_request(7, "gh", Kind::Tools)
        else {
            panic!()
        };
        assert_eq!(
            (kind, server.as_str()),
            (crate::workers::rpc::ListKind::Tools, "gh")
        );
        assert_eq!(budget, config.budget("gh").listing("gh", Kind::Tools));
        // A listing goes through the intake and comes back applied.
        assert!(s.want("gh", Kind::Tools, t0));
        s.listing_answered(
            "gh",
            Kind::Tools,
            3,
            Some(r#"[{"name":"search","inputSchema":{"type":"object"}}]"#.into()),
            None,
            None,
            1,
        )
        .map_err(|_| "refused")
        .unwrap();
        let mut catalog = Catalog::default();
        let applied = round(&mut s, &mut catalog);
        assert_eq!(applied.changed, vec![Kind::Tools]);
        assert!(applied.events.iter().any(|(k, _)| *k == "pin"));
        assert_eq!(s.status_json(&catalog)[0]["tools"], 1);
        assert_eq!(
            s.pins_json(store.load_all())["pins"][0]["tool"],
            "gh__search"
        );
        assert_eq!(
            s.pins_json(Err("the pin store is not open".into()))["error"],
            "the pin store is not open"
        );
        // Over budget: refused, degraded, the catalog stays.
        assert!(s.want("gh", Kind::Tools, t0 + Duration::from_secs(5)));
        let four = r#"[{"name":"a","inputSchema":{"type":"object"}},{"name":"b","inputSchema":{"type":"object"}},{"name":"c","inputSchema":{"type":"object"}},{"name":"d","inputSchema":{"type":"object"}}]"#;
        s.listing_answered("gh", Kind::Tools, 3, Some(four.into()), None, None, 2)
            .map_err(|_| "refused")
            .unwrap();
        let a = round(&mut s, &mut catalog);
        assert!(a.events.iter().any(|(k, _)| *k == "upstream_degraded"));
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

    /// Listings after the first reach the catalog as their change (computed by the intake
    /// against the base the job carried); a change computed against a base the loop no
    /// longer holds is not applied, and the list is listed again in full.
    #[test]
    fn listings_apply_as_changes_and_a_stale_change_is_listed_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        drop(
            crate::ledger::Ledger::open(&crate::ledger::LedgerConfig {
                path: path.clone(),
                ..Default::default()
            })
            .unwrap(),
        );
        let mut config = ServersConfig::default();
        config.servers.insert(
            "gh".into(),
            ServerConfig {
                url: "http://127.0.0.1:1/".into(),
                pin: PinMode::Off,
                ..ServerConfig::default()
            },
        );
        let setup = AggregatorSetup {
            limits: Limits::from_config(&config),
            servers: vec![],
        };
        let poll = mio::Poll::new().unwrap();
        let waker = Arc::new(mio::Waker::new(poll.registry(), mio::Token(0)).unwrap());
        let mut intake = crate::pins::intake::Intake::start(&path, waker, 8);
        let t0 = Instant::now();
        let mut s = UpstreamsState::new(3, &config, setup, Vec::new(), t0);
        let mut catalog = Catalog::default();
        let mut list = |s: &mut UpstreamsState, text: &str, n: i64| {
            let _ = s.want("gh", Kind::Tools, t0 + Duration::from_secs(n as u64 * 5));
            s.listing_answered("gh", Kind::Tools, 3, Some(text.into()), None, None, n)
                .map_err(|_| "refused")
                .unwrap();
            for job in s.take_jobs() {
                assert!(intake.submit(job).is_ok());
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let done = intake.poll();
                if !done.is_empty() {
                    break done;
                }
                assert!(Instant::now() < deadline, "the intake answered");
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        let names = |c: &Catalog| -> Vec<String> {
            c.entries(Kind::Tools).map(|e| e.key.clone()).collect()
        };
        let done = list(
            &mut s,
            r#"[{"name":"a","inputSchema":{"type":"object"}},{"name":"b","inputSchema":{"type":"object"}}]"#,
            1,
        );
        s.apply_reviewed(&mut catalog, done, t0, 1);
        assert_eq!(names(&catalog), vec!["gh__a", "gh__b"]);
        let done = list(
            &mut s,
            r#"[{"name":"a","inputSchema":{"type":"object"}},{"name":"c","inputSchema":{"type":"object"}}]"#,
            2,
        );
        let Done::Listing { outcome, .. } = &done[0] else {
            panic!()
        };
        let r = outcome.as_ref().as_ref().unwrap();
        assert_eq!(r.entries.len(), 1, "only the new entry travels");
        assert_eq!(r.delta.as_ref().unwrap().removed, vec!["gh__b".to_string()]);
        let a = s.apply_reviewed(&mut catalog, done, t0, 2);
        assert_eq!(a.changed, vec![Kind::Tools]);
        assert_eq!(names(&catalog), vec!["gh__a", "gh__c"]);
        // The same listing again: nothing travels, nothing changes.
        let done = list(
            &mut s,
            r#"[{"name":"a","inputSchema":{"type":"object"}},{"name":"c","inputSchema":{"type":"object"}}]"#,
            3,
        );
        assert!(
            s.apply_reviewed(&mut catalog, done, t0, 3)
                .changed
                .is_empty()
        );
        // The catalog changed under a listing in flight: not applied, listed again.
        let done = list(
            &mut s,
            r#"[{"name":"d","inputSchema":{"type":"object"}}]"#,
            4,
        );
        s.bases.insert(
            ("gh".into(), Kind::Tools),
            crate::mcp::catalog::delta::fresh(),
        );
        let a = s.apply_reviewed(&mut catalog, done, t0, 4);
        assert!(a.changed.is_empty());
        assert_eq!(names(&catalog), vec!["gh__a", "gh__c"]);
        let due = s.due(t0 + Duration::from_secs(60), |_| true);
        assert_eq!(due, vec![("gh".to_string(), Kind::Tools)]);
        // The next listing is applied whole.
        let done = list(
            &mut s,
            r#"[{"name":"d","inputSchema":{"type":"object"}}]"#,
            5,
        );
        s.apply_reviewed(&mut catalog, done, t0, 5);
        assert_eq!(names(&catalog), vec!["gh__d"]);
    }

    #[test]
    fn a_job_the_intake_refuses_ends_the_listing_and_staging_is_bounded() {
        let config = ServersConfig::default();
        let mut s = UpstreamsState::empty(&config, Vec::new(), Instant::now());
        let cap = intake_capacity(&config);
        let owners = |n: usize| Job::Owners {
            server: format!("s{n}"),
            uris: vec![],
            prune_before_ms: 0,
            now_ms: 0,
            keep: 1,
        };
        for n in 0..cap {
            assert!(s.stage(owners(n)).is_ok());
        }
        // Full: the next one comes back at once, never queued without bound.
        assert!(s.stage(owners(cap)).is_err());
        assert_eq!(s.take_jobs().len(), cap);
        assert!(s.take_jobs().is_empty());
        let refused = s.intake_refused(owners(0));
        assert!(refused.logs[0].0 && refused.logs[0].1.contains("not recorded"));
    }
}
