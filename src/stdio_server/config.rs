//! The keys of a local server, `[servers.NAME] command = [...]`, and their checks.
//!
//! A local server is a program toolwall starts and speaks MCP to over its stdin and
//! stdout. Its environment is built here from nothing: `PATH`, `LANG`, `HOME` and
//! `TMPDIR` (both inside the server's private state directory), `env` (plain values only)
//! and the secrets of `secret_env` (each read from a file) and `secret_env_from` (taken
//! from toolwall's own environment). A value in the config that looks like a credential
//! is refused, and no error here ever prints a value.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::aggregator::config::{ServerConfig, ServersConfig};
use crate::aggregator::inline_secret;
use crate::aggregator::setup::Secret;
use crate::config::MAX_TIMEOUT_SECS;
use crate::workspace::config::Network;

/// Default of `[servers.NAME] start_timeout_secs`: from start to the handshake's answer.
pub const DEFAULT_START_TIMEOUT_SECS: u64 = 60;
/// Default of `[servers.NAME] stop_grace_ms`: SIGTERM to SIGKILL when a server stops.
pub const DEFAULT_STOP_GRACE_MS: u64 = 2000;
/// Longest `stop_grace_ms`.
pub const MAX_STOP_GRACE_MS: u64 = 60_000;
/// Default of `[servers.NAME] discover_timeout_ms`: how long a `server/discover` probe
/// waits before the server is taken for a legacy one (which may not answer it at all).
/// The probe is the program's first message, so this covers its start too (an
/// interpreter loading its packages on a busy machine takes seconds).
pub const DEFAULT_DISCOVER_TIMEOUT_MS: u64 = 10_000;
/// Default of `[servers.NAME] max_processes` (RLIMIT_NPROC of the server's programs).
pub const DEFAULT_MAX_PROCESSES: u64 = 4096;
/// Default of `[servers.NAME] max_file_size_bytes` (RLIMIT_FSIZE).
pub const DEFAULT_MAX_FILE_SIZE_BYTES: u64 = 1 << 30;
/// Default of `[servers.NAME] pids_max`: processes and threads of the server's cgroup
/// (its host, leader and program), where cgroups are in force. A Node or Python server
/// uses tens; `npx` fetching a package a few more.
pub const DEFAULT_PIDS_MAX: u64 = 512;
/// Default of `[servers.NAME] memory_max_bytes`: memory of the server's cgroup (swap
/// closed), where cgroups are in force.
pub const DEFAULT_MEMORY_MAX_BYTES: u64 = 2 << 30;
/// Smallest `memory_max_bytes` (the host and its leader need some).
pub const MIN_MEMORY_MAX_BYTES: u64 = 32 << 20;
/// Default of `[servers] stderr_lines`.
pub const DEFAULT_STDERR_LINES: usize = 50;
/// Most `stderr_lines`.
pub const MAX_STDERR_LINES: usize = 10_000;
/// Most arguments of `command`, and the longest one.
pub const MAX_COMMAND_ARGS: usize = 256;
pub const MAX_ARG_BYTES: usize = 4096;
/// Most variables of `env`, `secret_env` and `secret_env_from` together, and the longest
/// plain value.
pub const MAX_ENV_VARS: usize = 128;
pub const MAX_ENV_VALUE_BYTES: usize = 32 * 1024;
/// Most `read_paths` and `write_paths` each.
pub const MAX_PATHS: usize = 64;
/// Largest secret file read for `secret_env`.
pub const MAX_SECRET_BYTES: u64 = 64 * 1024;
/// `PATH` of a server unless its `env` sets one.
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// `LANG` of a server unless its `env` sets one.
pub const DEFAULT_LANG: &str = "C.UTF-8";
/// Variables toolwall sets itself (inside the private state directory).
pub const RESERVED_ENV: &[&str] = &["HOME", "TMPDIR"];
/// The private temp dir inside a server's state directory.
pub const TMP_DIR_NAME: &str = "tmp";

