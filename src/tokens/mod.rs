//! Bearer tokens for the HTTP door.
//!
//! `toolwall token create` makes a token, prints it once, and stores only its SHA-256 in the
//! `tokens` table of the ledger database file; the HTTP door looks every presented token up
//! by that hash. A token names a principal (the call's principal in policy and ledger) and a
//! kind: `client` tokens call MCP methods, `admin` tokens read `/metrics`. Expired and
//! revoked tokens are refused. No token ever appears in a log line or a ledger column.

pub mod cli_output;
pub mod random;
pub mod secret;
mod store;

pub use store::{NewToken, RevokeOutcome, TOKENS_TABLE_SQL, TokenError, TokenStore};

use std::fmt;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenKind {
    /// MCP requests on `/mcp`.
    Client,
    /// `/metrics` (and future operator endpoints); never MCP requests.
    Admin,
}

impl TokenKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenKind::Client => "client",
            TokenKind::Admin => "admin",
        }
    }

    pub fn parse(text: &str) -> Result<TokenKind, String> {
        match text {
            "client" => Ok(TokenKind::Client),
            "admin" => Ok(TokenKind::Admin),
            other => Err(format!(
                "unknown token kind {other:?} (expected client or admin)"
            )),
        }
    }
}

/// A stored token, without its secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenInfo {
    pub id: i64,
    pub principal: String,
    pub kind: TokenKind,
    pub created_ms: i64,
    pub expires_ms: Option<i64>,
    pub revoked_ms: Option<i64>,
}

/// Where a token stands at a given time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenStatus {
    Active,
    Expired,
    Revoked,
}

impl TokenInfo {
    pub fn status(&self, now_ms: i64) -> TokenStatus {
        if self.revoked_ms.is_some() {
            TokenStatus::Revoked
        } else if self.expires_ms.is_some_and(|e| e <= now_ms) {
            TokenStatus::Expired
        } else {
            TokenStatus::Active
        }
    }
}

/// Why a request's credentials were refused. Never carries the presented token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthFailure {
    /// No `Authorization` header.
    Missing,
    /// Not `Bearer <token>`, several headers, or not shaped like a toolwall token.
    Malformed,
    /// Well-formed, but no such token.
    Unknown,
    Expired,
    Revoked,
    /// A valid token of a kind this endpoint does not take.
    WrongKind {
        have: TokenKind,
        need: TokenKind,
    },
    /// The token store could not be read; the request is refused (fail closed).
    Unavailable,
}

impl fmt::Display for AuthFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthFailure::Missing => f.write_str("a bearer token is required"),
            AuthFailure::Malformed => f.write_str("the bearer token is malformed"),
            AuthFailure::Unknown => f.write_str("the bearer token is not known"),
            AuthFailure::Expired => f.write_str("the bearer token has expired"),
            AuthFailure::Revoked => f.write_str("the bearer token has been revoked"),
            AuthFailure::WrongKind { have, need } => write!(
                f,
                "a token of kind {} cannot be used here; kind {} is required",
                have.as_str(),
                need.as_str()
            ),
            AuthFailure::Unavailable => f.write_str("the token store is unavailable"),
        }
    }
}

/// Looks presented tokens up; the HTTP door takes any implementation (the SQLite
/// [`TokenStore`] in the gateway).
pub trait TokenVerifier {
    /// The token's record when it exists, is not revoked and has not expired at `now_ms`.
    /// The kind is checked by the caller, which knows what the endpoint needs.
    fn verify(&self, presented: &str, now_ms: i64) -> Result<TokenInfo, AuthFailure>;
}

/// Longest principal name.
pub const MAX_PRINCIPAL_LEN: usize = 64;

/// Principal names appear in policy rules, ledger rows and log lines: keep them plain.
pub fn validate_principal(name: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@');
    if name.is_empty() || name.len() > MAX_PRINCIPAL_LEN || !name.chars().all(ok_char) {
        return Err(format!(
            "principal {name:?} must be 1 to {MAX_PRINCIPAL_LEN} characters of A-Z a-z 0-9 . _ - @"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip() {
        for kind in [TokenKind::Client, TokenKind::Admin] {
            assert_eq!(TokenKind::parse(kind.as_str()).unwrap(), kind);
        }
        assert!(TokenKind::parse("worker").is_err());
    }

    #[test]
    fn principals() {
        assert!(validate_principal("alice").is_ok());
        assert!(validate_principal("ci-bot@example.org").is_ok());
        assert!(validate_principal("").is_err());
        assert!(validate_principal("a b").is_err());
        assert!(validate_principal("x\n").is_err());
        assert!(validate_principal(&"a".repeat(65)).is_err());
    }

    #[test]
    fn status_order() {
        let mut info = TokenInfo {
            id: 1,
            principal: "p".into(),
            kind: TokenKind::Client,
            created_ms: 0,
            expires_ms: Some(100),
            revoked_ms: None,
        };
        assert_eq!(info.status(99), TokenStatus::Active);
        assert_eq!(info.status(100), TokenStatus::Expired);
        info.revoked_ms = Some(50);
        assert_eq!(info.status(10), TokenStatus::Revoked);
    }
}
