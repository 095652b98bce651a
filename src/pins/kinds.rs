//! Which kinds of definitions are pinned, and the key each pin is stored under.
//!
//! Tools keep their key `server__tool` (pins written before stay valid). Prompts are read by
//! models as tools are (their description and arguments steer an agent), so they are pinned
//! with the same review, digest, hold and approval, under `prompt/server__name`: a tool and
//! a prompt of the same name are two pins. `pins list` shows the key and its kind;
//! `pins approve prompt/server__name --digest D` approves one.
//!
//! Resource templates are pinned as prompts are (`template/server__uriTemplate`). Concrete
//! resources (`resource/server__uri`) too, with one difference: a file server lists
//! thousands that come and go, so a URI never pinned is pinned and served at once; only a
//! changed definition of a pinned URI waits for approval. Ownership of a URI has its own
//! rule (see the aggregator README).
//!
//! A key of another kind starts with a kind word and `/`; a tool's key starts with its
//! server's name and `__`, and server names hold neither `/` nor start with a kind word and
//! `/`, so the two never meet.

use serde_json::Value;

use crate::mcp::catalog::{Kind, NAMESPACE_SEP};

/// Whether listings of `kind` are pinned (under the server's `pin` mode).
pub fn pinned(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Tools | Kind::Prompts | Kind::Templates | Kind::Resources
    )
}

fn prefix(kind: Kind) -> &'static str {
    match kind {
        Kind::Tools => "",
        Kind::Prompts => "prompt/",
        Kind::Resources => "resource/",
        Kind::Templates => "template/",
    }
}

/// The pin key of a listed definition (`None` without its naming field).
pub fn key(kind: Kind, server: &str, item: &Value) -> Option<String> {
    let id = item.get(kind.key_field())?.as_str()?;
    Some(format!("{}{server}{NAMESPACE_SEP}{id}", prefix(kind)))
}

/// The kind a pin key belongs to.
pub fn kind_of(key: &str) -> Kind {
    for kind in [Kind::Prompts, Kind::Resources, Kind::Templates] {
        if key.starts_with(prefix(kind)) {
            return kind;
        }
    }
    Kind::Tools
}

/// The word `pins list` shows for a key's kind.
pub fn word(key: &str) -> &'static str {
    match kind_of(key) {
        Kind::Tools => "tool",
        Kind::Prompts => "prompt",
        Kind::Resources => "resource",
        Kind::Templates => "template",
    }
}

/// The `pin_servers` row that says a server's `kind` list has been pinned once (its first
/// sight is over). Tools use the server's own row; a marker has no origin, so address
/// comparisons never see it.
pub fn marker(kind: Kind, server: &str) -> String {
    format!("{}{server}", prefix(kind))
}

/// `key` with its server renamed `from` to `to` (a declared rename).
pub fn renamed(key: &str, from: &str, to: &str) -> Option<String> {
    let p = prefix(kind_of(key));
    let rest = key.strip_prefix(p)?;
    let bare = rest.strip_prefix(from)?.strip_prefix(NAMESPACE_SEP)?;
    Some(format!("{p}{to}{NAMESPACE_SEP}{bare}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_of_each_kind_never_meet() {
        let tool = key(Kind::Tools, "up", &json!({"name": "greet"})).unwrap();
        let prompt = key(Kind::Prompts, "up", &json!({"name": "greet"})).unwrap();
        assert_eq!(tool, "up__greet");
        assert_eq!(prompt, "prompt/up__greet");
        assert_eq!(kind_of(&tool), Kind::Tools);
        assert_eq!(kind_of(&prompt), Kind::Prompts);
        assert_eq!(kind_of("up__prompt/x"), Kind::Tools);
        assert_eq!(key(Kind::Prompts, "up", &json!({"title": "x"})), None);
        assert_eq!(
            renamed(&prompt, "up", "down").as_deref(),
            Some("prompt/down__greet")
        );
        assert_eq!(renamed(&tool, "up", "down").as_deref(), Some("down__greet"));
        assert_eq!(renamed(&tool, "other", "down"), None);
        assert_eq!(marker(Kind::Prompts, "up"), "prompt/up");
    }
}
