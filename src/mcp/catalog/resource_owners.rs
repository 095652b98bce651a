//! Who may serve a resource URI (or a resource template) that servers list. URIs are global
//! names, so two upstreams can list the same one; the rule below makes sure no server ever
//! takes a URI from another, whatever the order or speed of their listings:
//!
//! 1. **Configured owner.** `[servers.NAME] owns_resources = ["report://*"]`: a URI that
//!    matches one server's patterns is served by that server only (when it lists it, or a
//!    read is routed to it); every other server listing it is in conflict. Patterns of two
//!    servers matching one URI: nobody serves it (the config is ambiguous).
//! 2. **Remembered owner.** A URI a server served, alone, once every enabled server had
//!    listed its resources, is remembered in the ledger database (`resource_owners`) as
//!    that server's: across restarts and reloads, another server listing it is in conflict,
//!    also while the owner is down. Forgotten when the owner has not listed it for
//!    `[servers] pin_retention_secs`.
//! 3. **Otherwise**, a URI listed by one server is served by it (not yet remembered until
//!    every server has listed once: a server down at start cannot have its URIs taken for
//!    good); a URI listed by two or more servers is **contested**: nobody serves it until
//!    the operator names an owner (rule 1).
//!
//! Pure: the catalog calls [`OwnerRules::decide`] for every URI a listing touches.

use globset::{Glob, GlobBuilder, GlobMatcher};
use std::collections::{BTreeMap, HashMap};

/// Longest `owns_resources` pattern.
pub const MAX_PATTERN_BYTES: usize = 1024;

/// Check and compile one `owns_resources` pattern (`*` matches any run of characters,
/// `/` included; `?` one character; `[...]` a class).
pub fn compile_pattern(pattern: &str) -> Result<GlobMatcher, String> {
    if pattern.is_empty() || pattern.len() > MAX_PATTERN_BYTES {
        return Err(format!("a pattern must be 1 to {MAX_PATTERN_BYTES} bytes"));
    }
    if pattern.chars().any(char::is_control) {
        return Err("a pattern must not hold control characters".into());
    }
    GlobBuilder::new(pattern)
        .literal_separator(false)
        .backslash_escape(true)
        .build()
        .map(|g: Glob| g.compile_matcher())
        .map_err(|e| format!("bad pattern {}: {e}", pattern.escape_debug()))
}

/// Templates remembered per server for [`OwnerRules::template_owner`] (each read of a
/// concrete URI matches against all of them).
pub const MAX_REMEMBERED_TEMPLATES: usize = 64;

/// What decides a URI's server, besides who lists it.
#[derive(Debug, Default, Clone)]
pub struct OwnerRules {
    /// `owns_resources` of each server, compiled.
    configured: Vec<(String, Vec<GlobMatcher>)>,
    /// Remembered owners: URI (or template) -> server.
    remembered: HashMap<String, String>,
    /// The remembered templates alone (template -> server), at most
    /// [`MAX_REMEMBERED_TEMPLATES`] per server: a read of a concrete URI inside one goes to
    /// its server only, even while that server is down and another lists the URI.
    templates: BTreeMap<String, String>,
    /// How many are remembered per server.
    per_server: HashMap<String, usize>,
    /// Every enabled server has listed its resources at least once in this run: a URI
    /// served alone may now be remembered.
    pub settled: bool,
}

/// The verdict for one URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The server that serves it, if any.
    pub served_by: Option<String>,
    /// Why the other claimants (or all of them) do not serve it; none when there is no
    /// conflict.
    pub conflict: Option<String>,
}

impl OwnerRules {
    /// `owns` is each server's `owns_resources` (patterns already validated by the config).
    pub fn new(owns: &[(String, Vec<String>)]) -> OwnerRules {
        let configured = owns
            .iter()
            .filter(|(_, p)| !p.is_empty())
            .map(|(server, patterns)| {
                (
                    server.clone(),
                    patterns
                        .iter()
                        .filter_map(|p| compile_pattern(p).ok())
                        .collect(),
                )
            })
            .collect();
        OwnerRules {
            configured,
            remembered: HashMap::new(),
            templates: BTreeMap::new(),
            per_server: HashMap::new(),
            settled: false,
        }
    }

