//! A pin as `toolwall pins list` shows it (the admin socket's JSON): its state, the
//! approved version and the pending one, each with its full digest, and which fields
//! differ between them.

use serde::Serialize;
use serde_json::Value;

use super::PinMode;
use super::digest::changed_fields;
use super::store::PinRecord;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ApprovedView {
    pub digest: String,
    pub definition: Value,
    /// 1: an old pin of four fields (upgraded when the tool is seen again).
    pub scheme: i64,
    pub approved_ms: i64,
    pub approved_by: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PendingView {
    pub digest: String,
    pub definition: Value,
    pub seen_ms: i64,
    /// Top-level fields that differ from the approved definition (all of them for a new
    /// tool).
    pub fields: Vec<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PinView {
    /// The pin's key: `server__tool`, or `prompt/server__name` (see `pins::kinds`).
    pub tool: String,
    /// `tool` or `prompt`.
    pub kind: &'static str,
    pub server: String,
    /// `pinned`, `changed` (a pending definition beside the approved one), or `new` (held:
    /// nothing approved yet).
    pub state: &'static str,
    /// Whether agents are refused the tool now (enforced change, or held).
    pub hidden: bool,
    pub mode: &'static str,
    pub approved: Option<ApprovedView>,
    pub pending: Option<PendingView>,
    pub first_seen_ms: i64,
    pub last_seen_ms: i64,
}

fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::Null)
}

impl PinView {
    pub fn of(r: &PinRecord, mode: PinMode, hidden: bool) -> PinView {
        let state = match (&r.approved, &r.pending) {
            (None, _) => "new",
            (Some(_), Some(_)) => "changed",
            (Some(_), None) => "pinned",
        };
        PinView {
            tool: r.tool.clone(),
            kind: super::kinds::word(&r.tool),
            server: r.server.clone(),
            state,
            hidden,
            mode: mode.as_str(),
            approved: r.approved.as_ref().map(|a| ApprovedView {
                digest: a.digest.clone(),
                definition: parse(&a.definition),
                scheme: a.scheme,
                approved_ms: a.approved_ms,
                approved_by: a.approved_by.clone(),
            }),
            pending: r.pending.as_ref().map(|p| PendingView {
                digest: p.digest.clone(),
                definition: parse(&p.definition),
                seen_ms: p.seen_ms,
                fields: match &r.approved {
                    Some(a) => changed_fields(&a.definition, &p.definition),
                    None => match parse(&p.definition) {
                        Value::Object(m) => m.keys().cloned().collect(),
                        _ => Vec::new(),
                    },
                },
            }),
            first_seen_ms: r.first_seen_ms,
            last_seen_ms: r.last_seen_ms,
        }
    }
}