/// `[servers.NAME]` keys of a local server (flattened into
/// [`crate::aggregator::config::ServerConfig`]).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct LocalServerKeys {
    /// The working directory (default: the server's private state directory).
    pub cwd: Option<PathBuf>,
    /// Plain (non-secret) variables of its environment.
    pub env: BTreeMap<String, String>,
    /// Secret variables: `VAR = "/file/it/is/read/from"`.
    pub secret_env: BTreeMap<String, PathBuf>,
    /// Secret variables taken from toolwall's own environment, by name.
    pub secret_env_from: Vec<String>,
    /// Paths it may read and execute from, beyond the system directories.
    pub read_paths: Vec<PathBuf>,
    /// Directories it may write, beyond its private state directory.
    pub write_paths: Vec<PathBuf>,
    /// `false`, or the TCP ports it may connect to.
    pub network: Network,
    /// The user it runs as (default `[sandbox] agent_user`).
    pub agent_user: Option<String>,
    /// Seconds from start to the answer of its handshake; then it is stopped and started
    /// again with backoff.
    pub start_timeout_secs: u64,
    /// Milliseconds between SIGTERM and SIGKILL when it stops.
    pub stop_grace_ms: u64,
    /// Milliseconds a `server/discover` probe waits for an answer (era `auto`).
    pub discover_timeout_ms: u64,
    /// RLIMIT_NPROC of its programs.
    pub max_processes: u64,
    /// RLIMIT_FSIZE of its programs.
    pub max_file_size_bytes: u64,
    /// cgroup v2 `pids.max` of its cgroup (host and program), where cgroups are in force.
    pub pids_max: u64,
    /// cgroup v2 `memory.max` of its cgroup (swap closed), where cgroups are in force.
    pub memory_max_bytes: u64,
}

impl Default for LocalServerKeys {
    fn default() -> Self {
        LocalServerKeys {
            cwd: None,
            env: BTreeMap::new(),
            secret_env: BTreeMap::new(),
            secret_env_from: Vec::new(),
            read_paths: Vec::new(),
            write_paths: Vec::new(),
            network: Network::Off,
            agent_user: None,
            start_timeout_secs: DEFAULT_START_TIMEOUT_SECS,
            stop_grace_ms: DEFAULT_STOP_GRACE_MS,
            discover_timeout_ms: DEFAULT_DISCOVER_TIMEOUT_MS,
            max_processes: DEFAULT_MAX_PROCESSES,
            max_file_size_bytes: DEFAULT_MAX_FILE_SIZE_BYTES,
            pids_max: DEFAULT_PIDS_MAX,
            memory_max_bytes: DEFAULT_MEMORY_MAX_BYTES,
        }
    }
}

impl LocalServerKeys {
    /// The keys set to something other than their default, by name (a `url` server may
    /// not set any of them).
    pub fn set_keys(&self) -> Vec<&'static str> {
        let d = LocalServerKeys::default();
        let mut out = Vec::new();
        let mut check = |set: bool, key: &'static str| {
            if set {
                out.push(key);
            }
        };
        check(self.cwd.is_some(), "cwd");
        check(!self.env.is_empty(), "env");
        check(!self.secret_env.is_empty(), "secret_env");
        check(!self.secret_env_from.is_empty(), "secret_env_from");
        check(!self.read_paths.is_empty(), "read_paths");
        check(!self.write_paths.is_empty(), "write_paths");
        check(self.network != d.network, "network");
        check(self.agent_user.is_some(), "agent_user");
        check(
            self.start_timeout_secs != d.start_timeout_secs,
            "start_timeout_secs",
        );
        check(self.stop_grace_ms != d.stop_grace_ms, "stop_grace_ms");
        check(
            self.discover_timeout_ms != d.discover_timeout_ms,
            "discover_timeout_ms",
        );
        check(self.max_processes != d.max_processes, "max_processes");
        check(
            self.max_file_size_bytes != d.max_file_size_bytes,
            "max_file_size_bytes",
        );
        check(self.pids_max != d.pids_max, "pids_max");
        check(
            self.memory_max_bytes != d.memory_max_bytes,
            "memory_max_bytes",
        );
        out
    }
}

/// Keys only a local server has, for the list of known keys in errors.
pub const LOCAL_KEYS: &str = "command, cwd, env, secret_env, secret_env_from, read_paths, write_paths, network, agent_user, start_timeout_secs, stop_grace_ms, discover_timeout_ms, max_processes, max_file_size_bytes, pids_max, memory_max_bytes";