    /// New `owns_resources` (reload); remembered owners stay.
    pub fn set_configured(&mut self, owns: &[(String, Vec<String>)]) {
        let settled = self.settled;
        let remembered = std::mem::take(&mut self.remembered);
        let templates = std::mem::take(&mut self.templates);
        let per_server = std::mem::take(&mut self.per_server);
        *self = OwnerRules::new(owns);
        self.remembered = remembered;
        self.templates = templates;
        self.per_server = per_server;
        self.settled = settled;
    }

    pub fn remember(&mut self, key: &str, server: &str) {
        if let Some(old) = self.remembered.insert(key.to_owned(), server.to_owned()) {
            self.uncount(&old);
        }
        *self.per_server.entry(server.to_owned()).or_default() += 1;
        self.templates.remove(key);
        if key.contains('{')
            && self.templates.values().filter(|s| *s == server).count() < MAX_REMEMBERED_TEMPLATES
        {
            self.templates.insert(key.to_owned(), server.to_owned());
        }
    }

    pub fn forget(&mut self, key: &str) {
        if let Some(old) = self.remembered.remove(key) {
            self.uncount(&old);
        }
        self.templates.remove(key);
    }

    /// The server whose remembered template `uri` (a concrete URI) falls in: `None` when
    /// none does, `Err` when templates of two servers do.
    pub fn template_owner(&self, uri: &str) -> Option<Result<String, String>> {
        if uri.contains('{') {
            return None;
        }
        let mut owner: Option<&str> = None;
        for (template, server) in &self.templates {
            if !super::templates::matches(template, uri) {
                continue;
            }
            match owner {
                Some(o) if o != server => {
                    return Some(Err(format!(
                        "{uri} falls in the templates of servers {o} and {server}, each served before; toolwall serves it from neither"
                    )));
                }
                _ => owner = Some(server),
            }
        }
        owner.map(|o| Ok(o.to_owned()))
    }

