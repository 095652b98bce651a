//! `[servers]`: the external MCP servers the aggregator worker reaches, and its limits.
//!
//! `[servers]` holds both the aggregator's settings (`refresh_secs`, `threads`, ...) and one
//! `[servers.NAME]` table per upstream, so it is read by hand: a known setting key is a
//! setting, any other key must be a server table. Server tables are read without serde's
//! `deny_unknown_fields` on purpose: its error quotes the offending line of the file, and
//! that line may hold a token someone pasted inline. Unknown keys are collected instead and
//! refused by [`ServersConfig::validate`], whose messages never quote a value.

use crate::config::MAX_TIMEOUT_SECS;
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use super::budget::ServerBudget;
use super::inline_secret;
use crate::mcp::catalog::{GATEWAY_SERVER, LOCAL_SERVER, valid_server_name};
use crate::pins::{NewTools, PinMode};
use crate::tools::http::{TargetError, parse_target};

/// Default of `[servers] refresh_secs`: how often every server is listed again.
pub const DEFAULT_REFRESH_SECS: u64 = 300;
/// Default of `[servers] threads`: blocking upstream exchanges at once.
pub const DEFAULT_THREADS: usize = 16;
/// Default of `[servers] queue`: upstream requests waiting beyond busy threads.
pub const DEFAULT_QUEUE: usize = 256;
/// Default of `[servers] max_queued_bytes`: calls' arguments in flight toward one server.
pub const DEFAULT_MAX_QUEUED_BYTES: usize = 32 * 1024 * 1024;
/// Default of `[servers] max_body_bytes`: largest upstream answer read.
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
/// Largest `max_body_bytes`: an answer must still fit one worker RPC message (16 MiB).
pub const MAX_BODY_BYTES_LIMIT: usize = 15 * 1024 * 1024;
/// Default of `[servers] connect_timeout_secs`.
pub const DEFAULT_CONNECT_TIMEOUT_SECS: u64 = 10;
/// Default of `[servers] retry_max_secs`: the backoff cap for a server that is down.
pub const DEFAULT_RETRY_MAX_SECS: u64 = 60;
pub use super::budget::{
    DEFAULT_MAX_LISTING_BYTES, DEFAULT_MAX_PAGES, DEFAULT_MAX_PROMPTS,
    DEFAULT_MAX_RESOURCE_TEMPLATES, DEFAULT_MAX_RESOURCES, DEFAULT_MAX_TOOLS,
    MAX_LISTING_BYTES_LIMIT,
};
/// Default of `[servers] relist_min_interval_ms`: the least time between two listings of
/// one kind from one server, however often it says its lists changed.
pub const DEFAULT_RELIST_MIN_INTERVAL_MS: u64 = 1000;
pub use crate::aggregator::relist::DEFAULT_RELIST_LOOP_SHARE_PERCENT;
/// Default of `[servers] pin_retention_secs`: how long the pin of a tool that is no longer
/// listed is kept (30 days).
pub const DEFAULT_PIN_RETENTION_SECS: u64 = 30 * 24 * 3600;
/// Longest `pin_retention_secs` (ten years).
pub const MAX_PIN_RETENTION_SECS: u64 = 10 * 365 * 24 * 3600;
/// Default of `[servers] max_remembered_uris`: resource URIs and templates remembered as
/// one server's (and waiting to be), at most; more are served but not remembered.
pub const DEFAULT_MAX_REMEMBERED_URIS: usize = 20_000;
/// Default of `[servers] max_resource_pins`: resource URIs pinned at most per server
/// (twice the default `max_resources`, so pins of URIs gone lately are kept beside a full
/// listing).
pub const DEFAULT_MAX_RESOURCE_PINS: usize = 20_000;
/// Default of `[servers] reuse_idle_ms`: a kept-alive connection to a server idle longer
/// than this is not used again (a new one is opened). Below the 2 to 5 s after which
/// common servers close an idle connection (uvicorn, Node, Apache 5 s; gunicorn 2 s), so a
/// request is not written on a connection the server is closing at that moment (the
/// request would fail, and a POST is not sent again: it may have side effects).
pub const DEFAULT_REUSE_IDLE_MS: u64 = 1000;
/// Largest `reuse_idle_ms`.
pub const MAX_REUSE_IDLE_MS: u64 = 60_000;
/// Default of `[servers] max_server_subscriptions`: resource URIs one server may be asked
/// to watch at once for all agents.
pub const DEFAULT_MAX_SERVER_SUBSCRIPTIONS: usize = 4096;
/// Largest `max_server_subscriptions`: a 2026-07-28 server's set travels whole in every
/// `subscriptions/listen` request.
pub const MAX_SERVER_SUBSCRIPTIONS_LIMIT: usize = 65_536;
/// Default of `[servers] subscription_recheck_secs`: longest a 2026-07-28 server's
/// listening stream that carries subscriptions stays open without traffic before it is
/// opened again with the set as it is then.
pub const DEFAULT_SUBSCRIPTION_RECHECK_SECS: u64 = 5;
/// Largest `subscription_recheck_secs`: the idle time of a listening stream without
/// subscriptions (`upstream::LISTEN_IDLE`).
pub const MAX_SUBSCRIPTION_RECHECK_SECS: u64 = super::upstream::LISTEN_IDLE.as_secs();
/// Most `owns_resources` patterns per server.
pub const MAX_OWNS_RESOURCES: usize = 256;
/// Default of `[servers.NAME] timeout_secs`: one upstream exchange, headers and body.
pub const DEFAULT_TIMEOUT_SECS: u64 = 120;
/// Longest `url` accepted.
pub const MAX_URL_BYTES: usize = 2048;
/// Most `headers` per server.
pub const MAX_HEADERS: usize = 32;
/// Longest header value.
pub const MAX_HEADER_VALUE_BYTES: usize = 4096;

