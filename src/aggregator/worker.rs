//! The aggregator role's request handling inside `toolwall worker aggregator`.
//!
//! Requests (see `src/workers/rpc.rs` for the envelope):
//! - `configure` (once, first): `setup` is an [`AggregatorSetup`] as JSON. Starts, per
//!   server, a watcher thread and a pool of `limits.threads` threads with a queue of
//!   `limits.queue`, so one slow server holds up nothing but itself.
//! - `list_upstream` (a kind, the server, the listing's budget). Answer: a JSON array of
//!   the definitions as the server gave them (every page, copied, never re-encoded);
//!   `facts` = pages, bytes, dropped items, `list_changed` folded since the last report.
//! - `call_tool` (the server's own tool name, the arguments as JSON text, the server and
//!   the call's meta). Answer: the CallToolResult; `facts` = `{"server", "notifications":
//!   {method: count}}`.
//! - `read_resource`, `get_prompt`: the request params (and the prompt's own name).
//!
//! Events: `upstream_state` and `list_changed` (see `upstream.rs`), detail as JSON text.

use mio::Waker;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::answer_bound;
use super::budget::ListingBudget;
use super::call_link::{CallLink, CallLinks, Serving};
use super::call_relay::CallContext;
use super::error::{UpstreamError, UpstreamErrorCode};
use super::job_queue::{JobSender, SendRefused, job_queue};
use super::setup::AggregatorSetup;
use super::upstream::{EventSink, Upstream};
use crate::mcp::catalog::Kind;
use crate::mcp::catalog::NAMESPACE_SEP;
use crate::workers::relay_wire::{CallMeta, RequestAnswer};
use crate::workers::rpc::{Message, Op, RpcError};

/// Answers and events from threads, waiting for the worker's loop.
pub type Outbox = Arc<Mutex<Vec<Message>>>;

/// Where a pool thread hands its answer instead of the outbox: a host that writes answers
/// to the gateway from the answering thread (one wake-up of its loop less per call). It
/// must keep the order of what the same thread put in the outbox before.
pub type DirectAnswer = Arc<dyn Fn(Message) + Send + Sync>;

/// How a server of the setup is reached, when not over HTTP (a local server's host makes
/// its stdio channel here).
pub type ChannelFactory = Arc<
    dyn Fn(&super::setup::UpstreamSetup, EventSink) -> Result<super::channel::Channel, String>
        + Send
        + Sync,
>;

/// What a server's thread does for one request.
enum Work {
    List(Kind, ListingBudget),
    CallTool {
        tool: String,
        args: String,
    },
    ReadResource {
        params: String,
    },
    GetPrompt {
        prompt: String,
        params: String,
    },
    /// One of `rpc::FORWARDED_METHODS`, params as judged.
    Forward {
        method: String,
        params: String,
    },
}

struct Job {
    id: u64,
    work: Work,
    /// An agent's call: what the gateway said of the agent, and the link its answers and
    /// cancellation arrive through.
    call: Option<(CallMeta, Arc<CallLink>)>,
}

struct Server {
    jobs: JobSender<Job>,
    queue: usize,
    threads: usize,
}

/// The aggregator's state in its worker.
pub struct AggregatorRole {
    outbox: Outbox,
    waker: Arc<Waker>,
    servers: Option<HashMap<String, Server>>,
    /// Agents' calls queued or running: answers and cancellations find them here.
    links: Arc<CallLinks>,
    events: Option<EventSink>,
    channels: Option<ChannelFactory>,
    direct: Option<DirectAnswer>,
}

fn response_ok(id: u64, ok: String, facts: Option<String>) -> Message {
    Message::Response {
        id,
        ok: Some(ok),
        error: None,
        facts,
    }
}

fn response_err(id: u64, e: &UpstreamError) -> Message {
    Message::Response {
        id,
        ok: None,
        error: Some(match &e.missing_capability {
            Some(data) => RpcError {
                kind: super::missing_capability::KIND.to_owned(),
                message: data.clone(),
            },
            None => RpcError {
                kind: e.code.as_str().to_owned(),
                message: e.message.clone(),
            },
        }),
        facts: None,
    }
}

fn push(outbox: &Outbox, waker: &Waker, msg: Message) {
    outbox.lock().unwrap_or_else(|p| p.into_inner()).push(msg);
    let _ = waker.wake();
}

/// `server` or `server__rest`: the server, and the rest (empty without `__`).
pub fn split_target(name: &str) -> (&str, &str) {
    name.split_once(NAMESPACE_SEP).unwrap_or((name, ""))
}

