//! One listing from an upstream server, checked before anything of it is used: within its
//! budget (items, bytes), every item an object with a sane name (tools, prompts) or URI
//! (resources, templates), no name twice. A listing that fails any check is refused whole
//! (the server keeps its last good catalog). The worker checked the same already; the
//! gateway trusts no worker blindly. Pure.

use serde_json::Value;
use serde_json::value::RawValue;
use std::collections::HashSet;

use super::Kind;
use crate::aggregator::budget::ListingBudget;

/// Longest tool or prompt name accepted.
pub const MAX_NAME_CHARS: usize = 128;
/// Longest resource URI (or URI template) accepted.
pub const MAX_URI_BYTES: usize = 4096;

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
    for r in &raw {
        let Some(key) = item_key(kind, r) else {
            return Err(Refusal::malformed(format!(
                "server {server}: a {} item is not an object with an acceptable {}",
                kind.word(),
                kind.key_field()
            )));
        };
        if !seen.insert(key) {
            return Err(Refusal::malformed(format!(
                "server {server} lists the same {} twice",
                kind.key_field(),
            )));
        }
    }
    Ok(raw)
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

/// One checked item as a tree (it parsed once already: this cannot fail on the same text).
pub fn parse(raw: &RawValue) -> Value {
    serde_json::from_str(raw.get()).unwrap_or(Value::Null)
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
            parse(check("s", Kind::Tools, &ok, &budget()).unwrap()[1])["name"],
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
