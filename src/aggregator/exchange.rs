//! One HTTP exchange with an upstream (blocking, on a worker thread): POST a JSON-RPC
//! message, read the answer as `application/json` or as a `text/event-stream` whose final
//! event is the answer, hand notifications and server requests to the caller as they come,
//! and turn every failure into an [`UpstreamError`] naming the server.
//!
//! ureq is configured once per server: no proxy (whatever the environment says), no
//! redirects (an upstream that redirects is misconfigured, and following one would leave
//! the checked address), statuses returned as answers, and a resolver that knows only the
//! addresses the gateway resolved and its address policy allowed, for this server's
//! authority alone. The worker itself has no DNS and no files.

use std::io::Read;
use std::time::Duration;

use ureq::http::{Response, Uri};
use ureq::unversioned::transport::DefaultConnector;
use ureq::{Agent, Body};

use super::call_link::TrackingConnector;
use super::error::{UpstreamError, UpstreamErrorCode, quote_upstream};
use super::message::{Incoming, RpcFailure, classify};
use super::setup::{Limits, UpstreamSetup};
use super::sse::{SseEvent, SseParser};
use crate::tools::http::PinnedResolver;

/// What every POST accepts: both answer forms, as the transport requires.
pub const ACCEPT_POST: &str = "application/json, text/event-stream";
/// What a listening stream accepts.
pub const ACCEPT_STREAM: &str = "text/event-stream";
/// Bytes of an error answer read to quote it.
const ERROR_BODY_BYTES: u64 = 4096;
/// Read chunk of a streamed answer.
const CHUNK: usize = 16 * 1024;

/// Something that came from the upstream besides the answer.
#[derive(Debug)]
pub enum Notice {
    Notification {
        method: String,
        params: Option<serde_json::Value>,
    },
    ServerRequest {
        id: Box<serde_json::value::RawValue>,
        method: String,
        params: Option<serde_json::Value>,
    },
    /// Messages dropped before anyone read them (beyond the size bounds, or a full
    /// queue): counted for the call that reads it, or for the progress token they named.
    Dropped {
        progress_token: Option<String>,
        count: u64,
    },
}

/// The answer of one POST.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    /// `Mcp-Session-Id` of the answer, when valid.
    pub session_id: Option<String>,
    /// The JSON-RPC answer to our request, when the body held it.
    pub answer: Option<Result<String, RpcFailure>>,
}

/// How to reach one server.
pub struct Transport {
    server: String,
    agent: Agent,
    /// For a call's own requests: keep-alive connections of their own, each bound to the
    /// call it serves, so cancelling the call closes it (see `call_connections.rs`).
    call_agent: Agent,
    uri: Uri,
    headers: Vec<(String, String)>,
    authorization: Option<String>,
    timeout: Duration,
    max_body: u64,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the authorization value.
        f.debug_struct("Transport")
            .field("server", &self.server)
            .field("uri", &self.uri)
            .finish()
    }
}

impl Transport {
    pub fn new(setup: &UpstreamSetup, limits: &Limits) -> Result<Transport, UpstreamError> {
        let uri: Uri = setup.url.parse().map_err(|_| {
            UpstreamError::new(
                UpstreamErrorCode::Internal,
                format!("server {}: the URL does not parse", setup.name),
            )
        })?;
        let connect = Duration::from_secs(limits.connect_timeout_secs);
        let builder = || {
            Agent::config_builder()
                .proxy(None)
                .max_redirects(0)
                .http_status_as_error(false)
                .https_only(false)
                .user_agent(format!("toolwall/{}", env!("CARGO_PKG_VERSION")).as_str())
                .timeout_resolve(Some(connect))
                .timeout_connect(Some(connect))
                .max_idle_connections(limits.threads.max(1) * 2)
                .max_idle_connections_per_host(limits.threads.max(1))
                // The pool hands out its longest-idle connection first: one idle for as
                // long as the server keeps it (uvicorn: 5 s) could be closed by the server
                // while the request is written on it, and that request would fail (a lost
                // unsubscribe, a call's spurious `server_down`). Such a one is not reused.
                .max_idle_age(Duration::from_millis(limits.reuse_idle_ms))
                .max_response_header_size(64 * 1024)
        };
        let agent = Agent::with_parts(
            builder().build(),
            DefaultConnector::default(),
            PinnedResolver::new(&uri, &setup.addresses),
        );
        let call_agent = Agent::with_parts(
            builder().build(),
            TrackingConnector::default(),
            PinnedResolver::new(&uri, &setup.addresses),
        );
        Ok(Transport {
            server: setup.name.clone(),
            agent,
            call_agent,
            uri,
            headers: setup.headers.clone(),
            authorization: setup
                .bearer_token
                .as_ref()
                .map(|t| format!("Bearer {}", t.expose())),
            timeout: Duration::from_secs(setup.timeout_secs),
            max_body: limits.max_body_bytes as u64,
        })
    }

