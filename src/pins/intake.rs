//! The listing intake: a thread of the gateway process where every listing of an upstream
//! server is checked, pinned and turned into catalog entries, so the gateway's loop never
//! parses a listing or writes a pin. The loop hands over the listing's text
//! ([`Intake::submit`]) and later takes the result ([`Intake::poll`]; the thread wakes the
//! loop), which it applies to the catalog at once: agents see the whole listing or none of
//! it.
//!
//! Pins are written in transactions of at most [`CHUNK`] tools, each reading the rows it
//! writes over, so an approval made meanwhile is never overwritten and the ledger's
//! per-turn commit (same database file, one writer at a time) waits at most one chunk.
//! Memory: the jobs queued are bounded by the caller (one listing per server and kind in
//! flight), each is one listing within its budget.

use mio::Waker;
use serde_json::{Value, json};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, channel, sync_channel};
use std::thread::JoinHandle;

use super::digest::{pinned, pinned_v1};
use super::review::{self, Note, Outcome, ReviewCtx, SAMPLE, Write};
use super::store::{PIN_TX_BUDGET, PIN_TX_PAUSE, PinStore, ServerRecord};
use super::{NewTools, PinMode};
use crate::aggregator::budget::ListingBudget;
use crate::aggregator::error::quote_upstream;
use crate::mcp::catalog::delta::{self, Delta, Fingerprints};
use crate::mcp::catalog::listing::{self, Refusal};
use crate::mcp::catalog::{Entry, Kind, WorkerId, served_text, unservable};
use std::time::Instant;

/// Tools reviewed per pin transaction.
pub const CHUNK: usize = 256;
/// Tools named one log line each, per kind and listing (more are summed up in one line).
pub const LOG_EACH: usize = 3;
/// URIs remembered per owner transaction.
pub const OWNER_CHUNK: usize = 512;

/// What the intake must know of a server to review its tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerRules {
    pub server: String,
    /// Where it is reached (URL, or command line of a local server): a renamed server is
    /// recognised by it.
    pub origin: String,
    pub mode: PinMode,
    pub new_tools: NewTools,
    pub renamed_from: Option<String>,
    /// Every configured server (a server that looks renamed from one still configured is
    /// not a rename).
    pub configured: Vec<String>,
    pub retention_ms: i64,
    /// Most pins of tools no longer listed kept per server (its `max_tools`).
    pub absent_cap: usize,
    /// Agents see its tools and prompts as `server__name` (else under its own names).
    pub prefix: bool,
    /// Most resource URIs pinned for the server (`[servers] max_resource_pins`): a new
    /// URI beyond it is served unpinned (counted and logged), a pinned one keeps its pin.
    pub max_resource_pins: usize,
}

pub struct ListingJob {
    pub server: String,
    pub kind: Kind,
    pub worker: WorkerId,
    /// The listing: a JSON array of definitions as the server sent them.
    pub text: String,
    pub budget: ListingBudget,
    pub rules: Arc<ServerRules>,
    pub now_ms: i64,
    /// What the loop has applied of this server and kind: the result is the change
    /// against it (see [`crate::mcp::catalog::delta`]).
    pub base: Arc<Fingerprints>,
}

pub enum Job {
    Listing(Box<ListingJob>),
    /// Remember `server` as the owner of `uris` (or refresh them), and forget its owners not
    /// seen since `prune_before_ms`.
    Owners {
        server: String,
        uris: Vec<String>,
        prune_before_ms: i64,
        now_ms: i64,
        /// Most owners kept for the server (`max_remembered_uris`): the ones seen last.
        keep: usize,
    },
}

/// Counted, with the first few named.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Sample {
    pub count: usize,
    pub names: Vec<String>,
}

impl Sample {
    fn add(&mut self, name: String) {
        self.count += 1;
        if self.names.len() < SAMPLE {
            self.names.push(name);
        }
    }
}

/// One change, as the summary names it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ChangeNote {
    pub tool: String,
    pub approved_digest: String,
    pub seen_digest: String,
    pub fields: Vec<String>,
    pub hidden: bool,
}

/// What the review of one tools listing did, bounded whatever the listing (the `pin`
/// event of the ledger and the log lines are made of it).
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ReviewSummary {
    pub server: String,
    /// What was listed: `tools`, `prompts`.
    pub kind: &'static str,
    pub listed: usize,
    pub hidden: usize,
    pub first_sight: usize,
    /// Resource URIs not pinned before, pinned and served (no approval needed).
    pub new_resources: usize,
    /// Resource URIs served unpinned: the server has `max_resource_pins` pins already.
    pub unpinned: Sample,
    pub new_served: Sample,
    pub new_held: Sample,
    pub changed: Vec<ChangeNote>,
    pub changed_count: usize,
    pub reverted: usize,
    pub upgraded: usize,
    pub pruned: Sample,
    pub dropped_held: usize,
    /// `renamed_from`: the old name and how many pins moved.
    pub renamed_from: Option<(String, usize)>,
    /// Servers no longer configured that were reached at this server's origin.
    pub looks_renamed_from: Vec<String>,
    /// Servers still configured, pinned at this new server's origin.
    pub same_address_as: Vec<String>,
    /// Local servers still configured that run this new server's command line: what they
    /// approved is served here too, the rest is held.
    pub same_program_as: Vec<String>,
    /// Tools served because a server running the same program approved their digest.
    pub vouched: usize,
    /// The address this server was pinned at and the one it is reached at now.
    pub moved: Option<(String, String)>,
    pub store_error: Option<String>,
}

impl ReviewSummary {
    /// Worth an event: something happened beyond serving what was approved.
    pub fn eventful(&self) -> bool {
        self.first_sight > 0
            || self.new_resources > 0
            || self.unpinned.count > 0
            || self.new_served.count > 0
            || self.new_held.count > 0
            || self.changed_count > 0
            || self.reverted > 0
            || self.upgraded > 0
            || self.pruned.count > 0
            || self.dropped_held > 0
            || self.renamed_from.is_some()
            || !self.looks_renamed_from.is_empty()
            || !self.same_address_as.is_empty()
            || !self.same_program_as.is_empty()
            || self.vouched > 0
            || self.moved.is_some()
            || self.store_error.is_some()
    }

