//! One listing from an upstream server, checked before anything of it is used: within its
//! budget (items, bytes), every item an object with a sane name (tools, prompts) or URI
//! (resources, templates), no name twice. A listing that fails any check is refused whole
//! (the server keeps its last good catalog). The worker checked the same already; the
//! gateway trusts no worker blindly. An item nested deeper than [`MAX_DEFINITION_DEPTH`]
//! is left out alone, said in the log (`unservable`) by its name.

use serde_json::Value;
use serde_json::value::RawValue;
use std::collections::HashSet;

use super::Kind;
use crate::aggregator::budget::ListingBudget;

/// Longest tool or prompt name accepted.
pub const MAX_NAME_CHARS: usize = 128;
/// Longest resource URI (or URI template) accepted.
pub const MAX_URI_BYTES: usize = 4096;
/// Deepest nesting of objects and arrays in one definition served (the definition itself
/// is level 1; `{"inputSchema":{"properties":{"a":{}}}}` is 4). The JSON parser stops at
/// 128 levels, so a definition near that could not be parsed here, and one served near it
/// would break a client's parser once the answer's own levels wrap it; real schemas (nested
/// models are `$defs` and `$ref`) stay far below. A constant, not a config key: raising it
/// toward 128 is what it guards against.
pub const MAX_DEFINITION_DEPTH: usize = 64;

/// Why a listing was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// `over_budget` or `malformed`.
    pub code: &'static str,
    pub message: String,
}

impl Refusal {
    fn malformed(message: String) -> Refusal {
        Refusal {
            code: "malformed",
            message,
        }
    }
}

/// Whether a listed item's key is acceptable (the same rule the worker applies).
pub fn acceptable_key(kind: Kind, item: &Value) -> bool {
    let Some(key) = item.get(kind.key_field()).and_then(Value::as_str) else {
        return false;
    };
    match kind {
        Kind::Tools | Kind::Prompts => {
            !key.is_empty()
                && key.chars().count() <= MAX_NAME_CHARS
                && key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
        }
        Kind::Resources | Kind::Templates => {
            !key.is_empty() && key.len() <= MAX_URI_BYTES && !key.chars().any(char::is_control)
        }
    }
}

/// Check a listing (a JSON array, as the worker sends it) and return its items, still as
/// the text they are in `text` (each is parsed into a tree only when it is used, so a
/// listing costs its text, not a tree of all of it).
pub fn check<'a>(
    server: &str,
    kind: Kind,
    text: &'a str,
    budget: &ListingBudget,
) -> Result<Vec<&'a RawValue>, Refusal> {
    // The array's own brackets and commas are not the items' bytes.
    if text.len()
        > budget
            .max_bytes
            .saturating_add(budget.max_items)
            .saturating_add(2)
    {
        return Err(over_bytes(server, kind, text.len(), budget));
    }
    let raw: Vec<&RawValue> = serde_json::from_str(text).map_err(|e| {
        Refusal::malformed(format!(
            "server {server}: the {} listing is not a JSON array of definitions: {e}",
            kind.word()
        ))
    })?;
    if raw.len() > budget.max_items {
        return Err(Refusal {
            code: "over_budget",
            message: format!(
                "server {server} lists {} {}, more than {} = {}",
                raw.len(),
                kind.word(),
                budget.items_key,
                budget.max_items
            ),
        });
    }
    let bytes: usize = raw.iter().map(|r| r.get().len()).sum();
    if bytes > budget.max_bytes {
        return Err(over_bytes(server, kind, bytes, budget));
    }
    let mut seen = HashSet::with_capacity(raw.len());
    let mut too_deep = Vec::new();
    for (i, r) in raw.iter().enumerate() {
        let Some(key) = item_key(kind, r) else {
            return Err(Refusal::malformed(format!(
                "server {server}: a {} item is not an object with an acceptable {}",
                kind.word(),
                kind.key_field()
            )));
        };
        let depth = nesting_depth(r.get());
        if depth > MAX_DEFINITION_DEPTH {
            super::unservable::note_item(
                server,
                kind,
                &key,
                &format!("it nests {depth} levels deep, more than {MAX_DEFINITION_DEPTH}"),
            );
            too_deep.push(i);
        }
        if !seen.insert(key) {
            return Err(Refusal::malformed(format!(
                "server {server} lists the same {} twice",
                kind.key_field(),
            )));
        }
    }
    if too_deep.is_empty() {
        return Ok(raw);
    }
    // `too_deep` is in order: each look-up is a binary search.
    Ok(raw
        .into_iter()
        .enumerate()
        .filter(|(i, _)| too_deep.binary_search(i).is_err())
        .map(|(_, r)| r)
        .collect())
}

