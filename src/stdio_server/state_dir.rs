//! A local server's private state directory, made safe again at every start of its host
//! and of its program. Servers that share an agent uid can chmod each other's directories
//! (Landlock does not cover chmod), and any local user can then plant files there
//! (`.local/lib/python3*/site-packages/usercustomize.py` runs at the next start with the
//! server's secret in its environment). So each start resets the directory to 0700,
//! takes group and other write off the servers' state directory when this user owns it, and refuses to start the
//! program while the directory holds, at its top level, an entry another uid owns.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// Entries of the state directory's top level looked at, at most, per start. Beyond, the
/// start is refused (a directory that large is the server's own doing).
pub const MAX_TOP_LEVEL_ENTRIES: usize = 100_000;

/// Make `dir` (which must exist, a directory owned by `uid`) private again; see the module
/// comment.
pub fn secure(dir: &Path, uid: u32) -> Result<(), String> {
    let meta = std::fs::symlink_metadata(dir)
        .map_err(|e| format!("state directory {}: {e}", dir.display()))?;
    if !meta.is_dir() || meta.uid() != uid {
        return Err(format!(
            "state directory {} is not a directory of uid {uid}",
            dir.display()
        ));
    }
    if meta.mode() & 0o7777 != 0o700 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("state directory {}: chmod 0700: {e}", dir.display()))?;
    }
    // The servers' state directory only: what lies above it is the operator's.
    if let Some(parent) = dir.parent()
        && let Ok(m) = std::fs::symlink_metadata(parent)
        && m.uid() == uid
        && m.is_dir()
    {
        let mode = m.mode() & 0o7777;
        if mode & 0o022 != 0 {
            std::fs::set_permissions(parent, std::fs::Permissions::from_mode(mode & !0o022))
                .map_err(|e| {
                    format!(
                        "{}: taking group and other write off: {e}",
                        parent.display()
                    )
                })?;
        }
    }
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("state directory {}: {e}", dir.display()))?;
    for (n, entry) in entries.enumerate() {
        if n >= MAX_TOP_LEVEL_ENTRIES {
            return Err(format!(
                "state directory {} holds more than {MAX_TOP_LEVEL_ENTRIES} entries at its top level; clean it up",
                dir.display()
            ));
        }
        let entry = entry.map_err(|e| format!("state directory {}: {e}", dir.display()))?;
        let Ok(m) = std::fs::symlink_metadata(entry.path()) else {
            continue;
        };
        if m.uid() != uid {
            return Err(format!(
                "state directory {} holds {:?}, owned by uid {} and not by the server's uid {uid}: someone else wrote there; remove it (and check how) before the server starts again",
                dir.display(),
                entry.file_name(),
                m.uid()
            ));
        }
    }
    Ok(())
}

/// [`secure`] for a program about to start with environment `env` (`NAME=value`): its
/// `HOME` is its state directory.
pub fn secure_home(env: &[String]) -> Result<(), String> {
    let Some(home) = env.iter().find_map(|v| v.strip_prefix("HOME=")) else {
        return Ok(());
    };
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    secure(Path::new(home), uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uid() -> u32 {
        // SAFETY: getuid cannot fail.
        unsafe { libc::getuid() }
    }

    /// The attack: another server of the same uid opened the directory (0777) and a
    /// parent this user owns; the next start closes both and goes on.
    #[test]
    fn an_opened_state_dir_and_parent_are_closed_again() {
        let root = tempfile::tempdir().unwrap();
        let parent = root.path().join("servers");
        let dir = parent.join("victim");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::write(dir.join("own"), "x").unwrap();
        secure(&dir, uid()).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o7777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&parent), 0o755);
        let env = vec![format!("HOME={}", dir.display()), "PATH=/bin".into()];
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o707)).unwrap();
        secure_home(&env).unwrap();
        assert_eq!(mode(&dir), 0o700);
    }

    /// A file planted by another uid at the top level stops the start, naming it.
    #[test]
    fn an_entry_of_another_uid_refuses_the_start() {
        if uid() != 0 {
            return; // chown to another uid needs root
        }
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("victim");
        std::fs::create_dir(&dir).unwrap();
        let planted = dir.join(".local");
        std::fs::create_dir(&planted).unwrap();
        std::os::unix::fs::lchown(&planted, Some(65534), Some(65534)).unwrap();
        let err = secure(&dir, 0).unwrap_err();
        assert!(err.contains(".local") && err.contains("65534"), "{err}");
        std::fs::remove_dir(&planted).unwrap();
        secure(&dir, 0).unwrap();
        // Not its own directory: refused.
        assert!(secure(&dir, 65534).is_err());
    }
}