    pub fn server(&self) -> &str {
        &self.server
    }

    /// POST `body`; when `want` is a request id, read the answer to it. Notifications and
    /// server requests met on the way go to `notice`.
    pub fn post(
        &self,
        protocol_headers: &[(&str, String)],
        body: &[u8],
        want: Option<u64>,
        notice: &mut dyn FnMut(Notice),
    ) -> Result<Reply, UpstreamError> {
        self.post_with(&self.agent, protocol_headers, body, want, notice)
    }

    /// As [`Transport::post`], on a connection of the call the current thread serves
    /// (closed when the call is cancelled).
    pub fn post_for_call(
        &self,
        protocol_headers: &[(&str, String)],
        body: &[u8],
        want: Option<u64>,
        notice: &mut dyn FnMut(Notice),
    ) -> Result<Reply, UpstreamError> {
        self.post_with(&self.call_agent, protocol_headers, body, want, notice)
    }

    fn post_with(
        &self,
        agent: &Agent,
        protocol_headers: &[(&str, String)],
        body: &[u8],
        want: Option<u64>,
        notice: &mut dyn FnMut(Notice),
    ) -> Result<Reply, UpstreamError> {
        let mut request = agent
            .post(self.uri.clone())
            .header("accept", ACCEPT_POST)
            .header("content-type", "application/json");
        for (k, v) in &self.headers {
            request = request.header(k.as_str(), v.as_str());
        }
        for (k, v) in protocol_headers {
            request = request.header(*k, v.as_str());
        }
        if let Some(auth) = &self.authorization {
            request = request.header("authorization", auth.as_str());
        }
        let response = request
            .config()
            .timeout_global(Some(self.timeout))
            .build()
            .send(body)
            .map_err(|e| self.map_error(&e))?;
        self.read_reply(response, want, notice)
    }

