//! `file_find` (names by glob) and `file_search` (contents by text or regex): a walk under
//! a checked directory that never follows links, bounded in entries looked at, results
//! returned and time spent; the answer says which bound stopped it.

use globset::{GlobBuilder, GlobMatcher};
use regex::bytes::{Regex, RegexBuilder};
use serde_json::{Value, json};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::args::{FindArgs, SearchArgs};
use super::config::WorkspaceConfig;
use super::error::{WsError, WsErrorCode};
use super::paths::WorkspaceRoot;

/// Bytes looked at to decide that a file is binary (a NUL among them).
const BINARY_SNIFF_BYTES: usize = 8192;
/// Characters of a matching line returned.
const MAX_LINE_CHARS: usize = 500;
/// Compiled size limit of a search regex.
const REGEX_SIZE_LIMIT: usize = 1024 * 1024;
/// Longest pattern accepted.
const MAX_PATTERN_BYTES: usize = 4096;

/// A glob over names (no `/` in the pattern) or over paths relative to the search root.
pub struct NameGlob {
    matcher: GlobMatcher,
    on_path: bool,
}

impl NameGlob {
    pub fn new(pattern: &str) -> Result<NameGlob, WsError> {
        if pattern.is_empty() || pattern.len() > MAX_PATTERN_BYTES {
            return Err(WsError::invalid(format!(
                "a glob of 1 to {MAX_PATTERN_BYTES} bytes is needed"
            )));
        }
        let matcher = GlobBuilder::new(pattern)
            .literal_separator(true)
            .backslash_escape(true)
            .build()
            .map_err(|e| WsError::invalid(format!("glob {pattern:?}: {e}")))?
            .compile_matcher();
        Ok(NameGlob {
            matcher,
            on_path: pattern.contains('/'),
        })
    }

    /// `rel`: the path relative to the search root.
    pub fn is_match(&self, rel: &Path) -> bool {
        if self.on_path {
            self.matcher.is_match(rel)
        } else {
            rel.file_name().is_some_and(|n| self.matcher.is_match(n))
        }
    }
}

/// Why a walk stopped early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    MaxMatches,
    MaxScanEntries,
    TimeLimit,
}

impl Stop {
    fn as_str(self) -> &'static str {
        match self {
            Stop::MaxMatches => "max_matches",
            Stop::MaxScanEntries => "max_scan_entries",
            Stop::TimeLimit => "scan_time_limit_ms",
        }
    }
}

/// One entry met by the walk.
pub struct Entry<'a> {
    pub abs: &'a Path,
    /// Relative to the search root.
    pub rel: &'a Path,
    pub is_dir: bool,
    pub is_file: bool,
}

