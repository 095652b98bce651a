//! `file_list`, `file_read`, `file_write`, `file_edit`: every path checked by
//! [`WorkspaceRoot::check`], files opened beneath the root, writes made whole or not at all
//! (a temporary file renamed over the target).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use std::ffi::CString;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::UNIX_EPOCH;

use super::args::{EditArgs, Encoding, ListArgs, ReadArgs, WriteArgs};
use super::config::WorkspaceConfig;
use super::edit::apply_edits;
use super::error::{WsError, WsErrorCode};
use super::paths::{CheckedPath, WorkspaceRoot};

/// Numbers temporary files apart within this worker.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

fn kind_of(ft: &std::fs::FileType) -> &'static str {
    if ft.is_symlink() {
        "symlink"
    } else if ft.is_dir() {
        "directory"
    } else if ft.is_file() {
        "file"
    } else {
        "other"
    }
}

fn modified_ms(meta: &std::fs::Metadata) -> Option<u64> {
    meta.modified()
        .ok()?
        .duration_since(UNIX_EPOCH)
        .ok()
        .map(|d| d.as_millis() as u64)
}

/// `file_list`: the entries of a directory, links not followed, sorted by name.
pub fn list(
    root: &WorkspaceRoot,
    cfg: &WorkspaceConfig,
    args: &ListArgs,
) -> Result<Value, WsError> {
    let path = root.check(args.path.as_deref().unwrap_or("."))?;
    let shown = path.display();
    let meta = std::fs::metadata(&path.abs).map_err(|e| WsError::io(&shown, &e))?;
    if !meta.is_dir() {
        return Err(WsError::new(
            WsErrorCode::NotDirectory,
            format!("{shown} is not a directory (ws__file_read reads files)"),
        ));
    }
    let mut entries: Vec<Value> = Vec::new();
    let mut total = 0usize;
    for entry in std::fs::read_dir(&path.abs).map_err(|e| WsError::io(&shown, &e))? {
        let entry = entry.map_err(|e| WsError::io(&shown, &e))?;
        total += 1;
        if total > cfg.max_scan_entries {
            break;
        }
        let Ok(meta) = entry.metadata() else { continue };
        let name = entry.file_name().to_string_lossy().into_owned();
        let mut item = json!({
            "name": name,
            "type": kind_of(&meta.file_type()),
            "size": meta.len(),
            "mode": format!("{:o}", meta.mode() & 0o7777),
            "modified_ms": modified_ms(&meta),
        });
        if meta.file_type().is_symlink()
            && let Ok(target) = std::fs::read_link(entry.path())
        {
            item["target"] = json!(target.to_string_lossy());
        }
        entries.push(item);
    }
    entries.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    let truncated = entries.len() > cfg.max_list_entries || total > cfg.max_scan_entries;
    entries.truncate(cfg.max_list_entries);
    Ok(json!({
        "path": shown,
        "entries": entries,
        "truncated": truncated,
    }))
}

/// Whether bytes read as text: UTF-8 without NUL. An incomplete character at the very end
/// (a chunk boundary) is cut off and counted in the return value.
fn as_text(bytes: &[u8]) -> Option<(&str, usize)> {
    if bytes.contains(&0) {
        return None;
    }
    match std::str::from_utf8(bytes) {
        Ok(text) => Some((text, 0)),
        Err(e) if e.error_len().is_none() && bytes.len() - e.valid_up_to() < 4 => {
            let valid = e.valid_up_to();
            // Valid by construction.
            std::str::from_utf8(&bytes[..valid])
                .ok()
                .map(|t| (t, bytes.len() - valid))
        }
        Err(_) => None,
    }
}

/// Opens a file beneath the root for reading (`file_read`, `file_edit`). Only a regular
/// file: it is opened without blocking (a FIFO with no writer would hold a thread of the
/// file tools until one appears) and without becoming a controlling terminal, then
/// checked; a directory, FIFO, device or socket is refused, saying which it is.
fn open_to_read(
    root: &WorkspaceRoot,
    path: &CheckedPath,
    shown: &str,
) -> Result<(std::fs::File, std::fs::Metadata), WsError> {
    let fd = root
        .open_beneath(path, libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY, 0)
        .map_err(|e| WsError::io(shown, &e))?;
    let file = std::fs::File::from(fd);
    let meta = file.metadata().map_err(|e| WsError::io(shown, &e))?;
    require_regular(&meta, shown)?;
    Ok((file, meta))
}

