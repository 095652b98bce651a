//! Client servers into `[servers.NAME]` tables, sans-IO: the TOML text, and the secrets to
//! write into files (the caller writes them, 0600) — never a secret in the text.
//!
//! A stdio server becomes a local server (`command`, `env`, `secret_env`, `read_paths` for
//! the absolute paths it is given); an HTTP one a url server (`url`, `headers`,
//! `bearer_token_file`). A value that looks like a credential (by its variable's or
//! header's name, or its form) goes to a file; `${env:VAR}` and `${VAR}` become
//! `secret_env_from`. What cannot be carried over is said in a comment above the table
//! and in the notes; a table toolwall would refuse is printed commented out, with why.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::clients::{ClientServer, Reach};
use crate::aggregator::inline_secret;
use crate::mcp::catalog::{GATEWAY_SERVER, LOCAL_SERVER, valid_server_name};

/// One converted server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Converted {
    pub name: String,
    /// Where it came from in the client's file.
    pub at: String,
    /// The same, as keys from the top.
    pub path: Vec<String>,
    /// The `[servers.NAME]` table (comments first).
    pub toml: String,
    /// Files to write: path, content.
    pub secrets: Vec<(PathBuf, String)>,
    /// What was not carried over, or needs a look.
    pub notes: Vec<String>,
    /// Printed commented out: toolwall would refuse it as it is.
    pub refused: bool,
}

/// A toolwall server name for `name`: lower case, `[a-z0-9_-]`, no `__`, not reserved,
/// not in `taken` (then `-2`, `-3`, ...).
pub fn server_name(name: &str, taken: &BTreeSet<String>) -> String {
    let mut base: String = name
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    while base.contains("__") {
        base = base.replace("__", "_");
    }
    let base = base.trim_matches('-').to_owned();
    let mut base = if base.is_empty() {
        "server".into()
    } else {
        base
    };
    if [
        LOCAL_SERVER,
        GATEWAY_SERVER,
        crate::workspace::tools::SERVER,
    ]
    .contains(&base.as_str())
    {
        base.push_str("-imported");
    }
    let mut candidate = base.clone();
    let mut n = 2;
    while taken.contains(&candidate) || !valid_server_name(&candidate) {
        candidate = format!("{base}-{n}");
        n += 1;
    }
    candidate
}

/// A TOML string.
fn q(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

/// A TOML key: bare when it may be.
fn key(k: &str) -> String {
    if !k.is_empty()
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        k.to_owned()
    } else {
        q(k)
    }
}

fn inline(map: &BTreeMap<String, String>) -> String {
    let items: Vec<String> = map
        .iter()
        .map(|(k, v)| format!("{} = {}", key(k), q(v)))
        .collect();
    format!("{{ {} }}", items.join(", "))
}

fn list(items: &[String]) -> String {
    format!(
        "[{}]",
        items.iter().map(|s| q(s)).collect::<Vec<_>>().join(", ")
    )
}

/// `${env:VAR}` or `${VAR}`: the variable's name.
fn env_reference(value: &str) -> Option<&str> {
    let inner = value.strip_prefix("${")?.strip_suffix('}')?;
    let var = inner.strip_prefix("env:").unwrap_or(inner);
    crate::stdio_server::config::valid_env_name(var).then_some(var)
}

fn secret_value(var: &str, value: &str) -> bool {
    (inline_secret::key_suggests_secret(var) && !value.is_empty())
        || crate::stdio_server::config::looks_like_secret(value)
}

const SYSTEM_DIRS: &[&str] = &["/usr", "/bin", "/lib", "/lib64", "/etc", "/sbin"];

