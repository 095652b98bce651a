//! What a URL points at: scheme, host and port, parsed with the same `http::Uri` that
//! ureq sends, so the request goes exactly where the check looked.
//!
//! Hosts are read strictly. An IPv6 literal must parse as one; anything whose last label
//! is numeric is an IPv4 address in the URL standard's forms (decimal, `0x` hex, `0`
//! octal, one to four parts: `2130706433`, `0x7f.1`, `0177.0.0.1`, `127.1`), which is also
//! what the C library's `inet_aton` accepts, and it is connected to as that number, never
//! handed to the resolver; a numeric-looking host that is not a valid address is refused.
//! Names are ASCII letters, digits, `-`, `_` and `.` only (no percent-escapes, no
//! non-ASCII: an internationalized name must be written in its `xn--` form).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ureq::http::Uri;
use ureq::http::uri::Scheme;

/// A URL that passed parsing: the `Uri` handed to ureq and what it points at.
#[derive(Debug, Clone)]
pub struct Target {
    pub uri: Uri,
    pub host: TargetHost,
    pub port: u16,
}

/// The host part of a URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetHost {
    /// A DNS name, lowercased, without a trailing dot.
    Name(String),
    /// An address literal, in any of the numeric forms.
    Ip(IpAddr),
}

/// Why a URL was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetError {
    /// Not a URL we can read at all.
    Invalid(String),
    /// A URL, but one the address policy forbids (scheme, credentials).
    Refused(String),
}

/// Parse `url` (at most `max_bytes` long) into a target.
pub fn parse_target(url: &str, max_bytes: usize) -> Result<Target, TargetError> {
    if url.len() > max_bytes {
        return Err(TargetError::Invalid(format!(
            "URL is {} bytes, more than the limit of {max_bytes}",
            url.len()
        )));
    }
    if !url.is_ascii() {
        return Err(TargetError::Invalid(
            "URL must be ASCII: percent-encode the path and write internationalized host \
             names in their xn-- form"
                .into(),
        ));
    }
    // A scheme other than http(s) is a policy refusal, even where the rest of the URL
    // (file:///x, data:...) would not parse as an http URI.
    if let Some((scheme, _)) = url.split_once(':') {
        let is_scheme = scheme
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic())
            && scheme
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
        if is_scheme
            && !scheme.eq_ignore_ascii_case("http")
            && !scheme.eq_ignore_ascii_case("https")
        {
            return Err(TargetError::Refused(format!(
                "scheme {scheme:?} is not allowed: only http and https"
            )));
        }
    }
    let uri: Uri = url
        .parse()
        .map_err(|e| TargetError::Invalid(format!("not a valid URL: {e}")))?;
    let default_port = match uri.scheme() {
        Some(s) if *s == Scheme::HTTP => 80,
        Some(s) if *s == Scheme::HTTPS => 443,
        Some(s) => {
            return Err(TargetError::Refused(format!(
                "scheme {s:?} is not allowed: only http and https"
            )));
        }
        None => {
            return Err(TargetError::Invalid(
                "URL must be absolute (http:// or https://)".into(),
            ));
        }
    };
    let authority = uri
        .authority()
        .ok_or_else(|| TargetError::Invalid("URL has no host".into()))?;
    let authority_text = authority.as_str();
    if authority_text.contains('@') {
        return Err(TargetError::Refused(
            "credentials in URLs are not allowed".into(),
        ));
    }
    let host_text = authority.host();
    let host = parse_host(host_text).map_err(TargetError::Invalid)?;
    // What follows the host must be nothing or ":<port>"; `Authority::port` silently
    // ignores a port it cannot read, and ureq would then use the default one.
    let rest = authority_text.get(host_text.len()..).unwrap_or("");
    let port = match rest.strip_prefix(':') {
        None if rest.is_empty() => default_port,
        Some(digits) => parse_port(digits).ok_or_else(|| {
            TargetError::Invalid(format!("port {digits:?} is not a number from 1 to 65535"))
        })?,
        None => return Err(TargetError::Invalid("malformed host and port".into())),
    };
    Ok(Target { uri, host, port })
}

fn parse_port(digits: &str) -> Option<u16> {
    if digits.is_empty() || digits.len() > 5 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u16>().ok().filter(|p| *p != 0)
}

