//! The `requestState` toolwall itself issues to a 2026-07-28 client (a relayed server
//! request, or an `ask` answered at the client), sans-IO: the key is given.
//!
//! A state is sealed, never merely signed: the client can neither read nor forge it. The
//! claims (JSON) are encrypted with ChaCha20-Poly1305 under a nonce derived from them by
//! HMAC-SHA-256 (a synthetic IV, so no nonce is ever reused for two different claims, with
//! no randomness and no counter that a restart would reset), and the IV is checked again
//! after decryption. Both keys are derived from one 32-byte master key kept in the state
//! directory (`request-state.key`, mode 0600), so another replica holding the same file
//! accepts the state. The claims bind the state to its principal, tool, argument hash,
//! policy generation and expiry; single use is the caller's part (a round number or a
//! nonce it remembers).

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::aead::{self, Aad, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};
use ring::hmac;
use serde::{Deserialize, Serialize};

/// Bytes of the master key file.
pub const MASTER_KEY_BYTES: usize = 32;
/// Longest state accepted from a client (a sealed state is a few hundred bytes).
pub const MAX_STATE_BYTES: usize = 4096;
const PREFIX: &str = "tw1.";
const AAD: &[u8] = b"toolwall requestState v1";
const IV_BYTES: usize = 12;

/// The keys a state is sealed with.
pub struct StateKey {
    enc: LessSafeKey,
    iv: hmac::Key,
}

impl std::fmt::Debug for StateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateKey(<redacted>)")
    }
}

impl StateKey {
    pub fn from_master(master: &[u8; MASTER_KEY_BYTES]) -> StateKey {
        let root = hmac::Key::new(hmac::HMAC_SHA256, master);
        let derive = |label: &[u8]| hmac::sign(&root, label);
        let enc = derive(b"toolwall requestState encryption");
        let iv = derive(b"toolwall requestState iv");
        // A 32-byte key is what ChaCha20-Poly1305 takes; the HMAC tag is 32 bytes.
        let unbound = UnboundKey::new(&CHACHA20_POLY1305, enc.as_ref())
            .unwrap_or_else(|_| unreachable!("a 32-byte ChaCha20-Poly1305 key"));
        StateKey {
            enc: LessSafeKey::new(unbound),
            iv: hmac::Key::new(hmac::HMAC_SHA256, iv.as_ref()),
        }
    }

    fn iv_of(&self, plain: &[u8]) -> [u8; IV_BYTES] {
        let tag = hmac::sign(&self.iv, plain);
        let mut iv = [0u8; IV_BYTES];
        iv.copy_from_slice(&tag.as_ref()[..IV_BYTES]);
        iv
    }

    /// The sealed text of `claims`.
    pub fn seal(&self, claims: &Claims) -> String {
        let mut buf = serde_json::to_vec(claims).unwrap_or_default();
        let iv = self.iv_of(&buf);
        let sealed = self.enc.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(iv),
            Aad::from(AAD),
            &mut buf,
        );
        if sealed.is_err() {
            // Only for inputs beyond ~256 GiB; claims are tiny.
            return String::new();
        }
        let mut out = Vec::with_capacity(IV_BYTES + buf.len());
        out.extend_from_slice(&iv);
        out.extend_from_slice(&buf);
        format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(out))
    }

    /// The claims of a state this key sealed; an error for anything else.
    pub fn open(&self, text: &str) -> Result<Claims, StateError> {
        if text.len() > MAX_STATE_BYTES {
            return Err(StateError::Malformed);
        }
        let body = text.strip_prefix(PREFIX).ok_or(StateError::Malformed)?;
        let mut raw = URL_SAFE_NO_PAD
            .decode(body)
            .map_err(|_| StateError::Malformed)?;
        if raw.len() < IV_BYTES + aead::CHACHA20_POLY1305.tag_len() {
            return Err(StateError::Malformed);
        }
        let mut iv = [0u8; IV_BYTES];
        iv.copy_from_slice(&raw[..IV_BYTES]);
        let sealed = &mut raw[IV_BYTES..];
        let plain = self
            .enc
            .open_in_place(Nonce::assume_unique_for_key(iv), Aad::from(AAD), sealed)
            .map_err(|_| StateError::Forged)?;
        if self.iv_of(plain) != iv {
            return Err(StateError::Forged);
        }
        serde_json::from_slice(plain).map_err(|_| StateError::Forged)
    }
}

