//! One agent request to a server, as the pipeline carries it: who asked, where it goes,
//! and the parameters as judged. The methods that reach a server are one table
//! ([`Routed`]); a new one is a new row here, and it crosses the same pipeline.

use serde_json::Value;

use super::ConnRef;
use crate::mcp::catalog::{Kind, WorkerId};
use crate::mcp::compact_text::compact;
use crate::policy::{Decision, Transport};
use crate::workers::rpc::{Op, UpstreamCall};

/// The methods that reach a server. Everything else is answered by the gateway itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routed {
    CallTool,
    ReadResource,
    GetPrompt,
    /// `completion/complete`, routed by its `ref` (see `forwarded.rs`).
    Complete,
    /// `resources/subscribe` and `resources/unsubscribe`, routed by their URI.
    Subscribe,
    Unsubscribe,
}

impl Routed {
    pub fn from_method(method: &str) -> Option<Routed> {
        match method {
            "tools/call" => Some(Routed::CallTool),
            "resources/read" => Some(Routed::ReadResource),
            "prompts/get" => Some(Routed::GetPrompt),
            "completion/complete" => Some(Routed::Complete),
            "resources/subscribe" => Some(Routed::Subscribe),
            "resources/unsubscribe" => Some(Routed::Unsubscribe),
            _ => None,
        }
    }

    pub fn method(self) -> &'static str {
        match self {
            Routed::CallTool => "tools/call",
            Routed::ReadResource => "resources/read",
            Routed::GetPrompt => "prompts/get",
            Routed::Complete => "completion/complete",
            Routed::Subscribe => "resources/subscribe",
            Routed::Unsubscribe => "resources/unsubscribe",
        }
    }

    /// The catalog that names the target.
    pub fn kind(self) -> Kind {
        match self {
            Routed::CallTool => Kind::Tools,
            Routed::ReadResource | Routed::Subscribe | Routed::Unsubscribe => Kind::Resources,
            // A completion's prompt; a template or URI ref is looked up by URI.
            Routed::GetPrompt | Routed::Complete => Kind::Prompts,
        }
    }

    /// The params field that names the target.
    pub fn target_field(self) -> &'static str {
        match self {
            Routed::ReadResource | Routed::Subscribe | Routed::Unsubscribe => "uri",
            Routed::CallTool | Routed::GetPrompt => "name",
            Routed::Complete => "ref",
        }
    }

    /// Whether the judged arguments are `params.arguments` (tools, prompts) or the whole
    /// params (resources).
    pub fn has_arguments(self) -> bool {
        matches!(self, Routed::CallTool | Routed::GetPrompt)
    }

    /// Refusals of `tools/call` are results the model can read; of anything else, JSON-RPC
    /// errors.
    pub fn refuses_as_result(self) -> bool {
        self == Routed::CallTool
    }

    pub fn timeout_key(self) -> &'static str {
        match self {
            Routed::CallTool => "gateway.tool_call_timeout_secs",
            _ => "gateway.request_timeout_secs",
        }
    }
}

/// Who asked, and where the answer goes.
#[derive(Debug, Clone)]
pub struct Requester {
    /// None once the agent has gone: the call still ends in the ledger, nobody is answered.
    pub conn: Option<ConnRef>,
    pub stream: u32,
    /// The request's id as raw JSON.
    pub id: String,
    pub principal: String,
    pub process: String,
    pub transport: Transport,
}

/// Where a request goes, found in the catalog.
#[derive(Debug, Clone)]
pub struct Target {
    pub worker: WorkerId,
    pub server: String,
    /// The name at the server (tool, prompt) or the URI.
    pub upstream: String,
    /// What the ledger's `tool_name` column and approvals show: the bare tool or prompt
    /// name, or the URI.
    pub name: String,
    /// `server__tool` for tools/call (what tool globs match); None otherwise.
    pub tool: Option<String>,
    /// The URI of a resources/read or (un)subscribe, or of a completion's ref/resource.
    pub resource: Option<String>,
}

