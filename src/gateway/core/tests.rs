//! The core without sockets, SQLite or clocks: a recorder in memory that can be told to
//! fail, a policy from TOML text, workers played by the test. Each case drives inputs and
//! checks the actions released and the rows as they would be committed.

use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::dispatch::MAX_CANCEL_REASON_CHARS;
use super::*;
use crate::ledger::{CallEnd, CallStart};
use crate::policy::PolicyConfig;
use crate::workers::rpc::{Op, RpcError};

/// One staged record, owned.
#[derive(Debug, Clone)]
pub(super) enum Rec {
    Start {
        id: i64,
        method: String,
        server: String,
        tool: String,
        decision: String,
        rule: Option<String>,
        arguments: String,
    },
    End {
        id: i64,
        decision: String,
        rule: Option<String>,
        error: Option<String>,
        response: String,
        forwarded: Option<String>,
        original: Option<String>,
        approved_by: Option<String>,
    },
    Rule {
        call_id: i64,
        phase: String,
        rule: String,
    },
    Event {
        kind: String,
        detail: Value,
    },
}

/// A `tool_calls` row as the committed records leave it.
#[derive(Debug, Clone, Default)]
pub(super) struct Row {
    pub(super) method: String,
    pub(super) server: String,
    pub(super) tool: String,
    pub(super) decision: String,
    pub(super) rule: Option<String>,
    pub(super) error: Option<String>,
    pub(super) response: String,
    pub(super) arguments: String,
    pub(super) forwarded: Option<String>,
    pub(super) original: Option<String>,
    pub(super) approved_by: Option<String>,
}

#[derive(Default)]
pub(super) struct Memory {
    next_id: i64,
    staged: Vec<Rec>,
    pub(super) committed: Vec<Rec>,
    /// The next commits fail while set (disk full, a foreign write lock).
    pub(super) failing: bool,
}

impl Recorder for Memory {
    fn new_call_id(&mut self) -> i64 {
        self.next_id += 1;
        self.next_id
    }
    fn stage_call(&mut self, c: &CallStart) {
        self.staged.push(Rec::Start {
            id: c.id,
            method: c.method.into(),
            server: c.server_name.into(),
            tool: c.tool_name.into(),
            decision: c.decision.into(),
            rule: c.policy_rule.map(Into::into),
            arguments: String::from_utf8_lossy(c.arguments).into(),
        });
    }
    fn stage_call_end(&mut self, id: i64, e: &CallEnd) {
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        self.staged.push(Rec::End {
            id,
            decision: e.decision.into(),
            rule: e.policy_rule.map(Into::into),
            error: e.error_message.map(Into::into),
            response: text(e.response),
            forwarded: e.rewritten_arguments.map(text),
            original: e.original_response.map(text),
            approved_by: e.approved_by.map(Into::into),
        });
    }
    fn stage_rule_event(
        &mut self,
        call_id: i64,
        _: u32,
        rule: &str,
        _: &str,
        phase: &str,
        _: &str,
    ) {
        self.staged.push(Rec::Rule {
            call_id,
            phase: phase.into(),
            rule: rule.into(),
        });
    }
    fn stage_event(&mut self, kind: &str, detail: &Value) {
        self.staged.push(Rec::Event {
            kind: kind.into(),
            detail: detail.clone(),
        });
    }
    fn staged(&self) -> usize {
        self.staged.len()
    }
}

impl Memory {
    pub(super) fn commit(&mut self) -> Result<(), String> {
        if self.failing {
            return Err("disk full".into());
        }
        self.committed.append(&mut self.staged);
        Ok(())
    }

    pub(super) fn rows(&self) -> BTreeMap<i64, Row> {
        let mut rows: BTreeMap<i64, Row> = BTreeMap::new();
        for rec in &self.committed {
            match rec {
                Rec::Start {
                    id,
                    method,
                    server,
                    tool,
                    decision,
                    rule,
                    arguments,
                } => {
                    rows.insert(
                        *id,
                        Row {
                            method: method.clone(),
                            server: server.clone(),
                            tool: tool.clone(),
                            decision: decision.clone(),
                            rule: rule.clone(),
                            arguments: arguments.clone(),
                            ..Row::default()
                        },
                    );
                }
                Rec::End {
                    id,
                    decision,
                    rule,
                    error,
                    response,
                    forwarded,
                    original,
                    approved_by,
                } => {
                    let row = rows.entry(*id).or_default();
                    if approved_by.is_some() {
                        row.approved_by = approved_by.clone();
                    }
                    row.decision = decision.clone();
                    if rule.is_some() {
                        row.rule = rule.clone();
                    }
                    row.error = error.clone();
                    row.response = response.clone();
                    row.forwarded = forwarded.clone();
                    row.original = original.clone();
                }
                Rec::Rule { .. } | Rec::Event { .. } => {}
            }
        }
        rows
    }

