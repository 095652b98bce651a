//! PATH: where a rule looks inside the arguments or the result.
//!
//! Syntax: segments joined by `.`; a segment is a bare key (`headers`), a quoted key for keys
//! holding `.`, `[`, `]` or `"` (`"x.y"`, with `\"` and `\\` escapes), or an array index in
//! brackets (`[0]`). A bare key made only of digits also indexes an array, so `items.0.name`
//! and `items[0].name` address the same value; on an object it is the key `"0"`.
//! Examples: `query`, `headers.Authorization`, `items[0].name`, `headers."X.Trace"`,
//! `matrix[1][2]`. A path that does not resolve means the condition does not hold.

use serde_json::Value;

/// Longest PATH accepted, in bytes.
pub const MAX_PATH_BYTES: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    /// A key; `index` is set when the key is all digits, so it can index an array too.
    Key { name: String, index: Option<usize> },
    /// `[N]`: an array index only.
    Index(usize),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValuePath {
    text: String,
    segments: Vec<Segment>,
}

impl ValuePath {
    pub fn parse(text: &str) -> Result<ValuePath, String> {
        if text.is_empty() {
            return Err("empty path".into());
        }
        if text.len() > MAX_PATH_BYTES {
            return Err(format!("path longer than {MAX_PATH_BYTES} bytes"));
        }
        let bytes = text.as_bytes();
        let mut segments = Vec::new();
        let mut at = 0;
        // True where a key may start: the beginning, or right after a `.`.
        let mut key_expected = true;
        while at < bytes.len() {
            match bytes[at] {
                b'[' => {
                    let close = text[at..]
                        .find(']')
                        .map(|i| at + i)
                        .ok_or_else(|| format!("unclosed '[' at byte {at} in {text:?}"))?;
                    let digits = &text[at + 1..close];
                    segments.push(Segment::Index(parse_index(digits).ok_or_else(|| {
                        format!("bad array index [{digits}] in {text:?}: expected [N]")
                    })?));
                    at = close + 1;
                    key_expected = false;
                    if at < bytes.len() && bytes[at] == b'.' {
                        at += 1;
                        key_expected = true;
                        if at == bytes.len() {
                            return Err(format!("path {text:?} ends with '.'"));
                        }
                    }
                }
                _ if !key_expected => {
                    return Err(format!("expected '.' or '[' at byte {at} in {text:?}"));
                }
                b'.' => return Err(format!("empty segment at byte {at} in {text:?}")),
                b']' => return Err(format!("unexpected ']' at byte {at} in {text:?}")),
                b'"' => {
                    let (name, next) = parse_quoted(text, at)?;
                    segments.push(Segment::Key { name, index: None });
                    at = next;
                    key_expected = false;
                    if at < bytes.len() && bytes[at] == b'.' {
                        at += 1;
                        key_expected = true;
                        if at == bytes.len() {
                            return Err(format!("path {text:?} ends with '.'"));
                        }
                    }
                }
                _ => {
                    let end = text[at..]
                        .find(['.', '[', ']', '"'])
                        .map_or(text.len(), |i| at + i);
                    let name = &text[at..end];
                    segments.push(Segment::Key {
                        name: name.to_string(),
                        index: parse_index(name),
                    });
                    at = end;
                    key_expected = false;
                    if at < bytes.len() && bytes[at] == b'.' {
                        at += 1;
                        key_expected = true;
                        if at == bytes.len() {
                            return Err(format!("path {text:?} ends with '.'"));
                        }
                    }
                }
            }
        }
        Ok(ValuePath {
            text: text.to_string(),
            segments,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The value at this path, if every segment resolves.
    pub fn resolve<'v>(&self, root: &'v Value) -> Option<&'v Value> {
        let mut here = root;
        for segment in &self.segments {
            here = match (segment, here) {
                (Segment::Key { name, .. }, Value::Object(map)) => map.get(name)?,
                (Segment::Key { index: Some(i), .. }, Value::Array(items)) => items.get(*i)?,
                (Segment::Index(i), Value::Array(items)) => items.get(*i)?,
                _ => return None,
            };
        }
        Some(here)
    }

    /// The value at this path, mutably, if every segment resolves.
    pub fn resolve_mut<'v>(&self, root: &'v mut Value) -> Option<&'v mut Value> {
        let mut here = root;
        for segment in &self.segments {
            here = match (segment, here) {
                (Segment::Key { name, .. }, Value::Object(map)) => map.get_mut(name)?,
                (Segment::Key { index: Some(i), .. }, Value::Array(items)) => items.get_mut(*i)?,
                (Segment::Index(i), Value::Array(items)) => items.get_mut(*i)?,
                _ => return None,
            };
        }
        Some(here)
    }
}