/// Parse the host of a URL (as `http::Uri` gives it: IPv6 in brackets).
pub fn parse_host(host: &str) -> Result<TargetHost, String> {
    if let Some(inner) = host.strip_prefix('[') {
        let inner = inner
            .strip_suffix(']')
            .ok_or_else(|| "unbalanced brackets in host".to_string())?;
        return inner
            .parse::<Ipv6Addr>()
            .map(|ip| TargetHost::Ip(IpAddr::V6(ip)))
            .map_err(|_| format!("[{inner}] is not an IPv6 address (zone ids are not allowed)"));
    }
    if host.is_empty() {
        return Err("URL has an empty host".into());
    }
    let lower = host.to_ascii_lowercase();
    if !lower
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(format!(
            "host {host:?} may hold only letters, digits, '-', '_' and '.'"
        ));
    }
    if ends_in_number(&lower) {
        return parse_ipv4_number_forms(&lower)
            .map(|ip| TargetHost::Ip(IpAddr::V4(ip)))
            .ok_or_else(|| format!("host {host:?} looks numeric but is not an IPv4 address"));
    }
    let name = lower.strip_suffix('.').unwrap_or(&lower);
    if name.is_empty() || name.len() > 253 || name.split('.').any(|l| l.is_empty() || l.len() > 63)
    {
        return Err(format!("host {host:?} is not a valid DNS name"));
    }
    Ok(TargetHost::Name(name.to_string()))
}

/// The URL standard's "ends in a number": the last label (after one trailing dot) is all
/// digits or a `0x` hex number. Such a host is an IPv4 address or nothing.
fn ends_in_number(host: &str) -> bool {
    let trimmed = host.strip_suffix('.').unwrap_or(host);
    let last = trimmed.rsplit('.').next().unwrap_or("");
    if last.is_empty() {
        return false;
    }
    last.bytes().all(|b| b.is_ascii_digit()) || parse_ipv4_part(last).is_some()
}

/// One part of a numeric IPv4 host: `0x`/`0X` hex (empty digits mean 0), leading-zero
/// octal, or decimal. None when it is not a number or does not fit in 32 bits.
fn parse_ipv4_part(part: &str) -> Option<u32> {
    if part.is_empty() {
        return None;
    }
    let (digits, radix) =
        if let Some(hex) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
            (hex, 16)
        } else if part.len() > 1 && part.starts_with('0') {
            (&part[1..], 8)
        } else {
            (part, 10)
        };
    let mut value: u32 = 0;
    for c in digits.chars() {
        let d = c.to_digit(radix)?;
        value = value.checked_mul(radix)?.checked_add(d)?;
    }
    Some(value)
}

