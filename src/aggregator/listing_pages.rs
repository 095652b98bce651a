//! One listing read page by page inside the aggregator worker, sans-IO. Each page's items
//! are copied as the upstream wrote them (never parsed into a tree) into one JSON array,
//! and the page is dropped before the next is fetched: memory is one page (at most
//! `[servers] max_body_bytes`) plus the listing so far (at most its `max_listing_bytes`).
//! Over budget (items, bytes, pages), a cursor that repeats or is too long: the listing
//! fails whole with a message naming the key. Items without a usable name or URI, and a
//! name listed twice, are left out and counted.

use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use super::budget::{ListingBudget, MAX_CURSOR_BYTES};
use super::error::{UpstreamError, UpstreamErrorCode};
use crate::mcp::catalog::Kind;
use crate::mcp::catalog::listing::{MAX_NAME_CHARS, MAX_URI_BYTES};

#[derive(Deserialize)]
struct Keys<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    uri: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "uriTemplate")]
    uri_template: Option<Cow<'a, str>>,
}

/// Names (escaped, cut) of items left out for their name, quoted in the log line.
pub const BAD_KEY_SAMPLE: usize = 3;
/// Characters of one such name quoted.
const BAD_KEY_CHARS: usize = 64;

/// The key of a listed item, if it is acceptable; `Err(Some(key))`: it has a key, not an
/// acceptable one.
fn item_key(kind: Kind, raw: &RawValue) -> Result<String, Option<String>> {
    if !raw.get().starts_with('{') {
        return Err(None);
    }
    let keys: Keys = serde_json::from_str(raw.get()).map_err(|_| None)?;
    let key = match kind {
        Kind::Tools | Kind::Prompts => keys.name,
        Kind::Resources => keys.uri,
        Kind::Templates => keys.uri_template,
    }
    .ok_or(None)?;
    let ok = match kind {
        Kind::Tools | Kind::Prompts => {
            !key.is_empty()
                && key.chars().count() <= MAX_NAME_CHARS
                && key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
        }
        Kind::Resources | Kind::Templates => {
            !key.is_empty() && key.len() <= MAX_URI_BYTES && !key.chars().any(char::is_control)
        }
    };
    if ok {
        Ok(key.into_owned())
    } else {
        Err(Some(key.into_owned()))
    }
}

pub struct PageCollector {
    server: String,
    kind: Kind,
    budget: ListingBudget,
    out: String,
    items: usize,
    pages: usize,
    dropped: usize,
    /// Of `dropped`: items without an acceptable name or URI, and a few of those names
    /// (escaped, cut: upstream text never reaches a log line raw).
    bad_keys: usize,
    bad_key_sample: Vec<String>,
    cursors: HashSet<String>,
    keys: HashSet<String>,
}

impl PageCollector {
    pub fn new(server: &str, kind: Kind, budget: ListingBudget) -> PageCollector {
        PageCollector {
            server: server.to_owned(),
            kind,
            budget,
            out: String::from("["),
            items: 0,
            pages: 0,
            dropped: 0,
            bad_keys: 0,
            bad_key_sample: Vec::new(),
            cursors: HashSet::new(),
            keys: HashSet::new(),
        }
    }

    fn over(&self, what: String) -> UpstreamError {
        UpstreamError::new(
            UpstreamErrorCode::OverBudget,
            format!("server {}: {what}", self.server),
        )
    }

    fn bad(&self, what: &str) -> UpstreamError {
        UpstreamError::new(
            UpstreamErrorCode::BadResponse,
            format!("server {}: {what}", self.server),
        )
    }

    /// Whether another page may be fetched.
    pub fn may_fetch(&self) -> Result<(), UpstreamError> {
        if self.pages >= self.budget.max_pages {
            return Err(self.over(format!(
                "its {} listing has more than {} pages ({})",
                self.kind.word(),
                self.budget.max_pages,
                self.budget.pages_key
            )));
        }
        Ok(())
    }

    /// One page (the result object as text). `Ok(Some(cursor))`: fetch the next page with it.
    pub fn page(&mut self, result: &str) -> Result<Option<String>, UpstreamError> {
        self.pages += 1;
        let key = self.kind.list_key();
        let fields: HashMap<Cow<str>, &RawValue> = serde_json::from_str(result)
            .map_err(|_| self.bad(&format!("the {} result is not a JSON object", key)))?;
        let list = fields
            .get(key)
            .ok_or_else(|| self.bad(&format!("the result has no {key} array")))?;
        let raw: Vec<&RawValue> = serde_json::from_str(list.get())
            .map_err(|_| self.bad(&format!("{key} is not an array")))?;
        for item in raw {
            let k = match item_key(self.kind, item) {
                Ok(k) => k,
                Err(key) => {
                    self.dropped += 1;
                    self.bad_keys += 1;
                    if let Some(key) = key
                        && self.bad_key_sample.len() < BAD_KEY_SAMPLE
                    {
                        self.bad_key_sample
                            .push(super::error::quote_upstream(&key, BAD_KEY_CHARS));
                    }
                    continue;
                }
            };
            if self.keys.contains(&k) {
                self.dropped += 1;
                continue;
            }
            if self.items >= self.budget.max_items {
                return Err(self.over(format!(
                    "it lists more than {} {} ({})",
                    self.budget.max_items,
                    self.kind.word(),
                    self.budget.items_key
                )));
            }
            let text = item.get();
            if self.out.len() - 1 + text.len() > self.budget.max_bytes {
                return Err(self.over(format!(
                    "its {} listing holds more than {} bytes ({})",
                    self.kind.word(),
                    self.budget.max_bytes,
                    self.budget.bytes_key
                )));
            }
            if self.items > 0 {
                self.out.push(',');
            }
            self.out.push_str(text);
            self.items += 1;
            self.keys.insert(k);
        }
        let next = match fields.get("nextCursor") {
            None => None,
            Some(c) => serde_json::from_str::<Option<String>>(c.get())
                .map_err(|_| self.bad("nextCursor is not a string"))?,
        };
        match next {
            Some(c) if !c.is_empty() => {
                if c.len() > MAX_CURSOR_BYTES {
                    return Err(self.bad(&format!(
                        "a cursor of {} bytes (at most {MAX_CURSOR_BYTES})",
                        c.len()
                    )));
                }
                if !self.cursors.insert(c.clone()) {
                    return Err(self.bad(&format!("{} repeats a cursor", self.kind.word())));
                }
                Ok(Some(c))
            }
            _ => Ok(None),
        }
    }