/// A portable environment variable name.
pub fn valid_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && name.len() <= 256
}

/// A value that looks like a credential; a path (`/…`, `./…`, `../…`, `~/…`) does not,
/// however long and mixed its file names.
pub fn looks_like_secret(value: &str) -> bool {
    let v = value.trim();
    let path = ["/", "./", "../", "~/"].iter().any(|p| v.starts_with(p));
    !path && inline_secret::looks_like_secret(v)
}

/// An argument of the form `--token=VALUE` (or `-p=VALUE`) whose name suggests a secret.
fn flag_holds_secret(arg: &str) -> bool {
    let Some((flag, value)) = arg.split_once('=') else {
        return false;
    };
    flag.starts_with('-') && !value.is_empty() && inline_secret::key_suggests_secret(flag)
}

/// Checks a `[servers.NAME]` that has `command`. Errors name the key and never a value.
pub fn validate(name: &str, s: &ServerConfig) -> Result<(), String> {
    let at = |key: &str| format!("servers.{name}.{key}");
    let command = s.command.as_deref().unwrap_or_default();
    if !s.url.is_empty() {
        return Err(format!(
            "servers.{name}: set url (a server over HTTP) or command (a local program), not both"
        ));
    }
    for (set, key) in [
        (!s.headers.is_empty(), "headers"),
        (s.bearer_token_file.is_some(), "bearer_token_file"),
        (s.bearer_token_env.is_some(), "bearer_token_env"),
    ] {
        if set {
            return Err(format!(
                "{} applies to url servers only; a local server gets its secrets through secret_env (files) or secret_env_from",
                at(key)
            ));
        }
    }
    if command.is_empty() || command[0].is_empty() {
        return Err(format!(
            "{} must name a program: command = [\"npx\", \"-y\", \"PACKAGE\", ...]",
            at("command")
        ));
    }
    if command.len() > MAX_COMMAND_ARGS {
        return Err(format!(
            "{} has more than {MAX_COMMAND_ARGS} arguments",
            at("command")
        ));
    }
    for (i, arg) in command.iter().enumerate() {
        let key = at(&format!("command[{i}]"));
        if arg.len() > MAX_ARG_BYTES || arg.contains('\0') {
            return Err(format!(
                "{key}: an argument must be at most {MAX_ARG_BYTES} bytes without NUL (it is not shown)"
            ));
        }
        // `--flag=VALUE`: the value is what may be a credential.
        let value = match arg.split_once('=') {
            Some((flag, v)) if flag.starts_with('-') => v,
            _ => arg.as_str(),
        };
        if looks_like_secret(value) || flag_holds_secret(arg) {
            return Err(format!(
                "{key} looks like a credential; credentials never go in the config: put it in a file named by secret_env (or a variable of secret_env_from) and let the server read it from its environment (the value is not shown)"
            ));
        }
    }
    let l = &s.local;
    if let Some(cwd) = &l.cwd
        && !cwd.is_absolute()
    {
        return Err(format!("{} must be an absolute path", at("cwd")));
    }
    let vars = l.env.len() + l.secret_env.len() + l.secret_env_from.len();
    if vars > MAX_ENV_VARS {
        return Err(format!(
            "servers.{name}: more than {MAX_ENV_VARS} variables in env, secret_env and secret_env_from"
        ));
    }
    let check_name = |key: &str, var: &str| -> Result<(), String> {
        if !valid_env_name(var) {
            let hint = if inline_secret::looks_like_secret(var) {
                " (it looks like a credential itself: the key is the variable's name)"
            } else {
                ""
            };
            return Err(format!(
                "{}: a variable name must be [A-Za-z_][A-Za-z0-9_]*{hint} (it is not shown)",
                at(key)
            ));
        }
        if RESERVED_ENV.contains(&var) {
            return Err(format!(
                "{}.{var}: toolwall sets {var} itself, inside the server's private state directory",
                at(key)
            ));
        }
        Ok(())
    };
    for (var, value) in &l.env {
        check_name("env", var)?;
        if value.len() > MAX_ENV_VALUE_BYTES || value.contains('\0') {
            return Err(format!(
                "{}.{var}: a value must be at most {MAX_ENV_VALUE_BYTES} bytes without NUL (it is not shown)",
                at("env")
            ));
        }
        let secret_name = inline_secret::key_suggests_secret(var) && !value.is_empty();
        if secret_name || looks_like_secret(value) {
            return Err(format!(
                "{}.{var} looks like a credential; credentials never go in the config: use secret_env = {{ {var} = \"/path/to/file\" }} or secret_env_from = [\"{var}\"] (the value is not shown)",
                at("env")
            ));
        }
    }
    for (var, path) in &l.secret_env {
        check_name("secret_env", var)?;
        if l.env.contains_key(var) {
            return Err(format!(
                "{}.{var} is also in env: a variable comes from one place",
                at("secret_env")
            ));
        }
        if path.as_os_str().is_empty() {
            return Err(format!(
                "{}.{var} must name the file the value is read from",
                at("secret_env")
            ));
        }
        if inline_secret::looks_like_secret(&path.to_string_lossy()) && !path.is_absolute() {
            return Err(format!(
                "{}.{var} must be the path of a file holding the secret, not the secret (it is not shown)",
                at("secret_env")
            ));
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for var in &l.secret_env_from {
        check_name("secret_env_from", var)?;
        if l.env.contains_key(var) || l.secret_env.contains_key(var) || !seen.insert(var) {
            return Err(format!(
                "{}: {var} is named twice (env, secret_env, secret_env_from)",
                at("secret_env_from")
            ));
        }
    }
    for (key, paths) in [
        ("read_paths", &l.read_paths),
        ("write_paths", &l.write_paths),
    ] {
        if paths.len() > MAX_PATHS {
            return Err(format!("{} has more than {MAX_PATHS} paths", at(key)));
        }
        for p in paths {
            if !p.is_absolute() {
                return Err(format!("{}: {} is not absolute", at(key), p.display()));
            }
            if key == "write_paths" && p.parent().is_none() {
                return Err(format!("{}: / cannot be granted for writing", at(key)));
            }
        }
    }
    if let Some(cwd) = &l.cwd {
        let inside = l
            .read_paths
            .iter()
            .chain(&l.write_paths)
            .any(|p| cwd.starts_with(p));
        if !inside {
            return Err(format!(
                "{}: {} is in neither read_paths nor write_paths, so the server could not enter it; grant it or leave cwd out (the default is its private state directory)",
                at("cwd"),
                cwd.display()
            ));
        }
    }
    if let Some(user) = &l.agent_user
        && !valid_user_name(user)
    {
        return Err(format!(
            "{} must be a user name ([a-z_][a-z0-9_-]*)",
            at("agent_user")
        ));
    }
    if l.start_timeout_secs == 0 || l.start_timeout_secs > MAX_TIMEOUT_SECS {
        return Err(format!(
            "{} must be from 1 to {MAX_TIMEOUT_SECS} seconds",
            at("start_timeout_secs")
        ));
    }
    if l.stop_grace_ms > MAX_STOP_GRACE_MS {
        return Err(format!(
            "{} must be at most {MAX_STOP_GRACE_MS}",
            at("stop_grace_ms")
        ));
    }
    if l.discover_timeout_ms == 0 || l.discover_timeout_ms > MAX_TIMEOUT_SECS * 1000 {
        return Err(format!(
            "{} must be from 1 to {} milliseconds",
            at("discover_timeout_ms"),
            MAX_TIMEOUT_SECS * 1000
        ));
    }
    for (key, v) in [
        ("max_processes", l.max_processes),
        ("max_file_size_bytes", l.max_file_size_bytes),
        ("pids_max", l.pids_max),
    ] {
        if v == 0 {
            return Err(format!("{} must be greater than 0", at(key)));
        }
    }
    if l.memory_max_bytes < MIN_MEMORY_MAX_BYTES {
        return Err(format!(
            "{} must be at least {MIN_MEMORY_MAX_BYTES} (its host and leader need that much)",
            at("memory_max_bytes")
        ));
    }
    Ok(())
}

fn valid_user_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        && name.len() <= 32
}

/// `[servers]` checks for the settings of local servers.
pub fn validate_settings(servers: &ServersConfig) -> Result<(), String> {
    if servers.stderr_lines == 0 || servers.stderr_lines > MAX_STDERR_LINES {
        return Err(format!(
            "servers.stderr_lines must be from 1 to {MAX_STDERR_LINES}"
        ));
    }
    if servers.stderr_lines_per_sec == 0 || servers.stderr_lines_per_sec > 10_000 {
        return Err("servers.stderr_lines_per_sec must be from 1 to 10000".into());
    }
    if let Some(dir) = &servers.state_dir
        && dir.as_os_str().is_empty()
    {
        return Err("servers.state_dir is empty".into());
    }
    Ok(())
}

/// Where local servers keep their state: `[servers] state_dir`, else the directory next
/// to the ledger's, named like it with `-servers` (`/var/lib/toolwall-servers` for
/// `/var/lib/toolwall/ledger.db`, `./toolwall-data-servers` for the embedded defaults).
pub fn servers_state_root(servers: &ServersConfig, ledger_dir: &Path) -> PathBuf {
    if let Some(dir) = &servers.state_dir {
        return dir.clone();
    }
    let abs = std::fs::canonicalize(ledger_dir).unwrap_or_else(|_| ledger_dir.to_path_buf());
    let name = abs
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "toolwall".into());
    abs.parent()
        .unwrap_or_else(|| Path::new("/"))
        .join(format!("{name}-servers"))
}

