//! The merged, namespaced catalog: `server__tool` for tools and prompts; resources and
//! resource templates keep their URI, and who serves a URI several servers list is decided
//! by [`resource_owners`] (never by who listed first or fastest).
//!
//! - [`listing`]: an upstream's listing checked (budget, names) and turned into entries.
//! - [`claims`]: every server's resources, and the ones agents see.
//! - [`delta`]: a listing as the change it makes (computed off the loop).
//! - [`resource_owners`]: the ownership rule.
//! - [`templates`]: reading a URI through a resource template.
//! - [`served_text`]: upstream display text with hiding characters escaped.
//! - [`spec_shape`]: the fields of a definition whose type the MCP schema fixes, checked.
//!
//! Transport-independent and pure: the gateway feeds it listings from any kind of
//! upstream (HTTP servers through the aggregator worker, local servers).

pub mod claims;
pub mod delta;
pub mod listing;
pub mod names;
pub mod resource_owners;
pub mod served_text;
pub mod spec_shape;
pub mod templates;
pub mod unservable;

use serde_json::Value;
use std::collections::BTreeMap;

use claims::{ClaimChange, Claims};
use names::{NameChange, Names};
use resource_owners::OwnerRules;

/// Separator between server and tool names. Server names never contain it.
pub const NAMESPACE_SEP: &str = "__";
/// The built-in server's name.
pub const LOCAL_SERVER: &str = "local";
/// The gateway's own tools' server name.
pub const GATEWAY_SERVER: &str = "toolwall";

/// Which worker serves a server.
pub type WorkerId = usize;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Who it is to policy, pins and the ledger: always `server__name` for tools and
    /// prompts, whatever agents see; the URI (or URI template) for resources and
    /// templates.
    pub name: String,
    /// What agents see and call it by (the catalog's key): `name`, or the server's own
    /// name for a server with `prefix = false` (see [`names`]).
    pub key: String,
    pub server: String,
    /// The name (or URI) the server itself knows.
    pub upstream: String,
    pub worker: WorkerId,
    /// The definition as agents see it (under `key`), serialized once.
    pub json: String,
    /// The tool's input schema has an `input` property: `{"input": {...}}` arguments are
    /// meant as they are, never unwrapped.
    pub declares_input: bool,
    /// Tools: the parameters that also travel as `Mcp-Param-*` headers (`x-mcp-header`),
    /// which the HTTP door checks against a call's arguments.
    pub header_bindings: Vec<crate::mcp::param_headers::Binding>,
}

/// What a request needs of an entry to be routed: the entry without its definition's
/// text (a call copies this, never the whole definition).
#[derive(Debug, Clone)]
pub struct Route {
    pub name: String,
    pub server: String,
    pub upstream: String,
    pub worker: WorkerId,
    pub declares_input: bool,
}

impl Entry {
    pub fn route(&self) -> Route {
        Route {
            name: self.name.clone(),
            server: self.server.clone(),
            upstream: self.upstream.clone(),
            worker: self.worker,
            declares_input: self.declares_input,
        }
    }

    /// The entry for one definition as a server sent it, namespaced (`server__name`).
    pub fn of(kind: Kind, server: &str, worker: WorkerId, item: Value) -> Option<Entry> {
        Entry::listed(kind, server, worker, item, true)
    }

    /// The entry for one definition as a server sent it: its qualified name (tools and
    /// prompts) or the URI, the key agents see (`server__name` with `prefix`, else the
    /// server's own name; a URI is never prefixed) and the JSON agents see. `None` when
    /// it has no usable key, or (tools) an `x-mcp-header` annotation the spec forbids (a
    /// client must not offer such a tool). The one place names agents see are made.
    pub fn listed(
        kind: Kind,
        server: &str,
        worker: WorkerId,
        item: Value,
        prefix: bool,
    ) -> Option<Entry> {
        Entry::listed_tallied(
            kind,
            server,
            worker,
            item,
            prefix,
            &mut served_text::Tally::default(),
        )
    }