    /// The listing as one JSON array, and its facts (`pages`, `bytes`, `dropped`).
    pub fn finish(mut self) -> (String, serde_json::Value) {
        self.out.push(']');
        let facts = serde_json::json!({
            "pages": self.pages,
            "bytes": self.out.len(),
            "items": self.items,
            "dropped": self.dropped,
            "bad_keys": self.bad_keys,
            "bad_key_sample": self.bad_key_sample,
        });
        (self.out, facts)
    }

    pub fn dropped(&self) -> usize {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn budget(items: usize, bytes: usize, pages: usize) -> ListingBudget {
        ListingBudget::plain(items, bytes, pages)
    }

    #[test]
    fn pages_are_joined_verbatim_and_bad_items_left_out() {
        let mut c = PageCollector::new("s", Kind::Tools, budget(10, 10_000, 5));
        let next = c
            .page(r#"{"tools":[{"name":"a","x":{"deep":[1,2]}},{"name":"b c"},"junk"],"nextCursor":"2"}"#)
            .unwrap();
        assert_eq!(next.as_deref(), Some("2"));
        c.may_fetch().unwrap();
        assert_eq!(
            c.page(r#"{"tools":[{"name":"b"},{"name":"a"}]}"#).unwrap(),
            None
        );
        assert_eq!(c.dropped(), 3);
        let (text, facts) = c.finish();
        assert_eq!(
            facts["bad_keys"], 2,
            "\"b c\" and \"junk\"; the repeated a is not"
        );
        assert_eq!(facts["bad_key_sample"], json!(["b c"]));
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v, json!([{"name":"a","x":{"deep":[1,2]}},{"name":"b"}]));
        assert_eq!(facts["pages"], 2);
    }

    #[test]
    fn budgets_fail_the_listing_naming_the_key() {
        let mut c = PageCollector::new("s", Kind::Tools, budget(1, 10_000, 5));
        let e = c
            .page(r#"{"tools":[{"name":"a"},{"name":"b"}]}"#)
            .unwrap_err();
        assert_eq!(e.code, UpstreamErrorCode::OverBudget);
        assert!(e.message.contains("servers.max_items"), "{}", e.message);
        let mut c = PageCollector::new("s", Kind::Resources, budget(10, 30, 5));
        let e = c
            .page(r#"{"resources":[{"uri":"x://aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}]}"#)
            .unwrap_err();
        assert!(
            e.message.contains("servers.max_listing_bytes"),
            "{}",
            e.message
        );
        let mut c = PageCollector::new("s", Kind::Tools, budget(10, 1000, 1));
        c.page(r#"{"tools":[],"nextCursor":"x"}"#).unwrap();
        assert!(
            c.may_fetch()
                .unwrap_err()
                .message
                .contains("servers.max_pages")
        );
    }

    #[test]
    fn cursors_that_loop_or_bloat_are_refused() {
        let mut c = PageCollector::new("s", Kind::Prompts, budget(10, 1000, 9));
        c.page(r#"{"prompts":[],"nextCursor":"a"}"#).unwrap();
        assert!(c.page(r#"{"prompts":[],"nextCursor":"a"}"#).is_err());
        let mut c = PageCollector::new("s", Kind::Prompts, budget(10, 1000, 9));
        let long = format!(
            r#"{{"prompts":[],"nextCursor":"{}"}}"#,
            "x".repeat(MAX_CURSOR_BYTES + 1)
        );
        assert!(c.page(&long).is_err());
        assert!(c.page("[1]").is_err());
        assert!(c.page(r#"{"prompts":{}}"#).is_err());
    }

    #[test]
    fn templates_are_keyed_by_their_uri_template() {
        let mut c = PageCollector::new("s", Kind::Templates, budget(10, 1000, 2));
        c.page(r#"{"resourceTemplates":[{"uriTemplate":"x://{id}","name":"x"},{"name":"no"}]}"#)
            .unwrap();
        assert_eq!(c.dropped(), 1);
    }

    #[test]
    fn names_left_out_are_sampled_escaped_and_bounded() {
        let mut c = PageCollector::new("s", Kind::Tools, budget(10, 10_000, 2));
        let long = "y".repeat(500);
        c.page(&format!(
            r#"{{"tools":[{{"name":"x\u202e\u001b[2J"}},{{"name":"{long}"}},{{"name":"a b"}},{{"name":"c d"}},{{"name":"ok"}}]}}"#
        ))
        .unwrap();
        let (_, facts) = c.finish();
        assert_eq!(facts["bad_keys"], 4);
        let sample = facts["bad_key_sample"].as_array().unwrap();
        assert_eq!(sample.len(), BAD_KEY_SAMPLE);
        assert_eq!(sample[0], "x\\u{202e}\\u{1b}[2J");
        assert!(sample[1].as_str().unwrap().chars().count() <= BAD_KEY_CHARS + 1);
    }
}
