//! Questions an auditor asks without SQL: `toolwall ledger query` (calls by tool, server,
//! principal, transport, decision, rule, time, text, a page at a time), `ledger show ID`
//! (one call whole) and `ledger stats` (counts and latencies). Read-only; a live ledger is
//! read in a snapshot without holding the gateway back.
//!
//! How they stay fast without an index on the commit path: call ids are assigned in
//! arrival order, so a time bound becomes an id range found by binary search on the rowid
//! (`--since 2h` reads only the last two hours' rows), pages are id ranges (`--after`,
//! `--before`), and the rules of a call are a key lookup. Filters without a time bound
//! scan the table from the newest call back until a page is full.

use rusqlite::types::{Value, ValueRef};
use rusqlite::{Connection, OpenFlags, OptionalExtension, params_from_iter};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

use super::error::{LedgerError, LedgerErrorKind};
use super::tail::escape;
use super::time::format_utc_ms;

/// Most calls one page may hold.
pub const MAX_LIMIT: usize = 100_000;
/// Distinct tools, principals or rules `stats` counts separately; beyond, "(other)".
const MAX_GROUPS: usize = 10_000;

/// What to look for. Every filter given must hold.
#[derive(Debug, Clone, Default)]
pub struct Filters {
    /// A glob (`*`, `?`, `[...]`, case-sensitive) on `server__tool` or on the bare tool name.
    pub tool: Option<String>,
    pub server: Option<String>,
    pub principal: Option<String>,
    pub transport: Option<String>,
    pub decision: Option<String>,
    pub method: Option<String>,
    /// The deciding rule, or any rule that matched.
    pub rule: Option<String>,
    pub since_ms: Option<i64>,
    pub until_ms: Option<i64>,
    /// Text in the argument or response previews.
    pub text: Option<String>,
}

/// Which page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Page {
    /// The newest matching calls.
    Newest,
    /// The oldest matching calls after this id (following the ledger).
    After(i64),
    /// The newest matching calls before this id (going back).
    Before(i64),
}

/// One page of calls, oldest first: every column of `tool_calls`, by name.
pub struct Calls {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Value>>,
}

impl Calls {
    fn get(&self, row: &[Value], name: &str) -> Option<Value> {
        self.columns
            .iter()
            .position(|c| c == name)
            .and_then(|i| row.get(i).cloned())
    }

    /// The cursor for the next page (`--after`): the last id printed.
    pub fn cursor(&self) -> Option<i64> {
        self.rows.last().and_then(|r| match self.get(r, "id") {
            Some(Value::Integer(id)) => Some(id),
            _ => None,
        })
    }
}

fn read_err(path: &Path, what: &str, e: impl std::fmt::Display) -> LedgerError {
    LedgerError::new(LedgerErrorKind::Read, path, format!("{what}: {e}"))
}

/// Opens a ledger read-only.
pub fn open_read_only(path: &Path) -> Result<Connection, LedgerError> {
    if !path.exists() {
        return Err(LedgerError::new(
            LedgerErrorKind::Read,
            path,
            "no ledger at this path (run the gateway first, or pass --ledger FILE)",
        ));
    }
    Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| read_err(path, "open read-only", e))
}

