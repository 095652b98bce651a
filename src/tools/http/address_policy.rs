//! Where the HTTP tools may connect: decided by toolwall, not by the network.
//!
//! A connection to (host, port, address) is allowed when
//! 1. an `allow` entry `name:port` names this host and port (every address the name
//!    resolves to is then allowed: the operator vouched for the name), or
//! 2. an `allow` entry `ip:port` names this address and port, or
//! 3. the port is 80, 443 or one of `extra_ports`, and the address is public or inside an
//!    `allow` entry `IP` / `CIDR`.
//!
//! An address is public unless `ip_ranges` refuses it. IPv4-mapped IPv6 addresses are
//! treated as the IPv4 address they are; other forms that carry an IPv4 address (IPv4-
//! compatible, NAT64, 6to4, Teredo) are refused when the carried address would be.
//!
//! Every address a name resolves to must be allowed, or the whole request is refused: a
//! name that answers with a mix of public and internal addresses is how rebinding attacks
//! look, and refusing it does not depend on which address the connection would try first.

use std::net::{IpAddr, SocketAddr};

use super::ip_ranges::{V6Class, classify_v6, in_net, v4_refusal};
use super::url_target::{TargetHost, parse_host};

/// Ports allowed without an `allow` entry, besides `extra_ports`.
pub const STANDARD_PORTS: [u16; 2] = [80, 443];

/// One `[builtin.http] allow` exception, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowEntry {
    /// `IP` or `CIDR`: these addresses on the standard ports.
    Net { net: IpAddr, prefix: u8 },
    /// `ip:port` / `[ipv6]:port`: this address on this port.
    Socket { ip: IpAddr, port: u16 },
    /// `name:port`: this host name on this port, whatever it resolves to.
    NamePort { name: String, port: u16 },
}

impl AllowEntry {
    /// Parse one entry; the error says what was wrong with it.
    pub fn parse(text: &str) -> Result<AllowEntry, String> {
        let text = text.trim();
        if let Some((net, prefix)) = text.split_once('/') {
            let net: IpAddr = net
                .parse()
                .map_err(|_| format!("{text:?}: {net:?} is not an IP address"))?;
            let net = net.to_canonical();
            let max = if net.is_ipv4() { 32 } else { 128 };
            let prefix: u8 = prefix
                .parse()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{text:?}: prefix must be a number from 0 to {max}"))?;
            let masked = mask(net, prefix);
            if masked != net {
                return Err(format!(
                    "{text:?}: address has bits set beyond the prefix; did you mean {masked}/{prefix}?"
                ));
            }
            return Ok(AllowEntry::Net { net, prefix });
        }
        if let Ok(ip) = text.parse::<IpAddr>() {
            let ip = ip.to_canonical();
            let prefix = if ip.is_ipv4() { 32 } else { 128 };
            return Ok(AllowEntry::Net { net: ip, prefix });
        }
        if let Ok(sa) = text.parse::<SocketAddr>() {
            if sa.port() == 0 {
                return Err(format!("{text:?}: port must be from 1 to 65535"));
            }
            return Ok(AllowEntry::Socket {
                ip: sa.ip().to_canonical(),
                port: sa.port(),
            });
        }
        let (host, port) = text.rsplit_once(':').ok_or_else(|| {
            format!("{text:?}: expected \"host:port\", \"IP\", \"IP:port\" or \"CIDR\"")
        })?;
        let port: u16 = port
            .parse()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{text:?}: port must be a number from 1 to 65535"))?;
        match parse_host(host) {
            Ok(TargetHost::Name(name)) => Ok(AllowEntry::NamePort { name, port }),
            Ok(TargetHost::Ip(_)) => Err(format!(
                "{text:?}: write IP addresses in their usual form (dotted decimal, or [IPv6]:port)"
            )),
            Err(e) => Err(format!("{text:?}: {e}")),
        }
    }

    /// The port this entry opens beyond the standard ones, if any.
    pub fn port(&self) -> Option<u16> {
        match self {
            AllowEntry::Net { .. } => None,
            AllowEntry::Socket { port, .. } | AllowEntry::NamePort { port, .. } => Some(*port),
        }
    }
}

fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let m = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4((u32::from(v4) & m).into())
        }
        IpAddr::V6(v6) => {
            let m = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6((u128::from(v6) & m).into())
        }
    }
}

/// The address policy of one configuration.
#[derive(Debug, Clone)]
pub struct AddressPolicy {
    ports: Vec<u16>,
    allow: Vec<AllowEntry>,
}