/// Headers toolwall sets itself; `headers` may not name them (case-insensitive).
pub const RESERVED_HEADERS: &[&str] = &[
    "accept",
    "authorization",
    "mcp-session-id",
    "mcp-protocol-version",
    "mcp-method",
    "mcp-name",
    "last-event-id",
    "content-type",
    "content-length",
    "transfer-encoding",
    "host",
    "connection",
];

/// Setting keys of `[servers]`; every other key is a server name.
const SETTING_KEYS: &[&str] = &[
    "refresh_secs",
    "threads",
    "queue",
    "max_body_bytes",
    "max_queued_bytes",
    "connect_timeout_secs",
    "retry_max_secs",
    "max_pages",
    "max_tools",
    "max_resources",
    "max_prompts",
    "max_resource_templates",
    "max_listing_bytes",
    "relist_min_interval_ms",
    "relist_loop_share_percent",
    "pin_retention_secs",
    "max_remembered_uris",
    "max_resource_pins",
    "max_server_subscriptions",
    "subscription_recheck_secs",
    "reuse_idle_ms",
    "state_dir",
    "stderr_lines",
    "stderr_lines_per_sec",
];

/// `[servers]` in the config file.
#[derive(Debug, Clone, PartialEq)]
pub struct ServersConfig {
    /// Seconds between full listings of every server; 0: only at start, on reload and when
    /// a server says its lists changed.
    pub refresh_secs: u64,
    /// Threads in the aggregator worker for upstream exchanges.
    pub threads: usize,
    /// Upstream requests queued in the worker beyond its busy threads (then `busy`).
    pub queue: usize,
    /// Bytes of one upstream answer read at most; more is `too_large`.
    pub max_body_bytes: usize,
    /// Bytes of calls' arguments in flight toward one server at once (sent to its worker,
    /// not yet answered); beyond, a call is refused at once (`busy`), so a server that
    /// stops reading cannot make the gateway hold an unbounded backlog.
    pub max_queued_bytes: usize,
    /// Seconds to connect (TCP and TLS) to an upstream.
    pub connect_timeout_secs: u64,
    /// Longest wait between attempts to reach a server that is down (backoff doubles from
    /// one second up to this).
    pub retry_max_secs: u64,
    /// Pages of one listing followed at most (cursors); servers may override it.
    pub max_pages: usize,
    /// Items of each kind one server may list; servers may override them.
    pub max_tools: usize,
    pub max_resources: usize,
    pub max_prompts: usize,
    pub max_resource_templates: usize,
    /// Bytes of the items of one listing, every page together; servers may override it.
    pub max_listing_bytes: usize,
    /// Least milliseconds between two listings of one kind from one server.
    pub relist_min_interval_ms: u64,
    /// Most of the gateway loop's time (percent) applying one list of one server may take:
    /// a listing that cost `c` delays that list's next one by `c * (100 - p) / p`.
    pub relist_loop_share_percent: u32,
    /// Seconds the pin of a tool no longer listed is kept before it is pruned.
    pub pin_retention_secs: u64,
    /// Resource URIs and templates remembered as one server's owned (and waiting to be),
    /// at most per server: bounds `resource_owners` and its copy in memory.
    pub max_remembered_uris: usize,
    /// Resource URIs pinned at most per server: a new URI beyond is served unpinned
    /// (logged), a pinned one keeps its pin and a change of it is held.
    pub max_resource_pins: usize,
    /// Resource URIs one server may be asked to watch at once, for all agents together;
    /// beyond, a subscribe is refused (`busy`).
    pub max_server_subscriptions: usize,
    /// Seconds a 2026-07-28 server's listening stream that carries subscriptions stays
    /// open without traffic before it is opened again (a changed set applies within it).
    pub subscription_recheck_secs: u64,
    /// Milliseconds a kept-alive connection to a server may have been idle and still be
    /// used again; 0: every request on a new connection.
    pub reuse_idle_ms: u64,
    /// Where local servers (`command`) keep their private state directories (`NAME/`):
    /// by default the directory next to the ledger's, named like it with `-servers`.
    pub state_dir: Option<PathBuf>,
    /// Lines of each local server's stderr kept for `toolwall status NAME`.
    pub stderr_lines: usize,
    /// stderr lines per second a local server's host sends on (the rest are counted).
    pub stderr_lines_per_sec: u32,
    /// `[servers.NAME]`, by name.
    pub servers: BTreeMap<String, ServerConfig>,
    /// Keys of `[servers]` that were neither a setting nor a table (refused by `validate`,
    /// which names them without their values).
    pub not_tables: Vec<String>,
}