    /// [`Entry::listed`], counting in `tally` what [`served_text`] escaped: every door
    /// serves the JSON made here, so this is where upstream display text is made safe
    /// (after the intake digested the definition as sent: pins keep their meaning).
    pub fn listed_tallied(
        kind: Kind,
        server: &str,
        worker: WorkerId,
        mut item: Value,
        prefix: bool,
        tally: &mut served_text::Tally,
    ) -> Option<Entry> {
        let upstream = item.get(kind.key_field())?.as_str()?.to_owned();
        let (name, key) = if kind.namespaced() {
            let name = format!("{server}{NAMESPACE_SEP}{upstream}");
            let key = if prefix {
                name.clone()
            } else {
                upstream.clone()
            };
            item[kind.key_field()] = Value::String(key.clone());
            (name, key)
        } else {
            (upstream.clone(), upstream.clone())
        };
        if let Some(why) = served_text::unservable(kind, &item) {
            unservable::note_item(server, kind, &upstream, &why);
            return None;
        }
        let declares_input = item.pointer("/inputSchema/properties/input").is_some();
        let header_bindings = match kind {
            Kind::Tools => match crate::mcp::param_headers::bindings(item.get("inputSchema")) {
                Ok(b) => b,
                Err(why) => {
                    unservable::note_headers(server, &upstream, &why);
                    return None;
                }
            },
            _ => Vec::new(),
        };
        served_text::escape_definition(kind, &mut item, tally);
        Some(Entry {
            name,
            key,
            server: server.to_owned(),
            upstream,
            worker,
            json: item.to_string(),
            declares_input,
            header_bindings,
        })
    }
}

/// What a list request asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Tools,
    Resources,
    Prompts,
    /// Resource templates (`resources/templates/list`).
    Templates,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::Tools, Kind::Resources, Kind::Prompts, Kind::Templates];

    /// The key of the list in a list result.
    pub fn list_key(self) -> &'static str {
        match self {
            Kind::Tools => "tools",
            Kind::Resources => "resources",
            Kind::Prompts => "prompts",
            Kind::Templates => "resourceTemplates",
        }
    }

    /// The field of a definition that names it.
    pub fn key_field(self) -> &'static str {
        match self {
            Kind::Tools | Kind::Prompts => "name",
            Kind::Resources => "uri",
            Kind::Templates => "uriTemplate",
        }
    }

    /// Namespaced as `server__name` (tools, prompts), or kept as it is (URIs).
    pub fn namespaced(self) -> bool {
        matches!(self, Kind::Tools | Kind::Prompts)
    }

    /// A short word for logs, status and config keys.
    pub fn word(self) -> &'static str {
        match self {
            Kind::Tools => "tools",
            Kind::Resources => "resources",
            Kind::Prompts => "prompts",
            Kind::Templates => "resource templates",
        }
    }

    pub fn parse(word: &str) -> Option<Kind> {
        match word {
            "tools" => Some(Kind::Tools),
            "resources" => Some(Kind::Resources),
            "prompts" => Some(Kind::Prompts),
            "resourceTemplates" | "templates" => Some(Kind::Templates),
            _ => None,
        }
    }
}

#[derive(Debug, Default)]
pub struct Catalog {
    tools: Names,
    prompts: Names,
    resources: Claims,
    templates: Claims,
}

/// A server's listing could not be merged.
#[derive(Debug, PartialEq, Eq)]
pub struct CatalogError(pub String);

impl Catalog {
    fn served(&self, kind: Kind) -> &BTreeMap<String, std::sync::Arc<Entry>> {
        match kind {
            Kind::Tools => &self.tools.served,
            Kind::Prompts => &self.prompts.served,
            Kind::Resources => &self.resources.served,
            Kind::Templates => &self.templates.served,
        }
    }

    fn claims_mut(&mut self, kind: Kind) -> Option<&mut Claims> {
        match kind {
            Kind::Resources => Some(&mut self.resources),
            Kind::Templates => Some(&mut self.templates),
            _ => None,
        }
    }

