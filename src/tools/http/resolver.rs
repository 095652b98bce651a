//! Name resolution done once per hop, and the ureq resolver that hands ureq only the
//! address toolwall checked.
//!
//! toolwall resolves the name itself (one lookup, on a helper thread so a stuck lookup
//! cannot outlive the call's timeout), checks every address, and then gives ureq an agent
//! whose resolver knows exactly one checked address. ureq never looks the name up again,
//! so DNS cannot answer differently between the check and the connection.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::mpsc;
use std::time::Duration;

use ureq::config::Config;
use ureq::http::Uri;
use ureq::unversioned::resolver::{ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::NextTimeout;

use super::outcome::{ErrorCode, ToolError};

/// Addresses kept from one lookup; a name with more is unusual and its tail is dropped
/// after being checked like the rest.
pub const MAX_ADDRESSES_TRIED: usize = 16;

/// Largest number of addresses read from one lookup (all are checked).
const MAX_ADDRESSES_READ: usize = 256;

/// Resolve `name` for `port` with the system resolver, within `timeout`.
pub fn resolve_name(
    name: &str,
    port: u16,
    timeout: Duration,
) -> Result<Vec<SocketAddr>, ToolError> {
    let (tx, rx) = mpsc::sync_channel(1);
    let query = name.to_string();
    // The lookup thread is detached: when the lookup outlives the timeout it finishes on
    // its own (the C resolver has its own timeouts) and its answer is dropped.
    std::thread::Builder::new()
        .name("http-dns".into())
        .spawn(move || {
            let answer = (query.as_str(), port)
                .to_socket_addrs()
                .map(|addrs| addrs.take(MAX_ADDRESSES_READ).collect::<Vec<_>>());
            let _ = tx.send(answer);
        })
        .map_err(|e| {
            ToolError::new(
                ErrorCode::InternalError,
                format!("cannot start a lookup: {e}"),
            )
        })?;
    match rx.recv_timeout(timeout) {
        Ok(Ok(mut addrs)) => {
            let mut seen = Vec::with_capacity(addrs.len());
            addrs.retain(|a| {
                let new = !seen.contains(a);
                seen.push(*a);
                new
            });
            if addrs.is_empty() {
                Err(ToolError::new(
                    ErrorCode::ConnectFailed,
                    format!("{name} has no addresses"),
                ))
            } else {
                Ok(addrs)
            }
        }
        Ok(Err(e)) => Err(ToolError::new(
            ErrorCode::ConnectFailed,
            format!("cannot resolve {name}: {e}"),
        )),
        Err(mpsc::RecvTimeoutError::Timeout) => Err(ToolError::new(
            ErrorCode::Timeout,
            format!(
                "resolving {name} took longer than {} ms",
                timeout.as_millis()
            ),
        )),
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(ToolError::new(
            ErrorCode::InternalError,
            format!("the lookup of {name} ended without an answer"),
        )),
    }
}

/// A ureq resolver that knows one URI authority and the addresses checked for it (at most
/// [`MAX_ADDRESSES_TRIED`]), and refuses anything else. The HTTP tools pin one address per
/// attempt; the aggregator pins a server's checked list.
pub struct PinnedResolver {
    authority: String,
    addrs: Vec<SocketAddr>,
}

impl PinnedResolver {
    pub fn new(uri: &Uri, addrs: &[SocketAddr]) -> PinnedResolver {
        PinnedResolver {
            authority: uri
                .authority()
                .map(|a| a.as_str().to_string())
                .unwrap_or_default(),
            addrs: addrs.iter().take(MAX_ADDRESSES_TRIED).copied().collect(),
        }
    }
}

impl fmt::Debug for PinnedResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedResolver")
            .field("authority", &self.authority)
            .field("addrs", &self.addrs)
            .finish()
    }
}

impl Resolver for PinnedResolver {
    fn resolve(
        &self,
        uri: &Uri,
        _config: &Config,
        _timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let asked = uri.authority().map(|a| a.as_str()).unwrap_or("");
        if self.authority.is_empty() || self.addrs.is_empty() || asked != self.authority {
            // Only the checked URI may be connected to; anything else fails closed.
            return Err(ureq::Error::HostNotFound);
        }
        let mut out = self.empty();
        for addr in &self.addrs {
            out.push(*addr);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_numeric_names_and_localhost_from_hosts_file() {
        let addrs = resolve_name("localhost", 80, Duration::from_secs(5)).unwrap();
        assert!(addrs.iter().all(|a| a.ip().is_loopback()), "{addrs:?}");
    }

    #[test]
    fn pinned_resolver_refuses_other_authorities() {
        let uri: Uri = "http://example.com:8080/x".parse().unwrap();
        let addr: SocketAddr = "93.184.216.34:8080".parse().unwrap();
        let r = PinnedResolver::new(&uri, &[addr]);
        let config = Config::default();
        let timeout = NextTimeout {
            after: ureq::unversioned::transport::time::Duration::NotHappening,
            reason: ureq::Timeout::Global,
            per_read: None,
            per_write: None,
        };
        let got = r.resolve(&uri, &config, timeout).unwrap();
        assert_eq!(&got[..], &[addr]);
        let other: Uri = "http://evil.example:8080/".parse().unwrap();
        assert!(r.resolve(&other, &config, timeout).is_err());
    }
}