/// Walks `start` depth first in name order, links not followed. `visit` returns whether
/// the entry counted as a match; the walk stops at the bounds.
pub fn walk(
    start: &Path,
    max_entries: usize,
    max_matches: usize,
    deadline: Instant,
    mut visit: impl FnMut(&Entry) -> bool,
) -> (usize, usize, Option<Stop>) {
    let mut stack: Vec<(PathBuf, PathBuf)> = vec![(start.to_path_buf(), PathBuf::new())];
    let (mut scanned, mut matched) = (0usize, 0usize);
    while let Some((dir_abs, dir_rel)) = stack.pop() {
        let Ok(reader) = std::fs::read_dir(&dir_abs) else {
            continue;
        };
        let mut entries: Vec<(std::ffi::OsString, std::fs::FileType)> = Vec::new();
        for entry in reader.flatten() {
            if let Ok(ft) = entry.file_type() {
                entries.push((entry.file_name(), ft));
            }
            if entries.len() + scanned > max_entries {
                break;
            }
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut subdirs = Vec::new();
        for (name, ft) in entries {
            if scanned >= max_entries {
                return (scanned, matched, Some(Stop::MaxScanEntries));
            }
            if Instant::now() >= deadline {
                return (scanned, matched, Some(Stop::TimeLimit));
            }
            scanned += 1;
            let abs = dir_abs.join(&name);
            let rel = dir_rel.join(&name);
            let entry = Entry {
                abs: &abs,
                rel: &rel,
                is_dir: ft.is_dir(),
                is_file: ft.is_file(),
            };
            if visit(&entry) {
                matched += 1;
                if matched >= max_matches {
                    return (scanned, matched, Some(Stop::MaxMatches));
                }
            }
            if ft.is_dir() {
                subdirs.push((abs, rel));
            }
        }
        // Reverse so that the first subdirectory is walked first.
        stack.extend(subdirs.into_iter().rev());
    }
    (scanned, matched, None)
}

fn start_dir(root: &WorkspaceRoot, given: Option<&str>) -> Result<(PathBuf, PathBuf), WsError> {
    let start = root.check(given.unwrap_or("."))?;
    let shown = start.display();
    let meta = std::fs::metadata(&start.abs).map_err(|e| WsError::io(&shown, &e))?;
    if !meta.is_dir() {
        return Err(WsError::new(
            WsErrorCode::NotDirectory,
            format!("{shown} is not a directory"),
        ));
    }
    // Through a link inside the workspace: walk its target.
    let abs = std::fs::canonicalize(&start.abs).map_err(|e| WsError::io(&shown, &e))?;
    Ok((abs, start.rel))
}

fn deadline(cfg: &WorkspaceConfig) -> Instant {
    Instant::now() + Duration::from_millis(cfg.scan_time_limit_ms)
}

fn shown(prefix: &Path, rel: &Path) -> String {
    prefix.join(rel).to_string_lossy().into_owned()
}

/// `file_find`.
pub fn find(
    root: &WorkspaceRoot,
    cfg: &WorkspaceConfig,
    args: &FindArgs,
) -> Result<Value, WsError> {
    let glob = NameGlob::new(&args.pattern)?;
    let (start, prefix) = start_dir(root, args.root.as_deref())?;
    let mut matches = Vec::new();
    let (scanned, _, stop) = walk(
        &start,
        cfg.max_scan_entries,
        cfg.max_matches,
        deadline(cfg),
        |e| {
            if glob.is_match(e.rel) {
                matches.push(json!({
                "path": shown(&prefix, e.rel),
                "type": if e.is_dir { "directory" } else if e.is_file { "file" } else { "other" },
            }));
                true
            } else {
                false
            }
        },
    );
    Ok(json!({
        "root": if prefix.as_os_str().is_empty() { ".".to_string() } else { prefix.to_string_lossy().into_owned() },
        "pattern": args.pattern,
        "matches": matches,
        "scanned": scanned,
        "truncated": stop.is_some(),
        "stopped_by": stop.map(Stop::as_str),
    }))
}

fn search_regex(args: &SearchArgs) -> Result<Regex, WsError> {
    if args.pattern.is_empty() || args.pattern.len() > MAX_PATTERN_BYTES {
        return Err(WsError::invalid(format!(
            "file_search: a pattern of 1 to {MAX_PATTERN_BYTES} bytes is needed"
        )));
    }
    let source = if args.regex {
        args.pattern.clone()
    } else {
        regex::escape(&args.pattern)
    };
    RegexBuilder::new(&source)
        .case_insensitive(args.case_insensitive)
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| WsError::invalid(format!("file_search: pattern: {e}")))
}

