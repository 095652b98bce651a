//! The relay without sockets: a worker's notifications and requests during a call, the
//! agent's answers, the modern era's `input_required` and its retry.

use serde_json::{Value, json};

use super::tests::{AGENT, Harness, reply, to_worker};
use super::*;
use crate::gateway::relay_config::RelayConfig;
use crate::mcp::client_caps::ClientCaps;
use crate::workers::relay_wire::{CALL_NOTIFICATION, CALL_REQUESTS, RequestAnswer};
use crate::workers::rpc::Op;

fn worker_event(h: &mut Harness, kind: &str, detail: Value) {
    let msg = rpc::Message::Event {
        kind: kind.into(),
        detail: detail.to_string(),
    };
    h.core.on_worker_message(0, msg, h.now);
}

fn progress(h: &mut Harness, call: Option<u64>, token: &str, n: u64) {
    worker_event(
        h,
        CALL_NOTIFICATION,
        json!({"call": call, "server": "local", "method": "notifications/progress",
               "params": {"progressToken": token, "progress": n, "total": 10}}),
    );
}

/// Relayed messages among `actions`: (parsed message, the gateway's request id).
fn relays(actions: &[Action]) -> Vec<(Value, Option<String>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Relay {
                bytes, request_id, ..
            } => Some((
                serde_json::from_slice(bytes).expect("relayed JSON"),
                request_id.clone(),
            )),
            _ => None,
        })
        .collect()
}

/// Answers to the worker's requests among `actions`: (call, answer).
fn answers(actions: &[Action]) -> Vec<(u64, RequestAnswer)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::ToWorker {
                msg:
                    rpc::Message::Request {
                        op: Op::Answer { call, answer },
                        ..
                    },
                ..
            } => Some((*call, answer.clone())),
            _ => None,
        })
        .collect()
}

fn call_echo(h: &mut Harness, meta: Value) -> u64 {
    h.send(
        "tools/call",
        json!({"name": "local__echo", "arguments": {"text": "x"}, "_meta": meta}),
    );
    let (rpc_id, ..) = to_worker(&h.turn()).expect("sent to the worker");
    rpc_id
}

#[test]
fn progress_reaches_the_agent_under_its_own_token_only() {
    let mut h = Harness::new("");
    let call = call_echo(&mut h, json!({"progressToken": "agent-tok"}));
    let ours = format!("toolwall-{call}");
    progress(&mut h, Some(call), &ours, 1);
    let r = relays(&h.turn());
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].0["method"], "notifications/progress");
    assert_eq!(r[0].0["params"]["progressToken"], "agent-tok");
    assert_eq!(r[0].0["params"]["progress"], 1);
    assert!(r[0].0.get("id").is_none());
    // Tokens the gateway did not give for this call: dropped.
    progress(&mut h, Some(call), "toolwall-999999", 2);
    progress(&mut h, Some(call), "agent-tok", 3);
    progress(&mut h, Some(call), "", 4);
    assert!(relays(&h.turn()).is_empty());
    // On a listening stream (no call named): found by the token, if the server matches.
    progress(&mut h, None, &ours, 5);
    assert_eq!(relays(&h.turn()).len(), 1);
    worker_event(
        &mut h,
        CALL_NOTIFICATION,
        json!({"call": call, "server": "other", "method": "notifications/progress",
               "params": {"progressToken": ours, "progress": 6}}),
    );
    assert!(
        relays(&h.turn()).is_empty(),
        "another server's notification"
    );
    // A log message of the call reaches its agent.
    worker_event(
        &mut h,
        CALL_NOTIFICATION,
        json!({"call": call, "server": "local", "method": "notifications/message",
               "params": {"level": "info", "data": "half way"}}),
    );
    let r = relays(&h.turn());
    assert_eq!(r[0].0["params"]["data"], "half way");
    h.worker_ok(call, r#"{"content":[{"type":"text","text":"x"}]}"#);
    assert!(reply(&h.turn()).is_some());
    let relayed = h.core.records().event_details("relay");
    assert_eq!(relayed.len(), 3, "{relayed:?}");
    assert!(relayed.iter().all(|e| e["decision"] == "relayed"));
    let summary = &h.core.records().event_details("relay_summary")[0];
    assert_eq!(
        (summary["relayed"].as_u64(), summary["dropped"].as_u64()),
        (Some(3), Some(3))
    );
    // After the call, its token names nothing.
    progress(&mut h, None, &ours, 7);
    assert!(relays(&h.turn()).is_empty());
}

