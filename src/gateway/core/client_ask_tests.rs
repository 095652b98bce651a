//! `ask_via = "client"` without sockets: the legacy question and its answer, the modern
//! `input_required` and the retry that must carry an intact, fresh, unused approval for
//! exactly this principal, tool and arguments under the same deciding rule.

use serde_json::{Value, json};
use std::rc::Rc;
use std::time::Duration;

use super::tests::{AGENT, Harness, policy, reply, to_worker};
use super::*;
use crate::mcp::client_caps::ClientCaps;
use crate::policy::PolicyConfig;

const ASK_AT_CLIENT: &str = r#"
[[policy.rules]]
id = "ask-echo"
action = "ask"
tool = "local__echo"
ask_via = "client"
reason = "echo needs a human"
"#;

fn relays(actions: &[Action]) -> Vec<(Value, Option<String>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Relay {
                bytes, request_id, ..
            } => Some((serde_json::from_slice(bytes).unwrap(), request_id.clone())),
            _ => None,
        })
        .collect()
}

fn legacy(h: &mut Harness, caps: Value) {
    h.send(
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": caps, "clientInfo": {"name": "t"}}),
    );
    h.turn();
}

#[test]
fn a_legacy_client_that_can_elicit_is_asked_and_its_answer_decides() {
    let mut h = Harness::new(ASK_AT_CLIENT);
    legacy(&mut h, json!({"elicitation": {}}));
    h.send(
        "tools/call",
        json!({"name": "local__echo", "arguments": {"text": "hi", "path": "/etc/\u{1b}[2Jx"}}),
    );
    let actions = h.turn();
    assert!(to_worker(&actions).is_none(), "held");
    let r = relays(&actions);
    assert_eq!(r.len(), 1);
    let (msg, id) = &r[0];
    assert_eq!(msg["method"], "elicitation/create");
    let text = msg["params"]["message"].as_str().unwrap();
    assert!(
        text.contains("local__echo") && text.contains(r#""text": "hi""#),
        "{text}"
    );
    assert!(text.contains("echo needs a human"), "{text}");
    assert!(
        !text.contains('\u{1b}'),
        "control characters are not shown: {text:?}"
    );
    assert_eq!(
        msg["params"]["requestedSchema"]["properties"]["approve"]["type"],
        "boolean"
    );
    let pending = h.core.pending_approvals(h.now);
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].via, "client");
    // Yes: the call runs with its arguments, and the row says who decided.
    let answer = json!({"jsonrpc": "2.0", "id": id.clone().unwrap(),
                        "result": {"action": "accept", "content": {"approve": true}}});
    h.send_raw(&answer.to_string());
    let (rpc_id, op, name, args) = to_worker(&h.turn()).expect("approved: sent");
    assert_eq!((op, name.as_str()), ("call_tool", "echo"));
    assert_eq!(serde_json::from_str::<Value>(&args).unwrap()["text"], "hi");
    h.worker_ok(rpc_id, r#"{"content":[{"type":"text","text":"hi"}]}"#);
    h.turn();
    let row = h.last_row();
    assert_eq!(row.decision, "allowed");
    assert_eq!(row.approved_by.as_deref(), Some("client:uid:1000"));

    // No: ask_denied, the tool never runs.
    h.send(
        "tools/call",
        json!({"name": "local__echo", "arguments": {"text": "no"}}),
    );
    let r = relays(&h.turn());
    let answer = json!({"jsonrpc": "2.0", "id": r[0].1.clone().unwrap(),
                        "result": {"action": "accept", "content": {"approve": false}}});
    h.send_raw(&answer.to_string());
    let actions = h.turn();
    assert!(to_worker(&actions).is_none());
    let (_, v) = reply(&actions).expect("refused");
    assert_eq!(
        v["result"]["structuredContent"]["error"]["code"],
        "ask_denied"
    );
    assert!(h.core.pending_approvals(h.now).is_empty());
}

#[test]
fn a_legacy_client_without_elicitation_goes_to_the_operator() {
    let mut h = Harness::new(ASK_AT_CLIENT);
    legacy(&mut h, json!({}));
    h.send(
        "tools/call",
        json!({"name": "local__echo", "arguments": {"text": "hi"}}),
    );
    let actions = h.turn();
    assert!(relays(&actions).is_empty(), "nothing asked of the client");
    let pending = h.core.pending_approvals(h.now);
    assert_eq!((pending.len(), pending[0].via), (1, "operator"));
    h.core
        .decide_approval(pending[0].id, true, "operator:root", None, h.now)
        .unwrap();
    assert!(to_worker(&h.turn()).is_some());
}