impl AddressPolicy {
    /// Build from `extra_ports` and the `allow` entries; the error names the bad entry.
    pub fn new(extra_ports: &[u16], allow: &[String]) -> Result<AddressPolicy, String> {
        if extra_ports.contains(&0) {
            return Err("extra_ports: port 0 is not a port".into());
        }
        let mut ports: Vec<u16> = STANDARD_PORTS.to_vec();
        ports.extend_from_slice(extra_ports);
        let allow = allow
            .iter()
            .map(|e| AllowEntry::parse(e))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(AddressPolicy { ports, allow })
    }

    /// Every TCP port a connection may go to: what the sandbox must grant.
    pub fn all_ports(&self) -> Vec<u16> {
        let mut ports = self.ports.clone();
        ports.extend(self.allow.iter().filter_map(AllowEntry::port));
        ports.sort_unstable();
        ports.dedup();
        ports
    }

    /// Before resolving: refuse a port that no address could be allowed on, so a refused
    /// URL costs no DNS lookup.
    pub fn check_port(&self, host: &TargetHost, port: u16) -> Result<(), String> {
        let opened = self.ports.contains(&port)
            || self.allow.iter().any(|e| match e {
                AllowEntry::Socket { port: p, .. } => *p == port,
                AllowEntry::NamePort { name, port: p } => {
                    *p == port && *host == TargetHost::Name(name.clone())
                }
                AllowEntry::Net { .. } => false,
            });
        if opened {
            Ok(())
        } else {
            Err(format!(
                "port {port} is not allowed (allowed: {}; more need an allow entry or extra_ports)",
                join(&self.ports)
            ))
        }
    }

    /// Whether a connection to `addr` on `port`, for a URL naming `host`, is allowed; the
    /// error says why not.
    pub fn check(&self, host: &TargetHost, port: u16, addr: IpAddr) -> Result<(), String> {
        if let TargetHost::Name(name) = host {
            let vouched = self.allow.iter().any(|e| {
                matches!(e, AllowEntry::NamePort { name: n, port: p } if n == name && *p == port)
            });
            if vouched {
                return Ok(());
            }
        }
        let addr = addr.to_canonical();
        let exact = self
            .allow
            .iter()
            .any(|e| matches!(e, AllowEntry::Socket { ip, port: p } if *ip == addr && *p == port));
        if exact {
            return Ok(());
        }
        if !self.ports.contains(&port) {
            return Err(format!("port {port} is not allowed for {addr}"));
        }
        self.check_address(addr)
    }

    /// Check every address a host resolved to: all must be allowed, or the first refusal
    /// is the answer (see the module comment for why one refused address refuses all).
    pub fn check_all(&self, host: &TargetHost, port: u16, addrs: &[IpAddr]) -> Result<(), String> {
        if addrs.is_empty() {
            return Err("no addresses to check".into());
        }
        addrs
            .iter()
            .try_for_each(|addr| self.check(host, port, *addr))
    }

    fn in_allowed_net(&self, addr: IpAddr) -> bool {
        self.allow
            .iter()
            .any(|e| matches!(e, AllowEntry::Net { net, prefix } if in_net(addr, *net, *prefix)))
    }

    fn check_address(&self, addr: IpAddr) -> Result<(), String> {
        if self.in_allowed_net(addr) {
            return Ok(());
        }
        match addr {
            IpAddr::V4(v4) => match v4_refusal(v4) {
                None => Ok(()),
                Some(why) => Err(format!("{v4} is {why}")),
            },
            IpAddr::V6(v6) => match classify_v6(v6) {
                V6Class::Public => Ok(()),
                V6Class::Refused(why) => Err(format!("{v6} is {why}")),
                V6Class::Embeds { form, v4 } => {
                    if self.in_allowed_net(IpAddr::V4(v4)) {
                        return Ok(());
                    }
                    match v4_refusal(v4) {
                        None => Ok(()),
                        Some(why) => Err(format!("{v6} is {form} for {v4}, which is {why}")),
                    }
                }
            },
        }
    }
}

