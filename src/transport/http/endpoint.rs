//! The decision for one HTTP request, before any JSON-RPC processing, sans-IO.
//!
//! In order, on the head alone ([`Endpoint::decide_head`], before a byte of the body is
//! read): route (`/mcp`, `/health`, `/metrics`, else 404); `Host` against the listen
//! address, `public_url` and `[http] allowed_hosts` (DNS-rebinding defence); `Origin`
//! against `public_url`; the bearer token (nothing of a refused request is read further);
//! the declared body size (`Content-Length` over `max_body_bytes`: 413, told only to a
//! client whose token passed); the method; `Accept` and `Content-Type`. Then, once the body of an accepted head is in
//! ([`Endpoint::decide_body`]): the body as one JSON-RPC message; then the era's own rules
//! (sessions in the legacy era, mirrored headers and `_meta` in the modern one).
//!
//! The outcome is a [`HeadDecision`], then a [`Decision`] the loop acts on: write a response now, hand a request to
//! the core (and later turn the core's answer into a response with [`Endpoint::answer`]),
//! hand a notification to the core and acknowledge it, or serve health or metrics with data
//! the loop holds.

use serde_json::{Value, json};
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::time::Instant;

use super::auth::{ANONYMOUS_PRINCIPAL, HttpAuth, authenticate, challenge};
use super::authority::{Authority, Origin, Scheme};
use super::config::HttpConfig;
use super::era::{
    self, LEGACY_ONLY_METHODS, METHOD_HEADER, MODERN_VERSIONS, MirroredHeaders, NAME_HEADER,
    PROTOCOL_VERSION_HEADER, ParamFacts, Refusal, RepeatedHeader, SESSION_HEADER, single_header,
};
use super::reply::{error_body, is_result, result_protocol_version, wrap_modern};
use super::request::{ParseError, Request, trim_ows};
use super::response::{HttpResponse, JSON, PROMETHEUS_TEXT, ResponseBuilder};
use super::sessions::{OpenError, SessionLimits, Sessions, well_formed_id};
use crate::mcp::jsonrpc::{self, Message};
use crate::mcp::protocol;
use crate::tokens::{AuthFailure, TokenKind, TokenVerifier};

/// The MCP endpoint's path.
pub const MCP_PATH: &str = "/mcp";
pub const HEALTH_PATH: &str = "/health";
pub const METRICS_PATH: &str = "/metrics";

/// What the door is told by the config: `[listen] http, tls_cert/tls_key (present or not),
/// public_url, http_auth, metrics_public` and the `[http]` table.
#[derive(Debug, Clone)]
pub struct DoorSettings {
    pub listen: SocketAddr,
    /// Whether the listener speaks TLS (a certificate is configured).
    pub tls: bool,
    pub public_url: Option<String>,
    pub auth: HttpAuth,
    pub metrics_public: bool,
    pub http: HttpConfig,
}

/// Which era a message is served in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Era {
    /// `version` is the session's negotiated version; for `initialize`, the version it
    /// will negotiate. `session` is None only for `initialize`.
    Legacy {
        version: &'static str,
        session: Option<String>,
    },
    Modern {
        version: &'static str,
    },
}

impl Era {
    pub fn version(&self) -> &'static str {
        match self {
            Era::Legacy { version, .. } | Era::Modern { version } => version,
        }
    }

    pub fn is_modern(&self) -> bool {
        matches!(self, Era::Modern { .. })
    }
}

/// A request handed to the core; keep it until the core answers, then call
/// [`Endpoint::answer`] with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The token's principal (or `anonymous` with `http_auth = "none"`).
    pub principal: String,
    pub era: Era,
    pub method: String,
    /// The request's raw JSON id.
    pub id: String,
    /// Whether the connection stays open after the answer.
    pub keep_alive: bool,
    /// A legacy `initialize`: a successful answer opens a session.
    opens_session: bool,
    /// Legacy era: the client capabilities of its session (or of this `initialize`).
    pub caps: crate::mcp::client_caps::ClientCaps,
    /// Legacy era: the log level its session asked for.
    pub log_level: Option<crate::mcp::log_level::LogLevel>,
    /// HTTP/1.0: a streamed answer ends with the connection (no chunks).
    pub http10: bool,
}

