//! Where a redirect points: a `Location` resolved against the URL that answered
//! (RFC 3986 section 5). The result is parsed and checked again like any URL.

use ureq::http::Uri;

/// Statuses followed as redirects. Every hop becomes a GET (toolwall sends no bodies).
pub fn is_followed_redirect(status: u16) -> bool {
    matches!(status, 301 | 302 | 303 | 307 | 308)
}

/// Resolve `location` against `base`; the fragment is dropped. The error says why the
/// location cannot be followed.
pub fn resolve_location(base: &Uri, location: &str) -> Result<String, String> {
    let location = location.trim();
    if location.is_empty() {
        return Err("empty Location header".into());
    }
    if !location.is_ascii() || location.bytes().any(|b| b.is_ascii_control() || b == b' ') {
        return Err("Location holds characters a URL cannot".into());
    }
    // Browsers read '\' as '/' in http URLs, so "/\evil.example" means another host to
    // them; refuse it rather than guess.
    if location.contains('\\') {
        return Err("Location holds a backslash".into());
    }
    let location = location.split('#').next().unwrap_or("");
    if has_scheme(location) {
        return Ok(location.to_string());
    }
    let scheme = base.scheme_str().ok_or("base URL has no scheme")?;
    if let Some(rest) = location.strip_prefix("//") {
        return Ok(format!("{scheme}://{rest}"));
    }
    let authority = base.authority().ok_or("base URL has no host")?.as_str();
    let (ref_path, ref_query) = match location.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (location, None),
    };
    let base_path = base.path();
    let path = if ref_path.is_empty() {
        base_path.to_string()
    } else if ref_path.starts_with('/') {
        remove_dot_segments(ref_path)
    } else {
        // Merge: the base path up to its last '/', then the reference.
        let dir = match base_path.rfind('/') {
            Some(i) => &base_path[..=i],
            None => "/",
        };
        remove_dot_segments(&format!("{dir}{ref_path}"))
    };
    let query = match ref_query {
        Some(q) => Some(q),
        None if ref_path.is_empty() => base.query(),
        None => None,
    };
    let path = if path.is_empty() {
        "/".to_string()
    } else {
        path
    };
    Ok(match query {
        Some(q) => format!("{scheme}://{authority}{path}?{q}"),
        None => format!("{scheme}://{authority}{path}"),
    })
}

/// Whether a reference starts with `scheme:` (a letter, then letters, digits, + - .).
fn has_scheme(reference: &str) -> bool {
    let Some(colon) = reference.find(':') else {
        return false;
    };
    let scheme = &reference[..colon];
    let mut bytes = scheme.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
}

/// RFC 3986 5.2.4: remove "." and ".." segments from an absolute path.
fn remove_dot_segments(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let last = segments.len().saturating_sub(1);
    for (i, seg) in segments.iter().enumerate() {
        match *seg {
            "." => {
                if i == last {
                    out.push("");
                }
            }
            ".." => {
                out.pop();
                if i == last {
                    out.push("");
                }
            }
            s => out.push(s),
        }
    }
    format!("/{}", out.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3986_examples() {
        // From RFC 3986 section 5.4, with an http base.
        let base: Uri = "http://a/b/c/d;p?q".parse().unwrap();
        let cases = [
            ("g", "http://a/b/c/g"),
            ("./g", "http://a/b/c/g"),
            ("g/", "http://a/b/c/g/"),
            ("/g", "http://a/g"),
            ("//g", "http://g"),
            ("?y", "http://a/b/c/d;p?y"),
            ("g?y", "http://a/b/c/g?y"),
            ("#s", "http://a/b/c/d;p?q"),
            ("g#s", "http://a/b/c/g"),
            (";x", "http://a/b/c/;x"),
            ("", "http://a/b/c/d;p?q"),
            (".", "http://a/b/c/"),
            ("./", "http://a/b/c/"),
            ("..", "http://a/b/"),
            ("../", "http://a/b/"),
            ("../g", "http://a/b/g"),
            ("../..", "http://a/"),
            ("../../g", "http://a/g"),
            ("../../../g", "http://a/g"),
            ("/./g", "http://a/g"),
            ("/../g", "http://a/g"),
            ("g.", "http://a/b/c/g."),
            ("..g", "http://a/b/c/..g"),
            ("./g/.", "http://a/b/c/g/"),
            ("g/../h", "http://a/b/c/h"),
            ("https://other.example/x", "https://other.example/x"),
        ];
        for (reference, want) in cases {
            if reference.is_empty() {
                assert!(resolve_location(&base, reference).is_err());
                continue;
            }
            assert_eq!(
                resolve_location(&base, reference).as_deref(),
                Ok(want),
                "{reference}"
            );
        }
    }

    #[test]
    fn odd_locations_are_refused() {
        let base: Uri = "http://a/b".parse().unwrap();
        assert!(resolve_location(&base, "/\\evil.example/").is_err());
        assert!(resolve_location(&base, "http://a/\u{e9}").is_err());
        assert!(resolve_location(&base, "/a b").is_err());
        assert!(resolve_location(&base, "/a\r\nX: y").is_err());
    }

    #[test]
    fn statuses() {
        for s in [301, 302, 303, 307, 308] {
            assert!(is_followed_redirect(s));
        }
        for s in [200, 300, 304, 305, 306, 404] {
            assert!(!is_followed_redirect(s));
        }
    }
}
