//! What `toolwall token create | list | revoke` print, and how their arguments read. Pure
//! functions: the command line opens the [`TokenStore`](super::TokenStore) and prints these.

use std::fmt::Write as _;
use std::time::Duration;

use super::store::{MAX_LIFETIME, NewToken, RevokeOutcome};
use super::{TokenInfo, TokenStatus};
use crate::transport::http::http_date::utc_from_ms;

/// `--expires` as written: `30d`, `12h`, `90m`, `3600s`, `2w`, or `never`.
pub fn parse_lifetime(text: &str) -> Result<Option<Duration>, String> {
    if text == "never" {
        return Ok(None);
    }
    let bad = || {
        format!("--expires {text:?}: expected a number with s, m, h, d or w (e.g. 30d), or never")
    };
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (digits, unit) = text.split_at(split);
    let amount: u64 = digits.parse().map_err(|_| bad())?;
    let unit_secs: u64 = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => return Err(bad()),
    };
    let secs = amount.checked_mul(unit_secs).ok_or_else(bad)?;
    let lifetime = Duration::from_secs(secs);
    if lifetime.is_zero() || lifetime > MAX_LIFETIME {
        return Err(format!(
            "--expires {text:?}: must be between 1s and {}d",
            MAX_LIFETIME.as_secs() / 86_400
        ));
    }
    Ok(Some(lifetime))
}

/// The one time a token is shown. The secret is on a line of its own so scripts can take
/// the last line.
pub fn format_created(new: &NewToken) -> String {
    let info = &new.info;
    let expires = info
        .expires_ms
        .map(utc_from_ms)
        .unwrap_or_else(|| "never".to_owned());
    format!(
        "created token {} for principal {} (kind {}, expires {expires})\n\
         It is shown only this once; toolwall keeps only its hash.\n\
         Clients send it as: Authorization: Bearer <token>\n\
         {}\n",
        info.id,
        info.principal,
        info.kind.as_str(),
        new.secret
    )
}

fn status_word(info: &TokenInfo, now_ms: i64) -> &'static str {
    match info.status(now_ms) {
        TokenStatus::Active => "active",
        TokenStatus::Expired => "expired",
        TokenStatus::Revoked => "revoked",
    }
}

/// A table of every token (no secrets: the store has none).
pub fn format_list(tokens: &[TokenInfo], now_ms: i64) -> String {
    if tokens.is_empty() {
        return "no tokens (create one with: toolwall token create --principal NAME)\n".to_owned();
    }
    let width = tokens
        .iter()
        .map(|t| t.principal.len())
        .max()
        .unwrap_or(0)
        .max("PRINCIPAL".len());
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>5}  {:<width$}  {:<6}  {:<8}  {:<20}  {:<20}",
        "ID", "PRINCIPAL", "KIND", "STATUS", "CREATED", "EXPIRES"
    );
    for t in tokens {
        let expires = t
            .expires_ms
            .map(utc_from_ms)
            .unwrap_or_else(|| "never".to_owned());
        let _ = writeln!(
            out,
            "{:>5}  {:<width$}  {:<6}  {:<8}  {:<20}  {:<20}",
            t.id,
            t.principal,
            t.kind.as_str(),
            status_word(t, now_ms),
            utc_from_ms(t.created_ms),
            expires
        );
    }
    out
}

/// The message for `token revoke ID` and the exit code it deserves (1 when not found).
pub fn format_revoked(id: i64, outcome: &RevokeOutcome) -> (String, i32) {
    match outcome {
        RevokeOutcome::Revoked(info) => (
            format!(
                "revoked token {} of principal {}; requests bearing it are refused from now on\n",
                info.id, info.principal
            ),
            0,
        ),
        RevokeOutcome::AlreadyRevoked(info) => (
            format!(
                "token {} of principal {} was already revoked at {}\n",
                info.id,
                info.principal,
                info.revoked_ms.map(utc_from_ms).unwrap_or_default()
            ),
            0,
        ),
        RevokeOutcome::NotFound => (format!("no token with id {id}\n"), 1),
    }
}

/// `token revoke ID`: the id as typed.
pub fn parse_token_id(text: &str) -> Result<i64, String> {
    text.parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| {
            format!("token id {text:?} must be a positive number (see toolwall token list)")
        })
}

#[cfg(test)]
mod tests {
    use super::super::{TokenKind, TokenStore};
    use super::*;

    #[test]
    fn lifetimes() {
        assert_eq!(parse_lifetime("never").unwrap(), None);
        assert_eq!(
            parse_lifetime("30d").unwrap(),
            Some(Duration::from_secs(30 * 86_400))
        );
        assert_eq!(
            parse_lifetime("90m").unwrap(),
            Some(Duration::from_secs(5400))
        );
        assert_eq!(
            parse_lifetime("2w").unwrap(),
            Some(Duration::from_secs(14 * 86_400))
        );
        for bad in [
            "",
            "d",
            "30",
            "30x",
            "-1d",
            "0d",
            "1.5h",
            "99999999999999999999d",
            "4000d",
            "30 d",
        ] {
            assert!(parse_lifetime(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn outputs_from_a_real_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = TokenStore::open(&dir.path().join("ledger.db")).unwrap();
        let now = 1_787_400_000_000;
        let new = store
            .create(
                "alice",
                TokenKind::Client,
                Some(Duration::from_secs(86_400)),
                now,
            )
            .unwrap();
        let created = format_created(&new);
        assert_eq!(created.lines().last().unwrap(), new.secret);
        assert!(created.contains("principal alice"));

        let listed = format_list(&store.list().unwrap(), now);
        assert!(listed.contains("alice"));
        assert!(listed.contains("active"));
        assert!(!listed.contains(&new.secret));

        let outcome = store.revoke(new.info.id, now + 1).unwrap();
        let (text, code) = format_revoked(new.info.id, &outcome);
        assert_eq!(code, 0);
        assert!(text.contains("revoked token"));
        let (text, code) = format_revoked(77, &store.revoke(77, now).unwrap());
        assert_eq!(code, 1);
        assert!(text.contains("77"));
        assert!(format_list(&store.list().unwrap(), now).contains("revoked"));
        assert!(format_list(&[], now).contains("no tokens"));
    }

    #[test]
    fn ids() {
        assert_eq!(parse_token_id("3").unwrap(), 3);
        assert!(parse_token_id("0").is_err());
        assert!(parse_token_id("x").is_err());
    }
}