/// What a state says, once opened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// `input` (a relayed server request) or `ask` (an approval at the client).
    pub kind: String,
    pub principal: String,
    /// `server__tool` (or the prompt or URI) the state is for.
    pub tool: String,
    /// SHA-256 (hex) of the arguments as judged.
    pub args: String,
    /// The policy the state was issued under (`Policy::fingerprint`), and the rule that
    /// asked (an approval).
    pub policy: String,
    #[serde(default)]
    pub rule: String,
    /// Wall-clock expiry, ms since the epoch.
    pub expires_ms: i64,
    /// `input`: the call waiting for the input, and which round of it.
    pub call: u64,
    pub round: u64,
    /// Unique per issued state (instance and counter): single use is checked on it.
    pub nonce: String,
}

/// Why a state was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateError {
    /// Not a state toolwall could have issued (shape, encoding, size).
    Malformed,
    /// Tampered with, or sealed under another key.
    Forged,
}

impl std::fmt::Display for StateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StateError::Malformed => "the requestState is not one toolwall issued",
            StateError::Forged => "the requestState failed its integrity check",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims() -> Claims {
        Claims {
            kind: "ask".into(),
            principal: "alice".into(),
            tool: "local__echo".into(),
            args: "ab".repeat(32),
            policy: "p1".into(),
            rule: "r".into(),
            expires_ms: 1_700_000_000_000,
            call: 0,
            round: 0,
            nonce: "i1-1".into(),
        }
    }

    #[test]
    fn round_trip_and_unreadable() {
        let key = StateKey::from_master(&[7; MASTER_KEY_BYTES]);
        let sealed = key.seal(&claims());
        assert!(sealed.starts_with(PREFIX));
        assert!(!sealed.contains("alice") && !sealed.contains("echo"));
        let raw = URL_SAFE_NO_PAD.decode(&sealed[PREFIX.len()..]).unwrap();
        assert!(
            !raw.windows(5).any(|w| w == b"alice"),
            "the claims are encrypted"
        );
        assert_eq!(key.open(&sealed).unwrap(), claims());
        // Deterministic for the same claims, different for others.
        assert_eq!(key.seal(&claims()), sealed);
        let mut other = claims();
        other.nonce = "i1-2".into();
        assert_ne!(key.seal(&other), sealed);
    }

    #[test]
    fn tampering_and_other_keys_are_refused() {
        let key = StateKey::from_master(&[7; MASTER_KEY_BYTES]);
        let sealed = key.seal(&claims());
        // Every single-character change of the encoded body is refused.
        let body: Vec<char> = sealed.chars().collect();
        for i in PREFIX.len()..body.len() {
            let mut t = body.clone();
            t[i] = if t[i] == 'A' { 'B' } else { 'A' };
            let t: String = t.into_iter().collect();
            assert!(key.open(&t).is_err(), "changed at {i}");
        }
        let other = StateKey::from_master(&[8; MASTER_KEY_BYTES]);
        assert_eq!(other.open(&sealed).unwrap_err(), StateError::Forged);
        for junk in ["", "tw1.", "tw1.!!!", "x", &"tw1.A".repeat(2000)] {
            assert!(key.open(junk).is_err(), "{junk}");
        }
        // A replica with the same master key opens it.
        let replica = StateKey::from_master(&[7; MASTER_KEY_BYTES]);
        assert_eq!(replica.open(&sealed).unwrap(), claims());
    }
}
