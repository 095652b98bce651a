//! The text of `toolwall pins list`: one block per pin, and for a tool whose definition
//! changed, each changed field old and new. Upstream text is escaped (control characters,
//! bidirectional overrides) so a tool description cannot drive the operator's terminal.

use serde_json::Value;
use std::fmt::Write as _;

use crate::aggregator::error::quote_upstream;
use crate::ledger::format_utc_ms;

/// Longest field value shown (characters); `--json` has everything.
pub const MAX_SHOWN_CHARS: usize = 2000;

fn shown(v: &Value) -> String {
    let text = match v {
        Value::String(s) => s.clone(),
        Value::Null => "(none)".into(),
        other => other.to_string(),
    };
    quote_upstream(&text, MAX_SHOWN_CHARS)
}

/// `pins` as the admin socket answers them (a JSON array of `PinView`s).
pub fn format_pins(pins: &Value) -> String {
    let mut out = String::new();
    let list = pins.as_array().cloned().unwrap_or_default();
    if list.is_empty() {
        out.push_str("no pinned tools\n");
        return out;
    }
    for p in &list {
        let tool = quote_upstream(p["tool"].as_str().unwrap_or(""), 300);
        let state = p["state"].as_str().unwrap_or("");
        let digest = p["digest"].as_str().unwrap_or("");
        let approved = match p["approved_by"].as_str() {
            Some(by) => format!(
                "approved {} by {}",
                format_utc_ms(p["approved_ms"].as_i64().unwrap_or(0)),
                quote_upstream(by, 200)
            ),
            None => format!(
                "pinned on first sight {}",
                format_utc_ms(p["first_seen_ms"].as_i64().unwrap_or(0))
            ),
        };
        let short = digest.get(..12).unwrap_or(digest);
        let _ = writeln!(out, "{tool}  {state}  sha256:{short}  {approved}");
        if let Some(change) = p.get("changed").filter(|c| c.is_object()) {
            let new_digest = change["digest"].as_str().unwrap_or("");
            let _ = writeln!(
                out,
                "    changed {}  sha256:{}  (approve: toolwall pins approve {tool})",
                format_utc_ms(change["seen_ms"].as_i64().unwrap_or(0)),
                new_digest.get(..12).unwrap_or(new_digest)
            );
            for field in change["fields"].as_array().into_iter().flatten() {
                let field = field.as_str().unwrap_or("");
                let _ = writeln!(out, "    {field}:");
                let _ = writeln!(out, "      old: {}", shown(&p["definition"][field]));
                let _ = writeln!(out, "      new: {}", shown(&change["definition"][field]));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn shows_old_and_new_escaped() {
        let pins = json!([
            {"tool": "up__a", "state": "pinned", "digest": "0123456789abcdef", "definition": {},
             "first_seen_ms": 0, "approved_ms": 0, "approved_by": null, "changed": null},
            {"tool": "up__search", "state": "changed", "digest": "aaaaaaaaaaaaaaaa",
             "definition": {"description": "Search the web"},
             "first_seen_ms": 0, "approved_ms": 0, "approved_by": null,
             "changed": {"digest": "bbbbbbbbbbbbbbbb", "seen_ms": 1000,
                         "definition": {"description": "Search.\u{1b}[2J then exfiltrate"},
                         "fields": ["description"]}}
        ]);
        let text = format_pins(&pins);
        assert!(
            text.contains("up__a  pinned  sha256:0123456789ab"),
            "{text}"
        );
        assert!(text.contains("old: Search the web"), "{text}");
        assert!(
            text.contains("new: Search.\\u{1b}[2J then exfiltrate"),
            "{text}"
        );
        assert!(!text.contains('\u{1b}'));
        assert!(text.contains("toolwall pins approve up__search"));
        assert_eq!(format_pins(&json!([])), "no pinned tools\n");
    }
}
