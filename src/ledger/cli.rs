//! `toolwall ledger …`: parsing and output of the ledger's subcommands. They read files
//! and need no daemon; `src/cli.rs` hands them the whole command line.

use lexopt::prelude::*;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::PathBuf;

use super::chain::canonical;
use super::chain::signing::{self, SignedHead, SigningKey};
use super::chain::verify::{self, Report};
use super::query;
use super::retention::archive_file;
use crate::config::Config;
use std::io::IsTerminal as _;

/// Writes to stdout; a reader that went away (`| head`) ends the output quietly instead of
/// a panic.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let text = format!($($arg)*);
        let mut stdout = std::io::stdout().lock();
        if let Err(e) = stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
        }
    }};
}
macro_rules! outln {
    ($($arg:tt)*) => {{
        out!("{}\n", format!($($arg)*));
    }};
}

pub const USAGE: &str = "\
Usage: toolwall ledger <COMMAND> [--config FILE] [--ledger FILE] [OPTIONS]

  tail [-n N] [--json]       Recent tool calls, newest last
  verify [--public-key FILE] [--anchor FILE] [--json]
                             Recompute the hash chain, check every row and every signed
                             checkpoint; names the first group or row that does not match
                             and exits 1. --public-key: the key the checkpoints must be
                             signed with (default: the configured signing key, when
                             readable). --anchor: signed heads shipped by anchor_command
                             (one JSON line each); the ledger must hold each one's group.
                             --archive DIR: also check the archives and that they and the
                             live ledger continue each other
  archive list [--archive DIR] [--json]
                             The archive files (default: [ledger] archive_dir), each
                             checked: groups, dates, rows, size
  key [--json]               Print the public key that signs the checkpoints
                             (ed25519:<hex>), creating the key pair when missing
  query [FILTERS] [--limit N] [--after ID | --before ID] [--table | --json | --csv]
                             Calls matching every filter given, oldest first: the newest
                             page, or the page after/before a cursor (the last/first id
                             printed). A table on a terminal, JSON lines otherwise
    --tool GLOB              server__tool or the bare tool name (*, ?, [..]; case-sensitive)
    --server S  --principal P  --transport T  --decision D  --method M
    --rule ID                the deciding rule, or any rule that matched
    --since T  --until T     RFC 3339 (2025-06-01T09:00:00Z, 2025-06-01) or an age (30m, 2h, 7d)
    --text STRING            in the argument or response previews
  show ID [--json]           One call whole: bodies, every rule event, approval, timing, and
                             whether its row matches its chain group
  stats [--since T] [--until T] [--json]
                             Calls by tool, decision and principal, top blocking rules,
                             p50/p99 duration per tool (default --since 24h)
  --ledger FILE              The ledger to read (default: [ledger] path of the config); a
                             live ledger is read in one snapshot without stopping the
                             gateway, a copy works the same

Exit status: 0 ok, 1 the check failed, 2 bad usage or the file cannot be read.
";

/// Whether the command line is `toolwall … ledger …` (the first word, `--config`'s value
/// aside).
pub fn is_ledger_command(args: &[OsString]) -> bool {
    let mut skip_value = false;
    for arg in args {
        if skip_value {
            skip_value = false;
            continue;
        }
        let Some(text) = arg.to_str() else {
            return false;
        };
        if text == "--config" {
            skip_value = true;
        } else if !text.starts_with('-') {
            return text == "ledger";
        }
    }
    false
}

#[derive(Default)]
struct Args {
    words: Vec<String>,
    config: Option<PathBuf>,
    ledger: Option<PathBuf>,
    json: bool,
    n: Option<usize>,
    public_key: Option<PathBuf>,
    anchor: Vec<PathBuf>,
    archive: Option<PathBuf>,
    filters: FilterArgs,
    limit: Option<usize>,
    after: Option<i64>,
    before: Option<i64>,
    csv: bool,
    table: bool,
}

