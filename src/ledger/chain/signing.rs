//! Signed checkpoints: the ledger's Ed25519 key (kept in the state directory, 0600) signs
//! the chain's head every `checkpoint_groups` groups or `checkpoint_secs`, and the signed
//! head is stored in `ledger_checkpoints` and handed to `anchor_command`. An older copy
//! of the database, or one with its last groups cut off, still holds a valid chain; a head
//! shipped off the machine shows it (`toolwall ledger verify --anchor FILE`).
//!
//! What is signed: `"toolwall ledger head v1\0" ‖ seq (i64 BE) ‖ signed_at_ms (i64 BE) ‖
//! the group's hash (32 bytes)`. A signed head travels as one JSON line:
//! `{"ledger_head":1,"seq":N,"signed_at_ms":T,"hash":"<hex>","public_key":"<hex>",
//! "signature":"<hex>"}`.

use ring::rand::SystemRandom;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair as _, UnparsedPublicKey};
use std::fs::{DirBuilder, OpenOptions};
use std::io::{Read as _, Write as _};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use super::canonical::{self, Digest};

/// Prefix of every signed message.
pub const HEAD_DOMAIN: &[u8] = b"toolwall ledger head v1\0";

/// Length of an Ed25519 public key and of a signature.
pub const PUBLIC_KEY_LEN: usize = 32;
pub const SIGNATURE_LEN: usize = 64;

/// Largest key file read (a PKCS#8 Ed25519 key is 83–85 bytes).
const MAX_KEY_FILE: u64 = 4096;

/// The ledger's signing key.
pub struct SigningKey {
    pair: Ed25519KeyPair,
}

/// A chain head with its signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedHead {
    pub seq: i64,
    pub signed_at_ms: i64,
    pub hash: Digest,
    pub public_key: [u8; PUBLIC_KEY_LEN],
    pub signature: [u8; SIGNATURE_LEN],
}

fn message(seq: i64, signed_at_ms: i64, hash: &Digest) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEAD_DOMAIN.len() + 48);
    out.extend_from_slice(HEAD_DOMAIN);
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(&signed_at_ms.to_be_bytes());
    out.extend_from_slice(hash);
    out
}

impl SigningKey {
    /// Reads the key at `path`, creating it (0600, its directory 0700) when missing.
    pub fn load_or_create(path: &Path) -> Result<SigningKey, String> {
        Self::open(path, true)
    }

    /// Reads the key at `path`; an error when it does not exist.
    pub fn load(path: &Path) -> Result<SigningKey, String> {
        Self::open(path, false)
    }

    fn open(path: &Path, create: bool) -> Result<SigningKey, String> {
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            format!("ledger signing key {}: {what}: {e}", path.display())
        };
        if create && !path.exists() {
            if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)
                    .map_err(|e| fail("creating its directory", &e))?;
            }
            let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new())
                .map_err(|_| fail("generating", &"no randomness"))?;
            // create_new: never overwrite a key that appeared meanwhile.
            match OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
            {
                Ok(mut file) => {
                    file.write_all(pkcs8.as_ref())
                        .and_then(|()| file.sync_all())
                        .map_err(|e| fail("writing", &e))?;
                    crate::info!("ledger signing key {} created", path.display());
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(fail("creating", &e)),
            }
        }
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| fail("opening", &e))?;
        let meta = file.metadata().map_err(|e| fail("stat", &e))?;
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(fail(
                "refusing a key readable or writable by group or others",
                &format!("mode {:o}; chmod 600 it", meta.permissions().mode() & 0o777),
            ));
        }
        if meta.len() > MAX_KEY_FILE {
            return Err(fail("not a key", &format!("{} bytes", meta.len())));
        }
        let mut der = Vec::new();
        file.take(MAX_KEY_FILE)
            .read_to_end(&mut der)
            .map_err(|e| fail("reading", &e))?;
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der)
            .map_err(|e| fail("not a PKCS#8 Ed25519 key", &e))?;
        Ok(SigningKey { pair })
    }

    pub fn public_key(&self) -> [u8; PUBLIC_KEY_LEN] {
        let mut out = [0u8; PUBLIC_KEY_LEN];
        out.copy_from_slice(self.pair.public_key().as_ref());
        out
    }

    pub fn sign(&self, seq: i64, signed_at_ms: i64, hash: &Digest) -> SignedHead {
        let signature = self.pair.sign(&message(seq, signed_at_ms, hash));
        let mut sig = [0u8; SIGNATURE_LEN];
        sig.copy_from_slice(signature.as_ref());
        SignedHead {
            seq,
            signed_at_ms,
            hash: *hash,
            public_key: self.public_key(),
            signature: sig,
        }
    }
}

/// `ed25519:<hex>`, as `toolwall ledger key` prints it and `--public-key` reads it.
pub fn format_public_key(key: &[u8; PUBLIC_KEY_LEN]) -> String {
    format!("ed25519:{}", hex(key))
}

/// A public key from `ed25519:<hex>` or bare hex (surrounding space and comments after
/// `#` ignored).
pub fn parse_public_key(text: &str) -> Result<[u8; PUBLIC_KEY_LEN], String> {
    let line = text
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .find(|l| !l.is_empty())
        .unwrap_or("");
    let hex_part = line.strip_prefix("ed25519:").unwrap_or(line);
    from_hex::<PUBLIC_KEY_LEN>(hex_part)
        .ok_or_else(|| "not an Ed25519 public key (expected ed25519:<64 hex digits>)".into())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let text = text.trim();
    if text.len() != 2 * N || !text.is_ascii() {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

impl SignedHead {
    /// Whether the signature is `key`'s over this head.
    pub fn verify_with(&self, key: &[u8; PUBLIC_KEY_LEN]) -> bool {
        UnparsedPublicKey::new(&ED25519, key)
            .verify(
                &message(self.seq, self.signed_at_ms, &self.hash),
                &self.signature,
            )
            .is_ok()
    }

    /// The JSON line shipped to `anchor_command` (without the newline).
    pub fn to_json(&self) -> String {
        serde_json::json!({
            "ledger_head": 1,
            "seq": self.seq,
            "signed_at_ms": self.signed_at_ms,
            "hash": canonical::hex(&self.hash),
            "public_key": hex(&self.public_key),
            "signature": hex(&self.signature),
        })
        .to_string()
    }

    pub fn from_json(line: &str) -> Result<SignedHead, String> {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("not a signed head: {e}"))?;
        if v["ledger_head"] != 1 {
            return Err("not a signed head (no \"ledger_head\": 1)".into());
        }
        let int = |k: &str| v[k].as_i64().ok_or(format!("signed head: bad {k}"));
        let bytes = |k: &str| v[k].as_str().ok_or(format!("signed head: bad {k}"));
        Ok(SignedHead {
            seq: int("seq")?,
            signed_at_ms: int("signed_at_ms")?,
            hash: from_hex(bytes("hash")?).ok_or("signed head: bad hash")?,
            public_key: from_hex(bytes("public_key")?).ok_or("signed head: bad public_key")?,
            signature: from_hex(bytes("signature")?).ok_or("signed head: bad signature")?,
        })
    }
}
