//! Which IP addresses are refused by default, and which IPv6 addresses carry an IPv4
//! address inside them. Pure tables, no I/O; `address_policy` adds the exceptions.
//!
//! IPv6 is an allow-list: only global unicast (2000::/3) minus the special ranges below is
//! public, so ranges assigned in future outside 2000::/3 are refused until reviewed.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// IPv4 ranges refused by default, most specific first, with the reason given to the agent.
const REFUSED_V4: &[(Ipv4Addr, u8, &str)] = &[
    (Ipv4Addr::new(255, 255, 255, 255), 32, "broadcast"),
    (Ipv4Addr::new(0, 0, 0, 0), 8, "unspecified (0.0.0.0/8)"),
    (Ipv4Addr::new(10, 0, 0, 0), 8, "private (10.0.0.0/8)"),
    (
        Ipv4Addr::new(100, 64, 0, 0),
        10,
        "shared CGNAT (100.64.0.0/10)",
    ),
    (Ipv4Addr::new(127, 0, 0, 0), 8, "loopback (127.0.0.0/8)"),
    (
        Ipv4Addr::new(169, 254, 0, 0),
        16,
        "link-local (169.254.0.0/16)",
    ),
    (Ipv4Addr::new(172, 16, 0, 0), 12, "private (172.16.0.0/12)"),
    (
        Ipv4Addr::new(192, 0, 0, 0),
        24,
        "IETF protocol assignments (192.0.0.0/24)",
    ),
    (
        Ipv4Addr::new(192, 0, 2, 0),
        24,
        "documentation (192.0.2.0/24)",
    ),
    (
        Ipv4Addr::new(192, 168, 0, 0),
        16,
        "private (192.168.0.0/16)",
    ),
    (
        Ipv4Addr::new(198, 18, 0, 0),
        15,
        "benchmarking (198.18.0.0/15)",
    ),
    (
        Ipv4Addr::new(198, 51, 100, 0),
        24,
        "documentation (198.51.100.0/24)",
    ),
    (
        Ipv4Addr::new(203, 0, 113, 0),
        24,
        "documentation (203.0.113.0/24)",
    ),
    (Ipv4Addr::new(224, 0, 0, 0), 4, "multicast (224.0.0.0/4)"),
    (Ipv4Addr::new(240, 0, 0, 0), 4, "reserved (240.0.0.0/4)"),
];

/// IPv6 ranges refused outright, checked before the embedding forms and the 2000::/3 rule.
const REFUSED_V6: &[(Ipv6Addr, u8, &str)] = &[
    (Ipv6Addr::UNSPECIFIED, 128, "unspecified (::)"),
    (Ipv6Addr::LOCALHOST, 128, "loopback (::1)"),
    (
        Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, 0, 0),
        48,
        "local-use NAT64 (64:ff9b:1::/48)",
    ),
    (
        Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0, 0),
        64,
        "discard-only (100::/64)",
    ),
    (
        Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0),
        32,
        "documentation (2001:db8::/32)",
    ),
    (
        Ipv6Addr::new(0x3fff, 0, 0, 0, 0, 0, 0, 0),
        20,
        "documentation (3fff::/20)",
    ),
    (
        Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 0),
        48,
        "benchmarking (2001:2::/48)",
    ),
    (
        Ipv6Addr::new(0x2001, 0x10, 0, 0, 0, 0, 0, 0),
        28,
        "ORCHID (2001:10::/28)",
    ),
    (
        Ipv6Addr::new(0x2001, 0x20, 0, 0, 0, 0, 0, 0),
        28,
        "ORCHIDv2 (2001:20::/28)",
    ),
    (
        Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0),
        7,
        "unique local (fc00::/7)",
    ),
    (
        Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0),
        10,
        "link-local (fe80::/10)",
    ),
    (
        Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0),
        10,
        "site-local (fec0::/10)",
    ),
    (
        Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0),
        8,
        "multicast (ff00::/8)",
    ),
];

