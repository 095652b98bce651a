//! The Streamable HTTP door inside the loop: one [`HttpConn`] per TCP connection, parsed
//! by the sans-IO [`RequestReader`], judged by the sans-IO [`Endpoint`], with TLS driven by
//! hand. One request per connection is with the core at a time, so pipelined answers go
//! out in order; the next request is parsed when the answer is written.
//!
//! A head is judged before its body is read: a refused one (bad token, wrong route, a
//! principal over its share) never gets `100 Continue` and never has its body buffered, so
//! an unauthenticated connection holds at most one head (`http.max_head_bytes`). Legacy
//! calls are indexed by session and request id, so `notifications/cancelled` from any
//! connection of the session finds the one holding the call; a modern-era call is cancelled
//! when its connection closes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::ServerConfig;

use crate::config::Config;
use crate::gateway::core::{ConnFacts, ConnRef, Core, Expect, Peer};
use crate::gateway::door_limits::Stage;
use crate::policy::Transport;
use crate::tokens::TokenStore;
use crate::transport::http::endpoint::{self, HealthReport};
use crate::transport::http::response::CONTINUE_100;
use crate::transport::http::sse_writer;
use crate::transport::http::{
    Call, Decision, DoorSettings, Endpoint, Era, HeadDecision, HttpResponse, Progress, Request,
    RequestLimits, RequestReader, TlsSession, load_server_config,
};

/// Read-buffer capacity a connection may keep once a request is consumed: one read. A
/// large body's memory goes back as soon as it is handed over.
const KEEP_READ_BUFFER: usize = 16 * 1024;

/// How often idle sessions are swept.
const SESSION_SWEEP: Duration = Duration::from_secs(60);

pub struct HttpDoor {
    endpoint: Endpoint,
    tokens: TokenStore,
    tls: Option<Arc<ServerConfig>>,
    limits: RequestLimits,
    max_plain: usize,
    next_session_sweep: Instant,
    /// Responses written, by status (for `/metrics`); bounded by the statuses that exist.
    responses: std::collections::BTreeMap<u16, u64>,
    /// Legacy calls with the core, by (session, raw request id): where a cancel for them
    /// goes. At most one entry per connection (each holds one call at a time).
    waiting: HashMap<(String, String), ConnRef>,
    /// Server requests relayed into a legacy call's event stream, by (session, the
    /// gateway's raw request id): where the client's answer goes (it may POST it on any
    /// connection of the session). Bounded by `relay.max_requests_per_call` per call.
    relayed: HashMap<(String, String), ConnRef>,
    /// `Retry-After` of a 503 for a full door or principal.
    retry_after_secs: u64,
}

/// One HTTP connection's state.
pub struct HttpConn {
    reader: RequestReader,
    /// Plaintext of a cleartext connection (a TLS one keeps it in `tls`).
    plain: Vec<u8>,
    tls: Option<TlsSession>,
    /// Ciphertext read but not yet taken by TLS (it holds back while plaintext waits).
    cipher_in: Vec<u8>,
    /// The request with the core, awaiting its answer.
    pending: Option<Call>,
    /// The answer to `pending` has started as an event stream (messages were relayed).
    streaming: bool,
    /// Raw ids of the server requests relayed in this connection's stream.
    relayed_ids: Vec<String>,
    /// Stream id for the core's replies: one per request.
    seq: u32,
    /// When the request now arriving started (slow-client timer).
    pub request_started: Option<Instant>,
    /// When the body of the accepted head started to be awaited.
    body_started: Option<Instant>,
    /// When the connection last finished a request that did authenticated work (an answer
    /// from the core, or a response to an authenticated head), else when it opened: the
    /// keep-alive timer. `/health`, `/metrics` and refusals never push it on, so a client
    /// that only sends those cannot keep its seat.
    pub idle_since: Instant,
    /// The request being answered came with a head that authenticated a principal.
    answering_authenticated: bool,
    /// Close once the output is written.
    pub closing: bool,
    /// Whether any byte arrived.
    seen_bytes: bool,
    /// The principal this connection's seat counts for, once a head named one.
    principal: Option<String>,
    /// A head authenticated a principal that is not yet this connection's: the loop finds
    /// it a seat, then calls [`HttpDoor::seated`].
    binding: Option<String>,
    /// Admitted only to answer it: the door was full (this names the key). `/health` is
    /// still answered; every other request gets 503 with `Retry-After`.
    refusing: Option<&'static str>,
}