/// What the loop does with a request.
#[derive(Debug)]
pub enum Decision {
    /// Write this response now (a refusal, or a session ended).
    Respond(HttpResponse),
    /// Give the JSON-RPC request at `message` (a range of the request buffer) to the core;
    /// its answer goes through [`Endpoint::answer`].
    Call { call: Call, message: Range<usize> },
    /// Give the notification or response at `message` to the core (no answer is awaited)
    /// and write `ack` (202) now.
    Notify {
        principal: String,
        era: Era,
        message: Range<usize>,
        ack: HttpResponse,
    },
    /// Answer with [`Endpoint::health`].
    Health { keep_alive: bool },
    /// Answer with [`Endpoint::metrics`].
    Metrics { keep_alive: bool },
}

/// What the loop does with a request whose head alone was judged.
#[derive(Debug)]
pub enum HeadDecision {
    /// Write this response now; the body is never read.
    Respond(HttpResponse),
    /// Answer with [`Endpoint::health`].
    Health { keep_alive: bool },
    /// Answer with [`Endpoint::metrics`].
    Metrics { keep_alive: bool },
    /// An MCP `POST` by `principal`: read the body, then [`Endpoint::decide_body`].
    ReadBody { principal: String },
}

/// What `/health` reports; the loop fills it.
#[derive(Debug, Clone)]
pub struct HealthReport {
    /// False while the gateway cannot serve calls (e.g. the ledger cannot be written): 503.
    pub serving: bool,
    pub workers: Value,
    pub sandbox: Value,
    pub ledger: Value,
}

/// Which `Host` values are ours.
#[derive(Debug, Clone)]
enum HostRule {
    /// Wildcard listen address with no `public_url` and no `allowed_hosts`: any host.
    Any,
    /// (host, port); a port of None matches any port.
    Listed(Vec<(String, Option<u16>)>),
}

pub struct Endpoint {
    settings: DoorSettings,
    scheme: Scheme,
    public_origin: Option<Origin>,
    hosts: HostRule,
    sessions: Sessions,
    notes: Vec<String>,
}