    pub(super) fn rules_of(&self, id: i64, phase: &str) -> Vec<String> {
        self.committed
            .iter()
            .filter_map(|r| match r {
                Rec::Rule {
                    call_id,
                    phase: p,
                    rule,
                } if *call_id == id && p == phase => Some(rule.clone()),
                _ => None,
            })
            .collect()
    }

    /// The details of the committed events of `kind`, in order.
    pub(super) fn event_details(&self, kind: &str) -> Vec<Value> {
        self.committed
            .iter()
            .filter_map(|r| match r {
                Rec::Event { kind: k, detail } if k == kind => Some(detail.clone()),
                _ => None,
            })
            .collect()
    }

    pub(super) fn events(&self, kind: &str) -> usize {
        self.committed
            .iter()
            .filter(|r| matches!(r, Rec::Event { kind: k, .. } if k == kind))
            .count()
    }
}

pub(super) fn policy(text: &str) -> Rc<Policy> {
    #[derive(serde::Deserialize)]
    struct Wrapper {
        #[serde(default)]
        policy: PolicyConfig,
    }
    let cfg = toml::from_str::<Wrapper>(text).expect("policy toml").policy;
    Rc::new(Policy::load_with_corp_env(&cfg, "test.toml", None).expect("policy loads"))
}

pub(super) const AGENT: ConnRef = ConnRef {
    slot: 1,
    generation: 1,
};

/// A core with one worker (`local`) serving tools, a resource and a prompt.
pub(super) struct Harness {
    pub(super) core: Core<Memory>,
    pub(super) now: Instant,
    pub(super) peer: Peer,
    pub(super) next_id: u64,
}

impl Harness {
    pub(super) fn new(policy_text: &str) -> Harness {
        let now = Instant::now();
        let mut core = Core::new(
            GatewayConfig::default(),
            policy(policy_text),
            Memory::default(),
            now,
            1_700_000_000_000,
        );
        let worker = core.add_worker("builtin", "local");
        let mut h = Harness {
            core,
            now,
            peer: Peer {
                transport: Transport::Unix,
                principal: "uid:1000".into(),
                process: "agent".into(),
            },
            next_id: 0,
        };
        h.core.on_worker_ready(worker, now);
        // Answer the three listings.
        for action in h.turn() {
            let Action::ToWorker {
                msg: rpc::Message::Request { id, op, .. },
                ..
            } = action
            else {
                continue;
            };
            let items = match op {
                Op::List {
                    kind: rpc::ListKind::Tools,
                } => json!([
                    {"name": "echo", "inputSchema": {"type": "object"}},
                    {"name": "leak", "inputSchema": {"type": "object"}}
                ]),
                Op::List {
                    kind: rpc::ListKind::Resources,
                } => json!([{"uri": "file:///report", "name": "report"}]),
                Op::List {
                    kind: rpc::ListKind::Prompts,
                } => json!([{"name": "greet"}]),
                _ => continue,
            };
            h.worker_ok(id, &items.to_string());
        }
        h.turn();
        h.core.on_connect(AGENT, &h.peer.clone());
        h.turn();
        h
    }

    /// One loop turn: commit, tell the core, release.
    pub(super) fn turn(&mut self) -> Vec<Action> {
        if self.core.records().staged() > 0 {
            let outcome = self.core.records_mut().commit();
            self.core.after_commit(outcome, Duration::ZERO);
        }
        self.core.take_actions()
    }

    pub(super) fn send(&mut self, method: &str, params: Value) -> u64 {
        self.next_id += 1;
        let msg = json!({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params});
        self.send_raw(&msg.to_string());
        self.next_id
    }

    pub(super) fn send_raw(&mut self, payload: &str) {
        let peer = self.peer.clone();
        self.core.on_message(
            AGENT,
            &peer,
            "agent",
            Expect::Any,
            0,
            payload.as_bytes(),
            self.now,
        );
    }

    pub(super) fn worker_ok(&mut self, id: u64, text: &str) {
        let msg = rpc::Message::Response {
            id,
            ok: Some(text.into()),
            error: None,
            facts: None,
        };
        self.core.on_worker_message(0, msg, self.now);
    }

    pub(super) fn worker_err(&mut self, id: u64, message: &str) {
        let msg = rpc::Message::Response {
            id,
            ok: None,
            error: Some(RpcError {
                kind: "upstream_error".into(),
                message: message.into(),
            }),
            facts: None,
        };
        self.core.on_worker_message(0, msg, self.now);
    }

    pub(super) fn rows(&self) -> BTreeMap<i64, Row> {
        self.core.records().rows()
    }

    pub(super) fn last_row(&self) -> Row {
        self.rows().into_values().last().expect("a row")
    }
}