/// What the loop does after [`HttpDoor::process`].
pub enum Step {
    /// Read more bytes.
    NeedBytes,
    /// A request is with the core; its answer comes through [`HttpDoor::answer`].
    Waiting,
    /// Write the health report.
    Health { keep_alive: bool },
    /// Write the metrics page.
    Metrics { keep_alive: bool },
    /// A head authenticated `principal`, not yet this connection's: find the connection a
    /// seat for it, then call [`HttpDoor::seated`].
    Seat { principal: String },
    /// A legacy `notifications/cancelled` for a call that `target` (another connection of
    /// the same session) holds: hand `payload` to the core as if `target` had sent it.
    CancelElsewhere {
        target: ConnRef,
        principal: String,
        payload: Vec<u8>,
    },
}

impl HttpDoor {
    /// The door the config asks for, or None. Errors name what is wrong.
    pub fn open(config: &Config) -> Result<Option<HttpDoor>, String> {
        let Some(listen) = config.listen.http else {
            return Ok(None);
        };
        let tls = match (&config.listen.tls_cert, &config.listen.tls_key) {
            (Some(cert), Some(key)) => Some(load_server_config(cert, key).map_err(|e| e.0)?),
            _ => None,
        };
        let endpoint = Endpoint::new(settings(config, listen, tls.is_some()))?;
        for note in endpoint.startup_notes() {
            crate::warn!("http: {note}");
        }
        let tokens = TokenStore::open(&config.ledger.path).map_err(|e| e.to_string())?;
        let limits = RequestLimits::from(&config.http);
        Ok(Some(HttpDoor {
            endpoint,
            tokens,
            tls,
            limits,
            max_plain: config.http.max_head_bytes + config.http.max_body_bytes,
            next_session_sweep: Instant::now() + SESSION_SWEEP,
            responses: std::collections::BTreeMap::new(),
            waiting: HashMap::new(),
            relayed: HashMap::new(),
            retry_after_secs: config.http.retry_after_secs,
        }))
    }

    /// Apply a reloaded config: settings and TLS certificate. On error nothing changes.
    pub fn reload(&mut self, config: &Config) -> Result<(), String> {
        let Some(listen) = config.listen.http else {
            return Ok(());
        };
        let tls = match (&config.listen.tls_cert, &config.listen.tls_key) {
            (Some(cert), Some(key)) => Some(load_server_config(cert, key).map_err(|e| e.0)?),
            _ => None,
        };
        if tls.is_some() != self.tls.is_some() {
            return Err(
                "turning TLS on or off needs a restart (the listener stays as it is)".into(),
            );
        }
        self.endpoint
            .reconfigure(settings(config, listen, tls.is_some()))?;
        self.tls = tls;
        self.limits = RequestLimits::from(&config.http);
        self.retry_after_secs = config.http.retry_after_secs;
        Ok(())
    }

    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    pub fn new_conn(&self) -> Result<HttpConn, String> {
        let tls = match &self.tls {
            Some(cfg) => Some(TlsSession::new(Arc::clone(cfg), self.max_plain).map_err(|e| e.0)?),
            None => None,
        };
        Ok(HttpConn {
            reader: RequestReader::new(self.limits),
            plain: Vec::new(),
            tls,
            cipher_in: Vec::new(),
            pending: None,
            streaming: false,
            relayed_ids: Vec::new(),
            seq: 0,
            request_started: None,
            body_started: None,
            idle_since: Instant::now(),
            closing: false,
            seen_bytes: false,
            answering_authenticated: false,
            principal: None,
            binding: None,
            refusing: None,
        })
    }

