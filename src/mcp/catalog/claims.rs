//! Resources (and resource templates) as servers list them: every server's entry for each
//! URI is kept, and what agents see is decided by [`OwnerRules`] (see `resource_owners.rs`).
//! A listing changes only the URIs it adds or drops, so relisting the same conflicting
//! URIs again and again changes nothing and allocates nothing that lasts: memory is bounded
//! by what the servers list now (each server's listing is within its budget).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::Entry;
use super::resource_owners::OwnerRules;

#[derive(Debug, Default)]
pub struct Claims {
    /// What agents see: one entry per served key, in key order.
    pub(super) served: BTreeMap<String, Arc<Entry>>,
    /// Every server's entry for each key it lists now (shared with `served`).
    by_key: HashMap<Arc<str>, Vec<Arc<Entry>>>,
    /// The keys each server lists now.
    by_server: HashMap<String, BTreeSet<Arc<str>>>,
    /// Per server: the keys it lists but does not serve because of another server (or of
    /// an ambiguous configuration), with why.
    conflicts: HashMap<String, BTreeMap<Arc<str>, String>>,
}

/// What a listing changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ClaimChange {
    /// Agents see something different.
    pub changed: bool,
    /// Keys that are in conflict now and were not before (any server), with the reason.
    pub new_conflicts: Vec<(String, String)>,
    /// Keys served alone, not remembered yet: candidates for remembering.
    pub unremembered: Vec<(String, String)>,
}

impl Claims {
    /// Replace what `server` lists with `entries` (keyed by their `name`, the URI).
    pub fn set(&mut self, server: &str, entries: Vec<Entry>, rules: &OwnerRules) -> ClaimChange {
        let old: BTreeSet<Arc<str>> = self.by_server.remove(server).unwrap_or_default();
        let mut new: BTreeSet<Arc<str>> = BTreeSet::new();
        let mut touched: BTreeSet<Arc<str>> = BTreeSet::new();
        for entry in entries {
            let key: Arc<str> = match self.by_key.get_key_value(entry.name.as_str()) {
                Some((k, _)) => Arc::clone(k),
                None => Arc::from(entry.name.as_str()),
            };
            let list = self.by_key.entry(Arc::clone(&key)).or_default();
            match list.iter_mut().find(|e| e.server == server) {
                Some(existing) => {
                    if existing.json != entry.json || existing.worker != entry.worker {
                        *existing = Arc::new(entry);
                        touched.insert(Arc::clone(&key));
                    }
                }
                None => {
                    list.push(Arc::new(entry));
                    touched.insert(Arc::clone(&key));
                }
            }
            new.insert(key);
        }
        for gone in old.difference(&new) {
            if let Some(list) = self.by_key.get_mut(gone) {
                list.retain(|e| e.server != server);
                if list.is_empty() {
                    self.by_key.remove(gone);
                }
            }
            touched.insert(Arc::clone(gone));
        }
        if !new.is_empty() {
            self.by_server.insert(server.to_owned(), new);
        }
        let mut change = ClaimChange::default();
        for key in touched {
            self.decide(&key, rules, &mut change);
        }
        change
    }

    /// Apply what changed in what `server` lists: `upserts` (entries new or changed) and
    /// `removed` (keys it no longer lists). Touches only those keys.
    pub fn apply_delta(
        &mut self,
        server: &str,
        upserts: Vec<Entry>,
        removed: Vec<String>,
        rules: &OwnerRules,
    ) -> ClaimChange {
        let mut touched: BTreeSet<Arc<str>> = BTreeSet::new();
        let mut mine = self.by_server.remove(server).unwrap_or_default();
        for gone in removed {
            let Some((key, _)) = self.by_key.get_key_value(gone.as_str()) else {
                continue;
            };
            let key = Arc::clone(key);
            if let Some(list) = self.by_key.get_mut(&key) {
                list.retain(|e| e.server != server);
                if list.is_empty() {
                    self.by_key.remove(&key);
                }
            }
            mine.remove(&key);
            touched.insert(key);
        }
        for entry in upserts {
            let key: Arc<str> = match self.by_key.get_key_value(entry.name.as_str()) {
                Some((k, _)) => Arc::clone(k),
                None => Arc::from(entry.name.as_str()),
            };
            let list = self.by_key.entry(Arc::clone(&key)).or_default();
            list.retain(|e| e.server != server);
            list.push(Arc::new(entry));
            mine.insert(Arc::clone(&key));
            touched.insert(key);
        }
        if !mine.is_empty() {
            self.by_server.insert(server.to_owned(), mine);
        }
        let mut change = ClaimChange::default();
        for key in touched {
            self.decide(&key, rules, &mut change);
        }
        change
    }