const MODERN_META: &str = r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{}}}"#;

fn modern(h: &mut Harness) {
    h.core
        .set_state_key(StateKey::from_master(&[5; MASTER_KEY_BYTES]), "t".into());
    h.core.set_conn_facts(
        AGENT,
        ConnFacts {
            modern: true,
            caps: ClientCaps::default(),
            log_level: None,
        },
    );
}

fn call(h: &mut Harness, args: Value, extra: Value) -> Vec<Action> {
    let meta: Value = serde_json::from_str(MODERN_META).unwrap();
    let mut params = json!({"name": "local__echo", "arguments": args, "_meta": meta});
    if let (Some(p), Some(e)) = (params.as_object_mut(), extra.as_object()) {
        p.extend(e.clone());
    }
    h.send("tools/call", params);
    h.turn()
}

/// The `input_required` of a modern ask: the approval key and the state.
fn asked(actions: &[Action]) -> (String, Value) {
    assert!(to_worker(actions).is_none(), "asked, not run");
    let (_, v) = reply(actions).expect("answered input_required");
    let r = &v["result"];
    assert_eq!(r["resultType"], "input_required", "{v}");
    let (key, req) = r["inputRequests"]
        .as_object()
        .unwrap()
        .iter()
        .next()
        .unwrap();
    assert_eq!(req["method"], "elicitation/create");
    (key.clone(), r["requestState"].clone())
}

fn approve(key: &str, yes: bool) -> Value {
    json!({key: {"action": "accept", "content": {"approve": yes}}})
}

fn refused_with(actions: &[Action], words: &str) {
    assert!(to_worker(actions).is_none(), "the tool never runs");
    let (_, v) = reply(actions).expect("refused");
    let text = v.to_string();
    assert!(text.contains(words), "{words:?} not in {v}");
}

