//! Worker RPC over the socketpair, sans-IO: `u32 BE length` + one MessagePack map.
//!
//! The worker speaks first (`ready`), then the gateway sends `request`s and the worker
//! answers each with a `response`, in any order; `event`s are unsolicited. JSON payloads
//! (tool arguments, results, tool lists) travel as JSON text inside the map so nothing is
//! re-encoded twice.

use serde::{Deserialize, Serialize};

use super::relay_wire::{CallMeta, RequestAnswer};
use crate::aggregator::budget::ListingBudget;
use crate::mcp::catalog::Kind;
use crate::sandbox::ConfinementReport;

/// Largest message either side accepts.
pub const MAX_MESSAGE: usize = 16 * 1024 * 1024;
const PREFIX: usize = 4;

/// Externally tagged (`{"response": {...}}`): a message is decoded in one pass, where an
/// internally tagged one (`{"type": "response", ...}`) is first buffered whole, its answer
/// text copied once more, to find its tag.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Message {
    /// First message of a worker: who it is and the proof of its confinement.
    Ready {
        role: String,
        pid: u32,
        version: String,
        confinement: ConfinementReport,
    },
    Request {
        id: u64,
        op: Op,
    },
    Response {
        id: u64,
        /// JSON text of the result (a CallToolResult, a tool list, ...).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ok: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<RpcError>,
        /// JSON text of facts for the ledger (e.g. the HTTP tools' URL and address).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        facts: Option<String>,
    },
    Event {
        kind: String,
        detail: String,
    },
}

/// One operation the gateway asks of a worker, each with exactly the fields it needs.
/// JSON payloads the worker hands on unchanged (arguments, params, the setup) travel as
/// JSON text.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// The worker's own definitions of `kind` (builtin, workspace), as a JSON array.
    List { kind: ListKind },
    /// The definitions of `kind` of upstream `server` (aggregator, local server's host),
    /// as a JSON array within `budget` (it travels with each listing, so a reload
    /// applies at once).
    ListUpstream {
        kind: ListKind,
        server: String,
        budget: ListingBudget,
    },
    /// `tools/call` of `tool` (its server's own name for it); `args`: JSON text of the
    /// arguments as judged.
    CallTool {
        tool: String,
        args: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        upstream: Option<UpstreamCall>,
    },
    /// `resources/read`; `params`: JSON text of the request params (with the `uri`).
    ReadResource {
        params: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        upstream: Option<UpstreamCall>,
    },
    /// `prompts/get` of `prompt` (its server's own name); `params`: JSON text of the
    /// request params.
    GetPrompt {
        prompt: String,
        params: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        upstream: Option<UpstreamCall>,
    },
    /// A request forwarded to an upstream server as judged (`params`: JSON text), for the
    /// methods with nothing of their own to carry: `completion/complete`,
    /// `resources/subscribe`, `resources/unsubscribe` ([`FORWARDED_METHODS`]; a worker
    /// refuses any other method).
    Forward {
        method: String,
        params: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        upstream: Option<UpstreamCall>,
    },
    /// Stop working on request `target`; no response is owed for it afterwards, nor for
    /// the cancel.
    Cancel { target: u64 },
    /// Run the confinement probes again inside the live worker (threads running, work
    /// done): the answer is a fresh report. Operators and tests use it to re-check.
    Attest,
    /// Upstream workers only, once, first: `setup` is JSON text of the upstream servers
    /// with their checked addresses and credentials
    /// (`crate::aggregator::setup::AggregatorSetup`). Credentials travel only here, after
    /// the worker attested its confinement.
    Configure { setup: String },
    /// Upstream workers only: the agent's answer to a request the upstream made during
    /// call `call`. No response is owed.
    Answer { call: u64, answer: RequestAnswer },
}

/// The methods [`Op::Forward`] may carry.
pub const FORWARDED_METHODS: &[&str] = &[
    "completion/complete",
    "resources/subscribe",
    "resources/unsubscribe",
];