/// The secret variables of a local server, read by the gateway: each `secret_env` file
/// (regular, at most [`MAX_SECRET_BYTES`], a final line break dropped) and each
/// `secret_env_from` variable of toolwall's own environment. Errors name the key and the
/// file or variable, never the content.
pub fn read_secret_env(name: &str, s: &ServerConfig) -> Result<Vec<(String, Secret)>, String> {
    let mut out = Vec::new();
    for (var, path) in &s.local.secret_env {
        let value = read_secret_file(&format!("servers.{name}.secret_env.{var}"), path)?;
        out.push((var.clone(), Secret::new(value)));
    }
    for var in &s.local.secret_env_from {
        let key = format!("servers.{name}.secret_env_from");
        let value = std::env::var_os(var)
            .ok_or_else(|| format!("{key}: toolwall's environment has no variable {var}"))?;
        let value = value.into_string().map_err(|_| {
            format!("{key}: toolwall's variable {var} is not UTF-8 (it is not shown)")
        })?;
        out.push((var.clone(), Secret::new(value)));
    }
    for (var, secret) in &out {
        if secret.expose().contains('\0') || secret.expose().is_empty() {
            return Err(format!(
                "servers.{name}: the secret {var} is empty or holds a NUL byte (it is not shown)"
            ));
        }
    }
    Ok(out)
}