    /// The `events` row (kind `pin`).
    pub fn event(&self) -> Value {
        let mut v = json!(self);
        v["what"] = json!("listing");
        v
    }

    /// The log lines an operator must see: bounded (at most [`SAMPLE`] per kind).
    pub fn log_lines(&self) -> Vec<(bool, String)> {
        let s = &self.server;
        let what = if self.kind.is_empty() {
            "tools"
        } else {
            self.kind
        };
        let mut out = Vec::new();
        if let Some((from, moved)) = &self.renamed_from {
            out.push((false, format!(
                "pin: server {s}: {moved} pins of server {from} now belong to it (renamed_from = \"{from}\")"
            )));
        }
        if !self.looks_renamed_from.is_empty() {
            let from = self.looks_renamed_from.join(", ");
            out.push((true, format!(
                "pin: server {s} is reached where server {from} was, which is no longer configured: its tools are held as new until approved; if it is {from} renamed, set [servers.{s}] renamed_from = \"{}\"",
                self.looks_renamed_from[0]
            )));
        }
        if !self.same_address_as.is_empty() {
            out.push((true, format!(
                "pin: server {s} is reached where server {} is already pinned: its tools are held as new until approved (see `toolwall pins list`)",
                self.same_address_as.join(", ")
            )));
        }
        if !self.same_program_as.is_empty() {
            out.push((true, format!(
                "pin: server {s} runs the same command as server {}: only definitions approved there are served; its other tools are held until approved (see `toolwall pins list`)",
                self.same_program_as.join(", ")
            )));
        }
        if self.vouched > 0 {
            out.push((
                false,
                format!(
                    "pin: server {s}: {} tools served as approved under a server running the same command",
                    self.vouched
                ),
            ));
        }
        if let Some((was, now)) = &self.moved {
            out.push((true, format!(
                "pin: server {s} is reached at {} now, pinned at {}: approved definitions are still served, new tools are held until approved",
                quote_upstream(now, 200),
                quote_upstream(was, 200)
            )));
        }
        if self.first_sight > 0 {
            out.push((
                false,
                format!(
                    "pin: server {s}: {} {what} pinned on first sight",
                    self.first_sight
                ),
            ));
        }
        if self.new_resources > 0 {
            out.push((
                false,
                format!(
                    "pin: server {s}: {} new resources pinned and served (a new URI needs no approval; a change of a pinned one does)",
                    self.new_resources
                ),
            ));
        }
        if self.unpinned.count > 0 {
            out.push((true, format!(
                "pin: server {s}: {} resources served unpinned ({}): the server has max_resource_pins pins already, so a change of these is not detected; pinned ones stay pinned and a change of them is held",
                self.unpinned.count,
                self.unpinned.names.iter().take(LOG_EACH).map(|n| quote_upstream(n, 200)).collect::<Vec<_>>().join(", ")
            )));
        }
        // One line per tool only for a few; beyond that one line per kind, so a listing
        // logs a handful of lines whatever it holds.
        let one_by_one = |count: usize| count <= LOG_EACH;
        let names = |sample: &Sample| {
            let shown: Vec<&str> = sample
                .names
                .iter()
                .take(LOG_EACH)
                .map(|e| e.split_once(" sha256:").map_or(e.as_str(), |(n, _)| n))
                .collect();
            let more = if sample.count > shown.len() {
                ", …"
            } else {
                ""
            };
            format!("{}{more}", shown.join(", "))
        };
        if one_by_one(self.new_held.count) {
            for entry in &self.new_held.names {
                let (name, digest) = entry.split_once(" sha256:").unwrap_or((entry, ""));
                out.push((true, format!(
                    "pin: {name} is new; held until `toolwall pins approve {name} --digest {digest}` (see `toolwall pins list`)"
                )));
            }
        } else {
            out.push((true, format!(
                "pin: server {s}: {} new tools held until approved ({}); see `toolwall pins list`",
                self.new_held.count,
                names(&self.new_held)
            )));
        }
        if one_by_one(self.new_served.count) {
            for entry in &self.new_served.names {
                let (name, digest) = entry.split_once(" sha256:").unwrap_or((entry, ""));
                out.push((
                    true,
                    format!(
                        "pin: {name} is new; served at once (new_tools = \"serve\"), pinned as sha256:{digest}"
                    ),
                ));
            }
        } else {
            out.push((
                true,
                format!(
                    "pin: server {s}: {} new tools served at once (new_tools = \"serve\"): {}",
                    self.new_served.count,
                    names(&self.new_served)
                ),
            ));
        }
        if one_by_one(self.changed_count) {
            for c in &self.changed {
                let tail = if c.hidden {
                    format!(
                        "hidden and refused until `toolwall pins approve {} --digest {}`",
                        c.tool, c.seen_digest
                    )
                } else {
                    "still served (pin = \"warn\"); see `toolwall pins list`".into()
                };
                out.push((
                    true,
                    format!("pin: {} changed ({}); {tail}", c.tool, c.fields.join(", ")),
                ));
            }
        } else {
            let shown: Vec<&str> = self
                .changed
                .iter()
                .take(LOG_EACH)
                .map(|c| c.tool.as_str())
                .collect();
            out.push((
                true,
                format!(
                    "pin: server {s}: {} tools changed ({}, …); see `toolwall pins list`",
                    self.changed_count,
                    shown.join(", ")
                ),
            ));
        }
        if self.pruned.count > 0 {
            out.push((
                false,
                format!(
                    "pin: server {s}: {} pins of tools no longer listed pruned ({})",
                    self.pruned.count,
                    self.pruned.names.join(", ")
                ),
            ));
        }
        if let Some(e) = &self.store_error {
            out.push((true, format!("pin: server {s}: the pin store failed: {e}")));
        }
        // Keys of resources and templates are URIs as the server listed them: no control,
        // bidi or invisible character reaches the log raw (written `\u{…}`, which `pins
        // approve` accepts as `pins list` shows it).
        out.into_iter()
            .map(|(warn, line)| (warn, quote_upstream(&line, usize::MAX)))
            .collect()
    }
}

