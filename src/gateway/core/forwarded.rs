//! Requests that reach one server by what they name, with nothing of their own to carry:
//! `completion/complete` names a prompt (`ref/prompt`, the name agents see) or a resource
//! template or URI (`ref/resource`); `resources/subscribe` and `unsubscribe` name a URI.
//! They cross the one pipeline like `prompts/get` and `resources/read` (request phase
//! with their own `method`, a row, the response phase); this file says where they go and
//! what the server gets (the prompt under its own name).

use serde_json::{Value, json};
use std::collections::BTreeMap;

use super::exchange::{Exchange, Routed};

/// The `ref` types of a completion.
const REF_PROMPT: &str = "ref/prompt";
const REF_RESOURCE: &str = "ref/resource";

/// The target a request names in its params: the tool, prompt or URI; a completion's
/// prompt name or resource URI (by its `ref.type`). None when it names none as a string.
pub fn target_in(routed: Routed, params: &Value) -> Option<&str> {
    if routed != Routed::Complete {
        return params.get(routed.target_field()).and_then(Value::as_str);
    }
    let r = params.get("ref")?;
    let field = match r.get("type").and_then(Value::as_str)? {
        REF_PROMPT => "name",
        REF_RESOURCE => "uri",
        _ => return None,
    };
    r.get(field).and_then(Value::as_str)
}

/// Whether the target is a URI (resources, a completion's `ref/resource`), not a name.
pub fn by_uri(routed: Routed, params: &Value) -> bool {
    match routed {
        Routed::Complete => {
            params.pointer("/ref/type").and_then(Value::as_str) == Some(REF_RESOURCE)
        }
        _ => routed.target_field() == "uri",
    }
}

/// What a request lacking a target is told.
pub fn missing_target(routed: Routed) -> String {
    match routed {
        Routed::Complete => format!(
            "invalid params: completion/complete needs a ref of type {REF_PROMPT} with a \
             string name, or {REF_RESOURCE} with a string uri"
        ),
        _ => format!(
            "invalid params: {} needs a string {}",
            routed.method(),
            routed.target_field()
        ),
    }
}

/// A completion's params as its server gets them: a prompt under the server's own name.
pub fn completion_params(x: &Exchange) -> String {
    let mut params = x.params.clone();
    if !by_uri(Routed::Complete, &params)
        && let Some(r) = params.get_mut("ref").and_then(Value::as_object_mut)
    {
        r.insert("name".into(), Value::String(x.target.upstream.clone()));
    }
    crate::mcp::compact_text::compact(&params)
}

/// What each upstream server offers beyond tools, resources and prompts, from its
/// `upstream_state` events: toolwall declares `completions` and `resources.subscribe` to
/// agents only when a server it fronts does (one entry per configured server).
#[derive(Debug, Default)]
pub struct UpstreamOffers {
    by_server: BTreeMap<String, (bool, bool)>,
}

impl UpstreamOffers {
    /// An `upstream_state` event's detail (JSON text); other details are ignored.
    pub fn note(&mut self, detail: &str) {
        let Ok(d) = serde_json::from_str::<Value>(detail) else {
            return;
        };
        let (Some(server), Some(offers)) = (d["server"].as_str(), d.get("offers")) else {
            return;
        };
        let flag = |k: &str| offers.get(k).and_then(Value::as_bool).unwrap_or(false);
        self.by_server
            .insert(server.to_owned(), (flag("completions"), flag("subscribe")));
    }

    /// Forget a server no longer configured.
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.by_server.retain(|s, _| keep(s));
    }

    /// Add what some server offers to toolwall's own `capabilities`; `subscribe` only
    /// where the era has it (legacy `initialize`).
    pub fn declare(&self, caps: &mut Value, subscribe: bool) {
        if self.by_server.values().any(|(c, _)| *c) {
            caps["completions"] = json!({});
        }
        if subscribe
            && self.by_server.values().any(|(_, s)| *s)
            && let Some(r) = caps.get_mut("resources").and_then(Value::as_object_mut)
        {
            r.insert("subscribe".into(), Value::Bool(true));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn targets_of_completions() {
        let p = json!({"ref": {"type": "ref/prompt", "name": "greet"}, "argument": {}});
        assert_eq!(target_in(Routed::Complete, &p), Some("greet"));
        assert!(!by_uri(Routed::Complete, &p));
        let r = json!({"ref": {"type": "ref/resource", "uri": "file:///{path}"}});
        assert_eq!(target_in(Routed::Complete, &r), Some("file:///{path}"));
        assert!(by_uri(Routed::Complete, &r));
        // A ref of another type, or naming by the other field, names nothing.
        for bad in [
            json!({"ref": {"type": "ref/tool", "name": "x"}}),
            json!({"ref": {"type": "ref/prompt", "uri": "x"}}),
            json!({"ref": {"type": "ref/resource", "name": "x"}}),
            json!({"ref": "ref/prompt"}),
            json!({}),
        ] {
            assert_eq!(target_in(Routed::Complete, &bad), None, "{bad}");
        }
        let s = json!({"uri": "file:///a"});
        assert_eq!(target_in(Routed::Subscribe, &s), Some("file:///a"));
        assert!(by_uri(Routed::Unsubscribe, &s));
    }

    #[test]
    fn capabilities_follow_the_servers() {
        let mut o = UpstreamOffers::default();
        let mut caps = json!({"resources": {}});
        o.declare(&mut caps, true);
        assert_eq!(caps, json!({"resources": {}}));
        o.note(r#"{"server":"a","offers":{"completions":false,"subscribe":true}}"#);
        o.note(r#"{"server":"b","offers":{"completions":true,"subscribe":false}}"#);
        o.note("not json");
        o.declare(&mut caps, false);
        assert_eq!(caps, json!({"resources": {}, "completions": {}}));
        o.declare(&mut caps, true);
        assert_eq!(caps["resources"]["subscribe"], true);
        o.retain(|s| s == "b");
        let mut caps = json!({"resources": {}});
        o.declare(&mut caps, true);
        assert_eq!(caps, json!({"resources": {}, "completions": {}}));
    }
}