fn read_secret_file(key: &str, path: &Path) -> Result<String, String> {
    use std::os::unix::fs::MetadataExt;
    let file = std::fs::File::open(path).map_err(|e| format!("{key}: {}: {e}", path.display()))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("{key}: {}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{key}: {} is not a regular file", path.display()));
    }
    if meta.len() > MAX_SECRET_BYTES {
        return Err(format!(
            "{key}: {} is larger than {MAX_SECRET_BYTES} bytes",
            path.display()
        ));
    }
    if meta.mode() & 0o077 != 0 {
        crate::warn!(
            "{key}: {} is readable by group or others (mode {:o}); chmod 600 it",
            path.display(),
            meta.mode() & 0o777
        );
    }
    let mut text = String::new();
    file.take(MAX_SECRET_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("{key}: {}: {e} (it must be UTF-8)", path.display()))?;
    let trimmed = text
        .strip_suffix("\r\n")
        .or_else(|| text.strip_suffix('\n'))
        .unwrap_or(&text);
    Ok(trimmed.to_owned())
}

/// `RES_OPTIONS` of a server with network ports: glibc's resolver asks over TCP (port
/// 53 must be among the ports), since no UDP socket may be made.
pub const TCP_DNS_RES_OPTIONS: &str = "use-vc";