/// The smallest id whose `ts_ms` is at least `ts_ms`, by binary search on the rowid
/// (ids are in arrival order; a clock stepped back can hide a few calls around the step);
/// `None` when every call is older.
fn first_id_at(conn: &Connection, ts_ms: i64) -> rusqlite::Result<Option<i64>> {
    let bounds: (Option<i64>, Option<i64>) =
        // Two subqueries: SQLite answers a lone min() or max() of the rowid from the
        // b-tree's ends, but scans the whole table for both in one SELECT.
        conn.query_row("SELECT (SELECT min(id) FROM tool_calls), (SELECT max(id) FROM tool_calls)", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
    let (Some(mut lo), Some(mut hi)) = bounds else {
        return Ok(None);
    };
    let mut probe =
        conn.prepare_cached("SELECT id, ts_ms FROM tool_calls WHERE id >= ?1 ORDER BY id LIMIT 1")?;
    let mut first_from = |x: i64| -> rusqlite::Result<(i64, i64)> {
        probe.query_row([x], |r| Ok((r.get(0)?, r.get(1)?)))
    };
    if first_from(hi)?.1 < ts_ms {
        return Ok(None);
    }
    // The smallest x whose first call at or after it is recent enough.
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if first_from(mid)?.1 >= ts_ms {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Ok(Some(first_from(lo)?.0))
}

/// The id range a time window covers: (first id, last id), both inclusive.
pub fn id_range(
    conn: &Connection,
    since: Option<i64>,
    until: Option<i64>,
) -> rusqlite::Result<(i64, i64)> {
    let lo = match since {
        Some(t) => first_id_at(conn, t)?.unwrap_or(i64::MAX),
        None => i64::MIN,
    };
    let hi = match until {
        Some(t) => first_id_at(conn, t.saturating_add(1))?.map_or(i64::MAX, |id| id - 1),
        None => i64::MAX,
    };
    Ok((lo, hi))
}

/// The WHERE clause of `filters` (besides the id range) and its parameters.
fn conditions(filters: &Filters) -> (String, Vec<Value>) {
    let mut sql = String::new();
    let mut params: Vec<Value> = Vec::new();
    let mut add = |condition: &str, values: &[&str]| {
        sql.push_str(" AND ");
        sql.push_str(&condition.replace('#', &(params.len() + 1).to_string()));
        params.extend(values.iter().map(|v| Value::Text((*v).to_owned())));
    };
    if let Some(glob) = &filters.tool {
        add(
            "((c.server_name || '__' || c.tool_name) GLOB ?# OR c.tool_name GLOB ?#)",
            &[glob],
        );
    }
    for (column, value) in [
        ("server_name", &filters.server),
        ("principal", &filters.principal),
        ("transport", &filters.transport),
        ("decision", &filters.decision),
        ("method", &filters.method),
    ] {
        if let Some(value) = value {
            add(&format!("c.{column} = ?#"), &[value]);
        }
    }
    if let Some(rule) = &filters.rule {
        add(
            "(c.policy_rule = ?# OR EXISTS (SELECT 1 FROM security_rule_events e \
             WHERE e.call_id = c.id AND e.rule_id = ?#))",
            &[rule],
        );
    }
    if let Some(text) = &filters.text {
        add(
            "(instr(c.arguments, ?#) > 0 OR instr(c.response_preview, ?#) > 0)",
            &[text],
        );
    }
    if let Some(since) = filters.since_ms {
        sql.push_str(&format!(" AND c.ts_ms >= {since}"));
    }
    if let Some(until) = filters.until_ms {
        sql.push_str(&format!(" AND c.ts_ms <= {until}"));
    }
    (sql, params)
}

/// One page of matching calls, oldest first.
pub fn query(
    conn: &Connection,
    filters: &Filters,
    page: Page,
    limit: usize,
) -> rusqlite::Result<Calls> {
    let limit = limit.clamp(1, MAX_LIMIT);
    conn.execute_batch("BEGIN")?;
    let result = (|| {
        let (mut lo, mut hi) = id_range(conn, filters.since_ms, filters.until_ms)?;
        let ascending = match page {
            Page::Newest => false,
            Page::After(id) => {
                lo = lo.max(id.saturating_add(1));
                true
            }
            Page::Before(id) => {
                hi = hi.min(id.saturating_sub(1));
                false
            }
        };
        let (where_sql, params) = conditions(filters);
        let sql = format!(
            "SELECT * FROM tool_calls c WHERE c.id BETWEEN {lo} AND {hi}{where_sql} \
             ORDER BY c.id {} LIMIT {limit}",
            if ascending { "ASC" } else { "DESC" }
        );
        let mut stmt = conn.prepare(&sql)?;
        let columns: Vec<String> = stmt.column_names().map(str::to_owned).collect();
        let mut rows: Vec<Vec<Value>> = stmt
            .query_map(params_from_iter(params.iter()), |row| {
                (0..columns.len()).map(|i| row.get::<_, Value>(i)).collect()
            })?
            .collect::<Result<_, _>>()?;
        if !ascending {
            rows.reverse();
        }
        Ok(Calls { columns, rows })
    })();
    let _ = conn.execute_batch("COMMIT");
    result
}

fn json_value(value: &Value) -> serde_json::Value {
    match value {
        Value::Null => serde_json::Value::Null,
        Value::Integer(i) => (*i).into(),
        Value::Real(f) => (*f).into(),
        Value::Text(t) => t.as_str().into(),
        Value::Blob(b) => b
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect::<String>()
            .into(),
    }
}

fn text_of(value: &Option<Value>) -> String {
    match value {
        Some(Value::Text(t)) => t.clone(),
        Some(Value::Integer(i)) => i.to_string(),
        _ => String::new(),
    }
}

/// One JSON object per line, every column.
pub fn format_json(calls: &Calls) -> String {
    let mut out = String::new();
    for row in &calls.rows {
        let object: serde_json::Map<String, serde_json::Value> = calls
            .columns
            .iter()
            .zip(row)
            .map(|(c, v)| (c.clone(), json_value(v)))
            .collect();
        out.push_str(&serde_json::Value::Object(object).to_string());
        out.push('\n');
    }
    out
}

/// A CSV field (RFC 4180), with a leading `'` before text a spreadsheet would take for a
/// formula (agents choose these texts).
fn csv_field(text: &str) -> String {
    // Terminal controls and bidi overrides written visibly (a quoted field keeps its
    // line breaks).
    let text = &super::tail::defang(text, &['\n']);
    let guarded = if text.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{text}")
    } else {
        text.to_owned()
    };
    if guarded.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", guarded.replace('"', "\"\""))
    } else {
        guarded
    }
}