impl Default for ServersConfig {
    fn default() -> Self {
        ServersConfig {
            refresh_secs: DEFAULT_REFRESH_SECS,
            threads: DEFAULT_THREADS,
            queue: DEFAULT_QUEUE,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_queued_bytes: DEFAULT_MAX_QUEUED_BYTES,
            connect_timeout_secs: DEFAULT_CONNECT_TIMEOUT_SECS,
            retry_max_secs: DEFAULT_RETRY_MAX_SECS,
            max_pages: DEFAULT_MAX_PAGES,
            max_tools: DEFAULT_MAX_TOOLS,
            max_resources: DEFAULT_MAX_RESOURCES,
            max_prompts: DEFAULT_MAX_PROMPTS,
            max_resource_templates: DEFAULT_MAX_RESOURCE_TEMPLATES,
            max_listing_bytes: DEFAULT_MAX_LISTING_BYTES,
            relist_min_interval_ms: DEFAULT_RELIST_MIN_INTERVAL_MS,
            relist_loop_share_percent: DEFAULT_RELIST_LOOP_SHARE_PERCENT,
            pin_retention_secs: DEFAULT_PIN_RETENTION_SECS,
            max_remembered_uris: DEFAULT_MAX_REMEMBERED_URIS,
            max_resource_pins: DEFAULT_MAX_RESOURCE_PINS,
            max_server_subscriptions: DEFAULT_MAX_SERVER_SUBSCRIPTIONS,
            subscription_recheck_secs: DEFAULT_SUBSCRIPTION_RECHECK_SECS,
            reuse_idle_ms: DEFAULT_REUSE_IDLE_MS,
            state_dir: None,
            stderr_lines: crate::stdio_server::config::DEFAULT_STDERR_LINES,
            stderr_lines_per_sec: crate::stdio_server::hosting::STDERR_LINES_PER_SEC,
            servers: BTreeMap::new(),
            not_tables: Vec::new(),
        }
    }
}

/// `[servers.NAME] era`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EraChoice {
    /// `server/discover` first; legacy `initialize` when it is not answered as modern.
    #[default]
    Auto,
    /// Only the legacy handshake.
    Legacy,
    /// Only the modern era; a server that does not answer `server/discover` is down.
    Modern,
}

/// `[servers.NAME]`: one upstream MCP server, over Streamable HTTP (`url`) or a local
/// program spoken to over its stdin and stdout (`command`, see `crate::stdio_server`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, expecting = "a [servers.NAME] table")]
pub struct ServerConfig {
    /// The MCP endpoint, `http://` or `https://`.
    pub url: String,
    /// Extra request headers (not secrets, not the reserved ones).
    pub headers: BTreeMap<String, String>,
    /// A file holding the bearer token sent as `Authorization: Bearer ...`.
    pub bearer_token_file: Option<PathBuf>,
    /// An environment variable of the gateway holding that token.
    pub bearer_token_env: Option<String>,
    /// Seconds one upstream exchange may take (connect, headers and whole body).
    pub timeout_secs: u64,
    /// `false`: configured but not reached and not listed.
    pub enabled: bool,
    /// What happens when a tool's definition changes: see `crate::pins`.
    pub pin: PinMode,
    /// What happens to a tool this server did not list before (once it has been pinned):
    /// default `hold` under `pin = "enforce"`, else `serve`.
    pub new_tools: Option<NewTools>,
    /// The name this server had before a rename: its pins follow it (only when set).
    pub renamed_from: Option<String>,
    /// `true` (default): agents see this server's tools and prompts as `NAME__tool`.
    /// `false`: under the server's own names (policy, pins and the ledger still say
    /// `NAME__tool`); a name another server also offers is served by neither (see
    /// `crate::mcp::catalog::names`).
    pub prefix: bool,
    /// Resource URIs (globs) this server owns: no other server may serve them, and a
    /// contested URI goes to its configured owner.
    pub owns_resources: Vec<String>,
    /// Per-server overrides of the `[servers]` budgets.
    pub max_tools: Option<usize>,
    pub max_resources: Option<usize>,
    pub max_prompts: Option<usize>,
    pub max_resource_templates: Option<usize>,
    pub max_listing_bytes: Option<usize>,
    pub max_pages: Option<usize>,
    /// Which MCP era to speak: detected (`auto`), or forced for a server whose detection
    /// misleads.
    pub era: EraChoice,
    /// A local server: the program and its arguments (never with `url`). The other keys
    /// of a local server are in [`crate::stdio_server::config::LocalServerKeys`].
    pub command: Option<Vec<String>>,
    #[serde(flatten)]
    pub local: crate::stdio_server::config::LocalServerKeys,
    /// Keys this build does not know (refused by `validate`, values never shown).
    #[serde(flatten)]
    pub unknown: BTreeMap<String, IgnoredAny>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            url: String::new(),
            headers: BTreeMap::new(),
            bearer_token_file: None,
            bearer_token_env: None,
            timeout_secs: DEFAULT_TIMEOUT_SECS,
            enabled: true,
            pin: PinMode::Enforce,
            new_tools: None,
            renamed_from: None,
            prefix: true,
            owns_resources: Vec::new(),
            max_tools: None,
            max_resources: None,
            max_prompts: None,
            max_resource_templates: None,
            max_listing_bytes: None,
            max_pages: None,
            era: EraChoice::Auto,
            command: None,
            local: Default::default(),
            unknown: BTreeMap::new(),
        }
    }
}

impl<'de> Deserialize<'de> for ServersConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(ServersVisitor)
    }
}

struct ServersVisitor;

/// A `[servers]` value that is not a setting: a server table, or something else whose
/// value is skipped unread (it might be a token).
enum ServerEntry {
    Table(Box<ServerConfig>),
    NotATable,
}

impl<'de> Deserialize<'de> for ServerEntry {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EntryVisitor;
        impl<'de> Visitor<'de> for EntryVisitor {
            type Value = ServerEntry;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a [servers.NAME] table")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ServerEntry, A::Error> {
                let server =
                    ServerConfig::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(ServerEntry::Table(Box::new(server)))
            }
            fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<ServerEntry, E> {
                Ok(ServerEntry::NotATable)
            }
            fn visit_string<E: serde::de::Error>(self, _: String) -> Result<ServerEntry, E> {
                Ok(ServerEntry::NotATable)
            }
            fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<ServerEntry, E> {
                Ok(ServerEntry::NotATable)
            }
            fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<ServerEntry, E> {
                Ok(ServerEntry::NotATable)
            }
            fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<ServerEntry, E> {
                Ok(ServerEntry::NotATable)
            }
            fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<ServerEntry, E> {
                Ok(ServerEntry::NotATable)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<ServerEntry, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(ServerEntry::NotATable)
            }
        }
        deserializer.deserialize_any(EntryVisitor)
    }
}