/// The environment of a server's program: the defaults, `env`, then the secrets.
/// `state_dir` is its private state directory (`HOME`, and `TMPDIR` inside it); with
/// `network` ports, `RES_OPTIONS=use-vc` (unless `env` sets it).
pub fn child_env(
    env: &BTreeMap<String, String>,
    state_dir: &Path,
    secrets: &[(String, Secret)],
    network: &Network,
) -> Vec<(String, String)> {
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    vars.insert("PATH".into(), DEFAULT_PATH.into());
    vars.insert("LANG".into(), DEFAULT_LANG.into());
    if !network.ports().is_empty() {
        vars.insert("RES_OPTIONS".into(), TCP_DNS_RES_OPTIONS.into());
    }
    for (k, v) in env {
        vars.insert(k.clone(), v.clone());
    }
    vars.insert("HOME".into(), state_dir.to_string_lossy().into_owned());
    vars.insert(
        "TMPDIR".into(),
        state_dir.join(TMP_DIR_NAME).to_string_lossy().into_owned(),
    );
    for (k, v) in secrets {
        vars.insert(k.clone(), v.expose().to_owned());
    }
    vars.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    struct Doc {
        #[serde(default)]
        servers: ServersConfig,
    }

    fn load(text: &str) -> Result<ServersConfig, String> {
        let doc: Doc = toml::from_str(text).map_err(|e| e.to_string())?;
        doc.servers.validate()?;
        Ok(doc.servers)
    }

    #[test]
    fn a_local_server_reads_every_key() {
        let c = load(
            r#"
[servers]
state_dir = "/var/lib/tw-servers"
stderr_lines = 20

[servers.fs]
command = ["npx", "-y", "@modelcontextprotocol/server-filesystem", "/srv/project"]
cwd = "/srv/project"
env = { LOG_LEVEL = "info" }
secret_env = { GITHUB_TOKEN = "/etc/toolwall/github.token" }
secret_env_from = ["OPENAI_API_KEY"]
read_paths = ["/srv/project"]
write_paths = ["/srv/project/out"]
network = [443]
start_timeout_secs = 5
"#,
        )
        .unwrap();
        assert_eq!(c.stderr_lines, 20);
        let fs = &c.servers["fs"];
        assert_eq!(fs.command.as_ref().unwrap()[0], "npx");
        assert_eq!(fs.local.env["LOG_LEVEL"], "info");
        assert_eq!(fs.local.network, Network::Ports(vec![443]));
        assert_eq!(fs.local.start_timeout_secs, 5);
        assert_eq!(fs.local.stop_grace_ms, DEFAULT_STOP_GRACE_MS);
        assert!(fs.unknown.is_empty());
        assert_eq!(
            servers_state_root(&c, Path::new("/x")),
            PathBuf::from("/var/lib/tw-servers")
        );
        let d = ServersConfig::default();
        assert_eq!(
            servers_state_root(&d, Path::new("/nonexistent/state/toolwall")),
            PathBuf::from("/nonexistent/state/toolwall-servers")
        );
    }

    #[test]
    fn url_xor_command_and_errors_name_the_server() {
        for (text, needle) in [
            ("[servers.a]\n", "servers.a needs url"),
            (
                "[servers.a]\nurl = \"http://127.0.0.1:1/\"\ncommand = [\"x\"]\n",
                "servers.a: set url",
            ),
            ("[servers.a]\ncommand = []\n", "servers.a.command must name"),
            (
                "[servers.a]\ncommand = [\"x\"]\nheaders = { X = \"y\" }\n",
                "servers.a.headers applies to url servers",
            ),
            (
                "[servers.a]\nurl = \"http://127.0.0.1:1/\"\nenv = { A = \"b\" }\n",
                "servers.a.env applies to local servers",
            ),
            (
                "[servers.a]\ncommand = [\"x\"]\nenv = { HOME = \"/root\" }\n",
                "toolwall sets HOME",
            ),
            (
                "[servers.a]\ncommand = [\"x\"]\nread_paths = [\"rel\"]\n",
                "servers.a.read_paths: rel is not absolute",
            ),
            (
                "[servers.a]\ncommand = [\"x\"]\ncwd = \"/srv\"\n",
                "servers.a.cwd",
            ),
            (
                "[servers.a]\ncommand = [\"x\"]\nnetwork = true\n",
                "network",
            ),
            (
                "[servers.a]\ncommand = [\"x\"]\nsecret_env = { A = \"/f\" }\nsecret_env_from = [\"A\"]\n",
                "named twice",
            ),
            (
                "[servers.a]\ncommand = [\"x\"]\nbogus = 1\n",
                "servers.a.bogus",
            ),
            ("[servers]\nstderr_lines = 0\n", "servers.stderr_lines"),
        ] {
            let err = load(text).expect_err(text);
            assert!(err.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn inline_credentials_are_refused_without_being_printed() {
        let secret = "ghp_4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e";
        for text in [
            format!("[servers.a]\ncommand = [\"x\"]\nenv = {{ GITHUB_TOKEN = \"{secret}\" }}\n"),
            format!("[servers.a]\ncommand = [\"x\"]\nenv = {{ PLAIN = \"{secret}\" }}\n"),
            format!("[servers.a]\ncommand = [\"x\", \"{secret}\"]\n"),
            format!("[servers.a]\ncommand = [\"x\", \"--api-key={secret}\"]\n"),
            "[servers.a]\ncommand = [\"x\", \"--token=hunter2\"]\n".to_string(),
            format!("[servers.a]\ncommand = [\"x\"]\nsecret_env = {{ A = \"{secret}\" }}\n"),
            format!("[servers.a]\ncommand = [\"x\"]\ntoken = \"{secret}\"\n"),
        ] {
            let err = load(&text).expect_err(&text);
            assert!(!err.contains(secret), "printed the secret: {err}");
            assert!(!err.contains("4f9a8b"), "printed part of it: {err}");
            assert!(!err.contains("hunter2"), "printed it: {err}");
        }
        // Ordinary arguments and values pass.
        let ok = "[servers.a]\ncommand = [\"npx\", \"-y\", \"@modelcontextprotocol/server-filesystem\", \"/srv/project\", \"--port=8080\", \"/work/wt/i16/tests/fixtures/stdio_server2024.py\", \"--config=./conf/v2024abcdefghijklmnopq.json\"]\nenv = { LOG_LEVEL = \"debug\", NODE_ENV = \"production\" }\n";
        load(ok).unwrap();
    }

    #[test]
    fn secrets_come_from_files_and_the_environment_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tok");
        std::fs::write(&file, "s3cr3t-value\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut s = ServerConfig {
            command: Some(vec!["x".into()]),
            ..ServerConfig::default()
        };
        s.local.secret_env.insert("TOK".into(), file.clone());
        let got = read_secret_env("a", &s).unwrap();
        assert_eq!(got[0].0, "TOK");
        assert_eq!(got[0].1.expose(), "s3cr3t-value");
        s.local.secret_env_from = vec!["TOOLWALL_TEST_SURELY_UNSET_VAR".into()];
        let err = read_secret_env("a", &s).unwrap_err();
        assert!(err.contains("TOOLWALL_TEST_SURELY_UNSET_VAR"), "{err}");
        s.local.secret_env_from.clear();
        s.local
            .secret_env
            .insert("GONE".into(), dir.path().join("missing"));
        let err = read_secret_env("a", &s).unwrap_err();
        assert!(err.contains("servers.a.secret_env.GONE"), "{err}");
        // The environment: defaults, env, then secrets; HOME and TMPDIR are toolwall's.
        let mut env = BTreeMap::new();
        env.insert("PATH".to_string(), "/opt/bin:/usr/bin".to_string());
        let vars = child_env(&env, Path::new("/st/a"), &got, &Network::Off);
        let get = |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("PATH"), Some("/opt/bin:/usr/bin"));
        assert_eq!(get("LANG"), Some(DEFAULT_LANG));
        assert_eq!(get("HOME"), Some("/st/a"));
        assert_eq!(get("TMPDIR"), Some("/st/a/tmp"));
        assert_eq!(get("TOK"), Some("s3cr3t-value"));
        assert_eq!(vars.len(), 5);
        // With ports, glibc's resolver goes over TCP (no UDP socket may be made).
        let vars = child_env(&env, Path::new("/st/a"), &got, &Network::Ports(vec![53]));
        assert!(vars.contains(&("RES_OPTIONS".to_string(), "use-vc".to_string())));
    }
}
