//! URIs (and templates) a server started serving alone after start, waiting to be
//! remembered as its own. Who owns a new URI must not depend on which server's listing
//! arrives first: a URI is remembered only once every other enabled server has listed its
//! resources and its templates after the URI appeared. Two servers listing it in that
//! window contest it (nobody serves it until `owns_resources` names the owner), whatever
//! the order their answers came in. A server that never lists again (down, or silent)
//! keeps the URI waiting: served by its only lister, never remembered, so never taken from
//! the other server later.
//!
//! Bounded: at most `cap` URIs wait per server (`[servers] max_remembered_uris`); more are
//! served without being remembered. Sans-IO.

use std::collections::HashMap;

use crate::mcp::catalog::Kind;

#[derive(Debug)]
struct Waiting {
    server: String,
    kind: Kind,
    /// The listing count when it appeared.
    since: u64,
}

#[derive(Debug)]
pub struct OwnerCandidates {
    /// Listings of resources or templates applied, in order.
    count: u64,
    /// The last listing of each server and kind.
    heard: HashMap<(String, Kind), u64>,
    waiting: HashMap<String, Waiting>,
    per_server: HashMap<String, usize>,
    cap: usize,
    /// URIs not kept waiting because their server had `cap` waiting already.
    pub over_cap: u64,
}

impl OwnerCandidates {
    pub fn new(cap: usize) -> OwnerCandidates {
        OwnerCandidates {
            count: 0,
            heard: HashMap::new(),
            waiting: HashMap::new(),
            per_server: HashMap::new(),
            cap,
            over_cap: 0,
        }
    }

    /// `server` has just listed `kind` (call before adding what the listing made sole).
    pub fn heard(&mut self, server: &str, kind: Kind) {
        self.count += 1;
        self.heard.insert((server.to_owned(), kind), self.count);
    }

    /// URIs of `kind` served alone now, `(uri, server)`: they wait (a URI already waiting
    /// for the same server keeps its place).
    pub fn add(&mut self, kind: Kind, sole: Vec<(String, String)>) {
        for (uri, server) in sole {
            if let Some(w) = self.waiting.get(&uri) {
                if w.server == server && w.kind == kind {
                    continue;
                }
                self.remove(&uri);
            }
            let n = self.per_server.entry(server.clone()).or_default();
            if *n >= self.cap {
                self.over_cap += 1;
                continue;
            }
            *n += 1;
            self.waiting.insert(
                uri,
                Waiting {
                    server,
                    kind,
                    since: self.count,
                },
            );
        }
    }

    fn remove(&mut self, uri: &str) {
        if let Some(w) = self.waiting.remove(uri)
            && let Some(n) = self.per_server.get_mut(&w.server)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_server.remove(&w.server);
            }
        }
    }

    /// Take the URIs every other server of `enabled` has listed resources and templates
    /// since: `(uri, server, kind)`, to be checked (still served alone?) and remembered.
    pub fn ripe(&mut self, enabled: &[String]) -> Vec<(String, String, Kind)> {
        // For each server with waiting URIs: the oldest last listing among the others.
        let mut floor: HashMap<&str, u64> = HashMap::new();
        for w in self.waiting.values() {
            if floor.contains_key(w.server.as_str()) {
                continue;
            }
            let least = enabled
                .iter()
                .filter(|s| **s != w.server)
                .flat_map(|s| {
                    [Kind::Resources, Kind::Templates]
                        .map(|k| self.heard.get(&(s.clone(), k)).copied().unwrap_or(0))
                })
                .min()
                .unwrap_or(u64::MAX);
            floor.insert(w.server.as_str(), least);
        }
        let ripe: Vec<String> = self
            .waiting
            .iter()
            .filter(|(_, w)| floor.get(w.server.as_str()).is_some_and(|f| *f > w.since))
            .map(|(uri, _)| uri.clone())
            .collect();
        let mut out = Vec::with_capacity(ripe.len());
        for uri in ripe {
            if let Some(w) = self.waiting.get(&uri) {
                let (server, kind) = (w.server.clone(), w.kind);
                self.remove(&uri);
                out.push((uri, server, kind));
            }
        }
        out
    }

    /// Forget what waits for `server` (no longer enabled).
    pub fn drop_server(&mut self, server: &str) {
        let uris: Vec<String> = self
            .waiting
            .iter()
            .filter(|(_, w)| w.server == server)
            .map(|(u, _)| u.clone())
            .collect();
        for u in uris {
            self.remove(&u);
        }
    }

    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn servers() -> Vec<String> {
        vec!["evil".into(), "good".into()]
    }

    fn sole(uri: &str, server: &str) -> Vec<(String, String)> {
        vec![(uri.into(), server.into())]
    }

    #[test]
    fn remembered_only_once_every_other_server_listed_after_it_appeared() {
        let mut c = OwnerCandidates::new(10);
        for s in ["evil", "good"] {
            c.heard(s, Kind::Resources);
            c.heard(s, Kind::Templates);
        }
        // evil lists a new URI first: it waits.
        c.heard("evil", Kind::Resources);
        c.add(Kind::Resources, sole("report://q3", "evil"));
        assert!(c.ripe(&servers()).is_empty());
        // good lists its resources: not yet its templates.
        c.heard("good", Kind::Resources);
        assert!(c.ripe(&servers()).is_empty());
        c.heard("good", Kind::Templates);
        assert_eq!(
            c.ripe(&servers()),
            vec![("report://q3".into(), "evil".into(), Kind::Resources)]
        );
        assert!(c.is_empty());
        // good listing it again keeps its place; it waits for both of evil's lists.
        c.add(Kind::Resources, sole("x://1", "good"));
        c.heard("good", Kind::Resources);
        c.add(Kind::Resources, sole("x://1", "good"));
        c.heard("evil", Kind::Resources);
        assert!(c.ripe(&servers()).is_empty());
        c.heard("evil", Kind::Templates);
        assert_eq!(c.ripe(&servers()).len(), 1);
        assert_eq!(c.ripe(&["good".to_string()]).len(), 0);
    }

    #[test]
    fn bounded_per_server() {
        let mut c = OwnerCandidates::new(3);
        let many: Vec<(String, String)> = (0..10)
            .map(|i| (format!("u://{i}"), "evil".to_string()))
            .collect();
        c.add(Kind::Resources, many);
        c.add(Kind::Resources, sole("g://1", "good"));
        assert_eq!((c.len(), c.over_cap), (4, 7));
        c.drop_server("evil");
        assert_eq!(c.len(), 1);
    }
}