    pub fn claims(&self, kind: Kind) -> Option<&Claims> {
        match kind {
            Kind::Resources => Some(&self.resources),
            Kind::Templates => Some(&self.templates),
            _ => None,
        }
    }

    /// Replace everything `server` offers of `kind` with `items` (definitions as the server
    /// sent them): the path of the gateway's own workers (builtin, workspaces), whose
    /// resources no one else can claim. Returns whether agents would now see something
    /// different.
    pub fn set(
        &mut self,
        kind: Kind,
        server: &str,
        worker: WorkerId,
        items: Vec<Value>,
    ) -> Result<bool, CatalogError> {
        let mut entries = Vec::with_capacity(items.len());
        for item in items {
            let Some(entry) = Entry::of(kind, server, worker, item) else {
                return Err(CatalogError(format!(
                    "server {server}: a {} entry has no {}",
                    kind.list_key(),
                    kind.key_field()
                )));
            };
            entries.push(entry);
        }
        Ok(match kind {
            Kind::Tools | Kind::Prompts => self.replace(kind, server, entries).changed,
            _ => {
                self.claim(kind, server, entries, &OwnerRules::default())
                    .changed
            }
        })
    }

    /// Replace the tools or prompts of `server` with prepared entries, at once. A name
    /// two servers offer (or an unprefixed one of another server's form) is served by
    /// none: see [`names`].
    pub fn replace(&mut self, kind: Kind, server: &str, entries: Vec<Entry>) -> NameChange {
        match kind {
            Kind::Tools => self.tools.replace_server(server, entries),
            Kind::Prompts => self.prompts.replace_server(server, entries),
            _ => NameChange::default(),
        }
    }

    /// Apply a listing's change (see [`delta`]) to the tools, prompts, resources or
    /// templates of `server`, at once: `upserts` (new or changed entries), `removed` (keys
    /// gone); `rules` decide who serves a URI.
    pub fn apply_delta(
        &mut self,
        kind: Kind,
        server: &str,
        upserts: Vec<Entry>,
        removed: Vec<String>,
        rules: &OwnerRules,
    ) -> (NameChange, ClaimChange) {
        match kind {
            Kind::Tools => (
                self.tools.apply_delta(server, upserts, removed),
                ClaimChange::default(),
            ),
            Kind::Prompts => (
                self.prompts.apply_delta(server, upserts, removed),
                ClaimChange::default(),
            ),
            Kind::Resources => (
                NameChange::default(),
                self.resources.apply_delta(server, upserts, removed, rules),
            ),
            Kind::Templates => (
                NameChange::default(),
                self.templates.apply_delta(server, upserts, removed, rules),
            ),
        }
    }

    /// The tool or prompt name clashes `server` takes part in: how many, and a sample.
    pub fn clashes(
        &self,
        kind: Kind,
        server: &str,
        sample: usize,
    ) -> (usize, Vec<(String, String)>) {
        match kind {
            Kind::Tools => self.tools.clashes_of(server, sample),
            Kind::Prompts => self.prompts.clashes_of(server, sample),
            _ => (0, Vec::new()),
        }
    }

    /// Replace the resources or templates `server` lists with prepared entries, at once;
    /// who serves each URI follows `rules`.
    pub fn claim(
        &mut self,
        kind: Kind,
        server: &str,
        entries: Vec<Entry>,
        rules: &OwnerRules,
    ) -> ClaimChange {
        match self.claims_mut(kind) {
            Some(c) => c.set(server, entries, rules),
            None => ClaimChange::default(),
        }
    }

    /// Decide every resource and template again (owners changed).
    pub fn recheck_claims(&mut self, rules: &OwnerRules) -> (ClaimChange, ClaimChange) {
        (self.resources.recheck(rules), self.templates.recheck(rules))
    }

    pub fn get(&self, kind: Kind, name: &str) -> Option<&Entry> {
        self.served(kind).get(name).map(|e| &**e)
    }

