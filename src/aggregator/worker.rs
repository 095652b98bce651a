//! The aggregator role's request handling inside `toolwall worker aggregator`.
//!
//! Requests (see `src/workers/rpc.rs` for the envelope):
//! - `configure` (once, first): `args` is an [`AggregatorSetup`] as JSON. Starts, per
//!   server, a watcher thread and a pool of `limits.threads` threads with a queue of
//!   `limits.queue`, so one slow server holds up nothing but itself.
//! - `list_tools`, `list_resources`, `list_prompts`, `list_resource_templates`: `name` = the
//!   server, `args` = the listing's budget. Answer: a JSON array of the definitions as the
//!   server gave them (every page, copied, never re-encoded); `facts` = pages, bytes,
//!   dropped items, `list_changed` folded since the last report.
//! - `call_tool`: `name` = `server__tool`, `args` = the arguments (JSON text). Answer: the
//!   CallToolResult; `facts` = `{"server", "notifications": {method: count}}`.
//! - `read_resource`: `name` = the server, `args` = the `resources/read` params.
//! - `get_prompt`: `name` = `server__prompt`, `args` = the `prompts/get` params.
//!
//! Events: `upstream_state` and `list_changed` (see `upstream.rs`), detail as JSON text.

use mio::Waker;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};

use super::answer_bound;
use super::budget::ListingBudget;
use super::call_link::{CallLink, CallLinks, Serving};
use super::call_relay::CallContext;
use super::error::{UpstreamError, UpstreamErrorCode};
use super::setup::AggregatorSetup;
use super::upstream::{EventSink, Upstream};
use crate::mcp::catalog::Kind;
use crate::mcp::catalog::NAMESPACE_SEP;
use crate::workers::relay_wire::{CallMeta, RequestAnswer};
use crate::workers::rpc::{Message, Op, RpcError};

/// Answers and events from threads, waiting for the worker's loop.
pub type Outbox = Arc<Mutex<Vec<Message>>>;

/// How a server of the setup is reached, when not over HTTP (a local server's host makes
/// its stdio channel here).
pub type ChannelFactory = Arc<
    dyn Fn(&super::setup::UpstreamSetup, EventSink) -> Result<super::channel::Channel, String>
        + Send
        + Sync,
>;

struct Job {
    id: u64,
    op: Op,
    /// The tool or prompt name (without the server), when the op has one.
    item: String,
    args: Option<String>,
    /// An agent's call: what the gateway said of the agent, and the link its answers and
    /// cancellation arrive through.
    call: Option<(CallMeta, Arc<CallLink>)>,
}

struct Server {
    jobs: SyncSender<Job>,
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

    /// The gateway cancelled call `target`: its thread stops waiting and its connections
    /// close (the worker's loop drops its response).
    pub fn cancel(&self, target: u64) {
        if let Some(link) = self.links.get(target) {
            link.cancel();
        }
    }

    /// The agent's answer to a request the upstream made during call `target`.
    pub fn answer(&self, target: Option<u64>, args: Option<&str>) {
        let (Some(link), Some(answer)) = (
            target.and_then(|t| self.links.get(t)),
            args.and_then(|a| serde_json::from_str::<RequestAnswer>(a).ok()),
        ) else {
            return;
        };
        link.deliver(answer);
    }

