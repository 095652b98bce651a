//! The gateway's view of each upstream server, fed by the aggregator worker's events, for
//! `toolwall status` and for deciding what to list again. The worker is not trusted
//! blindly: events naming a server that is not configured are ignored.

use serde::Serialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;

use super::config::{ServerConfig, ServersConfig};
use crate::mcp::catalog::Kind;

/// One server as status shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct UpstreamStatus {
    pub server: String,
    /// `starting`, `connecting`, `up`, `down`, `disabled`, `worker_down`.
    pub state: String,
    /// `legacy 2025-06-18`, `modern 2026-07-28`, or none before the first connection.
    pub era: Option<String>,
    pub last_error: Option<String>,
    pub url: String,
    /// `http`, or `stdio` for a local server.
    pub transport: String,
    /// A local server's program, as configured (the program's name only).
    pub command: Option<String>,
    /// A local server's running program (none while it is down).
    pub pid: Option<i64>,
    /// Times a local server's program was started by its current host.
    pub starts: u64,
    pub pin: String,
    /// Why its catalog is not current (a listing refused or failed), per list; it keeps
    /// serving its last good catalog meanwhile.
    #[serde(skip)]
    pub degraded: BTreeMap<Kind, String>,
    /// `list_changed` notifications folded into a relisting already asked for.
    pub list_changed_coalesced: u64,
    /// Listings applied to the catalog.
    pub listings: u64,
    /// Listed items the worker left out (no usable name or URI, or listed twice).
    pub items_left_out: u64,
}

/// What the gateway should do after an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relist {
    pub server: String,
    pub kinds: Vec<Kind>,
}

#[derive(Debug, Default)]
pub struct UpstreamBoard {
    servers: BTreeMap<String, UpstreamStatus>,
}

/// Longest error text kept from an event.
const MAX_ERROR_CHARS: usize = 1000;

impl UpstreamBoard {
    pub fn new(config: &ServersConfig) -> UpstreamBoard {
        let servers = config
            .servers
            .iter()
            .map(|(name, s)| (name.clone(), Self::entry(name, s)))
            .collect();
        UpstreamBoard { servers }
    }

    fn entry(name: &str, s: &ServerConfig) -> UpstreamStatus {
        UpstreamStatus {
            server: name.to_owned(),
            state: if s.enabled { "starting" } else { "disabled" }.into(),
            era: None,
            last_error: None,
            url: s.url.clone(),
            transport: if s.is_local() { "stdio" } else { "http" }.into(),
            command: s
                .command
                .as_ref()
                .and_then(|c| c.first())
                .map(|c| c.chars().take(200).collect()),
            pid: None,
            starts: 0,
            pin: s.pin.as_str().into(),
            degraded: BTreeMap::new(),
            list_changed_coalesced: 0,
            listings: 0,
            items_left_out: 0,
        }
    }

    /// A server added by a reload: starting, with no history.
    pub fn insert(&mut self, name: &str, s: &ServerConfig) {
        self.servers.insert(name.to_owned(), Self::entry(name, s));
    }

    /// A server taken out of the config by a reload: no longer shown or listed.
    pub fn remove(&mut self, name: &str) -> bool {
        self.servers.remove(name).is_some()
    }

    /// An event from the aggregator worker (`kind`, `detail` as JSON text). Returns the
    /// lists to fetch again, if any.
    pub fn on_event(&mut self, kind: &str, detail: &str) -> Option<Relist> {
        let detail: Value = serde_json::from_str(detail).ok()?;
        let server = detail.get("server")?.as_str()?;
        let entry = self.servers.get_mut(server)?;
        if entry.state == "disabled" {
            return None;
        }
        match kind {
            "upstream_state" => {
                let text = |k: &str| {
                    detail
                        .get(k)
                        .and_then(Value::as_str)
                        .map(|s| s.chars().take(MAX_ERROR_CHARS).collect::<String>())
                };
                if let Some(state) =
                    text("state").filter(|s| matches!(s.as_str(), "connecting" | "up" | "down"))
                {
                    entry.state = state;
                }
                entry.era = text("era");
                entry.last_error = text("last_error");
                if entry.transport == "stdio" {
                    entry.pid = detail.get("pid").and_then(Value::as_i64);
                    if let Some(n) = detail.get("starts").and_then(Value::as_u64) {
                        entry.starts = n;
                    }
                }
                None
            }
            "server_process" if entry.transport == "stdio" => {
                let running = detail.get("running").and_then(Value::as_bool) == Some(true);
                entry.pid = detail
                    .get("pid")
                    .and_then(Value::as_i64)
                    .filter(|_| running);
                if let Some(n) = detail.get("starts").and_then(Value::as_u64) {
                    entry.starts = n;
                }
                None
            }
            "list_changed" => {
                let kinds: Vec<Kind> = detail
                    .get("kinds")?
                    .as_array()?
                    .iter()
                    .filter_map(|k| Kind::parse(k.as_str()?))
                    .collect();
                let coalesced = detail.get("coalesced").and_then(Value::as_u64).unwrap_or(0);
                entry.list_changed_coalesced =
                    entry.list_changed_coalesced.saturating_add(coalesced);
                (!kinds.is_empty()).then(|| Relist {
                    server: server.to_owned(),
                    kinds,
                })
            }
            _ => None,
        }
    }