/// A decimal array index without sign or leading `+`; None for anything else.
fn parse_index(digits: &str) -> Option<usize> {
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A `"..."` key starting at byte `at`; returns the key and the byte after the closing quote.
fn parse_quoted(text: &str, at: usize) -> Result<(String, usize), String> {
    let mut name = String::new();
    let mut chars = text[at + 1..].char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((name, at + 1 + i + 1)),
            '\\' => match chars.next() {
                Some((_, e @ ('"' | '\\'))) => name.push(e),
                _ => {
                    return Err(format!(
                        "bad escape in quoted key in {text:?}: only \\\" and \\\\"
                    ));
                }
            },
            c => name.push(c),
        }
    }
    Err(format!("unclosed '\"' at byte {at} in {text:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at<'v>(path: &str, v: &'v Value) -> Option<&'v Value> {
        ValuePath::parse(path).unwrap().resolve(v)
    }

    #[test]
    fn dotted_keys_and_indices() {
        let v = json!({"headers": {"Authorization": "Bearer x", "X.Trace": 1},
                        "items": [{"name": "a"}, {"name": "b"}],
                        "m": [[1, 2], [3, 4]],
                        "o": {"0": "zero"}});
        assert_eq!(at("headers.Authorization", &v), Some(&json!("Bearer x")));
        assert_eq!(at("items.1.name", &v), Some(&json!("b")));
        assert_eq!(at("items[1].name", &v), Some(&json!("b")));
        assert_eq!(at("m[1][0]", &v), Some(&json!(3)));
        assert_eq!(at("m.1.0", &v), Some(&json!(3)));
        assert_eq!(at("headers.\"X.Trace\"", &v), Some(&json!(1)));
        assert_eq!(at("o.0", &v), Some(&json!("zero")));
        assert_eq!(at("o[0]", &v), None, "[N] indexes arrays only");
        assert_eq!(at("items.2.name", &v), None);
        assert_eq!(at("headers.Missing", &v), None);
        assert_eq!(at("headers.Authorization.deeper", &v), None);
    }

    #[test]
    fn bad_paths_are_refused() {
        for bad in [
            "", ".a", "a.", "a..b", "a[", "a[x]", "a[-1]", "a]", "\"a", "a\"b\"", "a[0]b",
            "\"a\\n\"",
        ] {
            assert!(ValuePath::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(ValuePath::parse(&"a.".repeat(600)).is_err());
    }

    proptest::proptest! {
        #[test]
        fn any_text_parses_or_is_refused_without_panic(text in "[a-z0-9.\\[\\]\"\\\\é]{0,24}") {
            if let Ok(p) = ValuePath::parse(&text) {
                let v = json!({"a": [{"b": 1}], "0": {"é": "x"}});
                let _ = p.resolve(&v);
            }
        }
    }

    #[test]
    fn resolve_mut_reaches_the_same_value() {
        let mut v = json!({"items": [{"q": "x"}]});
        let p = ValuePath::parse("items[0].q").unwrap();
        *p.resolve_mut(&mut v).unwrap() = json!("y");
        assert_eq!(v, json!({"items": [{"q": "y"}]}));
    }
}
