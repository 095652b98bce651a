//! The admin socket: owner-only (0600), JSON lines, one request and one answer per line.
//! It is the only place a held (`ask`) call can be approved: no agent door can reach it.
//!
//! Requests: `{"op":"status"}`, `{"op":"reload"}`, `{"op":"approvals"}`, `{"op":"attest"}`,
//! `{"op":"approve","id":N}`, `{"op":"deny","id":N,"reason":"..."}`.

use mio::net::UnixListener;
use serde::Deserialize;
use serde_json::{Value, json};
use std::time::Instant;

use crate::config::Config;
use crate::gateway::event_loop::{Gateway, Mode};
use crate::gateway::listeners;
use crate::mcp::catalog::Kind;

/// Largest admin request line.
pub const MAX_ADMIN_REQUEST: usize = 64 * 1024;

pub fn bind(config: &Config, _mode: Mode) -> std::io::Result<Option<UnixListener>> {
    let path = &config.admin.socket;
    if path.as_os_str().is_empty() {
        return Ok(None);
    }
    listeners::bind_unix(path, 0o600).map(Some)
}

#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum Request {
    /// Everything; with `server`, that server's entry, its host worker and its last
    /// stderr lines.
    Status {
        #[serde(default)]
        server: Option<String>,
    },
    Reload,
    Approvals,
    /// Re-run every ready worker's confinement probes inside the live worker.
    Attest,
    Approve {
        id: u64,
    },
    Deny {
        id: u64,
        #[serde(default)]
        reason: Option<String>,
    },
    /// Every tool pin, with a waiting change's old and new definitions.
    Pins,
    /// Approve the definition of a pinned tool (`server__tool`) waiting with `digest`.
    PinApprove {
        tool: String,
        #[serde(default)]
        digest: Option<String>,
    },
}

pub fn handle(gw: &mut Gateway, principal: &str, line: &[u8]) -> Value {
    if line.len() > MAX_ADMIN_REQUEST {
        return json!({"ok": false, "error": format!("request exceeds {MAX_ADMIN_REQUEST} bytes")});
    }
    let request = match serde_json::from_slice::<Request>(line) {
        Ok(r) => r,
        Err(e) => return json!({"ok": false, "error": format!("bad admin request: {e}")}),
    };
    let now = Instant::now();
    match request {
        Request::Status { server: None } => status(gw, now),
        Request::Status { server: Some(name) } => server_status(gw, &name),
        Request::Reload => match gw.reload() {
            Ok(summary) => json!({"ok": true, "message": summary}),
            Err(e) => json!({"ok": false, "error": e}),
        },
        Request::Approvals => json!({"ok": true, "pending": gw.core().pending_approvals(now)}),
        Request::Attest => {
            let workers = gw.core().workers().len();
            let asked = (0..workers)
                .filter(|w| gw.core_mut().request_attest(*w, now))
                .count();
            json!({"ok": true, "asked": asked, "message": format!("{asked} workers re-attesting; see the ledger's worker_reattested events")})
        }
        Request::Approve { id } => decide(gw, id, true, principal, None, now),
        Request::Deny { id, reason } => decide(gw, id, false, principal, reason.as_deref(), now),
        Request::Pins => gw.pins_json(),
        Request::PinApprove { tool, digest } => {
            let who = format!("admin {principal}");
            let digest = match crate::pins::cli_output::check_digest(&tool, digest.as_deref()) {
                Ok(d) => d,
                Err(e) => return json!({"ok": false, "error": e}),
            };
            match gw.approve_pin(&tool, &digest, &who, now) {
                Ok(message) => json!({"ok": true, "message": message}),
                Err(e) => json!({"ok": false, "error": e}),
            }
        }
    }
}

fn decide(
    gw: &mut Gateway,
    id: u64,
    approve: bool,
    principal: &str,
    reason: Option<&str>,
    now: Instant,
) -> Value {
    let who = format!("admin {principal}");
    match gw
        .core_mut()
        .decide_approval(id, approve, &who, reason, now)
    {
        Ok(()) => json!({"ok": true, "id": id, "approved": approve, "by": who}),
        Err(e) => json!({"ok": false, "error": e}),
    }
}