/// What an IPv6 address is, for the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum V6Class {
    /// A public address.
    Public,
    /// Refused whatever it carries; the reason.
    Refused(&'static str),
    /// Carries an IPv4 address that decides: refused when that address is refused.
    Embeds { form: &'static str, v4: Ipv4Addr },
}

/// Whether `ip` lies in `net/prefix` (for either family; a family mismatch is false).
pub fn in_net(ip: IpAddr, net: IpAddr, prefix: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => v4_in(a, n, prefix),
        (IpAddr::V6(a), IpAddr::V6(n)) => v6_in(a, n, prefix),
        _ => false,
    }
}

fn v4_in(ip: Ipv4Addr, net: Ipv4Addr, prefix: u8) -> bool {
    let mask = u32::MAX
        .checked_shl(32 - u32::from(prefix.min(32)))
        .unwrap_or(0);
    u32::from(ip) & mask == u32::from(net) & mask
}

fn v6_in(ip: Ipv6Addr, net: Ipv6Addr, prefix: u8) -> bool {
    let mask = u128::MAX
        .checked_shl(128 - u32::from(prefix.min(128)))
        .unwrap_or(0);
    u128::from(ip) & mask == u128::from(net) & mask
}

/// Why an IPv4 address is refused by default, or None when it is public.
pub fn v4_refusal(ip: Ipv4Addr) -> Option<&'static str> {
    REFUSED_V4
        .iter()
        .find(|(net, prefix, _)| v4_in(ip, *net, *prefix))
        .map(|(_, _, why)| *why)
}

