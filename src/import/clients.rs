//! Agent clients' MCP configs, read into one shape, sans-IO: text in, servers out.
//!
//! - Claude Code: `.mcp.json` and `~/.claude.json` (`mcpServers`, and each project's
//!   `projects.PATH.mcpServers`); Cursor: `mcp.json` (`mcpServers`): `{command, args,
//!   env, cwd}` or `{url, headers}` (`type` = `stdio`, `http`, `sse`).
//! - VS Code: `.vscode/mcp.json` (`servers`, same fields; `inputs` and `envFile` are
//!   reported, not imported).
//! - Codex: `config.toml` (`[mcp_servers.NAME]`: `command`, `args`, `env`, `cwd`, `url`,
//!   `http_headers`, `bearer_token_env_var`, `enabled`).
//!
//! Every field this does not understand is reported with where it was, never dropped
//! silently.

use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// Which client wrote the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientKind {
    /// `mcpServers` (Claude Code's `.mcp.json`, Cursor's `mcp.json`).
    McpServers,
    /// Claude Code's `~/.claude.json`, with per-project entries.
    ClaudeUser,
    /// VS Code's `.vscode/mcp.json` (`servers`).
    VsCode,
    /// Codex's `config.toml` (`[mcp_servers.NAME]`).
    Codex,
}

impl ClientKind {
    pub fn describe(self) -> &'static str {
        match self {
            ClientKind::McpServers => "an mcpServers file (Claude Code .mcp.json, Cursor mcp.json)",
            ClientKind::ClaudeUser => "Claude Code's ~/.claude.json",
            ClientKind::VsCode => "VS Code's .vscode/mcp.json",
            ClientKind::Codex => "Codex's config.toml",
        }
    }
}

/// How an imported server is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reach {
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<String>,
    },
    Http {
        url: String,
        headers: BTreeMap<String, String>,
        /// Codex's `bearer_token_env_var`: the token is in that variable of the client's
        /// environment.
        bearer_token_env: Option<String>,
    },
}

/// One server of the client's file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientServer {
    /// Where it is in the file (`mcpServers.github`, `projects./home/a/p.mcpServers.x`).
    pub at: String,
    /// The same, as keys from the top (for rewriting the file).
    pub path: Vec<String>,
    /// Its name there.
    pub name: String,
    pub reach: Reach,
    /// `enabled = false` (Codex) or `disabled: true`.
    pub disabled: bool,
    /// Fields not imported, with why (`at.field: why`).
    pub unknown: Vec<String>,
}

/// The servers of a client file, and what was not understood outside them.
#[derive(Debug, Default)]
pub struct ClientFile {
    pub servers: Vec<ClientServer>,
    pub notes: Vec<String>,
}

/// Reads `text`, taking `path` (its name) as a hint for the format.
pub fn parse(path: &str, text: &str) -> Result<(ClientKind, ClientFile), String> {
    if path.ends_with(".toml") {
        let doc: toml::Table =
            toml::from_str(text).map_err(|e| format!("{path}: not TOML: {e}"))?;
        let json = serde_json::to_value(&doc).map_err(|e| format!("{path}: {e}"))?;
        return Ok((ClientKind::Codex, codex(&json)));
    }
    let doc: Value = serde_json::from_str(text).map_err(|e| format!("{path}: not JSON: {e}"))?;
    let Some(top) = doc.as_object() else {
        return Err(format!("{path}: the top level is not a JSON object"));
    };
    if top.contains_key("projects") && !top.contains_key("servers") {
        let mut out = ClientFile::default();
        if let Some(m) = top.get("mcpServers") {
            entries(m, "mcpServers", &["mcpServers"], &mut out);
        }
        if let Some(projects) = top.get("projects").and_then(Value::as_object) {
            for (project, p) in projects {
                if let Some(m) = p.get("mcpServers") {
                    entries(
                        m,
                        &format!("projects.{project}.mcpServers"),
                        &["projects", project, "mcpServers"],
                        &mut out,
                    );
                }
            }
        }
        return Ok((ClientKind::ClaudeUser, out));
    }
    if let Some(m) = top.get("mcpServers") {
        let mut out = ClientFile::default();
        entries(m, "mcpServers", &["mcpServers"], &mut out);
        for key in top.keys().filter(|k| *k != "mcpServers") {
            out.notes
                .push(format!("{key}: not an MCP server list, left alone"));
        }
        return Ok((ClientKind::McpServers, out));
    }
    if let Some(m) = top.get("servers") {
        let mut out = ClientFile::default();
        entries(m, "servers", &["servers"], &mut out);
        for key in top.keys().filter(|k| *k != "servers") {
            let why = if key == "inputs" {
                "VS Code prompts for these values; toolwall cannot, so servers using ${input:...} need their values in secret_env files"
            } else {
                "not an MCP server list"
            };
            out.notes.push(format!("{key}: {why}"));
        }
        return Ok((ClientKind::VsCode, out));
    }
    Err(format!(
        "{path}: neither mcpServers (Claude Code, Cursor), servers (VS Code), projects (~/.claude.json) nor [mcp_servers] (Codex, a .toml file)"
    ))
}