/// What the pin store knows of a listed server.
#[derive(Default)]
struct ServerState {
    /// Never pinned, and no pinned server at its address: its tools are pinned on sight.
    first_sight: bool,
    /// `renamed_from`: the old name and how many pins moved.
    renamed: Option<(String, usize)>,
    /// The address it was pinned at, when it is reached at another now.
    moved_from: Option<String>,
    /// Pinned servers at its address, no longer configured.
    looks_renamed: Vec<String>,
    /// Pinned servers at its address, still configured.
    same_address: Vec<String>,
    /// Pinned local servers still configured that run the same command line.
    same_program: Vec<String>,
    /// What those have approved.
    vouched: HashSet<String>,
}

/// A listing, ready for the catalog.
#[derive(Debug, Default)]
pub struct Reviewed {
    /// What agents may see (tools: only those served).
    pub entries: Vec<Entry>,
    /// Tools hidden, with the message their calls are refused with.
    pub hidden: Vec<(String, String)>,
    /// Tools listings of pinned servers.
    pub summary: Option<ReviewSummary>,
    /// SHA-256 of the listing's text (and worker, naming), for kinds not pinned: the loop skips applying a
    /// listing identical to the one it applied last (a relisting flood of the same
    /// catalog costs it nothing per entry).
    pub text_digest: Option<[u8; 32]>,
    /// Set: `entries` are only those new or changed against the loop's base (the change
    /// computed here, off the loop). `None`: `entries` are the whole listing.
    pub delta: Option<Delta>,
    /// What escaping the served entries' display text found (logged by the loop).
    pub text_tally: crate::mcp::catalog::served_text::Tally,
}

pub enum Done {
    Listing {
        server: String,
        kind: Kind,
        outcome: Box<Result<Reviewed, Refusal>>,
    },
    Owners {
        server: String,
        pruned: Vec<String>,
        error: Option<String>,
    },
}

/// The handle the gateway keeps.
pub struct Intake {
    jobs: Option<SyncSender<Job>>,
    done: Receiver<Done>,
    thread: Option<JoinHandle<()>>,
    in_flight: usize,
}

impl Intake {
    /// Start the thread. `capacity`: jobs queued at most (the caller keeps fewer in flight).
    pub fn start(ledger_path: &Path, waker: Arc<Waker>, capacity: usize) -> Intake {
        let (jobs, rx) = sync_channel::<Job>(capacity.max(1));
        let (tx, done) = channel::<Done>();
        let path = ledger_path.to_path_buf();
        let thread = std::thread::Builder::new()
            .name("listing-intake".into())
            .spawn(move || run(path, rx, tx, waker))
            .map_err(|e| crate::error!("pins: cannot start the listing intake thread: {e}"))
            .ok();
        Intake {
            jobs: thread.as_ref().map(|_| jobs),
            done,
            thread,
            in_flight: 0,
        }
    }

    /// Hand a job over; `Err` gives it back when the thread is gone or the queue is full.
    pub fn submit(&mut self, job: Job) -> Result<(), Job> {
        let Some(jobs) = &self.jobs else {
            return Err(job);
        };
        match jobs.try_send(job) {
            Ok(()) => {
                self.in_flight += 1;
                Ok(())
            }
            Err(TrySendError::Full(j)) | Err(TrySendError::Disconnected(j)) => Err(j),
        }
    }

    /// Results ready now.
    pub fn poll(&mut self) -> Vec<Done> {
        let mut out = Vec::new();
        while let Ok(d) = self.done.try_recv() {
            self.in_flight = self.in_flight.saturating_sub(1);
            out.push(d);
        }
        out
    }

    /// Jobs handed over and not yet taken back.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }
}

