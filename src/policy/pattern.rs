//! Glob patterns for names (method, server, tool, resource, principal, process) and for the
//! `glob` operator. `*` matches any run of characters, `/` included; `?` one character;
//! `[abc]`, `[!abc]` a class; `{a,b}` alternatives; `\` escapes. The common shapes (a literal,
//! `prefix*`, `*suffix`, `*middle*`, `*`) are matched with plain string operations, so the
//! usual rule costs a comparison, not a regex.

use globset::{Candidate, GlobBuilder, GlobMatcher};

const GLOB_META: &[char] = &['*', '?', '[', ']', '{', '}', '\\'];

#[derive(Debug, Clone)]
pub enum Pattern {
    Any,
    Literal(String),
    Prefix(String),
    Suffix(String),
    Contains(String),
    Glob(Box<GlobMatcher>),
}

impl Pattern {
    pub fn compile(text: &str) -> Result<Pattern, String> {
        if text.is_empty() {
            return Err("empty pattern".into());
        }
        let plain = |s: &str| !s.contains(GLOB_META);
        if text.chars().all(|c| c == '*') {
            return Ok(Pattern::Any);
        }
        if plain(text) {
            return Ok(Pattern::Literal(text.to_string()));
        }
        if let Some(inner) = text.strip_prefix('*').and_then(|t| t.strip_suffix('*'))
            && !inner.is_empty()
            && plain(inner)
        {
            return Ok(Pattern::Contains(inner.to_string()));
        }
        if let Some(prefix) = text.strip_suffix('*')
            && plain(prefix)
        {
            return Ok(Pattern::Prefix(prefix.to_string()));
        }
        if let Some(suffix) = text.strip_prefix('*')
            && plain(suffix)
        {
            return Ok(Pattern::Suffix(suffix.to_string()));
        }
        let glob = GlobBuilder::new(text)
            .literal_separator(false)
            .backslash_escape(true)
            .build()
            .map_err(|e| format!("bad glob {text:?}: {}", e.kind()))?;
        Ok(Pattern::Glob(Box::new(glob.compile_matcher())))
    }

    pub fn is_match(&self, s: &str) -> bool {
        match self {
            Pattern::Any => true,
            Pattern::Literal(l) => s == l,
            Pattern::Prefix(p) => s.starts_with(p.as_str()),
            Pattern::Suffix(x) => s.ends_with(x.as_str()),
            Pattern::Contains(c) => s.contains(c.as_str()),
            Pattern::Glob(g) => g.is_match_candidate(&Candidate::from_bytes(s.as_bytes())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, s: &str) -> bool {
        Pattern::compile(p).unwrap().is_match(s)
    }

    #[test]
    fn shapes_match_like_globs() {
        assert!(m("local__*", "local__echo"));
        assert!(!m("local__*", "github__echo"));
        assert!(m("*__delete", "github__delete"));
        assert!(m("*shell*", "local__shell_exec"));
        assert!(m("*", "anything/at/all"));
        assert!(m("tools/call", "tools/call"));
        assert!(!m("tools/call", "tools/list"));
        assert!(
            m("file:///etc/*", "file:///etc/ssh/sshd_config"),
            "* crosses /"
        );
        assert!(m("{github,gitlab}__*", "gitlab__push"));
        assert!(m("uid:100?", "uid:1000"));
        assert!(!m("uid:100?", "uid:10000"));
        assert!(m("local__[!x]*", "local__echo"));
        assert!(m(r"a\*b", "a*b"));
        assert!(!m(r"a\*b", "axb"));
    }

    proptest::proptest! {
        #[test]
        fn any_pattern_compiles_or_is_refused_without_panic(
            pattern in "[a-z*?\\[\\]{},!\\\\/_é-]{0,16}",
            name in "[a-z/_é-]{0,16}",
        ) {
            if let Ok(p) = Pattern::compile(&pattern) {
                let _ = p.is_match(&name);
            }
        }
    }

    #[test]
    fn bad_globs_are_refused() {
        assert!(Pattern::compile("").is_err());
        assert!(Pattern::compile("a[").is_err());
        assert!(Pattern::compile("{a,b").is_err());
    }
}
