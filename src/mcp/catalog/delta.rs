//! A listing as the change it makes: the listing intake (off the gateway's loop) compares a
//! server's new entries with what the loop applied last for that server and kind, and the
//! loop applies only the entries added or changed and the keys gone — O(changed) on the
//! loop, all in one turn, so agents see the whole listing or none of it.
//!
//! What was applied is kept as [`Fingerprints`] (key → digest of the entry as agents see
//! it and the worker it routes to), shared between the loop and the intake through an
//! `Arc`: a job carries the `Arc` the loop holds when it hands the listing over, and the
//! loop applies a delta only when that `Arc` is still the one it holds (else the catalog
//! changed under the listing — a reload removed the server, say — and the server is
//! listed again in full).

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Arc;

use super::{Entry, Kind};

/// Per catalog key of one server and kind: a digest of the entry applied.
pub type Fingerprints = HashMap<String, [u8; 16]>;

/// What a listing changes against `base`.
#[derive(Debug)]
pub struct Delta {
    /// `base` was empty: the entries are the whole listing (applied as a replacement).
    pub full: bool,
    /// Keys applied before and no longer listed.
    pub removed: Vec<String>,
    /// What the delta was computed against.
    pub base: Arc<Fingerprints>,
    /// What is applied once the delta is.
    pub after: Arc<Fingerprints>,
}

/// A fresh, empty base (a distinct allocation: a job diffed against another base never
/// matches it).
pub fn fresh() -> Arc<Fingerprints> {
    Arc::new(Fingerprints::new())
}

/// The key an entry of `kind` has in the catalog.
pub fn key_of(kind: Kind, e: &Entry) -> &str {
    if kind.namespaced() { &e.key } else { &e.name }
}

fn fingerprint(e: &Entry) -> [u8; 16] {
    let mut h = Sha256::new();
    h.update((e.worker as u64).to_le_bytes());
    h.update((e.server.len() as u64).to_le_bytes());
    h.update(e.server.as_bytes());
    h.update(e.json.as_bytes());
    let d = h.finalize();
    let mut out = [0u8; 16];
    out.copy_from_slice(&d[..16]);
    out
}

/// Keep in `entries` only what differs from `base` (all of them when `base` is empty),
/// and say what is gone.
pub fn diff(kind: Kind, base: Arc<Fingerprints>, entries: &mut Vec<Entry>) -> Delta {
    let mut after = Fingerprints::with_capacity(entries.len());
    let full = base.is_empty();
    entries.retain(|e| {
        let fp = fingerprint(e);
        let key = key_of(kind, e);
        let same = base.get(key) == Some(&fp);
        after.insert(key.to_owned(), fp);
        full || !same
    });
    let removed = base
        .keys()
        .filter(|k| !after.contains_key(*k))
        .cloned()
        .collect();
    Delta {
        full,
        removed,
        base,
        after: Arc::new(after),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(key: &str, json: &str) -> Entry {
        Entry {
            name: format!("up__{key}"),
            key: format!("up__{key}"),
            server: "up".into(),
            upstream: key.into(),
            worker: 1,
            json: json.into(),
            declares_input: false,
            header_bindings: Vec::new(),
        }
    }

    #[test]
    fn only_what_changed_travels() {
        let mut first = vec![e("a", "1"), e("b", "2")];
        let d = diff(Kind::Tools, fresh(), &mut first);
        assert!(d.full && d.removed.is_empty());
        assert_eq!(first.len(), 2);
        let mut second = vec![e("a", "1"), e("b", "changed"), e("c", "3")];
        let d2 = diff(Kind::Tools, d.after.clone(), &mut second);
        assert!(!d2.full);
        let keys: Vec<&str> = second.iter().map(|x| x.key.as_str()).collect();
        assert_eq!(keys, vec!["up__b", "up__c"]);
        let mut third = vec![e("c", "3")];
        let d3 = diff(Kind::Tools, d2.after.clone(), &mut third);
        assert!(third.is_empty());
        let mut gone = d3.removed.clone();
        gone.sort();
        assert_eq!(gone, vec!["up__a", "up__b"]);
        // Another worker is another entry.
        let mut moved = vec![Entry {
            worker: 2,
            ..e("c", "3")
        }];
        diff(Kind::Tools, d3.after, &mut moved);
        assert_eq!(moved.len(), 1);
    }
}