fn ip_host(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

/// Validated settings: the public origin, the host rule and what to log at start.
fn derive(s: &DoorSettings) -> Result<(Option<Origin>, HostRule, Vec<String>), String> {
    s.http.validate("config")?;
    let mut notes = Vec::new();
    let ip = s.listen.ip();
    let port = s.listen.port();
    if s.auth == HttpAuth::None {
        if !ip.is_loopback() {
            return Err(format!(
                "listen.http_auth = \"none\" is refused on {}: without tokens the HTTP door \
                 may only listen on a loopback address",
                s.listen
            ));
        }
        notes.push(format!(
            "http door on {}: http_auth = \"none\": MCP requests are NOT authenticated \
             (loopback only; every caller is principal {ANONYMOUS_PRINCIPAL})",
            s.listen
        ));
    }
    let public_origin = match &s.public_url {
        None => None,
        Some(url) => Some(
            Origin::of_url(url)
                .map_err(|e| format!("listen.public_url {url:?} is not an http(s) URL: {e}"))?,
        ),
    };
    let mut listed: Vec<(String, Option<u16>)> = Vec::new();
    for entry in &s.http.allowed_hosts {
        let a = Authority::parse(entry.as_bytes())
            .map_err(|e| format!("http.allowed_hosts {entry:?}: {e}"))?;
        listed.push((a.host, a.port));
    }
    if let Some(o) = &public_origin {
        listed.push((o.host.clone(), Some(o.port)));
    }
    let loopback_names = |listed: &mut Vec<(String, Option<u16>)>| {
        for name in ["localhost", "127.0.0.1", "[::1]"] {
            listed.push((name.to_owned(), Some(port)));
        }
    };
    let hosts = if ip.is_unspecified() {
        if listed.is_empty() {
            notes.push(format!(
                "http door on {}: no public_url or http.allowed_hosts, so any Host header is \
                 accepted; set public_url to enable the DNS-rebinding defence",
                s.listen
            ));
            HostRule::Any
        } else {
            loopback_names(&mut listed);
            HostRule::Listed(listed)
        }
    } else {
        if ip.is_loopback() {
            listed.push(("localhost".to_owned(), Some(port)));
        }
        listed.push((ip_host(ip), Some(port)));
        HostRule::Listed(listed)
    };
    if public_origin.is_none() {
        notes.push(format!(
            "http door on {}: no public_url, so every request carrying an Origin header \
             (browsers) is refused",
            s.listen
        ));
    }
    Ok((public_origin, hosts, notes))
}

fn json_refusal(
    status: u16,
    keep_alive: bool,
    id: Option<&str>,
    refusal: &Refusal,
) -> HttpResponse {
    ResponseBuilder::new(status).keep_alive(keep_alive).body(
        JSON,
        &error_body(id, refusal.code, &refusal.message, refusal.data.as_ref()),
    )
}

/// A refusal with a JSON-RPC error body and no id (before the body was read).
fn refuse(status: u16, keep_alive: bool, message: &str) -> HttpResponse {
    json_refusal(
        status,
        keep_alive,
        None,
        &Refusal::new(status, jsonrpc::INVALID_REQUEST, message),
    )
}

fn method_not_allowed(allow: &'static str, keep_alive: bool) -> HttpResponse {
    ResponseBuilder::new(405)
        .header("Allow", allow)
        .keep_alive(keep_alive)
        .body(
            JSON,
            &error_body(
                None,
                jsonrpc::INVALID_REQUEST,
                &format!("method not allowed here; allowed: {allow}"),
                None,
            ),
        )
}

/// A refused token closes the connection: a client that keeps failing authentication must
/// not keep its seat by sending one bad head after another.
fn unauthorized(failure: &AuthFailure) -> HttpResponse {
    let keep_alive = false;
    if *failure == AuthFailure::Unavailable {
        return refuse(
            503,
            keep_alive,
            "the token store is unavailable; try again later",
        );
    }
    ResponseBuilder::new(401)
        .header("WWW-Authenticate", challenge(failure))
        .keep_alive(keep_alive)
        .body(
            JSON,
            &error_body(None, jsonrpc::INVALID_REQUEST, &failure.to_string(), None),
        )
}

/// Media types listed in an `Accept` value, lowercased, without those given `q=0`.
fn accepted_types(value: &[u8]) -> impl Iterator<Item = String> + '_ {
    value.split(|&b| b == b',').filter_map(|range| {
        let mut parts = range.split(|&b| b == b';');
        let media = trim_ows(parts.next().unwrap_or(b""));
        let refused = parts.any(|p| {
            let p = trim_ows(p);
            p.len() >= 2
                && p[..2].eq_ignore_ascii_case(b"q=")
                && p[2..].iter().all(|b| matches!(b, b'0' | b'.'))
        });
        (!refused && !media.is_empty()).then(|| String::from_utf8_lossy(media).to_ascii_lowercase())
    })
}

/// `Accept` lists both `application/json` and `text/event-stream` (wildcards do not count:
/// the spec asks clients to name both).
fn accepts_json_and_sse(request: &Request) -> bool {
    let mut json = false;
    let mut sse = false;
    for value in request.headers_named("accept") {
        for media in accepted_types(value) {
            json |= media == "application/json";
            sse |= media == "text/event-stream";
        }
    }
    json && sse
}

/// `Content-Type` is `application/json`, with at most a UTF-8 charset parameter.
fn content_type_is_json(request: &Request) -> bool {
    let Ok(Some(value)) = single_header(request.headers_named("content-type")) else {
        return false;
    };
    let mut parts = value.split(|&b| b == b';');
    if !trim_ows(parts.next().unwrap_or(b"")).eq_ignore_ascii_case(b"application/json") {
        return false;
    }
    parts.all(|p| {
        let p = trim_ows(p);
        match p.iter().position(|&b| b == b'=') {
            Some(eq) if trim_ows(&p[..eq]).eq_ignore_ascii_case(b"charset") => {
                let v = trim_ows(&p[eq + 1..]);
                let v = v
                    .strip_prefix(b"\"")
                    .and_then(|v| v.strip_suffix(b"\""))
                    .unwrap_or(v);
                v.eq_ignore_ascii_case(b"utf-8")
            }
            // Other parameters say nothing about the bytes; tolerate them.
            Some(_) => true,
            None => p.is_empty(),
        }
    })
}