#[test]
fn a_call_without_a_progress_token_gets_no_progress() {
    let mut h = Harness::new("");
    let call = call_echo(&mut h, json!({}));
    progress(&mut h, Some(call), &format!("toolwall-{call}"), 1);
    assert!(relays(&h.turn()).is_empty());
}

#[test]
fn notifications_are_bounded_per_call() {
    let mut h = Harness::new("");
    h.core.set_relay_config(RelayConfig {
        notifications_per_sec: 0,
        notification_burst: 3,
        max_message_bytes: 200,
        ..RelayConfig::default()
    });
    let call = call_echo(&mut h, json!({"progressToken": 7}));
    for n in 0..10 {
        progress(&mut h, Some(call), &format!("toolwall-{call}"), n);
    }
    let r = relays(&h.turn());
    assert_eq!(r.len(), 3, "the burst, then nothing at a rate of 0");
    assert_eq!(
        r[0].0["params"]["progressToken"], 7,
        "a numeric token stays a number"
    );
    // Another call has its own bucket; an oversized notification is dropped.
    let other = call_echo(&mut h, json!({}));
    worker_event(
        &mut h,
        CALL_NOTIFICATION,
        json!({"call": other, "server": "local", "method": "notifications/message",
               "params": {"level": "info", "data": "y".repeat(300)}}),
    );
    worker_event(
        &mut h,
        CALL_NOTIFICATION,
        json!({"call": other, "server": "local", "method": "notifications/message",
               "params": {"level": "info", "data": "small"}}),
    );
    assert_eq!(relays(&h.turn()).len(), 1);
    h.worker_ok(call, r#"{"content":[]}"#);
    h.turn();
    let summary = &h.core.records().event_details("relay_summary")[0];
    assert_eq!(summary["dropped"], 7);
}

#[test]
fn policy_judges_what_servers_send_and_blocks_it() {
    let rules = r#"
[[policy.rules]]
id = "no-secret-logs"
action = "block"
phase = "response"
method = "notifications/message"
result = { contains = "SECRET" }

[[policy.rules]]
id = "no-sampling"
action = "block"
phase = "response"
method = "sampling/createMessage"
"#;
    let mut h = Harness::new(rules);
    h.send(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {"sampling": {}}, "clientInfo": {"name": "t"}}),
    );
    h.turn();
    let call = call_echo(&mut h, json!({}));
    for data in ["the SECRET is 42", "fine"] {
        worker_event(
            &mut h,
            CALL_NOTIFICATION,
            json!({"call": call, "server": "local", "method": "notifications/message",
                   "params": {"level": "info", "data": data}}),
        );
    }
    let r = relays(&h.turn());
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].0["params"]["data"], "fine");
    worker_event(
        &mut h,
        CALL_REQUESTS,
        json!({"call": call, "server": "local", "requests": [
            {"id": 1, "method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 5}}]}),
    );
    let actions = h.turn();
    assert!(
        relays(&actions).is_empty(),
        "a blocked request never reaches the client"
    );
    let a = answers(&actions);
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].0, call);
    let e = a[0].1.error.as_ref().expect("the server gets an error");
    assert_eq!(e.code, crate::mcp::jsonrpc::POLICY_BLOCKED);
    assert_eq!(e.data.as_ref().unwrap()["rule"], "no-sampling");
    let relayed = h.core.records().event_details("relay");
    let decisions: Vec<&str> = relayed
        .iter()
        .map(|e| e["decision"].as_str().unwrap())
        .collect();
    assert_eq!(decisions, ["blocked", "relayed", "blocked"]);
    assert_eq!(relayed[2]["rule"], "no-sampling");
}

#[test]
fn server_requests_reach_legacy_agents_that_declared_the_capability() {
    let mut h = Harness::new("");
    h.send(
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {"elicitation": {}}, "clientInfo": {"name": "t"}}),
    );
    h.turn();
    let call = call_echo(&mut h, json!({}));
    worker_event(
        &mut h,
        CALL_REQUESTS,
        json!({"call": call, "server": "local", "requests": [
            {"id": 1, "method": "elicitation/create", "params": {"message": "Name?", "requestedSchema": {"type": "object"}}},
            {"id": 2, "method": "roots/list"},
            {"id": 3, "method": "tools/call"}]}),
    );
    let actions = h.turn();
    let r = relays(&actions);
    assert_eq!(r.len(), 1);
    let (msg, id) = &r[0];
    let id = id.clone().expect("a request carries the gateway's id");
    assert!(id.starts_with("toolwall-"));
    assert_eq!(msg["id"], id);
    assert_eq!(msg["method"], "elicitation/create");
    assert_eq!(msg["params"]["message"], "Name?");
    let refused = answers(&actions);
    assert_eq!(
        refused.len(),
        2,
        "roots (not declared) and a method never relayed"
    );
    // Larger than relay.max_message_bytes: refused, not relayed.
    worker_event(
        &mut h,
        CALL_REQUESTS,
        json!({"call": call, "server": "local", "requests": [
            {"id": 9, "method": "elicitation/create", "params": {"message": "y".repeat(300_000)}}]}),
    );
    let big = h.turn();
    assert!(relays(&big).is_empty());
    assert!(
        answers(&big)[0]
            .1
            .error
            .as_ref()
            .unwrap()
            .message
            .contains("max_message_bytes")
    );
    let roots = refused.iter().find(|(_, a)| a.id == 2).unwrap();
    let e = roots.1.error.as_ref().unwrap();
    assert_eq!(e.code, crate::mcp::jsonrpc::METHOD_NOT_FOUND);
    assert!(e.message.contains("roots"), "{}", e.message);
    assert_eq!(
        e.data.as_ref().unwrap()["requiredCapabilities"]["roots"],
        json!({})
    );
    // An answer to an id nobody relayed, or from another connection: nothing.
    h.send_raw(r#"{"jsonrpc":"2.0","id":"toolwall-999","result":{"action":"accept"}}"#);
    let other = ConnRef {
        slot: 2,
        generation: 9,
    };
    let peer = h.peer.clone();
    h.core.on_connect(other, &peer);
    let forged =
        json!({"jsonrpc": "2.0", "id": id, "result": {"action": "accept", "content": {"x": 1}}});
    h.core.on_message(
        other,
        &peer,
        "intruder",
        Expect::Any,
        0,
        forged.to_string().as_bytes(),
        h.now,
    );
    assert!(answers(&h.turn()).is_empty());
    // The agent answers: the worker hears it, after it is recorded.
    let answer = json!({"jsonrpc": "2.0", "id": id, "result": {"action": "accept", "content": {"name": "Ada"}}});
    h.send_raw(&answer.to_string());
    let a = answers(&h.turn());
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].1.id, 1);
    assert_eq!(a[0].1.result.as_ref().unwrap()["content"]["name"], "Ada");
    // Answered once: a second answer goes nowhere.
    h.send_raw(&answer.to_string());
    assert!(answers(&h.turn()).is_empty());
    let to_server: Vec<Value> = h
        .core
        .records()
        .event_details("relay")
        .into_iter()
        .filter(|e| e["direction"] == "to_server")
        .collect();
    assert_eq!(to_server.len(), 1);
    assert_eq!(to_server[0]["decision"], "answered");
}

