//! The merged, namespaced catalog: `server__tool` for tools and prompts; resources keep
//! their URI and remember which server listed them.

use serde_json::Value;
use std::collections::{BTreeMap, HashMap};

/// Separator between server and tool names. Server names never contain it.
pub const NAMESPACE_SEP: &str = "__";
/// The built-in server's name.
pub const LOCAL_SERVER: &str = "local";
/// The gateway's own tools' server name.
pub const GATEWAY_SERVER: &str = "toolwall";

/// Which worker serves a server.
pub type WorkerId = usize;

#[derive(Debug, Clone)]
pub struct Entry {
    /// Namespaced (`server__name`) for tools and prompts; the URI for resources.
    pub name: String,
    pub server: String,
    /// The name (or URI) the server itself knows.
    pub upstream: String,
    pub worker: WorkerId,
    /// The definition as agents see it (namespaced), serialized once.
    pub json: String,
    /// The tool's input schema has an `input` property: `{"input": {...}}` arguments are
    /// meant as they are, never unwrapped.
    pub declares_input: bool,
}

#[derive(Debug, Default)]
struct Section {
    entries: BTreeMap<String, Entry>,
}

impl Section {
    fn replace_server(&mut self, server: &str, entries: Vec<Entry>) -> bool {
        let before: Vec<&String> = self
            .entries
            .values()
            .filter(|e| e.server == server)
            .map(|e| &e.json)
            .collect();
        let changed = before.len() != entries.len()
            || entries
                .iter()
                .any(|e| self.entries.get(&e.name).map(|old| &old.json) != Some(&e.json));
        self.entries.retain(|_, e| e.server != server);
        for e in entries {
            self.entries.insert(e.name.clone(), e);
        }
        changed
    }
}

/// What a list request asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Tools,
    Resources,
    Prompts,
}

impl Kind {
    pub fn list_key(self) -> &'static str {
        match self {
            Kind::Tools => "tools",
            Kind::Resources => "resources",
            Kind::Prompts => "prompts",
        }
    }
}

#[derive(Debug, Default)]
pub struct Catalog {
    tools: Section,
    resources: Section,
    prompts: Section,
    /// Duplicate resource URIs across servers: the first server keeps it; counted here.
    pub resource_conflicts: HashMap<String, Vec<String>>,
}

/// A server's listing could not be merged.
#[derive(Debug, PartialEq, Eq)]
pub struct CatalogError(pub String);

impl Catalog {
    fn section(&self, kind: Kind) -> &Section {
        match kind {
            Kind::Tools => &self.tools,
            Kind::Resources => &self.resources,
            Kind::Prompts => &self.prompts,
        }
    }

    /// Replace everything `server` offers of `kind` with `items` (definitions as the server
    /// sent them). Returns whether agents would now see something different.
    pub fn set(
        &mut self,
        kind: Kind,
        server: &str,
        worker: WorkerId,
        items: Vec<Value>,
    ) -> Result<bool, CatalogError> {
        let mut entries = Vec::with_capacity(items.len());
        for mut item in items {
            let key = if kind == Kind::Resources {
                "uri"
            } else {
                "name"
            };
            let Some(upstream) = item.get(key).and_then(Value::as_str).map(str::to_owned) else {
                return Err(CatalogError(format!(
                    "server {server}: a {} entry has no {key}",
                    kind.list_key()
                )));
            };
            let name = match kind {
                Kind::Resources => {
                    if let Some(owner) = self
                        .resources
                        .entries
                        .get(&upstream)
                        .filter(|e| e.server != server)
                    {
                        self.resource_conflicts
                            .entry(upstream.clone())
                            .or_default()
                            .push(format!("{} (kept {})", server, owner.server));
                        continue;
                    }
                    upstream.clone()
                }
                _ => {
                    let name = format!("{server}{NAMESPACE_SEP}{upstream}");
                    item["name"] = Value::String(name.clone());
                    name
                }
            };
            let json = item.to_string();
            let declares_input = item.pointer("/inputSchema/properties/input").is_some();
            entries.push(Entry {
                name,
                server: server.to_owned(),
                upstream,
                worker,
                json,
                declares_input,
            });
        }
        Ok(match kind {
            Kind::Tools => self.tools.replace_server(server, entries),
            Kind::Resources => self.resources.replace_server(server, entries),
            Kind::Prompts => self.prompts.replace_server(server, entries),
        })
    }