    /// Decide every key again (owners changed: reload, a remembered owner).
    pub fn recheck(&mut self, rules: &OwnerRules) -> ClaimChange {
        let keys: Vec<Arc<str>> = self
            .by_key
            .keys()
            .cloned()
            .chain(self.served.keys().map(|k| Arc::from(k.as_str())))
            .collect();
        let mut change = ClaimChange::default();
        let mut done = BTreeSet::new();
        for key in keys {
            if done.insert(Arc::clone(&key)) {
                self.decide(&key, rules, &mut change);
            }
        }
        change
    }

    fn decide(&mut self, key: &Arc<str>, rules: &OwnerRules, change: &mut ClaimChange) {
        let claimants: Vec<&str> = self
            .by_key
            .get(key)
            .map(|l| l.iter().map(|e| e.server.as_str()).collect())
            .unwrap_or_default();
        let verdict = rules.decide(key, &claimants);
        let chosen = verdict.served_by.as_ref().and_then(|s| {
            self.by_key
                .get(key)
                .and_then(|l| l.iter().find(|e| &e.server == s))
                .cloned()
        });
        let before = self.served.get(&**key);
        let differs = match (&chosen, before) {
            (Some(a), Some(b)) => a.json != b.json || a.server != b.server || a.worker != b.worker,
            (None, None) => false,
            _ => true,
        };
        if differs {
            change.changed = true;
            match chosen {
                Some(e) => {
                    if rules.remembered(key).is_none() && rules.owner_of(key).is_none() {
                        change
                            .unremembered
                            .push((key.to_string(), e.server.clone()));
                    }
                    self.served.insert(key.to_string(), e);
                }
                None => {
                    self.served.remove(&**key);
                }
            }
        } else if let Some(e) = &chosen
            && rules.owner_of(key).is_none()
        {
            change
                .unremembered
                .push((key.to_string(), e.server.clone()));
        }
        // Conflicts: every claimant that does not serve it, when there is a conflict.
        for (server, conflicts) in self.conflicts.iter_mut() {
            let still = verdict.conflict.is_some()
                && claimants.contains(&server.as_str())
                && verdict.served_by.as_deref() != Some(server.as_str());
            if !still {
                conflicts.remove(key);
            }
        }
        if let Some(why) = &verdict.conflict {
            let mut fresh = false;
            for server in &claimants {
                if verdict.served_by.as_deref() == Some(*server) {
                    continue;
                }
                let set = self.conflicts.entry((*server).to_owned()).or_default();
                if set.insert(Arc::clone(key), why.clone()).is_none() {
                    fresh = true;
                }
            }
            if fresh {
                change.new_conflicts.push((key.to_string(), why.clone()));
            }
        }
        self.conflicts.retain(|_, c| !c.is_empty());
    }

    /// How many keys `server` lists but does not serve because of a conflict, and up to
    /// `sample` of them with the reason.
    pub fn conflicts_of(&self, server: &str, sample: usize) -> (usize, Vec<(String, String)>) {
        match self.conflicts.get(server) {
            Some(c) => (
                c.len(),
                c.iter()
                    .take(sample)
                    .map(|(k, why)| (k.to_string(), why.clone()))
                    .collect(),
            ),
            None => (0, Vec::new()),
        }
    }

    /// Why `key` is not served although someone lists it.
    pub fn why_not_served(&self, key: &str) -> Option<String> {
        if self.served.contains_key(key) {
            return None;
        }
        self.conflicts.values().find_map(|c| c.get(key).cloned())
    }

