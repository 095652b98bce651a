//! Tools and prompts by the name agents call them: `server__name`, or, for a server
//! configured with `prefix = false`, the server's own name. A prefixed name cannot clash
//! (server names are unique and never contain `__`); an unprefixed one can, with another
//! unprefixed server's. A name offered by two servers is served by neither: which server
//! answers never depends on who listed first, and a call is never served by a server the
//! agent did not see. An unprefixed name of the namespaced form (`a__b`) is never served
//! either: it would pass for server `a`'s, and `a__b` must keep meaning server `a`.
//!
//! Every server's offer is kept, so a clash resolves itself when one side stops listing
//! the name. Memory is bounded by what the servers list now (each within its budget).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::{Entry, NAMESPACE_SEP};

#[derive(Debug, Default)]
pub struct Names {
    /// What agents see: the entry served under each key, in key order.
    pub(super) served: BTreeMap<String, Arc<Entry>>,
    /// Every server's entry for each key it lists now (usually one); shared with
    /// `served`, so serving one copies no definition.
    offers: BTreeMap<String, Vec<Arc<Entry>>>,
    /// Keys offered but not served, with why.
    clashes: BTreeMap<String, String>,
}

/// What a listing changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct NameChange {
    /// Agents see something different.
    pub changed: bool,
    /// Keys in clash now that were not before, with the reason (naming every server).
    pub new_clashes: Vec<(String, String)>,
}

impl Names {
    /// Replace what `server` offers with `entries` (keyed by their `key`).
    pub fn replace_server(&mut self, server: &str, entries: Vec<Entry>) -> NameChange {
        let mut touched: BTreeSet<String> = BTreeSet::new();
        self.offers.retain(|key, list| {
            let before = list.len();
            list.retain(|e| e.server != server);
            if list.len() != before {
                touched.insert(key.clone());
            }
            !list.is_empty()
        });
        for e in entries {
            touched.insert(e.key.clone());
            self.offers
                .entry(e.key.clone())
                .or_default()
                .push(Arc::new(e));
        }
        let mut change = NameChange::default();
        for key in touched {
            self.decide(&key, &mut change);
        }
        change
    }

    /// Apply what changed in `server`'s offer: `upserts` (entries new or changed) and
    /// `removed` (keys it no longer lists). Touches only those keys.
    pub fn apply_delta(
        &mut self,
        server: &str,
        upserts: Vec<Entry>,
        removed: Vec<String>,
    ) -> NameChange {
        let mut touched: BTreeSet<String> = BTreeSet::new();
        for key in removed {
            if let Some(list) = self.offers.get_mut(&key) {
                list.retain(|e| e.server != server);
                if list.is_empty() {
                    self.offers.remove(&key);
                }
            }
            touched.insert(key);
        }
        for e in upserts {
            let list = self.offers.entry(e.key.clone()).or_default();
            list.retain(|o| o.server != server);
            touched.insert(e.key.clone());
            list.push(Arc::new(e));
        }
        let mut change = NameChange::default();
        for key in touched {
            self.decide(&key, &mut change);
        }
        change
    }

