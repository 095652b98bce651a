//! Resources one server lists inside another server's resource template. A template claims
//! every URI it matches, so a URI listed by server E that matches a template of server G
//! is in effect listed by both: E must not take G's reads by listing it. Such a URI is
//! never remembered as E's (no first-come ownership through a gap in G's listing) and is
//! reported as a conflict; reads of it follow `Catalog::resource_route` (its configured
//! owner, else nobody).

use crate::mcp::catalog::{Catalog, template_conflict};

/// `(uri, server)` pairs, or `(uri, reason)` pairs.
type Pairs = Vec<(String, String)>;

/// Split URIs served alone (`(uri, server)`) into those inside another server's template,
/// as conflicts with the reason, and those really alone.
pub fn split(catalog: &Catalog, sole: Pairs) -> (Pairs, Pairs) {
    let mut inside = Vec::new();
    let mut alone = Vec::with_capacity(sole.len());
    for (uri, server) in sole {
        let rivals = catalog.template_rivals(&uri, &server);
        if rivals.is_empty() {
            alone.push((uri, server));
        } else {
            inside.push((uri.clone(), template_conflict(&uri, &server, &rivals)));
        }
    }
    (inside, alone)
}
