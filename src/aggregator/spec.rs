//! The gateway's handles on the aggregator worker: its spec (grant, settings) and the RPC
//! `configure` request.

use std::path::Path;

use super::config::ServersConfig;
use super::prepare::upstream_ports;
use super::setup::AggregatorSetup;
use crate::sandbox::{self, Role, SandboxMode};
use crate::tools::http::HttpToolsConfig;
use crate::workers::rpc::{Message, Op};
use crate::workers::settings::WorkerSettings;
use crate::workers::supervisor::WorkerSpec;

/// The aggregator worker's name in status, the ledger and errors.
pub const WORKER_NAME: &str = "aggregator";

/// The aggregator worker's spec, or `None` when no url server is enabled (then no
/// aggregator runs; local servers have hosts of their own). Its grant: TCP connect to the ports of the enabled servers' URLs, nothing else
/// (no files, no DNS: the gateway resolves upstream hosts and passes the addresses).
/// `state_dir` is the ledger's directory, which the attestation proves unreadable.
pub fn worker_spec(
    servers: &ServersConfig,
    sandbox_mode: SandboxMode,
    state_dir: &Path,
) -> Option<WorkerSpec> {
    servers.enabled().find(|(_, s)| !s.is_local())?;
    let mut grant = sandbox::role_grant_defaults(Role::Aggregator);
    grant.tcp_connect_ports.extend(upstream_ports(servers));
    grant.tcp_connect_ports.sort_unstable();
    grant.tcp_connect_ports.dedup();
    Some(WorkerSpec {
        name: WORKER_NAME.into(),
        role: Role::Aggregator,
        // One worker serves every upstream server; the core asks per server.
        server: String::new(),
        settings: WorkerSettings {
            sandbox_mode,
            tcp_connect_ports: grant.tcp_connect_ports,
            read_paths: grant.read_paths,
            forbidden_probe_dir: std::fs::canonicalize(state_dir)
                .unwrap_or_else(|_| state_dir.to_path_buf()),
            threads: servers.threads,
            queue: servers.queue,
            // Unused by the aggregator; the settings type is shared with the builtin.
            http: HttpToolsConfig::default(),
            // Filled in by the supervisor (`Supervisor::set_secrets`).
            secrets: Vec::new(),
        },
    })
}

/// The first request to a ready aggregator worker. `setup` holds credentials: the message
/// must never be logged or written to the ledger.
pub fn configure_request(id: u64, setup: &AggregatorSetup) -> Message {
    Message::Request {
        id,
        op: Op::Configure {
            setup: serde_json::to_string(setup).unwrap_or_else(|_| "{}".into()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregator::config::ServerConfig;

    #[test]
    fn no_servers_no_worker_and_ports_granted() {
        let mut servers = ServersConfig::default();
        assert!(worker_spec(&servers, SandboxMode::Enforce, Path::new(".")).is_none());
        servers.servers.insert(
            "a".into(),
            ServerConfig {
                url: "http://127.0.0.1:8931/mcp".into(),
                ..ServerConfig::default()
            },
        );
        let spec = worker_spec(&servers, SandboxMode::Enforce, Path::new(".")).unwrap();
        assert_eq!(spec.role, Role::Aggregator);
        assert_eq!(spec.settings.tcp_connect_ports, vec![8931]);
        assert!(spec.settings.read_paths.is_empty());
    }
}