/// Classify an IPv6 address. IPv4-mapped addresses are reported as embedding their IPv4
/// address, though the policy canonicalizes them to IPv4 before it gets here.
pub fn classify_v6(ip: Ipv6Addr) -> V6Class {
    if let Some((_, _, why)) = REFUSED_V6
        .iter()
        .find(|(net, prefix, _)| v6_in(ip, *net, *prefix))
    {
        return V6Class::Refused(why);
    }
    let bits = u128::from(ip);
    let low32 = Ipv4Addr::from(bits as u32);
    let embeds = |form| V6Class::Embeds { form, v4: low32 };
    if v6_in(ip, Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0), 96) {
        return embeds("IPv4-mapped");
    }
    if v6_in(ip, Ipv6Addr::UNSPECIFIED, 96) {
        return embeds("IPv4-compatible");
    }
    if v6_in(ip, Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0), 96) {
        return embeds("NAT64");
    }
    if v6_in(ip, Ipv6Addr::new(0x2002, 0, 0, 0, 0, 0, 0, 0), 16) {
        // 2002:AABB:CCDD::/48 carries AA.BB.CC.DD in bits 16..48.
        let v4 = Ipv4Addr::from((bits >> 80) as u32);
        return V6Class::Embeds { form: "6to4", v4 };
    }
    if v6_in(ip, Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0), 32) {
        // Teredo: the client's public IPv4 address is the last 32 bits, inverted.
        let v4 = Ipv4Addr::from(!(bits as u32));
        return V6Class::Embeds { form: "Teredo", v4 };
    }
    if !v6_in(ip, Ipv6Addr::new(0x2000, 0, 0, 0, 0, 0, 0, 0), 3) {
        return V6Class::Refused("not global unicast (outside 2000::/3)");
    }
    V6Class::Public
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }
    fn v6(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    #[test]
    fn every_refused_v4_range_at_both_ends() {
        let cases = [
            ("0.0.0.0", "0.255.255.255"),
            ("10.0.0.0", "10.255.255.255"),
            ("100.64.0.0", "100.127.255.255"),
            ("127.0.0.0", "127.255.255.255"),
            ("169.254.0.0", "169.254.255.255"),
            ("172.16.0.0", "172.31.255.255"),
            ("192.0.0.0", "192.0.0.255"),
            ("192.0.2.0", "192.0.2.255"),
            ("192.168.0.0", "192.168.255.255"),
            ("198.18.0.0", "198.19.255.255"),
            ("198.51.100.0", "198.51.100.255"),
            ("203.0.113.0", "203.0.113.255"),
            ("224.0.0.0", "239.255.255.255"),
            ("240.0.0.0", "255.255.255.255"),
        ];
        for (first, last) in cases {
            assert!(v4_refusal(v4(first)).is_some(), "{first}");
            assert!(v4_refusal(v4(last)).is_some(), "{last}");
        }
        assert_eq!(v4_refusal(v4("255.255.255.255")), Some("broadcast"));
    }

    #[test]
    fn neighbours_of_refused_v4_ranges_are_public() {
        for s in [
            "1.0.0.0",
            "9.255.255.255",
            "11.0.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "126.255.255.255",
            "128.0.0.0",
            "169.253.255.255",
            "169.255.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.0.1.0",
            "192.0.3.0",
            "192.167.255.255",
            "192.169.0.0",
            "198.17.255.255",
            "198.20.0.0",
            "198.51.99.255",
            "198.51.101.0",
            "203.0.112.255",
            "203.0.114.0",
            "223.255.255.255",
            "8.8.8.8",
            "93.184.216.34",
        ] {
            assert_eq!(v4_refusal(v4(s)), None, "{s}");
        }
    }

    #[test]
    fn refused_v6_ranges() {
        for s in [
            "::",
            "::1",
            "64:ff9b:1::1",
            "100::1",
            "2001:db8::1",
            "2001:db8:ffff::1",
            "3fff::1",
            "3fff:fff::1",
            "2001:2::1",
            "2001:10::1",
            "2001:20::1",
            "fc00::1",
            "fdff:ffff::1",
            "fe80::1",
            "febf::1",
            "fec0::1",
            "feff::1",
            "ff02::1",
            "ff0e::1",
            "4000::1",
            "1000::1",
        ] {
            assert!(
                matches!(classify_v6(v6(s)), V6Class::Refused(_)),
                "{s}: {:?}",
                classify_v6(v6(s))
            );
        }
    }

    #[test]
    fn public_v6() {
        for s in [
            "2606:4700::1111",
            "2a00:1450:4001::200e",
            "2001:4860:4860::8888",
        ] {
            assert_eq!(classify_v6(v6(s)), V6Class::Public, "{s}");
        }
    }

    #[test]
    fn embedded_v4_forms() {
        let cases = [
            ("::ffff:127.0.0.1", "IPv4-mapped", "127.0.0.1"),
            ("::ffff:8.8.8.8", "IPv4-mapped", "8.8.8.8"),
            ("::127.0.0.1", "IPv4-compatible", "127.0.0.1"),
            ("::10.1.2.3", "IPv4-compatible", "10.1.2.3"),
            ("64:ff9b::127.0.0.1", "NAT64", "127.0.0.1"),
            ("64:ff9b::8.8.8.8", "NAT64", "8.8.8.8"),
            ("2002:7f00:1::1", "6to4", "127.0.0.1"),
            ("2002:c0a8:0101::", "6to4", "192.168.1.1"),
            ("2002:0808:0808::1", "6to4", "8.8.8.8"),
            // Teredo client 127.0.0.1 is stored inverted: 0x80ff:fffe.
            (
                "2001:0:4136:e378:8000:63bf:80ff:fffe",
                "Teredo",
                "127.0.0.1",
            ),
            ("2001:0:4136:e378:8000:63bf:f7f7:f7f7", "Teredo", "8.8.8.8"),
        ];
        for (addr, form, inner) in cases {
            assert_eq!(
                classify_v6(v6(addr)),
                V6Class::Embeds {
                    form,
                    v4: v4(inner)
                },
                "{addr}"
            );
        }
    }

    #[test]
    fn in_net_handles_edges() {
        let any = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
        assert!(in_net("1.2.3.4".parse().unwrap(), any, 0));
        assert!(in_net(
            "1.2.3.4".parse().unwrap(),
            "1.2.3.4".parse().unwrap(),
            32
        ));
        assert!(!in_net(
            "1.2.3.5".parse().unwrap(),
            "1.2.3.4".parse().unwrap(),
            32
        ));
        assert!(!in_net("::1".parse().unwrap(), any, 0));
        assert!(in_net(
            "::1".parse().unwrap(),
            IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            0
        ));
    }
}