impl Endpoint {
    /// Check the settings; `http_auth = "none"` off loopback and a malformed `public_url`
    /// are errors. What to log at start is in [`Endpoint::startup_notes`].
    pub fn new(settings: DoorSettings) -> Result<Endpoint, String> {
        let (public_origin, hosts, notes) = derive(&settings)?;
        Ok(Endpoint {
            scheme: if settings.tls {
                Scheme::Https
            } else {
                Scheme::Http
            },
            sessions: Sessions::new(SessionLimits::from(&settings.http)),
            settings,
            public_origin,
            hosts,
            notes,
        })
    }

    /// Apply new settings (reload). Live sessions are kept; an invalid config changes
    /// nothing.
    pub fn reconfigure(&mut self, settings: DoorSettings) -> Result<(), String> {
        let (public_origin, hosts, notes) = derive(&settings)?;
        self.sessions
            .set_limits(SessionLimits::from(&settings.http));
        self.scheme = if settings.tls {
            Scheme::Https
        } else {
            Scheme::Http
        };
        self.settings = settings;
        self.public_origin = public_origin;
        self.hosts = hosts;
        self.notes = notes;
        Ok(())
    }

    /// Lines the gateway logs when the door opens (e.g. that tokens are off).
    pub fn startup_notes(&self) -> &[String] {
        &self.notes
    }

    pub fn settings(&self) -> &DoorSettings {
        &self.settings
    }

    pub fn sessions(&self) -> &Sessions {
        &self.sessions
    }

    /// End idle sessions; returns how many. Call it now and then (e.g. once a minute).
    pub fn sweep(&mut self, now: Instant) -> usize {
        self.sessions.sweep(now)
    }

    /// Decide what to do with `request`, whose bytes (head and body) are all in `buf`:
    /// [`Endpoint::decide_head`], then [`Endpoint::decide_body`] when the head is accepted.
    pub fn decide(
        &mut self,
        request: &Request,
        buf: &[u8],
        tokens: &dyn TokenVerifier,
        now: Instant,
        now_ms: i64,
    ) -> Decision {
        match self.decide_head(request, tokens, now, now_ms) {
            HeadDecision::Respond(r) => Decision::Respond(r),
            HeadDecision::Health { keep_alive } => Decision::Health { keep_alive },
            HeadDecision::Metrics { keep_alive } => Decision::Metrics { keep_alive },
            HeadDecision::ReadBody { principal } => self.decide_body(request, buf, principal, now),
        }
    }

    /// Judge a request by its head alone, before any of its body is read: route, `Host`,
    /// `Origin`, the token, the declared body size, the method, `Accept` and `Content-Type`. Only a request that
    /// passes all of them gets its body read (and `100 Continue`, when it asked).
    pub fn decide_head(
        &mut self,
        request: &Request,
        tokens: &dyn TokenVerifier,
        now: Instant,
        now_ms: i64,
    ) -> HeadDecision {
        let keep = request.keep_alive;
        let path = request.path();
        if ![MCP_PATH, HEALTH_PATH, METRICS_PATH].contains(&path) {
            return HeadDecision::Respond(refuse(404, keep, "not found; the MCP endpoint is /mcp"));
        }
        if let Err(response) = self.check_host(request) {
            return HeadDecision::Respond(response);
        }
        if let Err(response) = self.check_origin(request) {
            return HeadDecision::Respond(response);
        }
        match path {
            HEALTH_PATH => {
                if let Some(response) = too_large(request) {
                    return HeadDecision::Respond(response);
                }
                if request.method != "GET" {
                    return HeadDecision::Respond(method_not_allowed("GET", keep));
                }
                HeadDecision::Health { keep_alive: keep }
            }
            METRICS_PATH => {
                if !self.settings.metrics_public
                    && let Err(failure) = authenticate(request, tokens, TokenKind::Admin, now_ms)
                {
                    return HeadDecision::Respond(unauthorized(&failure));
                }
                if let Some(response) = too_large(request) {
                    return HeadDecision::Respond(response);
                }
                if request.method != "GET" {
                    return HeadDecision::Respond(method_not_allowed("GET", keep));
                }
                HeadDecision::Metrics { keep_alive: keep }
            }
            _ => self.decide_mcp_head(request, tokens, now, now_ms),
        }
    }