impl AggregatorRole {
    pub fn new(outbox: Outbox, waker: Arc<Waker>) -> AggregatorRole {
        AggregatorRole {
            outbox,
            waker,
            servers: None,
            links: Arc::new(CallLinks::default()),
            events: None,
            channels: None,
            direct: None,
        }
    }

    /// An aggregator whose servers are reached through `channels`.
    pub fn with_channels(
        outbox: Outbox,
        waker: Arc<Waker>,
        channels: ChannelFactory,
    ) -> AggregatorRole {
        AggregatorRole {
            channels: Some(channels),
            ..AggregatorRole::new(outbox, waker)
        }
    }

    /// Pool threads hand their answers to `direct` instead of the outbox (set before
    /// `configure` starts them).
    pub fn answer_directly(&mut self, direct: DirectAnswer) {
        self.direct = Some(direct);
    }

    /// The gateway cancelled call `target`: its thread stops waiting and its connections
    /// close, or a thread that takes it from the queue skips it (the worker's loop
    /// replaces its response with word that it ended). False when no call `target` is
    /// queued or running here (its answer already left).
    pub fn cancel(&self, target: u64) -> bool {
        match self.links.get(target) {
            Some(link) => {
                link.cancel();
                true
            }
            None => false,
        }
    }

    /// The agent's answer to a request the upstream made during call `call`.
    pub fn answer(&self, call: u64, answer: RequestAnswer) {
        if let Some(link) = self.links.get(call) {
            link.deliver(answer);
        }
    }

    /// Handle one request; `Some` is an immediate answer, `None` means a thread answers
    /// later through the outbox.
    pub fn handle(&mut self, id: u64, op: Op) -> Option<Message> {
        let (server_name, work, upstream) = match op {
            Op::Configure { setup } => return Some(self.configure(id, &setup)),
            Op::ListUpstream {
                kind,
                server,
                budget,
            } => (server, Work::List(kind.into(), budget), None),
            Op::CallTool {
                tool,
                args,
                upstream,
            } => (String::new(), Work::CallTool { tool, args }, upstream),
            Op::ReadResource { params, upstream } => {
                (String::new(), Work::ReadResource { params }, upstream)
            }
            Op::GetPrompt {
                prompt,
                params,
                upstream,
            } => (String::new(), Work::GetPrompt { prompt, params }, upstream),
            Op::Forward {
                method,
                params,
                upstream,
            } if crate::workers::rpc::FORWARDED_METHODS.contains(&method.as_str()) => {
                (String::new(), Work::Forward { method, params }, upstream)
            }
            other => {
                return Some(response_err(
                    id,
                    &UpstreamError::new(
                        UpstreamErrorCode::Internal,
                        format!("the aggregator does not serve {other:?}"),
                    ),
                ));
            }
        };
        // An agent's call names its server with the call's meta; a listing names it alone.
        let (server_name, call) = match upstream {
            Some(u) => (u.server, Some((u.meta, CallLink::new(id)))),
            None => (server_name, None),
        };
        if call.is_none() && !matches!(work, Work::List(..)) {
            return Some(response_err(
                id,
                &UpstreamError::new(
                    UpstreamErrorCode::InvalidArguments,
                    "an agent's call at the aggregator names its upstream server",
                ),
            ));
        }
        let Some(servers) = &self.servers else {
            return Some(response_err(
                id,
                &UpstreamError::new(
                    UpstreamErrorCode::Internal,
                    "the aggregator has not been configured yet",
                ),
            ));
        };
        let Some(server) = servers.get(&server_name) else {
            return Some(response_err(
                id,
                &UpstreamError::new(
                    UpstreamErrorCode::UnknownServer,
                    format!(
                        "no upstream server named {:?} is configured and enabled",
                        server_name
                    ),
                ),
            ));
        };
        if let Some((_, link)) = &call {
            self.links.insert(Arc::clone(link));
        }
        let call = call.map(|(meta, link)| (*meta, link));
        let job = Job { id, work, call };
        let refused = |links: &CallLinks| links.remove(id);
        match server.jobs.try_send(job) {
            Ok(()) => None,
            Err(SendRefused::Full(_)) => Some({
                refused(&self.links);
                response_err(
                    id,
                    &UpstreamError::new(
                        UpstreamErrorCode::Busy,
                        format!(
                            "server {server_name} is busy: {} threads and a queue of {} are in use (servers.threads, servers.queue)",
                            server.threads, server.queue
                        ),
                    ),
                )
            }),
            Err(SendRefused::Closed(_)) => Some({
                refused(&self.links);
                response_err(
                    id,
                    &UpstreamError::new(UpstreamErrorCode::Internal, "the server's pool is gone"),
                )
            }),
        }
    }

