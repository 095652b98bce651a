//! Workspace ids: `wrk_` + 12 hex digits, derived from the name and the canonical root, so
//! the same workspace keeps its id across restarts and reloads, and renaming it or moving
//! its root makes it a different workspace.

use sha2::{Digest, Sha256};
use std::path::Path;

/// What every workspace id starts with.
pub const ID_PREFIX: &str = "wrk_";
/// Hex digits after the prefix.
pub const ID_HEX_DIGITS: usize = 12;

/// The id of the workspace `name` rooted at `canonical_root`.
pub fn workspace_id(name: &str, canonical_root: &Path) -> String {
    let mut hash = Sha256::new();
    hash.update(b"toolwall workspace\0");
    hash.update(name.as_bytes());
    hash.update([0u8]);
    hash.update(canonical_root.as_os_str().as_encoded_bytes());
    let digest = hash.finalize();
    let mut id = String::with_capacity(ID_PREFIX.len() + ID_HEX_DIGITS);
    id.push_str(ID_PREFIX);
    for byte in digest.iter().take(ID_HEX_DIGITS / 2) {
        id.push_str(&format!("{byte:02x}"));
    }
    id
}

/// Whether `text` has the shape of a workspace id.
pub fn looks_like_id(text: &str) -> bool {
    text.strip_prefix(ID_PREFIX).is_some_and(|hex| {
        hex.len() == ID_HEX_DIGITS && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_shaped_and_depend_on_name_and_root() {
        let a = workspace_id("proj", Path::new("/srv/proj"));
        assert_eq!(a, workspace_id("proj", Path::new("/srv/proj")));
        assert!(looks_like_id(&a), "{a}");
        assert_ne!(a, workspace_id("proj2", Path::new("/srv/proj")));
        assert_ne!(a, workspace_id("proj", Path::new("/srv/other")));
        // The separator keeps ("ab", "/c") and ("a", "b/c")-like pairs apart.
        assert_ne!(
            workspace_id("a", Path::new("b/c")),
            workspace_id("ab", Path::new("/c"))
        );
        for not_id in [
            "wrk_",
            "wrk_0123456789aB",
            "wrk_0123456789abc",
            "proj",
            "tsk_0123456789ab",
        ] {
            assert!(!looks_like_id(not_id), "{not_id}");
        }
    }
}