#[derive(Default)]
struct FilterArgs {
    tool: Option<String>,
    server: Option<String>,
    principal: Option<String>,
    transport: Option<String>,
    decision: Option<String>,
    method: Option<String>,
    rule: Option<String>,
    since: Option<String>,
    until: Option<String>,
    text: Option<String>,
}

fn number<T: std::str::FromStr>(
    flag: &str,
    v: Result<OsString, lexopt::Error>,
) -> Result<T, String> {
    let v = value_string(v)?;
    v.parse()
        .map_err(|_| format!("{flag} needs a number, got {v:?}"))
}

fn value_string(v: Result<OsString, lexopt::Error>) -> Result<String, String> {
    v.map_err(|e| e.to_string())?
        .into_string()
        .map_err(|v| format!("argument {v:?} is not UTF-8"))
}

fn parse(args: Vec<OsString>) -> Result<Option<Args>, String> {
    let mut parser = lexopt::Parser::from_args(args);
    let mut out = Args::default();
    while let Some(arg) = parser.next().map_err(|e| e.to_string())? {
        match arg {
            Short('h') | Long("help") => return Ok(None),
            Long("config") => out.config = Some(parser.value().map_err(|e| e.to_string())?.into()),
            Long("ledger") => out.ledger = Some(parser.value().map_err(|e| e.to_string())?.into()),
            Long("json") => out.json = true,
            Long("public-key") => {
                out.public_key = Some(parser.value().map_err(|e| e.to_string())?.into())
            }
            Long("anchor") => out
                .anchor
                .push(parser.value().map_err(|e| e.to_string())?.into()),
            Long("archive") => {
                out.archive = Some(parser.value().map_err(|e| e.to_string())?.into())
            }
            Long("tool") => out.filters.tool = Some(value_string(parser.value())?),
            Long("server") => out.filters.server = Some(value_string(parser.value())?),
            Long("principal") => out.filters.principal = Some(value_string(parser.value())?),
            Long("transport") => out.filters.transport = Some(value_string(parser.value())?),
            Long("decision") => out.filters.decision = Some(value_string(parser.value())?),
            Long("method") => out.filters.method = Some(value_string(parser.value())?),
            Long("rule") => out.filters.rule = Some(value_string(parser.value())?),
            Long("since") => out.filters.since = Some(value_string(parser.value())?),
            Long("until") => out.filters.until = Some(value_string(parser.value())?),
            Long("text") => out.filters.text = Some(value_string(parser.value())?),
            Long("limit") => out.limit = Some(number("--limit", parser.value())?),
            Long("after") => out.after = Some(number("--after", parser.value())?),
            Long("before") => out.before = Some(number("--before", parser.value())?),
            Long("csv") => out.csv = true,
            Long("table") => out.table = true,
            Short('n') => {
                let v = value_string(parser.value())?;
                out.n = Some(
                    v.parse()
                        .map_err(|_| format!("-n needs a number, got {v:?}"))?,
                );
            }
            Value(v) => out.words.push(
                v.into_string()
                    .map_err(|v| format!("argument {v:?} is not UTF-8"))?,
            ),
            _ => return Err(arg.unexpected().to_string()),
        }
    }
    Ok(Some(out))
}

/// Largest `--public-key` / `--anchor` file read.
const MAX_SMALL_FILE: u64 = 1 << 20;

impl Args {
    fn query_filters(&self) -> Result<query::Filters, String> {
        let now = super::now_ms();
        let time = |t: &Option<String>| t.as_deref().map(|t| super::parse_time(t, now)).transpose();
        let f = &self.filters;
        if let Some(d) = &f.decision
            && !["allowed", "denied", "error", "pending"].contains(&d.as_str())
        {
            return Err(format!(
                "--decision must be allowed, denied, error or pending, not {d:?}"
            ));
        }
        Ok(query::Filters {
            tool: f.tool.clone(),
            server: f.server.clone(),
            principal: f.principal.clone(),
            transport: f.transport.clone(),
            decision: f.decision.clone(),
            method: f.method.clone(),
            rule: f.rule.clone(),
            since_ms: time(&f.since)?,
            until_ms: time(&f.until)?,
            text: f.text.clone(),
        })
    }

