//! Value conditions: `arg = { path, equals | contains | matches | glob }` and
//! `result = { path?, ... }`, compiled once, judged against whole values (never a preview).
//!
//! - With a path: the condition looks at the one value there. `equals` compares JSON values
//!   (numbers by value, so `1` equals `1.0`; a string never equals a number). `contains`,
//!   `matches` and `glob` test a string as it is, and any other value (number, boolean,
//!   object, array) by its compact JSON text.
//! - Without a path: the condition holds if it holds for any scalar (string, number,
//!   boolean) anywhere in the value, at any depth; `contains`, `matches` and `glob` also
//!   test every object key (a key can carry text as well as a value can). For a result
//!   it also holds if it holds for the result's text content: the `text` of every
//!   `content[]` and `contents[]` item (and of an embedded `resource`), joined with nothing
//!   and joined with `\n`, so a pattern split across blocks, mid-word or at a line break,
//!   is still found.

use std::cell::OnceCell;

use regex::{Regex, RegexBuilder};
use serde_json::Value;

use super::config::ValueCondition;
use super::path::ValuePath;
use super::pattern::Pattern;

#[derive(Debug, Clone)]
pub enum Test {
    Equals(Value),
    Contains(String),
    Matches(Regex),
    Glob(Pattern),
}

#[derive(Debug, Clone)]
pub struct Condition {
    pub path: Option<ValuePath>,
    pub test: Test,
}

/// Compile a regex under the configured size limit.
pub fn compile_regex(pattern: &str, max_bytes: usize) -> Result<Regex, String> {
    if pattern.is_empty() {
        return Err("empty regex (it would match everything)".into());
    }
    RegexBuilder::new(pattern)
        .size_limit(max_bytes)
        .build()
        .map_err(|e| format!("bad regex {pattern:?}: {}", one_line(&e)))
}

/// The regex crate explains a syntax error over several lines (pattern, caret, message);
/// fold it into "message at character N" so each fault stays one line.
fn one_line(error: &regex::Error) -> String {
    let text = error.to_string();
    let lines: Vec<&str> = text.lines().collect();
    let message = lines
        .iter()
        .find_map(|l| l.trim_start().strip_prefix("error: "));
    let caret = lines.iter().position(|l| l.trim_start().starts_with('^'));
    match (message, caret) {
        (Some(message), Some(at)) if at > 0 => {
            let echoed = lines[at - 1];
            let indent = echoed.len() - echoed.trim_start().len();
            let column = lines[at].find('^').unwrap_or(indent).saturating_sub(indent) + 1;
            format!("{message} at character {column}")
        }
        (Some(message), _) => message.to_string(),
        _ => lines.join(" "),
    }
}

impl Condition {
    /// `what` names the key in messages (`arg`, `result`).
    pub fn compile(cfg: &ValueCondition, what: &str, max_regex: usize) -> Result<Self, String> {
        let given = [
            cfg.equals.is_some(),
            cfg.contains.is_some(),
            cfg.matches.is_some(),
            cfg.glob.is_some(),
        ]
        .iter()
        .filter(|g| **g)
        .count();
        if given != 1 {
            return Err(format!(
                "{what} needs exactly one of equals, contains, matches, glob (found {given})"
            ));
        }
        let path = match &cfg.path {
            Some(p) => Some(ValuePath::parse(p).map_err(|e| format!("{what}.path: {e}"))?),
            None => None,
        };
        let test = if let Some(v) = &cfg.equals {
            if matches!(v, Value::Object(_)) {
                return Err(format!(
                    "{what}.equals takes a string, number, boolean or array"
                ));
            }
            Test::Equals(v.clone())
        } else if let Some(c) = &cfg.contains {
            if c.is_empty() {
                return Err(format!(
                    "{what}.contains is empty (it would match everything)"
                ));
            }
            Test::Contains(c.clone())
        } else if let Some(m) = &cfg.matches {
            Test::Matches(compile_regex(m, max_regex).map_err(|e| format!("{what}.matches: {e}"))?)
        } else if let Some(g) = &cfg.glob {
            Test::Glob(Pattern::compile(g).map_err(|e| format!("{what}.glob: {e}"))?)
        } else {
            return Err(format!("{what} has no operator"));
        };
        Ok(Condition { path, test })
    }