/// The one call at a worker among `actions`: (rpc id, op name, target's own name, args
/// or params).
pub(super) fn to_worker(actions: &[Action]) -> Option<(u64, &'static str, String, String)> {
    actions.iter().find_map(|a| match a {
        Action::ToWorker {
            msg: rpc::Message::Request { id, op },
            call: Some(_),
            ..
        } => {
            let (name, args) = match op {
                Op::CallTool { tool, args, .. } => (tool.clone(), args.clone()),
                Op::GetPrompt { prompt, params, .. } => (prompt.clone(), params.clone()),
                Op::ReadResource { params, .. } => {
                    let uri = serde_json::from_str::<Value>(params).ok()?["uri"].clone();
                    (uri.as_str()?.to_owned(), params.clone())
                }
                _ => return None,
            };
            Some((*id, op.name(), name, args))
        }
        _ => None,
    })
}

/// The answer the agent got: (raw bytes, parsed).
pub(super) fn reply(actions: &[Action]) -> Option<(Vec<u8>, Value)> {
    actions.iter().find_map(|a| match a {
        Action::Reply { bytes, .. } => Some((
            bytes.clone(),
            serde_json::from_slice(bytes).expect("answer is JSON"),
        )),
        _ => None,
    })
}

const PEM: &str = "-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----";

#[test]
fn forwarded_arguments_are_the_judged_ones_and_answers_are_reserialized() {
    let mut h = Harness::new("");
    // Duplicate keys: policy sees the last value, and so does the worker.
    h.send_raw(
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"local__echo","arguments":{"text":"TOPSECRET","text":"ok"}}}"#,
    );
    let actions = h.turn();
    let (rpc_id, op, name, args) = to_worker(&actions).expect("sent to the worker");
    assert_eq!((op, name.as_str()), ("call_tool", "echo"));
    assert_eq!(args, r#"{"text":"ok"}"#, "the worker gets what was judged");
    // An answer with newlines between tokens (a forged second message on stdio).
    h.worker_ok(
        rpc_id,
        "{\"content\":[{\"type\":\"text\",\"text\":\"ok\"}]}\n{\"jsonrpc\":\"2.0\",\"id\":9,\"result\":{}}",
    );
    assert!(reply(&h.turn()).is_some_and(|(_, v)| v["result"]["isError"] == true));
    let row = h.last_row();
    assert_eq!(
        row.decision, "error",
        "a result that is not one JSON object"
    );

    h.send(
        "tools/call",
        json!({"name": "local__echo", "arguments": {"text": "hi"}}),
    );
    let (rpc_id, ..) = to_worker(&h.turn()).expect("sent");
    h.worker_ok(
        rpc_id,
        "{\n  \"content\" : [ {\"type\":\"text\",\"text\":\"hi\"} ]\n}",
    );
    let (bytes, v) = reply(&h.turn()).expect("answered");
    assert!(!bytes.contains(&b'\n'), "no raw newline reaches an agent");
    assert_eq!(v["result"]["content"][0]["text"], "hi");
    let row = h.last_row();
    assert_eq!(
        (row.decision.as_str(), row.method.as_str()),
        ("allowed", "tools/call")
    );
}

#[test]
fn the_response_phase_judges_errors_and_every_method() {
    let rule = r#"
[[policy.rules]]
id = "no-respblock"
action = "block"
phase = "response"
result = { matches = "RESPBLOCK" }
"#;
    // (method, params, what the worker answers: Ok text or Err message, rule expected)
    let pem_result = json!({"content": [{"type": "text", "text": PEM}]}).to_string();
    let split_pem = json!({"content": [{"type": "text", "text": "-----BEGIN RSA PRIV"},
                                       {"type": "text", "text": "ATE KEY-----\nMIIB"}]})
    .to_string();
    let split_word =
        json!({"content": [{"type": "text", "text": "RESP"}, {"type": "text", "text": "BLOCK"}]})
            .to_string();
    let pem_resource = json!({"contents": [{"uri": "file:///report", "text": PEM}]}).to_string();
    let pem_prompt =
        json!({"messages": [{"role": "user", "content": {"type": "text", "text": PEM}}]})
            .to_string();
    let cases: Vec<(&str, Value, Result<String, String>, &str)> = vec![
        (
            "tools/call",
            json!({"name": "local__leak"}),
            Ok(pem_result),
            "builtin-private-key-in-result",
        ),
        (
            "tools/call",
            json!({"name": "local__leak"}),
            Err(format!("upstream said: {PEM}")),
            "builtin-private-key-in-result",
        ),
        (
            "tools/call",
            json!({"name": "local__leak"}),
            Ok(split_pem),
            "builtin-private-key-in-result",
        ),
        (
            "tools/call",
            json!({"name": "local__leak"}),
            Ok(split_word),
            "no-respblock",
        ),
        (
            "resources/read",
            json!({"uri": "file:///report"}),
            Ok(pem_resource),
            "builtin-private-key-in-result",
        ),
        (
            "resources/read",
            json!({"uri": "file:///report"}),
            Err(format!("no: {PEM}")),
            "builtin-private-key-in-result",
        ),
        (
            "prompts/get",
            json!({"name": "local__greet"}),
            Ok(pem_prompt),
            "builtin-private-key-in-result",
        ),
        (
            "prompts/get",
            json!({"name": "local__greet"}),
            Err(format!("bad {PEM}")),
            "builtin-private-key-in-result",
        ),
    ];
    for (method, params, answer, rule_id) in cases {
        let mut h = Harness::new(rule);
        h.send(method, params.clone());
        let (rpc_id, ..) = to_worker(&h.turn()).unwrap_or_else(|| panic!("{method} not sent"));
        match &answer {
            Ok(text) => h.worker_ok(rpc_id, text),
            Err(message) => h.worker_err(rpc_id, message),
        }
        let (bytes, _) = reply(&h.turn()).expect("answered");
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            !text.contains("BEGIN RSA") && !text.contains("RESPBLOCK") && !text.contains("MIIB"),
            "{method} {answer:?} leaked: {text}"
        );
        let row = h.last_row();
        assert_eq!(row.method, method);
        assert_eq!(row.decision, "denied", "{method} {answer:?}");
        assert_eq!(row.rule.as_deref(), Some(rule_id), "{method} {answer:?}");
        assert!(row.original.is_some(), "the ledger keeps what was refused");
        assert_eq!(
            h.core.records().rules_of(1, "response"),
            vec![rule_id.to_owned()]
        );
    }
}