    pub fn get(&self, kind: Kind, name: &str) -> Option<&Entry> {
        self.section(kind).entries.get(name)
    }

    pub fn len(&self, kind: Kind) -> usize {
        self.section(kind).entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tools.entries.is_empty()
            && self.resources.entries.is_empty()
            && self.prompts.entries.is_empty()
    }

    /// One page of a list result, in name order, after `cursor` (the last name of the
    /// previous page), keeping only entries `visible` admits. Returns the JSON text of
    /// the result.
    pub fn list_page(
        &self,
        kind: Kind,
        cursor: Option<&str>,
        page_size: usize,
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
            .section(kind)
            .entries
            .range((start, Bound::Unbounded))
            .map(|(_, e)| e)
        {
            if !visible(entry) {
                continue;
            }
            if count == page_size {
                more = true;
                break;
            }
            if count > 0 {
                out.push(',');
            }
            out.push_str(&entry.json);
            last = Some(&entry.name);
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

    /// Every entry of a kind (for status and policy explain).
    pub fn entries(&self, kind: Kind) -> impl Iterator<Item = &Entry> {
        self.section(kind).entries.values()
    }
}

/// Split `server__tool`; `None` when there is no namespace.
pub fn split_namespaced(name: &str) -> Option<(&str, &str)> {
    name.split_once(NAMESPACE_SEP)
}

/// Server names: `[a-z0-9_-]+`, never containing `__`.
pub fn valid_server_name(name: &str) -> bool {
    !name.is_empty()
        && !name.contains(NAMESPACE_SEP)
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn namespaces_and_pages() {
        let mut c = Catalog::default();
        let tools = (0..5)
            .map(|i| json!({"name": format!("t{i}"), "inputSchema": {"type":"object"}}))
            .collect();
        assert!(c.set(Kind::Tools, "local", 0, tools).unwrap());
        assert_eq!(c.get(Kind::Tools, "local__t3").unwrap().upstream, "t3");
        let p1: Value = serde_json::from_str(&c.list_page(Kind::Tools, None, 2, |_| true)).unwrap();
        assert_eq!(p1["tools"].as_array().unwrap().len(), 2);
        assert_eq!(p1["tools"][0]["name"], "local__t0");
        let cursor = p1["nextCursor"].as_str().unwrap().to_owned();
        let p2: Value =
            serde_json::from_str(&c.list_page(Kind::Tools, Some(&cursor), 10, |_| true)).unwrap();
        assert_eq!(p2["tools"].as_array().unwrap().len(), 3);
        assert!(p2.get("nextCursor").is_none());
        // Hidden entries are skipped, not counted.
        let p: Value =
            serde_json::from_str(&c.list_page(Kind::Tools, None, 10, |e| e.upstream != "t1"))
                .unwrap();
        assert_eq!(p["tools"].as_array().unwrap().len(), 4);
    }

    #[test]
    fn unchanged_listing_is_not_a_change() {
        let mut c = Catalog::default();
        let tools = || vec![json!({"name": "a"})];
        assert!(c.set(Kind::Tools, "s", 0, tools()).unwrap());
        assert!(!c.set(Kind::Tools, "s", 0, tools()).unwrap());
        assert!(c.set(Kind::Tools, "s", 0, vec![]).unwrap());
    }

    #[test]
    fn server_names() {
        assert!(valid_server_name("git-hub_2"));
        for bad in ["", "a__b", "Up", "a b", "é"] {
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