/// Directories a local server needs to read for the absolute paths it is given (its
/// program outside the system directories, its arguments, its working directory).
fn read_paths_for(command: &str, args: &[String], cwd: Option<&str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut add = |p: &Path| {
        let s = p.display().to_string();
        if SYSTEM_DIRS.iter().any(|d| p.starts_with(d)) || p == Path::new("/") {
            return;
        }
        if !out.contains(&s) {
            out.push(s);
        }
    };
    let abs = |s: &str| Path::new(s).is_absolute().then(|| PathBuf::from(s));
    for candidate in std::iter::once(command)
        .chain(args.iter().map(String::as_str))
        .chain(cwd)
        .filter_map(abs)
    {
        match std::fs::metadata(&candidate) {
            Ok(m) if m.is_dir() => add(&candidate),
            Ok(_) => {
                if let Some(parent) = candidate.parent() {
                    add(parent);
                }
            }
            Err(_) => {}
        }
    }
    out
}

/// Text for a `#` comment: control characters (line breaks above all) and the Unicode
/// line and paragraph separators are written out as escapes, so the comment stays one line.
pub fn comment_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}' | '\u{85}') {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

/// A line of a table that is printed commented out (toolwall would refuse it), with any
/// value that looks like a credential left out: a comment is still in the file.
fn without_credential(line: &str) -> String {
    let holds = match line.parse::<toml::Table>() {
        Ok(t) => t.values().any(value_holds_credential),
        Err(_) => false,
    };
    match line.split_once(" = ") {
        Some((key, _)) if holds => format!("{key} = \"<left out: it holds a credential>\""),
        _ => line.to_owned(),
    }
}

fn value_holds_credential(v: &toml::Value) -> bool {
    match v {
        toml::Value::String(s) => crate::stdio_server::config::looks_like_secret(s),
        toml::Value::Array(a) => a.iter().any(value_holds_credential),
        toml::Value::Table(t) => t.values().any(value_holds_credential),
        _ => false,
    }
}

/// Converts every server of a client's file. `secrets_dir` is where their secrets go.
pub fn convert(servers: &[ClientServer], source: &str, secrets_dir: &Path) -> Vec<Converted> {
    let mut taken = BTreeSet::new();
    let mut out = Vec::new();
    for s in servers {
        let name = server_name(&s.name, &taken);
        taken.insert(name.clone());
        out.push(convert_one(s, &name, source, secrets_dir));
    }
    out
}