impl Op {
    /// The operation's name on the wire (`call_tool`, `cancel`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Op::List { .. } => "list",
            Op::ListUpstream { .. } => "list_upstream",
            Op::CallTool { .. } => "call_tool",
            Op::ReadResource { .. } => "read_resource",
            Op::GetPrompt { .. } => "get_prompt",
            Op::Forward { .. } => "forward",
            Op::Cancel { .. } => "cancel",
            Op::Attest => "attest",
            Op::Configure { .. } => "configure",
            Op::Answer { .. } => "answer",
        }
    }
}

/// Which list a listing is of.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ListKind {
    Tools,
    Resources,
    Prompts,
    ResourceTemplates,
}

impl From<Kind> for ListKind {
    fn from(kind: Kind) -> ListKind {
        match kind {
            Kind::Tools => ListKind::Tools,
            Kind::Resources => ListKind::Resources,
            Kind::Prompts => ListKind::Prompts,
            Kind::Templates => ListKind::ResourceTemplates,
        }
    }
}

impl From<ListKind> for Kind {
    fn from(kind: ListKind) -> Kind {
        match kind {
            ListKind::Tools => Kind::Tools,
            ListKind::Resources => Kind::Resources,
            ListKind::Prompts => Kind::Prompts,
            ListKind::ResourceTemplates => Kind::Templates,
        }
    }
}

/// An agent's call at an upstream worker: the server that serves it, and what the
/// gateway says of the agent behind it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct UpstreamCall {
    pub server: String,
    /// Boxed: the largest part of a request, which would size every worker event.
    pub meta: Box<CallMeta>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RpcError {
    /// Stable code: `busy`, `unknown_tool`, `invalid_arguments`, `internal`, ...
    pub kind: String,
    pub message: String,
}

/// Why a byte stream from the other side cannot be read any further.
#[derive(Debug, PartialEq, Eq)]
pub enum RpcFault {
    TooLarge(usize),
    Malformed(String),
}

impl std::fmt::Display for RpcFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RpcFault::TooLarge(n) => write!(f, "rpc message of {n} bytes exceeds {MAX_MESSAGE}"),
            RpcFault::Malformed(e) => write!(f, "malformed rpc message: {e}"),
        }
    }
}

/// Append one encoded message to `out`.
pub fn encode(out: &mut Vec<u8>, msg: &Message) -> Result<(), RpcFault> {
    let start = out.len();
    out.extend_from_slice(&[0; PREFIX]);
    rmp_serde::encode::write_named(out, msg).map_err(|e| RpcFault::Malformed(e.to_string()))?;
    let len = out.len() - start - PREFIX;
    if len > MAX_MESSAGE {
        out.truncate(start);
        return Err(RpcFault::TooLarge(len));
    }
    out[start..start + PREFIX].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(())
}