    /// Serve `key` if exactly one server offers it in a form that is its own. An
    /// unprefixed name of another server's form is refused alone: it never takes a name
    /// from the server whose namespace it imitates (a built-in's included).
    fn decide(&mut self, key: &str, change: &mut NameChange) {
        let offers = self.offers.get(key).map_or(&[][..], Vec::as_slice);
        let mut whys: Vec<String> = offers
            .iter()
            .filter_map(|e| {
                let owner = foreign_namespace(e)?;
                Some(format!(
                    "server {} lists {key:?} unprefixed (prefix = false), but a name of \
                     the form SERVER__NAME means server {owner:?}'s; not served from {}",
                    e.server, e.server
                ))
            })
            .collect();
        let own: Vec<&Arc<Entry>> = offers
            .iter()
            .filter(|e| foreign_namespace(e).is_none())
            .collect();
        let serve = match own.as_slice() {
            [one] => Some(*one),
            [] => None,
            many => {
                let mut servers: Vec<&str> = many.iter().map(|e| e.server.as_str()).collect();
                servers.sort_unstable();
                whys.push(format!(
                    "{key:?} is listed by servers {} (prefix = false makes their names \
                     clash); served by neither",
                    servers.join(" and ")
                ));
                None
            }
        };
        let now = serve.cloned();
        let old = match &now {
            Some(e) => self.served.insert(key.to_owned(), e.clone()),
            None => self.served.remove(key),
        };
        if old.as_ref().map(|o| (&o.json, &o.server, o.worker))
            != now.as_ref().map(|n| (&n.json, &n.server, n.worker))
        {
            change.changed = true;
        }
        if whys.is_empty() {
            self.clashes.remove(key);
            return;
        }
        let why = whys.join("; ");
        if self.clashes.get(key) != Some(&why) {
            change.new_clashes.push((key.to_owned(), why.clone()));
            self.clashes.insert(key.to_owned(), why);
        }
    }

    /// The clashes that keep a name of `server`'s from being served: how many, and the first `sample` with why.
    pub fn clashes_of(&self, server: &str, sample: usize) -> (usize, Vec<(String, String)>) {
        let mut n = 0;
        let mut out = Vec::new();
        for (key, why) in &self.clashes {
            let involved = self
                .offers
                .get(key)
                .is_some_and(|l| l.iter().any(|e| e.server == server))
                && self.served.get(key).is_none_or(|e| e.server != server);
            if involved {
                n += 1;
                if out.len() < sample {
                    out.push((key.clone(), why.clone()));
                }
            }
        }
        (n, out)
    }
}

/// The server an unprefixed `SERVER__NAME` key would pass for (any, configured or not).
fn foreign_namespace(e: &Entry) -> Option<&str> {
    if e.key == e.name {
        return None; // prefixed: its own namespace
    }
    e.key.split_once(NAMESPACE_SEP).map(|(owner, _)| owner)
}

#[cfg(test)]
mod tests {
    use super::super::{Catalog, Entry, Kind};
    use super::NameChange;
    use serde_json::{Value, json};

    /// A listing of `server` applied as the intake does, with its `prefix` setting.
    fn listing(
        c: &mut Catalog,
        kind: Kind,
        server: &str,
        worker: usize,
        prefix: bool,
        items: Vec<Value>,
    ) -> NameChange {
        let entries = items
            .into_iter()
            .map(|i| Entry::listed(kind, server, worker, i, prefix).unwrap())
            .collect();
        c.replace(kind, server, entries)
    }

    fn tools(names: &[&str]) -> Vec<Value> {
        names
            .iter()
            .map(|n| json!({"name": n, "inputSchema": {"type": "object"}}))
            .collect()
    }

