//! Host names with ports, as the `Host` and `Origin` headers and `public_url` carry them,
//! for the DNS-rebinding defence. Parsing is strict: anything unusual is malformed, and a
//! malformed value is refused rather than guessed at.

use std::fmt;

/// Longest host name accepted (DNS allows 253 characters plus brackets for IPv6).
const MAX_HOST_LEN: usize = 255;

/// `http` or `https`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

impl Scheme {
    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

/// `host[:port]`, host lowercased; an IPv6 literal keeps its brackets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authority {
    pub host: String,
    pub port: Option<u16>,
}

impl fmt::Display for Authority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(port) => write!(f, "{}:{port}", self.host),
            None => f.write_str(&self.host),
        }
    }
}

impl Authority {
    /// Parse `host[:port]` where host is a DNS name, an IPv4 address or `[IPv6]`.
    pub fn parse(text: &[u8]) -> Result<Authority, &'static str> {
        if text.is_empty() {
            return Err("empty");
        }
        let (host, rest) = if text[0] == b'[' {
            let close = text
                .iter()
                .position(|&b| b == b']')
                .ok_or("unclosed IPv6 bracket")?;
            let inner = &text[1..close];
            let inner_ok = !inner.is_empty()
                && inner
                    .iter()
                    .all(|b| b.is_ascii_hexdigit() || matches!(b, b':' | b'.'))
                && std::str::from_utf8(inner)
                    .ok()
                    .and_then(|s| s.parse::<std::net::Ipv6Addr>().ok())
                    .is_some();
            if !inner_ok {
                return Err("invalid IPv6 literal");
            }
            (&text[..=close], &text[close + 1..])
        } else {
            let end = text.iter().position(|&b| b == b':').unwrap_or(text.len());
            let host = &text[..end];
            let host_ok = !host.is_empty()
                && host
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'));
            if !host_ok {
                return Err("invalid host name");
            }
            (host, &text[end..])
        };
        if host.len() > MAX_HOST_LEN {
            return Err("host name too long");
        }
        let port = match rest {
            [] => None,
            [b':', digits @ ..] => Some(parse_port(digits)?),
            _ => return Err("junk after host"),
        };
        // Only ASCII was accepted above, so this cannot fail.
        let host = String::from_utf8_lossy(host).to_ascii_lowercase();
        Ok(Authority { host, port })
    }
}

fn parse_port(digits: &[u8]) -> Result<u16, &'static str> {
    if digits.is_empty() || digits.len() > 5 || !digits.iter().all(u8::is_ascii_digit) {
        return Err("invalid port");
    }
    std::str::from_utf8(digits)
        .ok()
        .and_then(|s| s.parse::<u16>().ok())
        .filter(|p| *p != 0)
        .ok_or("invalid port")
}

/// A web origin: scheme, host and port (the default port filled in).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub scheme: Scheme,
    pub host: String,
    pub port: u16,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}:{}", self.scheme.as_str(), self.host, self.port)
    }
}

fn split_scheme(text: &[u8]) -> Result<(Scheme, &[u8]), &'static str> {
    let lower_starts = |prefix: &[u8]| {
        text.len() >= prefix.len() && text[..prefix.len()].eq_ignore_ascii_case(prefix)
    };
    if lower_starts(b"https://") {
        Ok((Scheme::Https, &text[8..]))
    } else if lower_starts(b"http://") {
        Ok((Scheme::Http, &text[7..]))
    } else {
        Err("scheme must be http or https")
    }
}

impl Origin {
    fn from_parts(scheme: Scheme, authority: &[u8]) -> Result<Origin, &'static str> {
        let a = Authority::parse(authority)?;
        Ok(Origin {
            scheme,
            port: a.port.unwrap_or(scheme.default_port()),
            host: a.host,
        })
    }

    /// An `Origin` header: exactly `scheme://host[:port]`. `null` and anything with a path
    /// are malformed.
    pub fn parse_header(value: &[u8]) -> Result<Origin, &'static str> {
        let (scheme, rest) = split_scheme(value)?;
        Origin::from_parts(scheme, rest)
    }

    /// The origin of a URL such as `public_url`; path, query and fragment are ignored,
    /// user info is refused.
    pub fn of_url(url: &str) -> Result<Origin, &'static str> {
        let (scheme, rest) = split_scheme(url.as_bytes())?;
        let end = rest
            .iter()
            .position(|b| matches!(b, b'/' | b'?' | b'#'))
            .unwrap_or(rest.len());
        let authority = &rest[..end];
        if authority.contains(&b'@') {
            return Err("user info is not allowed");
        }
        Origin::from_parts(scheme, authority)
    }

    /// The `Host` value this origin is reached by, as an authority.
    pub fn authority(&self) -> Authority {
        Authority {
            host: self.host.clone(),
            port: Some(self.port),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities() {
        let a = Authority::parse(b"LocalHost:9210").unwrap();
        assert_eq!(a.host, "localhost");
        assert_eq!(a.port, Some(9210));
        assert_eq!(Authority::parse(b"127.0.0.1").unwrap().port, None);
        let v6 = Authority::parse(b"[::1]:80").unwrap();
        assert_eq!(v6.host, "[::1]");
        assert_eq!(v6.port, Some(80));
        for bad in [
            &b""[..],
            b":80",
            b"host:",
            b"host:0",
            b"host:65536",
            b"host:80x",
            b"ho st",
            b"host/path",
            b"user@host",
            b"[::1",
            b"[zz]:1",
            b"[::1]x",
            b"h\xc3\xa9",
        ] {
            assert!(
                Authority::parse(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(Authority::parse("a".repeat(300).as_bytes()).is_err());
    }

    #[test]
    fn origins() {
        let o = Origin::parse_header(b"http://127.0.0.1:9210").unwrap();
        assert_eq!(
            o,
            Origin {
                scheme: Scheme::Http,
                host: "127.0.0.1".into(),
                port: 9210
            }
        );
        let o = Origin::parse_header(b"HTTPS://Example.COM").unwrap();
        assert_eq!(o.port, 443);
        assert_eq!(o.host, "example.com");
        for bad in [
            &b"null"[..],
            b"http://",
            b"http://a/b",
            b"ftp://a",
            b"http://a:b",
            b"example.com",
        ] {
            assert!(
                Origin::parse_header(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn url_origins() {
        let o = Origin::of_url("https://mcp.example.com/mcp?x=1").unwrap();
        assert_eq!(o.to_string(), "https://mcp.example.com:443");
        assert_eq!(Origin::of_url("http://127.0.0.1:9210").unwrap().port, 9210);
        assert!(Origin::of_url("https://user:pw@example.com/").is_err());
        assert!(Origin::of_url("mcp.example.com").is_err());
    }
}