impl<'de> Visitor<'de> for ServersVisitor {
    type Value = ServersConfig;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("the [servers] table")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ServersConfig, A::Error> {
        let mut cfg = ServersConfig::default();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "refresh_secs" => cfg.refresh_secs = map.next_value()?,
                "threads" => cfg.threads = map.next_value()?,
                "queue" => cfg.queue = map.next_value()?,
                "max_body_bytes" => cfg.max_body_bytes = map.next_value()?,
                "max_queued_bytes" => cfg.max_queued_bytes = map.next_value()?,
                "connect_timeout_secs" => cfg.connect_timeout_secs = map.next_value()?,
                "retry_max_secs" => cfg.retry_max_secs = map.next_value()?,
                "max_pages" => cfg.max_pages = map.next_value()?,
                "max_tools" => cfg.max_tools = map.next_value()?,
                "max_resources" => cfg.max_resources = map.next_value()?,
                "max_prompts" => cfg.max_prompts = map.next_value()?,
                "max_resource_templates" => cfg.max_resource_templates = map.next_value()?,
                "max_listing_bytes" => cfg.max_listing_bytes = map.next_value()?,
                "relist_min_interval_ms" => cfg.relist_min_interval_ms = map.next_value()?,
                "relist_loop_share_percent" => cfg.relist_loop_share_percent = map.next_value()?,
                "pin_retention_secs" => cfg.pin_retention_secs = map.next_value()?,
                "max_remembered_uris" => cfg.max_remembered_uris = map.next_value()?,
                "max_resource_pins" => cfg.max_resource_pins = map.next_value()?,
                "max_server_subscriptions" => cfg.max_server_subscriptions = map.next_value()?,
                "subscription_recheck_secs" => cfg.subscription_recheck_secs = map.next_value()?,
                "reuse_idle_ms" => cfg.reuse_idle_ms = map.next_value()?,
                "state_dir" => cfg.state_dir = Some(map.next_value()?),
                "stderr_lines" => cfg.stderr_lines = map.next_value()?,
                "stderr_lines_per_sec" => cfg.stderr_lines_per_sec = map.next_value()?,
                _ => match map.next_value::<ServerEntry>()? {
                    ServerEntry::Table(server) => {
                        cfg.servers.insert(key, *server);
                    }
                    ServerEntry::NotATable => cfg.not_tables.push(key),
                },
            }
        }
        Ok(cfg)
    }
}

impl ServersConfig {
    /// The servers that are enabled, by name.
    pub fn enabled(&self) -> impl Iterator<Item = (&String, &ServerConfig)> {
        self.servers.iter().filter(|(_, s)| s.enabled)
    }

    /// Whether `other` reaches the same servers the same way (names, URLs, headers,
    /// credentials' sources, timeouts, eras): if not, the worker needs a new grant and
    /// setup. Pin modes, budgets, `new_tools`, `owns_resources` and `refresh_secs` do not
    /// count: they apply without one (budgets travel with every listing request).
    pub fn same_connections(&self, other: &ServersConfig) -> bool {
        // A local server counts by its name only: a change of its command, environment,
        // grants or timeouts restarts that server alone (`changed_local_servers`).
        let key = |c: &ServersConfig| {
            c.enabled()
                .map(|(n, s)| {
                    if s.is_local() {
                        return (n.clone(), None);
                    }
                    (
                        n.clone(),
                        Some((
                            s.url.clone(),
                            s.headers.clone(),
                            s.bearer_token_file.clone(),
                            s.bearer_token_env.clone(),
                            s.timeout_secs,
                            s.era,
                        )),
                    )
                })
                .collect::<Vec<_>>()
        };
        key(self) == key(other)
            && (
                self.threads,
                self.queue,
                self.max_body_bytes,
                self.connect_timeout_secs,
            ) == (
                other.threads,
                other.queue,
                other.max_body_bytes,
                other.connect_timeout_secs,
            )
            && self.retry_max_secs == other.retry_max_secs
            && (
                self.max_server_subscriptions,
                self.subscription_recheck_secs,
                self.reuse_idle_ms,
            ) == (
                other.max_server_subscriptions,
                other.subscription_recheck_secs,
                other.reuse_idle_ms,
            )
    }

    /// Local servers enabled in both `self` and `other` whose program must start again
    /// for `other` (command, environment, secrets' sources, grants, timeouts, era).
    pub fn changed_local_servers(&self, other: &ServersConfig) -> Vec<String> {
        let launch = |s: &ServerConfig| (s.command.clone(), s.local.clone(), s.timeout_secs, s.era);
        self.enabled()
            .filter(|(_, s)| s.is_local())
            .filter_map(|(n, s)| {
                let o = other.servers.get(n).filter(|o| o.enabled && o.is_local())?;
                (launch(s) != launch(o)).then(|| n.clone())
            })
            .collect()
    }