    /// The worker reaching `servers` is gone: they are unreachable until it is back.
    pub fn on_worker_gone(&mut self, servers: &[String], why: &str) {
        for s in self.servers.values_mut() {
            if s.state != "disabled" && servers.contains(&s.server) {
                s.state = "worker_down".into();
                s.pid = None;
                s.last_error = Some(why.chars().take(MAX_ERROR_CHARS).collect());
            }
        }
    }

    /// Enabled server names, for listing every server (start, refresh, reload).
    pub fn enabled(&self) -> impl Iterator<Item = &str> {
        self.servers
            .values()
            .filter(|s| s.state != "disabled")
            .map(|s| s.server.as_str())
    }

    pub fn get(&self, server: &str) -> Option<&UpstreamStatus> {
        self.servers.get(server)
    }

    /// A listing of `kind` from `server` was refused or failed (`Some`), or applied
    /// (`None`). Returns true when the reason is new (log and record it once, not on every
    /// relisting).
    pub fn set_degraded(&mut self, server: &str, kind: Kind, why: Option<String>) -> bool {
        let Some(entry) = self.servers.get_mut(server) else {
            return false;
        };
        match why {
            Some(why) => {
                let why: String = why.chars().take(MAX_ERROR_CHARS).collect();
                entry.degraded.insert(kind, why.clone()) != Some(why)
            }
            None => {
                entry.listings += 1;
                entry.degraded.remove(&kind).is_some()
            }
        }
    }

    /// `list_changed` notifications the worker or the schedule folded, and listed items it
    /// left out, for `server`.
    pub fn add_counts(&mut self, server: &str, coalesced: u64, left_out: u64) {
        if let Some(e) = self.servers.get_mut(server) {
            e.list_changed_coalesced = e.list_changed_coalesced.saturating_add(coalesced);
            e.items_left_out = e.items_left_out.saturating_add(left_out);
        }
    }

    /// For `status --json`: every server, with what `extra` adds (tool count, conflicts).
    pub fn to_json(&self, extra: impl Fn(&str) -> Value) -> Value {
        Value::Array(
            self.servers
                .values()
                .map(|s| {
                    let mut v = json!(s);
                    v["degraded"] = if s.degraded.is_empty() {
                        Value::Null
                    } else {
                        json!(
                            s.degraded
                                .iter()
                                .map(|(k, why)| format!("{}: {why}", k.word()))
                                .collect::<Vec<_>>()
                                .join("; ")
                        )
                    };
                    if let (Value::Object(to), Value::Object(more)) = (&mut v, extra(&s.server)) {
                        to.extend(more);
                    }
                    v
                })
                .collect(),
        )
    }
}

