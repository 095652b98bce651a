//! Reading a URI through a resource template (RFC 6570 URI templates as MCP servers list
//! them, e.g. `file:///{path}` or `db://{table}/rows{?limit}`). A URI that no server lists
//! as a resource goes to the one server whose template matches it; when templates of two
//! servers match, nobody serves it (no server can capture another's reads by listing a
//! broad template). Pure; parsing is linear and matching is bounded by
//! [`MAX_PARTS`] × the URI's length squared.

use super::Entry;

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

/// The served template entry a read of `uri` goes to. With `owner` (the URI is owned),
/// only that server's templates count. `Ok(None)`: no template matches.
pub fn route<'a>(
    uri: &str,
    served: impl Iterator<Item = &'a Entry>,
    owner: Option<&str>,
) -> Result<Option<&'a Entry>, String> {
    let mut found: Option<&Entry> = None;
    let mut others: Vec<&str> = Vec::new();
    for e in served {
        if owner.is_some_and(|o| o != e.server) || !matches(&e.upstream, uri) {
            continue;
        }
        match found {
            None => found = Some(e),
            Some(f) if f.server == e.server => {}
            Some(_) => {
                if !others.contains(&e.server.as_str()) {
                    others.push(&e.server);
                }
            }
        }
    }
    match (found, owner) {
        (Some(f), _) if others.is_empty() => Ok(Some(f)),
        (Some(f), _) => Err(format!(
            "{uri} matches resource templates of servers {} and {}; toolwall serves it from none of them until an operator names its owner ([servers.NAME] owns_resources)",
            f.server,
            others.join(" and ")
        )),
        (None, Some(owner)) => Err(format!(
            "{uri} belongs to server {owner}, which does not serve it now"
        )),
        (None, None) => Ok(None),
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
            server: server.into(),
            upstream: template.into(),
            worker: 0,
            json: String::new(),
            declares_input: false,
        }
    }

    #[test]
    fn two_servers_matching_serve_nobody() {
        let good = entry("report://{id}", "good");
        let evil = entry("{+anything}", "evil");
        let both = [good.clone(), evil.clone()];
        assert!(route("report://q3", both.iter(), None).is_err());
        assert_eq!(
            route("report://q3", both.iter(), Some("good"))
                .unwrap()
                .unwrap()
                .server,
            "good"
        );
        assert_eq!(
            route("other:x", both.iter(), None).unwrap().unwrap().server,
            "evil"
        );
        assert!(route("report://q3", [evil].iter(), Some("good")).is_err());
        assert_eq!(
            route("report://q3", [good].iter(), None)
                .unwrap()
                .unwrap()
                .server,
            "good"
        );
    }
}