/// The URL standard's IPv4 parser: one to four parts, the last filling the remaining
/// bytes (`127.1` is 127.0.0.1, `2130706433` is 127.0.0.1).
pub fn parse_ipv4_number_forms(host: &str) -> Option<Ipv4Addr> {
    let trimmed = host.strip_suffix('.').unwrap_or(host);
    let parts: Vec<&str> = trimmed.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let numbers: Vec<u32> = parts
        .iter()
        .map(|p| parse_ipv4_part(p))
        .collect::<Option<_>>()?;
    let (last, leading) = numbers.split_last()?;
    if leading.iter().any(|n| *n > 255) {
        return None;
    }
    let last_bits = 8 * (4 - leading.len() as u32);
    if last_bits < 32 && u64::from(*last) >= 1u64 << last_bits {
        return None;
    }
    let mut value: u32 = *last;
    for (i, n) in leading.iter().enumerate() {
        value |= n << (24 - 8 * i as u32);
    }
    Some(Ipv4Addr::from(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host_of(url: &str) -> Result<TargetHost, TargetError> {
        parse_target(url, 8192).map(|t| t.host)
    }
    fn ip(s: &str) -> TargetHost {
        TargetHost::Ip(s.parse().unwrap())
    }

    #[test]
    fn numeric_tricks_are_read_as_addresses() {
        let cases = [
            ("http://2130706433/", "127.0.0.1"),
            ("http://0x7f.1/", "127.0.0.1"),
            ("http://0X7F.0.0.1/", "127.0.0.1"),
            ("http://0177.0.0.1/", "127.0.0.1"),
            ("http://127.1/", "127.0.0.1"),
            ("http://127.0.1/", "127.0.0.1"),
            ("http://127.0.0.1./", "127.0.0.1"),
            ("http://0x7f000001/", "127.0.0.1"),
            ("http://017700000001/", "127.0.0.1"),
            ("http://0/", "0.0.0.0"),
            ("http://0x/", "0.0.0.0"),
            ("http://10.0x100/", "10.0.1.0"),
            ("http://4294967295/", "255.255.255.255"),
            ("http://0xa9.0xfe.0xa9.0xfe/", "169.254.169.254"),
            ("http://8.8.8.8/", "8.8.8.8"),
            ("http://[::ffff:127.0.0.1]/", "::ffff:127.0.0.1"),
            ("http://[::FFFF:7f00:1]/", "::ffff:127.0.0.1"),
            ("http://[::1]:443/", "::1"),
        ];
        for (url, want) in cases {
            let got = host_of(url);
            let want_host = ip(want);
            assert_eq!(got, Ok(want_host), "{url}");
        }
    }

    #[test]
    fn bad_numeric_hosts_are_refused_not_resolved() {
        for url in [
            "http://4294967296/",
            "http://1.2.3.256/",
            "http://256.1.1.1/",
            "http://1.2.3.4.5/",
            "http://1.2.3.09/",
            "http://foo.0x10/",
            "http://foo.123/",
            "http://1.2.65536/",
            "http://1..2/",
        ] {
            assert!(
                matches!(host_of(url), Err(TargetError::Invalid(_))),
                "{url}: {:?}",
                host_of(url)
            );
        }
    }

    #[test]
    fn names_are_lowercased_and_lose_one_trailing_dot() {
        assert_eq!(
            host_of("http://Example.COM./x"),
            Ok(TargetHost::Name("example.com".into()))
        );
        assert_eq!(
            host_of("https://xn--mnchen-3ya.de/"),
            Ok(TargetHost::Name("xn--mnchen-3ya.de".into()))
        );
        assert_eq!(
            host_of("http://a_b.example/"),
            Ok(TargetHost::Name("a_b.example".into()))
        );
        // A last label that is not a number (in any base) makes a name, as in the URL
        // standard and inet_aton.
        assert_eq!(host_of("http://0x1g/"), Ok(TargetHost::Name("0x1g".into())));
        // A label that starts with digits but is not all digits is a name.
        assert_eq!(
            host_of("http://1.2.3.4a/"),
            Ok(TargetHost::Name("1.2.3.4a".into()))
        );
    }

    #[test]
    fn odd_names_are_refused() {
        for url in [
            "http://m\u{fc}nchen.de/",
            "http://%31%32%37.0.0.1/",
            "http://exa%6dple.com/",
            "http://a..b/",
            "http://[fe80::1%25eth0]/",
            "http://[::1/",
            "http://../",
        ] {
            assert!(
                matches!(host_of(url), Err(TargetError::Invalid(_))),
                "{url}: {:?}",
                host_of(url)
            );
        }
    }

    #[test]
    fn schemes_credentials_and_ports() {
        assert!(matches!(
            host_of("ftp://example.com/"),
            Err(TargetError::Refused(_))
        ));
        for url in [
            "file:///etc/passwd",
            "javascript:alert(1)",
            "data:text/html,<p>x",
            "gopher://127.0.0.1:70/",
            "HTTPX://example.com/",
        ] {
            assert!(
                matches!(host_of(url), Err(TargetError::Refused(_))),
                "{url}: {:?}",
                host_of(url)
            );
        }
        assert!(matches!(
            host_of("http://user:pw@example.com/"),
            Err(TargetError::Refused(_))
        ));
        assert!(matches!(
            host_of("http://@example.com/"),
            Err(TargetError::Refused(_))
        ));
        assert!(matches!(
            host_of("example.com/x"),
            Err(TargetError::Invalid(_))
        ));
        assert!(matches!(
            host_of("http://example.com:99999/"),
            Err(TargetError::Invalid(_))
        ));
        assert!(matches!(
            host_of("http://example.com:0/"),
            Err(TargetError::Invalid(_))
        ));
        assert!(matches!(
            host_of("http://example.com:/"),
            Err(TargetError::Invalid(_))
        ));
        assert!(matches!(
            host_of("http://example.com:80x/"),
            Err(TargetError::Invalid(_))
        ));
        let t = parse_target("HTTPS://example.com/a?b", 8192).unwrap();
        assert_eq!(t.port, 443);
        let t = parse_target("http://example.com:8080", 8192).unwrap();
        assert_eq!(t.port, 8080);
        let t = parse_target("http://[2001:4860::1]:8443/", 8192).unwrap();
        assert_eq!(t.port, 8443);
        assert!(matches!(
            parse_target("http://example.com/", 10),
            Err(TargetError::Invalid(_))
        ));
    }

    #[test]
    fn part_parser_never_panics_on_long_input() {
        assert_eq!(parse_ipv4_part("0x00000000000000000000000001"), Some(1));
        assert_eq!(parse_ipv4_part("99999999999999999999"), None);
        assert_eq!(parse_ipv4_number_forms(""), None);
        assert_eq!(parse_ipv4_number_forms("."), None);
    }
}
