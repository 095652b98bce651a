//! The gateway's side of the `configure` request: read each server's credential (file or
//! environment variable of the gateway), resolve its host and check every address with the
//! HTTP tools' address policy (the configured host:port allowed on purpose), and list the
//! TCP ports the aggregator's sandbox must grant. Blocking (files, DNS): run it before the
//! loop starts or on reload, never per request.

use std::io::Read;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use super::config::{MAX_URL_BYTES, ServerConfig, ServersConfig};
use super::setup::{AggregatorSetup, Limits, Secret, UpstreamSetup};
use crate::tools::http::{AddressPolicy, TargetHost, parse_target, resolve_name};

/// Largest token file read.
pub const MAX_TOKEN_BYTES: u64 = 16 * 1024;

/// The bearer token of a server, if it has one. Errors name the key and the file or
/// variable, never the content.
pub fn read_credential(name: &str, server: &ServerConfig) -> Result<Option<Secret>, String> {
    let token = match (&server.bearer_token_file, &server.bearer_token_env) {
        (Some(path), _) => read_token_file(name, path)?,
        (None, Some(var)) => std::env::var(var).map_err(|e| {
            format!(
                "servers.{name}.bearer_token_env: the gateway's variable {var} is unusable: {e}"
            )
        })?,
        (None, None) => return Ok(None),
    };
    let token = token.trim().to_owned();
    let source = if server.bearer_token_file.is_some() {
        "bearer_token_file"
    } else {
        "bearer_token_env"
    };
    if token.is_empty() {
        return Err(format!("servers.{name}.{source}: the token is empty"));
    }
    // It becomes a header value: printable ASCII, no spaces inside, no line breaks.
    if !token.bytes().all(|b| (0x21..0x7f).contains(&b)) {
        return Err(format!(
            "servers.{name}.{source}: the token holds spaces, line breaks or non-ASCII characters (it is not shown)"
        ));
    }
    Ok(Some(Secret::new(token)))
}