    /// Keys `server` lists now.
    pub fn listed_by(&self, server: &str) -> impl Iterator<Item = &str> {
        self.by_server
            .get(server)
            .into_iter()
            .flatten()
            .map(|k| &**k)
    }

    /// Every entry served.
    pub fn served(&self) -> impl Iterator<Item = &Entry> {
        self.served.values().map(|e| &**e)
    }

    /// Every entry every server lists now, served or not (template matching must see the
    /// contested ones too).
    pub fn listed(&self) -> impl Iterator<Item = &Entry> {
        self.by_key.values().flatten().map(|e| &**e)
    }

    /// Whether `key` is served by `server`.
    pub fn serves(&self, key: &str, server: &str) -> bool {
        self.served.get(key).is_some_and(|e| e.server == server)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(uri: &str, server: &str, text: &str) -> Entry {
        Entry {
            name: uri.into(),
            key: uri.into(),
            server: server.into(),
            upstream: uri.into(),
            worker: 1,
            json: format!("{{\"uri\":\"{uri}\",\"text\":\"{text}\"}}"),
            declares_input: false,
            header_bindings: Vec::new(),
        }
    }

    #[test]
    fn second_lister_makes_a_uri_contested_whatever_the_order() {
        let rules = OwnerRules::default();
        let mut c = Claims::default();
        let ch = c.set("evil", vec![entry("r://q3", "evil", "EVIL")], &rules);
        assert!(ch.changed);
        assert_eq!(ch.unremembered, vec![("r://q3".into(), "evil".into())]);
        assert_eq!(c.served["r://q3"].server, "evil");
        let ch = c.set("good", vec![entry("r://q3", "good", "GOOD")], &rules);
        assert!(ch.changed);
        assert_eq!(ch.new_conflicts.len(), 1);
        assert!(!c.served.contains_key("r://q3"));
        assert_eq!(c.conflicts_of("good", 10).0, 1);
        assert_eq!(c.conflicts_of("evil", 10).0, 1);
        assert!(
            c.why_not_served("r://q3")
                .unwrap()
                .contains("evil and good")
        );
        // Relisting the same conflict: nothing changes, nothing new is reported.
        for _ in 0..3 {
            let ch = c.set("evil", vec![entry("r://q3", "evil", "EVIL")], &rules);
            assert_eq!(ch, ClaimChange::default());
        }
        // evil drops it: good serves it.
        let ch = c.set("evil", vec![], &rules);
        assert!(ch.changed);
        assert_eq!(c.served["r://q3"].server, "good");
        assert_eq!(c.conflicts_of("good", 10).0, 0);
        assert_eq!(c.conflicts_of("evil", 10).0, 0);
    }

    #[test]
    fn a_remembered_owner_keeps_it_and_recheck_applies_new_rules() {
        let mut rules = OwnerRules::default();
        rules.remember("r://q3", "good");
        let mut c = Claims::default();
        c.set("evil", vec![entry("r://q3", "evil", "EVIL")], &rules);
        assert!(!c.served.contains_key("r://q3"));
        assert_eq!(c.conflicts_of("evil", 10).0, 1);
        c.set("good", vec![entry("r://q3", "good", "GOOD")], &rules);
        assert_eq!(c.served["r://q3"].server, "good");
        rules.forget("r://q3");
        let ch = c.recheck(&rules);
        assert!(ch.changed);
        assert!(!c.served.contains_key("r://q3"), "contested now");
    }

    #[test]
    fn memory_follows_the_current_listings() {
        let rules = OwnerRules::default();
        let mut c = Claims::default();
        let many = |s: &str| {
            (0..100)
                .map(|i| entry(&format!("r://{i}"), s, "x"))
                .collect()
        };
        for _ in 0..5 {
            c.set("a", many("a"), &rules);
            c.set("b", many("b"), &rules);
        }
        assert_eq!(c.by_key.len(), 100);
        assert_eq!(c.conflicts_of("a", 3), (100, c.conflicts_of("a", 3).1));
        c.set("a", vec![], &rules);
        c.set("b", vec![], &rules);
        assert!(c.by_key.is_empty() && c.served.is_empty() && c.conflicts.is_empty());
    }
}
