//! The one TOML file that configures everything. Unknown keys are errors that name the key
//! and the line; every limit has a name, a default and a key here.
//!
//! Relative paths are taken relative to the working directory, like the embedded defaults
//! (state under `./toolwall-data/`). Service configs should use absolute paths.

use serde::Deserialize;
use std::path::{Path, PathBuf};

use crate::aggregator::ServersConfig;
use crate::ledger::LedgerConfig;
use crate::policy::PolicyConfig;
use crate::sandbox::SandboxConfig;
use crate::tools::http::HttpToolsConfig;
use crate::transport::http::HttpConfig;
use crate::transport::http::auth::HttpAuth;
use std::net::SocketAddr;

/// Where `serve` looks when `--config` is not given.
pub const SYSTEM_CONFIG: &str = "/etc/toolwall/toolwall.toml";
/// The state directory of the embedded defaults.
pub const DEFAULT_STATE_DIR: &str = "toolwall-data";

/// Longest timeout or period any key accepts: a day. Longer ones add nothing, and near
/// `u64::MAX` they overflow `Instant` arithmetic (a panic at first use).
pub const MAX_TIMEOUT_SECS: u64 = 24 * 3600;

/// Longest `gateway.linger_secs`.
pub const MAX_LINGER_SECS: u64 = 60;

/// Most calls per thread `gateway.pool_prefetch` may queue at a worker.
const MAX_POOL_PREFETCH: usize = 16;

/// Most threads a worker pool may be configured with.
pub const MAX_POOL_THREADS: usize = 1024;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub listen: ListenConfig,
    pub gateway: GatewayConfig,
    pub ledger: LedgerConfig,
    pub policy: PolicyConfig,
    pub sandbox: SandboxConfig,
    pub admin: AdminConfig,
    pub builtin: BuiltinConfig,
    /// Limits of the Streamable HTTP door (`[listen] http` says where it listens).
    pub http: HttpConfig,
    /// `[servers]` and `[servers.NAME]`: the upstream MCP servers of the aggregator.
    pub servers: ServersConfig,
    /// `[workspaces.NAME]`: confined shell and file tools (the `ws` server).
    pub workspaces: crate::workspace::WorkspacesConfig,
    /// `[relay]`: progress, log messages and server requests relayed during a call.
    pub relay: crate::gateway::relay_config::RelayConfig,
    /// Where the config came from (None: embedded defaults). Not a TOML key.
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ListenConfig {
    /// Framed unix socket (mode 0660). Empty string: no unix listener.
    pub unix: Option<PathBuf>,
    /// Framed vsock port, any CID.
    pub vsock: Option<u32>,
    /// The Streamable HTTP door (`POST /mcp`), e.g. `"127.0.0.1:9210"`.
    pub http: Option<SocketAddr>,
    /// PEM certificate chain and private key: the HTTP door speaks TLS (reloaded on SIGHUP).
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// The URL clients use (`https://mcp.example.com`): `Origin` and `Host` are checked
    /// against it.
    pub public_url: Option<String>,
    /// `"tokens"` (default): every MCP request needs a client token. `"none"`: no tokens,
    /// refused unless `http` is a loopback address.
    pub http_auth: HttpAuth,
    /// Serve `/metrics` without an admin token.
    pub metrics_public: bool,
}