    /// Open a listening stream (legacy: GET; modern: POST `subscriptions/listen`) and
    /// hand every message to `notice` until the stream ends. `idle` bounds the silence
    /// between two reads. Returns the HTTP status when the stream was refused.
    pub fn listen(
        &self,
        protocol_headers: &[(&str, String)],
        body: Option<&[u8]>,
        idle: Duration,
        notice: &mut dyn FnMut(Notice),
    ) -> Result<(), UpstreamError> {
        let response = match body {
            Some(body) => {
                let mut r = self
                    .agent
                    .post(self.uri.clone())
                    .header("accept", ACCEPT_POST)
                    .header("content-type", "application/json");
                for (k, v) in &self.headers {
                    r = r.header(k.as_str(), v.as_str());
                }
                for (k, v) in protocol_headers {
                    r = r.header(*k, v.as_str());
                }
                if let Some(auth) = &self.authorization {
                    r = r.header("authorization", auth.as_str());
                }
                r.config()
                    .timeout_global(None)
                    .timeout_recv_body(None)
                    .timeout_per_read(Some(idle))
                    .build()
                    .send(body)
            }
            None => {
                let mut r = self
                    .agent
                    .get(self.uri.clone())
                    .header("accept", ACCEPT_STREAM);
                for (k, v) in &self.headers {
                    r = r.header(k.as_str(), v.as_str());
                }
                for (k, v) in protocol_headers {
                    r = r.header(*k, v.as_str());
                }
                if let Some(auth) = &self.authorization {
                    r = r.header("authorization", auth.as_str());
                }
                r.config()
                    .timeout_global(None)
                    .timeout_recv_response(Some(self.timeout))
                    .timeout_recv_body(None)
                    .timeout_per_read(Some(idle))
                    .build()
                    .call()
            }
        }
        .map_err(|e| self.map_error(&e))?;
        let status = response.status().as_u16();
        if !(200..300).contains(&status) {
            return Err(UpstreamError::new(
                UpstreamErrorCode::HttpError,
                format!(
                    "server {}: listening stream refused with HTTP {status}",
                    self.server
                ),
            )
            .with_status(status));
        }
        if !is_event_stream(&response) {
            return Err(UpstreamError::new(
                UpstreamErrorCode::BadResponse,
                format!(
                    "server {}: listening stream is not text/event-stream",
                    self.server
                ),
            ));
        }
        let mut body = response.into_body();
        let mut reader = body.with_config().limit(u64::MAX).reader();
        let mut parser = SseParser::new(self.max_body as usize);
        let mut buf = vec![0u8; CHUNK];
        let mut events = Vec::new();
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(e) => return Err(self.map_io(&e)),
            };
            parser
                .push(&buf[..n], &mut events)
                .map_err(|f| self.bad(format!("listening stream: {f}")))?;
            for event in events.drain(..) {
                if let Some(n) = self.notice_of(&event) {
                    notice(n);
                }
            }
        }
    }

    fn notice_of(&self, event: &SseEvent) -> Option<Notice> {
        if event.data.trim().is_empty() {
            return None;
        }
        match classify(&event.data, 0) {
            Ok(Incoming::Notification { method, params }) => {
                Some(Notice::Notification { method, params })
            }
            Ok(Incoming::ServerRequest { id, method, params }) => {
                Some(Notice::ServerRequest { id, method, params })
            }
            Ok(Incoming::Dropped { progress_token, .. }) => Some(Notice::Dropped {
                progress_token,
                count: 1,
            }),
            _ => None,
        }
    }

    fn read_reply(
        &self,
        mut response: Response<Body>,
        want: Option<u64>,
        notice: &mut dyn FnMut(Notice),
    ) -> Result<Reply, UpstreamError> {
        let status = response.status().as_u16();
        let session_id = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .filter(|v| super::era::valid_session_id(v))
            .map(str::to_owned);
        if !(200..300).contains(&status) {
            // Read a little of an error answer: a JSON-RPC error inside says more.
            let text = response
                .body_mut()
                .with_config()
                .limit(ERROR_BODY_BYTES)
                .read_to_vec()
                .unwrap_or_default();
            let answer = want.and_then(|id| match classify(&String::from_utf8_lossy(&text), id) {
                Ok(Incoming::Answer(a)) => Some(a),
                _ => None,
            });
            return Ok(Reply {
                status,
                session_id,
                answer,
            });
        }
        let Some(id) = want else {
            return Ok(Reply {
                status,
                session_id,
                answer: None,
            });
        };
        if status == 202 || status == 204 {
            return Err(self.bad(format!("answered {status} with no body to request {id}")));
        }
        let answer = if is_event_stream(&response) {
            self.read_stream_answer(response, id, notice)?
        } else if is_json(&response) {
            let text = self.read_whole(response)?;
            match classify(&text, id) {
                Ok(Incoming::Answer(a)) => a,
                Ok(_) => {
                    return Err(self.bad(format!(
                        "answered something other than the response to request {id}"
                    )));
                }
                Err(why) => return Err(self.bad(why)),
            }
        } else {
            let ct = response
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("none");
            return Err(self.bad(format!(
                "answered with content type {}, not application/json or text/event-stream",
                quote_upstream(ct, 80)
            )));
        };
        Ok(Reply {
            status,
            session_id,
            answer: Some(answer),
        })
    }

    fn read_whole(&self, mut response: Response<Body>) -> Result<String, UpstreamError> {
        let mut reader = response
            .body_mut()
            .with_config()
            .limit(self.max_body + 1)
            .reader();
        let mut out = Vec::new();
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = reader.read(&mut buf).map_err(|e| self.map_io(&e))?;
            if n == 0 {
                break;
            }
            if out.len() + n > self.max_body as usize {
                return Err(self.too_large());
            }
            out.extend_from_slice(&buf[..n]);
        }
        String::from_utf8(out).map_err(|_| self.bad("the answer is not UTF-8".into()))
    }

    fn read_stream_answer(
        &self,
        mut response: Response<Body>,
        id: u64,
        notice: &mut dyn FnMut(Notice),
    ) -> Result<Result<String, RpcFailure>, UpstreamError> {
        let mut reader = response
            .body_mut()
            .with_config()
            .limit(self.max_body + 1)
            .reader();
        let mut parser = SseParser::new(self.max_body as usize);
        let mut buf = vec![0u8; CHUNK];
        let mut events = Vec::new();
        let mut total = 0usize;
        loop {
            let n = reader.read(&mut buf).map_err(|e| self.map_io(&e))?;
            if n == 0 {
                return Err(self.bad(format!(
                    "the event stream ended without the response to request {id}"
                )));
            }
            total += n;
            if total > self.max_body as usize {
                return Err(self.too_large());
            }
            parser.push(&buf[..n], &mut events).map_err(|f| match f {
                super::sse::SseFault::TooLarge(_) => self.too_large(),
                other => self.bad(other.to_string()),
            })?;
            for event in events.drain(..) {
                if event.data.trim().is_empty() {
                    continue;
                }
                match classify(&event.data, id) {
                    Ok(Incoming::Answer(a)) => return Ok(a),
                    Ok(Incoming::Notification { method, params }) => {
                        notice(Notice::Notification { method, params })
                    }
                    Ok(Incoming::ServerRequest { id, method, params }) => {
                        notice(Notice::ServerRequest { id, method, params })
                    }
                    Ok(Incoming::Dropped { progress_token, .. }) => notice(Notice::Dropped {
                        progress_token,
                        count: 1,
                    }),
                    Ok(Incoming::Unrelated) => {}
                    Err(why) => return Err(self.bad(format!("in the event stream: {why}"))),
                }
            }
        }
    }

    fn bad(&self, why: String) -> UpstreamError {
        UpstreamError::new(
            UpstreamErrorCode::BadResponse,
            format!("server {}: {why}", self.server),
        )
    }

    fn too_large(&self) -> UpstreamError {
        UpstreamError::new(
            UpstreamErrorCode::TooLarge,
            format!(
                "server {}: the answer is larger than {} bytes (servers.max_body_bytes)",
                self.server, self.max_body
            ),
        )
    }

    fn map_io(&self, e: &std::io::Error) -> UpstreamError {
        if let Some(inner) = e.get_ref().and_then(|i| i.downcast_ref::<ureq::Error>()) {
            return self.map_error(inner);
        }
        use std::io::ErrorKind::*;
        match e.kind() {
            TimedOut | WouldBlock => UpstreamError::new(
                UpstreamErrorCode::Timeout,
                format!(
                    "server {}: no answer within {} s (servers.{}.timeout_secs)",
                    self.server,
                    self.timeout.as_secs(),
                    self.server
                ),
            ),
            _ => UpstreamError::new(
                UpstreamErrorCode::ConnectFailed,
                format!(
                    "server {}: connection failed while reading: {e}",
                    self.server
                ),
            ),
        }
    }

    fn map_error(&self, e: &ureq::Error) -> UpstreamError {
        use std::io::ErrorKind;
        let server = &self.server;
        match e {
            ureq::Error::Timeout(ureq::Timeout::Connect | ureq::Timeout::Resolve) => {
                UpstreamError::new(
                    UpstreamErrorCode::Timeout,
                    format!(
                        "server {server}: connecting took too long (servers.connect_timeout_secs)"
                    ),
                )
            }
            ureq::Error::Timeout(_) => UpstreamError::new(
                UpstreamErrorCode::Timeout,
                format!(
                    "server {server}: no answer within {} s (servers.{server}.timeout_secs)",
                    self.timeout.as_secs()
                ),
            ),
            ureq::Error::Io(io)
                if matches!(io.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) =>
            {
                UpstreamError::new(
                    UpstreamErrorCode::Timeout,
                    format!("server {server}: network timeout: {io}"),
                )
            }
            ureq::Error::Io(io) => UpstreamError::new(
                UpstreamErrorCode::ConnectFailed,
                format!("server {server}: {io}"),
            ),
            ureq::Error::HostNotFound => UpstreamError::new(
                UpstreamErrorCode::AddressRefused,
                format!(
                    "server {server}: no checked address to connect to (the gateway resolves upstream hosts at start and on reload)"
                ),
            ),
            ureq::Error::ConnectionFailed => UpstreamError::new(
                UpstreamErrorCode::ConnectFailed,
                format!("server {server}: cannot connect"),
            ),
            ureq::Error::Tls(_) | ureq::Error::Rustls(_) => UpstreamError::new(
                UpstreamErrorCode::ConnectFailed,
                format!("server {server}: TLS failed: {e}"),
            ),
            ureq::Error::BodyExceedsLimit(_) => self.too_large(),
            ureq::Error::LargeResponseHeader(..) => UpstreamError::new(
                UpstreamErrorCode::TooLarge,
                format!("server {server}: the answer's headers are too large"),
            ),
            _ => UpstreamError::new(
                UpstreamErrorCode::BadResponse,
                format!("server {server}: HTTP failed: {e}"),
            ),
        }
    }
}

fn content_type(response: &Response<Body>) -> String {
    response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .unwrap_or_default()
}

fn is_event_stream(response: &Response<Body>) -> bool {
    content_type(response) == "text/event-stream"
}

fn is_json(response: &Response<Body>) -> bool {
    content_type(response) == "application/json"
}