    fn check_host(&self, request: &Request) -> Result<(), HttpResponse> {
        let keep = request.keep_alive;
        let HostRule::Listed(allowed) = &self.hosts else {
            return Ok(());
        };
        let value = match single_header(request.headers_named("host")) {
            Ok(Some(v)) => v,
            Ok(None) => return Err(refuse(400, keep, "a Host header is required")),
            Err(RepeatedHeader) => return Err(refuse(400, keep, "more than one Host header")),
        };
        let authority = Authority::parse(value)
            .map_err(|e| refuse(400, keep, &format!("malformed Host header: {e}")))?;
        let port = authority.port.unwrap_or(self.scheme.default_port());
        let ok = allowed
            .iter()
            .any(|(host, p)| *host == authority.host && p.is_none_or(|p| p == port));
        if ok {
            Ok(())
        } else {
            Err(refuse(
                403,
                keep,
                "Host header does not name this server (set listen.public_url or http.allowed_hosts)",
            ))
        }
    }

    fn check_origin(&self, request: &Request) -> Result<(), HttpResponse> {
        let keep = request.keep_alive;
        let value = match single_header(request.headers_named("origin")) {
            Ok(None) => return Ok(()),
            Ok(Some(v)) => v,
            Err(RepeatedHeader) => return Err(refuse(403, keep, "more than one Origin header")),
        };
        let Some(public) = &self.public_origin else {
            return Err(refuse(
                403,
                keep,
                "requests with an Origin header are refused: no public_url is configured",
            ));
        };
        match Origin::parse_header(value) {
            Err(e) => Err(refuse(403, keep, &format!("malformed Origin header: {e}"))),
            Ok(origin) if origin == *public => Ok(()),
            Ok(_) => Err(refuse(403, keep, "Origin does not match public_url")),
        }
    }

    fn decide_mcp_head(
        &mut self,
        request: &Request,
        tokens: &dyn TokenVerifier,
        now: Instant,
        now_ms: i64,
    ) -> HeadDecision {
        let keep = request.keep_alive;
        let principal = match self.settings.auth {
            HttpAuth::None => ANONYMOUS_PRINCIPAL.to_owned(),
            HttpAuth::Tokens => match authenticate(request, tokens, TokenKind::Client, now_ms) {
                Ok(p) => p,
                Err(failure) => return HeadDecision::Respond(unauthorized(&failure)),
            },
        };
        // Size after identity: only a client with a valid token learns the limit.
        if let Some(response) = too_large(request) {
            return HeadDecision::Respond(response);
        }
        match request.method.as_str() {
            "POST" => {
                if !accepts_json_and_sse(request) {
                    return HeadDecision::Respond(refuse(
                        406,
                        keep,
                        "Accept must list both application/json and text/event-stream",
                    ));
                }
                if !content_type_is_json(request) {
                    return HeadDecision::Respond(refuse(
                        415,
                        keep,
                        "Content-Type must be application/json",
                    ));
                }
                HeadDecision::ReadBody { principal }
            }
            "DELETE" => HeadDecision::Respond(self.delete(request, &principal, now)),
            _ => HeadDecision::Respond(method_not_allowed("POST, DELETE", keep)),
        }
    }

    /// Judge a `POST /mcp` whose head [`Endpoint::decide_head`] accepted for `principal`,
    /// now that its body is in `buf`: one JSON-RPC message, then the era's rules.
    pub fn decide_body(
        &mut self,
        request: &Request,
        buf: &[u8],
        principal: String,
        now: Instant,
    ) -> Decision {
        let keep = request.keep_alive;
        let Some(body) = buf.get(request.body.clone()) else {
            return Decision::Respond(refuse(500, false, "request body out of range"));
        };
        let message = match jsonrpc::parse(body) {
            Ok(m) => m,
            Err(fault) => {
                let refusal = Refusal::new(400, fault.code, fault.message);
                return Decision::Respond(json_refusal(
                    400,
                    keep,
                    fault.id.map(|id| id.get()),
                    &refusal,
                ));
            }
        };
        let params = match &message {
            Message::Request { params, .. } | Message::Notification { params, .. } => *params,
            Message::Response { .. } => None,
        };
        let facts = ParamFacts::read(params);
        let Ok(version_header) = single_header(request.headers_named(PROTOCOL_VERSION_HEADER))
        else {
            let id = match &message {
                Message::Request { id, .. } => Some(id.get()),
                _ => None,
            };
            let refusal = Refusal::new(
                400,
                era::HEADER_MISMATCH,
                "Header mismatch: more than one MCP-Protocol-Version header",
            );
            return Decision::Respond(json_refusal(400, keep, id, &refusal));
        };
        let message_range = request.body.clone();
        if era::is_modern(version_header, &facts) {
            self.post_modern(
                request,
                message,
                &facts,
                version_header,
                principal,
                message_range,
            )
        } else {
            self.post_legacy(
                request,
                message,
                version_header,
                principal,
                message_range,
                now,
            )
        }
    }