fn entries(list: &Value, at: &str, path: &[&str], out: &mut ClientFile) {
    let Some(list) = list.as_object() else {
        out.notes
            .push(format!("{at}: not an object, nothing imported from it"));
        return;
    };
    for (name, entry) in list {
        let here = format!("{at}.{name}");
        match entry.as_object() {
            Some(e) => match json_server(&here, name, e) {
                Ok(mut s) => {
                    s.path = path.iter().map(|p| p.to_string()).collect();
                    s.path.push(name.clone());
                    out.servers.push(s)
                }
                Err(why) => out.notes.push(format!("{here}: not imported: {why}")),
            },
            None => out
                .notes
                .push(format!("{here}: not an object, not imported")),
        }
    }
}

fn strings(v: Option<&Value>) -> Result<Vec<String>, String> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| "an argument is not a string".to_string())
            })
            .collect(),
        Some(_) => Err("args is not a list".into()),
    }
}

fn string_map(v: Option<&Value>, what: &str) -> Result<BTreeMap<String, String>, String> {
    match v {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                Value::Number(n) => Ok((k.clone(), n.to_string())),
                Value::Bool(b) => Ok((k.clone(), b.to_string())),
                _ => Err(format!("{what}.{k} is not a string")),
            })
            .collect(),
        Some(_) => Err(format!("{what} is not an object")),
    }
}

/// The fields a JSON client entry may have; the others are reported.
const JSON_FIELDS: &[&str] = &[
    "command", "args", "env", "cwd", "type", "url", "headers", "disabled",
];

fn json_server(at: &str, name: &str, e: &Map<String, Value>) -> Result<ClientServer, String> {
    let mut unknown: Vec<String> = e
        .keys()
        .filter(|k| !JSON_FIELDS.contains(&k.as_str()))
        .map(|k| {
            let why = match k.as_str() {
                "envFile" => "an env file is not read: put its variables in env or secret_env",
                "alwaysAllow" | "autoApprove" => "toolwall's policy decides (allow rules)",
                "timeout" => "use timeout_secs",
                _ => "not understood",
            };
            format!("{at}.{k}: {why}")
        })
        .collect();
    let kind = e.get("type").and_then(Value::as_str).unwrap_or("");
    let disabled = e.get("disabled").and_then(Value::as_bool) == Some(true);
    let reach = if let Some(url) = e.get("url").and_then(Value::as_str) {
        if kind == "sse" {
            unknown.push(format!(
                "{at}.type: sse (the old HTTP+SSE transport): imported as Streamable HTTP at the same URL; check the server speaks it"
            ));
        }
        Reach::Http {
            url: url.to_owned(),
            headers: string_map(e.get("headers"), "headers")?,
            bearer_token_env: None,
        }
    } else if let Some(command) = e.get("command").and_then(Value::as_str) {
        Reach::Stdio {
            command: command.to_owned(),
            args: strings(e.get("args"))?,
            env: string_map(e.get("env"), "env")?,
            cwd: e.get("cwd").and_then(Value::as_str).map(str::to_owned),
        }
    } else {
        return Err("neither command nor url".into());
    };
    Ok(ClientServer {
        at: at.to_owned(),
        path: Vec::new(),
        name: name.to_owned(),
        reach,
        disabled,
        unknown,
    })
}

const CODEX_FIELDS: &[&str] = &[
    "command",
    "args",
    "env",
    "cwd",
    "url",
    "http_headers",
    "bearer_token_env_var",
    "enabled",
];