    fn configure(&mut self, id: u64, setup: &str) -> Message {
        if self.servers.is_some() {
            return response_err(
                id,
                &UpstreamError::new(
                    UpstreamErrorCode::Internal,
                    "already configured: the gateway restarts the worker to change servers",
                ),
            );
        }
        let setup: AggregatorSetup = match serde_json::from_str(setup) {
            Ok(s) => s,
            Err(e) => {
                return response_err(
                    id,
                    &UpstreamError::new(
                        UpstreamErrorCode::InvalidArguments,
                        format!("configure: bad setup: {e}"),
                    ),
                );
            }
        };
        let outbox = Arc::clone(&self.outbox);
        let waker = Arc::clone(&self.waker);
        let events: EventSink = Arc::new(move |kind: &str, detail: Value| {
            push(
                &outbox,
                &waker,
                Message::Event {
                    kind: kind.to_owned(),
                    detail: detail.to_string(),
                },
            );
        });
        self.events = Some(Arc::clone(&events));
        let mut servers = HashMap::new();
        let mut names = Vec::new();
        for s in &setup.servers {
            let upstream = match &self.channels {
                Some(make) => Upstream::with_channel(
                    s,
                    &setup.limits,
                    Arc::clone(&events),
                    make(s, Arc::clone(&events)),
                ),
                None => Upstream::new(s, &setup.limits, Arc::clone(&events)),
            };
            let threads = setup.limits.threads.max(1);
            let queue = setup.limits.queue.max(1);
            let jobs = match self.start_pool(&upstream, threads, queue) {
                Ok(j) => j,
                Err(e) => {
                    return response_err(
                        id,
                        &UpstreamError::new(
                            UpstreamErrorCode::Internal,
                            format!("server {}: cannot start threads: {e}", s.name),
                        ),
                    );
                }
            };
            if let Err(e) = upstream.start() {
                return response_err(
                    id,
                    &UpstreamError::new(
                        UpstreamErrorCode::Internal,
                        format!("server {}: cannot start its watcher: {e}", s.name),
                    ),
                );
            }
            names.push(s.name.clone());
            servers.insert(
                s.name.clone(),
                Server {
                    jobs,
                    queue,
                    threads,
                },
            );
        }
        self.servers = Some(servers);
        response_ok(id, json!({ "servers": names }).to_string(), None)
    }

    fn start_pool(
        &self,
        upstream: &Arc<Upstream>,
        threads: usize,
        queue: usize,
    ) -> std::io::Result<JobSender<Job>> {
        let (tx, rx) = job_queue::<Job>(queue);
        for n in 0..threads {
            let rx = rx.clone();
            let upstream = Arc::clone(upstream);
            let outbox = Arc::clone(&self.outbox);
            let waker = Arc::clone(&self.waker);
            let links = Arc::clone(&self.links);
            let events = self.events.clone();
            let direct = self.direct.clone();
            std::thread::Builder::new()
                .name(format!("up-{n}"))
                .spawn(move || {
                    while let Some(job) = rx.recv() {
                        let id = job.id;
                        let msg = run_job(&upstream, job, events.as_ref());
                        links.remove(id);
                        match &direct {
                            Some(answer) => answer(msg),
                            None => push(&outbox, &waker, msg),
                        }
                    }
                })?;
        }
        Ok(tx)
    }
}