fn read_token_file(name: &str, path: &Path) -> Result<String, String> {
    use std::os::unix::fs::MetadataExt;
    let key = format!("servers.{name}.bearer_token_file");
    let file = std::fs::File::open(path).map_err(|e| format!("{key}: {}: {e}", path.display()))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("{key}: {}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{key}: {} is not a regular file", path.display()));
    }
    if meta.len() > MAX_TOKEN_BYTES {
        return Err(format!(
            "{key}: {} is larger than {MAX_TOKEN_BYTES} bytes",
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
    file.take(MAX_TOKEN_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("{key}: {}: {e}", path.display()))?;
    Ok(text)
}

/// The address policy entry that allows a configured server's host on purpose.
fn allow_entry(host: &TargetHost, port: u16) -> String {
    match host {
        TargetHost::Name(name) => format!("{name}:{port}"),
        TargetHost::Ip(ip) => std::net::SocketAddr::new(*ip, port).to_string(),
    }
}

/// Resolve a server's host (the system resolver, bounded by `timeout`) and check every
/// address with the address policy. The error names the server.
pub fn checked_addresses(
    name: &str,
    url: &str,
    timeout: Duration,
) -> Result<Vec<SocketAddr>, String> {
    let target =
        parse_target(url, MAX_URL_BYTES).map_err(|e| format!("servers.{name}.url: {e:?}"))?;
    let policy = AddressPolicy::new(&[], &[allow_entry(&target.host, target.port)])
        .map_err(|e| format!("servers.{name}.url: {e}"))?;
    policy
        .check_port(&target.host, target.port)
        .map_err(|e| format!("servers.{name}: {e}"))?;
    let addrs = match &target.host {
        TargetHost::Ip(ip) => vec![SocketAddr::new(*ip, target.port)],
        TargetHost::Name(host) => resolve_name(host, target.port, timeout)
            .map_err(|e| format!("server {name}: {}", e.message))?,
    };
    let ips: Vec<_> = addrs.iter().map(SocketAddr::ip).collect();
    policy
        .check_all(&target.host, target.port, &ips)
        .map_err(|e| format!("server {name}: address refused: {e}"))?;
    Ok(addrs)
}

/// The TCP ports the aggregator worker must be granted: one per enabled server.
pub fn upstream_ports(servers: &ServersConfig) -> Vec<u16> {
    let mut ports: Vec<u16> = servers
        .enabled()
        .filter_map(|(_, s)| parse_target(&s.url, MAX_URL_BYTES).ok().map(|t| t.port))
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// Everything the aggregator worker needs, for every enabled url server (local servers
/// have hosts of their own). Resolves all hosts at once (one
/// thread each), so the wait is the slowest lookup, not their sum. A server whose
/// credential or addresses fail is still listed, as unusable, with the reason.
pub fn build_setup(servers: &ServersConfig) -> AggregatorSetup {
    let timeout = Duration::from_secs(servers.connect_timeout_secs);
    type Lookup = std::thread::JoinHandle<Result<Vec<SocketAddr>, String>>;
    let lookups: Vec<(String, Lookup)> = servers
        .enabled()
        .filter(|(_, s)| !s.is_local())
        .filter_map(|(name, s)| {
            let (n, url) = (name.clone(), s.url.clone());
            std::thread::Builder::new()
                .name("upstream-dns".into())
                .spawn(move || checked_addresses(&n, &url, timeout))
                .ok()
                .map(|h| (name.clone(), h))
        })
        .collect();
    let mut resolved: std::collections::HashMap<String, Result<Vec<SocketAddr>, String>> = lookups
        .into_iter()
        .map(|(name, h)| {
            let r = h
                .join()
                .unwrap_or_else(|_| Err(format!("server {name}: the lookup failed")));
            (name, r)
        })
        .collect();
    let mut out = Vec::new();
    for (name, server) in servers.enabled().filter(|(_, s)| !s.is_local()) {
        let mut unusable = None;
        let addresses = match resolved.remove(name) {
            Some(Ok(a)) => a,
            Some(Err(e)) => {
                unusable = Some(e);
                Vec::new()
            }
            None => {
                unusable = Some(format!("server {name}: its lookup could not start"));
                Vec::new()
            }
        };
        let bearer_token = match read_credential(name, server) {
            Ok(t) => t,
            Err(e) => {
                unusable.get_or_insert(e);
                None
            }
        };
        if let Some(why) = &unusable {
            crate::warn!("{why}; server {name} stays down until reload");
        }
        out.push(UpstreamSetup {
            name: name.clone(),
            url: server.url.clone(),
            headers: server
                .headers
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            bearer_token,
            timeout_secs: server.timeout_secs,
            era: server.era,
            addresses,
            unusable,
            secret_env: Vec::new(),
        });
    }
    AggregatorSetup {
        limits: Limits::from_config(servers),
        servers: out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn server(url: &str) -> ServerConfig {
        ServerConfig {
            url: url.into(),
            ..ServerConfig::default()
        }
    }

    #[test]
    fn token_from_file_trimmed_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        std::fs::write(&path, "tok-123\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut s = server("http://127.0.0.1:1/");
        s.bearer_token_file = Some(path.clone());
        assert_eq!(
            read_credential("a", &s).unwrap().unwrap().expose(),
            "tok-123"
        );
        std::fs::write(&path, "two words").unwrap();
        let e = read_credential("a", &s).unwrap_err();
        assert!(!e.contains("two words"), "{e}");
        std::fs::write(&path, "").unwrap();
        assert!(read_credential("a", &s).unwrap_err().contains("empty"));
        s.bearer_token_file = Some(dir.path().join("missing"));
        assert!(
            read_credential("a", &s)
                .unwrap_err()
                .contains("bearer_token_file")
        );
        assert!(
            read_credential("a", &server("http://h/"))
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn literal_and_localhost_addresses_are_allowed_on_purpose() {
        let a =
            checked_addresses("a", "http://127.0.0.1:8931/mcp", Duration::from_secs(5)).unwrap();
        assert_eq!(a, vec!["127.0.0.1:8931".parse().unwrap()]);
        let a =
            checked_addresses("a", "http://localhost:8931/mcp", Duration::from_secs(5)).unwrap();
        assert!(
            a.iter().all(|a| a.ip().is_loopback() && a.port() == 8931),
            "{a:?}"
        );
        let e = checked_addresses("a", "http://no-such-host.invalid/", Duration::from_secs(5))
            .unwrap_err();
        assert!(e.contains("server a"), "{e}");
    }

    #[test]
    fn ports_and_setup() {
        let mut servers = ServersConfig::default();
        servers
            .servers
            .insert("a".into(), server("http://127.0.0.1:8931/mcp"));
        servers
            .servers
            .insert("b".into(), server("https://127.0.0.1/mcp"));
        let mut off = server("http://127.0.0.1:7000/");
        off.enabled = false;
        servers.servers.insert("c".into(), off);
        assert_eq!(upstream_ports(&servers), vec![443, 8931]);
        let setup = build_setup(&servers);
        assert_eq!(setup.servers.len(), 2);
        assert!(setup.servers.iter().all(|s| s.unusable.is_none()));
        assert_eq!(
            setup.servers[1].addresses,
            vec!["127.0.0.1:443".parse().unwrap()]
        );
    }
}