#[derive(Debug)]
pub struct Exchange {
    pub routed: Routed,
    pub from: Requester,
    pub target: Target,
    pub ledger_id: i64,
    /// The params object as parsed; the judged arguments live inside it (see
    /// [`Exchange::arguments`]). What is forwarded is serialized from this value.
    pub params: Value,
    pub request_decision: Decision,
    /// The decision of the response phase, once it ran and did not allow the answer.
    pub response_decision: Option<Decision>,
    /// The judged arguments' text is not what arrived (duplicate keys, escapes, key
    /// order, an unwrapped `input`); whitespace between tokens alone is no difference.
    pub arrived_differs: bool,
    /// A rewrite rule changed the arguments.
    pub rewritten: bool,
    /// The judged arguments' text, encoded once when the call arrived and reused for the
    /// worker's request; [`Exchange::arguments_mut`] drops it, so it never outlives them.
    pub judged: Option<String>,
    /// What the server got, when it differs from what arrived: the ledger keeps both.
    pub forwarded: Option<String>,
    /// Who approved a held call, and when (ms since the epoch).
    pub approved: Option<(String, i64)>,
    /// What the server sends the agent during the call (see `relay.rs`).
    pub relay: super::relay::CallRelay,
    /// Bytes of arguments this call holds in its server's `max_queued_bytes` (see
    /// `queued_bytes.rs`); given back when the call ends.
    pub queued_bytes: usize,
    /// Bytes of the request as it arrived: what the call holds of its principal's
    /// `gateway.max_bytes_in_flight_per_principal` while it is in the table.
    pub arrived_bytes: usize,
}

impl Exchange {
    /// What policy judges: `params.arguments`, or the whole params for a method without
    /// arguments.
    pub fn arguments(&self) -> Option<&Value> {
        if self.routed.has_arguments() {
            self.params.get("arguments")
        } else {
            Some(&self.params)
        }
    }

    pub fn arguments_mut(&mut self) -> Option<&mut Value> {
        self.judged = None;
        if self.routed.has_arguments() {
            self.params.get_mut("arguments")
        } else {
            Some(&mut self.params)
        }
    }

    /// The text of the judged arguments, for the ledger.
    pub fn judged_text(&self) -> String {
        self.arguments().map(compact).unwrap_or_else(|| "{}".into())
    }

    /// The worker's `args`: toolwall's own serialization of what was judged, never the
    /// bytes that arrived.
    pub fn forward_text(&mut self) -> String {
        match self.routed {
            Routed::CallTool => self.judged.take().unwrap_or_else(|| self.judged_text()),
            Routed::GetPrompt => {
                let mut params = self.params.clone();
                params["name"] = Value::String(self.target.upstream.clone());
                compact(&params)
            }
            Routed::Complete => super::forwarded::completion_params(self),
            Routed::ReadResource | Routed::Subscribe | Routed::Unsubscribe => compact(&self.params),
        }
    }

    /// The worker's request, carrying `args` ([`Exchange::forward_text`], encoded once by
    /// the caller), for the target's own name; `upstream` for a call at an upstream worker.
    pub fn worker_op(&self, args: String, upstream: Option<UpstreamCall>) -> Op {
        match self.routed {
            Routed::CallTool => Op::CallTool {
                tool: self.target.upstream.clone(),
                args,
                upstream,
            },
            Routed::ReadResource => Op::ReadResource {
                params: args,
                upstream,
            },
            Routed::GetPrompt => Op::GetPrompt {
                prompt: self.target.upstream.clone(),
                params: args,
                upstream,
            },
            Routed::Complete | Routed::Subscribe | Routed::Unsubscribe => Op::Forward {
                method: self.routed.method().to_owned(),
                params: args,
                upstream,
            },
        }
    }

    fn target_field_is_uri(&self) -> bool {
        self.routed.target_field() == "uri"
    }

    /// `server__tool`, the URI, or `server__prompt`: how approvals name the target.
    pub fn display_name(&self) -> String {
        if self.target.resource.is_some() || self.target_field_is_uri() {
            return self.target.name.clone();
        }
        format!("{}__{}", self.target.server, self.target.name)
    }
}