/// A header line and one line per call, every column.
pub fn format_csv(calls: &Calls) -> String {
    let mut out = calls.columns.join(",");
    out.push_str("\r\n");
    for row in &calls.rows {
        let fields: Vec<String> = row
            .iter()
            .map(|v| match v {
                Value::Null => String::new(),
                Value::Integer(i) => i.to_string(),
                Value::Real(f) => f.to_string(),
                Value::Text(t) => csv_field(t),
                Value::Blob(b) => b.iter().map(|x| format!("{x:02x}")).collect(),
            })
            .collect();
        out.push_str(&fields.join(","));
        out.push_str("\r\n");
    }
    out
}

/// Widest a table cell is printed (longer ones end in `…`).
const CELL_MAX: usize = 48;

fn cell(text: &str) -> String {
    let escaped = escape(text);
    if escaped.chars().count() <= CELL_MAX {
        escaped
    } else {
        let mut cut: String = escaped.chars().take(CELL_MAX - 1).collect();
        cut.push('…');
        cut
    }
}

/// An aligned table, agent-chosen fields escaped, and the cursor of the next page.
pub fn format_table(calls: &Calls) -> String {
    let header = [
        "ID",
        "TIME (UTC)",
        "DECISION",
        "VIA",
        "PRINCIPAL",
        "TOOL",
        "MS",
        "RULE",
        "ERROR",
    ];
    let mut table: Vec<Vec<String>> = vec![header.iter().map(|h| (*h).to_owned()).collect()];
    for row in &calls.rows {
        let get = |name: &str| calls.get(row, name);
        let ts = match get("ts_ms") {
            Some(Value::Integer(t)) => format_utc_ms(t),
            _ => String::new(),
        };
        let ms = match get("duration_us") {
            Some(Value::Integer(us)) => format!("{}.{:03}", us / 1000, us % 1000),
            _ => "-".into(),
        };
        let method = text_of(&get("method"));
        let mut tool = format!(
            "{}__{}",
            text_of(&get("server_name")),
            text_of(&get("tool_name"))
        );
        if method != "tools/call" {
            tool = format!("{method} {tool}");
        }
        table.push(vec![
            text_of(&get("id")),
            ts,
            cell(&text_of(&get("decision"))),
            cell(&text_of(&get("transport"))),
            cell(&text_of(&get("principal"))),
            cell(&tool),
            ms,
            cell(&text_of(&get("policy_rule"))),
            cell(&text_of(&get("error_message"))),
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            table
                .iter()
                .map(|r| r[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in &table {
        let mut line = String::new();
        for (i, value) in row.iter().enumerate() {
            let pad = widths[i] - value.chars().count();
            if i == 0 || i == 6 {
                line.push_str(&" ".repeat(pad));
                line.push_str(value);
            } else {
                line.push_str(value);
                line.push_str(&" ".repeat(pad));
            }
            line.push_str("  ");
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    match calls.cursor() {
        Some(cursor) => {
            let _ = writeln!(
                out,
                "{} calls; next page: --after {cursor}",
                calls.rows.len()
            );
        }
        None => out.push_str("no calls match\n"),
    }
    out
}

/// One call, whole: the row, its bodies, its rule events, and whether the row still
/// matches the chain group that last wrote it.
pub fn show(conn: &Connection, id: i64) -> rusqlite::Result<Option<serde_json::Value>> {
    conn.execute_batch("BEGIN")?;
    let result = (|| {
        let calls = {
            let mut stmt = conn.prepare("SELECT * FROM tool_calls WHERE id = ?1")?;
            let columns: Vec<String> = stmt.column_names().map(str::to_owned).collect();
            let rows: Vec<Vec<Value>> = stmt
                .query_map([id], |row| {
                    (0..columns.len()).map(|i| row.get::<_, Value>(i)).collect()
                })?
                .collect::<Result<_, _>>()?;
            Calls { columns, rows }
        };
        let Some(row) = calls.rows.first() else {
            return Ok(None);
        };
        let mut call: serde_json::Map<String, serde_json::Value> = calls
            .columns
            .iter()
            .zip(row)
            .map(|(c, v)| (c.clone(), json_value(v)))
            .collect();
        // Straight from the chained tables, never through the `tool_call_bodies` view:
        // the chain covers rows, not the schema, and anyone who can write the file can
        // redefine a view.
        let text = |r: &rusqlite::Row<'_>, i: usize| -> rusqlite::Result<Option<String>> {
            Ok(match r.get_ref(i)? {
                ValueRef::Null => None,
                ValueRef::Text(t) | ValueRef::Blob(t) => Some(String::from_utf8_lossy(t).into()),
                ValueRef::Integer(n) => Some(n.to_string()),
                ValueRef::Real(f) => Some(f.to_string()),
            })
        };
        let flag = |r: &rusqlite::Row<'_>, i: usize| -> rusqlite::Result<bool> {
            Ok(!matches!(
                r.get_ref(i)?,
                ValueRef::Null | ValueRef::Integer(0)
            ))
        };
        let bodies: Option<serde_json::Value> = conn
            .query_row(
                "SELECT COALESCE(req.body, c.arguments), req.truncated, \
                 COALESCE(res.body, c.response_preview), res.truncated, rew.body, orig.body \
                 FROM main.tool_calls c \
                 LEFT JOIN main.event_body_blobs req ON req.hash = c.request_body_hash \
                 LEFT JOIN main.event_body_blobs res ON res.hash = c.response_body_hash \
                 LEFT JOIN main.event_body_blobs rew ON rew.hash = c.rewritten_arguments_hash \
                 LEFT JOIN main.event_body_blobs orig ON orig.hash = c.original_response_hash \
                 WHERE c.id = ?1",
                [id],
                |r| {
                    Ok(serde_json::json!({
                        "arguments": text(r, 0)?,
                        "arguments_truncated": flag(r, 1)?,
                        "response": text(r, 2)?,
                        "response_truncated": flag(r, 3)?,
                        "rewritten_arguments": text(r, 4)?,
                        "original_response": text(r, 5)?,
                    }))
                },
            )
            .optional()?;
        let mut rules = Vec::new();
        let mut stmt = conn.prepare(
            "SELECT phase, seq, ts_ms, rule_id, action, layer FROM security_rule_events \
             WHERE call_id = ?1 ORDER BY phase DESC, seq",
        )?;
        let mut found = stmt.query([id])?;
        while let Some(r) = found.next()? {
            // By storage class: one edited cell is shown as it is, not the end of `show`.
            let t = |i: usize| -> rusqlite::Result<String> {
                Ok(super::tail::lossy_text(r.get_ref(i)?).unwrap_or_default())
            };
            let n = |i: usize| -> rusqlite::Result<Option<i64>> {
                Ok(match r.get_ref(i)? {
                    ValueRef::Integer(v) => Some(v),
                    _ => None,
                })
            };
            rules.push(serde_json::json!({
                "phase": t(0)?,
                "seq": n(1)?,
                "ts_ms": n(2)?,
                "rule_id": t(3)?,
                "action": t(4)?,
                "layer": t(5)?,
            }));
        }
        let chain = super::chain::verify::check_one(
            conn,
            super::chain::canonical::Table::ToolCalls,
            &[Value::Integer(id)],
        )?;
        call.insert("bodies".into(), bodies.unwrap_or(serde_json::Value::Null));
        call.insert("rules".into(), rules.into());
        call.insert("chain".into(), chain.into());
        Ok(Some(serde_json::Value::Object(call)))
    })();
    let _ = conn.execute_batch("COMMIT");
    result
}

/// A body for the terminal: pretty JSON (which escapes control characters) or, if it is
/// not JSON, escaped text.
fn body_text(body: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(body) {
        // Pretty only when it says what is stored: a parse drops duplicate keys and
        // re-spells numbers and escapes, and `show` must not hide what arrived.
        Ok(v) if !crate::mcp::compact_text::same_but_whitespace(body, &v.to_string()) => {
            escape(body)
        }
        // Pretty JSON escapes C0 controls, not DEL, C1 or bidi overrides.
        Ok(v) => super::tail::defang(
            &serde_json::to_string_pretty(&v).unwrap_or_default(),
            &['\n'],
        ),
        Err(_) => escape(body),
    }
}

/// `show`'s text form.
pub fn format_show(call: &serde_json::Value) -> String {
    let s = |k: &str| call[k].as_str().map(escape).unwrap_or_else(|| "-".into());
    let i = |k: &str| call[k].as_i64();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "call {}  {}  {}",
        i("id").unwrap_or(0),
        i("ts_ms").map(format_utc_ms).unwrap_or_default(),
        s("decision")
    );
    let _ = writeln!(
        out,
        "  tool       {}__{} ({}, request id {})",
        s("server_name"),
        s("tool_name"),
        s("method"),
        s("request_id")
    );
    let _ = writeln!(
        out,
        "  who        principal {}, process {}, via {}",
        s("principal"),
        s("process_name"),
        s("transport")
    );
    let _ = writeln!(
        out,
        "  policy     rule {}: {}",
        s("policy_rule"),
        s("policy_reason")
    );
    if call["approved_by"].is_string() {
        let _ = writeln!(
            out,
            "  approval   {} at {}",
            s("approved_by"),
            i("decided_at_ms")
                .map(format_utc_ms)
                .unwrap_or_else(|| "-".into())
        );
    }
    let duration = i("duration_us").map_or("- (no outcome recorded)".into(), |us| {
        format!("{}.{:03} ms", us / 1000, us % 1000)
    });
    let _ = writeln!(out, "  duration   {duration}");
    let _ = writeln!(
        out,
        "  bytes      in {}, out {}",
        i("bytes_received").map_or("-".into(), |b| b.to_string()),
        i("bytes_sent").map_or("-".into(), |b| b.to_string())
    );
    if call["error_message"].is_string() {
        let _ = writeln!(out, "  error      {}", s("error_message"));
    }
    for rule in call["rules"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "  rule       {} #{} {} {} ({}) at {}",
            escape(rule["phase"].as_str().unwrap_or("")),
            rule["seq"],
            escape(rule["rule_id"].as_str().unwrap_or("")),
            escape(rule["action"].as_str().unwrap_or("")),
            escape(rule["layer"].as_str().unwrap_or("")),
            rule["ts_ms"]
                .as_i64()
                .map(format_utc_ms)
                .unwrap_or_default()
        );
    }
    let _ = writeln!(
        out,
        "  chain      {}",
        call["chain"].as_str().unwrap_or("-")
    );
    let bodies = &call["bodies"];
    for (label, key, truncated) in [
        ("arguments", "arguments", Some("arguments_truncated")),
        (
            "rewritten arguments (what the tool got)",
            "rewritten_arguments",
            None,
        ),
        (
            "response (what the agent got)",
            "response",
            Some("response_truncated"),
        ),
        (
            "original response (what the tool answered)",
            "original_response",
            None,
        ),
    ] {
        if let Some(body) = bodies[key].as_str() {
            let cut = truncated.is_some_and(|t| bodies[t] == true);
            let _ = writeln!(
                out,
                "  {label}{}:",
                if cut { " (cut at body_cap_bytes)" } else { "" }
            );
            for line in body_text(body).lines() {
                let _ = writeln!(out, "    {line}");
            }
        }
    }
    out
}

/// Approximate quantiles from a log histogram: 16 buckets per doubling (±2.2%).
#[derive(Default, Clone)]
struct Latencies {
    buckets: Vec<u64>,
    count: u64,
}

impl Latencies {
    fn bucket(us: i64) -> usize {
        let us = us.max(1) as f64;
        (us.log2() * 16.0) as usize
    }

    fn add(&mut self, us: i64) {
        let b = Self::bucket(us);
        if self.buckets.len() <= b {
            self.buckets.resize(b + 1, 0);
        }
        self.buckets[b] += 1;
        self.count += 1;
    }

    /// The `q` quantile in microseconds (the middle of its bucket).
    fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = ((self.count as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (b, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(2f64.powf((b as f64 + 0.5) / 16.0));
            }
        }
        None
    }
}

#[derive(Default, Clone)]
struct Tally {
    calls: u64,
    /// A handful of decision values: a short list beats a map.
    by_decision: Vec<(Vec<u8>, u64)>,
    latencies: Latencies,
}

impl Tally {
    fn add(&mut self, decision: &[u8], duration: Option<i64>) {
        self.calls += 1;
        match self.by_decision.iter_mut().find(|(d, _)| d == decision) {
            Some((_, n)) => *n += 1,
            None => self.by_decision.push((decision.to_vec(), 1)),
        }
        if let Some(us) = duration {
            self.latencies.add(us);
        }
    }
}

/// The tally of `key`, without allocating when it exists (every row of the window goes
/// through here).
fn bump<'a>(map: &'a mut HashMap<Vec<u8>, Tally>, key: &[u8]) -> &'a mut Tally {
    let key: &[u8] = if map.len() >= MAX_GROUPS && !map.contains_key(key) {
        b"(other)"
    } else {
        key
    };
    if !map.contains_key(key) {
        map.insert(key.to_vec(), Tally::default());
    }
    map.get_mut(key).expect("inserted above")
}

/// `ledger stats`: calls by tool, decision and principal in a time window, the rules that
/// blocked most, and p50/p99 duration per tool.
pub fn stats(
    conn: &Connection,
    since_ms: i64,
    until_ms: Option<i64>,
) -> rusqlite::Result<serde_json::Value> {
    conn.execute_batch("BEGIN")?;
    let result = (|| {
        let (lo, hi) = id_range(conn, Some(since_ms), until_ms)?;
        let until = until_ms.unwrap_or(i64::MAX);
        let mut by_tool: HashMap<Vec<u8>, Tally> = HashMap::new();
        let mut by_principal: HashMap<Vec<u8>, Tally> = HashMap::new();
        let mut all = Tally::default();
        let mut tool_key = Vec::with_capacity(128);
        let mut stmt = conn.prepare(
            "SELECT server_name, tool_name, principal, decision, duration_us FROM tool_calls \
             WHERE id BETWEEN ?1 AND ?2 AND ts_ms >= ?3 AND ts_ms <= ?4",
        )?;
        let mut rows = stmt.query(rusqlite::params![lo, hi, since_ms, until])?;
        while let Some(r) = rows.next()? {
            let bytes = |i: usize| -> &[u8] {
                match r.get_ref(i) {
                    Ok(ValueRef::Text(t)) => t,
                    _ => b"",
                }
            };
            let decision = bytes(3);
            let duration: Option<i64> = r.get(4)?;
            tool_key.clear();
            tool_key.extend_from_slice(bytes(0));
            tool_key.extend_from_slice(b"__");
            tool_key.extend_from_slice(bytes(1));
            all.add(decision, None);
            bump(&mut by_tool, &tool_key).add(decision, duration);
            bump(&mut by_principal, bytes(2)).add(decision, duration);
        }
        let mut blocking = Vec::new();
        let mut stmt = conn.prepare(
            "SELECT rule_id, count(*) FROM security_rule_events \
             WHERE call_id BETWEEN ?1 AND ?2 AND action = 'block' \
             GROUP BY rule_id ORDER BY 2 DESC, 1 LIMIT 20",
        )?;
        let mut rows = stmt.query([lo, hi])?;
        while let Some(r) = rows.next()? {
            blocking.push(serde_json::json!({"rule_id": r.get::<_, String>(0)?, "calls": r.get::<_, i64>(1)?}));
        }
        let decisions = |t: &Tally| -> serde_json::Map<String, serde_json::Value> {
            t.by_decision
                .iter()
                .map(|(d, n)| (String::from_utf8_lossy(d).into_owned(), (*n).into()))
                .collect()
        };
        let tallies = |map: HashMap<Vec<u8>, Tally>| {
            let mut list: Vec<(String, Tally)> = map
                .into_iter()
                .map(|(k, t)| (String::from_utf8_lossy(&k).into_owned(), t))
                .collect();
            list.sort_by(|a, b| b.1.calls.cmp(&a.1.calls).then(a.0.cmp(&b.0)));
            list.into_iter()
                .map(|(name, t)| {
                    serde_json::json!({
                        "name": name,
                        "calls": t.calls,
                        "by_decision": decisions(&t),
                        "p50_ms": t.latencies.quantile(0.5).map(|us| (us / 10.0).round() / 100.0),
                        "p99_ms": t.latencies.quantile(0.99).map(|us| (us / 10.0).round() / 100.0),
                    })
                })
                .collect::<Vec<_>>()
        };
        Ok(serde_json::json!({
            "since_ms": since_ms,
            "until_ms": until_ms,
            "calls": all.calls,
            "by_decision": decisions(&all),
            "by_tool": tallies(by_tool),
            "by_principal": tallies(by_principal),
            "top_blocking_rules": blocking,
        }))
    })();
    let _ = conn.execute_batch("COMMIT");
    result
}

/// `stats`' text form.
pub fn format_stats(stats: &serde_json::Value) -> String {
    let mut out = String::new();
    let since = stats["since_ms"]
        .as_i64()
        .map(format_utc_ms)
        .unwrap_or_default();
    let until = stats["until_ms"]
        .as_i64()
        .map_or("now".into(), format_utc_ms);
    let decisions = |v: &serde_json::Value| {
        let mut parts: Vec<(String, u64)> = v
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, n)| (k.clone(), n.as_u64().unwrap_or(0)))
            .collect();
        parts.sort();
        parts
            .into_iter()
            .map(|(k, n)| format!("{} {n}", escape(&k)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        out,
        "calls from {since} to {until}: {} ({})",
        stats["calls"],
        decisions(&stats["by_decision"])
    );
    for (title, key) in [("by tool", "by_tool"), ("by principal", "by_principal")] {
        let list = stats[key].as_array().cloned().unwrap_or_default();
        if list.is_empty() {
            continue;
        }
        let width = list
            .iter()
            .map(|t| escape(t["name"].as_str().unwrap_or("")).chars().count())
            .max()
            .unwrap_or(0)
            .clamp(4, CELL_MAX);
        let _ = writeln!(out, "{title}:");
        let _ = writeln!(
            out,
            "  {:<width$}  {:>8}  {:>9}  {:>9}  decisions",
            "NAME", "CALLS", "P50 MS", "P99 MS"
        );
        for t in list {
            let ms = |k: &str| t[k].as_f64().map_or("-".into(), |v| format!("{v:.2}"));
            let _ = writeln!(
                out,
                "  {:<width$}  {:>8}  {:>9}  {:>9}  {}",
                cell(t["name"].as_str().unwrap_or("")),
                t["calls"],
                ms("p50_ms"),
                ms("p99_ms"),
                decisions(&t["by_decision"])
            );
        }
    }
    let blocking = stats["top_blocking_rules"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !blocking.is_empty() {
        let _ = writeln!(out, "top blocking rules:");
        for r in blocking {
            let _ = writeln!(
                out,
                "  {:>8}  {}",
                r["calls"],
                escape(r["rule_id"].as_str().unwrap_or(""))
            );
        }
    }
    out
}

#[cfg(test)]
mod body_text_tests {
    use super::body_text;

    #[test]
    fn show_prints_what_is_stored_when_a_parse_would_change_it() {
        // Duplicate keys and a long number: shown as stored, not as parsed.
        let dup = r#"{"text":"a","text":"b"}"#;
        let shown = body_text(dup);
        assert!(
            shown.contains(r#"\"a\""#) && shown.contains(r#"\"b\""#),
            "{shown}"
        );
        let big = r#"{"n":12345678901234567890123}"#;
        assert!(body_text(big).contains("12345678901234567890123"));
        // A faithful parse is pretty-printed.
        assert_eq!(body_text(r#"{"a": 1}"#), "{\n  \"a\": 1\n}");
    }
}