fn run_job(upstream: &Upstream, job: Job, events: Option<&EventSink>) -> Message {
    let id = job.id;
    // Cancelled while it waited in the queue: it never reaches the server.
    if job
        .call
        .as_ref()
        .is_some_and(|(_, link)| link.is_cancelled())
    {
        return crate::workers::worker_main::cancelled_end(id);
    }
    // An agent's call: its relay context, and its connections tracked for cancellation.
    let mut ctx = match (job.call, events) {
        (Some((meta, link)), Some(events)) => Some(CallContext::new(
            link,
            meta,
            Arc::clone(events),
            upstream.name(),
        )),
        _ => None,
    };
    let _serving = ctx.as_ref().map(|c| Serving::start(&c.link));
    match job.work {
        Work::List(kind, budget) => match upstream.list(kind, budget) {
            Ok((items, facts)) => match upstream.scrubbed(Ok(items)) {
                Ok(items) => response_ok(id, items, Some(facts.to_string())),
                Err(e) => response_err(id, &e),
            },
            Err(e) => response_err(id, &upstream.scrubbed_error(e)),
        },
        Work::CallTool { tool, args } => {
            if tool.is_empty() {
                return response_err(
                    id,
                    &UpstreamError::new(
                        UpstreamErrorCode::InvalidArguments,
                        "call_tool needs the tool's name",
                    ),
                );
            }
            let (result, notices) = upstream.call_tool(&tool, &args, ctx.as_mut());
            let meta = ctx.as_ref().map(|c| &c.meta);
            let result = upstream.scrubbed(answer_bound::check(upstream.name(), result, meta));
            let dropped = ctx.as_ref().map_or(0, |c| c.dropped);
            let facts = json!({"server": upstream.name(), "notifications": notices.counts,
                               "relay_dropped": dropped});
            match result {
                Ok(r) => response_ok(id, r, Some(facts.to_string())),
                Err(e) => {
                    let mut m = response_err(id, &e);
                    if let Message::Response { facts: f, .. } = &mut m {
                        *f = Some(facts.to_string());
                    }
                    m
                }
            }
        }
        Work::ReadResource { params } => {
            forward(upstream, id, "resources/read", &params, None, ctx.as_mut())
        }
        Work::Forward { method, params } => {
            forward(upstream, id, &method, &params, None, ctx.as_mut())
        }
        Work::GetPrompt { prompt, params } => forward(
            upstream,
            id,
            "prompts/get",
            &params,
            Some(prompt),
            ctx.as_mut(),
        ),
    }
}

/// `resources/read` or `prompts/get` (with the prompt's own name set in the params).
fn forward(
    upstream: &Upstream,
    id: u64,
    method: &str,
    params: &str,
    prompt: Option<String>,
    mut ctx: Option<&mut CallContext>,
) -> Message {
    let mut params: Value = match serde_json::from_str::<Value>(params) {
        Ok(v @ Value::Object(_)) => v,
        _ => {
            return response_err(
                id,
                &UpstreamError::new(
                    UpstreamErrorCode::InvalidArguments,
                    "params must be a JSON object",
                ),
            );
        }
    };
    if let Some(prompt) = prompt.filter(|p| !p.is_empty()) {
        params["name"] = Value::String(prompt);
    }
    let result = upstream.forward(method, params, ctx.as_deref_mut());
    let meta = ctx.as_ref().map(|c| &c.meta);
    match upstream.scrubbed(answer_bound::check(upstream.name(), result, meta)) {
        Ok(r) => response_ok(id, r, None),
        Err(e) => response_err(id, &e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kind of error a job ended with.
    fn error_kind(msg: &Message) -> Option<String> {
        match msg {
            Message::Response { error: Some(e), .. } => Some(e.kind.clone()),
            _ => None,
        }
    }

    #[test]
    fn a_call_cancelled_while_queued_never_reaches_its_server() {
        let setup: super::super::setup::UpstreamSetup = serde_json::from_value(json!({
            "name": "fx", "url": "http://127.0.0.1:9/mcp", "headers": [],
            "bearer_token": null, "timeout_secs": 5, "addresses": [],
            "unusable": "no server in this test"}))
        .unwrap();
        let limits: super::super::setup::Limits = serde_json::from_value(json!({
            "threads": 1, "queue": 1, "max_body_bytes": 4096,
            "connect_timeout_secs": 1, "retry_max_secs": 1}))
        .unwrap();
        let events: EventSink = Arc::new(|_: &str, _: Value| {});
        let up = Upstream::with_channel(&setup, &limits, Arc::clone(&events), Err("none".into()));
        let job = |id: u64, link: Arc<CallLink>| Job {
            id,
            work: Work::CallTool {
                tool: "echo".into(),
                args: "{}".into(),
            },
            call: Some((CallMeta::default(), link)),
        };
        // Not cancelled: it goes to its server (here: unreachable, and says so).
        let msg = run_job(&up, job(1, CallLink::new(1)), Some(&events));
        assert_ne!(error_kind(&msg).as_deref(), Some("cancelled"), "{msg:?}");
        // Cancelled while it waited: word that it ended, nothing sent.
        let link = CallLink::new(2);
        link.cancel();
        let msg = run_job(&up, job(2, link), Some(&events));
        assert_eq!(msg, crate::workers::worker_main::cancelled_end(2));
    }

    #[test]
    fn targets() {
        assert_eq!(split_target("gh"), ("gh", ""));
        assert_eq!(split_target("gh__search"), ("gh", "search"));
        assert_eq!(split_target("gh__a__b"), ("gh", "a__b"));
    }
}