#[test]
fn resources_and_prompts_get_rows_like_tool_calls() {
    let mut h = Harness::new("");
    h.send("resources/read", json!({"uri": "file:///report"}));
    let (rpc_id, op, name, _) = to_worker(&h.turn()).expect("sent");
    assert_eq!((op, name.as_str()), ("read_resource", "file:///report"));
    h.worker_ok(
        rpc_id,
        r#"{"contents":[{"uri":"file:///report","text":"fine"}]}"#,
    );
    assert!(reply(&h.turn()).is_some_and(|(_, v)| v["result"]["contents"][0]["text"] == "fine"));
    let row = h.last_row();
    assert_eq!(
        (
            row.method.as_str(),
            row.tool.as_str(),
            row.decision.as_str()
        ),
        ("resources/read", "file:///report", "allowed")
    );
    h.send(
        "prompts/get",
        json!({"name": "local__greet", "arguments": {"who": "x"}}),
    );
    let (rpc_id, op, _, args) = to_worker(&h.turn()).expect("sent");
    assert_eq!(op, "get_prompt");
    let forwarded: Value = serde_json::from_str(&args).expect("json");
    assert_eq!(forwarded["name"], "greet", "the upstream's own name");
    h.worker_ok(rpc_id, r#"{"messages":[]}"#);
    h.turn();
    let row = h.last_row();
    assert_eq!(
        (
            row.method.as_str(),
            row.server.as_str(),
            row.tool.as_str(),
            row.decision.as_str()
        ),
        ("prompts/get", "local", "greet", "allowed")
    );
    // Unknown targets still get a row.
    h.send("resources/read", json!({"uri": "file:///nope"}));
    let (_, v) = reply(&h.turn()).expect("answered");
    assert_eq!(v["error"]["code"], -32002);
    assert_eq!(h.last_row().decision, "error");
    h.send("resources/read", json!({}));
    let (_, v) = reply(&h.turn()).expect("answered");
    assert_eq!(v["error"]["code"], -32602);
    assert_eq!(h.rows().len(), 4);
}

#[test]
fn a_request_rule_blocks_a_resource_with_a_row() {
    let mut h = Harness::new(
        r#"
[[policy.rules]]
id = "no-report"
action = "block"
method = "resources/read"
resource = "file:///report"
"#,
    );
    h.send("resources/read", json!({"uri": "file:///report"}));
    let actions = h.turn();
    assert!(to_worker(&actions).is_none(), "never reaches the worker");
    let (_, v) = reply(&actions).expect("answered");
    assert_eq!(v["error"]["code"], jsonrpc_code("policy"));
    let row = h.last_row();
    assert_eq!(
        (row.decision.as_str(), row.rule.as_deref()),
        ("denied", Some("no-report"))
    );
}

fn jsonrpc_code(what: &str) -> i64 {
    match what {
        "policy" => crate::mcp::jsonrpc::POLICY_BLOCKED,
        _ => crate::mcp::jsonrpc::LEDGER_UNAVAILABLE,
    }
}

#[test]
fn a_failed_commit_refuses_and_the_rows_say_so() {
    let mut h = Harness::new("");
    // The call's dispatch row cannot be committed: it must not reach the tool.
    h.core.records_mut().failing = true;
    h.send(
        "tools/call",
        json!({"name": "local__echo", "arguments": {"text": "x"}}),
    );
    let actions = h.turn();
    assert!(to_worker(&actions).is_none(), "no row on disk, no call");
    let (_, v) = reply(&actions).expect("refused");
    assert_eq!(
        v["result"]["structuredContent"]["error"]["code"],
        "ledger_unavailable"
    );
    assert!(!h.core.ledger_ok());
    h.core.records_mut().failing = false;
    h.turn();
    let row = h.last_row();
    assert_eq!(
        row.decision, "error",
        "recorded as refused once it can be: {row:?}"
    );

    // The answer's row cannot be committed: withheld, and recorded as such.
    h.send(
        "tools/call",
        json!({"name": "local__echo", "arguments": {"text": "y"}}),
    );
    let (rpc_id, ..) = to_worker(&h.turn()).expect("sent");
    h.core.records_mut().failing = true;
    h.worker_ok(rpc_id, r#"{"content":[{"type":"text","text":"y"}]}"#);
    let (_, v) = reply(&h.turn()).expect("answered");
    assert_eq!(v["error"]["code"], jsonrpc_code("ledger"));
    h.core.records_mut().failing = false;
    h.turn();
    let row = h.last_row();
    assert_eq!(row.decision, "error", "{row:?}");
    assert!(row.error.as_deref().is_some_and(|e| e.contains("withheld")));
    assert_eq!(row.response, "", "no preview of an answer nobody got");
}

#[test]
fn asks_approve_deny_time_out_and_follow_a_reload() {
    let ask = r#"
[policy]
ask_timeout_secs = 5
[[policy.rules]]
id = "ask-echo"
action = "ask"
tool = "local__echo"
"#;
    // approve
    let mut h = Harness::new(ask);
    h.send(
        "tools/call",
        json!({"name": "local__echo", "arguments": {"text": "a"}}),
    );
    assert!(h.turn().is_empty(), "held: no answer, no worker request");
    let pending = h.core.pending_approvals(h.now);
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].tool, "local__echo");
    let now = h.now;
    h.core
        .decide_approval(pending[0].id, true, "admin", None, now)
        .expect("approve");
    let (rpc_id, ..) = to_worker(&h.turn()).expect("sent after approval");
    h.worker_ok(rpc_id, r#"{"content":[]}"#);
    h.turn();
    assert_eq!(h.last_row().decision, "allowed");
    // deny
    h.send(
        "tools/call",
        json!({"name": "local__echo", "arguments": {"text": "b"}}),
    );
    h.turn();
    let id = h.core.pending_approvals(h.now)[0].id;
    h.core
        .decide_approval(id, false, "admin", Some("no"), now)
        .expect("deny");
    let (_, v) = reply(&h.turn()).expect("answered");
    assert_eq!(
        v["result"]["structuredContent"]["error"]["code"],
        "ask_denied"
    );
    assert_eq!(h.last_row().decision, "denied");
    // time out
    h.send(
        "tools/call",
        json!({"name": "local__echo", "arguments": {"text": "c"}}),
    );
    h.turn();
    h.core.on_timers(now + Duration::from_secs(6));
    let (_, v) = reply(&h.turn()).expect("answered");
    assert_eq!(
        v["result"]["structuredContent"]["error"]["code"],
        "ask_timeout"
    );
    // a reload that blocks the held call: it cannot be approved any more
    h.send(
        "tools/call",
        json!({"name": "local__echo", "arguments": {"text": "d"}}),
    );
    h.turn();
    let id = h.core.pending_approvals(h.now)[0].id;
    let blocking = r#"
[[policy.rules]]
id = "no-echo"
action = "block"
tool = "local__echo"
"#;
    h.core.set_policy(policy(blocking), now);
    let (_, v) = reply(&h.turn()).expect("answered");
    assert_eq!(
        v["result"]["structuredContent"]["error"]["code"],
        "policy_blocked"
    );
    assert!(
        h.core
            .decide_approval(id, true, "admin", None, now)
            .is_err()
    );
    assert!(to_worker(&h.turn()).is_none());
    let row = h.last_row();
    assert_eq!(
        (row.decision.as_str(), row.rule.as_deref()),
        ("denied", Some("no-echo"))
    );
}

#[test]
fn an_approved_ask_never_runs_without_its_row_or_its_agent() {
    let ask = r#"
[[policy.rules]]
id = "ask-echo"
action = "ask"
tool = "local__echo"
"#;
    // The agent leaves while held: the ask ends, an approval finds nothing.
    let mut h = Harness::new(ask);
    h.send(
        "tools/call",
        json!({"name": "local__echo", "arguments": {"text": "a"}}),
    );
    h.turn();
    let id = h.core.pending_approvals(h.now)[0].id;
    let (now, peer) = (h.now, h.peer.clone());
    h.core.on_disconnect(AGENT, &peer, now);
    assert!(
        h.core
            .decide_approval(id, true, "admin", None, now)
            .is_err()
    );
    assert!(to_worker(&h.turn()).is_none());
    assert_eq!(h.last_row().decision, "cancelled");
    assert_eq!(h.core.records().events("ask_dropped"), 1);

    // The approval's commit fails: the call is not made.
    let mut h = Harness::new(ask);
    h.send(
        "tools/call",
        json!({"name": "local__echo", "arguments": {"text": "a"}}),
    );
    h.turn();
    let id = h.core.pending_approvals(h.now)[0].id;
    h.core.records_mut().failing = true;
    h.core
        .decide_approval(id, true, "admin", None, now)
        .expect("approve");
    let actions = h.turn();
    assert!(
        to_worker(&actions).is_none(),
        "approved but unrecorded: not sent"
    );
    h.core.records_mut().failing = false;
    h.turn();
    assert_eq!(h.last_row().decision, "error");
}

#[test]
fn asks_are_refused_where_the_agent_could_answer_them() {
    let mut h = Harness::new(
        r#"
[[policy.rules]]
id = "ask-echo"
action = "ask"
tool = "local__echo"
"#,
    );
    h.core.set_ask_route(AskRoute::Refuse);
    h.send(
        "tools/call",
        json!({"name": "local__echo", "arguments": {"text": "a"}}),
    );
    let actions = h.turn();
    assert!(h.core.pending_approvals(h.now).is_empty());
    let (_, v) = reply(&actions).expect("refused at once");
    assert_eq!(
        v["result"]["structuredContent"]["error"]["code"],
        "ask_denied"
    );
    assert_eq!(h.last_row().decision, "denied");
}

#[test]
fn cancel_worker_gone_and_timeouts_end_the_row() {
    let mut h = Harness::new("");
    let id = h.send(
        "tools/call",
        json!({"name": "local__echo", "arguments": {"text": "a"}}),
    );
    let (rpc_id, ..) = to_worker(&h.turn()).expect("sent");
    h.send_raw(
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": id}})
            .to_string(),
    );
    let actions = h.turn();
    assert!(
        reply(&actions).is_none(),
        "no answer for a cancelled request"
    );
    assert!(actions.iter().any(|a| matches!(a,
        Action::ToWorker { msg: rpc::Message::Request { op: Op::Cancel { target: t }, .. }, .. } if *t == rpc_id)));
    assert!(
        h.last_row()
            .error
            .as_deref()
            .is_some_and(|e| e.starts_with("cancelled"))
    );
    // A late answer is dropped.
    h.worker_ok(rpc_id, r#"{"content":[]}"#);
    assert!(reply(&h.turn()).is_none());
    // Cancels for nothing of this agent's (the one already cancelled, ids that never
    // were) are counted, not recorded: one agent must not fill the ledger with them.
    let before = h.core.records().events("cancelled");
    assert_eq!(before, 1);
    for n in 0..1000 {
        let target = if n == 0 {
            json!(id)
        } else {
            json!(format!("nope-{n}"))
        };
        h.send_raw(
            &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                    "params": {"requestId": target, "reason": "R".repeat(2000)}})
            .to_string(),
        );
    }
    h.turn();
    assert_eq!(h.core.records().events("cancelled"), before);
    let reasons = h.core.records().event_details("cancelled");
    assert!(reasons[0]["reason"].as_str().unwrap().len() <= MAX_CANCEL_REASON_CHARS);

    h.send(
        "tools/call",
        json!({"name": "local__echo", "arguments": {"text": "b"}}),
    );
    h.turn();
    let now = h.now;
    h.core.on_worker_gone(0, "killed", now);
    let (_, v) = reply(&h.turn()).expect("answered");
    assert_eq!(
        v["result"]["structuredContent"]["error"]["code"],
        "worker_unavailable"
    );
    assert_eq!(h.last_row().decision, "error");
}