    /// A connection admitted only to be answered: the door is full (`key`). It is told so
    /// with 503 and `Retry-After` (its body never read), unless it asks for `/health`.
    pub fn refusing_conn(&self, key: &'static str) -> Result<HttpConn, String> {
        let mut h = self.new_conn()?;
        h.refusing = Some(key);
        Ok(h)
    }

    /// Bytes from the socket. TLS handshake output goes to `out`.
    pub fn on_bytes(
        &mut self,
        h: &mut HttpConn,
        bytes: &[u8],
        out: &mut Vec<u8>,
        now: Instant,
    ) -> Result<(), String> {
        if bytes.is_empty() {
            return Ok(());
        }
        h.seen_bytes = true;
        if h.request_started.is_none() {
            h.request_started = Some(now);
        }
        match &mut h.tls {
            None => h.plain.extend_from_slice(bytes),
            Some(tls) => {
                h.cipher_in.extend_from_slice(bytes);
                let taken = tls.feed(&h.cipher_in).map_err(|e| {
                    tls.pending_tls_out(out);
                    e.0
                })?;
                h.cipher_in.drain(..taken);
                tls.pending_tls_out(out);
            }
        }
        Ok(())
    }

    /// How many bytes the connection may read now. Until a head is judged, no more than
    /// one head (so an unauthenticated client holds at most `max_head_bytes`); while an
    /// accepted head's body arrives, that body and one pipelined head; TLS holds back while
    /// ciphertext waits for plaintext to be consumed.
    pub fn read_room(&self, h: &HttpConn) -> usize {
        if !h.cipher_in.is_empty() {
            return 0;
        }
        let head = self.limits.max_head_bytes + 1;
        let cap = match h.reader.current() {
            Some(request) if h.reader.in_body() => request.consumed + head,
            _ => head,
        };
        cap.saturating_sub(buffered(h))
    }

    /// A body with a grant for its whole size: room for all of it (and one pipelined head)
    /// at once, rather than doubling chunk after chunk (up to twice the memory).
    pub fn reserve_body(&self, h: &mut HttpConn) {
        if h.tls.is_some() {
            return;
        }
        let cap = self.read_room(h) + h.plain.len();
        if h.plain.capacity() < cap {
            h.plain.reserve_exact(cap - h.plain.len());
        }
    }

    /// Parse and act on buffered requests until one goes to the core, more bytes are
    /// needed, the loop must act (health, metrics, a seat, a cancel for another
    /// connection), or the connection must close.
    pub fn process(
        &mut self,
        h: &mut HttpConn,
        out: &mut Vec<u8>,
        core: &mut Core,
        conn: ConnRef,
        now: Instant,
    ) -> Step {
        loop {
            if h.pending.is_some() || h.closing || h.binding.is_some() {
                return Step::Waiting;
            }
            // Ciphertext held back may go in now that plaintext was consumed.
            if let Some(tls) = &mut h.tls
                && !h.cipher_in.is_empty()
            {
                match tls.feed(&h.cipher_in) {
                    Ok(taken) => {
                        h.cipher_in.drain(..taken);
                    }
                    Err(_) => {
                        tls.pending_tls_out(out);
                        h.closing = true;
                        return Step::Waiting;
                    }
                }
            }
            let plain: &[u8] = match &h.tls {
                Some(tls) => tls.plaintext(),
                None => &h.plain,
            };
            let progress = match h.reader.poll(plain) {
                Ok(p) => p,
                Err(e) => {
                    let response = endpoint::parse_error_response(&e);
                    self.respond(h, out, response);
                    return Step::Waiting;
                }
            };
            match progress {
                Progress::NeedMore => return Step::NeedBytes,
                Progress::Head(request) => {
                    if let Some(step) = self.judge_head(h, out, request, now) {
                        return step;
                    }
                }
                Progress::Ready(request) => {
                    if let Some(step) = self.judge_body(h, out, core, conn, &request, now) {
                        return step;
                    }
                }
            }
        }
    }