    fn post_modern(
        &mut self,
        request: &Request,
        message: Message<'_>,
        facts: &ParamFacts,
        version_header: Option<&[u8]>,
        principal: String,
        message_range: Range<usize>,
    ) -> Decision {
        let keep = request.keep_alive;
        let (id, method) = match message {
            Message::Request { id, method, .. } => (id, method),
            Message::Notification { .. } | Message::Response { .. } => {
                // This revision defines no client notifications over HTTP; accept and
                // pass them on like the legacy era does.
                let version = version_header
                    .and_then(|v| std::str::from_utf8(v).ok())
                    .and_then(era::modern_version)
                    .unwrap_or(MODERN_VERSIONS[0]);
                return Decision::Notify {
                    principal,
                    era: Era::Modern { version },
                    message: message_range,
                    ack: ResponseBuilder::new(202).keep_alive(keep).empty(),
                };
            }
        };
        let id = id.get();
        let headers = (
            single_header(request.headers_named(METHOD_HEADER)),
            single_header(request.headers_named(NAME_HEADER)),
        );
        let (Ok(method_header), Ok(name_header)) = headers else {
            let refusal = Refusal::new(
                400,
                era::HEADER_MISMATCH,
                "Header mismatch: Mcp-Method and Mcp-Name may appear once each",
            );
            return Decision::Respond(json_refusal(400, keep, Some(id), &refusal));
        };
        let mirrored = MirroredHeaders {
            protocol_version: version_header,
            method: method_header,
            name: name_header,
        };
        let version = match era::check_modern_request(&method, facts, mirrored) {
            Ok(v) => v,
            Err(refusal) => {
                return Decision::Respond(json_refusal(refusal.status, keep, Some(id), &refusal));
            }
        };
        if LEGACY_ONLY_METHODS.contains(&method.as_ref()) {
            let refusal = Refusal::new(
                404,
                jsonrpc::METHOD_NOT_FOUND,
                format!("Method not found: {method} is not part of protocol version {version}"),
            );
            return Decision::Respond(json_refusal(404, keep, Some(id), &refusal));
        }
        Decision::Call {
            call: Call {
                principal,
                era: Era::Modern { version },
                method: method.into_owned(),
                id: id.to_owned(),
                keep_alive: keep,
                opens_session: false,
                caps: Default::default(),
                log_level: None,
                http10: request.minor_version == 0,
            },
            message: message_range,
        }
    }