    /// Check what serde cannot. The error names the key (`servers.NAME.KEY`) and never
    /// quotes a header value, a URL's query or anything that may be a secret.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(key) = self.not_tables.first() {
            if key == "max_items" {
                return Err("servers.max_items was replaced by max_tools, max_resources, max_prompts and max_resource_templates (each also settable per server)".into());
            }
            return Err(format!(
                "servers.{key} is neither a setting ({}) nor a [servers.{key}] table (its value is not shown)",
                SETTING_KEYS.join(", ")
            ));
        }
        let positive = [
            ("threads", self.threads as u64),
            ("queue", self.queue as u64),
            ("max_body_bytes", self.max_body_bytes as u64),
            ("max_queued_bytes", self.max_queued_bytes as u64),
            ("connect_timeout_secs", self.connect_timeout_secs),
            ("retry_max_secs", self.retry_max_secs),
            ("max_pages", self.max_pages as u64),
            ("max_tools", self.max_tools as u64),
            ("max_resources", self.max_resources as u64),
            ("max_prompts", self.max_prompts as u64),
            ("max_resource_templates", self.max_resource_templates as u64),
            ("max_listing_bytes", self.max_listing_bytes as u64),
            ("pin_retention_secs", self.pin_retention_secs),
            ("max_remembered_uris", self.max_remembered_uris as u64),
            ("max_resource_pins", self.max_resource_pins as u64),
            (
                "max_server_subscriptions",
                self.max_server_subscriptions as u64,
            ),
            ("subscription_recheck_secs", self.subscription_recheck_secs),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(format!("servers.{key} must be greater than 0"));
            }
        }
        if self.max_listing_bytes > MAX_LISTING_BYTES_LIMIT {
            return Err(format!(
                "servers.max_listing_bytes must be at most {MAX_LISTING_BYTES_LIMIT} (a listing must fit one worker message)"
            ));
        }
        if self.pin_retention_secs > MAX_PIN_RETENTION_SECS {
            return Err(format!(
                "servers.pin_retention_secs must be at most {MAX_PIN_RETENTION_SECS} seconds"
            ));
        }
        if !(1..=100).contains(&self.relist_loop_share_percent) {
            return Err(format!(
                "servers.relist_loop_share_percent must be 1 to 100, not {}",
                self.relist_loop_share_percent
            ));
        }
        if self.max_server_subscriptions > MAX_SERVER_SUBSCRIPTIONS_LIMIT {
            return Err(format!(
                "servers.max_server_subscriptions must be at most {MAX_SERVER_SUBSCRIPTIONS_LIMIT} (a 2026-07-28 server gets the whole set in every subscriptions/listen)"
            ));
        }
        if self.reuse_idle_ms > MAX_REUSE_IDLE_MS {
            return Err(format!(
                "servers.reuse_idle_ms must be at most {MAX_REUSE_IDLE_MS} milliseconds"
            ));
        }
        if self.subscription_recheck_secs > MAX_SUBSCRIPTION_RECHECK_SECS {
            return Err(format!(
                "servers.subscription_recheck_secs must be at most {MAX_SUBSCRIPTION_RECHECK_SECS} seconds (a listening stream without subscriptions is opened again that often anyway)"
            ));
        }
        if self.relist_min_interval_ms > MAX_TIMEOUT_SECS * 1000 {
            return Err(format!(
                "servers.relist_min_interval_ms must be at most {} milliseconds",
                MAX_TIMEOUT_SECS * 1000
            ));
        }
        crate::stdio_server::config::validate_settings(self)?;
        if self.max_body_bytes > MAX_BODY_BYTES_LIMIT {
            return Err(format!(
                "servers.max_body_bytes must be at most {MAX_BODY_BYTES_LIMIT} (an answer must fit one worker message)"
            ));
        }
        for (key, value) in [
            ("refresh_secs", self.refresh_secs),
            ("connect_timeout_secs", self.connect_timeout_secs),
            ("retry_max_secs", self.retry_max_secs),
        ] {
            if value > MAX_TIMEOUT_SECS {
                return Err(format!(
                    "servers.{key} must be at most {MAX_TIMEOUT_SECS} seconds"
                ));
            }
        }
        for (name, server) in &self.servers {
            check_server_name(name)?;
            server.validate(name)?;
            if let Some(old) = &server.renamed_from {
                if old == name {
                    return Err(format!(
                        "servers.{name}.renamed_from names the server itself"
                    ));
                }
                check_server_name(old).map_err(|e| format!("servers.{name}.renamed_from: {e}"))?;
                if self.servers.contains_key(old) {
                    return Err(format!(
                        "servers.{name}.renamed_from = {old:?}, but [servers.{old}] is still configured; pins follow a rename only from a server that is gone"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The budgets of `name` (its own overrides over the `[servers]` defaults).
    pub fn budget(&self, name: &str) -> ServerBudget {
        let s = self.servers.get(name);
        let pick = |own: Option<Option<usize>>, default: usize| match own.flatten() {
            Some(v) => (v, true),
            None => (default, false),
        };
        let (max_tools, a) = pick(s.map(|s| s.max_tools), self.max_tools);
        let (max_resources, b) = pick(s.map(|s| s.max_resources), self.max_resources);
        let (max_prompts, c) = pick(s.map(|s| s.max_prompts), self.max_prompts);
        let (max_resource_templates, d) = pick(
            s.map(|s| s.max_resource_templates),
            self.max_resource_templates,
        );
        let (max_listing_bytes, e) = pick(s.map(|s| s.max_listing_bytes), self.max_listing_bytes);
        let (max_pages, f) = pick(s.map(|s| s.max_pages), self.max_pages);
        ServerBudget {
            max_tools,
            max_resources,
            max_prompts,
            max_resource_templates,
            max_listing_bytes,
            max_pages,
            own: [a, b, c, d, e, f],
        }
    }
}

/// Server names: `[a-z0-9_-]+`, no `__`, not `local` or `toolwall`.
pub fn check_server_name(name: &str) -> Result<(), String> {
    if name == LOCAL_SERVER || name == GATEWAY_SERVER || name == crate::workspace::tools::SERVER {
        return Err(format!(
            "[servers.{name}]: the server name {name:?} is reserved (the built-in tools are `local`, the workspaces `ws`, the gateway's own `toolwall`)"
        ));
    }
    if !valid_server_name(name) {
        return Err(format!(
            "[servers.{}]: a server name may hold only a-z, 0-9, '_' and '-', never \"__\", and may not end in '_' (server__tool must name one server)",
            name.escape_debug()
        ));
    }
    Ok(())
}

/// A valid HTTP header name (RFC 9110 token).
fn valid_header_name(name: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'!' | b'#'
                        | b'$'
                        | b'%'
                        | b'&'
                        | b'\''
                        | b'*'
                        | b'+'
                        | b'-'
                        | b'.'
                        | b'^'
                        | b'_'
                        | b'`'
                        | b'|'
                        | b'~'
                )
        })
}

/// A header value toolwall will send: visible ASCII and spaces, no control characters.
fn valid_header_value(value: &str) -> bool {
    value
        .bytes()
        .all(|b| b == b' ' || b == b'\t' || (0x21..0x7f).contains(&b))
}

/// A portable environment variable name.
fn valid_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && name.len() <= 256
}