#[test]
fn the_agent_leaving_answers_its_relayed_requests() {
    let mut h = Harness::new("");
    h.send(
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {"elicitation": {}}}),
    );
    h.turn();
    let call = call_echo(&mut h, json!({}));
    worker_event(
        &mut h,
        CALL_REQUESTS,
        json!({"call": call, "server": "local", "requests": [{"id": 4, "method": "elicitation/create", "params": {"message": "?"}}]}),
    );
    assert_eq!(relays(&h.turn()).len(), 1);
    let peer = h.peer.clone();
    h.core.on_disconnect(AGENT, &peer, h.now);
    let a = answers(&h.turn());
    assert_eq!(a.len(), 1, "the server is not left waiting");
    assert!(a[0].1.error.is_some());
}

fn modern(h: &mut Harness) {
    h.core
        .set_state_key(StateKey::from_master(&[9; MASTER_KEY_BYTES]), "test".into());
    h.core.set_conn_facts(
        AGENT,
        ConnFacts {
            modern: true,
            caps: ClientCaps::default(),
            log_level: None,
        },
    );
}

const MODERN_META: &str = r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{}}}"#;

/// A modern call whose server asked for input: (worker call, the input_required result).
fn modern_input_required(h: &mut Harness) -> (u64, Value) {
    modern(h);
    let meta: Value = serde_json::from_str(MODERN_META).unwrap();
    let call = call_echo(h, meta);
    worker_event(
        h,
        CALL_REQUESTS,
        json!({"call": call, "server": "local", "requests": [
            {"id": 1, "method": "elicitation/create", "params": {"message": "Name?"}}]}),
    );
    let actions = h.turn();
    assert!(
        relays(&actions).is_empty(),
        "no JSON-RPC request in the modern era"
    );
    let (_, v) = reply(&actions).expect("the request is answered with input_required");
    (call, v["result"].clone())
}