    /// Judge against the arguments (or any value): the value at the path, or any scalar.
    pub fn holds_in(&self, root: &Value) -> bool {
        match &self.path {
            Some(path) => path.resolve(root).is_some_and(|v| self.test.holds(v)),
            None => {
                any_scalar(root, |v| self.test.holds(v))
                    || (!matches!(self.test, Test::Equals(_))
                        && any_key(root, |k| self.test.holds_str(k)))
            }
        }
    }

    /// Judge against a result: as `holds_in`, plus the joined text content without a path.
    pub fn holds_in_result(&self, result: &ResultView<'_>) -> bool {
        if self.holds_in(result.value) {
            return true;
        }
        self.path.is_none()
            && result
                .joined_texts()
                .is_some_and(|joined| joined.iter().any(|t| self.test.holds_str(t)))
    }
}

impl Test {
    pub fn holds(&self, value: &Value) -> bool {
        match (self, value) {
            (Test::Equals(want), got) => json_equal(want, got),
            (_, Value::String(s)) => self.holds_str(s),
            (_, other) => match serde_json::to_string(other) {
                Ok(text) => self.holds_str(&text),
                Err(_) => false,
            },
        }
    }

    pub fn holds_str(&self, s: &str) -> bool {
        match self {
            Test::Equals(Value::String(want)) => want == s,
            Test::Equals(_) => false,
            Test::Contains(c) => s.contains(c.as_str()),
            Test::Matches(re) => re.is_match(s),
            Test::Glob(p) => p.is_match(s),
        }
    }
}

/// JSON equality, with numbers compared by value.
fn json_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            if let (Some(x), Some(y)) = (x.as_i64(), y.as_i64()) {
                x == y
            } else if let (Some(x), Some(y)) = (x.as_u64(), y.as_u64()) {
                x == y
            } else {
                x.as_f64() == y.as_f64()
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| json_equal(x, y))
        }
        _ => a == b,
    }
}

/// The values a walk has still to visit. Every rule without a path walks every call's
/// arguments (and answers), so the walk's stack lives inline for the shallow values nearly
/// every call holds and only a wide or deep one spills to the heap.
type WalkStack<'a> = smallvec::SmallVec<[&'a Value; 16]>;

/// True if `test` holds for some string, number or boolean anywhere in `root`. Walks with an
/// explicit stack, so no input depth can exhaust the thread's stack.
pub fn any_scalar(root: &Value, mut test: impl FnMut(&Value) -> bool) -> bool {
    let mut pending: WalkStack<'_> = WalkStack::new();
    let mut here = root;
    loop {
        match here {
            Value::Object(map) => pending.extend(map.values()),
            Value::Array(items) => pending.extend(items.iter()),
            Value::Null => {}
            scalar => {
                if test(scalar) {
                    return true;
                }
            }
        }
        match pending.pop() {
            Some(next) => here = next,
            None => return false,
        }
    }
}

/// True if `test` holds for some object key anywhere in `root` (explicit stack, as above).
pub fn any_key(root: &Value, mut test: impl FnMut(&str) -> bool) -> bool {
    let mut pending: WalkStack<'_> = smallvec::smallvec![root];
    while let Some(here) = pending.pop() {
        match here {
            Value::Object(map) => {
                for (key, value) in map {
                    if test(key) {
                        return true;
                    }
                    pending.push(value);
                }
            }
            Value::Array(items) => pending.extend(items.iter()),
            _ => {}
        }
    }
    false
}

/// A result as response rules see it; the joined text content is built at most once, and
/// only when some rule needs it.
pub struct ResultView<'a> {
    pub value: &'a Value,
    joined: OnceCell<Option<[String; 2]>>,
}

impl<'a> ResultView<'a> {
    pub fn new(value: &'a Value) -> Self {
        ResultView {
            value,
            joined: OnceCell::new(),
        }
    }

    /// The text of all `content[]` / `contents[]` items joined with nothing and with `\n`,
    /// when there are two or more (one text is already tested as a scalar).
    pub fn joined_texts(&self) -> Option<&[String; 2]> {
        self.joined
            .get_or_init(|| {
                let texts: Vec<&str> = text_blocks(self.value).collect();
                if texts.len() < 2 {
                    None
                } else {
                    Some([texts.concat(), texts.join("\n")])
                }
            })
            .as_ref()
    }
}