#[test]
fn a_modern_approval_runs_the_call_once_with_its_own_arguments() {
    let mut h = Harness::new(ASK_AT_CLIENT);
    modern(&mut h);
    let (key, state) = asked(&call(&mut h, json!({"text": "hi"}), json!({})));
    let first = h.last_row();
    assert_eq!(
        first.decision, "pending",
        "the asking request's row says so"
    );
    // Argument swap, other principal, tampering: refused.
    let retry = |args: Value, st: &Value, yes: bool| {
        json!({"requestState": st, "inputResponses": approve(&key, yes)}).tap(args)
    };
    let (args, extra) = retry(json!({"text": "rm -rf /"}), &state, true);
    refused_with(&call(&mut h, args, extra), "other arguments");
    h.peer.principal = "uid:2000".into();
    let (args, extra) = retry(json!({"text": "hi"}), &state, true);
    refused_with(&call(&mut h, args, extra), "another principal");
    h.peer.principal = "uid:1000".into();
    let mut forged = state.as_str().unwrap().to_owned();
    forged.insert(8, 'x');
    let (args, extra) = retry(json!({"text": "hi"}), &json!(forged), true);
    refused_with(&call(&mut h, args, extra), "requestState");
    // The right retry runs the call, with who decided on its row.
    let (args, extra) = retry(json!({"text": "hi"}), &state, true);
    let (rpc_id, op, _, sent) = to_worker(&call(&mut h, args, extra)).expect("approved: runs");
    assert_eq!(op, "call_tool");
    assert_eq!(
        sent, r#"{"text":"hi"}"#,
        "the original arguments, as judged"
    );
    h.worker_ok(rpc_id, r#"{"content":[{"type":"text","text":"hi"}]}"#);
    let (_, v) = reply(&h.turn()).unwrap();
    assert_eq!(v["result"]["content"][0]["text"], "hi");
    let row = h.last_row();
    assert_eq!(row.decision, "allowed");
    assert_eq!(row.approved_by.as_deref(), Some("client:uid:1000"));
    // Replayed: refused.
    let (args, extra) = retry(json!({"text": "hi"}), &state, true);
    refused_with(&call(&mut h, args, extra), "good once");
    assert_eq!(
        h.core.records().event_details("client_approval_used").len(),
        1
    );
}

#[test]
fn a_modern_decline_is_ask_denied_and_an_expired_approval_is_refused() {
    let mut h = Harness::new(ASK_AT_CLIENT);
    modern(&mut h);
    let (key, state) = asked(&call(&mut h, json!({"text": "a"}), json!({})));
    let extra = json!({"requestState": state, "inputResponses": approve(&key, false)});
    refused_with(&call(&mut h, json!({"text": "a"}), extra), "ask_denied");
    assert_eq!(h.last_row().approved_by.as_deref(), Some("client:uid:1000"));
    let (key, state) = asked(&call(&mut h, json!({"text": "b"}), json!({})));
    h.now += Duration::from_secs(121);
    let extra = json!({"requestState": state, "inputResponses": approve(&key, true)});
    refused_with(&call(&mut h, json!({"text": "b"}), extra), "expired");
}

#[test]
fn a_reload_that_changes_the_decision_refuses_the_approval() {
    let mut h = Harness::new(ASK_AT_CLIENT);
    modern(&mut h);
    let (key, state) = asked(&call(&mut h, json!({"text": "a"}), json!({})));
    // Another rule added, the same rule still asks: the approval holds.
    let more = format!(
        "{ASK_AT_CLIENT}\n[[policy.rules]]\nid = \"unrelated\"\naction = \"block\"\ntool = \"nothing__here\"\n"
    );
    h.core.set_policy(policy(&more), h.now);
    let extra = json!({"requestState": state, "inputResponses": approve(&key, true)});
    assert!(to_worker(&call(&mut h, json!({"text": "a"}), extra)).is_some());
    // The ask rule removed (the call would now be allowed): refused, not run.
    let (key, state) = asked(&call(&mut h, json!({"text": "b"}), json!({})));
    h.core.set_policy(policy(""), h.now);
    let extra = json!({"requestState": state, "inputResponses": approve(&key, true)});
    refused_with(&call(&mut h, json!({"text": "b"}), extra), "reloaded");
    // Blocked now: refused by the policy.
    h.core.set_policy(policy(ASK_AT_CLIENT), h.now);
    let (key, state) = asked(&call(&mut h, json!({"text": "c"}), json!({})));
    let block = format!(
        "{ASK_AT_CLIENT}\n[[policy.rules]]\nid = \"no-echo\"\naction = \"block\"\ntool = \"local__echo\"\n"
    );
    h.core.set_policy(policy(&block), h.now);
    let extra = json!({"requestState": state, "inputResponses": approve(&key, true)});
    refused_with(&call(&mut h, json!({"text": "c"}), extra), "no-echo");
}

#[test]
fn another_replica_with_the_same_key_accepts_the_approval() {
    let mut a = Harness::new(ASK_AT_CLIENT);
    modern(&mut a);
    let (key, state) = asked(&call(&mut a, json!({"text": "x"}), json!({})));
    let mut b = Harness::new(ASK_AT_CLIENT);
    modern(&mut b);
    let extra = json!({"requestState": state, "inputResponses": approve(&key, true)});
    assert!(to_worker(&call(&mut b, json!({"text": "x"}), extra.clone())).is_some());
    // A restart that remembers the nonces used (from the ledger) refuses the replay.
    let mut c = Harness::new(ASK_AT_CLIENT);
    modern(&mut c);
    let used = b.core.records().event_details("client_approval_used");
    c.core.remember_used_approvals(used.iter().map(|u| {
        (
            u["nonce"].as_str().unwrap().to_owned(),
            u["expires_ms"].as_i64().unwrap(),
        )
    }));
    refused_with(&call(&mut c, json!({"text": "x"}), extra), "good once");
}

#[test]
fn a_corp_config_can_forbid_asks_at_the_client() {
    let dir = tempfile::tempdir().unwrap();
    let corp = dir.path().join("corp.toml");
    std::fs::write(&corp, "[policy]\nallow_ask_via_client = false\n").unwrap();
    #[derive(serde::Deserialize)]
    struct W {
        policy: PolicyConfig,
    }
    let cfg = toml::from_str::<W>(ASK_AT_CLIENT).unwrap().policy;
    let p = Policy::load_with_corp_env(&cfg, "t.toml", Some(&corp)).unwrap();
    assert!(
        p.warnings()
            .iter()
            .any(|w| w.contains("allow_ask_via_client")),
        "{:?}",
        p.warnings()
    );
    let mut h = Harness::new(ASK_AT_CLIENT);
    h.core.set_policy(Rc::new(p), h.now);
    modern(&mut h);
    let actions = call(&mut h, json!({"text": "x"}), json!({}));
    assert!(reply(&actions).is_none(), "not answered input_required");
    let pending = h.core.pending_approvals(h.now);
    assert_eq!((pending.len(), pending[0].via), (1, "operator"));
}

/// `(args, extra)` for [`call`].
trait Tap {
    fn tap(self, args: Value) -> (Value, Value);
}

impl Tap for Value {
    fn tap(self, args: Value) -> (Value, Value) {
        (args, self)
    }
}
