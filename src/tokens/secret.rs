//! The token secret: how it is made, what a well-formed one looks like, and the hash that
//! is all the database keeps.
//!
//! A secret is `twt_` followed by 32 random bytes in unpadded base64url (43 characters).
//! The prefix lets secret scanners and operators recognise a leaked toolwall token.
//!
//! Why SHA-256 and not a slow password hash: the secret carries 256 bits from the kernel's
//! CSPRNG, so there is nothing to guess faster with a fast hash; slow KDFs protect
//! low-entropy passwords. A slow hash would only make every HTTP request cost milliseconds
//! and hand an unauthenticated client a CPU lever.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest as _, Sha256};
use std::io;

use super::random::random_bytes;

/// What every toolwall token starts with.
pub const TOKEN_PREFIX: &str = "twt_";
/// Random bytes in a token.
pub const TOKEN_SECRET_BYTES: usize = 32;
/// Base64url characters encoding [`TOKEN_SECRET_BYTES`] without padding.
const TOKEN_BODY_CHARS: usize = (TOKEN_SECRET_BYTES * 4).div_ceil(3);
/// Length of a whole token.
pub const TOKEN_LEN: usize = TOKEN_PREFIX.len() + TOKEN_BODY_CHARS;
/// Lowercase hex of a SHA-256 digest.
pub const HASH_HEX_LEN: usize = 64;

/// A fresh token secret.
pub fn generate() -> io::Result<String> {
    let bytes: [u8; TOKEN_SECRET_BYTES] = random_bytes()?;
    let mut token = String::with_capacity(TOKEN_LEN);
    token.push_str(TOKEN_PREFIX);
    URL_SAFE_NO_PAD.encode_string(bytes, &mut token);
    Ok(token)
}

/// Whether `presented` has the shape of a token (checked before any database work).
pub fn well_formed(presented: &str) -> bool {
    presented.len() == TOKEN_LEN
        && presented.starts_with(TOKEN_PREFIX)
        && presented[TOKEN_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Lowercase hex SHA-256 of the token text: the lookup key stored in the database.
pub fn hash_hex(token: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(token.as_bytes());
    let mut out = String::with_capacity(HASH_HEX_LEN);
    for byte in digest.iter() {
        out.push(HEX[usize::from(byte >> 4)] as char);
        out.push(HEX[usize::from(byte & 0x0f)] as char);
    }
    out
}

/// Equality whose time depends only on the lengths, not on where the inputs differ.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // black_box keeps the optimiser from turning the fold into an early exit.
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tokens_are_well_formed_and_distinct() {
        let a = generate().unwrap();
        let b = generate().unwrap();
        assert_eq!(a.len(), TOKEN_LEN);
        assert!(well_formed(&a), "{}", a.len());
        assert!(well_formed(&b));
        assert_ne!(a, b);
        assert_ne!(hash_hex(&a), hash_hex(&b));
        assert_eq!(hash_hex(&a).len(), HASH_HEX_LEN);
    }

    #[test]
    fn malformed_shapes() {
        let good = generate().unwrap();
        assert!(!well_formed(""));
        assert!(!well_formed(&good[1..]));
        assert!(!well_formed(&format!("{good}x")));
        assert!(!well_formed(&good.replacen("twt_", "twx_", 1)));
        let mut bad = good.clone().into_bytes();
        bad[10] = b'+';
        assert!(!well_formed(std::str::from_utf8(&bad).unwrap()));
        // Multi-byte characters never panic on the slice.
        let wide = format!("twt_{}a", "é".repeat(21));
        assert_eq!(wide.len(), TOKEN_LEN);
        assert!(!well_formed(&wide));
    }

    #[test]
    fn hash_is_sha256_hex() {
        assert_eq!(
            hash_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn constant_time_equality() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
        assert!(ct_eq(b"", b""));
    }
}
