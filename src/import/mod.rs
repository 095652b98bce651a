//! `toolwall import FILE`: an agent client's MCP servers (Claude Code, Cursor, VS Code,
//! Codex) as `[servers.*]` tables, their secrets moved into 0600 files in toolwall's
//! state directory; `--write CONFIG` merges them into a toolwall config (refusing name
//! clashes, with a backup), `--rewrite-client` replaces them in the client's file with one
//! `toolwall` entry (with a backup, printing the diff).
//!
//! - [`clients`]: the client formats, read into one shape (sans-IO);
//! - [`emit`]: that shape into TOML and secret files (sans-IO);
//! - [`rewrite`]: the client's file with one `toolwall` entry instead (sans-IO), and the
//!   diff shown.

pub mod clients;
pub mod emit;
pub mod rewrite;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::config::Config;

/// Largest client file read.
pub const MAX_CLIENT_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// What `toolwall import` was asked.
pub struct ImportRequest<'a> {
    pub file: &'a Path,
    /// `--write CONFIG`.
    pub write: Option<&'a Path>,
    pub rewrite_client: bool,
    /// The config whose state directory holds the secrets (the `--write` target, else
    /// `--config`).
    pub config: &'a Config,
    /// Where the config lives, for the client's `toolwall` entry.
    pub config_path: Option<PathBuf>,
}

/// Runs the import; the TOML goes to stdout, notes to stderr. Returns the exit code.
pub fn run(req: &ImportRequest) -> Result<i32, String> {
    let text = crate::config::read_bounded(req.file, MAX_CLIENT_FILE_BYTES)
        .map_err(|e| format!("{}: {e}", req.file.display()))?;
    let name = req.file.display().to_string();
    let (kind, file) = clients::parse(&name, &text)?;
    let state = absolute(&req.config.state_dir());
    let secrets_dir = state.join("imported-secrets");
    let converted = emit::convert(&file.servers, &name, &secrets_dir);
    eprintln!(
        "toolwall import: {} server(s) from {}",
        converted.len(),
        kind.describe()
    );
    for n in &file.notes {
        eprintln!("note: {}", emit::comment_text(n));
    }
    for c in &converted {
        for n in &c.notes {
            eprintln!("note: {}", emit::comment_text(n));
        }
    }
    let mut toml = String::new();
    for c in &converted {
        toml.push_str(&c.toml);
        toml.push('\n');
    }
    print!("{toml}");
    // The merged config is checked before any secret file is written: a refused merge
    // leaves nothing behind.
    let merged = match req.write {
        Some(target) => Some((target, merged_config(target, &converted, &toml)?)),
        None => None,
    };
    let written = write_secrets(&converted, &secrets_dir, &state)?;
    if written > 0 {
        eprintln!(
            "wrote {written} secret file(s) (mode 0600) in {}",
            secrets_dir.display()
        );
    }
    if let Some((target, after)) = merged {
        if target.exists() {
            std::fs::copy(target, backup_name(target))
                .map_err(|e| format!("backing up {}: {e}", target.display()))?;
        }
        replace_file(target, after.as_bytes())?;
        eprintln!(
            "merged into {} (the previous version is {})",
            target.display(),
            backup_name(target).display()
        );
    }
    if req.rewrite_client {
        let imported: Vec<Vec<String>> = converted
            .iter()
            .filter(|c| !c.refused)
            .map(|c| c.path.clone())
            .collect();
        let config_path = req
            .write
            .map(Path::to_path_buf)
            .or_else(|| req.config_path.clone());
        let entry = rewrite::toolwall_entry(req.config, config_path.as_deref());
        let new = rewrite::rewrite(kind, &name, &text, &imported, &entry)?;
        let backup = backup_name(req.file);
        std::fs::copy(req.file, &backup)
            .map_err(|e| format!("backing up {}: {e}", req.file.display()))?;
        replace_file(req.file, new.as_bytes())?;
        println!(
            "# {} now reaches these servers through toolwall (the previous version is {}):",
            req.file.display(),
            backup.display()
        );
        let secrets: Vec<&str> = converted
            .iter()
            .flat_map(|c| c.secrets.iter().map(|(_, v)| v.as_str()))
            .collect();
        print!(
            "{}",
            rewrite::redact_secrets(&rewrite::diff(&text, &new), &secrets)
        );
    }
    Ok(if converted.iter().any(|c| c.refused) {
        1
    } else {
        0
    })
}