    pub fn len(&self, kind: Kind) -> usize {
        self.served(kind).len()
    }

    pub fn is_empty(&self) -> bool {
        Kind::ALL.iter().all(|k| self.served(*k).is_empty())
    }

    /// One page of a list result, in name order, after `cursor` (the last name of the
    /// previous page), keeping only entries `visible` admits. Returns the JSON text of
    /// the result.
    pub fn list_page(
        &self,
        kind: Kind,
        cursor: Option<&str>,
        page_size: usize,
        max_bytes: usize,
        mut visible: impl FnMut(&Entry) -> bool,
    ) -> String {
        use std::ops::Bound;
        let start = match cursor {
            Some(after) => Bound::Excluded(after.to_owned()),
            None => Bound::Unbounded,
        };
        let mut out = String::with_capacity(256);
        out.push_str("{\"");
        out.push_str(kind.list_key());
        out.push_str("\":[");
        let mut count = 0;
        let mut last: Option<&str> = None;
        let mut more = false;
        for entry in self
            .served(kind)
            .range((start, Bound::Unbounded))
            .map(|(_, e)| &**e)
        {
            if !visible(entry) {
                continue;
            }
            if count == page_size {
                more = true;
                break;
            }
            // A page never outgrows what one answer may carry; an item that could not fit
            // even alone is never listed (an agent could not receive it).
            if out.len() + entry.json.len() + entry.key.len() + 64 > max_bytes {
                if entry.json.len() + 64 > max_bytes {
                    // Said once per listing like every refusal (atk9 F3b: it was pinned,
                    // approvable and never listed, without a word).
                    unservable::note_item(
                        &entry.server,
                        kind,
                        &entry.upstream,
                        &format!(
                            "its definition is {} bytes, more than one answer may carry \
                             ({max_bytes} bytes: gateway.max_answer_bytes less room for the \
                             envelope)",
                            entry.json.len()
                        ),
                    );
                    continue;
                }
                more = true;
                break;
            }
            if count > 0 {
                out.push(',');
            }
            out.push_str(&entry.json);
            last = Some(&entry.key);
            count += 1;
        }
        out.push(']');
        if let (true, Some(last)) = (more, last) {
            out.push_str(",\"nextCursor\":");
            out.push_str(&Value::String(last.to_owned()).to_string());
        }
        out.push('}');
        out
    }

    /// Every entry of a kind agents see (for status and policy explain).
    pub fn entries(&self, kind: Kind) -> impl Iterator<Item = &Entry> {
        self.served(kind).values().map(|e| &**e)
    }

    /// Where a `resources/read` of `uri` goes: the server that serves it as a listed
    /// resource, else the one server whose template matches it; `Err` says why nobody
    /// may serve it (a conflict, or templates of several servers).
    ///
    /// A URI listed by one server that falls inside a resource template of another is
    /// listed by both in effect: it goes to the listing server only when it owns the URI
    /// (`owns_resources`, or remembered as its own), to the template's server when that one
    /// owns it by `owns_resources`, and otherwise to nobody.
    pub fn resource_route(&self, uri: &str, rules: &OwnerRules) -> Result<Option<&Entry>, String> {
        // Inside a template another server served first: that server's, even while it is
        // down at start and another lists the URI or a template of its own around it.
        if rules.owner_of(uri).is_none()
            && let Some(owner) = rules.template_owner(uri)
        {
            let owner = owner?;
            let listed_by_owner = self
                .resources
                .served
                .get(uri)
                .is_some_and(|e| e.server == owner);
            // The owner's template up: the rules below decide (a rival is a conflict).
            let owner_up =
                templates::route(uri, &self.templates, Some(&owner)).is_ok_and(|e| e.is_some());
            if !listed_by_owner && !owner_up {
                return Err(format!(
                    "{uri} falls in a resource template server {owner} served first; {owner} does not serve it now, so nobody does"
                ));
            }
        }
        if let Some(e) = self.resources.served.get(uri).map(|e| &**e) {
            let rivals = self.template_rivals(uri, &e.server);
            if rivals.is_empty() {
                return Ok(Some(e));
            }
            return match rules.owner_of(uri) {
                Some(Ok(owner)) if owner == e.server => Ok(Some(e)),
                Some(Ok(owner)) => templates::route(uri, &self.templates, Some(&owner)),
                Some(Err(why)) => Err(why),
                None => Err(template_conflict(uri, &e.server, &rivals)),
            };
        }
        // Owned URIs go to their owner only, even through a template (also when another
        // server lists them).
        match rules.owner_of(uri) {
            Some(Err(why)) => Err(why),
            Some(Ok(owner)) => templates::route(uri, &self.templates, Some(&owner)),
            None => match self.resources.why_not_served(uri) {
                Some(why) => Err(why),
                None => templates::route(uri, &self.templates, None),
            },
        }
    }
}