/// The text blocks of an answer, in order: the `content[]` items of a tool result, the
/// `contents[]` of a resource read, the `messages[].content` of a prompt (one block or a
/// list), each block's `text` and the `text` of a resource embedded in it.
pub fn text_blocks(result: &Value) -> impl Iterator<Item = &str> {
    let listed = ["content", "contents"]
        .into_iter()
        .filter_map(move |key| result.get(key).and_then(Value::as_array))
        .flatten();
    let messages = result
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|m| m.get("content"))
        .flat_map(|c| match c {
            Value::Array(blocks) => blocks.iter().collect::<Vec<_>>(),
            block => vec![block],
        });
    listed
        .chain(messages)
        .flat_map(|item| {
            [
                item.get("text"),
                item.get("resource").and_then(|r| r.get("text")),
            ]
        })
        .flatten()
        .filter_map(Value::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cond(toml_text: &str) -> Condition {
        let cfg: ValueCondition = toml::from_str(toml_text).unwrap();
        Condition::compile(&cfg, "arg", 1 << 20).unwrap()
    }

    #[test]
    fn path_operators() {
        let args = json!({"n": 5, "f": 1.0, "s": "hello world", "b": true, "o": {"k": "v"}});
        assert!(cond("path = \"n\"\nequals = 5").holds_in(&args));
        assert!(cond("path = \"n\"\nequals = 5.0").holds_in(&args));
        assert!(cond("path = \"f\"\nequals = 1").holds_in(&args));
        assert!(!cond("path = \"n\"\nequals = \"5\"").holds_in(&args));
        assert!(cond("path = \"b\"\nequals = true").holds_in(&args));
        assert!(cond("path = \"s\"\ncontains = \"lo wo\"").holds_in(&args));
        assert!(cond("path = \"s\"\nmatches = \"^hel+o\"").holds_in(&args));
        assert!(cond("path = \"s\"\nglob = \"hello *\"").holds_in(&args));
        assert!(
            cond("path = \"n\"\nmatches = \"^5$\"").holds_in(&args),
            "numbers by JSON text"
        );
        assert!(cond("path = \"o\"\ncontains = '\"k\":\"v\"'").holds_in(&args));
        assert!(!cond("path = \"missing\"\ncontains = \"x\"").holds_in(&args));
    }

    #[test]
    fn without_path_any_scalar_anywhere() {
        let args = json!({"a": [{"b": {"c": "needle in here"}}], "n": 42});
        assert!(cond("contains = \"needle\"").holds_in(&args));
        assert!(cond("equals = 42").holds_in(&args));
        assert!(
            !cond("equals = \"b\"").holds_in(&args),
            "equals does not compare keys"
        );
        let keyed = json!({"structuredContent": {"-----BEGIN RSA PRIVATE KEY-----": 1}});
        assert!(
            cond("matches = \"BEGIN [A-Z ]*PRIVATE KEY\"").holds_in(&keyed),
            "text tests see keys too"
        );
    }

    #[test]
    fn prompt_messages_are_joined_too() {
        let result = json!({"messages": [
            {"role": "user", "content": {"type": "text", "text": "-----BEGIN RSA PRIV"}},
            {"role": "user", "content": [{"type": "text", "text": "ATE KEY-----"}]}]});
        let view = ResultView::new(&result);
        assert!(cond("matches = \"BEGIN RSA PRIVATE KEY\"").holds_in_result(&view));
    }

    #[test]
    fn result_text_joined_across_blocks() {
        let result = json!({"content": [{"type": "text", "text": "BEGIN se"},
                                        {"type": "text", "text": "cret END"}]});
        let view = ResultView::new(&result);
        assert!(cond("matches = \"se\\ncret\"").holds_in_result(&view));
        assert!(!cond("matches = \"se\\ncret\"").holds_in(&result));
    }

    #[test]
    fn operator_count_checked() {
        let two: ValueCondition = toml::from_str("equals = 1\ncontains = \"x\"").unwrap();
        assert!(Condition::compile(&two, "arg", 1 << 20).is_err());
        let none: ValueCondition = toml::from_str("path = \"x\"").unwrap();
        assert!(Condition::compile(&none, "arg", 1 << 20).is_err());
    }

    #[test]
    fn deep_values_do_not_exhaust_the_stack() {
        let mut v = json!("leaf");
        for _ in 0..100_000 {
            v = Value::Array(vec![v]);
        }
        assert!(cond("equals = \"leaf\"").holds_in(&v));
        // Dropping a deep Value recurses in serde_json; unwind it here iteratively.
        while let Value::Array(mut items) = v {
            v = items.pop().unwrap_or(Value::Null);
        }
    }
}
