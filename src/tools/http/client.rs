//! One HTTP exchange under the address policy: parse, check, resolve once, check every
//! address, connect only to a checked address, follow redirects ourselves (each hop
//! checked again), all within one deadline for the whole call.
//!
//! ureq is configured per attempt: no proxy (whatever the environment says), no redirects
//! of its own, statuses returned rather than raised, the remaining time as its global
//! timeout, and a resolver that knows only the one address being tried. A name with
//! several addresses is tried address by address, sharing the connect timeout (half of
//! what remains to each but the last), and the address that answered goes in the facts.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ureq::http::{Response, Uri};
use ureq::unversioned::transport::DefaultConnector;
use ureq::{Agent, Body};

use super::address_policy::AddressPolicy;
use super::config::HttpToolsConfig;
use super::outcome::{ErrorCode, HttpFacts, ToolError};
use super::redirect::{is_followed_redirect, resolve_location};
use super::resolver::{MAX_ADDRESSES_TRIED, PinnedResolver, resolve_name};
use super::url_target::{Target, TargetError, TargetHost, parse_target};

/// What toolwall asks for: documents first, anything else accepted.
const ACCEPT: &str =
    "text/html,application/xhtml+xml,text/plain;q=0.9,application/json;q=0.9,*/*;q=0.8";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
}

/// A response whose headers have arrived; the body is still on the wire.
pub struct Answer {
    pub response: Response<Body>,
    /// The URL that answered (after redirects).
    pub url: String,
}

/// The limits and policy of one call.
pub struct Client<'a> {
    cfg: &'a HttpToolsConfig,
    policy: AddressPolicy,
    deadline: Instant,
}

impl<'a> Client<'a> {
    pub fn new(cfg: &'a HttpToolsConfig) -> Result<Client<'a>, ToolError> {
        let policy = AddressPolicy::new(&cfg.extra_ports, &cfg.allow).map_err(|e| {
            ToolError::new(
                ErrorCode::InternalError,
                format!("builtin.http config: {e}"),
            )
        })?;
        // `validate` bounds the timeout; a config that skipped it must not panic here.
        let deadline = Instant::now()
            .checked_add(Duration::from_secs(cfg.timeout_secs))
            .ok_or_else(|| {
                ToolError::new(
                    ErrorCode::InternalError,
                    "builtin.http.timeout_secs is too large",
                )
            })?;
        Ok(Client {
            cfg,
            policy,
            deadline,
        })
    }

    /// Send `method` to `url`, following redirects when `follow` is set, and return the
    /// final response with its body unread.
    pub fn send(
        &self,
        url: &str,
        method: Method,
        follow: bool,
        facts: &mut HttpFacts,
    ) -> Result<Answer, ToolError> {
        let mut target = parse_target(url, self.cfg.max_url_bytes).map_err(|e| match e {
            TargetError::Invalid(m) => ToolError::new(ErrorCode::InvalidArguments, m),
            TargetError::Refused(m) => ToolError::new(ErrorCode::AddressRefused, m),
        })?;
        let mut current_url = url.to_string();
        let mut hops: u32 = 0;
        loop {
            let response = self.send_one(&target, method, facts)?;
            let status = response.status().as_u16();
            facts.status = Some(status);
            if !(follow && is_followed_redirect(status)) {
                return Ok(Answer {
                    response,
                    url: current_url,
                });
            }
            let Some(location) = response.headers().get("location") else {
                return Ok(Answer {
                    response,
                    url: current_url,
                });
            };
            if hops >= self.cfg.max_redirects {
                return Err(ToolError::new(
                    ErrorCode::HttpError,
                    format!("more than {} redirects", self.cfg.max_redirects),
                ));
            }
            hops += 1;
            let location = location.to_str().map_err(|_| {
                ToolError::new(ErrorCode::HttpError, "redirect Location is not ASCII")
            })?;
            let next = resolve_location(&target.uri, location).map_err(|m| {
                ToolError::new(ErrorCode::HttpError, format!("cannot follow redirect: {m}"))
            })?;
            facts.redirects.push(next.clone());
            target = parse_target(&next, self.cfg.max_url_bytes).map_err(|e| match e {
                TargetError::Invalid(m) => ToolError::new(
                    ErrorCode::HttpError,
                    format!("redirect to an unusable URL: {m}"),
                ),
                TargetError::Refused(m) => {
                    ToolError::new(ErrorCode::AddressRefused, format!("redirect refused: {m}"))
                }
            })?;
            current_url = next;
        }
    }

    fn remaining(&self) -> Result<Duration, ToolError> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ToolError::new(
                ErrorCode::Timeout,
                format!("the call took longer than {} s", self.cfg.timeout_secs),
            ));
        }
        Ok(left)
    }

    /// One hop: check, resolve, check every address, then try them in order.
    fn send_one(
        &self,
        target: &Target,
        method: Method,
        facts: &mut HttpFacts,
    ) -> Result<Response<Body>, ToolError> {
        self.policy
            .check_port(&target.host, target.port)
            .map_err(|m| ToolError::new(ErrorCode::AddressRefused, m))?;
        let connect_budget =
            Duration::from_secs(self.cfg.connect_timeout_secs).min(self.remaining()?);
        let connect_deadline = Instant::now() + connect_budget;
        let addrs: Vec<SocketAddr> = match &target.host {
            TargetHost::Ip(ip) => vec![SocketAddr::new(*ip, target.port)],
            TargetHost::Name(name) => resolve_name(name, target.port, connect_budget)?,
        };
        let ips: Vec<_> = addrs.iter().map(SocketAddr::ip).collect();
        if let Err(why) = self.policy.check_all(&target.host, target.port, &ips) {
            facts
                .resolved
                .extend(addrs.iter().map(SocketAddr::to_string));
            return Err(ToolError::new(
                ErrorCode::AddressRefused,
                format!("{} refused: {why}", host_text(&target.host)),
            ));
        }
        let tried = &addrs[..addrs.len().min(MAX_ADDRESSES_TRIED)];
        let mut last_error = None;
        for (i, addr) in tried.iter().enumerate() {
            let connect_left = connect_deadline.saturating_duration_since(Instant::now());
            if connect_left.is_zero() {
                break;
            }
            let is_last = i + 1 == tried.len();
            let attempt_budget = if is_last {
                connect_left
            } else {
                connect_left / 2
            };
            let agent = self.agent_for(&target.uri, *addr, attempt_budget, self.remaining()?);
            let request = match method {
                Method::Get => agent
                    .get(target.uri.clone())
                    .header("accept", ACCEPT)
                    .call(),
                Method::Head => agent
                    .head(target.uri.clone())
                    .header("accept", ACCEPT)
                    .call(),
            };
            match request {
                Ok(response) => {
                    facts.resolved.push(addr.to_string());
                    return Ok(response);
                }
                Err(e) if !is_last && is_connect_failure(&e) => last_error = Some(e),
                Err(e) => {
                    facts.resolved.push(addr.to_string());
                    return Err(map_error(&e, self.cfg));
                }
            }
        }
        facts
            .resolved
            .extend(tried.iter().map(SocketAddr::to_string));
        Err(match last_error {
            Some(e) => map_error(&e, self.cfg),
            None => ToolError::new(
                ErrorCode::Timeout,
                format!(
                    "connecting to {} took longer than {} s",
                    host_text(&target.host),
                    self.cfg.connect_timeout_secs
                ),
            ),
        })
    }

    fn agent_for(&self, uri: &Uri, addr: SocketAddr, connect: Duration, global: Duration) -> Agent {
        let config = Agent::config_builder()
            .proxy(None)
            .max_redirects(0)
            .http_status_as_error(false)
            .https_only(false)
            .user_agent(self.cfg.user_agent.as_str())
            .timeout_global(Some(global))
            .timeout_resolve(Some(connect))
            .timeout_connect(Some(connect))
            .max_idle_connections(0)
            .max_idle_connections_per_host(0)
            .build();
        Agent::with_parts(
            config,
            DefaultConnector::default(),
            PinnedResolver::new(uri, &[addr]),
        )
    }
}

