//! An upstream's own credentials (its bearer token, credential headers, a local server's
//! secret variables) cut out of everything that comes back from it: a hostile or careless
//! server that echoes the `Authorization` header in an error would otherwise hand the
//! agent the key to call it directly, past every rule, and write it into the ledger.

use serde_json::Value;

use super::setup::UpstreamSetup;

/// Shorter values are not looked for: they would cut ordinary words out of answers.
pub const MIN_SECRET_CHARS: usize = 8;
/// What a credential is replaced with.
pub const REDACTED: &str = "[redacted credential]";

/// Header names whose values are credentials (compared in lowercase).
fn is_credential_header(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n == "authorization"
        || n == "cookie"
        || n == "proxy-authorization"
        || ["key", "token", "secret", "auth", "password"]
            .iter()
            .any(|w| n.contains(w))
}

#[derive(Debug, Default, Clone)]
pub struct Scrubber {
    secrets: Vec<String>,
}

impl Scrubber {
    pub fn new(setup: &UpstreamSetup) -> Scrubber {
        let mut secrets: Vec<String> = Vec::new();
        let mut add = |v: &str| {
            let v = v.trim();
            if v.chars().count() >= MIN_SECRET_CHARS && !secrets.iter().any(|s| s == v) {
                secrets.push(v.to_owned());
            }
        };
        if let Some(t) = &setup.bearer_token {
            add(t.expose());
        }
        for (name, value) in &setup.headers {
            if is_credential_header(name) {
                add(value);
                // "Bearer xyz", "Basic xyz": the part after the scheme on its own too.
                if let Some((_, rest)) = value.trim().split_once(' ') {
                    add(rest);
                }
            }
        }
        for (_, value) in &setup.secret_env {
            add(value.expose());
        }
        // Longest first: a secret that contains another is cut whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Scrubber { secrets }
    }

    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// JSON text from the server without the credentials, judged on its decoded strings:
    /// a `\u0073`-escaped token is the token (cutting the raw bytes missed it). Text that
    /// is not JSON is cut as text.
    pub fn json_text(&self, text: String) -> String {
        if self.is_empty() {
            return text;
        }
        match serde_json::from_str::<Value>(&text) {
            Ok(mut v) => {
                if self.value(&mut v) {
                    v.to_string()
                } else {
                    text
                }
            }
            Err(_) => self.text(text),
        }
    }

    /// `text` without the credentials (JSON text stays JSON: the replacement has no quote
    /// or backslash).
    pub fn text(&self, text: String) -> String {
        let mut out = text;
        for s in &self.secrets {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), REDACTED);
            }
        }
        out
    }

    /// Every string in `value` (keys too) without the credentials; true when one was cut.
    pub fn value(&self, value: &mut Value) -> bool {
        if self.is_empty() {
            return false;
        }
        match value {
            Value::String(s) if self.secrets.iter().any(|k| s.contains(k.as_str())) => {
                *s = self.text(std::mem::take(s));
                true
            }
            Value::Array(items) => items.iter_mut().fold(false, |cut, v| self.value(v) | cut),
            Value::Object(map) => {
                let mut cut = false;
                if map
                    .keys()
                    .any(|k| self.secrets.iter().any(|s| k.contains(s.as_str())))
                {
                    let old = std::mem::take(map);
                    for (k, v) in old {
                        map.insert(self.text(k), v);
                    }
                    cut = true;
                }
                map.values_mut().fold(cut, |cut, v| self.value(v) | cut)
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregator::setup::Secret;
    use serde_json::json;

    fn setup() -> UpstreamSetup {
        let mut s: UpstreamSetup =
            serde_json::from_value(json!({"name": "s", "url": "http://x/", "headers": [],
                                          "bearer_token": null, "timeout_secs": 1,
                                          "addresses": [], "unusable": null}))
            .unwrap();
        s.bearer_token = Some(Secret::new("tok-0123456789abcdef".into()));
        s.headers = vec![
            ("X-Api-Key".into(), "key-ABCDEFGHIJ".into()),
            ("Accept-Language".into(), "en-US-long-enough".into()),
        ];
        s.secret_env = vec![("GH".into(), Secret::new("ghp_secretvalue1".into()))];
        s
    }

    #[test]
    fn credentials_are_cut_from_text_and_values() {
        let sc = Scrubber::new(&setup());
        let t = sc.text(r#"{"error":"got Bearer tok-0123456789abcdef and key-ABCDEFGHIJ"}"#.into());
        assert_eq!(
            t,
            r#"{"error":"got Bearer [redacted credential] and [redacted credential]"}"#
        );
        assert!(serde_json::from_str::<Value>(&t).is_ok());
        // An ordinary header's value is not a credential.
        assert!(sc.text("en-US-long-enough".into()).contains("en-US"));
        let mut v = json!({"a": ["ghp_secretvalue1"], "ghp_secretvalue1": 1, "n": 3});
        sc.value(&mut v);
        assert_eq!(
            v,
            json!({"a": ["[redacted credential]"], "[redacted credential]": 1, "n": 3})
        );
    }

    #[test]
    fn an_escaped_credential_is_found_in_json() {
        let sc = Scrubber::new(&setup());
        let escaped = r#"{"t":"\u0074ok-0123456789abcdef","n":1}"#.to_string();
        let out: Value = serde_json::from_str(&sc.json_text(escaped)).unwrap();
        assert_eq!(out, json!({"t": "[redacted credential]", "n": 1}));
        let clean = r#"{"a": 1}"#.to_string();
        assert_eq!(sc.json_text(clean.clone()), clean, "untouched when clean");
    }

    #[test]
    fn short_values_are_not_looked_for() {
        let mut s = setup();
        s.bearer_token = Some(Secret::new("abc".into()));
        s.headers.clear();
        s.secret_env.clear();
        let sc = Scrubber::new(&s);
        assert!(sc.is_empty());
        assert_eq!(sc.text("abc abc".into()), "abc abc");
    }
}