/// What a file that is not regular is, for the refusal.
fn special_kind(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    }
}

/// Refuses anything but a regular file: a directory as `is_directory`, the rest as
/// `not_regular_file`.
pub fn require_regular(meta: &std::fs::Metadata, shown: &str) -> Result<(), WsError> {
    if meta.is_dir() {
        return Err(WsError::new(
            WsErrorCode::IsDirectory,
            format!("{shown} is a directory (ws__file_list lists it)"),
        ));
    }
    if !meta.is_file() {
        return Err(WsError::new(
            WsErrorCode::NotRegularFile,
            format!(
                "{shown} is {}: the file tools read and write regular files only (use ws__shell_run for anything else)",
                special_kind(meta)
            ),
        ));
    }
    Ok(())
}

/// `file_read`: `limit` bytes from `offset`, as text, or base64 when the bytes are not
/// UTF-8 text.
pub fn read(
    root: &WorkspaceRoot,
    cfg: &WorkspaceConfig,
    args: &ReadArgs,
) -> Result<Value, WsError> {
    let path = root.check(&args.path)?;
    let shown = path.display();
    let (file, meta) = open_to_read(root, &path, &shown)?;
    let size = meta.len();
    let offset = args.offset.unwrap_or(0);
    let limit = args
        .limit
        .unwrap_or(cfg.max_read_bytes as u64)
        .min(cfg.max_read_bytes as u64) as usize;
    let mut buf = vec![0u8; limit.min(size.saturating_sub(offset) as usize)];
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(WsError::io(&shown, &e)),
        }
    }
    buf.truncate(got);
    let (encoding, content, used) = match as_text(&buf) {
        Some((text, cut)) => ("utf-8", text.to_owned(), got - cut),
        None => ("base64", STANDARD.encode(&buf), got),
    };
    let next = offset + used as u64;
    Ok(json!({
        "path": shown,
        "size": size,
        "offset": offset,
        "bytes_read": used,
        "next_offset": next,
        "eof": next >= size,
        "encoding": encoding,
        "content": content,
    }))
}