fn absolute(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            std::env::current_dir()
                .map(|d| d.join(p))
                .unwrap_or_else(|_| p.to_path_buf())
        }
    })
}

/// Writes each secret to its file: the directory 0700, each file 0600, both given to the
/// state directory's owner (toolwall's user reads them), replaced whole.
fn write_secrets(converted: &[emit::Converted], dir: &Path, state: &Path) -> Result<usize, String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
    let all: Vec<&(PathBuf, String)> = converted.iter().flat_map(|c| &c.secrets).collect();
    if all.is_empty() {
        return Ok(0);
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let owner = std::fs::metadata(state).ok().map(|m| (m.uid(), m.gid()));
    // SAFETY: getuid cannot fail.
    let root = unsafe { libc::getuid() } == 0;
    let give = |p: &Path| -> Result<(), String> {
        if let (true, Some((uid, gid))) = (root, owner) {
            std::os::unix::fs::chown(p, Some(uid), Some(gid))
                .map_err(|e| format!("{}: chown: {e}", p.display()))?;
        }
        Ok(())
    };
    give(dir)?;
    for (path, value) in &all {
        let tmp = path.with_extension("tmp");
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| format!("{}: {e}", tmp.display()))?;
        f.write_all(value.as_bytes())
            .and_then(|()| f.write_all(b"\n"))
            .map_err(|e| format!("{}: {e}", tmp.display()))?;
        give(&tmp)?;
        std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(all.len())
}

/// `FILE.toolwall-backup`.
fn backup_name(p: &Path) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(".toolwall-backup");
    PathBuf::from(s)
}

fn replace_file(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let tmp = path.with_extension("toolwall-tmp");
    std::fs::write(&tmp, bytes).map_err(|e| format!("{}: {e}", tmp.display()))?;
    if let Ok(meta) = std::fs::metadata(path) {
        let _ = std::fs::set_permissions(&tmp, meta.permissions());
    }
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Appends the tables to the toolwall config `target`: refused when a name is taken
/// there; the result must load, else the file is left as it was.
/// The servers a config's text defines.
fn server_names(text: &str, what: &Path) -> Result<BTreeSet<String>, String> {
    match toml::from_str::<toml::Table>(text) {
        Ok(t) => Ok(t
            .get("servers")
            .and_then(toml::Value::as_table)
            .map(|s| {
                s.iter()
                    .filter(|(_, v)| v.is_table())
                    .map(|(k, _)| k.clone())
                    .collect()
            })
            .unwrap_or_default()),
        Err(e) => Err(format!("{}: not TOML: {e}", what.display())),
    }
}

/// The target config with the imported tables appended, once it loads and defines exactly
/// the servers it had plus the imported ones (nothing a client file says can add more).
fn merged_config(
    target: &Path,
    converted: &[emit::Converted],
    toml: &str,
) -> Result<String, String> {
    let before = if target.exists() {
        crate::config::read_bounded(target, crate::config::MAX_CONFIG_BYTES)
            .map_err(|e| format!("{}: {e}", target.display()))?
    } else {
        String::new()
    };
    let existing = server_names(&before, target)?;
    let clashes: Vec<&str> = converted
        .iter()
        .filter(|c| !c.refused && existing.contains(&c.name))
        .map(|c| c.name.as_str())
        .collect();
    if !clashes.is_empty() {
        return Err(format!(
            "{} already has [servers.{}]: nothing was merged (rename them in the client's file, or remove them from the config)",
            target.display(),
            clashes.join("], [servers.")
        ));
    }
    let mut after = before.clone();
    if !after.is_empty() && !after.ends_with('\n') {
        after.push('\n');
    }
    after.push_str("\n# ---- imported by toolwall import ----\n");
    after.push_str(toml);
    crate::config::Config::from_toml(&after, &target.display().to_string())
        .map_err(|e| format!("the merged config would not load, nothing was merged: {e}"))?;
    let mut expected = existing;
    expected.extend(
        converted
            .iter()
            .filter(|c| !c.refused)
            .map(|c| c.name.clone()),
    );
    let defined = server_names(&after, target)?;
    if defined != expected {
        let extra: Vec<&String> = defined.difference(&expected).collect();
        return Err(format!(
            "the merged config would define servers nobody imported ({extra:?}): nothing was merged"
        ));
    }
    Ok(after)
}
