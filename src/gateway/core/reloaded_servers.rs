//! Upstream servers a reload adds or takes away: a removed server leaves the catalog at
//! once (its tools, prompts, resources and templates; agents are told the lists changed)
//! and its calls fail when its worker is gone; an added local server gets a worker slot
//! and is listed when its host is ready. The loop starts and stops the hosts.

use serde_json::json;
use std::time::Instant;

use super::{Core, Recorder};
use crate::aggregator::config::ServerConfig;
use crate::aggregator::gateway_state::Applied;
use crate::aggregator::setup::AggregatorSetup;
use crate::log::Level;
use crate::mcp::catalog::WorkerId;

impl<R: Recorder> Core<R> {
    /// `server` is no longer configured. Returns the worker that reached it alone (a
    /// local server's host), for the loop to stop.
    pub fn remove_upstream_server(&mut self, server: &str, now: Instant) -> Option<WorkerId> {
        self.now = now;
        let wall_ms = self.wall_ms();
        let u = self.upstreams.as_mut()?;
        let mut applied = Applied::default();
        let worker = u.remove_server(server, &mut self.catalog, wall_ms, &mut applied);
        self.carry_out(applied);
        self.event("server_removed", json!({"server": server}));
        self.log(
            Level::Info,
            format!("reload: server {server} removed; its tools, resources and prompts are gone"),
        );
        worker
    }

    /// A local server added by a reload: a worker slot named `worker_name`, routed to
    /// `server` with `setup`. The loop starts its host; it is listed once ready.
    pub fn add_local_server(
        &mut self,
        server: &str,
        config: &ServerConfig,
        worker_name: &str,
        setup: AggregatorSetup,
        now: Instant,
    ) -> Option<WorkerId> {
        self.now = now;
        self.upstreams.as_ref()?;
        let worker = self.add_worker(worker_name, server);
        let u = self.upstreams.as_mut()?;
        u.add_local_server(server, config, worker, setup);
        self.event("server_added", json!({"server": server}));
        Some(worker)
    }
}