fn retry(h: &mut Harness, args: Value, state: &Value, responses: Value) -> Vec<Action> {
    let meta: Value = serde_json::from_str(MODERN_META).unwrap();
    h.send(
        "tools/call",
        json!({"name": "local__echo", "arguments": args, "_meta": meta,
               "inputResponses": responses, "requestState": state}),
    );
    h.turn()
}

#[test]
fn modern_agents_get_input_required_and_their_retry_resumes_the_call() {
    let mut h = Harness::new("");
    let (call, result) = modern_input_required(&mut h);
    assert_eq!(result["resultType"], "input_required");
    let (key, request) = result["inputRequests"]
        .as_object()
        .and_then(|m| m.iter().next())
        .expect("one input request");
    assert_eq!(request["method"], "elicitation/create");
    assert_eq!(request["params"]["message"], "Name?");
    let state = result["requestState"].clone();
    let text = state.as_str().unwrap();
    assert!(
        !text.contains("echo") && !text.contains("uid"),
        "the state is opaque"
    );
    // Tampered, or for other arguments: refused, and the server hears nothing.
    let mut tampered = text.to_owned();
    tampered.pop();
    tampered.push(if text.ends_with('A') { 'B' } else { 'A' });
    let responses = json!({key: {"action": "accept", "content": {"name": "Ada"}}});
    for (args, st) in [
        (json!({"text": "x"}), json!(tampered)),
        (json!({"text": "other"}), state.clone()),
        (json!({"text": "x"}), json!(5)),
    ] {
        let actions = retry(&mut h, args, &st, responses.clone());
        let (_, v) = reply(&actions).expect("refused");
        assert_eq!(
            v["error"]["code"],
            crate::mcp::jsonrpc::INVALID_PARAMS,
            "{v}"
        );
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("requestState")
        );
        assert!(answers(&actions).is_empty());
    }
    // The right retry: the answer goes to the server; the call's answer to the retry.
    let actions = retry(&mut h, json!({"text": "x"}), &state, responses.clone());
    assert!(
        reply(&actions).is_none(),
        "the retry waits for the call's answer"
    );
    let a = answers(&actions);
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].0, call);
    assert_eq!(a[0].1.result.as_ref().unwrap()["content"]["name"], "Ada");
    // Replayed while the call runs: refused.
    let actions = retry(&mut h, json!({"text": "x"}), &state, responses.clone());
    let (_, v) = reply(&actions).expect("refused");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("good once"),
        "{v}"
    );
    h.worker_ok(call, r#"{"content":[{"type":"text","text":"Hello Ada"}]}"#);
    let (_, v) = reply(&h.turn()).expect("the call's answer");
    assert_eq!(v["id"], h.next_id - 1, "to the retry that resumed it");
    assert_eq!(v["result"]["content"][0]["text"], "Hello Ada");
    // After the call: refused too.
    let actions = retry(&mut h, json!({"text": "x"}), &state, responses);
    assert!(
        reply(&actions).unwrap().1["error"]["message"]
            .as_str()
            .unwrap()
            .contains("ended")
    );
    assert_eq!(h.rows().len(), 1, "one call, one row");
}

