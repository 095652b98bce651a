//! Resources one server lists inside another server's resource template. A template claims
//! every URI it matches, so a URI listed by server E that matches a template of server G
//! is in effect listed by both: E must not take G's reads by listing it. Such a URI is
//! never remembered as E's (no first-come ownership through a gap in G's listing) and is
//! reported as a conflict; reads of it follow `Catalog::resource_route` (its configured
//! owner, else nobody).

use crate::mcp::catalog::{Catalog, template_conflict};

/// `(uri, server)` pairs, or `(uri, reason)` pairs.
type Pairs = Vec<(String, String)>;

/// Templates looked at per call of [`split`] (URIs × other servers' templates): a listing
/// of 10,000 URIs against another server's 1,000 templates must not hold the gateway's
/// loop. URIs left unchecked are not remembered (still served; each read is checked on
/// its own).
pub const MAX_TEMPLATE_MATCHES: usize = 200_000;

/// Split URIs served alone (`(uri, server)`) into those inside another server's template,
/// as conflicts with the reason, and those really alone; URIs not checked within
/// [`MAX_TEMPLATE_MATCHES`] are in neither.
pub fn split(catalog: &Catalog, sole: Pairs) -> (Pairs, Pairs) {
    let mut inside = Vec::new();
    let mut alone = Vec::with_capacity(sole.len());
    let mut budget = MAX_TEMPLATE_MATCHES;
    for (uri, server) in sole {
        match catalog.template_rivals_within(&uri, &server, &mut budget) {
            Some(rivals) if rivals.is_empty() => alone.push((uri, server)),
            Some(rivals) => {
                inside.push((uri.clone(), template_conflict(&uri, &server, &rivals)));
            }
            None => break,
        }
    }
    (inside, alone)
}