    /// `--public-key FILE`, else the configured signing key when it exists and is readable.
    fn trusted_key(&self) -> Result<Option<[u8; signing::PUBLIC_KEY_LEN]>, String> {
        if let Some(file) = &self.public_key {
            let text = crate::config::read_bounded(file, MAX_SMALL_FILE)
                .map_err(|e| format!("--public-key {}: {e}", file.display()))?;
            return signing::parse_public_key(&text)
                .map(Some)
                .map_err(|e| format!("--public-key {}: {e}", file.display()));
        }
        let Ok(config) = self.config() else {
            return Ok(None);
        };
        Ok(SigningKey::load(&config.ledger.signing_key_path())
            .ok()
            .map(|k| k.public_key()))
    }

    fn anchors(&self) -> Result<Vec<SignedHead>, String> {
        let mut out = Vec::new();
        for file in &self.anchor {
            let text = crate::config::read_bounded(file, MAX_SMALL_FILE)
                .map_err(|e| format!("--anchor {}: {e}", file.display()))?;
            for (n, line) in text.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                out.push(
                    SignedHead::from_json(line.trim())
                        .map_err(|e| format!("--anchor {} line {}: {e}", file.display(), n + 1))?,
                );
            }
        }
        Ok(out)
    }

    fn ledger_path(&self) -> Result<PathBuf, String> {
        match &self.ledger {
            Some(p) => Ok(p.clone()),
            None => Ok(self.config()?.ledger.path),
        }
    }

    fn config(&self) -> Result<Config, String> {
        Config::load(self.config.as_deref()).map_err(|e| e.to_string())
    }
}

