//! The master key that seals the `requestState`s toolwall issues (see
//! `core/request_state.rs`): 32 random bytes in `request-state.key` in the state directory,
//! created on first start with mode 0600 (never readable by anyone but toolwall's user).
//! Copy the file to a second replica and it accepts the states this one issued. A file
//! that is not exactly 32 bytes, or that others may read, is refused with an error naming
//! it: states sealed under a key others know would be forgeable.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::gateway::core::{MASTER_KEY_BYTES, StateKey};

pub const KEY_FILE: &str = "request-state.key";

pub fn key_path(state_dir: &Path) -> PathBuf {
    state_dir.join(KEY_FILE)
}

/// Read the key file, creating it (0600, random) when it does not exist.
pub fn load_or_create(state_dir: &Path) -> Result<StateKey, String> {
    let path = key_path(state_dir);
    let shown = path.display();
    let mut master = [0u8; MASTER_KEY_BYTES];
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
    {
        Ok(mut file) => {
            crate::tokens::random::fill_random(&mut master)
                .map_err(|e| format!("{shown}: no random bytes for a new key: {e}"))?;
            file.write_all(&master)
                .and_then(|()| file.sync_all())
                .map_err(|e| {
                    let _ = std::fs::remove_file(&path);
                    format!("{shown}: writing a new key: {e}")
                })?;
            return Ok(StateKey::from_master(&master));
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("{shown}: creating the key: {e}")),
    }
    let mut file = std::fs::File::open(&path).map_err(|e| format!("{shown}: {e}"))?;
    let meta = file.metadata().map_err(|e| format!("{shown}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("{shown}: not a regular file"));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "{shown}: group or others may access it (mode {:o}); chmod 600 it",
            meta.permissions().mode() & 0o777
        ));
    }
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    if meta.uid() != euid {
        return Err(format!(
            "{shown}: owned by uid {}, not by this process's uid {euid}",
            meta.uid()
        ));
    }
    if meta.len() != MASTER_KEY_BYTES as u64 {
        return Err(format!(
            "{shown}: {} bytes, not the {MASTER_KEY_BYTES} a key has",
            meta.len()
        ));
    }
    file.read_exact(&mut master)
        .map_err(|e| format!("{shown}: {e}"))?;
    Ok(StateKey::from_master(&master))
}

/// A fresh name for this gateway instance (random hex): part of every nonce it issues.
pub fn instance_name() -> String {
    let bytes: [u8; 8] = crate::tokens::random::random_bytes().unwrap_or_default();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_private_then_read_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create(dir.path()).unwrap();
        let path = key_path(dir.path());
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let again = load_or_create(dir.path()).unwrap();
        let claims = crate::gateway::core::test_claims();
        assert_eq!(again.open(&first.seal(&claims)).unwrap(), claims);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = load_or_create(dir.path()).unwrap_err();
        assert!(e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, b"short").unwrap();
        let e = load_or_create(dir.path()).unwrap_err();
        assert!(e.contains("32"), "{e}");
    }
}