fn codex(doc: &Value) -> ClientFile {
    let mut out = ClientFile::default();
    let Some(list) = doc.get("mcp_servers").and_then(Value::as_object) else {
        out.notes
            .push("no [mcp_servers] tables: nothing to import".into());
        return out;
    };
    for (name, entry) in list {
        let at = format!("mcp_servers.{name}");
        let Some(e) = entry.as_object() else {
            out.notes.push(format!("{at}: not a table, not imported"));
            continue;
        };
        let unknown: Vec<String> = e
            .keys()
            .filter(|k| !CODEX_FIELDS.contains(&k.as_str()))
            .map(|k| {
                let why = match k.as_str() {
                    "startup_timeout_sec" => "use start_timeout_secs",
                    "tool_timeout_sec" => "use timeout_secs",
                    "env_vars" => "variables passed from the client's environment: use secret_env_from for secrets, env for the rest",
                    "enabled_tools" | "disabled_tools" => "toolwall's policy decides (block rules)",
                    _ => "not understood",
                };
                format!("{at}.{k}: {why}")
            })
            .collect();
        let disabled = e.get("enabled").and_then(Value::as_bool) == Some(false);
        let reach = if let Some(url) = e.get("url").and_then(Value::as_str) {
            match string_map(e.get("http_headers"), "http_headers") {
                Ok(headers) => Reach::Http {
                    url: url.to_owned(),
                    headers,
                    bearer_token_env: e
                        .get("bearer_token_env_var")
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                },
                Err(why) => {
                    out.notes.push(format!("{at}: not imported: {why}"));
                    continue;
                }
            }
        } else if let Some(command) = e.get("command").and_then(Value::as_str) {
            match (strings(e.get("args")), string_map(e.get("env"), "env")) {
                (Ok(args), Ok(env)) => Reach::Stdio {
                    command: command.to_owned(),
                    args,
                    env,
                    cwd: e.get("cwd").and_then(Value::as_str).map(str::to_owned),
                },
                (Err(why), _) | (_, Err(why)) => {
                    out.notes.push(format!("{at}: not imported: {why}"));
                    continue;
                }
            }
        } else {
            out.notes
                .push(format!("{at}: not imported: neither command nor url"));
            continue;
        };
        out.servers.push(ClientServer {
            path: vec!["mcp_servers".into(), name.clone()],
            at,
            name: name.clone(),
            reach,
            disabled,
            unknown,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_format_reads_into_one_shape() {
        let claude = r#"{"mcpServers": {
            "fs": {"command": "npx", "args": ["-y", "pkg", "/srv"], "env": {"A": "b"}},
            "remote": {"type": "http", "url": "https://mcp.example.com/mcp",
                       "headers": {"Authorization": "Bearer x"}, "alwaysAllow": ["t"]}}}"#;
        let (kind, f) = parse(".mcp.json", claude).unwrap();
        assert_eq!(kind, ClientKind::McpServers);
        assert_eq!(f.servers.len(), 2);
        assert!(matches!(&f.servers[0].reach, Reach::Stdio { command, .. } if command == "npx"));
        assert_eq!(f.servers[1].unknown.len(), 1, "{:?}", f.servers[1].unknown);
        assert!(f.servers[1].unknown[0].contains("mcpServers.remote.alwaysAllow"));

        let user = r#"{"numStartups": 3, "mcpServers": {"a": {"command": "x"}},
            "projects": {"/home/u/p": {"mcpServers": {"b": {"command": "y"}}, "history": []}}}"#;
        let (kind, f) = parse("/home/u/.claude.json", user).unwrap();
        assert_eq!(kind, ClientKind::ClaudeUser);
        assert_eq!(
            f.servers.iter().map(|s| s.at.as_str()).collect::<Vec<_>>(),
            vec!["mcpServers.a", "projects./home/u/p.mcpServers.b"]
        );

        let vscode = r#"{"inputs": [{"id": "k"}], "servers": {"gh": {"type": "stdio",
            "command": "gh-mcp", "envFile": ".env"}}}"#;
        let (kind, f) = parse(".vscode/mcp.json", vscode).unwrap();
        assert_eq!(kind, ClientKind::VsCode);
        assert!(f.notes.iter().any(|n| n.starts_with("inputs:")));
        assert!(f.servers[0].unknown[0].contains("envFile"));

        let codex = "[mcp_servers.docs]\ncommand = \"uvx\"\nargs = [\"docs-mcp\"]\nstartup_timeout_sec = 20\n\n[mcp_servers.web]\nurl = \"https://x.example/mcp\"\nbearer_token_env_var = \"WEB_TOKEN\"\nenabled = false\n";
        let (kind, f) = parse("config.toml", codex).unwrap();
        assert_eq!(kind, ClientKind::Codex);
        assert_eq!(f.servers.len(), 2);
        assert!(f.servers[0].unknown[0].contains("startup_timeout_sec"));
        assert!(f.servers[1].disabled);
        assert!(
            matches!(&f.servers[1].reach, Reach::Http { bearer_token_env: Some(v), .. } if v == "WEB_TOKEN")
        );

        assert!(parse("x.json", "[]").is_err());
        assert!(parse("x.json", "{\"other\": 1}").is_err());
        assert!(parse("x.json", "not json").is_err());
    }
}
