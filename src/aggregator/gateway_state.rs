//! What the gateway's core keeps about the aggregator: which worker it is, the `configure`
//! setup (credentials included: it lives only here and in the RPC message), each server's
//! state for `status`, the pin gate, and the refresh schedule. Sans-IO apart from the pin
//! store's SQLite writes; the core calls it at the points named in each method.

use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

use super::config::ServersConfig;
use super::setup::AggregatorSetup;
use super::spec;
use super::status::{Relist, UpstreamBoard};
use crate::ledger::now_ms;
use crate::mcp::catalog::{Catalog, Kind, NAMESPACE_SEP, WorkerId};
use crate::pins::{PinGate, PinReview};
use crate::workers::rpc::{Message, Op};

pub struct UpstreamsState {
    /// The aggregator worker.
    pub worker: WorkerId,
    setup: AggregatorSetup,
    board: UpstreamBoard,
    pins: PinGate,
    refresh: Option<Duration>,
    next_refresh: Option<Instant>,
}

impl UpstreamsState {
    /// `setup` from [`super::prepare::build_setup`]; the pin store opens beside the ledger
    /// (after `Ledger::open` migrated it).
    pub fn new(
        worker: WorkerId,
        config: &ServersConfig,
        setup: AggregatorSetup,
        ledger_path: &Path,
        now: Instant,
    ) -> UpstreamsState {
        let refresh = (config.refresh_secs > 0).then(|| Duration::from_secs(config.refresh_secs));
        UpstreamsState {
            worker,
            setup,
            board: UpstreamBoard::new(config),
            pins: PinGate::open(ledger_path, config),
            refresh,
            next_refresh: refresh.map(|r| now + r),
        }
    }

    pub fn is_worker(&self, worker: WorkerId) -> bool {
        self.worker == worker
    }

    /// `on_worker_ready` of the aggregator: the `configure` request, sent before any
    /// listing. Never log or ledger it (it holds credentials).
    pub fn configure_request(&self, id: u64) -> Message {
        spec::configure_request(id, &self.setup)
    }

    /// The enabled servers, to list each one (start, refresh, worker restart).
    pub fn servers(&self) -> Vec<String> {
        self.board.enabled().map(str::to_owned).collect()
    }

    /// The `name` field of a request to the aggregator: `server` for listings and
    /// `read_resource`, `server__name` for `call_tool` and `get_prompt`.
    pub fn request_name(op: Op, server: &str, upstream: &str) -> String {
        match op {
            Op::CallTool | Op::GetPrompt => format!("{server}{NAMESPACE_SEP}{upstream}"),
            _ => server.to_owned(),
        }
    }

    /// An event from the aggregator (`on_worker_message`): what to list again.
    pub fn on_event(&mut self, kind: &str, detail: &str) -> Option<Relist> {
        self.board.on_event(kind, detail)
    }

    pub fn on_worker_gone(&mut self, why: &str) {
        self.board.on_worker_gone(why);
    }

    /// A `tools` listing of `server` arrived (`complete`, before `Catalog::set`): the
    /// definitions the catalog may show, and the pin notes to record (`events` kind
    /// `pin`) and log.
    pub fn review_tools(&mut self, server: &str, items: Vec<Value>) -> PinReview {
        self.pins.review(server, items, now_ms())
    }

    /// `tools/call` of `tool` (`server__tool`) before "unknown tool": the `pin_changed`
    /// message when the tool is hidden by a changed pin.
    pub fn pin_refusal(&self, tool: &str) -> Option<String> {
        self.pins.refusal(tool).map(str::to_owned)
    }

    /// `toolwall pins approve TOOL` (admin socket): returns the server whose tools must be
    /// listed again.
    pub fn approve_pin(&mut self, tool: &str, by: &str) -> Result<String, String> {
        self.pins.approve(tool, by, now_ms())
    }

    /// `toolwall pins list` (admin socket): `{"ok": true, "pins": [...]}`.
    pub fn pins_json(&self) -> Value {
        json!({"ok": true, "pins": self.pins.list()})
    }

    /// `toolwall status`: each server's state, era, last error and tool count.
    pub fn status_json(&self, catalog: &Catalog) -> Value {
        self.board.to_json(|server| {
            catalog
                .entries(Kind::Tools)
                .filter(|e| e.server == server)
                .count()
        })
    }

    /// The next periodic refresh (`[servers] refresh_secs`), for the loop's timeout.
    pub fn next_refresh(&self) -> Option<Instant> {
        self.next_refresh
    }

    /// On timers: true when every server should be listed again now (and the next
    /// refresh is scheduled).
    pub fn refresh_due(&mut self, now: Instant) -> bool {
        match (self.next_refresh, self.refresh) {
            (Some(t), Some(every)) if t <= now => {
                self.next_refresh = Some(now + every);
                true
            }
            _ => false,
        }
    }

    /// After a reload whose `[servers]` did not change the set of servers: new pin modes
    /// and refresh period. (A changed set of servers needs a new worker: its grant and
    /// setup change.)
    pub fn reconfigure(&mut self, config: &ServersConfig, now: Instant) {
        self.pins.set_modes(config);
        self.refresh = (config.refresh_secs > 0).then(|| Duration::from_secs(config.refresh_secs));
        self.next_refresh = self.refresh.map(|r| now + r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregator::config::ServerConfig;
    use crate::aggregator::setup::Limits;

    #[test]
    fn names_refresh_and_status() {
        assert_eq!(
            UpstreamsState::request_name(Op::CallTool, "gh", "search"),
            "gh__search"
        );
        assert_eq!(
            UpstreamsState::request_name(Op::GetPrompt, "gh", "p"),
            "gh__p"
        );
        assert_eq!(UpstreamsState::request_name(Op::ListTools, "gh", ""), "gh");
        assert_eq!(
            UpstreamsState::request_name(Op::ReadResource, "gh", "x://y"),
            "gh"
        );

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        drop(
            crate::ledger::Ledger::open(&crate::ledger::LedgerConfig {
                path: path.clone(),
                ..Default::default()
            })
            .unwrap(),
        );
        let mut config = ServersConfig {
            refresh_secs: 10,
            ..ServersConfig::default()
        };
        config.servers.insert(
            "gh".into(),
            ServerConfig {
                url: "http://127.0.0.1:1/".into(),
                ..ServerConfig::default()
            },
        );
        let setup = AggregatorSetup {
            limits: Limits::from_config(&config),
            servers: vec![],
        };
        let t0 = Instant::now();
        let mut s = UpstreamsState::new(3, &config, setup, &path, t0);
        assert!(s.is_worker(3));
        assert_eq!(s.servers(), vec!["gh".to_string()]);
        assert!(!s.refresh_due(t0));
        assert!(s.refresh_due(t0 + Duration::from_secs(10)));
        assert_eq!(s.next_refresh(), Some(t0 + Duration::from_secs(20)));
        let review = s.review_tools("gh", vec![json!({"name": "search"})]);
        assert_eq!(review.visible.len(), 1);
        let mut catalog = Catalog::default();
        catalog.set(Kind::Tools, "gh", 3, review.visible).unwrap();
        assert_eq!(s.status_json(&catalog)[0]["tools"], 1);
        assert_eq!(s.pins_json()["pins"][0]["tool"], "gh__search");
    }
}