/// Writes `bytes` to `path` whole or not at all: a temporary file beside it, renamed over
/// it. An existing file keeps its permissions. Returns whether the file is new.
fn write_whole(
    root: &WorkspaceRoot,
    path: &CheckedPath,
    bytes: &[u8],
    create_dirs: bool,
) -> Result<bool, WsError> {
    let shown = path.display();
    let Some(name) = path.rel.file_name() else {
        return Err(WsError::new(
            WsErrorCode::IsDirectory,
            "the workspace root is a directory",
        ));
    };
    let parent_rel = path.rel.parent().unwrap_or(Path::new(""));
    let parent_abs = root.path().join(parent_rel);
    match std::fs::metadata(&parent_abs) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(WsError::new(
                WsErrorCode::NotDirectory,
                format!("{}: a parent is not a directory", shown),
            ));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && create_dirs => {
            std::fs::create_dir_all(&parent_abs).map_err(|e| WsError::io(&shown, &e))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(WsError::new(
                WsErrorCode::NotFound,
                format!(
                    "{shown}: the parent directory does not exist (create_dirs: true creates it)"
                ),
            ));
        }
        Err(e) => return Err(WsError::io(&shown, &e)),
    }
    // Writing to a link inside the workspace writes its target.
    let existing = std::fs::metadata(&path.abs).ok();
    if let Some(meta) = &existing {
        require_regular(meta, &shown)?;
    }
    let target = match std::fs::symlink_metadata(&path.abs) {
        Ok(m) if m.file_type().is_symlink() => {
            let real = std::fs::canonicalize(&path.abs).map_err(|e| WsError::io(&shown, &e))?;
            let rel = real
                .strip_prefix(root.path())
                .map_err(|_| {
                    WsError::new(
                        WsErrorCode::PathOutsideWorkspace,
                        format!("{shown} leads outside the workspace through a link"),
                    )
                })?
                .to_path_buf();
            CheckedPath { rel, abs: real }
        }
        _ => path.clone(),
    };
    let target_name = target.rel.file_name().unwrap_or(name);
    let temp_rel = target.rel.with_file_name(format!(
        ".{}.toolwall-{}-{}.tmp",
        target_name.to_string_lossy(),
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let temp = CheckedPath {
        abs: root.path().join(&temp_rel),
        rel: temp_rel,
    };
    let mode = existing
        .as_ref()
        .map_or(0o644, |m| m.permissions().mode() & 0o7777);
    let fd = root
        .open_beneath(&temp, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, mode)
        .map_err(|e| WsError::io(&shown, &e))?;
    let mut file = std::fs::File::from(fd);
    let written = file
        .write_all(bytes)
        .and_then(|()| file.set_permissions(std::fs::Permissions::from_mode(mode)));
    drop(file);
    let renamed = written.and_then(|()| rename_beneath(root, &temp.rel, &target.rel));
    if let Err(e) = renamed {
        let _ = std::fs::remove_file(&temp.abs);
        return Err(WsError::io(&shown, &e));
    }
    Ok(existing.is_none())
}

/// `renameat` with both paths relative to the root's handle.
fn rename_beneath(root: &WorkspaceRoot, from: &Path, to: &Path) -> std::io::Result<()> {
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
    };
    let (from, to) = (c(from)?, c(to)?);
    let dir = root.dir_fd();
    // SAFETY: valid dirfd and C strings.
    let rc = unsafe { libc::renameat(dir, from.as_ptr(), dir, to.as_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `file_write`.
pub fn write(
    root: &WorkspaceRoot,
    cfg: &WorkspaceConfig,
    args: &WriteArgs,
) -> Result<Value, WsError> {
    let path = root.check(&args.path)?;
    let bytes = match args.encoding {
        Encoding::Utf8 => args.content.as_bytes().to_vec(),
        Encoding::Base64 => STANDARD
            .decode(args.content.as_bytes())
            .map_err(|e| WsError::invalid(format!("file_write: content is not base64: {e}")))?,
    };
    if bytes.len() > cfg.max_write_bytes {
        return Err(WsError::new(
            WsErrorCode::TooLarge,
            format!(
                "file_write: {} bytes (max_write_bytes {})",
                bytes.len(),
                cfg.max_write_bytes
            ),
        ));
    }
    let created = write_whole(root, &path, &bytes, args.create_dirs)?;
    Ok(json!({
        "path": path.display(),
        "bytes_written": bytes.len(),
        "created": created,
    }))
}

/// `file_edit`.
pub fn edit(
    root: &WorkspaceRoot,
    cfg: &WorkspaceConfig,
    args: &EditArgs,
) -> Result<Value, WsError> {
    let path = root.check(&args.path)?;
    let shown = path.display();
    let (file, meta) = open_to_read(root, &path, &shown)?;
    if meta.len() > cfg.max_write_bytes as u64 {
        return Err(WsError::new(
            WsErrorCode::TooLarge,
            format!(
                "{shown}: {} bytes (max_write_bytes {})",
                meta.len(),
                cfg.max_write_bytes
            ),
        ));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(cfg.max_write_bytes as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| WsError::io(&shown, &e))?;
    let text = String::from_utf8(bytes).map_err(|_| {
        WsError::new(
            WsErrorCode::NotText,
            format!("{shown} is not UTF-8 text; ws__file_write replaces it whole"),
        )
    })?;
    let (edited, replacements) = apply_edits(&text, &args.operations, cfg.max_write_bytes)?;
    write_whole(root, &path, edited.as_bytes(), false)?;
    Ok(json!({
        "path": shown,
        "operations": args.operations.len(),
        "replacements": replacements,
        "bytes_before": text.len(),
        "bytes_after": edited.len(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace::args::EditOperation;

    fn setup() -> (tempfile::TempDir, WorkspaceRoot, WorkspaceConfig) {
        let dir = tempfile::tempdir().expect("tempdir");
        let canonical = std::fs::canonicalize(dir.path()).expect("canonical");
        let ws = canonical.join("ws");
        std::fs::create_dir_all(ws.join("src")).expect("mkdir");
        std::fs::write(ws.join("src/main.rs"), "fn main() {}\n").expect("write");
        std::fs::write(ws.join("bin.dat"), [0u8, 159, 146, 150]).expect("write");
        std::fs::write(canonical.join("secret"), "s").expect("write");
        std::os::unix::fs::symlink(canonical.join("secret"), ws.join("leak")).expect("link");
        let root = WorkspaceRoot::open(&ws).expect("root");
        let cfg = WorkspaceConfig {
            max_read_bytes: 8,
            max_write_bytes: 64,
            max_list_entries: 2,
            ..WorkspaceConfig::default()
        };
        (dir, root, cfg)
    }

    #[test]
    fn read_text_binary_offsets_and_refusals() {
        let (_d, root, cfg) = setup();
        let r = |path: &str, offset: Option<u64>, limit: Option<u64>| {
            read(
                &root,
                &cfg,
                &ReadArgs {
                    worker: None,
                    path: path.into(),
                    offset,
                    limit,
                },
            )
        };
        let first = r("src/main.rs", None, None).expect("read");
        assert_eq!(first["content"], "fn main(");
        assert_eq!(first["encoding"], "utf-8");
        assert_eq!(first["eof"], false);
        let rest = r("src/main.rs", Some(8), Some(100)).expect("rest");
        assert_eq!(rest["content"], ") {}\n");
        assert_eq!(rest["eof"], true);
        let bin = r("bin.dat", None, None).expect("binary");
        assert_eq!(bin["encoding"], "base64");
        assert_eq!(bin["content"], STANDARD.encode([0u8, 159, 146, 150]));
        assert_eq!(
            r("src", None, None).expect_err("dir").code,
            WsErrorCode::IsDirectory
        );
        assert_eq!(
            r("nope", None, None).expect_err("missing").code,
            WsErrorCode::NotFound
        );
        for bad in ["leak", "../secret", "/etc/passwd"] {
            assert_eq!(
                r(bad, None, None).expect_err(bad).code,
                WsErrorCode::PathOutsideWorkspace
            );
        }
    }

    /// A FIFO without a writer used to hold a file-tool thread until one appeared.
    #[test]
    fn a_fifo_is_refused_at_once_by_read_edit_and_write() {
        let (_d, root, cfg) = setup();
        let fifo = root.path().join("pipe");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        let read_err = read(
            &root,
            &cfg,
            &ReadArgs {
                worker: None,
                path: "pipe".into(),
                offset: None,
                limit: None,
            },
        )
        .expect_err("a FIFO");
        assert_eq!(read_err.code, WsErrorCode::NotRegularFile);
        assert!(read_err.message.contains("FIFO"), "{read_err:?}");
        let write_err = write(
            &root,
            &cfg,
            &WriteArgs {
                worker: None,
                path: "pipe".into(),
                content: "x".into(),
                encoding: Encoding::Utf8,
                create_dirs: false,
            },
        )
        .expect_err("a FIFO");
        assert_eq!(write_err.code, WsErrorCode::NotRegularFile);
        // Still a FIFO: nothing replaced it.
        use std::os::unix::fs::FileTypeExt;
        assert!(
            std::fs::symlink_metadata(&fifo)
                .expect("stat")
                .file_type()
                .is_fifo()
        );
    }

    #[test]
    fn a_character_cut_by_the_limit_is_left_for_the_next_read() {
        let (_d, root, cfg) = setup();
        std::fs::write(root.path().join("u.txt"), "abcdefgé").expect("write"); // é at 7..9
        let first = read(
            &root,
            &cfg,
            &ReadArgs {
                worker: None,
                path: "u.txt".into(),
                offset: None,
                limit: None,
            },
        )
        .expect("read");
        assert_eq!(first["content"], "abcdefg");
        assert_eq!(first["next_offset"], 7);
        assert_eq!(first["encoding"], "utf-8");
    }

    #[test]
    fn write_creates_replaces_and_needs_create_dirs_for_new_parents() {
        let (_d, root, cfg) = setup();
        let w = |path: &str, content: &str, create_dirs: bool| {
            write(
                &root,
                &cfg,
                &WriteArgs {
                    worker: None,
                    path: path.into(),
                    content: content.into(),
                    encoding: Encoding::Utf8,
                    create_dirs,
                },
            )
        };
        assert_eq!(
            w("a/b/c.txt", "x", false).expect_err("no parent").code,
            WsErrorCode::NotFound
        );
        let made = w("a/b/c.txt", "hello", true).expect("create_dirs");
        assert_eq!(made["created"], true);
        assert_eq!(
            std::fs::read_to_string(root.path().join("a/b/c.txt")).expect("read"),
            "hello"
        );
        std::fs::set_permissions(
            root.path().join("a/b/c.txt"),
            std::fs::Permissions::from_mode(0o600),
        )
        .expect("chmod");
        let again = w("a/b/c.txt", "bye", false).expect("replace");
        assert_eq!(again["created"], false);
        let meta = std::fs::metadata(root.path().join("a/b/c.txt")).expect("meta");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "mode kept");
        assert_eq!(
            w("big", &"x".repeat(65), false).expect_err("big").code,
            WsErrorCode::TooLarge
        );
        assert_eq!(
            w("leak", "x", false).expect_err("link out").code,
            WsErrorCode::PathOutsideWorkspace
        );
        assert_eq!(
            w("src", "x", false).expect_err("dir").code,
            WsErrorCode::IsDirectory
        );
        // No temporary file is left anywhere.
        let leftovers: Vec<_> = std::fs::read_dir(root.path().join("a/b"))
            .expect("list")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp"))
            .collect();
        assert!(leftovers.is_empty());
    }

    #[test]
    fn edit_is_all_or_nothing() {
        let (_d, root, cfg) = setup();
        let e = |ops: Vec<EditOperation>| {
            edit(
                &root,
                &cfg,
                &EditArgs {
                    worker: None,
                    path: "src/main.rs".into(),
                    operations: ops,
                },
            )
        };
        let op = |old: &str, new: &str| EditOperation {
            old: old.into(),
            new: new.into(),
            count: None,
        };
        let err = e(vec![op("main", "start"), op("missing", "x")]).expect_err("mismatch");
        assert_eq!(err.code, WsErrorCode::EditMismatch);
        assert!(err.message.contains("operation 2 of 2"), "{err}");
        assert_eq!(
            std::fs::read_to_string(root.path().join("src/main.rs")).expect("read"),
            "fn main() {}\n",
            "nothing written"
        );
        let ok = e(vec![op("main", "start")]).expect("edit");
        assert_eq!(ok["replacements"], 1);
        assert_eq!(
            std::fs::read_to_string(root.path().join("src/main.rs")).expect("read"),
            "fn start() {}\n"
        );
        let bin = edit(
            &root,
            &cfg,
            &EditArgs {
                worker: None,
                path: "bin.dat".into(),
                operations: vec![op("a", "b")],
            },
        );
        assert_eq!(bin.expect_err("binary").code, WsErrorCode::NotText);
    }

    #[test]
    fn list_is_sorted_bounded_and_does_not_follow_links() {
        let (_d, root, cfg) = setup();
        let l = list(
            &root,
            &cfg,
            &ListArgs {
                worker: None,
                path: None,
            },
        )
        .expect("list");
        let names: Vec<&str> = l["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .filter_map(|e| e["name"].as_str())
            .collect();
        assert_eq!(names, vec!["bin.dat", "leak"]);
        assert_eq!(l["truncated"], true);
        assert_eq!(l["entries"][1]["type"], "symlink");
        let file = list(
            &root,
            &cfg,
            &ListArgs {
                worker: None,
                path: Some("bin.dat".into()),
            },
        );
        assert_eq!(file.expect_err("file").code, WsErrorCode::NotDirectory);
        let out = list(
            &root,
            &cfg,
            &ListArgs {
                worker: None,
                path: Some("leak".into()),
            },
        );
        assert_eq!(
            out.expect_err("out").code,
            WsErrorCode::PathOutsideWorkspace
        );
    }
}