impl ServerConfig {
    /// `new_tools` as it applies: `hold` by default under `pin = "enforce"`, else `serve`.
    pub fn new_tools(&self) -> NewTools {
        self.new_tools.unwrap_or(match self.pin {
            PinMode::Enforce => NewTools::Hold,
            _ => NewTools::Serve,
        })
    }

    /// A local server (`command`): a program toolwall starts, not an URL it reaches.
    pub fn is_local(&self) -> bool {
        self.command.is_some()
    }

    fn validate(&self, name: &str) -> Result<(), String> {
        let at = |key: &str| format!("servers.{name}.{key}");
        if let Some(key) = self.unknown.keys().next() {
            let hint = if inline_secret::key_suggests_secret(key) {
                " (tokens never go in the config: use bearer_token_file or bearer_token_env, or secret_env for a local server)"
            } else {
                ""
            };
            return Err(format!(
                "unknown key {}; known keys: url, headers, bearer_token_file, bearer_token_env, timeout_secs, enabled, pin, new_tools, renamed_from, prefix, owns_resources, era, max_tools, max_resources, max_prompts, max_resource_templates, max_listing_bytes, max_pages, and for a local server {}{hint} (its value is not shown)",
                at(key.as_str()),
                crate::stdio_server::config::LOCAL_KEYS
            ));
        }
        if self.is_local() {
            crate::stdio_server::config::validate(name, self)?;
        } else {
            if self.url.is_empty() {
                return Err(format!(
                    "servers.{name} needs url (a server over HTTP) or command (a local program started by toolwall)"
                ));
            }
            if let Some(key) = self.local.set_keys().first() {
                return Err(format!(
                    "{} applies to local servers only (those with command), not to a url server",
                    at(key)
                ));
            }
            self.validate_url(name)?;
        }
        if self.headers.len() > MAX_HEADERS {
            return Err(format!(
                "{} has more than {MAX_HEADERS} entries",
                at("headers")
            ));
        }
        for (header, value) in &self.headers {
            let key = at(&format!("headers.{header}"));
            if !valid_header_name(header) {
                return Err(format!("{key}: not a valid HTTP header name"));
            }
            let lower = header.to_ascii_lowercase();
            if RESERVED_HEADERS.contains(&lower.as_str()) {
                return Err(format!(
                    "{key}: toolwall sets this header itself and it cannot be overridden (reserved: {}); for a token use bearer_token_file or bearer_token_env",
                    RESERVED_HEADERS.join(", ")
                ));
            }
            if inline_secret::header_name_suggests_secret(&lower)
                || inline_secret::looks_like_secret(value)
            {
                return Err(format!(
                    "{key} looks like a credential; credentials never go in the config (use bearer_token_file or bearer_token_env; the value is not shown)"
                ));
            }
            if value.len() > MAX_HEADER_VALUE_BYTES || !valid_header_value(value) {
                return Err(format!(
                    "{key}: a header value must be printable ASCII of at most {MAX_HEADER_VALUE_BYTES} bytes (the value is not shown)"
                ));
            }
        }
        match (&self.bearer_token_file, &self.bearer_token_env) {
            (Some(_), Some(_)) => {
                return Err(format!(
                    "servers.{name}: set bearer_token_file or bearer_token_env, not both"
                ));
            }
            (Some(path), None) if path.as_os_str().is_empty() => {
                return Err(format!("{} is empty", at("bearer_token_file")));
            }
            (None, Some(var)) if !valid_env_name(var) => {
                let hint = if inline_secret::looks_like_secret(var) {
                    "; it looks like a token itself: put the token in that variable, and the variable's name here"
                } else {
                    ""
                };
                return Err(format!(
                    "{} must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*){hint} (the value is not shown)",
                    at("bearer_token_env")
                ));
            }
            _ => {}
        }
        for (key, value) in [
            ("max_tools", self.max_tools),
            ("max_resources", self.max_resources),
            ("max_prompts", self.max_prompts),
            ("max_resource_templates", self.max_resource_templates),
            ("max_listing_bytes", self.max_listing_bytes),
            ("max_pages", self.max_pages),
        ] {
            if value == Some(0) {
                return Err(format!("{} must be greater than 0", at(key)));
            }
        }
        if self
            .max_listing_bytes
            .is_some_and(|b| b > MAX_LISTING_BYTES_LIMIT)
        {
            return Err(format!(
                "{} must be at most {MAX_LISTING_BYTES_LIMIT} (a listing must fit one worker message)",
                at("max_listing_bytes")
            ));
        }
        if self.owns_resources.len() > MAX_OWNS_RESOURCES {
            return Err(format!(
                "{} has more than {MAX_OWNS_RESOURCES} patterns",
                at("owns_resources")
            ));
        }
        for pattern in &self.owns_resources {
            crate::mcp::catalog::resource_owners::compile_pattern(pattern)
                .map_err(|e| format!("{}: {e}", at("owns_resources")))?;
        }
        if self.pin == PinMode::Off && self.new_tools.is_some() {
            return Err(format!(
                "{} has no effect with pin = \"off\" (nothing is pinned)",
                at("new_tools")
            ));
        }
        if self.timeout_secs == 0 || self.timeout_secs > MAX_TIMEOUT_SECS {
            return Err(format!(
                "{} must be from 1 to {MAX_TIMEOUT_SECS} seconds",
                at("timeout_secs")
            ));
        }
        Ok(())
    }

