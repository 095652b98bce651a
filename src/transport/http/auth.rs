//! Who is calling: the bearer token of a request, checked against the token store, or
//! nobody at all when `http_auth = "none"` (loopback only).

use serde::Deserialize;

use super::request::{Request, trim_ows};
use crate::tokens::{AuthFailure, TokenKind, TokenVerifier};

/// `[listen] http_auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HttpAuth {
    /// Every MCP request carries a client token (the default).
    #[default]
    Tokens,
    /// No tokens: for local use and conformance runs, refused unless the listener is on a
    /// loopback address.
    None,
}

/// The principal of requests when `http_auth = "none"`.
pub const ANONYMOUS_PRINCIPAL: &str = "anonymous";

/// The token in `Authorization: Bearer <token>`.
pub fn bearer_token(request: &Request) -> Result<&str, AuthFailure> {
    let mut values = request.headers_named("authorization");
    let value = values.next().ok_or(AuthFailure::Missing)?;
    if values.next().is_some() {
        return Err(AuthFailure::Malformed);
    }
    let space = value
        .iter()
        .position(|&b| b == b' ')
        .ok_or(AuthFailure::Malformed)?;
    let (scheme, rest) = value.split_at(space);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return Err(AuthFailure::Malformed);
    }
    let token = trim_ows(rest);
    if token.is_empty() || token.iter().any(|&b| b == b' ' || b == b'\t') {
        return Err(AuthFailure::Malformed);
    }
    std::str::from_utf8(token).map_err(|_| AuthFailure::Malformed)
}

/// The principal behind `request`, which must hold a valid token of kind `need`.
pub fn authenticate(
    request: &Request,
    verifier: &dyn TokenVerifier,
    need: TokenKind,
    now_ms: i64,
) -> Result<String, AuthFailure> {
    let token = bearer_token(request)?;
    let info = verifier.verify(token, now_ms)?;
    if info.kind != need {
        return Err(AuthFailure::WrongKind {
            have: info.kind,
            need,
        });
    }
    Ok(info.principal)
}

/// The `WWW-Authenticate` value for a refusal (RFC 6750 §3: no error code when the request
/// carried no credentials).
pub fn challenge(failure: &AuthFailure) -> String {
    match failure {
        AuthFailure::Missing => "Bearer realm=\"toolwall\"".to_owned(),
        other => format!(
            "Bearer realm=\"toolwall\", error=\"invalid_token\", error_description=\"{other}\""
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::http::request::{Header, Request};

    fn with_auth(values: &[&[u8]]) -> Request {
        Request {
            method: "POST".into(),
            target: "/mcp".into(),
            minor_version: 1,
            headers: values
                .iter()
                .map(|v| Header {
                    name: "authorization".into(),
                    value: v.to_vec(),
                })
                .collect(),
            body: 0..0,
            consumed: 0,
            keep_alive: true,
            expects_continue: false,
            body_over_limit: None,
        }
    }

    #[test]
    fn bearer_shapes() {
        assert_eq!(bearer_token(&with_auth(&[b"Bearer abc"])), Ok("abc"));
        assert_eq!(bearer_token(&with_auth(&[b"bearer   abc"])), Ok("abc"));
        assert_eq!(bearer_token(&with_auth(&[])), Err(AuthFailure::Missing));
        for bad in [
            &b"Basic abc"[..],
            b"Bearer",
            b"Bearer ",
            b"Bearer a b",
            b"Bearerabc",
            b"Bearer \xff",
        ] {
            assert_eq!(
                bearer_token(&with_auth(&[bad])),
                Err(AuthFailure::Malformed),
                "{bad:?}"
            );
        }
        assert_eq!(
            bearer_token(&with_auth(&[b"Bearer a", b"Bearer b"])),
            Err(AuthFailure::Malformed)
        );
    }

    #[test]
    fn challenges() {
        assert_eq!(
            challenge(&AuthFailure::Missing),
            "Bearer realm=\"toolwall\""
        );
        assert!(challenge(&AuthFailure::Expired).contains("invalid_token"));
    }
}