    fn uncount(&mut self, server: &str) {
        if let Some(n) = self.per_server.get_mut(server) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_server.remove(server);
            }
        }
    }

    /// How many URIs are remembered as `server`'s.
    pub fn remembered_by(&self, server: &str) -> usize {
        self.per_server.get(server).copied().unwrap_or(0)
    }

    pub fn remembered(&self, key: &str) -> Option<&str> {
        self.remembered.get(key).map(String::as_str)
    }

    pub fn remembered_count(&self) -> usize {
        self.remembered.len()
    }

    /// The servers whose `owns_resources` match `key`.
    fn configured_owners(&self, key: &str) -> Vec<&str> {
        self.configured
            .iter()
            .filter(|(_, globs)| globs.iter().any(|g| g.is_match(key)))
            .map(|(s, _)| s.as_str())
            .collect()
    }

    /// The one server a read of `key` may go to by ownership alone (configured, else
    /// remembered), and why: `Some(Ok(server))`, `Some(Err(why nobody))`, or `None` when
    /// ownership does not decide.
    pub fn owner_of(&self, key: &str) -> Option<Result<String, String>> {
        match self.configured_owners(key).as_slice() {
            [] => {}
            [one] => return Some(Ok((*one).to_owned())),
            many => {
                return Some(Err(format!(
                    "{key} matches owns_resources of servers {}; toolwall serves it from none of them until one pattern is removed",
                    many.join(" and ")
                )));
            }
        }
        self.remembered(key).map(|s| Ok(s.to_owned()))
    }

    /// Who serves `key`, listed by `claimants` (server names, any order, no repeats).
    pub fn decide(&self, key: &str, claimants: &[&str]) -> Verdict {
        let mut claimants: Vec<&str> = claimants.to_vec();
        claimants.sort_unstable();
        if let Some(owner) = self.owner_of(key) {
            return match owner {
                Ok(owner) => {
                    let serves = claimants.contains(&owner.as_str());
                    let others: Vec<&str> =
                        claimants.iter().copied().filter(|c| *c != owner).collect();
                    let how = if self.configured_owners(key).is_empty() {
                        "which served it first"
                    } else {
                        "by owns_resources"
                    };
                    Verdict {
                        served_by: serves.then(|| owner.clone()),
                        conflict: (!others.is_empty()).then(|| {
                            format!(
                                "{key} is listed by {} but belongs to server {owner} ({how}){}",
                                others.join(" and "),
                                if serves {
                                    ""
                                } else {
                                    "; its owner does not list it now, so nobody serves it"
                                }
                            )
                        }),
                    }
                }
                Err(why) => Verdict {
                    served_by: None,
                    conflict: Some(why),
                },
            };
        }
        match claimants.as_slice() {
            [] => Verdict {
                served_by: None,
                conflict: None,
            },
            [one] => Verdict {
                served_by: Some((*one).to_owned()),
                conflict: None,
            },
            many => Verdict {
                served_by: None,
                conflict: Some(format!(
                    "{key} is listed by servers {}; toolwall serves it from none of them until an operator names its owner ([servers.NAME] owns_resources)",
                    many.join(" and ")
                )),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> OwnerRules {
        OwnerRules::new(&[
            ("good".into(), vec!["report://*".into()]),
            ("other".into(), vec![]),
        ])
    }

    #[test]
    fn contested_uris_go_to_nobody() {
        let r = OwnerRules::default();
        let v = r.decide("x://a", &["evil", "good"]);
        assert_eq!(v.served_by, None);
        assert!(v.conflict.unwrap().contains("evil and good"));
        // Order of listing does not matter.
        assert_eq!(r.decide("x://a", &["good", "evil"]).served_by, None);
        assert_eq!(
            r.decide("x://a", &["good"]).served_by.as_deref(),
            Some("good")
        );
        assert_eq!(r.decide("x://a", &[]).served_by, None);
    }

    #[test]
    fn configured_owner_wins_and_alone_or_absent_it_still_owns() {
        let r = rules();
        let v = r.decide("report://q3", &["evil", "good"]);
        assert_eq!(v.served_by.as_deref(), Some("good"));
        assert!(v.conflict.unwrap().contains("evil"));
        // The owner is down: nobody serves it, the other claimant least of all.
        let v = r.decide("report://q3", &["evil"]);
        assert_eq!(v.served_by, None);
        assert!(v.conflict.is_some());
        assert_eq!(
            r.owner_of("report://deep/path"),
            Some(Ok("good".to_string()))
        );
    }

    #[test]
    fn remembered_owner_keeps_its_uri_across_absence() {
        let mut r = OwnerRules::default();
        r.remember("report://q3", "good");
        assert_eq!(r.decide("report://q3", &["evil"]).served_by, None);
        assert_eq!(
            r.decide("report://q3", &["evil", "good"])
                .served_by
                .as_deref(),
            Some("good")
        );
        r.forget("report://q3");
        assert_eq!(
            r.decide("report://q3", &["evil"]).served_by.as_deref(),
            Some("evil")
        );
    }

    #[test]
    fn ambiguous_patterns_serve_nobody() {
        let r = OwnerRules::new(&[
            ("a".into(), vec!["x://*".into()]),
            ("b".into(), vec!["x://y*".into()]),
        ]);
        assert_eq!(r.decide("x://yes", &["a"]).served_by, None);
        assert_eq!(r.decide("x://no", &["a"]).served_by.as_deref(), Some("a"));
    }

    #[test]
    fn patterns_are_checked() {
        assert!(compile_pattern("").is_err());
        assert!(compile_pattern("a\nb").is_err());
        assert!(compile_pattern("x://[").is_err());
        assert!(compile_pattern("file:///srv/**").is_ok());
    }
}