/// The `servers` part of `toolwall status` as text, from the JSON of [`UpstreamBoard::to_json`].
pub fn format_servers(servers: &Value) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for s in servers.as_array().into_iter().flatten() {
        if s["transport"] == "stdio" {
            let _ = writeln!(
                out,
                "server {}  state {}  era {}  tools {}  pin {}  stdio {}  pid {}  restarts {}",
                s["server"].as_str().unwrap_or(""),
                s["state"].as_str().unwrap_or(""),
                s["era"].as_str().unwrap_or("-"),
                s["tools"],
                s["pin"].as_str().unwrap_or(""),
                super::error::quote_upstream(s["command"].as_str().unwrap_or(""), 200),
                s["pid"].as_i64().map_or("-".to_string(), |p| p.to_string()),
                s["starts"].as_u64().unwrap_or(0).saturating_sub(1)
            );
        } else {
            let _ = writeln!(
                out,
                "server {}  state {}  era {}  tools {}  pin {}  {}",
                s["server"].as_str().unwrap_or(""),
                s["state"].as_str().unwrap_or(""),
                s["era"].as_str().unwrap_or("-"),
                s["tools"],
                s["pin"].as_str().unwrap_or(""),
                s["url"].as_str().unwrap_or("")
            );
        }
        if let Some(e) = s["last_error"].as_str() {
            let _ = writeln!(
                out,
                "    last error: {}",
                super::error::quote_upstream(e, MAX_ERROR_CHARS)
            );
        }
        if let Some(d) = s["degraded"].as_str() {
            let _ = writeln!(
                out,
                "    DEGRADED (serving its last good catalog): {}",
                super::error::quote_upstream(d, MAX_ERROR_CHARS)
            );
        }
        let held = s["tools_hidden"].as_u64().unwrap_or(0);
        if held > 0 {
            let _ = writeln!(
                out,
                "    {held} tools hidden by their pins (see `toolwall pins list`)"
            );
        }
        let coalesced = s["list_changed_coalesced"].as_u64().unwrap_or(0);
        if coalesced > 0 {
            let _ = writeln!(
                out,
                "    {coalesced} list_changed notifications folded into {} listings",
                s["listings"]
            );
        }
        let left_out = s["items_left_out"].as_u64().unwrap_or(0);
        if left_out > 0 {
            let _ = writeln!(
                out,
                "    {left_out} listed items left out (no usable name or URI, or listed twice)"
            );
        }
        let conflicts = s["resource_conflicts"].as_u64().unwrap_or(0);
        if conflicts > 0 {
            let _ = writeln!(
                out,
                "    {conflicts} resource URIs in conflict (not served by this server):"
            );
            for c in s["resource_conflict_sample"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let _ = writeln!(
                    out,
                    "      {}",
                    super::error::quote_upstream(c["why"].as_str().unwrap_or(""), 300)
                );
            }
        }
        let clashes = s["name_clashes"]["count"].as_u64().unwrap_or(0);
        if clashes > 0 {
            let _ = writeln!(
                out,
                "    {clashes} tool or prompt names in clash (served by no server):"
            );
            for c in s["name_clashes"]["sample"].as_array().into_iter().flatten() {
                let _ = writeln!(
                    out,
                    "      {}",
                    super::error::quote_upstream(c["why"].as_str().unwrap_or(""), 300)
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregator::config::ServerConfig;

    fn board() -> UpstreamBoard {
        let mut c = ServersConfig::default();
        c.servers.insert(
            "a".into(),
            ServerConfig {
                url: "http://127.0.0.1:1/".into(),
                ..ServerConfig::default()
            },
        );
        c.servers.insert(
            "off".into(),
            ServerConfig {
                url: "http://127.0.0.1:2/".into(),
                enabled: false,
                ..ServerConfig::default()
            },
        );
        UpstreamBoard::new(&c)
    }

    #[test]
    fn state_and_relists_from_events() {
        let mut b = board();
        assert_eq!(b.enabled().collect::<Vec<_>>(), vec!["a"]);
        assert!(
            b.on_event(
                "upstream_state",
                r#"{"server":"a","state":"up","era":"modern 2026-07-28","last_error":null}"#
            )
            .is_none()
        );
        assert_eq!(b.get("a").unwrap().state, "up");
        assert_eq!(
            b.get("a").unwrap().era.as_deref(),
            Some("modern 2026-07-28")
        );
        let r = b
            .on_event(
                "list_changed",
                r#"{"server":"a","kinds":["tools","bogus"]}"#,
            )
            .unwrap();
        assert_eq!(r.kinds, vec![Kind::Tools]);
        // Unknown or disabled servers, odd states and garbage are ignored.
        assert!(
            b.on_event("list_changed", r#"{"server":"zz","kinds":["tools"]}"#)
                .is_none()
        );
        assert!(
            b.on_event("list_changed", r#"{"server":"off","kinds":["tools"]}"#)
                .is_none()
        );
        b.on_event("upstream_state", r#"{"server":"a","state":"pwned"}"#);
        assert_eq!(b.get("a").unwrap().state, "up");
        assert!(b.on_event("upstream_state", "not json").is_none());
        b.on_worker_gone(&["a".to_string(), "off".to_string()], "killed");
        assert_eq!(b.get("a").unwrap().state, "worker_down");
        assert_eq!(b.get("off").unwrap().state, "disabled");
        let j = b.to_json(|s| json!({"tools": if s == "a" { 3 } else { 0 }}));
        assert_eq!(j[0]["tools"], 3);
        let text = format_servers(&j);
        assert!(text.contains("server a  state worker_down"), "{text}");
    }
}