impl Catalog {
    /// Servers other than `server` that list a resource template matching `uri`.
    pub fn template_rivals(&self, uri: &str, server: &str) -> Vec<String> {
        let mut unlimited = usize::MAX;
        self.template_rivals_within(uri, server, &mut unlimited)
            .unwrap_or_default()
    }

    /// [`Catalog::template_rivals`] looking at most at `budget` templates (each costs
    /// one); `None` once it ran out.
    pub fn template_rivals_within(
        &self,
        uri: &str,
        server: &str,
        budget: &mut usize,
    ) -> Option<Vec<String>> {
        let mut out: Vec<String> = Vec::new();
        for e in self.templates.listed() {
            if e.server == server || out.contains(&e.server) {
                continue;
            }
            *budget = budget.checked_sub(1)?;
            if literal_start_fits(&e.upstream, uri) && templates::matches(&e.upstream, uri) {
                out.push(e.server.clone());
            }
        }
        out.sort_unstable();
        Some(out)
    }
}

/// Whether `uri` starts with the literal part of `template` before its first expression
/// (a cheap test that rules most templates out; it reads no further than they agree).
fn literal_start_fits(template: &str, uri: &str) -> bool {
    let u = uri.as_bytes();
    for (i, b) in template.bytes().enumerate() {
        if b == b'{' {
            return true;
        }
        if u.get(i) != Some(&b) {
            return false;
        }
    }
    true
}

/// Why a URI one server lists and another's template matches is served by neither.
pub fn template_conflict(uri: &str, server: &str, rivals: &[String]) -> String {
    format!(
        "{uri} is listed by server {server} and matches a resource template of server {}; toolwall serves it from none of them until an operator names its owner ([servers.NAME] owns_resources)",
        rivals.join(" and ")
    )
}

/// Split `server__tool`; `None` when there is no namespace.
pub fn split_namespaced(name: &str) -> Option<(&str, &str)> {
    name.split_once(NAMESPACE_SEP)
}