    /// Handle one request; `Some` is an immediate answer, `None` means a thread answers
    /// later through the outbox.
    pub fn handle(
        &mut self,
        id: u64,
        op: Op,
        name: Option<String>,
        args: Option<String>,
        meta: Option<String>,
    ) -> Option<Message> {
        if op == Op::Configure {
            return Some(self.configure(id, args.as_deref()));
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
        let name = name.unwrap_or_default();
        let (server_name, item) = split_target(&name);
        let Some(server) = servers.get(server_name) else {
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
        let call = matches!(op, Op::CallTool | Op::ReadResource | Op::GetPrompt).then(|| {
            let meta = meta
                .as_deref()
                .and_then(|m| serde_json::from_str::<CallMeta>(m).ok())
                .unwrap_or_default();
            (meta, CallLink::new(id))
        });
        if let Some((_, link)) = &call {
            self.links.insert(Arc::clone(link));
        }
        let job = Job {
            id,
            op,
            item: item.to_owned(),
            args,
            call,
        };
        let refused = |links: &CallLinks| links.remove(id);
        match server.jobs.try_send(job) {
            Ok(()) => None,
            Err(TrySendError::Full(_)) => Some({
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
            Err(TrySendError::Disconnected(_)) => Some({
                refused(&self.links);
                response_err(
                    id,
                    &UpstreamError::new(UpstreamErrorCode::Internal, "the server's pool is gone"),
                )
            }),
        }
    }

    fn configure(&mut self, id: u64, args: Option<&str>) -> Message {
        if self.servers.is_some() {
            return response_err(
                id,
                &UpstreamError::new(
                    UpstreamErrorCode::Internal,
                    "already configured: the gateway restarts the worker to change servers",
                ),
            );
        }
        let setup: AggregatorSetup = match args.map(serde_json::from_str) {
            Some(Ok(s)) => s,
            Some(Err(e)) => {
                return response_err(
                    id,
                    &UpstreamError::new(
                        UpstreamErrorCode::InvalidArguments,
                        format!("configure: bad setup: {e}"),
                    ),
                );
            }
            None => {
                return response_err(
                    id,
                    &UpstreamError::new(UpstreamErrorCode::InvalidArguments, "configure: no setup"),
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
    ) -> std::io::Result<SyncSender<Job>> {
        let (tx, rx) = sync_channel::<Job>(queue);
        let rx = Arc::new(Mutex::new(rx));
        for n in 0..threads {
            let rx: Arc<Mutex<Receiver<Job>>> = Arc::clone(&rx);
            let upstream = Arc::clone(upstream);
            let outbox = Arc::clone(&self.outbox);
            let waker = Arc::clone(&self.waker);
            let links = Arc::clone(&self.links);
            let events = self.events.clone();
            std::thread::Builder::new()
                .name(format!("up-{n}"))
                .spawn(move || {
                    loop {
                        let job = {
                            let guard = rx.lock().unwrap_or_else(|p| p.into_inner());
                            match guard.recv() {
                                Ok(job) => job,
                                Err(_) => return,
                            }
                        };
                        let id = job.id;
                        let msg = run_job(&upstream, job, events.as_ref());
                        links.remove(id);
                        push(&outbox, &waker, msg);
                    }
                })?;
        }
        Ok(tx)
    }
}

fn run_job(upstream: &Upstream, job: Job, events: Option<&EventSink>) -> Message {
    let id = job.id;
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
    let list = |kind: Kind| {
        // The gateway sends each listing's budget; without one, the `[servers]` defaults.
        let budget = match job
            .args
            .as_deref()
            .map(serde_json::from_str::<ListingBudget>)
        {
            Some(Ok(b)) => b,
            Some(Err(e)) => {
                return response_err(
                    id,
                    &UpstreamError::new(
                        UpstreamErrorCode::InvalidArguments,
                        format!("a listing's budget is not valid: {e}"),
                    ),
                );
            }
            None => super::config::ServersConfig::default()
                .budget(upstream.name())
                .listing(upstream.name(), kind),
        };
        match upstream.list(kind, budget) {
            Ok((items, facts)) => match upstream.scrubbed(Ok(items)) {
                Ok(items) => response_ok(id, items, Some(facts.to_string())),
                Err(e) => response_err(id, &e),
            },
            Err(e) => response_err(id, &upstream.scrubbed_error(e)),
        }
    };
    match job.op {
        Op::ListTools => list(Kind::Tools),
        Op::ListResources => list(Kind::Resources),
        Op::ListPrompts => list(Kind::Prompts),
        Op::ListResourceTemplates => list(Kind::Templates),
        Op::CallTool => {
            if job.item.is_empty() {
                return response_err(
                    id,
                    &UpstreamError::new(
                        UpstreamErrorCode::InvalidArguments,
                        "call_tool needs name = server__tool",
                    ),
                );
            }
            let args = job.args.as_deref().unwrap_or("{}");
            let (result, notices) = upstream.call_tool(&job.item, args, ctx.as_mut());
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
        Op::ReadResource | Op::GetPrompt => {
            let mut params: Value = match job.args.as_deref().map(serde_json::from_str::<Value>) {
                Some(Ok(v @ Value::Object(_))) => v,
                None => json!({}),
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
            let method = if job.op == Op::ReadResource {
                "resources/read"
            } else {
                if !job.item.is_empty() {
                    params["name"] = Value::String(job.item.clone());
                }
                "prompts/get"
            };
            let result = upstream.forward(method, params, ctx.as_mut());
            let meta = ctx.as_ref().map(|c| &c.meta);
            match upstream.scrubbed(answer_bound::check(upstream.name(), result, meta)) {
                Ok(r) => response_ok(id, r, None),
                Err(e) => response_err(id, &e),
            }
        }
        other => response_err(
            id,
            &UpstreamError::new(
                UpstreamErrorCode::Internal,
                format!("the aggregator does not serve {other:?}"),
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        assert_eq!(split_target("gh"), ("gh", ""));
        assert_eq!(split_target("gh__search"), ("gh", "search"));
        assert_eq!(split_target("gh__a__b"), ("gh", "a__b"));
    }
}