/// `toolwall status SERVER`: the server as `status` shows it, with its last stderr lines,
/// and the worker that reaches it (a local server's own host, or the aggregator).
fn server_status(gw: &Gateway, name: &str) -> Value {
    let core = gw.core();
    let Some(u) = core.upstreams() else {
        return json!({"ok": false, "error": "no upstream servers are configured"});
    };
    let Some(entry) = u.server_json(name, core.catalog()) else {
        return json!({"ok": false, "error": format!("no server named {name:?} is configured")});
    };
    let proc_ = u
        .worker_of(name)
        .and_then(|id| gw.supervisor().workers.iter().find(|w| w.id == id));
    let worker = proc_.map(worker_json);
    let cgroup = proc_
        .filter(|w| w.spec.role == crate::sandbox::Role::StdioServer)
        .map(|w| host_cgroup_json(gw, &w.host));
    json!({"ok": true, "server": entry, "worker": worker, "cgroup": cgroup})
}

/// A local server's cgroup, its limits and use; or why it has none.
fn host_cgroup_json(gw: &Gateway, host: &crate::workers::supervisor::WorkerHost) -> Value {
    use crate::workers::supervisor::WorkerHost;
    if let WorkerHost::AgentUser {
        cgroup: Some(dir), ..
    } = host
    {
        let mut v = crate::launcher::cgroup_tree::usage_json(dir);
        v["in_force"] = json!(true);
        return v;
    }
    let reason = match (host, gw.supervisor().agents.as_ref()) {
        (WorkerHost::Gateway, _) => {
            "it runs as toolwall's own user, outside the cgroup tree".to_string()
        }
        (_, Some(plan)) => match &plan.cgroups {
            crate::launcher::cgroup_tree::CgroupTree::Off(reason) => reason.clone(),
            _ => "none was made for it".to_string(),
        },
        (_, None) => "no agent plan".to_string(),
    };
    json!({"in_force": false, "reason": reason})
}

fn worker_json(w: &crate::workers::supervisor::WorkerProc) -> Value {
    // The one verdict: the same gaps the supervisor refuses a worker for.
    let gaps = w.report.as_ref().map(|r| r.gaps());
    json!({
        "confined": gaps.as_ref().is_some_and(Vec::is_empty),
        "gaps": gaps,
        "name": w.spec.name,
        "role": w.spec.role.to_string(),
        "server": w.spec.server,
        "pid": w.pid,
        "state": w.state.as_str(),
        "restarts": w.restarts,
        "last_exit": w.last_exit,
        "confinement": w.report,
        "warnings": w.warnings,
    })
}

fn status(gw: &Gateway, now: Instant) -> Value {
    let core = gw.core();
    let workers: Vec<Value> = gw.supervisor().workers.iter().map(worker_json).collect();
    json!({
        "ok": true,
        "version": env!("CARGO_PKG_VERSION"),
        "ready": gw.is_ready(),
        "uptime_s": now.saturating_duration_since(gw.started).as_secs(),
        "connections": gw.live_connections(),
        "seats": gw.door_seats(),
        "in_flight": core.in_flight_total(),
        "counters": core.counters,
        "tools": core.catalog().len(Kind::Tools),
        "ledger": {"path": gw.config().ledger.path, "writable": core.ledger_ok()},
        "policy": {"rules": core.policy().rule_count(), "default": format!("{:?}", core.policy().default_verdict()).to_lowercase()},
        "sandbox_mode": format!("{:?}", gw.config().sandbox.mode).to_lowercase(),
        "agents": gw.supervisor().agents.as_ref().map(|a| a.status_json()),
        "last_reload": gw.last_reload,
        "reloads": gw.reloads,
        "workers": workers,
        "servers": core.upstreams().map(|u| u.status_json(core.catalog())).unwrap_or_else(|| json!([])),
    })
}