    fn validate_url(&self, name: &str) -> Result<(), String> {
        let key = format!("servers.{name}.url");
        if self.url.is_empty() {
            return Err(format!("{key} is required"));
        }
        // Checked before parsing, so no parse error can echo a password or a query token.
        let authority_end = self
            .url
            .find("://")
            .map(|i| i + 3)
            .map(|start| {
                start
                    + self.url[start..]
                        .find(['/', '?', '#'])
                        .unwrap_or(self.url.len() - start)
            })
            .unwrap_or(0);
        if self.url[..authority_end].contains('@') {
            return Err(format!(
                "{key} holds credentials (user:password@); use bearer_token_file or bearer_token_env (the URL is not shown)"
            ));
        }
        if let Some((_, query)) = self.url.split_once('?') {
            let query = query.split('#').next().unwrap_or("");
            for pair in query.split('&') {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                if inline_secret::key_suggests_secret(&k.to_ascii_lowercase())
                    || inline_secret::looks_like_secret(v)
                {
                    return Err(format!(
                        "{key} carries what looks like a credential in its query; use bearer_token_file or bearer_token_env (the URL is not shown)"
                    ));
                }
            }
        }
        if self.url.contains('#') {
            return Err(format!("{key} must not have a fragment (#...)"));
        }
        match parse_target(&self.url, MAX_URL_BYTES) {
            Ok(_) => Ok(()),
            Err(TargetError::Invalid(why)) | Err(TargetError::Refused(why)) => {
                Err(format!("{key}: {why}"))
            }
        }
    }
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
    fn prefix_defaults_to_true_and_is_a_known_key() {
        let c = load(
            "[servers.a]\nurl = \"http://127.0.0.1:1/mcp\"\n\n[servers.b]\nurl = \"http://127.0.0.1:2/mcp\"\nprefix = false\n",
        )
        .unwrap();
        assert!(c.servers["a"].prefix);
        assert!(!c.servers["b"].prefix);
        let err =
            load("[servers.a]\nurl = \"http://127.0.0.1:1/mcp\"\nprefixes = false\n").unwrap_err();
        assert!(
            err.contains("servers.a.prefixes") && err.contains("prefix,"),
            "{err}"
        );
        assert!(load("[servers.a]\nurl = \"http://127.0.0.1:1/mcp\"\nprefix = \"no\"\n").is_err());
    }

    #[test]
    fn settings_and_servers_share_the_table() {
        let c = load(
            r#"
[servers]
refresh_secs = 30
threads = 4

[servers.github]
url = "https://api.example.com/mcp"
headers = { "X-Client" = "toolwall" }
bearer_token_file = "/etc/toolwall/github.token"
timeout_secs = 20
pin = "warn"
era = "legacy"

[servers.local-files]
url = "http://127.0.0.1:8931/mcp"
enabled = false
"#,
        )
        .unwrap();
        assert_eq!(c.refresh_secs, 30);
        assert_eq!(c.threads, 4);
        assert_eq!(c.queue, DEFAULT_QUEUE);
        let gh = &c.servers["github"];
        assert_eq!(gh.timeout_secs, 20);
        assert_eq!(gh.pin, PinMode::Warn);
        assert_eq!(gh.headers["X-Client"], "toolwall");
        assert_eq!(gh.era, EraChoice::Legacy);
        let lf = &c.servers["local-files"];
        assert!(!lf.enabled);
        assert_eq!(lf.pin, PinMode::Enforce);
        assert_eq!(lf.timeout_secs, DEFAULT_TIMEOUT_SECS);
        assert_eq!(c.enabled().count(), 1);
        let mut other = c.clone();
        other.servers.get_mut("github").unwrap().pin = PinMode::Off;
        other.refresh_secs = 5;
        assert!(c.same_connections(&other));
        other.servers.get_mut("github").unwrap().url = "https://other.example.com/mcp".into();
        assert!(!c.same_connections(&other));
    }

    #[test]
    fn subscription_limits_are_keys_with_bounds() {
        let c = load("[servers]\nmax_server_subscriptions = 10\nsubscription_recheck_secs = 2\n")
            .unwrap();
        assert_eq!(
            (c.max_server_subscriptions, c.subscription_recheck_secs),
            (10, 2)
        );
        let d = ServersConfig::default();
        assert_eq!(
            (d.max_server_subscriptions, d.subscription_recheck_secs),
            (4096, 5)
        );
        for (text, key) in [
            (
                "max_server_subscriptions = 0",
                "servers.max_server_subscriptions",
            ),
            (
                "max_server_subscriptions = 65537",
                "servers.max_server_subscriptions",
            ),
            (
                "subscription_recheck_secs = 0",
                "servers.subscription_recheck_secs",
            ),
            (
                "subscription_recheck_secs = 301",
                "servers.subscription_recheck_secs",
            ),
        ] {
            let err = load(&format!("[servers]\n{text}\n")).unwrap_err();
            assert!(err.contains(key), "{text}: {err}");
        }
        assert!(load("[servers]\nsubscription_recheck_secs = 300\n").is_ok());
        assert_eq!(d.reuse_idle_ms, 1000);
        assert_eq!(
            load("[servers]\nreuse_idle_ms = 0\n")
                .unwrap()
                .reuse_idle_ms,
            0
        );
        let err = load("[servers]\nreuse_idle_ms = 60001\n").unwrap_err();
        assert!(err.contains("servers.reuse_idle_ms"), "{err}");
        // Both reach the worker's setup, so a change needs a new one.
        let mut other = c.clone();
        other.subscription_recheck_secs = 3;
        assert!(!c.same_connections(&other));
        let limits = crate::aggregator::setup::Limits::from_config(&c);
        assert_eq!(
            (
                limits.max_server_subscriptions,
                limits.subscription_recheck_secs
            ),
            (10, 2)
        );
    }