/// Server names: `[a-z0-9_-]+`, never containing `__`.
/// A server name: `[a-z0-9_-]+`, never `__`, never ending in `_`. The last rule keeps
/// `server__tool` unambiguous: with `a_` allowed, `a_` + `__` + `b` and `a` + `__` + `_b`
/// would both be `a___b` (an attack run sent a call for one server's tool to another).
pub fn valid_server_name(name: &str) -> bool {
    !name.is_empty()
        && !name.contains(NAMESPACE_SEP)
        && !name.ends_with('_')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_page_never_outgrows_one_answer() {
        let mut c = Catalog::default();
        let big = "d".repeat(3000);
        let tools = (0..10)
            .map(|i| json!({"name": format!("t{i}"), "description": big, "inputSchema": {"type":"object"}}))
            .chain([json!({"name": "huge", "description": "h".repeat(20_000), "inputSchema": {"type": "object"}})])
            .collect();
        assert!(c.set(Kind::Tools, "s", 0, tools).unwrap());
        let mut seen = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let text = c.list_page(Kind::Tools, cursor.as_deref(), 200, 10_000, |_| true);
            assert!(text.len() <= 10_000, "{} bytes", text.len());
            let page: Value = serde_json::from_str(&text).unwrap();
            for t in page["tools"].as_array().unwrap() {
                seen.push(t["name"].as_str().unwrap().to_owned());
            }
            match page["nextCursor"].as_str() {
                Some(next) => cursor = Some(next.to_owned()),
                None => break,
            }
        }
        assert_eq!(
            seen.len(),
            10,
            "every tool that fits, once; the one that cannot, never"
        );
        assert!(!seen.iter().any(|n| n == "s__huge"));
    }

    #[test]
    fn namespaces_and_pages() {
        let mut c = Catalog::default();
        let tools = (0..5)
            .map(|i| json!({"name": format!("t{i}"), "inputSchema": {"type":"object"}}))
            .collect();
        assert!(c.set(Kind::Tools, "local", 0, tools).unwrap());
        assert_eq!(c.get(Kind::Tools, "local__t3").unwrap().upstream, "t3");
        let p1: Value =
            serde_json::from_str(&c.list_page(Kind::Tools, None, 2, 1 << 20, |_| true)).unwrap();
        assert_eq!(p1["tools"].as_array().unwrap().len(), 2);
        assert_eq!(p1["tools"][0]["name"], "local__t0");
        let cursor = p1["nextCursor"].as_str().unwrap().to_owned();
        let p2: Value =
            serde_json::from_str(&c.list_page(Kind::Tools, Some(&cursor), 10, 1 << 20, |_| true))
                .unwrap();
        assert_eq!(p2["tools"].as_array().unwrap().len(), 3);
        assert!(p2.get("nextCursor").is_none());
        // Hidden entries are skipped, not counted.
        let p: Value = serde_json::from_str(
            &c.list_page(Kind::Tools, None, 10, 1 << 20, |e| e.upstream != "t1"),
        )
        .unwrap();
        assert_eq!(p["tools"].as_array().unwrap().len(), 4);
    }

    #[test]
    fn unchanged_listing_is_not_a_change() {
        let mut c = Catalog::default();
        let tools = || vec![json!({"name": "a", "inputSchema": {"type": "object"}})];
        assert!(c.set(Kind::Tools, "s", 0, tools()).unwrap());
        assert!(!c.set(Kind::Tools, "s", 0, tools()).unwrap());
        assert!(c.set(Kind::Tools, "s", 0, vec![]).unwrap());
    }

    #[test]
    fn server_names() {
        assert!(valid_server_name("git-hub_2"));
        for bad in ["", "a__b", "Up", "a b", "é", "a_"] {
            assert!(!valid_server_name(bad), "{bad}");
        }
    }

    #[test]
    fn entry_without_name_refused() {
        let mut c = Catalog::default();
        assert!(c.set(Kind::Tools, "s", 0, vec![json!({"x": 1})]).is_err());
    }
}

/// Arguments some clients send wrapped as `{"input": {...}}`: the inner object, when that
/// is the whole of them and the tool does not itself take an `input` property.
pub fn unwrap_input(arguments: &str) -> Option<String> {
    if !arguments.contains("\"input\"") {
        return None;
    }
    let map: serde_json::Map<String, Value> = serde_json::from_str(arguments).ok()?;
    match (map.len(), map.get("input")) {
        (1, Some(inner @ Value::Object(_))) => Some(inner.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod unwrap_tests {
    use super::unwrap_input;

    #[test]
    fn unwraps_only_a_lone_input_object() {
        assert_eq!(
            unwrap_input(r#"{"input":{"text":"a"}}"#).as_deref(),
            Some(r#"{"text":"a"}"#)
        );
        assert_eq!(unwrap_input(r#"{"input":{"a":1},"b":2}"#), None);
        assert_eq!(unwrap_input(r#"{"input":"x"}"#), None);
        assert_eq!(unwrap_input(r#"{"text":"input"}"#), None);
    }
}
