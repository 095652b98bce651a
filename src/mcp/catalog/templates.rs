//! Reading a URI through a resource template (RFC 6570 URI templates as MCP servers list
//! them, e.g. `file:///{path}` or `db://{table}/rows{?limit}`). A URI that no server lists
//! as a resource goes to the one server whose template matches it; when templates of two
//! servers match, nobody serves it (no server can capture another's reads by listing a
//! broad template). Pure; parsing is linear and matching is bounded by
//! [`MAX_PARTS`] × the URI's length squared.

use super::Entry;
use super::claims::Claims;

/// Most literal and variable parts of a template that is matched at all.
pub const MAX_PARTS: usize = 64;
/// Longest URI matched against templates.
pub const MAX_URI_BYTES: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part<'a> {
    Literal(&'a str),
    /// A variable expression; `reserved` ones (`+`, `#`) may span `/`, `?` and `#`.
    Var {
        reserved: bool,
        query: bool,
    },
}

fn parse(template: &str) -> Option<Vec<Part<'_>>> {
    let mut parts = Vec::new();
    let mut rest = template;
    while !rest.is_empty() {
        if parts.len() >= MAX_PARTS {
            return None;
        }
        match rest.find('{') {
            Some(0) => {
                let end = rest.find('}')?;
                let expr = &rest[1..end];
                let op = expr.chars().next()?;
                parts.push(Part::Var {
                    reserved: matches!(op, '+' | '#'),
                    query: matches!(op, '?' | '&'),
                });
                rest = &rest[end + 1..];
            }
            Some(i) => {
                parts.push(Part::Literal(&rest[..i]));
                rest = &rest[i..];
            }
            None => {
                if rest.contains('}') {
                    return None;
                }
                parts.push(Part::Literal(rest));
                rest = "";
            }
        }
    }
    Some(parts)
}

/// Whether `uri` is an expansion of `template`.
pub fn matches(template: &str, uri: &str) -> bool {
    if uri.len() > MAX_URI_BYTES {
        return false;
    }
    let Some(parts) = parse(template) else {
        return false;
    };
    let bytes = uri.as_bytes();
    // reach[i]: the first `part` parts can produce exactly uri[..i].
    let mut reach = vec![false; bytes.len() + 1];
    reach[0] = true;
    for part in &parts {
        let mut next = vec![false; bytes.len() + 1];
        for start in 0..=bytes.len() {
            if !reach[start] {
                continue;
            }
            match part {
                Part::Literal(lit) => {
                    if uri[start..].starts_with(lit) {
                        next[start + lit.len()] = true;
                    }
                }
                Part::Var { reserved, query } => {
                    next[start] = true;
                    for end in start..bytes.len() {
                        let b = bytes[end];
                        let stop = if *reserved {
                            false
                        } else if *query {
                            b == b'#'
                        } else {
                            matches!(b, b'/' | b'?' | b'#')
                        };
                        if stop {
                            break;
                        }
                        next[end + 1] = true;
                    }
                }
            }
        }
        reach = next;
    }
    reach[bytes.len()]
}

/// The template entry a read of `uri` goes to. Every template any server lists counts
/// (a contested one too): when templates of two servers match, nobody serves the URI. With
/// `owner` (the URI is owned), only that server's templates count. The template chosen
/// must be one the server serves (not in conflict itself). `Ok(None)`: none matches.
pub fn route<'a>(
    uri: &str,
    claims: &'a Claims,
    owner: Option<&str>,
) -> Result<Option<&'a Entry>, String> {
    let mut servers: Vec<&str> = Vec::new();
    let mut chosen: Option<&Entry> = None;
    let mut blocked: Option<String> = None;
    for e in claims.listed() {
        if owner.is_some_and(|o| o != e.server) || !matches(&e.upstream, uri) {
            continue;
        }
        if !servers.contains(&e.server.as_str()) {
            servers.push(&e.server);
        }
        if claims.serves(&e.name, &e.server) {
            chosen.get_or_insert(e);
        } else if blocked.is_none() {
            blocked = claims.why_not_served(&e.name);
        }
    }
    servers.sort_unstable();
    match (servers.as_slice(), chosen, owner) {
        ([], _, Some(owner)) => Err(format!(
            "{uri} belongs to server {owner}, which does not serve it now"
        )),
        ([], _, None) => Ok(None),
        ([_], Some(e), _) => Ok(Some(e)),
        ([_], None, _) => Err(blocked.unwrap_or_else(|| format!("{uri} is not served"))),
        (many, _, _) => Err(format!(
            "{uri} matches resource templates of servers {}; toolwall serves it from none of them until an operator names its owner ([servers.NAME] owns_resources)",
            many.join(" and ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn level_one_to_three_expressions() {
        assert!(matches("file:///{path}", "file:///notes.txt"));
        assert!(!matches("file:///{path}", "file:///a/b.txt"));
        assert!(matches("file:///{+path}", "file:///a/b.txt"));
        assert!(matches(
            "db://{table}/rows{?limit,offset}",
            "db://t/rows?limit=5&offset=1"
        ));
        assert!(matches("db://{table}/rows{?limit}", "db://t/rows"));
        assert!(!matches("db://{table}/rows", "db://t/cols"));
        assert!(matches("x://{a}-{b}", "x://1-2"));
        assert!(matches("x://fixed", "x://fixed"));
        assert!(!matches("x://{a", "x://1"));
        assert!(!matches("x://a}", "x://a}"));
    }

    #[test]
    fn bounded_on_hostile_input() {
        let t = "{a}".repeat(60);
        assert!(matches(&t, &"x".repeat(4000)));
        assert!(!matches(&"{a}".repeat(65), "x"));
        assert!(!matches("{+a}", &"x".repeat(MAX_URI_BYTES + 1)));
    }

    fn entry(template: &str, server: &str) -> Entry {
        Entry {
            name: template.into(),
            key: template.into(),
            server: server.into(),
            upstream: template.into(),
            worker: 0,
            json: String::new(),
            declares_input: false,
            header_bindings: Vec::new(),
        }
    }

    #[test]
    fn two_servers_matching_serve_nobody() {
        use crate::mcp::catalog::resource_owners::OwnerRules;
        let rules = OwnerRules::default();
        let mut c = Claims::default();
        c.set(
            "good",
            vec![
                entry("report://{id}", "good"),
                entry("shared://{id}", "good"),
            ],
            &rules,
        );
        c.set(
            "evil",
            vec![entry("{+anything}", "evil"), entry("shared://{id}", "evil")],
            &rules,
        );
        assert!(
            route("report://q3", &c, None)
                .unwrap_err()
                .contains("evil and good")
        );
        assert_eq!(
            route("report://q3", &c, Some("good"))
                .unwrap()
                .unwrap()
                .server,
            "good"
        );
        assert_eq!(route("other:x", &c, None).unwrap().unwrap().server, "evil");
        // The contested template counts: evil's catch-all does not get its URIs.
        assert!(route("shared://7", &c, None).is_err());
        assert!(route("report://q3", &c, Some("nobody")).is_err());
        let mut alone = Claims::default();
        alone.set("good", vec![entry("report://{id}", "good")], &rules);
        assert_eq!(
            route("report://q3", &alone, None).unwrap().unwrap().server,
            "good"
        );
        assert_eq!(route("x://y", &alone, None).unwrap(), None);
    }
}