    /// A head has arrived: judge it before any of its body is read. `Some` is a step for
    /// the loop; `None` means go on processing.
    fn judge_head(
        &mut self,
        h: &mut HttpConn,
        out: &mut Vec<u8>,
        mut request: Request,
        now: Instant,
    ) -> Option<Step> {
        h.answering_authenticated = false;
        // A refusal before the body arrived closes the connection: the body is not read,
        // so the stream cannot carry another request (the unread rest lingers away). A
        // connection admitted only to be answered closes after its one answer.
        let whole = buffered(h) >= request.consumed;
        if !whole || h.refusing.is_some() {
            request.keep_alive = false;
        }
        let decision =
            self.endpoint
                .decide_head(&request, &self.tokens, now, crate::ledger::now_ms());
        match decision {
            HeadDecision::Respond(response) => {
                finish_head(h, &request, whole);
                self.respond(h, out, response);
                None
            }
            HeadDecision::Health { keep_alive } => {
                finish_head(h, &request, whole);
                Some(Step::Health { keep_alive })
            }
            HeadDecision::Metrics { keep_alive } => {
                finish_head(h, &request, whole);
                if let Some(key) = h.refusing {
                    self.refuse_busy(h, out, key);
                    return None;
                }
                Some(Step::Metrics { keep_alive })
            }
            HeadDecision::ReadBody { principal } => {
                if let Some(key) = h.refusing {
                    finish_head(h, &request, whole);
                    self.refuse_busy(h, out, key);
                    return None;
                }
                if h.principal.as_deref() != Some(principal.as_str()) {
                    h.binding = Some(principal.clone());
                    return Some(Step::Seat { principal });
                }
                h.answering_authenticated = true;
                self.start_body(h, out, now);
                None
            }
        }
    }

    /// The loop found (or not) a seat for the principal a head named.
    pub fn seated(&mut self, h: &mut HttpConn, seated: bool, out: &mut Vec<u8>, now: Instant) {
        let Some(principal) = h.binding.take() else {
            return;
        };
        if seated {
            h.principal = Some(principal);
            h.answering_authenticated = true;
            self.start_body(h, out, now);
        } else {
            let whole = h
                .reader
                .current()
                .is_some_and(|r| buffered(h) >= r.consumed);
            if let Some(r) = h.reader.current().cloned() {
                finish_head(h, &r, whole);
            }
            self.refuse_busy(h, out, "http.max_connections_per_principal");
        }
    }

    /// An accepted head: wait for its body, and say `100 Continue` if the client waits for it.
    fn start_body(&mut self, h: &mut HttpConn, out: &mut Vec<u8>, now: Instant) {
        h.reader.proceed();
        h.body_started = Some(now);
        let expects = h
            .reader
            .current()
            .is_some_and(|r| r.expects_continue && buffered(h) < r.consumed);
        if expects {
            write(h, out, CONTINUE_100);
        }
    }

    /// 503 with `Retry-After`; the connection closes after it.
    fn refuse_busy(&mut self, h: &mut HttpConn, out: &mut Vec<u8>, key: &str) {
        let response = endpoint::busy_response(key, self.retry_after_secs);
        self.respond(h, out, response);
    }

