//! Reading recent calls for `toolwall ledger tail`: a read-only connection that never
//! blocks the gateway (WAL readers do not stop the writer).

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags, Row};
use std::fmt::Write as _;
use std::path::Path;

use super::error::{LedgerError, LedgerErrorKind};
use super::time::format_utc_ms;

const SQL_TAIL: &str = "SELECT * FROM \
    (SELECT * FROM tool_calls ORDER BY id DESC LIMIT ?1) ORDER BY id";

/// The last `n` calls, oldest first. Text: one line per call, with every agent-supplied
/// field escaped so it cannot drive the terminal. JSON: one object per line with every
/// column of `tool_calls`, in column order.
pub fn tail(path: &Path, n: usize, json: bool) -> Result<String, LedgerError> {
    let read_err = |what: &str, e: rusqlite::Error| {
        LedgerError::new(LedgerErrorKind::Read, path, format!("{what}: {e}"))
    };
    if !path.exists() {
        return Err(LedgerError::new(
            LedgerErrorKind::Read,
            path,
            "no ledger at this path (run the gateway first, or pass --ledger FILE)",
        ));
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| read_err("open read-only", e))?;
    let mut stmt = conn
        .prepare(SQL_TAIL)
        .map_err(|e| read_err("reading tool_calls", e))?;
    let columns: Vec<String> = stmt.column_names().map(str::to_owned).collect();
    let limit = i64::try_from(n).unwrap_or(i64::MAX);
    let mut rows = stmt
        .query([limit])
        .map_err(|e| read_err("reading tool_calls", e))?;
    let mut out = String::new();
    while let Some(row) = rows.next().map_err(|e| read_err("reading tool_calls", e))? {
        if json {
            json_line(row, &columns, &mut out);
        } else {
            text_line(row, &mut out).map_err(|e| read_err("reading tool_calls", e))?;
        }
        out.push('\n');
    }
    Ok(out)
}

fn json_line(row: &Row, columns: &[String], out: &mut String) {
    out.push('{');
    for (index, name) in columns.iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        let value = match row.get_ref(index) {
            Ok(ValueRef::Integer(i)) => serde_json::Value::from(i),
            Ok(ValueRef::Real(f)) => serde_json::Value::from(f),
            Ok(ValueRef::Text(t)) => serde_json::Value::from(String::from_utf8_lossy(t)),
            // tool_calls has no BLOB column; should one appear, print it as hex.
            Ok(ValueRef::Blob(b)) => {
                serde_json::Value::from(b.iter().fold(String::new(), |mut hex, byte| {
                    let _ = write!(hex, "{byte:02x}");
                    hex
                }))
            }
            Ok(ValueRef::Null) | Err(_) => serde_json::Value::Null,
        };
        // Serialising a string or a Value into a String cannot fail.
        let _ = write!(out, "{}:{}", serde_json::Value::from(name.as_str()), value);
    }
    out.push('}');
}

fn text_line(row: &Row, out: &mut String) -> rusqlite::Result<()> {
    let text = |name: &str| -> rusqlite::Result<Option<String>> { row.get(name) };
    let int = |name: &str| -> rusqlite::Result<Option<i64>> { row.get(name) };
    let id: i64 = row.get("id")?;
    let ts_ms: i64 = row.get("ts_ms")?;
    let decision = text("decision")?.unwrap_or_default();
    let _ = write!(
        out,
        "{} #{id} {:<7}",
        format_utc_ms(ts_ms),
        escape(&decision)
    );
    for name in ["transport", "principal", "process_name"] {
        let _ = write!(out, " {}", escape(&text(name)?.unwrap_or_default()));
    }
    let method = text("method")?.unwrap_or_default();
    if method != "tools/call" {
        let _ = write!(out, " {}", escape(&method));
    }
    let server = text("server_name")?.unwrap_or_default();
    let tool = text("tool_name")?.unwrap_or_default();
    let _ = write!(out, " {}__{}", escape(&server), escape(&tool));
    match int("duration_us")? {
        Some(us) => {
            let _ = write!(out, " {}.{:03}ms", us / 1000, us % 1000);
        }
        None => out.push_str(" -"),
    }
    let received = int("bytes_received")?.unwrap_or(0);
    match int("bytes_sent")? {
        Some(sent) => {
            let _ = write!(out, " in={received}B out={sent}B");
        }
        None => {
            let _ = write!(out, " in={received}B");
        }
    }
    for (label, name) in [
        ("rule", "policy_rule"),
        ("reason", "policy_reason"),
        ("approved_by", "approved_by"),
        ("error", "error_message"),
    ] {
        if let Some(value) = text(name)? {
            let _ = write!(out, " {label}={}", escape(&value));
        }
    }
    Ok(())
}

/// A field as printed in text mode: as is when it is made only of visible characters,
/// else quoted with every control, space-like, format or non-ASCII-graphic symbol escaped
/// as `\u{..}` (ANSI escapes and bidi overrides included).
pub(crate) fn escape(value: &str) -> String {
    let plain = |c: char| c.is_ascii_graphic() && c != '"' && c != '\\' || c.is_alphanumeric();
    if !value.is_empty() && value.chars().all(plain) {
        return value.to_owned();
    }
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            ' ' => out.push(' '),
            c if plain(c) => out.push(c),
            c => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn plain_fields_print_as_is() {
        assert_eq!(escape("uid:1000"), "uid:1000");
        assert_eq!(escape("café"), "café");
    }

    #[test]
    fn terminal_controls_are_escaped() {
        assert_eq!(escape("a\u{1b}[31mb"), "\"a\\u{1b}[31mb\"");
        assert_eq!(escape("x\u{202e}y"), "\"x\\u{202e}y\"");
        assert_eq!(escape("two words"), "\"two words\"");
        assert_eq!(escape(""), "\"\"");
        assert_eq!(escape("q\"\\"), "\"q\\\"\\\\\"");
    }
}