    #[test]
    fn empty_and_absent_are_defaults() {
        assert_eq!(load("").unwrap(), ServersConfig::default());
        assert_eq!(load("[servers]\n").unwrap(), ServersConfig::default());
    }

    #[test]
    fn bad_names_are_load_errors() {
        for (name, needle) in [
            ("local", "reserved"),
            ("toolwall", "reserved"),
            ("ws", "reserved"),
            ("a__b", "__"),
            ("Up", "a-z"),
            ("\"a b\"", "a-z"),
            ("\"é\"", "a-z"),
        ] {
            let text = format!("[servers.{name}]\nurl = \"http://127.0.0.1:1/\"\n");
            let err = load(&text).unwrap_err();
            assert!(err.contains(needle), "{name}: {err}");
        }
    }

    #[test]
    fn inline_tokens_are_refused_without_being_printed() {
        let secret = "sk-live-4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c";
        let cases = [
            format!("[servers.a]\nurl = \"http://127.0.0.1:1/\"\nbearer_token = \"{secret}\"\n"),
            format!("[servers.a]\nurl = \"http://127.0.0.1:1/\"\ntoken = \"{secret}\"\n"),
            format!(
                "[servers.a]\nurl = \"http://127.0.0.1:1/\"\nheaders = {{ \"X-Api-Key\" = \"{secret}\" }}\n"
            ),
            format!(
                "[servers.a]\nurl = \"http://127.0.0.1:1/\"\nheaders = {{ \"X-Thing\" = \"{secret}\" }}\n"
            ),
            format!(
                "[servers.a]\nurl = \"http://127.0.0.1:1/\"\nheaders = {{ Authorization = \"Bearer {secret}\" }}\n"
            ),
            format!(
                "[servers.a]\nurl = \"http://127.0.0.1:1/\"\nbearer_token_env = \"{secret}\"\n"
            ),
            format!("[servers.a]\nurl = \"http://user:{secret}@127.0.0.1:1/\"\n"),
            format!("[servers.a]\nurl = \"http://127.0.0.1:1/mcp?api_key={secret}\"\n"),
            format!("[servers.a]\nurl = \"http://127.0.0.1:1/mcp?x={secret}\"\n"),
            format!("[servers]\ntoken = \"{secret}\"\n"),
            format!("[servers]\na = [\"{secret}\"]\n"),
        ];
        for text in &cases {
            let err = load(text).expect_err(text);
            assert!(!err.contains(secret), "printed the secret: {err}");
            assert!(!err.contains("4f9a8b"), "printed part of the secret: {err}");
        }
    }

    #[test]
    fn reserved_headers_cannot_be_overridden() {
        for header in [
            "Accept",
            "mcp-session-id",
            "MCP-Protocol-Version",
            "Authorization",
            "Host",
        ] {
            let text = format!(
                "[servers.a]\nurl = \"http://127.0.0.1:1/\"\nheaders = {{ \"{header}\" = \"x\" }}\n"
            );
            let err = load(&text).unwrap_err();
            assert!(err.contains("cannot be overridden"), "{header}: {err}");
        }
        // Plain, non-secret headers are fine.
        let ok = "[servers.a]\nurl = \"http://127.0.0.1:1/\"\nheaders = { \"X-Tenant\" = \"blue team\" }\n";
        assert!(load(ok).is_ok());
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        let cases = [
            (
                "[servers.a]\nurl = \"http://127.0.0.1:1/\"\nbogus = 1\n",
                "servers.a.bogus",
            ),
            ("[servers.a]\n", "servers.a needs url"),
            ("[servers.a]\nurl = \"ftp://h/\"\n", "servers.a.url"),
            ("[servers.a]\nurl = \"http://h/#x\"\n", "fragment"),
            (
                "[servers.a]\nurl = \"http://h/\"\ntimeout_secs = 0\n",
                "timeout_secs",
            ),
            (
                "[servers.a]\nurl = \"http://h/\"\nbearer_token_file = \"/a\"\nbearer_token_env = \"B\"\n",
                "not both",
            ),
            (
                "[servers.a]\nurl = \"http://h/\"\npin = \"maybe\"\n",
                "maybe",
            ),
            ("[servers]\nthreads = 0\n", "servers.threads"),
            ("[servers]\nmax_body_bytes = 99999999\n", "max_body_bytes"),
            ("[servers]\nrefreshsecs = 5\n", "servers.refreshsecs"),
        ];
        for (text, needle) in cases {
            let err = load(text).unwrap_err();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn type_errors_keep_their_line() {
        let err = load("[servers.a]\nurl = \"http://h/\"\ntimeout_secs = \"ten\"\n").unwrap_err();
        assert!(
            err.contains("timeout_secs") || err.contains("line"),
            "{err}"
        );
    }
}