#[test]
fn a_state_is_bound_to_its_principal_and_expires() {
    let mut h = Harness::new("");
    let (_, result) = modern_input_required(&mut h);
    let state = result["requestState"].clone();
    let key = result["inputRequests"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    let responses = json!({key: {"action": "decline"}});
    h.peer.principal = "uid:2000".into();
    let actions = retry(&mut h, json!({"text": "x"}), &state, responses.clone());
    assert!(
        reply(&actions).unwrap().1["error"]["message"]
            .as_str()
            .unwrap()
            .contains("another principal")
    );
    h.peer.principal = "uid:1000".into();
    h.now += std::time::Duration::from_secs(601);
    let actions = retry(&mut h, json!({"text": "x"}), &state, responses);
    assert!(
        reply(&actions).unwrap().1["error"]["message"]
            .as_str()
            .unwrap()
            .contains("expired")
    );
}

#[test]
fn a_failed_commit_relays_nothing() {
    let mut h = Harness::new("");
    h.send(
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {"elicitation": {}}}),
    );
    h.turn();
    let call = call_echo(&mut h, json!({"progressToken": "t"}));
    h.core.records_mut().failing = true;
    progress(&mut h, Some(call), &format!("toolwall-{call}"), 1);
    worker_event(
        &mut h,
        CALL_REQUESTS,
        json!({"call": call, "server": "local", "requests": [{"id": 1, "method": "elicitation/create", "params": {"message": "?"}}]}),
    );
    let actions = h.turn();
    assert!(
        relays(&actions).is_empty(),
        "nothing unrecorded reaches the agent"
    );
    assert!(
        actions.iter().any(|a| matches!(a, Action::ToWorker {
        msg: rpc::Message::Request { op: Op::Cancel { target: t }, .. }, .. } if *t == call)),
        "the call the server asked in ends at the worker too"
    );
}

/// F4: the server answered its call while a request it relayed waits for the agent. The
/// answer goes out at once; the agent's late answer reaches nobody and is counted.
#[test]
fn a_final_answer_forgets_the_relayed_requests_still_open() {
    let mut h = Harness::new("");
    h.send(
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {"elicitation": {}}}),
    );
    h.turn();
    let call = call_echo(&mut h, json!({}));
    worker_event(
        &mut h,
        CALL_REQUESTS,
        json!({"call": call, "server": "local", "requests": [{"id": 4, "method": "elicitation/create", "params": {"message": "?"}}]}),
    );
    let r = relays(&h.turn());
    assert_eq!(r.len(), 1);
    let relay_id = r[0].1.clone().expect("relayed as a request");
    // The server gives up waiting and answers its call.
    h.worker_ok(call, r#"{"content":[{"type":"text","text":"done"}]}"#);
    let actions = h.turn();
    let (_, answer) = reply(&actions).expect("the final answer goes out at once");
    assert_eq!(answer["result"]["content"][0]["text"], "done");
    // The agent is told the request is void (the spec's notifications/cancelled).
    let cancels: Vec<Value> = relays(&actions)
        .into_iter()
        .map(|(m, _)| m)
        .filter(|m| m["method"] == "notifications/cancelled")
        .collect();
    assert_eq!(cancels.len(), 1, "{actions:?}");
    assert_eq!(cancels[0]["params"]["requestId"], relay_id);
    // A late answer reaches no worker, and is counted.
    let late =
        json!({"jsonrpc": "2.0", "id": relay_id, "result": {"action": "accept", "content": {}}});
    h.send_raw(&late.to_string());
    assert!(answers(&h.turn()).is_empty());
    assert_eq!(h.core.relay_answers_dropped(), 1);
    // The ledger says the request was forgotten, linked to its call.
    let forgotten: Vec<Value> = h
        .core
        .records()
        .event_details("relay")
        .into_iter()
        .filter(|e| e["decision"] == "forgotten")
        .collect();
    assert_eq!(forgotten.len(), 1, "{forgotten:?}");
    assert_eq!(forgotten[0]["relay_id"], relay_id);
}

