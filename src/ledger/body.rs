//! Bodies and texts as the ledger stores them: sha256 digests in hex, and cuts that never
//! split a UTF-8 character.

use sha2::{Digest as _, Sha256};

/// Length of a sha256 digest in bytes.
pub const DIGEST_LEN: usize = 32;
/// Length of a sha256 digest in lowercase hex.
pub const DIGEST_HEX_LEN: usize = 2 * DIGEST_LEN;

/// sha256 of the whole body (not of a capped copy), so equal bodies share one blob row.
pub fn sha256(body: &[u8]) -> [u8; DIGEST_LEN] {
    Sha256::digest(body).into()
}

/// Lowercase hex of a digest, on the stack.
pub fn hex(digest: &[u8; DIGEST_LEN]) -> [u8; DIGEST_HEX_LEN] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; DIGEST_HEX_LEN];
    for (i, byte) in digest.iter().enumerate() {
        out[2 * i] = HEX[usize::from(byte >> 4)];
        out[2 * i + 1] = HEX[usize::from(byte & 0x0f)];
    }
    out
}

/// The longest prefix of `text` of at most `max` bytes that ends on a char boundary.
pub fn cut_str(text: &str, max: usize) -> &str {
    &text[..text.floor_char_boundary(max)]
}

/// How a byte body's preview relates to the body itself.
#[derive(Debug, PartialEq, Eq)]
pub enum Preview {
    /// The preview is `body[..len]`: valid UTF-8, cut on a char boundary.
    Prefix(usize),
    /// The prefix holds invalid UTF-8 before the cut; the preview is this lossy text
    /// (U+FFFD for each bad sequence), itself cut to the limit.
    Lossy(String),
}

/// Preview of at most `max` bytes of `body`. Bodies are JSON text, so the usual answer is
/// a plain prefix that costs no copy.
pub fn preview(body: &[u8], max: usize) -> Preview {
    let prefix = &body[..body.len().min(max)];
    match std::str::from_utf8(prefix) {
        Ok(_) => Preview::Prefix(prefix.len()),
        // Only the last character was cut in half: stop before it.
        Err(e) if e.error_len().is_none() => Preview::Prefix(e.valid_up_to()),
        Err(_) => {
            let lossy = String::from_utf8_lossy(prefix);
            Preview::Lossy(cut_str(&lossy, max).to_owned())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_matches_known_digest() {
        let digest = sha256(b"abc");
        assert_eq!(
            std::str::from_utf8(&hex(&digest)).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn cut_str_never_splits_a_char() {
        let text = "aé€😀";
        for max in 0..=text.len() + 2 {
            let cut = cut_str(text, max);
            assert!(cut.len() <= max);
            assert!(text.starts_with(cut));
            // The next char would not have fitted.
            if let Some(next) = text[cut.len()..].chars().next() {
                assert!(cut.len() + next.len_utf8() > max);
            }
        }
    }

    #[test]
    fn preview_stops_before_a_cut_char() {
        let body = "€€".as_bytes(); // 3 bytes each
        assert_eq!(preview(body, 4), Preview::Prefix(3));
        assert_eq!(preview(body, 6), Preview::Prefix(6));
        assert_eq!(preview(body, 100), Preview::Prefix(6));
        assert_eq!(preview(body, 2), Preview::Prefix(0));
    }

    #[test]
    fn preview_of_invalid_utf8_is_lossy_and_bounded() {
        let body = b"ab\xffcd\xfe";
        match preview(body, 4) {
            Preview::Lossy(text) => {
                assert!(text.len() <= 4);
                assert!(text.starts_with("ab"));
            }
            other => panic!("expected lossy, got {other:?}"),
        }
    }
}
