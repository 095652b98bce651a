//! One upstream server inside the aggregator worker: its connection state (era, session,
//! up or down), the requests the gateway sends it, and the thread that keeps it connected.
//!
//! The **watcher** thread owns (re)connection: it detects the era, retries a server that is
//! down with backoff (one second doubling up to `retry_max_secs`), keeps a listening stream
//! open when the server announces list changes (legacy: `GET`; modern: `POST
//! subscriptions/listen`), and tells the gateway through events: `upstream_state` on every
//! change of state, `list_changed` when a list changed or the server came back.
//!
//! Requests run on the server's own pool threads (so a slow server holds up only itself).
//! A request never connects by itself: it takes the current session, and when the server
//! is down it fails at once with the last error. A legacy session the server forgot (404)
//! is renewed once (whoever meets the 404 first re-initializes; the others reuse the new
//! session) and the request is repeated once, unless it is a `tools/call`.

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::budget::ListingBudget;
use super::call_link::{CancelHook, NoAnswer};
use super::call_relay::{self, CallContext};
use super::channel::Channel;
use super::config::EraChoice;
use super::drop_tally::DropTally;
use super::era::{
    self, AfterStatus, Discovery, Era, ListChanges, after_status, judge_discover, judge_initialize,
    params_for, protocol_headers, status_error,
};
use super::error::{UpstreamError, UpstreamErrorCode, quote_upstream};
use super::exchange::{Notice, Reply, Transport};
use super::listing_pages::PageCollector;
use super::message::{
    answer_body, list_changed_kind, notification_body, refusal_body, request_body,
};
use super::resource_subscriptions;
use super::scrub::Scrubber;
use super::setup::{Limits, UpstreamSetup};
use crate::mcp::catalog::Kind;
use crate::mcp::token_bucket::TokenBucket;
use crate::workers::relay_wire::{CALL_NOTIFICATION, CallNotification, RequestAnswer};

/// Events the worker sends the gateway: `(kind, detail)`.
pub type EventSink = Arc<dyn Fn(&str, Value) + Send + Sync>;

/// First retry delay of a server that is down.
/// How a notice met during a request is relayed: the call's context (None: the gateway's
/// own request), the scope whose threads wait for the client's answers, and how many wait.
struct Relaying<'a, 's, 'e> {
    ctx: Option<&'a mut CallContext>,
    scope: &'s std::thread::Scope<'s, 'e>,
    waiting: &'a mut usize,
}

pub const MIN_RETRY: Duration = Duration::from_secs(1);
/// Silence on a listening stream before it is reopened.
pub const LISTEN_IDLE: Duration = Duration::from_secs(300);
/// Progress and log notifications relayed from one listening stream: per second, burst.
pub const LISTEN_NOTIFICATIONS: (u32, u32) = (20, 50);
/// A local server up this long before its stream broke starts again without the backoff
/// its earlier failures built up.
pub const STABLE_UP: Duration = Duration::from_secs(30);

/// The method that lists `kind`.
pub fn list_method(kind: Kind) -> &'static str {
    match kind {
        Kind::Tools => "tools/list",
        Kind::Resources => "resources/list",
        Kind::Prompts => "prompts/list",
        Kind::Templates => "resources/templates/list",
    }
}

fn kind_bit(kind: Kind) -> u8 {
    match kind {
        Kind::Tools => 1,
        Kind::Resources => 2,
        Kind::Prompts => 4,
        Kind::Templates => 8,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The first attempt is under way: requests wait for it.
    Connecting,
    Up,
    Down,
}

impl Phase {
    fn as_str(self) -> &'static str {
        match self {
            Phase::Connecting => "connecting",
            Phase::Up => "up",
            Phase::Down => "down",
        }
    }
}

#[derive(Debug)]
struct ConnState {
    phase: Phase,
    era: Option<Era>,
    changes: ListChanges,
    /// Bumped on every new session, so a 404 renews it once.
    generation: u64,
    last_error: Option<String>,
    /// A request was refused because the server was down: list again once it is up.
    refused_while_down: bool,
    /// A request could not reach the server: the watcher should check it.
    check: bool,
    /// How many times the server came up.
    ups: u64,
    /// A modern server's watched resource URIs (see `resource_subscriptions.rs`).
    subscriptions: std::collections::BTreeSet<String>,
    /// The URIs changed since the listening stream last opened.
    subscriptions_changed: bool,
}

/// Notifications met while serving one request, by method (progress and log messages
/// cannot be relayed to the agent from here: they are counted, and the counts go in the
/// call's facts).
#[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
pub struct Notices {
    pub counts: BTreeMap<String, u64>,
}

impl Notices {
    fn count(&mut self, method: &str) {
        let key = if method.len() > 64 { "other" } else { method };
        *self.counts.entry(key.to_owned()).or_insert(0) += 1;
    }
}

/// What a request sends as `params`.
enum Params {
    None,
    Value(Value),
    /// `tools/call`: the arguments stay the JSON text the gateway sent; `extra` holds an
    /// `input_required` retry's `inputResponses` and `requestState`.
    ToolCall {
        name: String,
        arguments: Box<RawValue>,
        extra: Map<String, Value>,
    },
}

impl Params {
    /// Add an `input_required` retry's fields.
    fn extend(&mut self, more: Map<String, Value>) {
        match self {
            Params::None => *self = Params::Value(Value::Object(more)),
            Params::Value(Value::Object(m)) | Params::ToolCall { extra: m, .. } => m.extend(more),
            Params::Value(other) => *other = Value::Object(more),
        }
    }
}

#[derive(Serialize)]
struct ToolCallParams<'a> {
    name: &'a str,
    arguments: &'a RawValue,
    #[serde(rename = "_meta", skip_serializing_if = "Option::is_none")]
    meta: Option<Value>,
    #[serde(flatten)]
    extra: &'a Map<String, Value>,
}