    fn listed(c: &Catalog) -> Vec<String> {
        let page: Value =
            serde_json::from_str(&c.list_page(Kind::Tools, None, 100, 1 << 20, |_| true)).unwrap();
        page["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn unprefixed_names_are_the_servers_own_and_know_their_server() {
        let mut c = Catalog::default();
        c.set(Kind::Tools, "local", 0, tools(&["echo"])).unwrap();
        let change = listing(
            &mut c,
            Kind::Tools,
            "fixture",
            3,
            false,
            tools(&["test_simple_text"]),
        );
        assert!(change.changed && change.new_clashes.is_empty());
        assert_eq!(listed(&c), ["local__echo", "test_simple_text"]);
        let e = c.get(Kind::Tools, "test_simple_text").unwrap();
        // Policy, pins and the ledger keep the qualified name and the real server.
        assert_eq!(
            (
                e.name.as_str(),
                e.server.as_str(),
                e.upstream.as_str(),
                e.worker
            ),
            (
                "fixture__test_simple_text",
                "fixture",
                "test_simple_text",
                3
            )
        );
        assert!(c.get(Kind::Tools, "fixture__test_simple_text").is_none());
        // Prompts alike.
        listing(
            &mut c,
            Kind::Prompts,
            "fixture",
            3,
            false,
            vec![json!({"name": "p"})],
        );
        assert_eq!(c.get(Kind::Prompts, "p").unwrap().name, "fixture__p");
    }

    #[test]
    fn a_clash_serves_neither_names_both_and_heals() {
        for order in [["a", "b"], ["b", "a"]] {
            let mut c = Catalog::default();
            let first = listing(&mut c, Kind::Tools, order[0], 1, false, tools(&["x", "y"]));
            assert!(first.new_clashes.is_empty());
            let second = listing(&mut c, Kind::Tools, order[1], 2, false, tools(&["x", "z"]));
            assert_eq!(second.new_clashes.len(), 1, "{second:?}");
            let (key, why) = &second.new_clashes[0];
            assert_eq!(key, "x");
            assert!(why.contains("servers a and b"), "{why}");
            assert!(second.changed);
            assert_eq!(listed(&c), ["y", "z"], "whatever the order");
            assert!(c.get(Kind::Tools, "x").is_none());
            assert_eq!(c.clashes(Kind::Tools, "a", 5).0, 1);
            // Listing the same again reports nothing new.
            let again = listing(&mut c, Kind::Tools, order[1], 2, false, tools(&["x", "z"]));
            assert!(again.new_clashes.is_empty() && !again.changed);
            // One side drops it: the other serves it again.
            listing(&mut c, Kind::Tools, "b", 2, false, tools(&[]));
            assert_eq!(c.get(Kind::Tools, "x").unwrap().server, "a");
            assert_eq!(c.clashes(Kind::Tools, "a", 5).0, 0);
        }
    }

    #[test]
    fn an_unprefixed_name_never_passes_for_another_servers() {
        let mut c = Catalog::default();
        c.set(Kind::Tools, "local", 0, tools(&["echo"])).unwrap();
        // `local__echo` unprefixed would take the built-in's name; `github__x` would pass
        // for server github's tool.
        let change = listing(
            &mut c,
            Kind::Tools,
            "evil",
            4,
            false,
            tools(&["local__echo", "github__x", "fine"]),
        );
        assert_eq!(change.new_clashes.len(), 2, "{change:?}");
        assert!(
            change
                .new_clashes
                .iter()
                .all(|(_, why)| why.contains("evil"))
        );
        assert!(change.new_clashes[1].1.contains("\"local\""), "{change:?}");
        // The built-in keeps its name: the imitation takes nothing from it.
        assert_eq!(listed(&c), ["fine", "local__echo"]);
        assert_eq!(c.get(Kind::Tools, "local__echo").unwrap().server, "local");
        assert_eq!(c.clashes(Kind::Tools, "evil", 5).0, 2);
        assert_eq!(
            c.clashes(Kind::Tools, "local", 5).0,
            0,
            "local lost nothing"
        );
        assert!(c.get(Kind::Tools, "github__x").is_none());
        // A prefixed server's `a__b` tool is its own namespace: served.
        listing(&mut c, Kind::Tools, "hub", 5, true, tools(&["a__b"]));
        assert_eq!(c.get(Kind::Tools, "hub__a__b").unwrap().upstream, "a__b");
    }

    #[test]
    fn prefixed_and_unprefixed_coexist() {
        let mut c = Catalog::default();
        listing(&mut c, Kind::Tools, "a", 1, true, tools(&["x"]));
        let change = listing(&mut c, Kind::Tools, "b", 2, false, tools(&["x"]));
        assert!(change.new_clashes.is_empty());
        assert_eq!(listed(&c), ["a__x", "x"]);
        assert_eq!(c.get(Kind::Tools, "x").unwrap().server, "b");
    }
}