    fn post_legacy(
        &mut self,
        request: &Request,
        message: Message<'_>,
        version_header: Option<&[u8]>,
        principal: String,
        message_range: Range<usize>,
        now: Instant,
    ) -> Decision {
        let keep = request.keep_alive;
        let request_id = match &message {
            Message::Request { id, .. } => Some(id.get()),
            _ => None,
        };
        if let Message::Request { id, method, params } = &message
            && method == "initialize"
        {
            if !self.sessions.has_room(&principal, now) {
                let refusal = Refusal::new(
                    503,
                    jsonrpc::INVALID_REQUEST,
                    "too many sessions are open; try again later",
                );
                return Decision::Respond(json_refusal(503, keep, Some(id.get()), &refusal));
            }
            let requested = protocol::requested_version(*params);
            let version = protocol::negotiate(requested.as_deref());
            return Decision::Call {
                call: Call {
                    principal,
                    era: Era::Legacy {
                        version,
                        session: None,
                    },
                    method: "initialize".to_owned(),
                    id: id.get().to_owned(),
                    keep_alive: keep,
                    opens_session: true,
                    caps: crate::mcp::client_caps::ClientCaps::from_value(
                        params
                            .and_then(|p| serde_json::from_str::<Value>(p.get()).ok())
                            .as_ref()
                            .and_then(|p| p.get("capabilities")),
                    ),
                    log_level: None,
                    http10: request.minor_version == 0,
                },
                message: message_range,
            };
        }
        let refusal = |status: u16, message: &str| {
            Decision::Respond(json_refusal(
                status,
                keep,
                request_id,
                &Refusal::new(status, jsonrpc::INVALID_REQUEST, message),
            ))
        };
        let session_id = match single_header(request.headers_named(SESSION_HEADER)) {
            Ok(Some(id)) => id,
            Ok(None) => {
                return refusal(
                    400,
                    "an Mcp-Session-Id header is required (start a session with initialize)",
                );
            }
            Err(RepeatedHeader) => return refusal(400, "more than one Mcp-Session-Id header"),
        };
        let session = if well_formed_id(session_id) {
            // Checked ASCII hex above.
            let id = String::from_utf8_lossy(session_id).into_owned();
            self.sessions
                .touch(&id, &principal, now)
                .map(|s| (id, s.version, s.caps, s.log_level))
        } else {
            None
        };
        let Some((session_id, version, caps, mut log_level)) = session else {
            return refusal(
                404,
                "unknown or expired session; start a new one with initialize",
            );
        };
        if let Some(header) = version_header
            && header != version.as_bytes()
        {
            return refusal(
                400,
                &format!(
                    "MCP-Protocol-Version does not match the version this session negotiated ({version})"
                ),
            );
        }
        // The session's log level counts for every later call, on any connection.
        if let Message::Request { method, params, .. } = &message
            && method == "logging/setLevel"
            && let Some(level) = params
                .and_then(|p| serde_json::from_str::<Value>(p.get()).ok())
                .as_ref()
                .and_then(|p| p.get("level"))
                .and_then(Value::as_str)
                .and_then(crate::mcp::log_level::LogLevel::parse)
        {
            self.sessions.set_log_level(&session_id, level);
            log_level = Some(level);
        }
        let era = Era::Legacy {
            version,
            session: Some(session_id),
        };
        match message {
            Message::Request { id, method, .. } => Decision::Call {
                call: Call {
                    principal,
                    era,
                    method: method.into_owned(),
                    id: id.get().to_owned(),
                    keep_alive: keep,
                    opens_session: false,
                    caps,
                    log_level,
                    http10: request.minor_version == 0,
                },
                message: message_range,
            },
            Message::Notification { .. } | Message::Response { .. } => Decision::Notify {
                principal,
                era,
                message: message_range,
                ack: ResponseBuilder::new(202).keep_alive(keep).empty(),
            },
        }
    }

    fn delete(&mut self, request: &Request, principal: &str, now: Instant) -> HttpResponse {
        let keep = request.keep_alive;
        let session = single_header(request.headers_named(SESSION_HEADER));
        let version = single_header(request.headers_named(PROTOCOL_VERSION_HEADER));
        let modern = matches!(version, Ok(Some(v)) if std::str::from_utf8(v).ok().and_then(era::legacy_version).is_none());
        match session {
            Ok(None) if modern => method_not_allowed("POST", keep),
            Ok(None) => refuse(400, keep, "an Mcp-Session-Id header is required"),
            Err(RepeatedHeader) => refuse(400, keep, "more than one Mcp-Session-Id header"),
            Ok(Some(id)) => {
                let closed = well_formed_id(id)
                    && self
                        .sessions
                        .close(&String::from_utf8_lossy(id), principal, now);
                if closed {
                    ResponseBuilder::new(204).keep_alive(keep).empty()
                } else {
                    refuse(404, keep, "unknown or expired session")
                }
            }
        }
    }