pub struct Upstream {
    name: String,
    era_choice: EraChoice,
    transport: Option<Channel>,
    unusable: Option<String>,
    limits: Limits,
    state: Mutex<ConnState>,
    changed: Condvar,
    /// Held while a session is renewed, so only one thread re-initializes.
    renewing: Mutex<()>,
    next_id: AtomicU64,
    events: EventSink,
    /// Lists announced as changed and not listed since (one bit per kind): a flood of
    /// `list_changed` becomes one event per list until the gateway lists it again.
    changes_pending: AtomicU8,
    /// Announcements folded into one already pending, not reported yet.
    coalesced: AtomicU64,
    /// The server's own credentials, cut from what it sends back.
    scrub: Scrubber,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("name", &self.name)
            .finish()
    }
}

impl Upstream {
    pub fn new(setup: &UpstreamSetup, limits: &Limits, events: EventSink) -> Arc<Upstream> {
        let channel = Transport::new(setup, limits)
            .map(|t| Channel::Http(Box::new(t)))
            .map_err(|e| e.message);
        Upstream::with_channel(setup, limits, events, channel)
    }

    /// An upstream reached through `channel` (or never, and why).
    pub fn with_channel(
        setup: &UpstreamSetup,
        limits: &Limits,
        events: EventSink,
        channel: Result<Channel, String>,
    ) -> Arc<Upstream> {
        let (transport, unusable) = match &setup.unusable {
            Some(why) => (None, Some(why.clone())),
            None => match channel {
                Ok(t) => (Some(t), None),
                Err(e) => (None, Some(e)),
            },
        };
        Arc::new(Upstream {
            name: setup.name.clone(),
            era_choice: setup.era,
            transport,
            unusable,
            limits: limits.clone(),
            state: Mutex::new(ConnState {
                phase: Phase::Connecting,
                era: None,
                changes: ListChanges::default(),
                generation: 0,
                last_error: None,
                refused_while_down: false,
                check: false,
                ups: 0,
                subscriptions: Default::default(),
                subscriptions_changed: false,
            }),
            changed: Condvar::new(),
            renewing: Mutex::new(()),
            next_id: AtomicU64::new(1),
            events,
            changes_pending: AtomicU8::new(0),
            coalesced: AtomicU64::new(0),
            scrub: Scrubber::new(setup),
        })
    }

    /// What came back from the server, without its own credentials.
    pub fn scrubbed(&self, r: Result<String, UpstreamError>) -> Result<String, UpstreamError> {
        r.map(|text| self.scrub.json_text(text))
            .map_err(|e| self.scrubbed_error(e))
    }