fn convert_one(s: &ClientServer, name: &str, source: &str, secrets_dir: &Path) -> Converted {
    let mut notes: Vec<String> = s.unknown.clone();
    let mut secrets = Vec::new();
    // An argument holding a credential cannot be moved anywhere (the program reads it
    // there): the table is refused, and the argument is not shown.
    let mut secret_argument = false;
    let mut lines: Vec<String> = Vec::new();
    let secret_file = |what: &str| secrets_dir.join(format!("{name}.{what}"));
    match &s.reach {
        Reach::Stdio {
            command,
            args,
            env,
            cwd,
        } => {
            let mut command_line = vec![command.clone()];
            command_line.extend(args.iter().cloned());
            for (i, a) in command_line.iter_mut().enumerate() {
                let value = match a.split_once('=') {
                    Some((flag, v)) if flag.starts_with('-') => v,
                    _ => a.as_str(),
                };
                if crate::stdio_server::config::looks_like_secret(value)
                    || inline_secret::key_suggests_secret(a.split('=').next().unwrap_or(""))
                        && a.contains('=')
                        && a.starts_with('-')
                {
                    notes.push(format!(
                        "{}: argument {i} looks like a credential; toolwall refuses it in a config: make the server read it from an environment variable (secret_env)",
                        s.at
                    ));
                    *a = "<a credential, left out>".into();
                    secret_argument = true;
                }
            }
            lines.push(format!("command = {}", list(&command_line)));
            let mut plain = BTreeMap::new();
            let mut secret_env = BTreeMap::new();
            let mut from_env = Vec::new();
            for (var, value) in env {
                if let Some(v) = env_reference(value) {
                    if v != var {
                        notes.push(format!(
                            "{}: env.{var} came from the client's ${{{v}}}; toolwall sets {var} from its own environment's {var} (secret_env_from): export it there",
                            s.at
                        ));
                    }
                    from_env.push(var.clone());
                } else if value.contains("${") {
                    notes.push(format!(
                        "{}: env.{var} refers to a client variable (${{...}}) toolwall does not expand; set it in the table",
                        s.at
                    ));
                    plain.insert(var.clone(), value.clone());
                } else if secret_value(var, value) {
                    let file = secret_file(var);
                    secret_env.insert(var.clone(), file.display().to_string());
                    secrets.push((file, value.clone()));
                } else {
                    plain.insert(var.clone(), value.clone());
                }
            }
            if !plain.is_empty() {
                lines.push(format!("env = {}", inline(&plain)));
            }
            if !secret_env.is_empty() {
                lines.push(format!("secret_env = {}", inline(&secret_env)));
            }
            if !from_env.is_empty() {
                lines.push(format!("secret_env_from = {}", list(&from_env)));
            }
            if let Some(cwd) = cwd {
                lines.push(format!("cwd = {}", q(cwd)));
            }
            let reads = read_paths_for(command, args, cwd.as_deref());
            if !reads.is_empty() {
                lines.push(format!("read_paths = {}", list(&reads)));
            }
            let fetcher = ["npx", "uvx", "bunx", "pipx", "pnpx"]
                .iter()
                .any(|f| Path::new(command).file_name() == Some(std::ffi::OsStr::new(f)));
            if fetcher {
                lines.push(
                    "# network = [443]   # the package manager downloads the server at start: grant it, or install the package beforehand"
                        .into(),
                );
            }
            lines.push(
                "# write_paths = []   # the server writes only its private state directory unless granted more"
                    .into(),
            );
        }
        Reach::Http {
            url,
            headers,
            bearer_token_env,
        } => {
            lines.push(format!("url = {}", q(url)));
            let mut plain = BTreeMap::new();
            for (h, v) in headers {
                let lower = h.to_ascii_lowercase();
                if lower == "authorization" {
                    let token = v
                        .strip_prefix("Bearer ")
                        .or_else(|| v.strip_prefix("bearer "));
                    match token {
                        Some(t) => {
                            let file = secret_file("bearer");
                            lines.push(format!("bearer_token_file = {}", q(&file.display().to_string())));
                            secrets.push((file, t.trim().to_owned()));
                        }
                        None => notes.push(format!(
                            "{}: headers.Authorization is not a bearer token; toolwall sends only bearer tokens (bearer_token_file), so it is left out",
                            s.at
                        )),
                    }
                } else if inline_secret::header_name_suggests_secret(&lower)
                    || inline_secret::looks_like_secret(v)
                {
                    notes.push(format!(
                        "{}: headers.{h} holds a credential, which toolwall can send only as a bearer token; left out",
                        s.at
                    ));
                } else {
                    plain.insert(h.clone(), v.clone());
                }
            }
            if !plain.is_empty() {
                lines.push(format!("headers = {}", inline(&plain)));
            }
            if let Some(var) = bearer_token_env {
                lines.push(format!("bearer_token_env = {}", q(var)));
            }
        }
    }
    if s.disabled {
        lines.push("enabled = false".into());
    }
    let table = format!("[servers.{name}]\n{}\n", lines.join("\n"));
    // Would toolwall load it? If not, it is printed commented out, with why.
    let refusal = if secret_argument {
        Some("an argument holds a credential (see the note)".to_string())
    } else {
        crate::config::Config::from_toml(&table, "import")
            .err()
            .map(|e| e.to_string())
    };
    // What a client file says reaches comments only written out: a line break in a
    // server's name must not start a line of TOML.
    let mut head = format!(
        "# imported from {}: {}\n",
        comment_text(source),
        comment_text(&s.at)
    );
    for n in &notes {
        head.push_str(&format!("# note: {}\n", comment_text(n)));
    }
    let (toml, refused) = match &refusal {
        Some(why) => {
            head.push_str(&format!(
                "# NOT IMPORTED: toolwall would refuse it: {}\n",
                comment_text(why)
            ));
            let commented: String = table
                .lines()
                .map(|l| format!("# {}\n", comment_text(&without_credential(l))))
                .collect();
            (format!("{head}{commented}"), true)
        }
        None => (format!("{head}{table}"), false),
    };
    if let Some(why) = refusal {
        notes.push(format!("{}: not imported: {why}", s.at));
    }
    Converted {
        name: name.to_owned(),
        at: s.at.clone(),
        path: s.path.clone(),
        toml,
        secrets: if refused { Vec::new() } else { secrets },
        notes,
        refused,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::import::clients::parse;

    #[test]
    fn names_become_toolwall_names() {
        let taken: BTreeSet<String> = ["github".to_string()].into();
        assert_eq!(server_name("GitHub", &taken), "github-2");
        assert_eq!(server_name("my server__x", &BTreeSet::new()), "my-server_x");
        assert_eq!(server_name("local", &BTreeSet::new()), "local-imported");
        assert_eq!(server_name("??", &BTreeSet::new()), "server");
    }

    #[test]
    fn secrets_go_to_files_and_never_into_the_text() {
        let token = "ghp_0123456789abcdefghijklmnopqrstuvwxyz";
        let text = format!(
            r#"{{"mcpServers": {{
              "gh": {{"command": "npx", "args": ["-y", "@org/gh-mcp"],
                      "env": {{"GITHUB_TOKEN": "{token}", "LOG": "debug", "KEY2": "${{env:KEY2}}"}}}},
              "api": {{"url": "https://mcp.example.com/mcp",
                       "headers": {{"Authorization": "Bearer {token}", "X-Tenant": "blue", "X-Api-Key": "{token}"}}}}}}}}"#
        );
        let (_, f) = parse(".mcp.json", &text).unwrap();
        let out = convert(
            &f.servers,
            ".mcp.json",
            Path::new("/var/lib/tw/imported-secrets"),
        );
        let all: String = out.iter().map(|c| c.toml.clone()).collect();
        assert!(!all.contains(token), "{all}");
        assert!(!all.contains("0123456789abcdef"), "{all}");
        let gh = &out.iter().find(|c| c.name == "gh").unwrap();
        assert!(!gh.refused, "{}", gh.toml);
        assert!(
            gh.toml.contains(
                "secret_env = { GITHUB_TOKEN = \"/var/lib/tw/imported-secrets/gh.GITHUB_TOKEN\" }"
            ),
            "{}",
            gh.toml
        );
        assert!(gh.toml.contains("env = { LOG = \"debug\" }"), "{}", gh.toml);
        assert!(
            gh.toml.contains("secret_env_from = [\"KEY2\"]"),
            "{}",
            gh.toml
        );
        assert!(gh.toml.contains("# network = [443]"), "{}", gh.toml);
        assert_eq!(gh.secrets[0].1, token);
        let api = &out.iter().find(|c| c.name == "api").unwrap();
        assert!(
            api.toml
                .contains("bearer_token_file = \"/var/lib/tw/imported-secrets/api.bearer\""),
            "{}",
            api.toml
        );
        assert!(
            api.toml.contains("headers = { X-Tenant = \"blue\" }"),
            "{}",
            api.toml
        );
        assert!(
            api.notes.iter().any(|n| n.contains("headers.X-Api-Key")),
            "{:?}",
            api.notes
        );
        assert_eq!(api.secrets[0].1, token);
    }

    #[test]
    fn a_server_toolwall_would_refuse_is_printed_commented_out() {
        let text = r#"{"mcpServers": {"x": {"command": "srv", "args": ["--token=sk-live-abcdefghij0123456789"]}}}"#;
        let (_, f) = parse(".mcp.json", text).unwrap();
        let out = convert(&f.servers, ".mcp.json", Path::new("/s"));
        assert!(out[0].refused);
        assert!(
            out[0]
                .toml
                .lines()
                .filter(|l| !l.is_empty())
                .all(|l| l.starts_with('#'))
        );
        assert!(
            !out[0].toml.contains("abcdefghij0123456789"),
            "{}",
            out[0].toml
        );
        assert!(out[0].secrets.is_empty());
    }
}