fn host_text(host: &TargetHost) -> String {
    match host {
        TargetHost::Name(n) => n.clone(),
        TargetHost::Ip(ip) => ip.to_string(),
    }
}

/// Read the body of `answer`, at most `max_body_bytes` after decompression.
pub fn read_body(answer: &mut Answer, cfg: &HttpToolsConfig) -> Result<Vec<u8>, ToolError> {
    answer
        .response
        .body_mut()
        .with_config()
        .limit(cfg.max_body_bytes)
        .read_to_vec()
        .map_err(|e| map_error(&e, cfg))
}

/// Failures that concern one address only, after which the next address may work.
fn is_connect_failure(e: &ureq::Error) -> bool {
    use std::io::ErrorKind::*;
    match e {
        ureq::Error::Io(io) => matches!(
            io.kind(),
            ConnectionRefused
                | HostUnreachable
                | NetworkUnreachable
                | NetworkDown
                | AddrNotAvailable
                | TimedOut
        ),
        ureq::Error::Timeout(ureq::Timeout::Connect) | ureq::Error::ConnectionFailed => true,
        _ => false,
    }
}

/// A ureq error as the code and message an agent sees.
fn map_error(e: &ureq::Error, cfg: &HttpToolsConfig) -> ToolError {
    use std::io::ErrorKind;
    match e {
        ureq::Error::Timeout(ureq::Timeout::Connect) => ToolError::new(
            ErrorCode::Timeout,
            format!("connecting took longer than {} s", cfg.connect_timeout_secs),
        ),
        ureq::Error::Timeout(_) => ToolError::new(
            ErrorCode::Timeout,
            format!("the call took longer than {} s", cfg.timeout_secs),
        ),
        ureq::Error::Io(io) if matches!(io.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) => {
            ToolError::new(ErrorCode::Timeout, format!("network timeout: {io}"))
        }
        ureq::Error::BodyExceedsLimit(_) => ToolError::new(
            ErrorCode::TooLarge,
            format!("the body is larger than {} bytes", cfg.max_body_bytes),
        ),
        ureq::Error::LargeResponseHeader(..) => {
            ToolError::new(ErrorCode::TooLarge, "the response headers are too large")
        }
        ureq::Error::Io(io) => {
            ToolError::new(ErrorCode::ConnectFailed, format!("network error: {io}"))
        }
        ureq::Error::HostNotFound | ureq::Error::ConnectionFailed => {
            ToolError::new(ErrorCode::ConnectFailed, format!("cannot connect: {e}"))
        }
        ureq::Error::Tls(_) | ureq::Error::Rustls(_) => {
            ToolError::new(ErrorCode::ConnectFailed, format!("TLS failed: {e}"))
        }
        _ => ToolError::new(ErrorCode::HttpError, format!("HTTP failed: {e}")),
    }
}