    /// An error about the server (it may quote the server), without its credentials.
    pub fn scrubbed_error(&self, mut e: UpstreamError) -> UpstreamError {
        e.message = self.scrub.text(e.message);
        e
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn lock(&self) -> MutexGuard<'_, ConnState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Start the watcher thread.
    pub fn start(self: &Arc<Self>) -> std::io::Result<()> {
        let me = Arc::clone(self);
        std::thread::Builder::new()
            .name(format!("watch-{}", truncate(&self.name, 9)))
            .spawn(move || me.watch())?;
        Ok(())
    }

    // ---- state ----------------------------------------------------------------------

    fn emit_state(&self, st: &ConnState) {
        let mut detail = json!({
            "server": self.name,
            "state": st.phase.as_str(),
            "era": st.era.as_ref().map(Era::describe),
            "last_error": st.last_error,
            "list_changed": {"tools": st.changes.tools, "resources": st.changes.resources, "prompts": st.changes.prompts},
            "offers": {"completions": st.changes.completions, "subscribe": st.changes.subscribe},
        });
        if let (Some(Value::Object(more)), Value::Object(d)) = (
            self.transport.as_ref().and_then(Channel::describe),
            &mut detail,
        ) {
            d.extend(more);
        }
        (self.events)("upstream_state", detail);
    }

    /// `kinds` changed: one event for those not already announced; the rest are counted.
    /// Returns whether an event went out.
    fn emit_list_changed(&self, kinds: &[Kind]) -> bool {
        let mut fresh = Vec::new();
        for kind in kinds {
            let bit = kind_bit(*kind);
            if self.changes_pending.fetch_or(bit, Ordering::AcqRel) & bit == 0 {
                fresh.push(kind.list_key());
            } else {
                self.coalesced.fetch_add(1, Ordering::Relaxed);
            }
        }
        if fresh.is_empty() {
            return false;
        }
        let coalesced = self.coalesced.swap(0, Ordering::Relaxed);
        (self.events)(
            "list_changed",
            json!({"server": self.name, "kinds": fresh, "coalesced": coalesced}),
        );
        true
    }

    fn mark_up(&self, era: Era, changes: ListChanges) {
        let relist;
        {
            let mut st = self.lock();
            st.generation += 1;
            st.era = Some(era);
            st.changes = changes;
            st.last_error = None;
            st.check = false;
            st.ups += 1;
            relist = st.ups > 1 || st.refused_while_down;
            st.refused_while_down = false;
            st.phase = Phase::Up;
            self.emit_state(&st);
        }
        self.changed.notify_all();
        if relist {
            self.emit_list_changed(&Kind::ALL);
        }
    }

    fn mark_down(&self, error: &UpstreamError) {
        {
            let mut st = self.lock();
            let changed = st.phase != Phase::Down
                || st.last_error.as_deref() != Some(&self.scrub.text(error.message.clone()));
            st.phase = Phase::Down;
            st.last_error = Some(self.scrub.text(error.message.clone()));
            if changed {
                self.emit_state(&st);
            }
        }
        self.changed.notify_all();
    }

    /// The current session, waiting for the first connection attempt if it is under way.
    fn session(&self) -> Result<(Era, u64), UpstreamError> {
        let wait = Duration::from_secs(self.limits.connect_timeout_secs)
            + self
                .transport
                .as_ref()
                .map(|_| Duration::from_secs(self.limits.connect_timeout_secs))
                .unwrap_or_default()
                * 2;
        let deadline = Instant::now() + wait;
        let mut st = self.lock();
        while st.phase == Phase::Connecting {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            st = self
                .changed
                .wait_timeout(st, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        match (&st.phase, &st.era) {
            (Phase::Up, Some(era)) => Ok((era.clone(), st.generation)),
            _ => {
                st.refused_while_down = true;
                let why = st
                    .last_error
                    .clone()
                    .or_else(|| self.unusable.clone())
                    .unwrap_or_else(|| "still connecting".into());
                Err(UpstreamError::new(
                    UpstreamErrorCode::ServerDown,
                    format!("server {} is not available: {why}", self.name),
                ))
            }
        }
    }

    /// A request could not reach the server: let the watcher check it.
    fn suspect(&self) {
        self.lock().check = true;
        self.changed.notify_all();
    }

    // ---- connecting -------------------------------------------------------------------

    fn transport(&self) -> Result<&Channel, UpstreamError> {
        self.transport.as_ref().ok_or_else(|| {
            UpstreamError::new(
                UpstreamErrorCode::ServerDown,
                self.unusable
                    .clone()
                    .unwrap_or_else(|| format!("server {} cannot be reached", self.name)),
            )
        })
    }

    /// Detect the era and open a session. `legacy_only` skips discovery (renewing a
    /// legacy session).
    fn connect(&self, legacy_only: bool) -> Result<(Era, ListChanges), UpstreamError> {
        let transport = self.transport()?;
        transport.open()?;
        let mut ignore = |_: Notice| {};
        if !legacy_only && self.era_choice != EraChoice::Legacy && !transport.knows_legacy() {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let params = params_for(None, None).map(|p| p.to_string());
            let headers = protocol_headers(None, "server/discover", None);
            let body = request_body(id, "server/discover", params.as_deref());
            let reply = transport.probe(&headers, &body, id, &mut ignore)?;
            if matches!(reply.status, 401 | 403)
                && let Some(e) = status_error(&self.name, reply.status)
            {
                return Err(e);
            }
            let outcome = match &reply.answer {
                Some(Ok(r)) if reply.status == 200 => Some(Ok(r.as_str())),
                Some(Err(f)) => Some(Err(f.message.as_str())),
                _ => None,
            };
            match judge_discover(reply.status, outcome) {
                Discovery::Modern { version, changes } => {
                    return Ok((Era::Modern { version }, changes));
                }
                Discovery::TryLegacy(why) if self.era_choice == EraChoice::Modern => {
                    return Err(UpstreamError::new(
                        UpstreamErrorCode::BadResponse,
                        format!(
                            "server {} does not speak the modern era (servers.{}.era = \"modern\"): {why}",
                            self.name, self.name
                        ),
                    ));
                }
                Discovery::TryLegacy(why) => {
                    crate::debug!("server {}: {why}; trying the legacy handshake", self.name);
                    transport.note_legacy();
                }
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let body = request_body(id, "initialize", Some(&era::initialize_params()));
        let reply = transport.post(&[], &body, Some(id), &mut ignore)?;
        if let Some(e) = status_error(&self.name, reply.status) {
            return Err(e);
        }
        let result = match reply.answer {
            Some(Ok(r)) => r,
            Some(Err(f)) => {
                return Err(UpstreamError::new(
                    UpstreamErrorCode::UpstreamError,
                    format!(
                        "server {}: initialize failed: {} {}",
                        self.name,
                        f.code,
                        quote_upstream(&f.message, 300)
                    ),
                ));
            }
            None => {
                return Err(UpstreamError::new(
                    UpstreamErrorCode::BadResponse,
                    format!("server {}: initialize got no answer", self.name),
                ));
            }
        };
        let (version, changes) = judge_initialize(&result).map_err(|e| {
            UpstreamError::new(e.code, format!("server {}: {}", self.name, e.message))
        })?;
        let era = Era::Legacy {
            version,
            session_id: reply.session_id,
        };
        let headers = protocol_headers(Some(&era), "notifications/initialized", None);
        let body = notification_body("notifications/initialized", None);
        let reply = transport.post(&headers, &body, None, &mut ignore)?;
        if let Some(e) = status_error(&self.name, reply.status) {
            return Err(e);
        }
        Ok((era, changes))
    }

    /// The session of generation `seen` is gone (404): renew it, unless another thread
    /// already did.
    fn renew(&self, seen: u64) -> Result<(), UpstreamError> {
        let _one_at_a_time = self.renewing.lock().unwrap_or_else(|p| p.into_inner());
        if self.lock().generation != seen {
            return Ok(());
        }
        crate::info!(
            "server {}: the session expired (404); initializing again",
            self.name
        );
        match self.connect(true) {
            Ok((era, changes)) => {
                let mut st = self.lock();
                st.generation += 1;
                st.era = Some(era);
                st.changes = changes;
                st.phase = Phase::Up;
                st.last_error = None;
                self.emit_state(&st);
                drop(st);
                self.changed.notify_all();
                Ok(())
            }
            Err(e) => {
                self.mark_down(&e);
                self.suspect();
                Err(e)
            }
        }
    }

    // ---- requests ---------------------------------------------------------------------

    fn params_text(
        era: &Era,
        params: &Params,
        ctx: Option<&CallContext>,
    ) -> Result<(Option<String>, Option<Value>), UpstreamError> {
        let with_call = |p: Option<Value>| -> Option<Value> {
            let Some(ctx) = ctx else { return p };
            let mut map = match p {
                Some(Value::Object(m)) => m,
                _ => Map::new(),
            };
            ctx.apply_meta(era, &mut map);
            (!map.is_empty()).then_some(Value::Object(map))
        };
        Ok(match params {
            Params::None => {
                let p = with_call(params_for(Some(era), None));
                (p.as_ref().map(Value::to_string), None)
            }
            Params::Value(v) => {
                let p = with_call(params_for(Some(era), Some(v.clone())));
                (p.as_ref().map(Value::to_string), p)
            }
            Params::ToolCall {
                name,
                arguments,
                extra,
            } => {
                let meta = params_for(Some(era), Some(json!({})))
                    .and_then(|p| p.get("_meta").cloned())
                    .filter(|_| era.is_modern());
                let meta = match (meta, ctx) {
                    (meta, Some(ctx)) => {
                        let mut holder = Map::new();
                        if let Some(m) = meta {
                            holder.insert("_meta".into(), m);
                        }
                        ctx.apply_meta(era, &mut holder);
                        holder.remove("_meta")
                    }
                    (meta, None) => meta,
                };
                let text = serde_json::to_string(&ToolCallParams {
                    name,
                    arguments,
                    meta,
                    extra,
                })
                .map_err(|e| UpstreamError::new(UpstreamErrorCode::Internal, e.to_string()))?;
                (Some(text), Some(json!({"name": name})))
            }
        })
    }

    /// Send one request and return its result as JSON text.
    fn request(
        &self,
        method: &str,
        params: Params,
        notices: &mut Notices,
    ) -> Result<String, UpstreamError> {
        self.request_in(method, params, notices, None)
    }

    /// Send one request of an agent's call (`ctx`), or of the gateway's own (`None`).
    /// Within a call, notifications and the server's requests are relayed (see
    /// `call_relay.rs`), an `input_required` result is answered and the request retried,
    /// and a cancelled call closes its connection (a legacy upstream is also sent
    /// `notifications/cancelled`).
    fn request_in(
        &self,
        method: &str,
        mut params: Params,
        notices: &mut Notices,
        mut ctx: Option<&mut CallContext>,
    ) -> Result<String, UpstreamError> {
        let transport = self.transport()?;
        let mut attempt = 0;
        let mut rounds = 0;
        loop {
            if attempt >= 2 {
                return Err(UpstreamError::new(
                    UpstreamErrorCode::Internal,
                    "no attempt left",
                ));
            }
            if ctx.as_ref().is_some_and(|c| c.link.is_cancelled()) {
                return Err(cancelled_error(&self.name));
            }
            let (era, generation) = self.session()?;
            let (text, for_headers) = Self::params_text(&era, &params, ctx.as_deref())?;
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let mut headers = protocol_headers(Some(&era), method, for_headers.as_ref());
            // SEP-2243: the parameters the tool binds travel as headers too (modern era).
            let param_headers: Vec<(String, String)> = match (&era, ctx.as_deref()) {
                (Era::Modern { .. }, Some(c)) if method == "tools/call" => c
                    .meta
                    .param_headers
                    .iter()
                    .map(|(name, text)| (format!("Mcp-Param-{name}"), era::header_value(text)))
                    .collect(),
                _ => Vec::new(),
            };
            let headers: Vec<(&str, String)> = headers
                .drain(..)
                .chain(param_headers.iter().map(|(n, v)| (n.as_str(), v.clone())))
                .collect();
            let body = request_body(id, method, text.as_deref());
            if let Some(c) = ctx.as_deref() {
                c.link.set_upstream_id(Some(id.to_string()));
            }
            let for_call = ctx.is_some();
            // A cancellation wakes a request waiting on a local server's pipe (an HTTP
            // request is woken by its socket's shutdown).
            let _abandon = match (ctx.as_deref(), transport.lines()) {
                (Some(c), Some(lines)) => {
                    let lines = Arc::clone(lines);
                    let hook: Arc<CancelHook> = Arc::new(move || lines.abandon(id));
                    c.link.on_cancel(&hook);
                    Some(hook)
                }
                _ => None,
            };
            // A legacy server's requests met in the answer's stream wait for the agent on
            // threads of this scope, so the stream is read on: a final answer that comes
            // first (the server gave up waiting) ends the call at once, and the requests
            // still waiting are over (their threads end with the scope).
            let posted = std::thread::scope(|scope| {
                let posted = {
                    let mut waiting = 0;
                    let mut on_notice = |n: Notice| {
                        let relay = Relaying {
                            ctx: ctx.as_deref_mut(),
                            scope,
                            waiting: &mut waiting,
                        };
                        self.on_notice(&era, n, notices, relay)
                    };
                    if for_call {
                        transport.post_for_call(&headers, &body, Some(id), &mut on_notice)
                    } else {
                        transport.post(&headers, &body, Some(id), &mut on_notice)
                    }
                };
                if let Some(c) = ctx.as_deref() {
                    c.link.end_waits();
                }
                posted
            });
            if let Some(c) = ctx.as_deref()
                && c.link.is_cancelled()
            {
                self.tell_cancelled(&era, c);
                return Err(cancelled_error(&self.name));
            }
            let reply = match posted {
                Ok(r) => r,
                Err(e) => {
                    if e.code.means_unreachable() {
                        self.suspect();
                    }
                    return Err(e);
                }
            };
            match after_status(&era, reply.status, method, attempt) {
                AfterStatus::Proceed => {
                    let result = self.outcome(method, reply)?;
                    let asked = match call_relay::input_required(&result) {
                        None => return Ok(result),
                        Some(asked) => asked,
                    };
                    let Some(c) = ctx.as_deref_mut() else {
                        return Err(UpstreamError::new(
                            UpstreamErrorCode::UpstreamError,
                            format!(
                                "server {} asked for more input (a multi-round request) outside an agent's call",
                                self.name
                            ),
                        ));
                    };
                    rounds += 1;
                    let extra = asked
                        .map_err(|why| {
                            UpstreamError::new(
                                UpstreamErrorCode::BadResponse,
                                format!(
                                    "server {} asked for more input that cannot be relayed: {why}",
                                    self.name
                                ),
                            )
                        })
                        .and_then(|asked| {
                            if rounds > call_relay::MAX_INPUT_ROUNDS {
                                return Err(UpstreamError::new(
                                    UpstreamErrorCode::UpstreamError,
                                    format!(
                                        "server {} asked for more input {} times; the call ends",
                                        self.name,
                                        call_relay::MAX_INPUT_ROUNDS
                                    ),
                                ));
                            }
                            let wanted = asked
                                .requests
                                .iter()
                                .map(|(k, m, p)| (Some(k.clone()), m.clone(), p.clone()))
                                .collect();
                            let answers = c
                                .ask_keyed(wanted)
                                .wait(&c.link, None)
                                .map_err(|_| cancelled_error(&self.name))?;
                            call_relay::retry_params(&asked, &answers).map_err(|why| {
                                UpstreamError::new(
                                    UpstreamErrorCode::UpstreamError,
                                    format!("server {}: {why}", self.name),
                                )
                            })
                        })?;
                    params.extend(extra);
                    // A retry is a new request, not a second attempt after a 404.
                    attempt = 0;
                }
                AfterStatus::RenewAndRetry => {
                    self.renew(generation)?;
                    attempt += 1;
                }
                AfterStatus::RenewAndFail => {
                    let renewed = self.renew(generation);
                    let what = if method == "tools/call" {
                        "the call was not repeated (tool calls never are)"
                    } else {
                        "the request failed again after one renewal"
                    };
                    let state = match renewed {
                        Ok(()) => "a new session is open",
                        Err(_) => "a new session could not be opened",
                    };
                    return Err(UpstreamError::new(
                        UpstreamErrorCode::SessionExpired,
                        format!(
                            "server {} forgot the session (404); {state}, and {what}",
                            self.name
                        ),
                    )
                    .with_status(404));
                }
            }
        }
    }

    /// A legacy upstream, and any local server, is told that the call's request is
    /// cancelled (a modern HTTP one was told by closing the connection; a pipe has no
    /// connection per request to close).
    fn tell_cancelled(&self, era: &Era, ctx: &CallContext) {
        let lines = self.transport.as_ref().is_some_and(Channel::always_listens);
        if era.is_modern() && !lines {
            return;
        }
        let (Ok(transport), Some(id)) = (self.transport(), ctx.link.upstream_id()) else {
            return;
        };
        let params = json!({"requestId": serde_json::from_str::<Value>(&id).unwrap_or(Value::Null),
                            "reason": "the client cancelled the call"})
        .to_string();
        let headers = protocol_headers(Some(era), "notifications/cancelled", None);
        let body = notification_body("notifications/cancelled", Some(&params));
        if let Err(e) = transport.post(&headers, &body, None, &mut |_| {}) {
            crate::debug!(
                "server {}: telling it of a cancellation failed: {e}",
                self.name
            );
        }
    }

    fn outcome(&self, method: &str, reply: Reply) -> Result<String, UpstreamError> {
        // A JSON-RPC error says more than the status that carried it.
        match (reply.answer, status_error(&self.name, reply.status)) {
            (Some(Err(f)), status) => {
                let code = if matches!(reply.status, 401 | 403) {
                    status
                        .map(|s| s.code)
                        .unwrap_or(UpstreamErrorCode::UpstreamError)
                } else {
                    UpstreamErrorCode::UpstreamError
                };
                Err(UpstreamError::new(
                    code,
                    format!(
                        "server {} refused {method}: {} (JSON-RPC {})",
                        self.name,
                        quote_upstream(&f.message, 500),
                        f.code
                    ),
                )
                .with_status(reply.status)
                .with_rpc_code(f.code))
                .map_err(|mut e: UpstreamError| {
                    if f.code == super::missing_capability::CODE {
                        e.missing_capability =
                            super::missing_capability::report(f.data.as_ref(), &e.message);
                    }
                    e
                })
            }
            (_, Some(e)) => Err(e.with_status(reply.status)),
            (Some(Ok(result)), None) => Ok(result),
            (None, None) => Err(UpstreamError::new(
                UpstreamErrorCode::BadResponse,
                format!("server {}: no answer to {method}", self.name),
            )),
        }
    }

    fn on_notice<'s, 'e: 's>(
        &'e self,
        era: &Era,
        notice: Notice,
        notices: &mut Notices,
        relay: Relaying<'_, 's, 'e>,
    ) {
        let Relaying {
            ctx,
            scope,
            waiting,
        } = relay;
        match notice {
            Notice::Notification { method, mut params } => {
                if let Some(p) = params.as_mut() {
                    self.scrub.value(p);
                }
                notices.count(&method);
                if let Some(kind) = list_changed_kind(&method).and_then(Kind::parse) {
                    self.emit_list_changed(&[kind]);
                } else if let Some(ctx) = ctx
                    && !ctx.notification(&method, params)
                    && call_relay::relayed_notification(&method)
                {
                    notices.count("dropped (relay.notifications_per_sec)");
                }
            }
            Notice::Dropped { count, .. } => {
                *notices
                    .counts
                    .entry("dropped (too large or queue full)".to_owned())
                    .or_insert(0) += count;
                if let Some(ctx) = ctx {
                    ctx.dropped = ctx.dropped.saturating_add(count);
                }
            }
            Notice::ServerRequest {
                id,
                method,
                mut params,
            } => {
                if let Some(p) = params.as_mut() {
                    self.scrub.value(p);
                }
                notices.count(&format!("request {method}"));
                match ctx {
                    Some(ctx) if call_relay::relayed_request(&method) => {
                        if *waiting >= ctx.max_waiting() {
                            let answer = RequestAnswer::error(
                                0,
                                crate::mcp::jsonrpc::INTERNAL_ERROR,
                                "too many requests wait for the client in this call",
                                None,
                            );
                            self.answer_relayed(era, &id, &method, answer);
                            return;
                        }
                        *waiting += 1;
                        self.relay_server_request(era, id, &method, params, ctx, scope)
                    }
                    _ => self.answer_server_request(era, &id, &method),
                }
            }
        }
    }

    /// A legacy upstream asked the agent something during its call: the gateway relays it
    /// (or refuses it), and the answer goes back as a JSON-RPC response, from a thread of
    /// `scope` that waits for it while the call's stream is read on.
    fn relay_server_request<'s, 'e: 's>(
        &'e self,
        era: &Era,
        id: Box<RawValue>,
        method: &str,
        params: Option<Value>,
        ctx: &mut CallContext,
        scope: &'s std::thread::Scope<'s, 'e>,
    ) {
        let asked = ctx.ask(vec![(method.to_owned(), params)]);
        let link = Arc::clone(&ctx.link);
        let epoch = link.waits_epoch();
        let (era, method) = (era.clone(), method.to_owned());
        let spawned = std::thread::Builder::new()
            .name("up-ask".into())
            .spawn_scoped(scope, {
                let (era, id, method) = (era.clone(), id.clone(), method.clone());
                move || {
                    let answer = match asked.wait(&link, Some(epoch)) {
                        Ok(mut answers) => answers.pop(),
                        // The call is cancelled (its connection closes), or the server
                        // answered it without this: nothing to answer.
                        Err(NoAnswer::Cancelled | NoAnswer::Over) => return,
                        Err(NoAnswer::TimedOut) => None,
                    };
                    let answer = answer.unwrap_or_else(|| {
                        RequestAnswer::error(
                            0,
                            crate::mcp::jsonrpc::INTERNAL_ERROR,
                            "no answer",
                            None,
                        )
                    });
                    self.answer_relayed(&era, &id, &method, answer);
                }
            });
        if let Err(e) = spawned {
            crate::debug!(
                "server {}: no thread to wait for the client: {e}",
                self.name
            );
            let answer = RequestAnswer::error(
                0,
                crate::mcp::jsonrpc::INTERNAL_ERROR,
                "toolwall could not wait for the client's answer",
                None,
            );
            self.answer_relayed(&era, &id, &method, answer);
        }
    }

    /// Send a legacy upstream the answer to its request `id`.
    fn answer_relayed(&self, era: &Era, id: &RawValue, method: &str, answer: RequestAnswer) {
        let Ok(transport) = self.transport() else {
            return;
        };
        let headers = protocol_headers(Some(era), "", None);
        let body = answer_body(id, &answer);
        if let Err(e) = transport.post(&headers, &body, None, &mut |_| {}) {
            crate::debug!(
                "server {}: answering its {method} request failed: {e}",
                self.name
            );
        }
    }

    /// The server asked us something (legacy era): `ping` is answered, anything else
    /// (sampling, elicitation, roots) is refused, so the server does not wait forever.
    fn answer_server_request(&self, era: &Era, id: &RawValue, method: &str) {
        let Ok(transport) = self.transport() else {
            return;
        };
        let body = if method == "ping" {
            format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":{},\"result\":{{}}}}",
                id.get()
            )
            .into_bytes()
        } else {
            refusal_body(id, "toolwall does not serve requests from upstream servers")
        };
        let headers = protocol_headers(Some(era), "", None);
        if let Err(e) = transport.post(&headers, &body, None, &mut |_| {}) {
            crate::debug!(
                "server {}: answering its {method} request failed: {e}",
                self.name
            );
        }
    }

    /// Every item of one list, following cursors, as a JSON array, within `budget`; the
    /// facts say how many pages, bytes and dropped items, and how many `list_changed` were
    /// folded since the last report.
    pub fn list(
        &self,
        kind: Kind,
        budget: ListingBudget,
    ) -> Result<(String, Value), UpstreamError> {
        // From here on, a change is a change after this listing began: announce it again.
        self.changes_pending
            .fetch_and(!kind_bit(kind), Ordering::AcqRel);
        let mut notices = Notices::default();
        let mut pages = PageCollector::new(&self.name, kind, budget);
        let mut cursor: Option<String> = None;
        loop {
            pages.may_fetch()?;
            let cursor_was_none = cursor.is_none();
            let params = match cursor.take() {
                Some(c) => Params::Value(json!({ "cursor": c })),
                None => Params::None,
            };
            let result = match self.request(list_method(kind), params, &mut notices) {
                Ok(r) => r,
                // A server that does not serve a list (method not found) lists nothing.
                Err(e) if e.rpc_code == Some(-32601) && cursor_was_none => {
                    format!("{{\"{}\":[]}}", kind.list_key())
                }
                Err(e) => return Err(e),
            };
            match pages.page(&result)? {
                Some(next) => cursor = Some(next),
                None => {
                    let (text, mut facts) = pages.finish();
                    facts["coalesced"] = json!(self.coalesced.swap(0, Ordering::Relaxed));
                    facts["notifications"] = json!(notices.counts);
                    return Ok((text, facts));
                }
            }
        }
    }

    /// `tools/call`; the notices met on the way come back for the call's facts. `ctx`
    /// is the agent's call (relayed notifications and requests, cancellation).
    pub fn call_tool(
        &self,
        tool: &str,
        arguments: &str,
        ctx: Option<&mut CallContext>,
    ) -> (Result<String, UpstreamError>, Notices) {
        let mut notices = Notices::default();
        let arguments: Box<RawValue> = match serde_json::from_str(arguments) {
            Ok(a) => a,
            Err(e) => {
                return (
                    Err(UpstreamError::new(
                        UpstreamErrorCode::InvalidArguments,
                        format!("arguments are not JSON: {e}"),
                    )),
                    notices,
                );
            }
        };
        let params = Params::ToolCall {
            name: tool.to_owned(),
            arguments,
            extra: Map::new(),
        };
        let r = self.request_in("tools/call", params, &mut notices, ctx);
        (r, notices)
    }

    /// `resources/read` or `prompts/get` with the params the gateway forwarded.
    pub fn forward(
        &self,
        method: &str,
        params: Value,
        ctx: Option<&mut CallContext>,
    ) -> Result<String, UpstreamError> {
        if let Some(answer) = self.modern_subscription(method, &params) {
            return answer;
        }
        let mut notices = Notices::default();
        self.request_in(method, Params::Value(params), &mut notices, ctx)
    }

    /// `resources/subscribe` or `unsubscribe` to a modern server over HTTP: the URI joins
    /// or leaves the set its listening stream carries (see `resource_subscriptions.rs`);
    /// None for any other request, era or channel (forwarded as it is).
    fn modern_subscription(
        &self,
        method: &str,
        params: &Value,
    ) -> Option<Result<String, UpstreamError>> {
        if !resource_subscriptions::converted(method)
            || self.transport.as_ref().is_none_or(Channel::always_listens)
        {
            return None;
        }
        let changed = {
            let mut st = self.lock();
            if !matches!(st.era, Some(Era::Modern { .. })) {
                return None;
            }
            match resource_subscriptions::apply(
                &mut st.subscriptions,
                self.limits.max_server_subscriptions.max(1),
                &self.name,
                method,
                params,
            ) {
                Ok(changed) => {
                    st.subscriptions_changed |= changed;
                    changed
                }
                Err(e) => return Some(Err(e)),
            }
        };
        if changed {
            // A watcher waiting without a stream opens one now.
            self.changed.notify_all();
        }
        Some(Ok("{}".to_owned()))
    }

    // ---- the watcher ------------------------------------------------------------------

    fn watch(self: Arc<Self>) {
        if let Some(why) = &self.unusable {
            self.mark_down(&UpstreamError::new(
                UpstreamErrorCode::ServerDown,
                why.clone(),
            ));
            return;
        }
        let max = Duration::from_secs(self.limits.retry_max_secs).max(MIN_RETRY);
        let mut backoff = MIN_RETRY;
        loop {
            match self.connect(false) {
                Ok((era, changes)) => {
                    crate::info!("server {}: up, {}", self.name, era.describe());
                    self.mark_up(era, changes);
                    let up_at = Instant::now();
                    let lines = self.transport.as_ref().is_some_and(Channel::always_listens);
                    if !lines {
                        backoff = MIN_RETRY;
                    }
                    self.stay_connected();
                    if lines {
                        // Its program stopped (crashed, broke the protocol): it starts
                        // again, with backoff unless it had run for a while.
                        if up_at.elapsed() >= STABLE_UP {
                            backoff = MIN_RETRY;
                        }
                        std::thread::sleep(backoff);
                        backoff = (backoff * 2).min(max);
                    }
                }
                Err(e) => {
                    if self.lock().phase != Phase::Down {
                        crate::warn!("server {}: down: {e}; retrying with backoff", self.name);
                    }
                    if let Some(t) = &self.transport {
                        t.reset(&e);
                    }
                    self.mark_down(&e);
                    self.sleep_unless_checked(backoff);
                    backoff = (backoff * 2).min(max);
                }
            }
        }
    }

    /// While the server is up: keep a listening stream open if it announces changes, else
    /// wait until a request finds it unreachable. Returns when it should be reconnected.
    fn stay_connected(&self) {
        let mut stream_works = true;
        let mut pause = MIN_RETRY;
        loop {
            let (era, generation, changes, watching) = {
                let st = self.lock();
                match (&st.era, st.phase) {
                    (Some(era), Phase::Up) => (
                        era.clone(),
                        st.generation,
                        st.changes,
                        !st.subscriptions.is_empty(),
                    ),
                    _ => return,
                }
            };
            let listens = self.transport.as_ref().is_some_and(Channel::always_listens);
            // A modern server's updates come only for URIs named in the stream: it is
            // opened for them when some are watched.
            let wanted = match era {
                Era::Modern { .. } => {
                    changes.tools || changes.resources || changes.prompts || watching
                }
                Era::Legacy { .. } => changes.any(),
            };
            if !((wanted || listens) && stream_works) {
                if self.wait_for_check_or_watch(Duration::from_secs(3600)) {
                    return;
                }
                continue;
            }
            // A modern server that takes subscriptions: the stream is opened again with the
            // set of the moment after a short quiet (a change applies within it).
            let rechecks = matches!(era, Era::Modern { .. }) && (changes.subscribe || watching);
            match self.listen(&era, changes, rechecks) {
                Ok(()) => {
                    pause = MIN_RETRY;
                    std::thread::sleep(MIN_RETRY);
                }
                Err(e) if rechecks && e.code == UpstreamErrorCode::Timeout => {
                    pause = MIN_RETRY;
                }
                Err(e)
                    if e.status == Some(404)
                        && matches!(
                            era,
                            Era::Legacy {
                                session_id: Some(_),
                                ..
                            }
                        ) =>
                {
                    if self.renew(generation).is_err() {
                        return;
                    }
                }
                Err(e) if e.status.is_some_and(|s| matches!(s, 400 | 404 | 405 | 406)) => {
                    crate::debug!(
                        "server {}: no listening stream ({e}); lists are refreshed by servers.refresh_secs",
                        self.name
                    );
                    stream_works = false;
                }
                Err(e) if self.transport.as_ref().is_some_and(Channel::always_listens) => {
                    crate::warn!("server {}: {e}; starting it again", self.name);
                    self.mark_down(&e);
                    return;
                }
                Err(e) if e.code.means_unreachable() && e.code != UpstreamErrorCode::Timeout => {
                    crate::warn!("server {}: the listening stream broke: {e}", self.name);
                    return;
                }
                Err(e) => {
                    crate::debug!("server {}: listening stream: {e}", self.name);
                    if self.wait_for_check(pause) {
                        return;
                    }
                    pause = (pause * 2).min(Duration::from_secs(self.limits.retry_max_secs.max(1)));
                }
            }
        }
    }

    fn listen(&self, era: &Era, changes: ListChanges, rechecks: bool) -> Result<(), UpstreamError> {
        let transport = self.transport()?;
        // Progress and log messages on the listening stream belong to no call here; the
        // gateway finds a call by progress token, or logs them. Bounded per stream.
        let mut bucket = TokenBucket::new(LISTEN_NOTIFICATIONS.0, LISTEN_NOTIFICATIONS.1);
        // What was dropped here or before (the channel's queue, the size bounds), told to
        // the gateway in sums, so the call a progress token names counts them.
        let mut drops = DropTally::default();
        let mut on_notice = |n: Notice| match n {
            Notice::Dropped {
                progress_token,
                count,
            } => {
                drops.add(progress_token, count);
                drops.flush(&self.name, &self.events);
            }
            Notice::Notification { method, params } => {
                if let Some(kind) = list_changed_kind(&method).and_then(Kind::parse) {
                    if self.emit_list_changed(&[kind]) {
                        crate::debug!("server {}: its {} changed", self.name, kind.word());
                    }
                } else if call_relay::relayed_notification(&method) && !bucket.take(Instant::now())
                {
                    let token = params
                        .as_ref()
                        .and_then(|p| p.get("progressToken"))
                        .and_then(Value::as_str)
                        .map(|t| t.chars().take(64).collect());
                    drops.add(token, 1);
                    drops.flush_due(&self.name, &self.events);
                } else if call_relay::relayed_notification(&method) {
                    let mut params = params;
                    if let Some(p) = params.as_mut() {
                        self.scrub.value(p);
                    }
                    let note = CallNotification {
                        call: None,
                        server: self.name.clone(),
                        method,
                        params,
                    };
                    if let Ok(detail) = serde_json::to_value(&note) {
                        (self.events)(CALL_NOTIFICATION, detail);
                    }
                }
            }
            Notice::ServerRequest { id, method, .. } => {
                self.answer_server_request(era, &id, &method)
            }
        };
        match era {
            Era::Legacy { .. } => {
                let headers = protocol_headers(Some(era), "", None);
                transport.listen(&headers, None, LISTEN_IDLE, &mut on_notice)
            }
            Era::Modern { .. } => {
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                let mut wanted = json!({
                    "toolsListChanged": changes.tools,
                    "resourcesListChanged": changes.resources,
                    "promptsListChanged": changes.prompts,
                });
                let watched: Vec<String> = {
                    let mut st = self.lock();
                    st.subscriptions_changed = false;
                    st.subscriptions.iter().cloned().collect()
                };
                if !watched.is_empty() {
                    wanted["resourceSubscriptions"] = json!(watched);
                }
                let params = params_for(Some(era), Some(json!({ "notifications": wanted })));
                let text = params.as_ref().map(Value::to_string);
                let headers = protocol_headers(Some(era), "subscriptions/listen", params.as_ref());
                let body = request_body(id, "subscriptions/listen", text.as_deref());
                let idle = if rechecks {
                    Duration::from_secs(self.limits.subscription_recheck_secs.max(1))
                } else {
                    LISTEN_IDLE
                };
                transport.listen(&headers, Some(&body), idle, &mut on_notice)
            }
        }
    }

    /// Like [`Upstream::wait_for_check`], and also returns (false) when the watched
    /// resource URIs changed.
    fn wait_for_check_or_watch(&self, d: Duration) -> bool {
        self.wait_for(d, true)
    }

    /// Sleep `d`, or less when a request asked for a check. True when one did.
    fn wait_for_check(&self, d: Duration) -> bool {
        self.wait_for(d, false)
    }

    /// Sleep `d`, or less when a check is asked for (or, with `watch`, the watched set
    /// changed). True when a check was asked for (it is taken).
    fn wait_for(&self, d: Duration, watch: bool) -> bool {
        let deadline = Instant::now() + d;
        let mut st = self.lock();
        while !(st.check || (watch && st.subscriptions_changed)) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = self
                .changed
                .wait_timeout(st, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        std::mem::take(&mut st.check)
    }

    fn sleep_unless_checked(&self, d: Duration) {
        let _ = self.wait_for_check(d);
    }

    /// The state for tests and status: (state, era).
    pub fn describe(&self) -> (String, Option<String>) {
        let st = self.lock();
        (
            st.phase.as_str().to_owned(),
            st.era.as_ref().map(Era::describe),
        )
    }
}

fn cancelled_error(server: &str) -> UpstreamError {
    UpstreamError::new(
        UpstreamErrorCode::Internal,
        format!("server {server}: the call was cancelled"),
    )
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_are_counted_with_bounded_keys() {
        let mut n = Notices::default();
        n.count("notifications/progress");
        n.count("notifications/progress");
        n.count(&"x".repeat(100));
        assert_eq!(n.counts["notifications/progress"], 2);
        assert_eq!(n.counts["other"], 1);
    }
}