fn join(ports: &[u16]) -> String {
    let mut sorted = ports.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    sorted
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::http::url_target::parse_target;

    fn policy(extra: &[u16], allow: &[&str]) -> AddressPolicy {
        let allow: Vec<String> = allow.iter().map(|s| s.to_string()).collect();
        AddressPolicy::new(extra, &allow).unwrap()
    }

    /// The decision for a URL whose host resolved to `addr` (or is that literal).
    fn decide(p: &AddressPolicy, url: &str, addr: Option<&str>) -> Result<(), String> {
        let t = parse_target(url, 8192).map_err(|e| format!("{e:?}"))?;
        p.check_port(&t.host, t.port)?;
        let ip = match (&t.host, addr) {
            (TargetHost::Ip(ip), _) => *ip,
            (TargetHost::Name(_), Some(a)) => a.parse().unwrap(),
            (TargetHost::Name(_), None) => panic!("name needs an address"),
        };
        p.check(&t.host, t.port, ip)
    }

    #[test]
    fn refused_literals_by_default() {
        let p = policy(&[], &[]);
        for url in [
            "http://127.0.0.1/",
            "http://127.255.0.1/",
            "http://10.1.2.3/",
            "http://172.16.0.1/",
            "http://172.31.255.254/",
            "http://192.168.1.1/",
            "http://169.254.169.254/latest/meta-data/",
            "http://100.64.0.1/",
            "http://198.18.0.1/",
            "http://198.19.255.1/",
            "http://192.0.2.1/",
            "http://198.51.100.7/",
            "http://203.0.113.9/",
            "http://192.0.0.8/",
            "http://224.0.0.1/",
            "http://239.255.255.250/",
            "http://240.0.0.1/",
            "http://255.255.255.255/",
            "http://0.0.0.0/",
            "http://0.1.2.3/",
            "http://[::]/",
            "http://[::1]/",
            "http://[fc00::1]/",
            "http://[fd12:3456::1]/",
            "http://[fe80::1]/",
            "http://[fec0::1]/",
            "http://[ff02::1]/",
            "http://[2001:db8::1]/",
            // IPv4 carried inside IPv6.
            "http://[::ffff:127.0.0.1]/",
            "http://[::ffff:10.0.0.1]/",
            "http://[::ffff:7f00:1]/",
            "http://[::127.0.0.1]/",
            "http://[::192.168.0.1]/",
            "http://[2002:7f00:1::]/",
            "http://[2002:a9fe:a9fe::1]/",
            "http://[64:ff9b::127.0.0.1]/",
            "http://[64:ff9b::10.0.0.1]/",
            "http://[64:ff9b:1::8.8.8.8]/",
            "http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/",
            // Numeric tricks.
            "http://2130706433/",
            "http://0x7f.1/",
            "http://0177.0.0.1/",
            "http://127.1/",
            "http://127.0.0.1./",
            "http://0/",
            "http://0xa9fea9fe/",
            "http://3232235777/",
        ] {
            assert!(decide(&p, url, None).is_err(), "{url} was allowed");
        }
    }

    #[test]
    fn public_literals_are_allowed_on_standard_ports() {
        let p = policy(&[], &[]);
        for url in [
            "http://8.8.8.8/",
            "https://1.1.1.1/",
            "http://[2606:4700::1111]/",
            "http://[::ffff:8.8.8.8]/",
            "http://[64:ff9b::8.8.8.8]/",
            "http://[2002:0808:0808::1]/",
            "http://[2001:0:4136:e378:8000:63bf:f7f7:f7f7]/",
            "http://134744072/",
        ] {
            assert_eq!(decide(&p, url, None), Ok(()), "{url}");
        }
        assert!(decide(&p, "http://8.8.8.8:8080/", None).is_err());
        assert!(decide(&p, "http://8.8.8.8:22/", None).is_err());
    }

    #[test]
    fn names_are_judged_by_what_they_resolve_to() {
        let p = policy(&[], &[]);
        assert_eq!(
            decide(&p, "http://example.com/", Some("93.184.216.34")),
            Ok(())
        );
        assert!(decide(&p, "http://localhost/", Some("127.0.0.1")).is_err());
        assert!(decide(&p, "http://localhost/", Some("::1")).is_err());
        assert!(decide(&p, "http://rebind.example/", Some("10.0.0.5")).is_err());
        assert!(decide(&p, "http://x.example/", Some("::ffff:192.168.0.1")).is_err());
    }

    #[test]
    fn one_refused_address_refuses_the_name() {
        let p = policy(&[], &[]);
        let host = TargetHost::Name("mixed.example".into());
        let ips = |list: &[&str]| {
            list.iter()
                .map(|s| s.parse().unwrap())
                .collect::<Vec<IpAddr>>()
        };
        assert_eq!(
            p.check_all(&host, 443, &ips(&["93.184.216.34", "2606:2800:220:1::1"])),
            Ok(())
        );
        for mixed in [
            &["93.184.216.34", "127.0.0.1"][..],
            &["10.0.0.1", "93.184.216.34"],
            &["2606:2800:220:1::1", "::ffff:169.254.169.254"],
        ] {
            assert!(p.check_all(&host, 443, &ips(mixed)).is_err(), "{mixed:?}");
        }
        assert!(p.check_all(&host, 443, &[]).is_err());
    }

    #[test]
    fn extra_ports_open_ports_not_addresses() {
        let p = policy(&[8080], &[]);
        assert_eq!(decide(&p, "http://8.8.8.8:8080/", None), Ok(()));
        assert!(decide(&p, "http://127.0.0.1:8080/", None).is_err());
        assert_eq!(p.all_ports(), vec![80, 443, 8080]);
    }

    #[test]
    fn socket_exception_opens_one_address_and_port() {
        let p = policy(&[], &["127.0.0.1:8080"]);
        assert_eq!(decide(&p, "http://127.0.0.1:8080/", None), Ok(()));
        assert_eq!(decide(&p, "http://2130706433:8080/", None), Ok(()));
        assert_eq!(decide(&p, "http://[::ffff:127.0.0.1]:8080/", None), Ok(()));
        assert!(decide(&p, "http://127.0.0.1/", None).is_err());
        assert!(decide(&p, "http://127.0.0.2:8080/", None).is_err());
        assert!(decide(&p, "http://127.0.0.1:8081/", None).is_err());
        // A name resolving to it, on that port, is allowed: the address is what counts.
        assert_eq!(
            decide(&p, "http://localhost:8080/", Some("127.0.0.1")),
            Ok(())
        );
        assert_eq!(p.all_ports(), vec![80, 443, 8080]);
    }

    #[test]
    fn cidr_and_ip_exceptions_cover_standard_ports_and_embedded_forms() {
        let p = policy(&[], &["10.0.0.0/8", "192.168.1.10", "fd00::/8"]);
        assert_eq!(decide(&p, "http://10.20.30.40/", None), Ok(()));
        assert_eq!(decide(&p, "https://192.168.1.10/", None), Ok(()));
        assert_eq!(decide(&p, "http://[fd00::5]/", None), Ok(()));
        assert_eq!(decide(&p, "http://[64:ff9b::10.1.1.1]/", None), Ok(()));
        assert!(decide(&p, "http://192.168.1.11/", None).is_err());
        assert!(decide(&p, "http://10.20.30.40:8080/", None).is_err());
        assert!(decide(&p, "http://127.0.0.1/", None).is_err());
    }

    #[test]
    fn name_exception_vouches_for_that_name_and_port_only() {
        let p = policy(&[], &["intranet.example:443"]);
        assert_eq!(
            decide(&p, "https://intranet.example/", Some("10.1.1.1")),
            Ok(())
        );
        assert_eq!(
            decide(&p, "https://INTRANET.example./", Some("10.1.1.1")),
            Ok(())
        );
        assert!(decide(&p, "http://intranet.example/", Some("10.1.1.1")).is_err());
        assert!(decide(&p, "https://other.example/", Some("10.1.1.1")).is_err());
        // The literal address is not vouched for by the name.
        assert!(decide(&p, "https://10.1.1.1/", None).is_err());
        let p = policy(&[], &["svc.internal:9000"]);
        assert_eq!(
            decide(&p, "http://svc.internal:9000/", Some("10.2.2.2")),
            Ok(())
        );
        assert!(decide(&p, "http://other.internal:9000/", Some("8.8.8.8")).is_err());
        assert_eq!(p.all_ports(), vec![80, 443, 9000]);
    }

    #[test]
    fn allow_entry_parsing() {
        assert_eq!(
            AllowEntry::parse("127.0.0.1:8080"),
            Ok(AllowEntry::Socket {
                ip: "127.0.0.1".parse().unwrap(),
                port: 8080
            })
        );
        assert_eq!(
            AllowEntry::parse("[::1]:8443"),
            Ok(AllowEntry::Socket {
                ip: "::1".parse().unwrap(),
                port: 8443
            })
        );
        assert_eq!(
            AllowEntry::parse("::ffff:10.0.0.1"),
            Ok(AllowEntry::Net {
                net: "10.0.0.1".parse().unwrap(),
                prefix: 32
            })
        );
        assert_eq!(
            AllowEntry::parse("Example.Internal:443"),
            Ok(AllowEntry::NamePort {
                name: "example.internal".into(),
                port: 443
            })
        );
        for bad in [
            "10.0.0.1/8",
            "10.0.0.0/33",
            "example.internal",
            "example.internal:0",
            "example.internal:http",
            "127.1:80",
            "2130706433:80",
            "bad host:80",
            "127.0.0.1:0",
            "",
        ] {
            assert!(AllowEntry::parse(bad).is_err(), "{bad:?} parsed");
        }
        assert!(AddressPolicy::new(&[0], &[]).is_err());
    }

    #[test]
    fn check_port_refuses_before_any_lookup() {
        let p = policy(&[], &["svc.internal:9000", "127.0.0.1:8080"]);
        let name = |n: &str| TargetHost::Name(n.into());
        assert!(p.check_port(&name("svc.internal"), 9000).is_ok());
        assert!(p.check_port(&name("other"), 9000).is_err());
        // An ip:port entry opens the port; the address is checked after resolving.
        assert!(p.check_port(&name("other"), 8080).is_ok());
        assert!(p.check_port(&name("other"), 22).is_err());
        assert!(p.check_port(&name("other"), 443).is_ok());
    }
}