impl Drop for Intake {
    fn drop(&mut self) {
        // The thread finishes what is queued (pins and owners reach the disk), then ends.
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(path: PathBuf, jobs: Receiver<Job>, done: std::sync::mpsc::Sender<Done>, waker: Arc<Waker>) {
    let mut store = match PinStore::open(&path) {
        Ok(mut s) => {
            if let Err(e) = s.relaxed_sync() {
                crate::warn!("{e}");
            }
            s.pause_after_commit(PIN_TX_PAUSE);
            Some(s)
        }
        Err(e) => {
            crate::error!("{e}; tools of servers under pin = \"enforce\" stay hidden");
            None
        }
    };
    while let Ok(job) = jobs.recv() {
        let result = match job {
            Job::Listing(j) => Done::Listing {
                server: j.server.clone(),
                kind: j.kind,
                outcome: Box::new(process(store.as_mut(), &j).map(|mut r| {
                    r.delta = Some(delta::diff(j.kind, j.base.clone(), &mut r.entries));
                    r
                })),
            },
            Job::Owners {
                server,
                uris,
                prune_before_ms,
                now_ms,
                keep,
            } => {
                let (pruned, error) = owners(
                    store.as_mut(),
                    &server,
                    &uris,
                    prune_before_ms,
                    now_ms,
                    keep,
                );
                Done::Owners {
                    server,
                    pruned,
                    error,
                }
            }
        };
        if done.send(result).is_err() {
            return;
        }
        let _ = waker.wake();
    }
}

fn owners(
    store: Option<&mut PinStore>,
    server: &str,
    uris: &[String],
    prune_before_ms: i64,
    now_ms: i64,
    keep: usize,
) -> (Vec<String>, Option<String>) {
    let Some(store) = store else {
        return (Vec::new(), Some("the pin store is not open".into()));
    };
    for chunk in uris.chunks(OWNER_CHUNK) {
        if let Err(e) = store.write(|t| {
            for uri in chunk {
                t.own(uri, server, now_ms)?;
            }
            Ok(())
        }) {
            return (Vec::new(), Some(e));
        }
    }
    match store.write(|t| {
        let mut gone = t.prune_owners(server, prune_before_ms)?;
        gone.extend(t.trim_owners(server, keep)?);
        Ok(gone)
    }) {
        Ok(p) => (p, None),
        Err(e) => (Vec::new(), Some(e)),
    }
}

/// Check, pin and prepare one listing.
pub fn process(store: Option<&mut PinStore>, job: &ListingJob) -> Result<Reviewed, Refusal> {
    let reviewed = review_listing(store, job);
    // What this listing refused is what the next one's refusals are compared with.
    crate::mcp::catalog::unservable::listing_reviewed(&job.server, job.kind);
    reviewed
}

fn review_listing(store: Option<&mut PinStore>, job: &ListingJob) -> Result<Reviewed, Refusal> {
    let items = listing::check(&job.server, job.kind, &job.text, &job.budget)?;
    if !super::kinds::pinned(job.kind) || job.rules.mode == PinMode::Off {
        let mut text_tally = Default::default();
        let entries = items
            .into_iter()
            .filter_map(|raw| {
                let item = listing::parse(&job.server, job.kind, raw);
                Entry::listed_tallied(
                    job.kind,
                    &job.server,
                    job.worker,
                    item,
                    job.rules.prefix,
                    &mut text_tally,
                )
            })
            .collect();
        use sha2::Digest;
        return Ok(Reviewed {
            entries,
            // What the entries are made of: the text, the worker they route to, the
            // naming rule.
            text_digest: Some({
                let mut h = sha2::Sha256::new();
                h.update((job.worker as u64).to_le_bytes());
                h.update([u8::from(job.rules.prefix)]);
                h.update(job.text.as_bytes());
                h.finalize().into()
            }),
            text_tally,
            ..Reviewed::default()
        });
    }
    Ok(review_tools(store, job, items))
}

fn review_tools(
    store: Option<&mut PinStore>,
    job: &ListingJob,
    items: Vec<&serde_json::value::RawValue>,
) -> Reviewed {
    let rules = &job.rules;
    let server = job.server.as_str();
    let now = job.now_ms;
    let mut out = Reviewed::default();
    let mut summary = ReviewSummary {
        server: server.to_owned(),
        kind: job.kind.word(),
        listed: items.len(),
        ..ReviewSummary::default()
    };
    let enforce = rules.mode == PinMode::Enforce;
    let Some(store) = store else {
        // Fail closed: nothing unpinned is served under enforce.
        summary.store_error = Some("the pin store is not open".into());
        for raw in items {
            push_unreviewed(
                &mut out,
                job,
                listing::parse(&job.server, job.kind, raw),
                enforce,
                "the pin store is not open",
            );
        }
        summary.hidden = out.hidden.len();
        out.summary = Some(summary);
        return out;
    };

    // The server: seen before (maybe at another address now), renamed (declared or not),
    // reached where another pinned server is, or brand new. Only brand new is trusted on
    // first sight.
    let kind = job.kind;
    let marker = super::kinds::marker(kind, server);
    let server_state = store.write(|t| {
        let mut state = ServerState::default();
        // Another kind than tools: its first sight is its own (listings of a new server's
        // kinds are reviewed in any order), recorded in a marker row.
        let kind_seen = kind != Kind::Tools && t.server(&marker)?.is_some();
        if let Some(mut known) = t.server(server)? {
            if !known.origin.is_empty()
                && !rules.origin.is_empty()
                && !super::origin::same(&known.origin, &rules.origin)
            {
                state.moved_from = Some(std::mem::take(&mut known.origin));
            }
            if known.origin.is_empty() && !rules.origin.is_empty() {
                known.origin = rules.origin.clone();
                t.put_server(&known)?;
            }
            state.first_sight = kind != Kind::Tools && !kind_seen && state.moved_from.is_none();
            return Ok(state);
        }
        if let Some(from) = &rules.renamed_from
            && let Some(old) = t.server(from)?
        {
            let moved = t.move_server(from, server)?;
            state.renamed = Some((from.clone(), moved));
            if !old.origin.is_empty() && !super::origin::same(&old.origin, &rules.origin) {
                state.moved_from = Some(old.origin);
            }
            t.put_server(&ServerRecord {
                server: server.to_owned(),
                origin: rules.origin.clone(),
                first_listed_ms: old.first_listed_ms,
            })?;
            return Ok(state);
        }
        // Two local servers may run one program (their own walls, env and state): the new
        // one serves on sight only what the other has approved, never what waits there
        // for review; a gone one's command line marks a rename. Two URLs alike are one
        // server.
        let local = rules.origin.starts_with(super::origin::LOCAL_PREFIX);
        for other in t.servers_from(&rules.origin, server)? {
            if rules.configured.contains(&other) {
                if local {
                    state.vouched.extend(t.approved_digests(&other)?);
                    state.same_program.push(other);
                } else {
                    state.same_address.push(other);
                }
            } else {
                state.looks_renamed.push(other);
            }
        }
        state.first_sight = state.looks_renamed.is_empty()
            && state.same_address.is_empty()
            && state.same_program.is_empty()
            && !kind_seen;
        Ok(state)
    });
    let mut vouched = HashSet::new();
    let (first_sight, force_hold) = match server_state {
        Ok(state) => {
            let hold = !state.first_sight
                && (state.moved_from.is_some()
                    || !state.looks_renamed.is_empty()
                    || !state.same_address.is_empty()
                    || !state.same_program.is_empty());
            vouched = state.vouched;
            summary.same_program_as = state.same_program;
            summary.renamed_from = state.renamed;
            summary.looks_renamed_from = state.looks_renamed;
            summary.same_address_as = state.same_address;
            summary.moved = state.moved_from.map(|was| (was, rules.origin.clone()));
            (state.first_sight, hold)
        }
        Err(e) => {
            summary.store_error = Some(e);
            (false, true)
        }
    };
    // A server now reached elsewhere keeps serving what was approved; what is new there
    // waits, and the new address is the one remembered.
    if summary.moved.is_some()
        && summary.renamed_from.is_none()
        && let Err(e) = store.write(|t| {
            if let Some(mut known) = t.server(server)? {
                known.origin = rules.origin.clone();
                t.put_server(&known)?;
            }
            Ok(())
        })
    {
        summary.store_error = Some(e);
    }
    let ctx = ReviewCtx {
        server: server.to_owned(),
        mode: rules.mode,
        new_tools: rules.new_tools,
        first_sight,
        force_hold,
        vouched_by: summary.same_program_as.join(", "),
        vouched,
        now_ms: now,
        touch_after_ms: (rules.retention_ms / 4).clamp(1, 3_600_000),
        new_on_sight: kind == Kind::Resources,
    };
    // Resources: pinned URIs keep their pins; new ones are pinned while the server has
    // fewer than `max_resource_pins` (listed now or not), the rest served unpinned.
    let mut room = match kind {
        Kind::Resources => match resource_room(store, server, rules.max_resource_pins) {
            Ok(room) => Some(room),
            Err(e) => {
                summary.store_error = Some(e);
                Some(0)
            }
        },
        _ => None,
    };
    let room_at_start = room;

    let mut listed: HashSet<String> = HashSet::with_capacity(items.len());
    let mut items = items.into_iter().peekable();
    while items.peek().is_some() {
        let chunk: Vec<Value> = items
            .by_ref()
            .take(CHUNK)
            .map(|raw| listing::parse(server, kind, raw))
            .collect();
        let prepared: Vec<(String, Value, super::digest::Pinned)> = chunk
            .into_iter()
            .filter_map(|item| {
                let key = super::kinds::key(kind, server, &item)?;
                // A definition that would never be served is not held for approval
                // either (approving it could not serve it): it is said once as not
                // served, and its pin, if it has one, stays as it was.
                if let Some(why) = served_text::unservable(kind, &item) {
                    let upstream = item.get(kind.key_field()).and_then(Value::as_str);
                    unservable::note_item(server, kind, upstream.unwrap_or_default(), &why);
                    listed.insert(key);
                    return None;
                }
                let p = pinned(&item);
                Some((key, item, p))
            })
            .collect();
        // In transactions of at most PIN_TX_BUDGET each: whatever a definition weighs,
        // the ledger's writer never waits long for the file's lock.
        let mut reviews: Result<Vec<_>, String> = Ok(Vec::with_capacity(prepared.len()));
        while let Ok(done) = &mut reviews
            && done.len() < prepared.len()
        {
            let rest = &prepared[done.len()..];
            match review_some(store, &ctx, rest, now, &mut room) {
                Ok(more) => done.extend(more),
                Err(e) => reviews = Err(e),
            }
        }
        match reviews {
            Ok(reviews) => {
                for ((name, item, _), r) in prepared.into_iter().zip(reviews) {
                    note(&mut summary, &name, r.note);
                    match r.outcome {
                        Outcome::Serve => {
                            if let Some(e) = Entry::listed_tallied(
                                kind,
                                server,
                                job.worker,
                                item,
                                rules.prefix,
                                &mut out.text_tally,
                            ) {
                                out.entries.push(e);
                            }
                        }
                        Outcome::Hide(why) => out.hidden.push((name.clone(), why)),
                    }
                    listed.insert(name);
                }
            }
            Err(e) => {
                for (name, item, _) in prepared {
                    push_unreviewed(&mut out, job, item, enforce, &e);
                    listed.insert(name);
                }
                summary.store_error = Some(e);
            }
        }
    }

    // Tools no longer listed, and the server's record once everything above is written.
    let write_record = first_sight && summary.store_error.is_none();
    // Deleted in transactions of [`CHUNK`] like the reviews: a listing that rotated
    // 10,000 held tools away must not hold the file's write lock past the ledger's wait.
    let tail = store
        .write(|t| {
            let absent: Vec<_> = t
                .summaries(server)?
                .into_iter()
                .filter(|p| super::kinds::kind_of(&p.tool) == kind && !listed.contains(&p.tool))
                .collect();
            // Resources: a pin of an absent URI stays until its retention ends, never pushed
            // out by new ones (a server that listed enough new URIs could otherwise drop a
            // pin, then bring its URI back changed as "new" and served).
            let cap = match room_at_start {
                Some(_) => usize::MAX,
                None => rules.absent_cap,
            };
            Ok(review::absent(absent, now, rules.retention_ms, cap))
        })
        .and_then(|decided| {
            for chunk in decided.drop_held.chunks(CHUNK) {
                store.write(|t| chunk.iter().try_for_each(|tool| t.delete_held(tool)))?;
            }
            for chunk in decided.prune.chunks(CHUNK) {
                store.write(|t| chunk.iter().try_for_each(|tool| t.delete(tool)))?;
            }
            Ok(decided)
        });
    let tail = tail.and_then(|decided| {
        store.write(|t| {
            if write_record && kind == Kind::Tools {
                t.put_server(&ServerRecord {
                    server: server.to_owned(),
                    origin: rules.origin.clone(),
                    first_listed_ms: now,
                })?;
            } else if write_record {
                t.put_server(&ServerRecord {
                    server: marker.clone(),
                    origin: String::new(),
                    first_listed_ms: now,
                })?;
            }
            Ok(())
        })?;
        Ok(decided)
    });
    match tail {
        Ok(decided) => {
            summary.dropped_held = decided.drop_held.len();
            for p in decided.prune {
                summary.pruned.add(p);
            }
        }
        Err(e) => summary.store_error = Some(e),
    }
    // Said when it holds something new: a server held that way lists the same tools
    // again and again, and must not log or record it every time.
    if summary.new_held.count == 0 {
        summary.looks_renamed_from.clear();
        summary.same_address_as.clear();
        summary.same_program_as.clear();
    }
    summary.hidden = out.hidden.len();
    out.summary = Some(summary);
    if matches!(kind, Kind::Resources | Kind::Templates) {
        // What the entries are made of: the text, the worker, the naming rule and what the
        // pins hid; a relisting identical in all of these changes nothing for agents.
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update((job.worker as u64).to_le_bytes());
        h.update([u8::from(rules.prefix)]);
        h.update((job.text.len() as u64).to_le_bytes());
        h.update(job.text.as_bytes());
        for (name, why) in &out.hidden {
            h.update((name.len() as u64).to_le_bytes());
            h.update(name.as_bytes());
            h.update((why.len() as u64).to_le_bytes());
            h.update(why.as_bytes());
        }
        out.text_digest = Some(h.finalize().into());
    }
    out
}

/// Reviews tools from the front of `rest` in one transaction, until all are done or the
/// transaction has run [`PIN_TX_BUDGET`] (at least one is always reviewed).
fn review_some(
    store: &mut PinStore,
    ctx: &ReviewCtx,
    rest: &[(String, Value, super::digest::Pinned)],
    now: i64,
    room: &mut Option<usize>,
) -> Result<Vec<review::ToolReview>, String> {
    let mut left = *room;
    let reviews = store.write(|t| {
        left = *room;
        let started = Instant::now();
        let mut reviews = Vec::new();
        for (name, item, p) in rest {
            if !reviews.is_empty() && started.elapsed() >= PIN_TX_BUDGET {
                break;
            }
            let row = t.get(name)?;
            if row.is_none() {
                match &mut left {
                    Some(0) => {
                        reviews.push(review::ToolReview {
                            outcome: Outcome::Serve,
                            write: None,
                            note: Some(Note::OverPinBudget),
                        });
                        continue;
                    }
                    Some(n) => *n -= 1,
                    None => {}
                }
            }
            let r = review::review_tool(ctx, name, row.as_ref(), p, || pinned_v1(item).digest);
            match &r.write {
                Some(Write::Put(rec)) => t.put(rec)?,
                Some(Write::Touch) => t.touch(name, now)?,
                None => {}
            }
            reviews.push(r);
        }
        Ok(reviews)
    })?;
    *room = left;
    Ok(reviews)
}

/// How many new resource URIs `server` may still have pinned: `max` less all its resource
/// pins, listed now or not (a pin of an absent URI goes only when its retention ends).
fn resource_room(store: &mut PinStore, server: &str, max: usize) -> Result<usize, String> {
    let pinned = store.write(|t| {
        Ok(t.summaries(server)?
            .into_iter()
            .filter(|p| super::kinds::kind_of(&p.tool) == Kind::Resources)
            .count())
    })?;
    Ok(max.saturating_sub(pinned))
}

fn push_unreviewed(out: &mut Reviewed, job: &ListingJob, item: Value, enforce: bool, why: &str) {
    let Some(name) = super::kinds::key(job.kind, &job.server, &item) else {
        return;
    };
    if enforce {
        out.hidden.push((
            name.clone(),
            format!("{name} cannot be checked against its pin ({why}), so it is not served"),
        ));
    } else if let Some(e) = Entry::listed_tallied(
        job.kind,
        &job.server,
        job.worker,
        item,
        job.rules.prefix,
        &mut out.text_tally,
    ) {
        out.entries.push(e);
    }
}

fn note(summary: &mut ReviewSummary, name: &str, note: Option<Note>) {
    let Some(note) = note else { return };
    match note {
        Note::FirstSight => summary.first_sight += 1,
        Note::NewServed { digest } => summary.new_served.add(format!("{name} sha256:{digest}")),
        Note::NewHeld { digest } => summary.new_held.add(format!("{name} sha256:{digest}")),
        Note::Changed {
            approved,
            seen,
            fields,
            enforced,
        } => {
            summary.changed_count += 1;
            if summary.changed.len() < SAMPLE {
                // Field names are the upstream's: bounded and escaped before they reach a
                // log line or a ledger row.
                let mut shown: Vec<String> = fields
                    .iter()
                    .take(SAMPLE)
                    .map(|f| quote_upstream(f, 100))
                    .collect();
                if fields.len() > SAMPLE {
                    shown.push(format!("{} more fields", fields.len() - SAMPLE));
                }
                summary.changed.push(ChangeNote {
                    tool: name.to_owned(),
                    approved_digest: approved,
                    seen_digest: seen,
                    fields: shown,
                    hidden: enforced,
                });
            }
        }
        Note::Reverted => summary.reverted += 1,
        Note::Vouched => summary.vouched += 1,
        Note::NewResource => summary.new_resources += 1,
        Note::OverPinBudget => summary.unpinned.add(name.to_owned()),
        Note::Upgraded => summary.upgraded += 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{Ledger, LedgerConfig};

    fn setup() -> (tempfile::TempDir, PinStore) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        drop(
            Ledger::open(&LedgerConfig {
                path: path.clone(),
                ..LedgerConfig::default()
            })
            .unwrap(),
        );
        let store = PinStore::open(&path).unwrap();
        (dir, store)
    }

    fn rules(server: &str, new_tools: NewTools) -> Arc<ServerRules> {
        Arc::new(ServerRules {
            server: server.into(),
            origin: "http://127.0.0.1:1/mcp".into(),
            mode: PinMode::Enforce,
            new_tools,
            renamed_from: None,
            configured: vec![server.into()],
            retention_ms: 1_000_000,
            absent_cap: 100,
            prefix: true,
            max_resource_pins: 10,
        })
    }

    fn job(server: &str, tools: &[Value], rules: Arc<ServerRules>, now_ms: i64) -> ListingJob {
        ListingJob {
            server: server.into(),
            kind: Kind::Tools,
            worker: 1,
            text: Value::Array(tools.to_vec()).to_string(),
            budget: ListingBudget::plain(1000, 1 << 20, 10),
            rules,
            now_ms,
            base: delta::fresh(),
        }
    }

    fn t(name: &str, desc: &str) -> Value {
        json!({"name": name, "description": desc, "inputSchema": {"type": "object"}})
    }

    fn served(r: &Reviewed) -> Vec<&str> {
        r.entries.iter().map(|e| e.name.as_str()).collect()
    }

    #[test]
    fn first_sight_then_new_tools_held_then_dropped_when_gone() {
        let (_d, mut store) = setup();
        let r = rules("up", NewTools::Hold);
        let first = process(
            Some(&mut store),
            &job("up", &[t("a", "x"), t("b", "y")], r.clone(), 1),
        )
        .unwrap();
        assert_eq!(served(&first), vec!["up__a", "up__b"]);
        let s = first.summary.unwrap();
        assert_eq!(s.first_sight, 2);
        assert_eq!(s.log_lines().len(), 1);
        let second = process(
            Some(&mut store),
            &job("up", &[t("a", "x"), t("b", "y"), t("c", "z")], r.clone(), 2),
        )
        .unwrap();
        assert_eq!(served(&second), vec!["up__a", "up__b"]);
        assert_eq!(second.hidden[0].0, "up__c");
        assert_eq!(second.summary.as_ref().unwrap().new_held.count, 1);
        // Rotated away: the held one is dropped, the approved ones stay.
        let third = process(Some(&mut store), &job("up", &[t("a", "x")], r, 3)).unwrap();
        assert_eq!(third.summary.as_ref().unwrap().dropped_held, 1);
        let all: Vec<String> = store
            .load_all()
            .unwrap()
            .into_iter()
            .map(|p| p.tool)
            .collect();
        assert_eq!(all, vec!["up__a", "up__b"]);
    }

    #[test]
    fn a_large_listing_is_written_in_chunks_and_a_relisting_writes_nothing() {
        let (_d, mut store) = setup();
        let r = rules("big", NewTools::Hold);
        let tools: Vec<Value> = (0..(CHUNK * 3 + 7))
            .map(|i| t(&format!("t{i}"), "d"))
            .collect();
        let first = process(Some(&mut store), &job("big", &tools, r.clone(), 1)).unwrap();
        assert_eq!(first.entries.len(), tools.len());
        assert_eq!(store.load_all().unwrap().len(), tools.len());
        let again = process(Some(&mut store), &job("big", &tools, r, 2)).unwrap();
        assert!(!again.summary.unwrap().eventful());
    }

    #[test]
    fn a_rename_is_held_unless_declared() {
        let (_d, mut store) = setup();
        let old = rules("old", NewTools::Hold);
        process(Some(&mut store), &job("old", &[t("a", "x")], old, 1)).unwrap();
        // Same origin, new name, the old one no longer configured.
        let r = rules("new", NewTools::Serve);
        let held = process(Some(&mut store), &job("new", &[t("a", "x")], r.clone(), 2)).unwrap();
        assert!(held.entries.is_empty());
        assert_eq!(
            held.summary.as_ref().unwrap().looks_renamed_from,
            vec!["old".to_string()]
        );
        // Still held the next time (nothing was recorded as trusted).
        let again = process(Some(&mut store), &job("new", &[t("a", "x")], r, 3)).unwrap();
        assert!(again.entries.is_empty());
        // Declared: the pins follow.
        let mut declared = (*rules("new", NewTools::Hold)).clone();
        declared.renamed_from = Some("old".into());
        let moved = process(
            Some(&mut store),
            &job("new", &[t("a", "x")], Arc::new(declared), 4),
        )
        .unwrap();
        assert_eq!(served(&moved), vec!["new__a"]);
        assert_eq!(moved.summary.unwrap().renamed_from, Some(("old".into(), 1)));
    }

    fn at(server: &str, origin: &str, configured: &[&str]) -> Arc<ServerRules> {
        let mut r = (*rules(server, NewTools::Serve)).clone();
        r.origin = origin.into();
        r.configured = configured.iter().map(|s| s.to_string()).collect();
        Arc::new(r)
    }

    #[test]
    fn a_new_name_at_any_spelling_of_a_pinned_address_is_held() {
        let (_d, mut store) = setup();
        let base = "http://127.0.0.1:1/mcp";
        process(
            Some(&mut store),
            &job("a", &[t("x", "v0")], at("a", base, &["a"]), 1),
        )
        .unwrap();
        // The upstream changes its tool: waiting for approval under `a`.
        let changed = process(
            Some(&mut store),
            &job("a", &[t("x", "v1 RUGPULL")], at("a", base, &["a"]), 2),
        )
        .unwrap();
        assert!(changed.entries.is_empty());
        let spellings = [
            "http://127.0.0.1:1/mcp",
            "http://localhost:1/mcp",
            "http://127.0.0.1:1/mcp/",
            "HTTP://127.0.0.1:1/MCP",
            "http://127.0.0.1:1/mcp?v=1",
            "http://[::1]:1/mcp",
        ];
        for (n, url) in spellings.iter().enumerate() {
            // `a` renamed (gone from the config), or still configured next to it.
            for (name, with_a) in [(format!("b{n}"), false), (format!("c{n}"), true)] {
                let configured = if with_a {
                    vec!["a", name.as_str()]
                } else {
                    vec![name.as_str()]
                };
                let r = process(
                    Some(&mut store),
                    &job(
                        &name,
                        &[t("x", "v1 RUGPULL")],
                        at(&name, url, &configured),
                        3,
                    ),
                )
                .unwrap();
                assert!(
                    r.entries.is_empty(),
                    "{url} {configured:?}: {:?}",
                    served(&r)
                );
                let s = r.summary.unwrap();
                assert_eq!(s.first_sight, 0, "{url}");
                let named = if configured.len() == 2 {
                    &s.same_address_as
                } else {
                    &s.looks_renamed_from
                };
                assert_eq!(named, &vec!["a".to_string()], "{url}");
                assert!(
                    s.log_lines()
                        .iter()
                        .any(|(warn, l)| *warn && l.contains("held"))
                );
                // Listed again: still held, nothing more to log or record.
                let again = process(
                    Some(&mut store),
                    &job(
                        &name,
                        &[t("x", "v1 RUGPULL")],
                        at(&name, url, &configured),
                        4,
                    ),
                )
                .unwrap();
                assert!(again.entries.is_empty());
                assert!(!again.summary.unwrap().eventful());
            }
        }
        // Another address is another server: first sight.
        let other = process(
            Some(&mut store),
            &job(
                "d",
                &[t("x", "v")],
                at("d", "http://127.0.0.1:2/mcp", &["d"]),
                5,
            ),
        )
        .unwrap();
        assert_eq!(served(&other), vec!["d__x"]);
    }

    #[test]
    fn two_local_servers_may_run_one_program_but_a_renamed_one_is_held() {
        let (_d, mut store) = setup();
        let cmd = super::super::origin::of_server("", Some(&["python3".into(), "s.py".into()]));
        process(
            Some(&mut store),
            &job("a", &[t("x", "v")], at("a", &cmd, &["a", "b"]), 1),
        )
        .unwrap();
        // `a` changes `x`: the change waits for approval under `a`.
        let a2 = process(
            Some(&mut store),
            &job(
                "a",
                &[t("x", "v2 RUGPULL"), t("y", "w")],
                at("a", &cmd, &["a", "b"]),
                2,
            ),
        )
        .unwrap();
        assert_eq!(served(&a2), vec!["a__y"], "new_tools = serve at `a`");
        // Another instance of the program serves only what `a` approved: not the pending
        // `x`, not what `a` never listed.
        let b = process(
            Some(&mut store),
            &job(
                "b",
                &[t("x", "v2 RUGPULL"), t("z", "new")],
                at("b", &cmd, &["a", "b"]),
                2,
            ),
        )
        .unwrap();
        assert!(b.entries.is_empty(), "{:?}", served(&b));
        assert_eq!(b.hidden.len(), 2);
        let s = b.summary.unwrap();
        assert_eq!(s.same_program_as, vec!["a".to_string()]);
        assert!(
            s.log_lines()
                .iter()
                .any(|(w, l)| *w && l.contains("same command"))
        );
        let b = process(
            Some(&mut store),
            &job(
                "b",
                &[t("x", "v"), t("y", "w")],
                at("b", &cmd, &["a", "b"]),
                2,
            ),
        )
        .unwrap();
        assert_eq!(
            served(&b),
            vec!["b__x", "b__y"],
            "what a approved is served"
        );
        assert_eq!(b.summary.unwrap().vouched, 2);
        let c = process(
            Some(&mut store),
            &job("c", &[t("x", "v")], at("c", &cmd, &["c"]), 3),
        )
        .unwrap();
        assert!(c.entries.is_empty(), "a is gone: c looks renamed");
        assert_eq!(c.summary.unwrap().looks_renamed_from, vec!["a"]);
    }

    #[test]
    fn a_server_moved_to_another_address_keeps_approvals_and_holds_what_is_new() {
        let (_d, mut store) = setup();
        let base = "http://127.0.0.1:1/mcp";
        process(
            Some(&mut store),
            &job("a", &[t("x", "v0")], at("a", base, &["a"]), 1),
        )
        .unwrap();
        let elsewhere = "http://127.0.0.1:9/mcp";
        let r = process(
            Some(&mut store),
            &job(
                "a",
                &[t("x", "v0"), t("y", "new")],
                at("a", elsewhere, &["a"]),
                2,
            ),
        )
        .unwrap();
        assert_eq!(served(&r), vec!["a__x"], "new_tools = serve does not apply");
        let s = r.summary.unwrap();
        assert_eq!(s.moved, Some((base.to_string(), elsewhere.to_string())));
        assert!(s.log_lines().iter().any(|(_, l)| l.contains("pinned at")));
        // Remembered at its new address: nothing more to say the next time.
        let again = process(
            Some(&mut store),
            &job(
                "a",
                &[t("x", "v0"), t("y", "new")],
                at("a", elsewhere, &["a"]),
                3,
            ),
        )
        .unwrap();
        assert!(again.summary.unwrap().moved.is_none());
        // Declared rename to another address: pins follow, new tools wait.
        let mut declared = (*at("b", "http://127.0.0.1:7/mcp", &["b"])).clone();
        declared.renamed_from = Some("a".into());
        let r = process(
            Some(&mut store),
            &job("b", &[t("x", "v0"), t("z", "new")], Arc::new(declared), 4),
        )
        .unwrap();
        assert_eq!(served(&r), vec!["b__x"]);
        assert!(r.summary.unwrap().moved.is_some());
    }

    #[test]
    fn prompts_have_their_own_first_sight_and_pins() {
        for prompts_first in [true, false] {
            let (_d, mut store) = setup();
            let r = rules("up", NewTools::Hold);
            let mut prompts = job("up", &[t("a", "p")], r.clone(), 1);
            prompts.kind = Kind::Prompts;
            let tools = job("up", &[t("a", "x")], r.clone(), 1);
            let (first, second) = if prompts_first {
                (&prompts, &tools)
            } else {
                (&tools, &prompts)
            };
            let one = process(Some(&mut store), first).unwrap();
            let two = process(Some(&mut store), second).unwrap();
            assert_eq!(served(&one), vec!["up__a"], "{prompts_first}");
            assert_eq!(served(&two), vec!["up__a"], "{prompts_first}");
            let keys: Vec<String> = store
                .load_all()
                .unwrap()
                .into_iter()
                .map(|p| p.tool)
                .collect();
            assert_eq!(keys, vec!["prompt/up__a", "up__a"]);
            // A changed prompt is held; a tools listing does not touch prompt pins.
            let mut changed = job("up", &[t("a", "p2"), t("b", "new")], r.clone(), 2);
            changed.kind = Kind::Prompts;
            let held = process(Some(&mut store), &changed).unwrap();
            assert!(held.entries.is_empty());
            assert_eq!(held.hidden.len(), 2);
            process(Some(&mut store), &job("up", &[t("a", "x")], r, 3)).unwrap();
            assert_eq!(store.load_all().unwrap().len(), 3);
        }
    }

    #[test]
    fn without_a_store_enforced_tools_stay_hidden() {
        let r = rules("up", NewTools::Hold);
        let out = process(None, &job("up", &[t("a", "x")], r, 1)).unwrap();
        assert!(out.entries.is_empty());
        assert_eq!(out.hidden.len(), 1);
    }

    #[test]
    fn over_budget_is_refused_before_any_pin_is_written() {
        let (_d, mut store) = setup();
        let mut j = job(
            "up",
            &[t("a", "x"), t("b", "y")],
            rules("up", NewTools::Hold),
            1,
        );
        j.budget = ListingBudget::plain(1, 1 << 20, 10);
        assert_eq!(
            process(Some(&mut store), &j).unwrap_err().code,
            "over_budget"
        );
        assert!(store.load_all().unwrap().is_empty());
    }
}