#[test]
fn a_tool_call_timeout_names_its_key() {
    let mut h = Harness::new("");
    h.send(
        "tools/call",
        json!({"name": "local__echo", "arguments": {"text": "b"}}),
    );
    let (rpc_id, ..) = to_worker(&h.turn()).expect("sent");
    let later = h.now + Duration::from_secs(301);
    h.core.on_timers(later);
    let actions = h.turn();
    let (_, v) = reply(&actions).expect("answered");
    let message = v["result"]["structuredContent"]["error"]["message"]
        .as_str()
        .unwrap_or("");
    assert!(
        message.contains("gateway.tool_call_timeout_secs"),
        "{message}"
    );
    assert!(actions.iter().any(|a| matches!(a,
        Action::ToWorker { msg: rpc::Message::Request { op: Op::Cancel { target: t }, .. }, .. } if *t == rpc_id)));
}

#[test]
fn malformed_and_unknown_calls_still_get_rows() {
    let mut h = Harness::new("");
    for params in [
        json!({}),
        json!({"name": 7}),
        json!({"name": "local__echo", "arguments": [1]}),
        json!({"name": "local__nope"}),
    ] {
        h.send("tools/call", params.clone());
        let (_, v) = reply(&h.turn()).expect("answered");
        assert_eq!(v["error"]["code"], -32602, "{params}");
        assert_eq!(h.last_row().decision, "error", "{params}");
    }
    assert_eq!(h.rows().len(), 4);
}

