//! The client's file after the import, sans-IO: the imported servers taken out, one
//! `toolwall` entry in (the relay to the daemon's unix socket when the relay is installed
//! beside this binary, else `toolwall stdio --config CONFIG`), and the diff shown to the
//! operator. JSON files are written back with their keys sorted; TOML files without their
//! comments (the backup keeps the original).

use serde_json::{Value, json};
use std::path::Path;

use super::clients::ClientKind;
use crate::config::Config;

/// The one entry that replaces the imported servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub command: String,
    pub args: Vec<String>,
}

/// How the client reaches toolwall: the relay to the daemon when both exist, else
/// `toolwall stdio` with the config.
pub fn toolwall_entry(config: &Config, config_path: Option<&Path>) -> Entry {
    let exe = std::env::current_exe().unwrap_or_else(|_| "toolwall".into());
    let relay = exe.with_file_name("toolwall-relay");
    let unix = config
        .listen
        .unix
        .as_ref()
        .filter(|p| !p.as_os_str().is_empty());
    if let (true, Some(sock)) = (relay.is_file(), unix) {
        let sock = std::fs::canonicalize(sock).unwrap_or_else(|_| sock.clone());
        return Entry {
            command: relay.display().to_string(),
            args: vec!["--connect".into(), format!("unix:{}", sock.display())],
        };
    }
    let mut args = vec!["stdio".to_string()];
    if let Some(p) = config_path {
        args.push("--config".into());
        args.push(
            std::fs::canonicalize(p)
                .unwrap_or_else(|_| p.to_path_buf())
                .display()
                .to_string(),
        );
    }
    Entry {
        command: exe.display().to_string(),
        args,
    }
}

fn remove_at(doc: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = doc;
    for p in parents {
        match cur.get_mut(p) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if let Some(m) = cur.as_object_mut() {
        m.remove(last);
    }
}

/// `text` (the client's file) without the servers at `imported`, with the `toolwall`
/// entry.
pub fn rewrite(
    kind: ClientKind,
    name: &str,
    text: &str,
    imported: &[Vec<String>],
    entry: &Entry,
) -> Result<String, String> {
    if kind == ClientKind::Codex {
        let table: toml::Table = toml::from_str(text).map_err(|e| format!("{name}: {e}"))?;
        let mut doc = serde_json::to_value(&table).map_err(|e| format!("{name}: {e}"))?;
        for path in imported {
            remove_at(&mut doc, path);
        }
        doc["mcp_servers"]["toolwall"] = json!({"command": entry.command, "args": entry.args});
        let back: toml::Table = serde_json::from_value(doc).map_err(|e| format!("{name}: {e}"))?;
        return toml::to_string(&back).map_err(|e| format!("{name}: {e}"));
    }
    let mut doc: Value = serde_json::from_str(text).map_err(|e| format!("{name}: {e}"))?;
    for path in imported {
        remove_at(&mut doc, path);
    }
    let (list, value) = match kind {
        ClientKind::VsCode => (
            "servers",
            json!({"type": "stdio", "command": entry.command, "args": entry.args}),
        ),
        _ => (
            "mcpServers",
            json!({"command": entry.command, "args": entry.args}),
        ),
    };
    if !doc[list].is_object() {
        doc[list] = json!({});
    }
    doc[list]["toolwall"] = value;
    let mut out = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
    out.push('\n');
    Ok(out)
}

/// `text` with every value of `secrets`, and every quoted string that looks like a
/// credential, shown as `<redacted>`: a diff of a client's file shows the entries it
/// loses, secrets included.
pub fn redact_secrets(text: &str, secrets: &[&str]) -> String {
    let mut out = text.to_owned();
    for s in secrets.iter().filter(|s| !s.is_empty()) {
        out = out.replace(s, "<redacted>");
    }
    out.lines()
        .map(|line| {
            let parts: Vec<&str> = line.split('"').collect();
            parts
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    // Odd pieces are inside quotes.
                    if i % 2 == 1 && crate::stdio_server::config::looks_like_secret(p) {
                        "<redacted>"
                    } else {
                        p
                    }
                })
                .collect::<Vec<_>>()
                .join("\"")
        })
        .map(|l| l + "\n")
        .collect()
}

/// Most line pairs compared for a diff (larger files get a summary instead).
const MAX_DIFF_CELLS: usize = 4_000_000;