/// `file_search`: lines matching the pattern, in files under `root` (binary files and
/// files above `max_search_file_bytes` skipped and counted).
pub fn search(
    root: &WorkspaceRoot,
    cfg: &WorkspaceConfig,
    args: &SearchArgs,
) -> Result<Value, WsError> {
    let regex = search_regex(args)?;
    let filter = args.glob.as_deref().map(NameGlob::new).transpose()?;
    let (start, prefix) = start_dir(root, args.root.as_deref())?;
    let max = cfg.max_matches;
    let mut matches: Vec<Value> = Vec::new();
    let (mut files, mut skipped_binary, mut skipped_large) = (0u64, 0u64, 0u64);
    let limit = deadline(cfg);
    let (scanned, _, stop) = walk(&start, cfg.max_scan_entries, usize::MAX, limit, |e| {
        if !e.is_file || matches.len() >= max {
            return false;
        }
        if filter.as_ref().is_some_and(|f| !f.is_match(e.rel)) {
            return false;
        }
        // A file swapped for a link since the listing is not followed, nor one swapped
        // for a FIFO or device (opened without blocking, then checked).
        let Ok(file) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(e.abs)
        else {
            return false;
        };
        let Ok(meta) = file.metadata() else {
            return false;
        };
        if !meta.is_file() {
            return false;
        }
        let size = meta.len();
        if size > cfg.max_search_file_bytes {
            skipped_large += 1;
            return false;
        }
        let mut bytes = Vec::with_capacity(size as usize);
        if file
            .take(cfg.max_search_file_bytes)
            .read_to_end(&mut bytes)
            .is_err()
        {
            return false;
        }
        if bytes[..bytes.len().min(BINARY_SNIFF_BYTES)].contains(&0) {
            skipped_binary += 1;
            return false;
        }
        files += 1;
        for (n, line) in bytes.split(|b| *b == b'\n').enumerate() {
            if matches.len() >= max {
                break;
            }
            if regex.is_match(line) {
                let text = String::from_utf8_lossy(line);
                let mut text: String = text.chars().take(MAX_LINE_CHARS).collect();
                if text.ends_with('\r') {
                    text.pop();
                }
                matches.push(json!({
                    "path": shown(&prefix, e.rel),
                    "line": n + 1,
                    "text": text,
                }));
            }
        }
        false
    });
    let stop = stop.or((matches.len() >= max).then_some(Stop::MaxMatches));
    Ok(json!({
        "pattern": args.pattern,
        "regex": args.regex,
        "matches": matches,
        "files_searched": files,
        "skipped_binary": skipped_binary,
        "skipped_large": skipped_large,
        "scanned": scanned,
        "truncated": stop.is_some(),
        "stopped_by": stop.map(Stop::as_str),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, WorkspaceRoot) {
        let dir = tempfile::tempdir().expect("tempdir");
        let canonical = std::fs::canonicalize(dir.path()).expect("canonical");
        let ws = canonical.join("ws");
        for d in ["src/a", "src/b", "docs"] {
            std::fs::create_dir_all(ws.join(d)).expect("mkdir");
        }
        std::fs::write(ws.join("src/a/one.rs"), "fn one() {}\n// TODO: x\n").expect("w");
        std::fs::write(ws.join("src/b/two.rs"), "fn two() {}\nlet todo = 1;\n").expect("w");
        std::fs::write(ws.join("docs/readme.md"), "TODO docs\r\n").expect("w");
        std::fs::write(ws.join("src/blob.bin"), b"TODO\0binary").expect("w");
        std::fs::create_dir_all(canonical.join("outside")).expect("mkdir");
        std::fs::write(canonical.join("outside/secret.rs"), "TODO secret").expect("w");
        std::os::unix::fs::symlink(canonical.join("outside"), ws.join("src/escape")).expect("link");
        let root = WorkspaceRoot::open(&ws).expect("root");
        (dir, root)
    }

    fn paths(v: &Value) -> Vec<String> {
        v["matches"]
            .as_array()
            .expect("matches")
            .iter()
            .filter_map(|m| m["path"].as_str().map(str::to_owned))
            .collect()
    }

    #[test]
    fn globs_match_names_or_relative_paths_and_links_are_not_followed() {
        let (_d, root) = setup();
        let cfg = WorkspaceConfig::default();
        let f = |pattern: &str, start: Option<&str>| {
            find(
                &root,
                &cfg,
                &FindArgs {
                    worker: None,
                    pattern: pattern.into(),
                    root: start.map(str::to_owned),
                },
            )
            .expect("find")
        };
        assert_eq!(
            paths(&f("*.rs", None)),
            vec!["src/a/one.rs", "src/b/two.rs"]
        );
        assert_eq!(paths(&f("a/*.rs", Some("src"))), vec!["src/a/one.rs"]);
        assert_eq!(paths(&f("**/two.rs", None)), vec!["src/b/two.rs"]);
        assert_eq!(paths(&f("*.rs", Some("src/b"))), vec!["src/b/two.rs"]);
        assert!(
            paths(&f("secret*", None)).is_empty(),
            "a link is not followed"
        );
        let e = find(
            &root,
            &cfg,
            &FindArgs {
                worker: None,
                pattern: "*".into(),
                root: Some("src/escape".into()),
            },
        );
        assert_eq!(
            e.expect_err("outside").code,
            WsErrorCode::PathOutsideWorkspace
        );
        let bad = find(
            &root,
            &cfg,
            &FindArgs {
                worker: None,
                pattern: "[".into(),
                root: None,
            },
        );
        assert_eq!(
            bad.expect_err("bad glob").code,
            WsErrorCode::InvalidArguments
        );
    }

    #[test]
    fn find_stops_at_its_bounds_and_says_which() {
        let (_d, root) = setup();
        let mut cfg = WorkspaceConfig {
            max_matches: 1,
            ..WorkspaceConfig::default()
        };
        let args = FindArgs {
            worker: None,
            pattern: "*".into(),
            root: None,
        };
        let v = find(&root, &cfg, &args).expect("find");
        assert_eq!(v["matches"].as_array().map(Vec::len), Some(1));
        assert_eq!(v["stopped_by"], "max_matches");
        cfg.max_matches = 100;
        cfg.max_scan_entries = 3;
        let v = find(&root, &cfg, &args).expect("find");
        assert_eq!(v["scanned"], 3);
        assert_eq!(v["stopped_by"], "max_scan_entries");
        cfg.max_scan_entries = 100;
        cfg.scan_time_limit_ms = 0;
        let v = find(&root, &cfg, &args).expect("find");
        assert_eq!(v["stopped_by"], "scan_time_limit_ms");
        assert_eq!(v["truncated"], true);
    }

    #[test]
    fn search_literal_regex_case_glob_and_binary_skip() {
        let (_d, root) = setup();
        let cfg = WorkspaceConfig::default();
        let s = |pattern: &str, regex: bool, ci: bool, glob: Option<&str>| {
            search(
                &root,
                &cfg,
                &SearchArgs {
                    worker: None,
                    pattern: pattern.into(),
                    root: None,
                    regex,
                    glob: glob.map(str::to_owned),
                    case_insensitive: ci,
                },
            )
            .expect("search")
        };
        let literal = s("TODO", false, false, None);
        assert_eq!(paths(&literal), vec!["docs/readme.md", "src/a/one.rs"]);
        assert_eq!(literal["skipped_binary"], 1);
        assert_eq!(literal["matches"][0]["text"], "TODO docs");
        assert_eq!(literal["matches"][1]["line"], 2);
        let ci = s("todo", false, true, Some("*.rs"));
        assert_eq!(paths(&ci), vec!["src/a/one.rs", "src/b/two.rs"]);
        let re = s(r"fn \w+\(\)", true, false, None);
        assert_eq!(re["matches"].as_array().map(Vec::len), Some(2));
        // `.` is literal unless regex is set.
        assert!(paths(&s("fn.one", false, false, None)).is_empty());
        assert_eq!(paths(&s("fn.one", true, false, None)), vec!["src/a/one.rs"]);
        let bad = search(
            &root,
            &cfg,
            &SearchArgs {
                worker: None,
                pattern: "(".into(),
                root: None,
                regex: true,
                glob: None,
                case_insensitive: false,
            },
        );
        assert_eq!(
            bad.expect_err("bad regex").code,
            WsErrorCode::InvalidArguments
        );
    }

    #[test]
    fn search_skips_large_files_and_bounds_matches() {
        let (_d, root) = setup();
        let cfg = WorkspaceConfig {
            max_search_file_bytes: 12,
            max_matches: 1,
            ..WorkspaceConfig::default()
        };
        let s = |pattern: &str| {
            search(
                &root,
                &cfg,
                &SearchArgs {
                    worker: None,
                    pattern: pattern.into(),
                    root: None,
                    regex: false,
                    glob: None,
                    case_insensitive: false,
                },
            )
            .expect("search")
        };
        let v = s("o");
        assert_eq!(v["matches"].as_array().map(Vec::len), Some(1));
        assert_eq!(v["stopped_by"], "max_matches");
        let v = s("fn");
        assert_eq!(v["matches"], json!([]));
        assert_eq!(v["skipped_large"], 2, "{v}");
        assert_eq!(v["skipped_binary"], 1, "{v}");
        assert_eq!(v["stopped_by"], Value::Null);
    }
}