    /// A whole request whose head was accepted: judge its body, then hand it to the core.
    fn judge_body(
        &mut self,
        h: &mut HttpConn,
        out: &mut Vec<u8>,
        core: &mut Core,
        conn: ConnRef,
        request: &Request,
        now: Instant,
    ) -> Option<Step> {
        h.body_started = None;
        let principal = h.principal.clone().unwrap_or_default();
        let plain: &[u8] = match &h.tls {
            Some(tls) => tls.plaintext(),
            None => &h.plain,
        };
        match self.endpoint.decide_body(request, plain, principal, now) {
            Decision::Respond(response) => {
                consume(h, request.consumed);
                self.respond(h, out, response);
                None
            }
            Decision::Call { call, message } => {
                h.seq = h.seq.wrapping_add(1).max(1);
                let peer = Peer {
                    transport: Transport::Http,
                    principal: call.principal.clone(),
                    process: "http".into(),
                };
                let payload = plain[message].to_vec();
                // SEP-2243: a parameter the tool binds to an `Mcp-Param-*` header must
                // travel in both, alike; the catalog knows the tool's bindings.
                // Read as the core reads it (a repeated key: the last one counts), so the
                // check sees the name and arguments the call is made with.
                let body: Option<serde_json::Value> = (call.era.is_modern()
                    && call.method == "tools/call")
                    .then(|| serde_json::from_slice(&payload).ok())
                    .flatten();
                let params = body.as_ref().and_then(|b| b.get("params"));
                let bindings = params
                    .and_then(|p| p.get("name"))
                    .and_then(serde_json::Value::as_str)
                    .map_or(&[][..], |name| core.header_bindings(name, &peer));
                let arguments = params.and_then(|p| p.get("arguments"));
                if let Some(response) =
                    endpoint::param_header_refusal(&call, request, arguments, bindings)
                {
                    consume(h, request.consumed);
                    self.respond(h, out, response);
                    return None;
                }
                consume(h, request.consumed);
                if let Era::Legacy {
                    session: Some(session),
                    ..
                } = &call.era
                {
                    self.waiting
                        .insert((session.clone(), call.id.clone()), conn);
                }
                core.set_conn_facts(
                    conn,
                    ConnFacts {
                        modern: call.era.is_modern(),
                        caps: call.caps,
                        log_level: call.log_level,
                    },
                );
                h.pending = Some(call);
                core.on_message(conn, &peer, "http", Expect::Request, h.seq, &payload, now);
                Some(Step::Waiting)
            }
            Decision::Notify {
                principal,
                era,
                message,
                ack,
            } => {
                let payload = plain[message].to_vec();
                consume(h, request.consumed);
                self.respond(h, out, ack);
                if let Era::Legacy {
                    session: Some(session),
                    ..
                } = &era
                    && let Some(target) = cancelled_request_id(&payload)
                        .and_then(|id| self.waiting.get(&(session.clone(), id)))
                        .or_else(|| {
                            response_id(&payload)
                                .and_then(|id| self.relayed.get(&(session.clone(), id)))
                        })
                        .copied()
                    && target != conn
                {
                    return Some(Step::CancelElsewhere {
                        target,
                        principal,
                        payload,
                    });
                }
                let peer = Peer {
                    transport: Transport::Http,
                    principal,
                    process: "http".into(),
                };
                core.on_message(conn, &peer, "http", Expect::Notification, 0, &payload, now);
                None
            }
            Decision::Health { keep_alive } => {
                consume(h, request.consumed);
                Some(Step::Health { keep_alive })
            }
            Decision::Metrics { keep_alive } => {
                consume(h, request.consumed);
                Some(Step::Metrics { keep_alive })
            }
        }
    }