/// A line diff of `old` and `new`: `-` and `+` lines with two lines of context.
pub fn diff(old: &str, new: &str) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    if a.len().saturating_mul(b.len()) > MAX_DIFF_CELLS {
        return format!(
            "(the files are too large to diff here: {} lines before, {} after; compare with the backup)\n",
            a.len(),
            b.len()
        );
    }
    // Longest common subsequence, then walk it.
    let mut lcs = vec![vec![0u32; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut ops: Vec<(char, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            ops.push((' ', a[i]));
            i += 1;
            j += 1;
        } else if j < b.len() && (i == a.len() || lcs[i][j + 1] > lcs[i + 1][j]) {
            ops.push(('+', b[j]));
            j += 1;
        } else {
            ops.push(('-', a[i]));
            i += 1;
        }
    }
    let near = |k: usize| {
        ops[k.saturating_sub(2)..(k + 3).min(ops.len())]
            .iter()
            .any(|(c, _)| *c != ' ')
    };
    let mut out = String::new();
    let mut skipped = false;
    for (k, (c, line)) in ops.iter().enumerate() {
        if *c == ' ' && !near(k) {
            skipped = true;
            continue;
        }
        if skipped {
            out.push_str("@@\n");
            skipped = false;
        }
        out.push(*c);
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::import::clients::parse;

    #[test]
    fn imported_servers_give_way_to_one_toolwall_entry() {
        let text = r#"{"mcpServers": {"fs": {"command": "x"}, "keep": {"command": "y", "args": ["--token=sk-live-abcdefghij0123456789"]}}, "other": 1}"#;
        let (kind, f) = parse(".mcp.json", text).unwrap();
        let entry = Entry {
            command: "/usr/local/bin/toolwall-relay".into(),
            args: vec!["--connect".into(), "unix:/run/toolwall/mcp.sock".into()],
        };
        let imported = vec![f.servers[0].path.clone()];
        let out = rewrite(kind, ".mcp.json", text, &imported, &entry).unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        assert!(v["mcpServers"].get("fs").is_none());
        assert!(v["mcpServers"].get("keep").is_some(), "not imported: kept");
        assert_eq!(v["mcpServers"]["toolwall"]["command"], entry.command);
        assert_eq!(v["other"], 1);
        let d = diff(text, &out);
        assert!(d.contains("+") && d.contains("toolwall-relay"), "{d}");

        let vs = r#"{"servers": {"gh": {"type": "stdio", "command": "gh"}}}"#;
        let (kind, f) = parse("mcp.json", vs).unwrap();
        let out = rewrite(kind, "mcp.json", vs, &[f.servers[0].path.clone()], &entry).unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["servers"]["toolwall"]["type"], "stdio");
        assert!(v["servers"].get("gh").is_none());

        let user = r#"{"projects": {"/p/a.b": {"mcpServers": {"x": {"command": "x"}}}}}"#;
        let (kind, f) = parse(".claude.json", user).unwrap();
        let out = rewrite(
            kind,
            ".claude.json",
            user,
            &[f.servers[0].path.clone()],
            &entry,
        )
        .unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        assert!(
            v["projects"]["/p/a.b"]["mcpServers"].get("x").is_none(),
            "{v}"
        );
        assert!(v["mcpServers"]["toolwall"].is_object());

        let codex = "model = \"m\"\n[mcp_servers.docs]\ncommand = \"uvx\"\n";
        let (kind, f) = parse("config.toml", codex).unwrap();
        let out = rewrite(
            kind,
            "config.toml",
            codex,
            &[f.servers[0].path.clone()],
            &entry,
        )
        .unwrap();
        let t: toml::Table = toml::from_str(&out).unwrap();
        assert!(t["mcp_servers"].get("docs").is_none());
        assert_eq!(
            t["mcp_servers"]["toolwall"]["command"].as_str(),
            Some(entry.command.as_str())
        );
        assert_eq!(t["model"].as_str(), Some("m"));
    }

    #[test]
    fn diffs_never_show_secrets() {
        let d = "-      \"TOKEN\": \"sk-live-abcdefghij0123456789\",\n-  \"X\": \"hunter2\"\n";
        let r = redact_secrets(d, &["hunter2"]);
        assert!(
            !r.contains("abcdefghij0123456789") && !r.contains("hunter2"),
            "{r}"
        );
        assert!(r.contains("\"TOKEN\": \"<redacted>\""), "{r}");
    }

    #[test]
    fn diffs_show_changes_with_context() {
        let d = diff("a\nb\nc\nd\ne\nf\ng\n", "a\nb\nc\nX\ne\nf\ng\n");
        assert_eq!(
            d,
            "@@\nb\nc\n-d\n+X\n e\n f\n".replace("@@\nb\nc", "@@\n b\n c")
        );
    }
}