/// A modern agent sees a modern server's own input keys where they cannot clash, and its
/// retry is matched by them; keys that clash (or look like the gateway's) are the
/// gateway's own. Failed before: every key was `toolwall-N`.
#[test]
fn modern_agents_see_the_servers_own_input_keys() {
    let mut h = Harness::new("");
    modern(&mut h);
    let meta: Value = serde_json::from_str(MODERN_META).unwrap();
    let call = call_echo(&mut h, meta);
    worker_event(
        &mut h,
        CALL_REQUESTS,
        json!({"call": call, "server": "local", "requests": [
            {"id": 1, "method": "elicitation/create", "params": {"message": "Name?"}, "key": "user_name"},
            {"id": 2, "method": "elicitation/create", "params": {"message": "A?"}, "key": "twice"},
            {"id": 3, "method": "elicitation/create", "params": {"message": "B?"}, "key": "twice"},
            {"id": 4, "method": "elicitation/create", "params": {"message": "C?"}, "key": "toolwall-1"}]}),
    );
    let (_, v) = reply(&h.turn()).expect("input_required");
    let result = v["result"].clone();
    let keys: Vec<(String, String)> = result["inputRequests"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, r)| {
            (
                k.clone(),
                r["params"]["message"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(keys.len(), 4, "{keys:?}");
    assert!(
        keys.contains(&("user_name".into(), "Name?".into())),
        "{keys:?}"
    );
    for m in ["A?", "B?", "C?"] {
        let (k, _) = keys.iter().find(|(_, msg)| msg == m).unwrap();
        assert!(k.starts_with("toolwall-") && k != "toolwall-1", "{keys:?}");
    }
    let mut responses = serde_json::Map::new();
    for (k, m) in &keys {
        responses.insert(
            k.clone(),
            json!({"action": "accept", "content": {"name": m}}),
        );
    }
    let actions = retry(
        &mut h,
        json!({"text": "x"}),
        &result["requestState"],
        json!(responses),
    );
    let mut got: Vec<(u64, String)> = answers(&actions)
        .into_iter()
        .map(|(_, a)| {
            let name = a.result.as_ref().unwrap()["content"]["name"]
                .as_str()
                .unwrap()
                .to_owned();
            (a.id, name)
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            (1, "Name?".into()),
            (2, "A?".into()),
            (3, "B?".into()),
            (4, "C?".into())
        ],
        "each answer reaches the request it was asked under"
    );
}

#[test]
fn a_log_message_of_no_call_is_logged_with_hiding_characters_escaped() {
    let mut h = Harness::new("");
    let tags: String = "SEND"
        .chars()
        .map(|c| char::from_u32(0xE0000 + c as u32).unwrap())
        .collect();
    worker_event(
        &mut h,
        CALL_NOTIFICATION,
        json!({"server": "ev\u{202E}il", "method": "notifications/message",
               "params": {"level": "error", "data": format!("a\u{200B}b\u{2028}{tags}")}}),
    );
    h.turn();
    let logs = h.core.take_logs();
    let line = logs
        .iter()
        .map(|(_, l)| l)
        .find(|l| l.contains(" says ("))
        .expect("the message is logged");
    assert!(
        !line
            .chars()
            .any(|c| c.is_control() || crate::pins::visible::is_format(c)),
        "{}",
        line.escape_debug()
    );
    assert!(line.contains("ev\\u{202e}il"), "{line}");
}