impl Default for ListenConfig {
    fn default() -> Self {
        ListenConfig {
            unix: Some(PathBuf::from(DEFAULT_STATE_DIR).join("mcp.sock")),
            vsock: None,
            http: None,
            tls_cert: None,
            tls_key: None,
            public_url: None,
            http_auth: HttpAuth::Tokens,
            metrics_public: false,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GatewayConfig {
    /// Seconds a started frame may take to arrive whole.
    pub frame_timeout_secs: u64,
    /// Seconds before a non-`tools/call` request times out.
    pub request_timeout_secs: u64,
    /// Seconds before a `tools/call` times out.
    pub tool_call_timeout_secs: u64,
    /// Requests in flight per connection; beyond it, reading pauses.
    pub max_in_flight_per_connection: usize,
    /// Requests in flight across all connections; beyond it, reading pauses everywhere.
    pub max_in_flight_total: usize,
    /// Calls (tools, prompts, resources; held asks included) in flight for one principal
    /// (an HTTP token's principal, a unix uid, a vsock cid); beyond it a call is refused
    /// with an error naming this key, so one principal cannot take every seat of
    /// `max_in_flight_total`. Default: a quarter of `max_in_flight_total`.
    pub max_in_flight_per_principal: Option<usize>,
    /// Bytes one principal may hold in flight: the requests of its calls in the table
    /// (queued, at a worker or held for approval) plus the answers waiting to be written
    /// to its connections. Beyond it a call is refused at once with an error naming this
    /// key, so an agent that pipelines large calls and never reads cannot grow the
    /// gateway's memory. A principal holding nothing is always let in (one call larger
    /// than the bound still runs alone).
    pub max_bytes_in_flight_per_principal: usize,
    /// Bytes all principals together may hold in flight (the same count as the per-principal
    /// one, summed): many principals each within their share cannot together grow the
    /// gateway's memory past this. When nothing is held a call is always let in.
    pub max_bytes_in_flight: usize,
    /// Percent of a pool (the builtin worker's `builtin.threads + builtin.queue`, or one
    /// upstream server's `servers.threads + servers.queue`) one principal may hold, running
    /// or waiting. Calls beyond a pool's threads wait in the gateway, one queue per
    /// principal served in turn, so another principal's call goes at the next free thread.
    pub pool_share_percent: usize,
    /// Calls a pool's worker is sent per thread beyond the one the thread runs, so a
    /// thread that ends a call starts its next without waiting for the gateway's loop
    /// turn. Another principal's call may then wait behind up to this many calls per
    /// thread (0: it goes at the next free thread, at the cost of answers arriving in
    /// bursts of at most `threads`: more loop turns and ledger commits per call).
    pub pool_prefetch: usize,
    /// Messages (frames, lines, HTTP requests) taken from one connection per loop turn
    /// before the other connections get theirs: a pipelined burst cannot stall the loop.
    pub max_messages_per_turn: usize,
    /// Open framed agent connections (unix and vsock): the framed doors' own seats. The
    /// HTTP door has its own (`http.max_connections`) and the admin socket its own reserve,
    /// so no door's clients can take another's seats. When full, a new connection takes the
    /// place of one that has not sent a byte yet; else it is refused with an error it can
    /// read.
    pub max_connections: usize,
    /// Framed connections of one peer (unix uid, vsock cid); default half of
    /// `max_connections`.
    pub max_connections_per_peer: Option<usize>,
    /// Bytes all connections together may hold for messages not yet whole beyond what each
    /// holds without asking (a frame still arriving, an HTTP body still coming); a larger
    /// message waits for room before more of it is read.
    pub max_partial_bytes: usize,
    /// The share of `max_partial_bytes` one peer (unix uid, vsock cid, HTTP principal) may
    /// hold; default a quarter of it, never less than the largest message (a whole frame,
    /// an HTTP head and body).
    pub max_partial_bytes_per_peer: Option<usize>,
    /// A framed message up to this size is read without asking `max_partial_bytes`: what
    /// each framed connection may hold on its own.
    pub small_message_bytes: usize,
    /// Window of `list` events: the first listing of a principal and method in a window
    /// is recorded as it comes, the others counted into one `list_summary` event when the
    /// window ends. 0 records every listing.
    pub list_event_secs: u64,
    /// Seconds from accept to a framed connection's first byte; a silent one is closed.
    pub accept_timeout_secs: u64,
    /// Seconds a framed connection may sit with nothing in flight and nothing read or
    /// written (a ping counts); then it is closed.
    pub idle_timeout_secs: u64,
    /// Seconds output may wait with none of it taken by the agent; then it is closed.
    pub write_stall_secs: u64,
    /// Seconds a connection is read and drained after an error answer or a refusal, before
    /// it is closed, so the client reads what it was sent.
    pub linger_secs: u64,
    /// Connections lingering (or kept only to be refused) at once; beyond it they are
    /// closed at once.
    pub max_lingering: usize,
    /// Bytes queued for one agent connection before reading from it pauses.
    pub max_write_buffer_bytes: usize,
    /// Seconds to finish calls in flight after SIGTERM.
    pub drain_secs: u64,
    /// Largest answer sent to an agent (bytes of the JSON-RPC message); a larger one is
    /// refused as `too_large` (its row says so). At most what one frame carries.
    pub max_answer_bytes: usize,
    /// JSON values (and object members) an answer or a relayed message may hold; counted
    /// on its bytes before it is parsed, so a megabyte of tiny values never becomes a tree
    /// a hundred times its size. Beyond: an answer is refused as `too_large`, a relayed
    /// message dropped and counted.
    pub max_json_nodes: usize,
}

/// `gateway.max_partial_bytes` unless set: with 1,000 connections on each door holding
/// their small message, under 64 MiB in all.
pub const DEFAULT_MAX_PARTIAL_BYTES: usize = 24 * 1024 * 1024;

/// The most `gateway.max_answer_bytes` may be: a frame's payload with a full name.
pub const MAX_ANSWER_BYTES: usize = toolwall_relay::frame::MAX_TOTAL
    - toolwall_relay::frame::HEADER_LEN
    - toolwall_relay::frame::MAX_NAME;

impl GatewayConfig {
    /// `max_connections_per_peer`, or its default: half of `max_connections`, at
    /// least 1.
    pub fn connections_per_peer(&self) -> usize {
        self.max_connections_per_peer
            .unwrap_or(self.max_connections / 2)
            .max(1)
    }

    /// `max_in_flight_per_principal`, or its default: a quarter of `max_in_flight_total`,
    /// at least 1; never more than the total.
    pub fn in_flight_per_principal(&self) -> usize {
        self.max_in_flight_per_principal
            .unwrap_or(self.max_in_flight_total / 4)
            .clamp(1, self.max_in_flight_total.max(1))
    }
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            frame_timeout_secs: 30,
            request_timeout_secs: 60,
            tool_call_timeout_secs: 300,
            max_in_flight_per_connection: 64,
            max_in_flight_total: 4096,
            max_in_flight_per_principal: None,
            max_bytes_in_flight_per_principal: 32 * 1024 * 1024,
            max_bytes_in_flight: 64 * 1024 * 1024,
            pool_share_percent: 50,
            pool_prefetch: 1,
            max_messages_per_turn: 32,
            max_connections: 1024,
            max_connections_per_peer: None,
            max_partial_bytes: DEFAULT_MAX_PARTIAL_BYTES,
            max_partial_bytes_per_peer: None,
            small_message_bytes: 16 * 1024,
            list_event_secs: 60,
            accept_timeout_secs: 10,
            idle_timeout_secs: 3600,
            write_stall_secs: 60,
            linger_secs: 2,
            max_lingering: 64,
            max_write_buffer_bytes: 8 * 1024 * 1024,
            drain_secs: 30,
            max_answer_bytes: 1024 * 1024,
            max_json_nodes: crate::aggregator::json_nodes::DEFAULT_MAX_JSON_NODES,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// The admin socket (mode 0600): status, reload, approvals.
    pub socket: PathBuf,
    /// Admin connections at once: a reserve of their own, never taken by agents.
    pub max_connections: usize,
    /// Seconds an admin connection may take to send a request line, or to take its answer.
    pub timeout_secs: u64,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            socket: PathBuf::from(DEFAULT_STATE_DIR).join("admin.sock"),
            max_connections: 8,
            timeout_secs: 10,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BuiltinConfig {
    /// Threads in the builtin worker for blocking tool work.
    pub threads: usize,
    /// Tool calls queued in the builtin worker beyond its busy threads.
    pub queue: usize,
    pub http: HttpToolsConfig,
}

impl Default for BuiltinConfig {
    fn default() -> Self {
        BuiltinConfig {
            threads: 16,
            queue: 256,
            http: HttpToolsConfig::default(),
        }
    }
}

/// A config that could not be loaded; the message names the file and the line.
#[derive(Debug)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// Largest config file read.
pub const MAX_CONFIG_BYTES: u64 = 4 * 1024 * 1024;

impl Config {
    /// The config `--config` names, else the system file when it exists, else the
    /// embedded defaults.
    pub fn load(explicit: Option<&Path>) -> Result<Config, ConfigError> {
        match explicit {
            Some(path) => Config::from_file(path),
            None if Path::new(SYSTEM_CONFIG).exists() => {
                Config::from_file(Path::new(SYSTEM_CONFIG))
            }
            None => Ok(Config::default()),
        }
    }

    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = read_bounded(path, MAX_CONFIG_BYTES)
            .map_err(|e| ConfigError(format!("{}: {e}", path.display())))?;
        let mut config = Config::from_toml(&text, &path.display().to_string())?;
        config.source = Some(path.to_path_buf());
        Ok(config)
    }

    /// Parse and validate; `origin` names the text in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text)
            .map_err(|e| ConfigError(format!("{origin}: {}", e.to_string().trim_end())))?;
        config.validate(origin)?;
        Ok(config)
    }

    fn validate(&self, origin: &str) -> Result<(), ConfigError> {
        let g = &self.gateway;
        let positive = [
            ("gateway.frame_timeout_secs", g.frame_timeout_secs as usize),
            (
                "gateway.request_timeout_secs",
                g.request_timeout_secs as usize,
            ),
            (
                "gateway.tool_call_timeout_secs",
                g.tool_call_timeout_secs as usize,
            ),
            (
                "gateway.max_in_flight_per_connection",
                g.max_in_flight_per_connection,
            ),
            ("gateway.max_in_flight_total", g.max_in_flight_total),
            (
                "gateway.max_in_flight_per_principal",
                g.max_in_flight_per_principal.unwrap_or(1),
            ),
            (
                "gateway.max_bytes_in_flight_per_principal",
                g.max_bytes_in_flight_per_principal,
            ),
            ("gateway.max_bytes_in_flight", g.max_bytes_in_flight),
            ("gateway.pool_share_percent", g.pool_share_percent),
            ("gateway.max_messages_per_turn", g.max_messages_per_turn),
            ("gateway.max_connections", g.max_connections),
            (
                "gateway.max_connections_per_peer",
                g.max_connections_per_peer.unwrap_or(1),
            ),
            (
                "gateway.accept_timeout_secs",
                g.accept_timeout_secs as usize,
            ),
            ("gateway.idle_timeout_secs", g.idle_timeout_secs as usize),
            ("gateway.write_stall_secs", g.write_stall_secs as usize),
            ("gateway.linger_secs", g.linger_secs as usize),
            ("gateway.max_lingering", g.max_lingering),
            ("admin.max_connections", self.admin.max_connections),
            ("admin.timeout_secs", self.admin.timeout_secs as usize),
            ("gateway.max_write_buffer_bytes", g.max_write_buffer_bytes),
            ("builtin.threads", self.builtin.threads),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(ConfigError(format!(
                    "{origin}: {key} must be greater than 0"
                )));
            }
        }
        for (key, value) in [
            ("gateway.frame_timeout_secs", g.frame_timeout_secs),
            ("gateway.request_timeout_secs", g.request_timeout_secs),
            ("gateway.tool_call_timeout_secs", g.tool_call_timeout_secs),
            ("gateway.drain_secs", g.drain_secs),
            ("gateway.accept_timeout_secs", g.accept_timeout_secs),
            ("gateway.idle_timeout_secs", g.idle_timeout_secs),
            ("gateway.write_stall_secs", g.write_stall_secs),
            ("admin.timeout_secs", self.admin.timeout_secs),
            ("gateway.list_event_secs", g.list_event_secs),
        ] {
            if value > MAX_TIMEOUT_SECS {
                return Err(ConfigError(format!(
                    "{origin}: {key} must be at most {MAX_TIMEOUT_SECS}"
                )));
            }
        }
        if g.max_answer_bytes < 1024 || g.max_answer_bytes > MAX_ANSWER_BYTES {
            return Err(ConfigError(format!(
                "{origin}: gateway.max_answer_bytes must be between 1024 and {MAX_ANSWER_BYTES}"
            )));
        }
        let most = crate::aggregator::json_nodes::MAX_JSON_NODES;
        if g.max_json_nodes == 0 || g.max_json_nodes > most {
            return Err(ConfigError(format!(
                "{origin}: gateway.max_json_nodes must be between 1 and {most}"
            )));
        }
        // Lingering is a courtesy to a client being refused: seconds, not minutes.
        if g.linger_secs > MAX_LINGER_SECS {
            return Err(ConfigError(format!(
                "{origin}: gateway.linger_secs must be at most {MAX_LINGER_SECS}"
            )));
        }
        let max = crate::transport::http::config::MAX_CONNECTIONS;
        for (key, value) in [
            ("gateway.max_connections", g.max_connections),
            ("gateway.max_lingering", g.max_lingering),
            ("admin.max_connections", self.admin.max_connections),
        ] {
            if value > max {
                return Err(ConfigError(format!(
                    "{origin}: {key} must be at most {max}"
                )));
            }
        }
        if g.pool_prefetch > MAX_POOL_PREFETCH {
            return Err(ConfigError(format!(
                "{origin}: gateway.pool_prefetch must be at most {MAX_POOL_PREFETCH}"
            )));
        }
        if g.pool_share_percent > 100 {
            return Err(ConfigError(format!(
                "{origin}: gateway.pool_share_percent must be at most 100"
            )));
        }
        if self.builtin.threads > MAX_POOL_THREADS {
            return Err(ConfigError(format!(
                "{origin}: builtin.threads must be at most {MAX_POOL_THREADS}"
            )));
        }
        // Every message a door accepts must fit a grant, or it could never be read.
        let largest = self.largest_message();
        for (key, value) in [
            ("gateway.max_partial_bytes", Some(g.max_partial_bytes)),
            (
                "gateway.max_partial_bytes_per_peer",
                g.max_partial_bytes_per_peer,
            ),
        ] {
            if let Some(v) = value
                && v < largest
            {
                return Err(ConfigError(format!(
                    "{origin}: {key} is {v}, below the largest message a door accepts \
                     ({largest} bytes: a whole frame, or http.max_head_bytes + \
                     http.max_body_bytes)"
                )));
            }
        }
        if g.small_message_bytes < 1024 || g.small_message_bytes > 1024 * 1024 {
            return Err(ConfigError(format!(
                "{origin}: gateway.small_message_bytes must be between 1024 and 1048576"
            )));
        }
        self.builtin
            .http
            .validate()
            .map_err(|e| ConfigError(format!("{origin}: {e}")))?;
        self.http.validate(origin).map_err(ConfigError)?;
        self.servers
            .validate()
            .map_err(|e| ConfigError(format!("{origin}: {e}")))?;
        self.relay
            .validate()
            .map_err(|e| ConfigError(format!("{origin}: {e}")))?;
        Ok(())
    }

    /// The largest message a connection may have to hold whole: a frame with its prefix,
    /// or an HTTP head and body.
    pub fn largest_message(&self) -> usize {
        (toolwall_relay::frame::PREFIX_LEN + toolwall_relay::frame::MAX_TOTAL)
            .max(self.http.max_head_bytes + self.http.max_body_bytes + 1)
    }

    /// `gateway.max_partial_bytes_per_peer`, or its default: a quarter of
    /// `max_partial_bytes`, at least the largest message, at most the total.
    pub fn partial_bytes_per_peer(&self) -> usize {
        let g = &self.gateway;
        g.max_partial_bytes_per_peer
            .unwrap_or_else(|| (g.max_partial_bytes / 4).max(self.largest_message()))
            .min(g.max_partial_bytes)
    }

    /// The directory state lives in: the ledger's directory.
    pub fn state_dir(&self) -> PathBuf {
        self.ledger
            .path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."))
    }
}

/// Read a whole file, refusing one larger than `max` bytes before allocating for it.
pub fn read_bounded(path: &Path, max: u64) -> std::io::Result<String> {
    use std::io::Read;
    let file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    if len > max {
        return Err(std::io::Error::other(format!(
            "file is {len} bytes, more than the limit of {max}"
        )));
    }
    let mut text = String::with_capacity(len as usize);
    file.take(max + 1).read_to_string(&mut text)?;
    if text.len() as u64 > max {
        return Err(std::io::Error::other(format!(
            "file is larger than the limit of {max} bytes"
        )));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_key_names_key_and_line() {
        let err = Config::from_toml("[listen]\nunix = \"/x\"\nbogus = 1\n", "t.toml").unwrap_err();
        assert!(err.0.contains("bogus"), "{err}");
        assert!(err.0.contains("line 3"), "{err}");
    }

    #[test]
    fn partial_budgets_must_hold_the_largest_message() {
        let err = Config::from_toml("[gateway]\nmax_partial_bytes = 65536\n", "t").unwrap_err();
        assert!(
            err.0.contains("gateway.max_partial_bytes is 65536"),
            "{err}"
        );
        let err =
            Config::from_toml("[gateway]\nmax_partial_bytes_per_peer = 1000\n", "t").unwrap_err();
        assert!(err.0.contains("max_partial_bytes_per_peer"), "{err}");
        let c = Config::from_toml(
            "[gateway]\nmax_partial_bytes = 4194304\n[http]\nmax_body_bytes = 2097152\n",
            "t",
        )
        .unwrap();
        assert_eq!(c.partial_bytes_per_peer(), 2097152 + 16 * 1024 + 1);
        let c = Config::default();
        assert_eq!(c.partial_bytes_per_peer(), DEFAULT_MAX_PARTIAL_BYTES / 4);
        assert!(Config::from_toml("[gateway]\nsmall_message_bytes = 10\n", "t").is_err());
    }

    #[test]
    fn zero_limit_refused() {
        let err =
            Config::from_toml("[gateway]\nmax_in_flight_per_connection = 0\n", "t").unwrap_err();
        assert!(err.0.contains("max_in_flight_per_connection"));
    }

    /// Every section's limits are checked when the file is read, not when (or whether) the
    /// part that uses them starts: `[builtin.http]` and `[http]` were checked only in tests
    /// and at the HTTP door's start, and no timeout had an upper bound.
    #[test]
    fn every_section_is_checked_when_the_file_is_read() {
        let huge = u64::MAX;
        let cases = [
            (
                "[builtin.http]\ntimeout_secs = 0\n".to_string(),
                "builtin.http.timeout_secs",
            ),
            (
                r#"[builtin.http]
allow = ["not an address"]
"#
                .to_string(),
                "builtin.http.allow",
            ),
            (
                "[builtin.http]\nuser_agent = \"a\\u0007b\"\n".to_string(),
                "builtin.http.user_agent",
            ),
            (
                "[builtin]\nthreads = 1000000\n".to_string(),
                "builtin.threads",
            ),
            (
                "[http]\nmax_body_bytes = 0\n".to_string(),
                "http.max_body_bytes",
            ),
            (
                "[http]\nmax_body_bytes = 1000000000\n".to_string(),
                "http.max_body_bytes",
            ),
            (
                format!("[http]\nsession_idle_secs = {}\n", huge >> 1),
                "http.session_idle_secs",
            ),
            (
                format!("[gateway]\ntool_call_timeout_secs = {}\n", huge >> 1),
                "gateway.tool_call_timeout_secs",
            ),
            (
                "[gateway]\ndrain_secs = 100000000\n".to_string(),
                "gateway.drain_secs",
            ),
        ];
        for (text, key) in cases {
            let err = Config::from_toml(&text, "t.toml").expect_err(&text);
            assert!(err.0.contains(key), "{text}: {err}");
            assert!(err.0.starts_with("t.toml"), "{err}");
        }
    }

    #[test]
    fn defaults() {
        let c = Config::from_toml("", "t").unwrap();
        assert_eq!(c.gateway.max_in_flight_per_connection, 64);
        assert_eq!(c.ledger.path, PathBuf::from("toolwall-data/ledger.db"));
    }

    #[test]
    fn one_principal_share_of_calls_in_flight() {
        let share = |toml: &str| {
            Config::from_toml(toml, "t")
                .map(|c| c.gateway.in_flight_per_principal())
                .map_err(|e| e.0)
        };
        assert_eq!(share(""), Ok(1024), "a quarter of max_in_flight_total");
        assert_eq!(share("[gateway]\nmax_in_flight_total = 3\n"), Ok(1));
        assert_eq!(
            share("[gateway]\nmax_in_flight_total = 8\nmax_in_flight_per_principal = 100\n"),
            Ok(8),
            "never more than the total"
        );
        let err = share("[gateway]\nmax_in_flight_per_principal = 0\n").unwrap_err();
        assert!(err.contains("gateway.max_in_flight_per_principal"), "{err}");
        let err = share("[gateway]\nmax_messages_per_turn = 0\n").unwrap_err();
        assert!(err.contains("gateway.max_messages_per_turn"), "{err}");
        let err = share("[gateway]\npool_prefetch = 17\n").unwrap_err();
        assert!(err.contains("gateway.pool_prefetch"), "{err}");
        assert!(
            share("[gateway]\npool_prefetch = 0\n").is_ok(),
            "0 is strict turns"
        );
    }
}