#[test]
fn the_row_keeps_what_arrived_and_what_was_forwarded() {
    let mut h = Harness::new(
        r#"
[[policy.rules]]
id = "redact"
action = "rewrite"
tool = "local__echo"
replace = { path = "text", matches = "secret", with = "***" }
"#,
    );
    h.send_raw(
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"local__echo","arguments":{"text":"a secret"}}}"#,
    );
    let (rpc_id, _, _, args) = to_worker(&h.turn()).expect("sent");
    assert_eq!(args, r#"{"text":"a ***"}"#);
    h.worker_ok(rpc_id, r#"{"content":[]}"#);
    h.turn();
    let row = h.last_row();
    assert_eq!(row.arguments, r#"{"text":"a secret"}"#);
    assert_eq!(row.forwarded.as_deref(), Some(r#"{"text":"a ***"}"#));
    assert_eq!(
        h.core.records().rules_of(1, "request"),
        vec!["redact".to_owned()]
    );
}

#[test]
fn policy_decisions_count_decisions_not_failures() {
    let mut h = Harness::new("");
    h.send(
        "tools/call",
        json!({"name": "local__echo", "arguments": {"text": "b"}}),
    );
    h.turn();
    let now = h.now;
    h.core.on_worker_gone(0, "killed", now);
    h.turn();
    let decisions = h.core.observed.policy_decisions();
    let counted: u64 = decisions.values().sum();
    assert_eq!(counted, 1, "{decisions:?}");
    assert!(decisions.contains_key(&("default".to_owned(), "allow")));
}

#[test]
fn a_rewrite_cannot_assemble_what_a_block_rule_refuses() {
    // Response: stripping a zero-width space would complete a private key header.
    let mut h = Harness::new(
        r#"
[[policy.rules]]
id = "strip-zw"
action = "rewrite"
phase = "response"
replace = { matches = "\u200b", with = "" }
"#,
    );
    h.send("tools/call", json!({"name": "local__leak"}));
    let (rpc_id, ..) = to_worker(&h.turn()).expect("sent");
    let text = PEM.replace("PRIVATE KEY-----\nMIIB", "PRIVATE \u{200b}KEY-----\nMIIB");
    h.worker_ok(
        rpc_id,
        &json!({"content": [{"type": "text", "text": text}]}).to_string(),
    );
    let (bytes, _) = reply(&h.turn()).expect("answered");
    assert!(!String::from_utf8_lossy(&bytes).contains("MIIB"));
    let row = h.last_row();
    assert_eq!(
        (row.decision.as_str(), row.rule.as_deref()),
        ("denied", Some("builtin-private-key-in-result"))
    );
    assert_eq!(
        h.core.records().rules_of(1, "response_rewritten"),
        vec![
            "builtin-private-key-in-result".to_owned(),
            "strip-zw".to_owned()
        ]
    );
    // Request: a rewrite that produces blocked arguments is refused before the worker.
    let mut h = Harness::new(
        r#"
[[policy.rules]]
id = "expand"
action = "rewrite"
tool = "local__echo"
replace = { path = "text", matches = "SAFE", with = "evil" }

[[policy.rules]]
id = "no-evil"
action = "block"
arg = { contains = "evil" }
"#,
    );
    h.send(
        "tools/call",
        json!({"name": "local__echo", "arguments": {"text": "SAFE"}}),
    );
    let actions = h.turn();
    assert!(to_worker(&actions).is_none(), "never sent");
    assert_eq!(h.last_row().rule.as_deref(), Some("no-evil"));
}

#[test]
fn every_input_wrapper_is_unwrapped_before_policy() {
    let mut h = Harness::new(
        r#"
[[policy.rules]]
id = "no-evil"
action = "block"
tool = "local__echo"
arg = { path = "text", contains = "evil" }
"#,
    );
    for args in [
        json!({"text": "evil"}),
        json!({"input": {"text": "evil"}}),
        json!({"input": {"input": {"input": {"text": "evil"}}}}),
    ] {
        h.send(
            "tools/call",
            json!({"name": "local__echo", "arguments": args}),
        );
        let actions = h.turn();
        assert!(to_worker(&actions).is_none(), "{args} reached the worker");
        assert_eq!(h.last_row().rule.as_deref(), Some("no-evil"), "{args}");
    }
    // What passes reaches the worker exactly as judged.
    h.send(
        "tools/call",
        json!({"name": "local__echo", "arguments": {"input": {"input": {"text": "fine"}}}}),
    );
    let (_, _, _, args) = to_worker(&h.turn()).expect("sent");
    assert_eq!(args, r#"{"text":"fine"}"#);
}

#[test]
fn a_split_across_prompt_messages_is_found() {
    let mut h = Harness::new("");
    h.send("prompts/get", json!({"name": "local__greet"}));
    let (rpc_id, ..) = to_worker(&h.turn()).expect("sent");
    h.worker_ok(
        rpc_id,
        &json!({"messages": [
            {"role": "user", "content": {"type": "text", "text": "-----BEGIN RSA PRIV"}},
            {"role": "user", "content": {"type": "text", "text": "ATE KEY-----\nMIIB"}}]})
        .to_string(),
    );
    let (bytes, _) = reply(&h.turn()).expect("answered");
    assert!(!String::from_utf8_lossy(&bytes).contains("MIIB"));
    assert_eq!(h.last_row().decision, "denied");
}

#[test]
fn an_agent_that_stops_sending_cannot_have_its_held_call_approved() {
    let mut h = Harness::new(
        r#"
[[policy.rules]]
id = "ask-echo"
action = "ask"
tool = "local__echo"
"#,
    );
    h.send(
        "tools/call",
        json!({"name": "local__echo", "arguments": {"text": "a"}}),
    );
    h.turn();
    let id = h.core.pending_approvals(h.now)[0].id;
    let now = h.now;
    h.core.on_agent_eof(AGENT, now);
    let actions = h.turn();
    assert!(
        h.core
            .decide_approval(id, true, "admin", None, now)
            .is_err()
    );
    assert!(to_worker(&actions).is_none() && to_worker(&h.turn()).is_none());
    assert_eq!(h.last_row().decision, "cancelled");
}

#[test]
fn duplicate_arguments_keys_keep_what_arrived_on_the_row() {
    let mut h = Harness::new("");
    let raw = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"local__echo","arguments":{"text":"a"},"arguments":{"text":"b"}}}"#;
    h.send_raw(raw);
    let (rpc_id, _, _, args) = to_worker(&h.turn()).expect("sent");
    assert_eq!(args, r#"{"text":"b"}"#, "judged and forwarded: the last");
    h.worker_ok(rpc_id, r#"{"content":[]}"#);
    h.turn();
    let row = h.last_row();
    assert!(row.arguments.contains(r#""text":"a""#) && row.arguments.contains(r#""text":"b""#));
    assert_eq!(row.forwarded.as_deref(), Some(r#"{"text":"b"}"#));
}

#[test]
fn an_answer_larger_than_a_door_carries_is_refused_and_recorded() {
    let mut h = Harness::new("");
    h.send(
        "tools/call",
        json!({"name": "local__echo", "arguments": {"text": "x"}}),
    );
    let (rpc_id, ..) = to_worker(&h.turn()).expect("sent");
    let big = "a".repeat(1024 * 1024 + 10);
    h.worker_ok(
        rpc_id,
        &json!({"content": [{"type": "text", "text": big}]}).to_string(),
    );
    let (bytes, v) = reply(&h.turn()).expect("answered");
    assert!(bytes.len() < 4096);
    assert_eq!(
        v["result"]["structuredContent"]["error"]["code"],
        "too_large"
    );
    let row = h.last_row();
    assert_eq!(row.decision, "error");
    assert!(
        row.original.is_some_and(|o| o.len() > 1024 * 1024),
        "the row keeps what came"
    );
}

#[test]
fn spaces_between_tokens_keep_no_second_copy_but_other_differences_do() {
    let mut h = Harness::new("");
    // Python's json.dumps: a space after every ':' and ','. The compact text follows from it.
    let spaced = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"local__echo","arguments": {"n": [1, 2], "text": "a b"}}}"#;
    h.send_raw(spaced);
    let (rpc_id, _, _, args) = to_worker(&h.turn()).expect("sent");
    assert_eq!(args, r#"{"n":[1,2],"text":"a b"}"#);
    h.worker_ok(rpc_id, r#"{"content":[]}"#);
    h.turn();
    let row = h.last_row();
    assert!(
        row.arguments.contains(r#""text": "a b""#),
        "{}",
        row.arguments
    );
    assert_eq!(row.forwarded, None, "whitespace alone is no difference");

    // An escape the compact form spells otherwise is a difference: both are kept.
    let escaped = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"local__echo","arguments":{"text":"\u0041"}}}"#;
    h.send_raw(escaped);
    let (rpc_id, _, _, args) = to_worker(&h.turn()).expect("sent");
    assert_eq!(args, r#"{"text":"A"}"#);
    h.worker_ok(rpc_id, r#"{"content":[]}"#);
    h.turn();
    assert_eq!(h.last_row().forwarded.as_deref(), Some(r#"{"text":"A"}"#));
}