/// Decode the first message of `buf`: `Ok(None)` when more bytes are needed, else the
/// message and the bytes it consumed.
pub fn decode(buf: &[u8]) -> Result<Option<(Message, usize)>, RpcFault> {
    if buf.len() < PREFIX {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len > MAX_MESSAGE {
        return Err(RpcFault::TooLarge(len));
    }
    if buf.len() < PREFIX + len {
        return Ok(None);
    }
    let msg = rmp_serde::from_slice(&buf[PREFIX..PREFIX + len])
        .map_err(|e| RpcFault::Malformed(e.to_string()))?;
    Ok(Some((msg, PREFIX + len)))
}

/// A bounded read buffer for one RPC peer: bytes in, messages out. The buffer is zeroed
/// once as it grows and reused; `start..end` holds unread bytes.
#[derive(Debug, Default)]
pub struct RpcReader {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

/// Bytes asked of the socket per read.
const READ_CHUNK: usize = 64 * 1024;

impl RpcReader {
    /// Room to read into (grows up to one maximal message plus a chunk).
    pub fn spare(&mut self) -> &mut [u8] {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == 0 && self.buf.len() > 4 * READ_CHUNK {
            self.buf = Vec::new();
        }
        let want = (self.end + READ_CHUNK).min(PREFIX + MAX_MESSAGE + READ_CHUNK);
        if self.buf.len() < want {
            self.buf.resize(want, 0);
        }
        &mut self.buf[self.end..want]
    }

    /// After reading `n` bytes into `spare()`.
    pub fn filled(&mut self, n: usize) {
        self.end = (self.end + n).min(self.buf.len());
    }

    /// Read what a non-blocking `stream` has for us; true at end of file.
    pub fn read_from(&mut self, stream: &mut impl std::io::Read) -> std::io::Result<bool> {
        loop {
            match stream.read(self.spare()) {
                Ok(0) => return Ok(true),
                Ok(n) => self.filled(n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The next whole message, if any.
    pub fn next_message(&mut self) -> Result<Option<Message>, RpcFault> {
        match decode(&self.buf[self.start..self.end])? {
            Some((msg, used)) => {
                self.start += used;
                if self.start == self.end {
                    self.start = 0;
                    self.end = 0;
                }
                Ok(Some(msg))
            }
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_from_takes_what_is_there_and_says_eof() {
        use std::io::Write;
        let (mut a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        let mut reader = RpcReader::default();
        // Nothing yet: not the end.
        assert!(!reader.read_from(&mut b).unwrap());
        let mut bytes = Vec::new();
        let msg = Message::Event {
            kind: "k".into(),
            detail: "d".into(),
        };
        encode(&mut bytes, &msg).unwrap();
        a.write_all(&bytes).unwrap();
        assert!(!reader.read_from(&mut b).unwrap());
        assert!(matches!(
            reader.next_message(),
            Ok(Some(Message::Event { .. }))
        ));
        drop(a);
        assert!(reader.read_from(&mut b).unwrap(), "the peer closed");
    }

    #[test]
    fn round_trip_out_of_order_and_split() {
        let msgs = vec![
            Message::Request {
                id: 2,
                op: Op::CallTool {
                    tool: "echo".into(),
                    args: r#"{"text":"hi"}"#.into(),
                    upstream: None,
                },
            },
            Message::Request {
                id: 3,
                op: Op::CallTool {
                    tool: "search".into(),
                    args: "{}".into(),
                    upstream: Some(UpstreamCall {
                        server: "gh".into(),
                        meta: Box::new(CallMeta {
                            progress_token: Some("toolwall-3".into()),
                            client_capabilities: Some(serde_json::json!({"elicitation": {}})),
                            wait_ms: 5,
                            ..CallMeta::default()
                        }),
                    }),
                },
            },
            Message::Request {
                id: 4,
                op: Op::ListUpstream {
                    kind: ListKind::ResourceTemplates,
                    server: "gh".into(),
                    budget: ListingBudget::plain(3, 1 << 20, 10),
                },
            },
            Message::Request {
                id: 5,
                op: Op::Answer {
                    call: 3,
                    answer: RequestAnswer::result(
                        1,
                        serde_json::json!({"action": "accept", "n": -1.5}),
                    ),
                },
            },
            Message::Request {
                id: 6,
                op: Op::Cancel { target: 2 },
            },
            Message::Request {
                id: 7,
                op: Op::Attest,
            },
            Message::Response {
                id: 1,
                ok: Some("[]".into()),
                error: None,
                facts: None,
            },
            Message::Response {
                id: 9,
                ok: None,
                error: Some(RpcError {
                    kind: "busy".into(),
                    message: "queue full".into(),
                }),
                facts: None,
            },
        ];
        let mut wire = Vec::new();
        for m in &msgs {
            encode(&mut wire, m).unwrap();
        }
        // Feed one byte at a time.
        let mut reader = RpcReader::default();
        let mut got = Vec::new();
        for b in &wire {
            reader.spare()[0] = *b;
            reader.filled(1);
            while let Some(m) = reader.next_message().unwrap() {
                got.push(m);
            }
        }
        assert_eq!(got, msgs);
    }

    #[test]
    fn an_operation_without_its_fields_is_malformed() {
        let frame = |v: serde_json::Value| {
            let body = rmp_serde::to_vec_named(&v).unwrap();
            let mut bytes = (body.len() as u32).to_be_bytes().to_vec();
            bytes.extend(body);
            bytes
        };
        // The old shapes (one op name with optional fields; the message's kind as a `type`
        // field), a cancel with no target, a call with no arguments, an answer with no
        // call: none of them is a request.
        for bad in [
            serde_json::json!({"request": {"id": 1, "op": "cancel", "target": 5}}),
            serde_json::json!({"type": "request", "id": 1, "op": {"cancel": {"target": 5}}}),
            serde_json::json!({"request": {"id": 1, "op": {"cancel": {}}}}),
            serde_json::json!({"request": {"id": 1, "op": {"call_tool": {"tool": "echo"}}}}),
            serde_json::json!({"request": {"id": 1, "op": {"answer": {"answer": {"id": 1}}}}}),
            serde_json::json!({"request": {"id": 1, "op": {"attest": null, "cancel": {"target": 1}}}}),
            serde_json::json!({"request": {"id": 1, "op": {"cancel": {"target": 5}}}, "event": {"kind": "k", "detail": "d"}}),
            serde_json::json!({"bogus": {"id": 1}}),
            serde_json::json!({}),
        ] {
            assert!(
                matches!(decode(&frame(bad.clone())), Err(RpcFault::Malformed(_))),
                "{bad}"
            );
        }
        let good =
            frame(serde_json::json!({"request": {"id": 1, "op": {"cancel": {"target": 5}}}}));
        assert_eq!(
            decode(&good).unwrap().unwrap().0,
            Message::Request {
                id: 1,
                op: Op::Cancel { target: 5 }
            }
        );
    }

    /// The worker_rpc fuzz target starts from `fuzz/seeds/worker_rpc`: every seed must be a
    /// run of messages in today's shape, or the fuzzer starts from nothing valid.
    #[test]
    fn the_fuzz_seeds_are_messages_in_todays_shape() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/worker_rpc");
        let seeds = seed_messages();
        if std::env::var_os("TOOLWALL_WRITE_RPC_SEEDS").is_some() {
            for (name, msgs) in &seeds {
                let mut bytes = Vec::new();
                for m in msgs {
                    encode(&mut bytes, m).unwrap();
                }
                std::fs::write(dir.join(name), bytes).unwrap();
            }
        }
        for (name, want) in seeds {
            let bytes = std::fs::read(dir.join(name)).unwrap();
            let mut got = Vec::new();
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                let (m, used) = decode(rest)
                    .unwrap_or_else(|e| {
                        panic!(
                            "seed {name}: {e:?} (rewrite the seeds with TOOLWALL_WRITE_RPC_SEEDS=1)"
                        )
                    })
                    .unwrap_or_else(|| panic!("seed {name} ends in a partial message"));
                got.push(m);
                rest = &rest[used..];
            }
            assert_eq!(got, want, "seed {name}");
        }
    }

    fn seed_messages() -> Vec<(&'static str, Vec<Message>)> {
        let call = Message::Request {
            id: 7,
            op: Op::CallTool {
                tool: "echo".into(),
                args: r#"{"text":"hi"}"#.into(),
                upstream: None,
            },
        };
        vec![
            (
                "request",
                vec![
                    call.clone(),
                    Message::Request {
                        id: 8,
                        op: Op::Cancel { target: 7 },
                    },
                ],
            ),
            (
                "mixed",
                vec![
                    call,
                    Message::Response {
                        id: 7,
                        ok: Some(r#"{"content":[{"type":"text","text":"hi"}]}"#.into()),
                        error: None,
                        facts: None,
                    },
                    Message::Response {
                        id: 8,
                        ok: None,
                        error: Some(RpcError {
                            kind: "busy".into(),
                            message: "the pool is full".into(),
                        }),
                        facts: Some(r#"{"url":"https://example.com/"}"#.into()),
                    },
                    Message::Event {
                        kind: "log".into(),
                        detail: "started".into(),
                    },
                ],
            ),
        ]
    }

    #[test]
    fn oversized_length_refused_before_allocation() {
        let bytes = ((MAX_MESSAGE + 1) as u32).to_be_bytes();
        assert_eq!(decode(&bytes), Err(RpcFault::TooLarge(MAX_MESSAGE + 1)));
    }

    #[test]
    fn garbage_is_malformed_not_panic() {
        let mut bytes = 3u32.to_be_bytes().to_vec();
        bytes.extend([0xc1, 0xff, 0x00]);
        assert!(matches!(decode(&bytes), Err(RpcFault::Malformed(_))));
    }
}