    /// Turn the core's JSON-RPC `answer` to `call` into the HTTP response. A legacy
    /// `initialize` that succeeded opens the session here and names it in
    /// `Mcp-Session-Id`.
    pub fn answer(&mut self, call: &Call, answer: &[u8], now: Instant) -> HttpResponse {
        let keep = call.keep_alive;
        match &call.era {
            Era::Modern { .. } => {
                match wrap_modern(&call.method, answer, self.settings.http.cache_ttl_ms) {
                    Ok(w) => ResponseBuilder::new(w.status)
                        .keep_alive(keep)
                        .body(JSON, &w.body),
                    Err(e) => {
                        crate::error!("http door: {e}");
                        internal_error(call, keep)
                    }
                }
            }
            Era::Legacy { version, .. } if call.opens_session && is_result(answer) => {
                let negotiated = result_protocol_version(answer)
                    .and_then(|v| era::legacy_version(&v))
                    .unwrap_or(version);
                match self
                    .sessions
                    .open_with(&call.principal, negotiated, call.caps, now)
                {
                    Ok(session) => ResponseBuilder::new(200)
                        .header("Mcp-Session-Id", session)
                        .keep_alive(keep)
                        .body(JSON, answer),
                    Err(OpenError::Full) => json_refusal(
                        503,
                        keep,
                        Some(&call.id),
                        &Refusal::new(
                            503,
                            jsonrpc::INVALID_REQUEST,
                            "too many sessions are open; try again later",
                        ),
                    ),
                    Err(OpenError::Random(e)) => {
                        crate::error!("http door: cannot make a session id: {e}");
                        internal_error(call, keep)
                    }
                }
            }
            Era::Legacy { .. } => ResponseBuilder::new(200)
                .keep_alive(keep)
                .body(JSON, answer),
        }
    }

    /// The `/health` response.
    pub fn health(&self, report: &HealthReport, keep_alive: bool) -> HttpResponse {
        let body = json!({
            "status": if report.serving { "ok" } else { "unavailable" },
            "mcp_enabled": true,
            "version": env!("CARGO_PKG_VERSION"),
            "workers": report.workers,
            "sandbox": report.sandbox,
            "ledger": report.ledger,
        });
        ResponseBuilder::new(if report.serving { 200 } else { 503 })
            .keep_alive(keep_alive)
            .body(JSON, body.to_string().as_bytes())
    }

    /// The `/metrics` response around the rendered text.
    pub fn metrics(&self, text: &str, keep_alive: bool) -> HttpResponse {
        ResponseBuilder::new(200)
            .keep_alive(keep_alive)
            .body(PROMETHEUS_TEXT, text.as_bytes())
    }
}

fn internal_error(call: &Call, keep: bool) -> HttpResponse {
    json_refusal(
        500,
        keep,
        Some(&call.id),
        &Refusal::new(500, jsonrpc::INTERNAL_ERROR, "internal error"),
    )
}

/// The response to a request that could not be read; the connection closes after it.
pub fn parse_error_response(error: &ParseError) -> HttpResponse {
    refuse(error.status, false, error.reason)
}

/// 413 for a head whose `Content-Length` is over `max_body_bytes` (its body is never
/// read; the connection closes after it). Asked only once route, `Host`, `Origin` and the
/// token passed: who asks is judged before how much.
fn too_large(request: &Request) -> Option<HttpResponse> {
    request
        .body_over_limit
        .map(|_| refuse(413, false, super::request::TOO_LARGE))
}

/// The response to a client too slow to send its request; the connection closes after it.
pub fn timeout_response() -> HttpResponse {
    refuse(408, false, "the request took too long to arrive")
}

/// The response for a connection beyond a limit (`key` names it); it closes after it and
/// asks the client to come back in `retry_after_secs`.
pub fn busy_response(key: &str, retry_after_secs: u64) -> HttpResponse {
    ResponseBuilder::new(503)
        .header("Retry-After", retry_after_secs.to_string())
        .keep_alive(false)
        .body(
            JSON,
            &error_body(
                None,
                jsonrpc::INVALID_REQUEST,
                &format!("too many connections ({key}); try again in {retry_after_secs} s"),
                None,
            ),
        )
}

#[cfg(test)]
#[path = "endpoint_tests.rs"]
mod tests;

/// Judge a modern `tools/call`'s `Mcp-Param-*` headers (SEP-2243) against its `arguments`,
/// for the tool the catalog names with `bindings`: `None` when they agree (or the tool
/// binds none), else the 400 / -32020 refusal.
pub fn param_header_refusal(
    call: &Call,
    request: &Request,
    arguments: Option<&Value>,
    bindings: &[crate::mcp::param_headers::Binding],
) -> Option<HttpResponse> {
    if bindings.is_empty() || !call.era.is_modern() || call.method != "tools/call" {
        return None;
    }
    let headers = request
        .headers
        .iter()
        .map(|h| (h.name.as_str(), h.value.as_slice()));
    let why = crate::mcp::param_headers::check(bindings, arguments, headers).err()?;
    let refusal = Refusal::new(400, era::HEADER_MISMATCH, why);
    Some(json_refusal(400, call.keep_alive, Some(&call.id), &refusal))
}