/// Runs `toolwall ledger …` (the whole command line after the program name); returns the
/// exit status, or an error for bad usage and unreadable files.
pub fn run(args: Vec<OsString>) -> Result<i32, String> {
    let Some(args) = parse(args)? else {
        out!("{USAGE}");
        return Ok(0);
    };
    let words: Vec<&str> = args.words.iter().map(String::as_str).collect();
    match words.as_slice() {
        ["ledger", "tail"] => {
            let path = args.ledger_path()?;
            let text =
                super::tail(&path, args.n.unwrap_or(20), args.json).map_err(|e| e.to_string())?;
            out!("{text}");
            Ok(0)
        }
        ["ledger", "verify"] => {
            let path = args.ledger_path()?;
            let options = verify::Options {
                trusted_key: args.trusted_key()?,
                anchors: args.anchors()?,
                archive_dir: args.archive.clone(),
                ..verify::Options::default()
            };
            let report = verify::verify_file(&path, &options).map_err(|e| e.to_string())?;
            if args.json {
                outln!("{}", report_json(&path, &report));
            } else {
                out!("{}", report_text(&path, &report));
            }
            Ok(if report.ok() { 0 } else { 1 })
        }
        ["ledger", "archive", "list"] => {
            let dir = match &args.archive {
                Some(d) => d.clone(),
                None => args.config()?.ledger.archive_dir_path(),
            };
            let files = archive_file::list(&dir)?;
            let key = args.trusted_key()?;
            let mut listed = Vec::new();
            let mut bad = 0;
            for file in &files {
                let (summary, problems) = archive_file::check(file, key.as_ref())?;
                bad += problems.len();
                listed.push((summary, problems));
            }
            if args.json {
                for (s, problems) in &listed {
                    outln!(
                        "{}",
                        serde_json::json!({
                            "file": s.path.display().to_string(),
                            "first_seq": s.first_seq,
                            "last_seq": s.last_seq,
                            "first_ts_ms": s.first_ts_ms,
                            "last_ts_ms": s.last_ts_ms,
                            "rows": s.rows,
                            "checkpoints": s.checkpoints,
                            "bytes": s.bytes,
                            "prev_hash": canonical::hex(&s.prev_hash),
                            "last_hash": canonical::hex(&s.last_hash),
                            "problems": problems,
                        })
                    );
                }
            } else {
                if listed.is_empty() {
                    outln!("no archives in {}", dir.display());
                }
                for (s, problems) in &listed {
                    let when = |t: Option<i64>| t.map(super::format_utc_ms).unwrap_or_default();
                    outln!(
                        "{}  groups {}..{}  {} .. {}  {} rows  {} checkpoints  {} bytes  {}",
                        s.path.display(),
                        s.first_seq,
                        s.last_seq,
                        when(s.first_ts_ms),
                        when(s.last_ts_ms),
                        s.rows,
                        s.checkpoints,
                        s.bytes,
                        if problems.is_empty() { "OK" } else { "BAD" }
                    );
                    for p in problems {
                        outln!("  BAD: {p}");
                    }
                }
            }
            Ok(if bad == 0 { 0 } else { 1 })
        }
        ["ledger", "key"] => {
            let config = args.config()?;
            let key_path = config.ledger.signing_key_path();
            let key = SigningKey::load_or_create(&key_path)?;
            let public = signing::format_public_key(&key.public_key());
            if args.json {
                outln!(
                    "{}",
                    serde_json::json!({"public_key": public, "path": key_path.display().to_string()})
                );
            } else {
                outln!("{public}");
            }
            Ok(0)
        }
        ["ledger", "query"] => {
            let path = args.ledger_path()?;
            let filters = args.query_filters()?;
            let page = match (args.after, args.before) {
                (Some(_), Some(_)) => return Err("give --after or --before, not both".into()),
                (Some(id), None) => query::Page::After(id),
                (None, Some(id)) => query::Page::Before(id),
                (None, None) => query::Page::Newest,
            };
            let limit = args.limit.unwrap_or(50);
            if limit == 0 || limit > query::MAX_LIMIT {
                return Err(format!(
                    "--limit must be between 1 and {}",
                    query::MAX_LIMIT
                ));
            }
            let conn = query::open_read_only(&path).map_err(|e| e.to_string())?;
            let calls = query::query(&conn, &filters, page, limit)
                .map_err(|e| format!("ledger {}: {e}", path.display()))?;
            let text = if args.csv {
                query::format_csv(&calls)
            } else if args.json || (!args.table && !std::io::stdout().is_terminal()) {
                query::format_json(&calls)
            } else {
                query::format_table(&calls)
            };
            out!("{text}");
            Ok(0)
        }
        ["ledger", "show", id] => {
            let id: i64 = id
                .parse()
                .map_err(|_| format!("a call id is a number, not {id:?}"))?;
            let path = args.ledger_path()?;
            let conn = query::open_read_only(&path).map_err(|e| e.to_string())?;
            let Some(call) =
                query::show(&conn, id).map_err(|e| format!("ledger {}: {e}", path.display()))?
            else {
                eprintln!("toolwall: no call {id} in {}", path.display());
                return Ok(1);
            };
            if args.json {
                outln!("{call}");
            } else {
                out!("{}", query::format_show(&call));
            }
            Ok(0)
        }
        ["ledger", "stats"] => {
            let path = args.ledger_path()?;
            let now = super::now_ms();
            let since = super::parse_time(args.filters.since.as_deref().unwrap_or("24h"), now)?;
            let until = args
                .filters
                .until
                .as_deref()
                .map(|t| super::parse_time(t, now))
                .transpose()?;
            let conn = query::open_read_only(&path).map_err(|e| e.to_string())?;
            let stats = query::stats(&conn, since, until)
                .map_err(|e| format!("ledger {}: {e}", path.display()))?;
            if args.json {
                outln!("{stats}");
            } else {
                out!("{}", query::format_stats(&stats));
            }
            Ok(0)
        }
        ["ledger"] => {
            eprint!("{USAGE}");
            Ok(2)
        }
        _ => Err(format!(
            "unknown command {:?}; see toolwall ledger --help",
            args.words.join(" ")
        )),
    }
}

fn group_text(group: Option<(i64, i64)>) -> String {
    match group {
        Some((seq, ts)) => format!("{seq} ({})", super::format_utc_ms(ts)),
        None => "-".into(),
    }
}

