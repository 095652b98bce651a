//! The Streamable HTTP door inside the loop: one [`HttpConn`] per TCP connection, parsed
//! by the sans-IO [`RequestReader`], judged by the sans-IO [`Endpoint`], with TLS driven by
//! hand. One request per connection is with the core at a time, so pipelined answers go
//! out in order; the next request is parsed when the answer is written.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::ServerConfig;

use crate::config::Config;
use crate::gateway::core::{ConnRef, Core, Expect, Peer};
use crate::policy::Transport;
use crate::tokens::TokenStore;
use crate::transport::http::endpoint::{self, HealthReport};
use crate::transport::http::response::CONTINUE_100;
use crate::transport::http::{
    Call, Decision, DoorSettings, Endpoint, HttpResponse, Progress, RequestLimits, RequestReader,
    TlsSession, load_server_config,
};

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
    /// Stream id for the core's replies: one per request.
    seq: u32,
    /// When the request now arriving started (slow-client timer).
    pub request_started: Option<Instant>,
    /// When the connection last finished a request (keep-alive idle timer).
    pub idle_since: Instant,
    /// Close once the output is written.
    pub closing: bool,
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
            seq: 0,
            request_started: None,
            idle_since: Instant::now(),
            closing: false,
        })
    }

    /// Bytes from the socket. TLS handshake output goes to `out`.
    pub fn on_bytes(
        &mut self,
        h: &mut HttpConn,
        bytes: &[u8],
        out: &mut Vec<u8>,
        now: Instant,
    ) -> Result<(), String> {
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

    /// Whether the connection can take more bytes now (TLS holds back while plaintext
    /// waits; a cleartext buffer is bounded by the request limits).
    pub fn wants_bytes(&self, h: &HttpConn) -> bool {
        h.cipher_in.is_empty() && buffered(h) <= self.max_plain
    }

    /// Parse and act on buffered requests until one goes to the core, more bytes are
    /// needed, or the connection must close.
    pub fn process(
        &mut self,
        h: &mut HttpConn,
        out: &mut Vec<u8>,
        core: &mut Core,
        conn: ConnRef,
        now: Instant,
    ) -> Step {
        loop {
            if h.pending.is_some() || h.closing {
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
            let request = match h.reader.poll(plain) {
                Ok(Progress::NeedMore { send_continue }) => {
                    if send_continue {
                        write(h, out, CONTINUE_100);
                    }
                    return Step::NeedBytes;
                }
                Ok(Progress::Ready(request)) => request,
                Err(e) => {
                    let response = endpoint::parse_error_response(&e);
                    self.respond(h, out, response);
                    return Step::Waiting;
                }
            };
            let now_ms = crate::ledger::now_ms();
            let decision = self
                .endpoint
                .decide(&request, plain, &self.tokens, now, now_ms);
            let step = match decision {
                Decision::Respond(response) => {
                    consume(h, request.consumed);
                    self.respond(h, out, response);
                    continue;
                }
                Decision::Call { call, message } => {
                    h.seq = h.seq.wrapping_add(1).max(1);
                    let peer = Peer {
                        transport: Transport::Http,
                        principal: call.principal.clone(),
                        process: "http".into(),
                    };
                    let payload = plain[message].to_vec();
                    consume(h, request.consumed);
                    h.pending = Some(call);
                    core.on_message(conn, &peer, "http", Expect::Request, h.seq, &payload, now);
                    Step::Waiting
                }
                Decision::Notify {
                    principal,
                    message,
                    ack,
                    ..
                } => {
                    let peer = Peer {
                        transport: Transport::Http,
                        principal,
                        process: "http".into(),
                    };
                    let payload = plain[message].to_vec();
                    consume(h, request.consumed);
                    core.on_message(conn, &peer, "http", Expect::Notification, 0, &payload, now);
                    self.respond(h, out, ack);
                    continue;
                }
                Decision::Health { keep_alive } => {
                    consume(h, request.consumed);
                    Step::Health { keep_alive }
                }
                Decision::Metrics { keep_alive } => {
                    consume(h, request.consumed);
                    Step::Metrics { keep_alive }
                }
            };
            return step;
        }
    }

    /// The core answered the pending request: write the HTTP response.
    pub fn answer(&mut self, h: &mut HttpConn, answer: &[u8], out: &mut Vec<u8>, now: Instant) {
        let Some(call) = h.pending.take() else {
            return;
        };
        let response = self.endpoint.answer(&call, answer, now);
        self.respond(h, out, response);
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

    /// A slow client: 408 and close.
    pub fn time_out(&mut self, h: &mut HttpConn, out: &mut Vec<u8>) {
        self.respond(h, out, endpoint::timeout_response());
    }

    fn respond(&mut self, h: &mut HttpConn, out: &mut Vec<u8>, response: HttpResponse) {
        self.count_response(response.status);
        write(h, out, &response.bytes);
        h.request_started = if buffered(h) > 0 {
            Some(Instant::now())
        } else {
            None
        };
        h.idle_since = Instant::now();
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
    /// A request is with the core.
    pub fn is_waiting(&self) -> bool {
        self.pending.is_some()
    }

    /// Bytes of a request started and not finished.
    pub fn mid_request(&self) -> bool {
        self.pending.is_none() && self.reader.mid_request(buffered(self))
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