    /// The core answered the pending request: write the HTTP response (the last event
    /// of its stream, when messages were relayed before it).
    pub fn answer(&mut self, h: &mut HttpConn, answer: &[u8], out: &mut Vec<u8>, now: Instant) {
        let Some(call) = h.pending.take() else {
            return;
        };
        self.forget_waiting(&call);
        self.forget_relayed(h, &call);
        if std::mem::take(&mut h.streaming) {
            let body = match &call.era {
                Era::Modern { .. } => crate::transport::http::reply::wrap_modern(
                    &call.method,
                    answer,
                    self.endpoint.settings().http.cache_ttl_ms,
                )
                .map(|w| w.body)
                .unwrap_or_else(|_| answer.to_vec()),
                Era::Legacy { .. } => answer.to_vec(),
            };
            let framing = framing_of(&call);
            let mut bytes = Vec::with_capacity(body.len() + 64);
            sse_writer::event(&mut bytes, &body, framing);
            sse_writer::end(&mut bytes, framing);
            write(h, out, &bytes);
            let now = Instant::now();
            h.request_started = if buffered(h) > 0 { Some(now) } else { None };
            h.idle_since = now;
            if !call.keep_alive || framing == sse_writer::Framing::UntilClose {
                h.closing = true;
                if let Some(tls) = &mut h.tls {
                    tls.close();
                    tls.pending_tls_out(out);
                }
            }
            return;
        }
        let response = self.endpoint.answer(&call, answer, now);
        self.respond(h, out, response);
    }

    /// A message a server sent during the pending call: the answer becomes an event
    /// stream (its head written with the first message), and the message an event of it.
    /// A relayed request of a legacy session is remembered, so the client's answer finds
    /// this connection from any connection of the session.
    pub fn relay(
        &mut self,
        h: &mut HttpConn,
        conn: ConnRef,
        message: &[u8],
        request_id: Option<&str>,
        out: &mut Vec<u8>,
    ) {
        let Some(call) = &h.pending else {
            return;
        };
        let framing = framing_of(call);
        let mut bytes = Vec::with_capacity(message.len() + 256);
        if !h.streaming {
            self.count_response(200);
            bytes.extend_from_slice(&sse_writer::head(call.keep_alive, framing));
            h.streaming = true;
        }
        if let (
            Some(id),
            Era::Legacy {
                session: Some(session),
                ..
            },
        ) = (request_id, &call.era)
        {
            let raw = serde_json::Value::String(id.to_owned()).to_string();
            self.relayed.insert((session.clone(), raw.clone()), conn);
            h.relayed_ids.push(raw);
        }
        sse_writer::event(&mut bytes, message, framing);
        write(h, out, &bytes);
    }

    fn forget_relayed(&mut self, h: &mut HttpConn, call: &Call) {
        let ids = std::mem::take(&mut h.relayed_ids);
        if let Era::Legacy {
            session: Some(session),
            ..
        } = &call.era
        {
            for id in ids {
                self.relayed.remove(&(session.clone(), id));
            }
        }
    }

    /// The call this connection held was cancelled from another connection of its session:
    /// no answer is owed (the MCP rule). Its response is an event stream that ends without
    /// one (the stream already under way, or an empty one), so the client's request ends
    /// cleanly and the connection may carry the next.
    pub fn abandon(&mut self, h: &mut HttpConn, out: &mut Vec<u8>) {
        let Some(call) = h.pending.take() else {
            return;
        };
        self.forget_waiting(&call);
        self.forget_relayed(h, &call);
        let framing = framing_of(&call);
        let mut bytes = Vec::new();
        if !std::mem::take(&mut h.streaming) {
            self.count_response(200);
            bytes.extend_from_slice(&sse_writer::head(call.keep_alive, framing));
        }
        sse_writer::end(&mut bytes, framing);
        write(h, out, &bytes);
        let now = Instant::now();
        h.request_started = if buffered(h) > 0 { Some(now) } else { None };
        h.idle_since = now;
        if !call.keep_alive || framing == sse_writer::Framing::UntilClose {
            h.closing = true;
            if let Some(tls) = &mut h.tls {
                tls.close();
                tls.pending_tls_out(out);
            }
        }
    }

