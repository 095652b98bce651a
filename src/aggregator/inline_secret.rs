//! Does a config value look like a credential? Tokens belong in a file or an environment
//! variable, never in the config file (which is copied, diffed and pasted into tickets), so
//! the config refuses anything that looks like one, without ever printing it.
//!
//! These are heuristics: they err on the side of refusing. A header that is not a secret
//! but looks like one can still be sent by naming it differently or shortening it.

/// Key or header-name fragments that mean "this holds a credential".
const SECRET_KEY_FRAGMENTS: &[&str] = &[
    "token",
    "secret",
    "password",
    "passwd",
    "apikey",
    "api-key",
    "api_key",
    "access-key",
    "access_key",
    "private-key",
    "private_key",
    "credential",
    "auth",
    "cookie",
    "session",
    "signature",
    "key",
    "bearer",
    "passphrase",
    "_pass",
    "pass_",
    "-pass",
    "pwd",
];

/// Prefixes of well-known token formats.
const TOKEN_PREFIXES: &[&str] = &[
    "bearer ",
    "basic ",
    "token ",
    "sk-",
    "sk_",
    "pk_",
    "rk_",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "glpat-",
    "xox",
    "akia",
    "asia",
    "eyj",
    "twt_",
    "ya29.",
    "hf_",
    "npm_",
    "pypi-",
];

/// Shortest run that counts as "long random-looking".
const MIN_OPAQUE_LEN: usize = 24;

/// A config key (lowercase) that suggests its value is a credential.
pub fn key_suggests_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    key == "pass" || SECRET_KEY_FRAGMENTS.iter().any(|f| key.contains(f))
}

/// A header name (lowercase) that suggests its value is a credential.
pub fn header_name_suggests_secret(name: &str) -> bool {
    key_suggests_secret(name)
}

/// A value that looks like a token: a known token prefix, or a long run of letters and
/// digits (with `-_.+/=`) that mixes letters and digits and has no spaces.
pub fn looks_like_secret(value: &str) -> bool {
    let trimmed = value.trim();
    let lower = trimmed.to_ascii_lowercase();
    if TOKEN_PREFIXES
        .iter()
        .any(|p| lower.starts_with(p) && lower.len() > p.len() + 4)
    {
        return true;
    }
    url_holds_credential(trimmed)
        || header_line_holds_credential(trimmed)
        || trimmed
            .split([' ', ',', ';'])
            .any(|w| opaque_run(w) || token_word(w))
}

/// One word that starts like a known token (`sk-…`, `ghp_…`) anywhere in a value:
/// `--header "Authorization: Bearer sk-…"` hides it after a prefix of its own.
fn token_word(word: &str) -> bool {
    let lower = word.to_ascii_lowercase();
    TOKEN_PREFIXES
        .iter()
        .filter(|p| !p.ends_with(' '))
        .any(|p| lower.starts_with(p) && lower.len() > p.len() + 4)
}

/// A header written out (`X-Api-Key: …`, `Authorization: Bearer …`) whose name suggests a
/// credential and whose value is not empty.
fn header_line_holds_credential(value: &str) -> bool {
    let Some((name, rest)) = value.split_once(':') else {
        return false;
    };
    let name = name.trim();
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && !rest.trim().is_empty()
        && !rest.starts_with("//")
        && header_name_suggests_secret(name)
}

/// A URL with a password in it (`scheme://user:PASSWORD@host`), or a query parameter
/// whose name suggests a credential (`?api_key=...`, `&token=...`).
fn url_holds_credential(value: &str) -> bool {
    let Some((_, rest)) = value.split_once("://") else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if let Some((userinfo, _)) = authority.rsplit_once('@')
        && userinfo
            .split_once(':')
            .is_some_and(|(_, pw)| !pw.is_empty())
    {
        return true;
    }
    let query = rest.split_once('?').map_or("", |(_, q)| q);
    let query = query.split('#').next().unwrap_or("");
    query.split('&').any(|pair| {
        pair.split_once('=')
            .is_some_and(|(k, v)| !v.is_empty() && key_suggests_secret(k))
    })
}

/// The canonical UUID form (8-4-4-4-12 hex digits): an identifier, not a credential.
fn is_uuid(word: &str) -> bool {
    let groups: Vec<&str> = word.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn opaque_run(word: &str) -> bool {
    if word.len() < MIN_OPAQUE_LEN || is_uuid(word) {
        return false;
    }
    let charset_ok = word
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'+' | b'/' | b'='));
    let letters = word.bytes().filter(u8::is_ascii_alphabetic).count();
    let digits = word.bytes().filter(u8::is_ascii_digit).count();
    charset_ok && letters > 0 && digits > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_look_like_tokens() {
        for v in [
            "sk-live-abcdef123456",
            "Bearer abc.def.ghi",
            "ghp_0123456789abcdefghijklmnopqrstuvwxyz",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig",
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
            "twt_q83hd7s6s5d4f3g2h1j0k9l8m7n6b5v4c3x2z1a0s9d",
            "AKIAIOSFODNN7EXAMPLE1234",
            "postgresql://admin:Hunter2Pass@db.internal:5432/prod",
            "mysql://root:s3cretPW@db/x",
            "https://mcp.example.com/mcp?api_key=KEYINURL",
            "https://mcp.example.com/mcp?x=1&access_token=abc",
            "Authorization: Bearer sk-abcdefabcdef12345678",
            "X-Api-Key: abcdef1234567890abcd",
            "--key sk-abcdefabcd1",
        ] {
            assert!(looks_like_secret(v), "{v}");
        }
    }

    #[test]
    fn ordinary_values_do_not() {
        for v in [
            "toolwall",
            "blue team",
            "application/vnd.example+json",
            "2026-07-28",
            "en-US,en;q=0.9",
            "a-long-but-plain-hyphenated-identifier",
            "123e4567-e89b-12d3-a456-426614174000",
            "https://user@mcp.example.com/mcp?page=2&lang=en",
            "postgresql://db.internal:5432/prod",
            "Note: nothing secret here",
            "https://user@example.com:8443/x",
            "",
        ] {
            assert!(!looks_like_secret(v), "{v}");
        }
    }

    #[test]
    fn secret_key_names() {
        for k in [
            "bearer_token",
            "token",
            "x-api-key",
            "cookie",
            "password",
            "proxy-authorization",
        ] {
            assert!(key_suggests_secret(k), "{k}");
        }
        for k in ["x-tenant", "x-client", "user-agent", "x-request-id"] {
            assert!(!key_suggests_secret(k), "{k}");
        }
    }
}