/// How deep objects and arrays nest in `json` (valid JSON text), counted without parsing
/// it into a tree (which would fail past the parser's limit).
pub fn nesting_depth(json: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for b in json.bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

#[derive(serde::Deserialize)]
struct Keys {
    #[serde(default)]
    name: Option<Value>,
    #[serde(default)]
    uri: Option<Value>,
    #[serde(default, rename = "uriTemplate")]
    uri_template: Option<Value>,
}

/// The key of one listed item (parsing only its key fields), if acceptable.
fn item_key(kind: Kind, raw: &RawValue) -> Option<String> {
    if !raw.get().starts_with('{') {
        return None;
    }
    let keys: Keys = serde_json::from_str(raw.get()).ok()?;
    let key = match kind {
        Kind::Tools | Kind::Prompts => keys.name,
        Kind::Resources => keys.uri,
        Kind::Templates => keys.uri_template,
    }?;
    let probe = serde_json::json!({ kind.key_field(): key });
    acceptable_key(kind, &probe).then(|| key.as_str().unwrap_or_default().to_owned())
}

/// One checked item of `server`'s listing of `kind` as a tree. The check read it as JSON
/// text; values JSON allows and a tree cannot hold (a number beyond a 64-bit float, a lone
/// surrogate escape) fail here: such an item is not served, and said once like every
/// other refusal (it was dropped without a word: atk9 F3).
pub fn parse(server: &str, kind: Kind, raw: &RawValue) -> Value {
    match serde_json::from_str(raw.get()) {
        Ok(item) => item,
        Err(e) => {
            let name = item_key(kind, raw).unwrap_or_else(|| "(its name unreadable)".into());
            super::unservable::note_item(
                server,
                kind,
                &name,
                &format!("it holds a value toolwall cannot read ({e})"),
            );
            Value::Null
        }
    }
}

fn over_bytes(server: &str, kind: Kind, bytes: usize, budget: &ListingBudget) -> Refusal {
    Refusal {
        code: "over_budget",
        message: format!(
            "server {server}: its {} listing holds {bytes} bytes, more than {} = {}",
            kind.word(),
            budget.bytes_key,
            budget.max_bytes
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn budget() -> ListingBudget {
        ListingBudget::plain(3, 200, 5)
    }

    #[test]
    fn within_budget_passes_and_over_is_refused_naming_the_key() {
        let ok = json!([{"name": "a"}, {"name": "b.c/d-e_f"}]).to_string();
        assert_eq!(
            parse(
                "s",
                Kind::Tools,
                check("s", Kind::Tools, &ok, &budget()).unwrap()[1]
            )["name"],
            "b.c/d-e_f"
        );
        assert_eq!(check("s", Kind::Tools, &ok, &budget()).unwrap().len(), 2);
        let many = json!([{"name": "a"}, {"name": "b"}, {"name": "c"}, {"name": "d"}]).to_string();
        let e = check("s", Kind::Tools, &many, &budget()).unwrap_err();
        assert_eq!(e.code, "over_budget");
        assert!(e.message.contains("servers.max_items = 3"), "{}", e.message);
        let big = json!([{"name": "a", "description": "x".repeat(300)}]).to_string();
        let e = check("s", Kind::Tools, &big, &budget()).unwrap_err();
        assert!(
            e.message.contains("servers.max_listing_bytes"),
            "{}",
            e.message
        );
    }

    /// `{"name": .., "inputSchema": {"type": "object", "properties": {"a": {..}}}}` with
    /// `levels` nested `properties`.
    fn deep_tool(name: &str, levels: usize) -> String {
        let mut schema = String::from("{\"type\":\"string\"}");
        for _ in 0..levels {
            schema = format!("{{\"type\":\"object\",\"properties\":{{\"a\":{schema}}}}}");
        }
        format!("{{\"name\":\"{name}\",\"inputSchema\":{schema}}}")
    }

    #[test]
    fn an_item_nested_too_deep_is_left_out_alone() {
        let ok = deep_tool("ok", 31);
        assert_eq!(
            nesting_depth(&ok),
            MAX_DEFINITION_DEPTH,
            "at the limit: served"
        );
        assert_eq!(nesting_depth(r#"{"a":"[[{{\"[","b":[[]]}"#), 3);
        for levels in [20, 31, 32, 63, 64, 100, 300] {
            let deep = deep_tool("deep", levels);
            let text = format!("[{ok},{deep}]");
            let items = check(
                "s",
                Kind::Tools,
                &text,
                &ListingBudget::plain(3, 1 << 20, 5),
            )
            .unwrap();
            let names: Vec<Value> = items
                .iter()
                .map(|r| parse("s", Kind::Tools, r)["name"].clone())
                .collect();
            if 2 * levels + 2 <= MAX_DEFINITION_DEPTH {
                assert_eq!(names, [json!("ok"), json!("deep")], "{levels}");
            } else {
                assert_eq!(names, [json!("ok")], "{levels}");
            }
        }
    }

    #[test]
    fn malformed_items_and_duplicates_refuse_the_whole_listing() {
        for bad in [
            json!([{"name": "a b"}]),
            json!([{"nom": "a"}]),
            json!(["a"]),
            json!([{"name": "a"}, {"name": "a", "description": "other"}]),
        ] {
            let e = check("s", Kind::Tools, &bad.to_string(), &budget()).unwrap_err();
            assert_eq!(e.code, "malformed", "{bad}");
        }
        assert!(check("s", Kind::Tools, "{\"tools\":[]}", &budget()).is_err());
        assert!(
            check(
                "s",
                Kind::Resources,
                &json!([{"uri": "a\nb"}]).to_string(),
                &budget()
            )
            .is_err()
        );
        assert!(
            check(
                "s",
                Kind::Templates,
                &json!([{"uriTemplate": "x://{id}"}]).to_string(),
                &budget()
            )
            .is_ok()
        );
    }
}