    /// The connection is closing. A modern-era call still with the core is cancelled by
    /// that (the 2026-07-28 transport): the returned `notifications/cancelled` is for the
    /// core, as from this connection. A legacy call runs on (its session may still ask).
    pub fn on_close(&mut self, h: &mut HttpConn) -> Option<(String, Vec<u8>)> {
        let call = h.pending.take()?;
        self.forget_waiting(&call);
        self.forget_relayed(h, &call);
        if !call.era.is_modern() {
            return None;
        }
        let id: Box<serde_json::value::RawValue> =
            serde_json::value::RawValue::from_string(call.id.clone()).ok()?;
        let note = serde_json::json!({
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": id, "reason": "the client closed the connection"},
        });
        Some((call.principal, note.to_string().into_bytes()))
    }

    fn forget_waiting(&mut self, call: &Call) {
        if let Era::Legacy {
            session: Some(session),
            ..
        } = &call.era
        {
            self.waiting.remove(&(session.clone(), call.id.clone()));
        }
    }

    pub fn write_health(
        &mut self,
        h: &mut HttpConn,
        report: &HealthReport,
        keep_alive: bool,
        out: &mut Vec<u8>,
    ) {
        let response = self.endpoint.health(report, keep_alive);
        self.respond(h, out, response);
    }

    pub fn write_metrics(
        &mut self,
        h: &mut HttpConn,
        text: &str,
        keep_alive: bool,
        out: &mut Vec<u8>,
    ) {
        let response = self.endpoint.metrics(text, keep_alive);
        self.respond(h, out, response);
    }

    /// A slow client: 408 and close (a refusing connection just closes).
    pub fn time_out(&mut self, h: &mut HttpConn, out: &mut Vec<u8>) {
        self.respond(h, out, endpoint::timeout_response());
    }

    fn respond(&mut self, h: &mut HttpConn, out: &mut Vec<u8>, response: HttpResponse) {
        self.count_response(response.status);
        write(h, out, &response.bytes);
        let now = Instant::now();
        h.request_started = if buffered(h) > 0 { Some(now) } else { None };
        if std::mem::take(&mut h.answering_authenticated) {
            h.idle_since = now;
        }
        if response.close {
            h.closing = true;
            if let Some(tls) = &mut h.tls {
                tls.close();
                tls.pending_tls_out(out);
            }
        }
    }

    /// Idle sessions end now and then.
    pub fn sweep(&mut self, now: Instant) {
        if now >= self.next_session_sweep {
            let ended = self.endpoint.sweep(now);
            if ended > 0 {
                crate::debug!("http: {ended} idle sessions ended");
            }
            self.next_session_sweep = now + SESSION_SWEEP;
        }
    }

    /// Count a response written outside [`HttpDoor::respond`] (a refusal at accept).
    pub fn count_response(&mut self, status: u16) {
        *self.responses.entry(status).or_insert(0) += 1;
    }

    pub fn responses(&self) -> std::collections::BTreeMap<u16, u64> {
        self.responses.clone()
    }

    pub fn sessions(&self) -> usize {
        self.endpoint.sessions().len()
    }
}

impl HttpConn {
    /// Bytes the request whose body is arriving occupies in all (head and body).
    pub fn body_need(&self) -> Option<usize> {
        self.reader
            .current()
            .filter(|_| self.reader.in_body())
            .map(|r| r.consumed)
    }

    /// A request is with the core.
    pub fn is_waiting(&self) -> bool {
        self.pending.is_some()
    }

    /// Bytes of a request started and not finished.
    pub fn mid_request(&self) -> bool {
        self.pending.is_none() && self.reader.mid_request(buffered(self))
    }

    /// Whether a head authenticated a principal on this connection (until then the auth
    /// deadline applies, whatever it sent: `/health`, refused tokens, wrong routes).
    pub fn authenticated(&self) -> bool {
        self.principal.is_some()
    }

    /// The principal this connection's seat counts for.
    pub fn principal(&self) -> Option<&str> {
        self.principal.as_deref()
    }

