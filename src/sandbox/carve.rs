//! Hidden paths carved out of read grants. Landlock can only add rights, never take part of
//! a granted tree back, so a granted directory that holds a hidden path (say `/etc` holding
//! `/etc/toolwall/toolwall.toml`) is granted entry by entry instead, down to the hidden
//! path's siblings, and the hidden path itself is left out.

use std::io;
use std::path::{Path, PathBuf};

/// Most rules a carve-out may produce; beyond it the grant is refused (fail closed) rather
/// than turned into a ruleset the kernel may refuse or that takes long to build.
pub const MAX_CARVED_RULES: usize = 4096;

/// Returns `grants` with every path in `hidden` carved out, as absolute, canonical paths.
///
/// - A grant that is (or lies under) a hidden path is dropped.
/// - A grant that holds a hidden path is replaced by its entries, recursively along the way
///   to the hidden path. Symbolic links among those entries are not granted: the kernel
///   checks the path a link resolves to, which is granted (or not) on its own.
/// - A grant that does not exist is kept as is (the ruleset skips it and notes it).
/// - A hidden path that does not exist yet is hidden where it would be created.
///
/// Every decision worth knowing goes to `notes`.
pub fn carve_hidden(
    grants: &[PathBuf],
    hidden: &[PathBuf],
    notes: &mut Vec<String>,
) -> Result<Vec<PathBuf>, String> {
    let hidden: Vec<PathBuf> = hidden.iter().filter_map(|h| resolve_hidden(h)).collect();
    let mut out = Vec::new();
    for grant in grants {
        let Ok(canonical) = std::fs::canonicalize(grant) else {
            out.push(grant.clone());
            continue;
        };
        if let Some(h) = hidden.iter().find(|h| canonical.starts_with(h)) {
            notes.push(format!(
                "{} is hidden ({}); not granted",
                grant.display(),
                h.display()
            ));
            continue;
        }
        if hidden.iter().any(|h| h.starts_with(&canonical)) {
            let before = out.len();
            expand(&canonical, &hidden, &mut out)
                .map_err(|e| format!("carving hidden paths out of {}: {e}", grant.display()))?;
            notes.push(format!(
                "{} holds a hidden path: granted as {} entries",
                grant.display(),
                out.len() - before
            ));
        } else {
            out.push(canonical);
        }
        if out.len() > MAX_CARVED_RULES {
            return Err(format!(
                "carving hidden paths out of {} needs more than {MAX_CARVED_RULES} rules",
                grant.display()
            ));
        }
    }
    Ok(out)
}

/// The canonical form of a hidden path; for one that does not exist, its nearest existing
/// ancestor made canonical plus the rest. None for a relative or unresolvable path.
fn resolve_hidden(path: &Path) -> Option<PathBuf> {
    if !path.is_absolute() {
        return None;
    }
    let mut existing = path.to_path_buf();
    let mut rest = Vec::new();
    loop {
        match std::fs::canonicalize(&existing) {
            Ok(c) => {
                let mut full = c;
                for part in rest.iter().rev() {
                    full.push(part);
                }
                return Some(full);
            }
            Err(_) => {
                let name = existing.file_name()?.to_owned();
                rest.push(name);
                existing = existing.parent()?.to_path_buf();
            }
        }
    }
}

fn expand(dir: &Path, hidden: &[PathBuf], out: &mut Vec<PathBuf>) -> io::Result<()> {
    let mut entries: Vec<PathBuf> = Vec::new();
    let listing = match std::fs::read_dir(dir) {
        Ok(l) => l,
        // A directory this process may not list (an agent user's view of a root-only
        // directory) cannot be read by it either: left out, which Landlock then refuses too.
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in listing {
        let entry = entry?;
        if entry.file_type()?.is_symlink() {
            continue;
        }
        entries.push(entry.path());
        if out.len() + entries.len() > MAX_CARVED_RULES {
            return Err(io::Error::other(format!(
                "more than {MAX_CARVED_RULES} entries"
            )));
        }
    }
    entries.sort();
    for path in entries {
        if hidden.iter().any(|h| path.starts_with(h)) {
            continue;
        }
        if hidden.iter().any(|h| h.starts_with(&path)) {
            expand(&path, hidden, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        for d in ["etc/toolwall", "etc/ssl/certs", "usr/bin"] {
            std::fs::create_dir_all(root.join(d)).expect("mkdir");
        }
        for f in [
            "etc/hosts",
            "etc/toolwall/toolwall.toml",
            "etc/ssl/certs/ca.pem",
        ] {
            std::fs::write(root.join(f), b"x").expect("write");
        }
        std::os::unix::fs::symlink(root.join("etc/toolwall"), root.join("etc/alias"))
            .expect("symlink");
        dir
    }

    #[test]
    fn a_grant_holding_a_hidden_path_is_granted_entry_by_entry_without_it() {
        let dir = tree();
        let root = std::fs::canonicalize(dir.path()).expect("canonical");
        let mut notes = Vec::new();
        let out = carve_hidden(
            &[root.join("etc"), root.join("usr")],
            &[root.join("etc/toolwall/toolwall.toml")],
            &mut notes,
        )
        .expect("carve");
        // /etc/toolwall is expanded too: only its hidden entry is left out. The link is
        // never granted (the kernel checks what it resolves to).
        assert_eq!(
            out,
            vec![
                root.join("etc/hosts"),
                root.join("etc/ssl"),
                root.join("usr")
            ]
        );
        assert_eq!(notes.len(), 1, "{notes:?}");
    }

    #[test]
    fn a_hidden_directory_and_a_grant_under_it_are_left_out() {
        let dir = tree();
        let root = std::fs::canonicalize(dir.path()).expect("canonical");
        let mut notes = Vec::new();
        let out = carve_hidden(
            &[root.join("etc"), root.join("etc/toolwall")],
            &[root.join("etc/toolwall")],
            &mut notes,
        )
        .expect("carve");
        assert_eq!(out, vec![root.join("etc/hosts"), root.join("etc/ssl")]);
        assert!(notes.iter().any(|n| n.contains("is hidden")), "{notes:?}");
    }

    #[test]
    fn a_hidden_path_not_created_yet_is_hidden_where_it_would_be() {
        let dir = tree();
        let root = std::fs::canonicalize(dir.path()).expect("canonical");
        let mut notes = Vec::new();
        let out = carve_hidden(
            &[root.join("etc")],
            &[root.join("etc/ssl/later/ledger.db")],
            &mut notes,
        )
        .expect("carve");
        assert_eq!(
            out,
            vec![
                root.join("etc/hosts"),
                root.join("etc/ssl/certs"),
                root.join("etc/toolwall")
            ]
        );
    }

    #[test]
    fn grants_without_hidden_paths_stay_whole_and_missing_ones_pass_through() {
        let dir = tree();
        let root = std::fs::canonicalize(dir.path()).expect("canonical");
        let missing = root.join("nope");
        let mut notes = Vec::new();
        let out = carve_hidden(
            &[root.join("usr"), missing.clone()],
            &[root.join("etc/toolwall")],
            &mut notes,
        )
        .expect("carve");
        assert_eq!(out, vec![root.join("usr"), missing]);
        assert!(notes.is_empty());
    }
}