/// `verify`'s text report: the verdict first, then what was checked, then every problem.
pub fn report_text(path: &std::path::Path, report: &Report) -> String {
    let mut out = String::new();
    let verdict = if report.ok() { "OK" } else { "FAILED" };
    let _ = writeln!(out, "ledger {}: {verdict}", path.display());
    let _ = writeln!(
        out,
        "  groups: {} (first {}, last {})",
        report.groups,
        group_text(report.first_group),
        group_text(report.last_group)
    );
    if let Some(head) = report.head {
        let _ = writeln!(
            out,
            "  head: group {} {}",
            head.seq,
            canonical::hex(&head.hash)
        );
    }
    let rows = canonical::Table::ALL
        .iter()
        .zip(report.chained_rows)
        .map(|(t, n)| format!("{} {n}", t.name()))
        .collect::<Vec<_>>()
        .join(", ");
    let _ = writeln!(out, "  rows checked: {rows}");
    let legacy: u64 = report.legacy_rows.iter().sum();
    if legacy > 0 {
        let _ = writeln!(out, "  rows older than the chain (sealed): {legacy}");
    }
    let sigs = &report.signatures;
    match (sigs.last, sigs.key) {
        (Some((seq, at)), Some(key)) => {
            let _ = writeln!(
                out,
                "  signed checkpoints: {} (last: group {seq}, signed {}) by {}{}",
                sigs.checkpoints,
                super::format_utc_ms(at),
                signing::format_public_key(&key),
                if sigs.key_trusted {
                    ""
                } else {
                    " (the key the ledger names: pass --public-key to check it is yours)"
                }
            );
        }
        _ => {
            let _ = writeln!(out, "  signed checkpoints: none");
        }
    }
    if sigs.anchors > 0 {
        let _ = writeln!(out, "  anchors checked: {}", sigs.anchors);
    }
    if sigs.archives > 0 {
        let _ = writeln!(
            out,
            "  archives checked: {} ({} rows)",
            sigs.archives, sigs.archived_rows
        );
    }
    for note in &report.notes {
        let _ = writeln!(out, "  note: {note}");
    }
    for problem in &report.problems {
        let at = match (problem.group, problem.group_ts_ms) {
            (Some(seq), Some(ts)) => {
                format!("group {seq} (committed {}): ", super::format_utc_ms(ts))
            }
            _ => String::new(),
        };
        let _ = writeln!(out, "  BAD: {at}{}", problem.what);
    }
    if report.more_problems > 0 {
        let _ = writeln!(out, "  … and {} more problems", report.more_problems);
    }
    out
}

/// `verify --json`: one object.
pub fn report_json(path: &std::path::Path, report: &Report) -> serde_json::Value {
    let group =
        |g: Option<(i64, i64)>| g.map(|(seq, ts)| serde_json::json!({"seq": seq, "ts_ms": ts}));
    let mut rows = serde_json::Map::new();
    let mut legacy = serde_json::Map::new();
    for (i, table) in canonical::Table::ALL.iter().enumerate() {
        rows.insert(table.name().into(), report.chained_rows[i].into());
        legacy.insert(table.name().into(), report.legacy_rows[i].into());
    }
    serde_json::json!({
        "ledger": path.display().to_string(),
        "ok": report.ok(),
        "groups": report.groups,
        "first_group": group(report.first_group),
        "last_group": group(report.last_group),
        "head": report.head.map(|h| serde_json::json!({
            "seq": h.seq,
            "hash": canonical::hex(&h.hash),
        })),
        "rows": rows,
        "legacy_rows": legacy,
        "notes": report.notes,
        "problems": report.problems.iter().map(|p| serde_json::json!({
            "group": p.group,
            "group_ts_ms": p.group_ts_ms,
            "what": p.what,
        })).collect::<Vec<_>>(),
        "more_problems": report.more_problems,
        "signatures": {
            "checkpoints": report.signatures.checkpoints,
            "last": group(report.signatures.last),
            "public_key": report.signatures.key.map(|k| signing::format_public_key(&k)),
            "key_trusted": report.signatures.key_trusted,
            "anchors": report.signatures.anchors,
        },
    })
}