    /// Admitted only to be answered (the door was full).
    pub fn is_refusing(&self) -> bool {
        self.refusing.is_some()
    }

    /// What the connection is doing, for its deadlines.
    pub fn stage(&self) -> Stage {
        if self.pending.is_some() || self.binding.is_some() {
            Stage::Busy
        } else if self.closing {
            Stage::Closing
        } else if self.reader.in_body() {
            Stage::Body {
                since: self.body_started.unwrap_or(self.idle_since),
            }
        } else if self.reader.mid_request(buffered(self)) || !self.cipher_in.is_empty() {
            Stage::Head {
                since: self.request_started.unwrap_or(self.idle_since),
            }
        } else if !self.seen_bytes {
            Stage::Opening
        } else if self.tls.as_ref().is_some_and(TlsSession::is_handshaking) {
            Stage::Head {
                since: self.request_started.unwrap_or(self.idle_since),
            }
        } else {
            Stage::Idle {
                since: self.idle_since,
            }
        }
    }
}

/// A refused or answered head: drop it (and its body when all of it is here); otherwise the
/// connection closes after the answer and the rest lingers away.
fn finish_head(h: &mut HttpConn, request: &Request, whole: bool) {
    if whole {
        consume(h, request.consumed);
    }
    h.reader.reset();
}

/// The id (raw JSON) of a JSON-RPC response, if that is what `payload` is.
fn response_id(payload: &[u8]) -> Option<String> {
    match crate::mcp::jsonrpc::parse(payload) {
        Ok(crate::mcp::jsonrpc::Message::Response { id, .. }) => Some(id.get().to_owned()),
        _ => None,
    }
}

/// The `requestId` (raw JSON) of a `notifications/cancelled`, if that is what `payload` is.
fn cancelled_request_id(payload: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Note<'a> {
        #[serde(borrow)]
        method: std::borrow::Cow<'a, str>,
        #[serde(borrow)]
        params: Option<&'a serde_json::value::RawValue>,
    }
    #[derive(serde::Deserialize)]
    struct Params<'a> {
        #[serde(borrow, rename = "requestId")]
        request_id: &'a serde_json::value::RawValue,
    }
    let note: Note = serde_json::from_slice(payload).ok()?;
    if note.method != "notifications/cancelled" {
        return None;
    }
    let params: Params = serde_json::from_str(note.params?.get()).ok()?;
    Some(params.request_id.get().to_owned())
}

/// How a streamed answer to `call` is framed.
fn framing_of(call: &Call) -> sse_writer::Framing {
    if call.http10 {
        sse_writer::Framing::UntilClose
    } else {
        sse_writer::Framing::Chunked
    }
}

fn buffered(h: &HttpConn) -> usize {
    match &h.tls {
        Some(tls) => tls.plaintext().len(),
        None => h.plain.len(),
    }
}

fn consume(h: &mut HttpConn, n: usize) {
    match &mut h.tls {
        Some(tls) => tls.consume(n),
        None => {
            let n = n.min(h.plain.len());
            h.plain.drain(..n);
            // A large body read once is not kept for the rest of a keep-alive connection.
            if h.plain.is_empty() && h.plain.capacity() > KEEP_READ_BUFFER {
                h.plain = Vec::new();
            }
        }
    }
}

fn write(h: &mut HttpConn, out: &mut Vec<u8>, bytes: &[u8]) {
    match &mut h.tls {
        None => out.extend_from_slice(bytes),
        Some(tls) => {
            if tls.write_plain(bytes).is_err() {
                h.closing = true;
            }
            tls.pending_tls_out(out);
        }
    }
}

fn settings(config: &Config, listen: std::net::SocketAddr, tls: bool) -> DoorSettings {
    DoorSettings {
        listen,
        tls,
        public_url: config.listen.public_url.clone(),
        auth: config.listen.http_auth,
        metrics_public: config.listen.metrics_public,
        http: config.http.clone(),
    }
}
