//! Where a server is reached, as pins compare it: one key for every spelling of the same
//! address, so a server renamed in the config, or spelled differently (`HTTP://`,
//! `localhost` for `127.0.0.1`, a trailing slash, a query string), is recognised as one
//! pinned before and does not get first-sight trust.
//!
//! The key errs towards "the same": two addresses that share a key make the newer name's
//! tools wait for approval, which is safe; two spellings of one server that did not share a
//! key would let a changed definition in unreviewed. So scheme and host are lowercased,
//! every numeric IPv4 spelling the resolver accepts (`127.1`, `0x7f000001`, `2130706433`,
//! `0177.0.0.1`) is the dotted quad, every loopback spelling (`localhost`, `*.localhost`,
//! `127.0.0.0/8`, `::1`, `0.0.0.0`, `::`) is one host, the default port is filled in, the path is percent-decoded,
//! lowercased, its `.`/`..` segments resolved and its empty segments and trailing slashes
//! dropped, and user info, query and fragment are ignored. A local server's origin is its
//! command line, compared as written except its program, which is resolved (the local
//! servers' default `PATH`, symbolic links: `python3` and `/usr/bin/python3.11` are one program).
//!
//! Not recognised (different keys, so a new name there is pinned on first sight): a host
//! name and an address it resolves to, two names of one host. Nothing here resolves names.

use std::net::{IpAddr, Ipv4Addr};

use crate::transport::http::authority::Authority;

/// Prefix of a local server's origin (its command line as JSON follows).
pub const LOCAL_PREFIX: &str = "stdio:";

/// The origin recorded for a server: its URL, or `stdio:` and its command line.
pub fn of_server(url: &str, command: Option<&[String]>) -> String {
    match command {
        Some(cmd) => format!(
            "{LOCAL_PREFIX}{}",
            serde_json::to_string(cmd).unwrap_or_default()
        ),
        None => url.to_owned(),
    }
}

/// The comparison key of an origin (see the module comment). Empty stays empty (a server
/// pinned before origins were kept matches nothing).
pub fn key(origin: &str) -> String {
    if let Some(cmd) = origin.strip_prefix(LOCAL_PREFIX) {
        return local_key(cmd).unwrap_or_else(|| origin.to_owned());
    }
    if origin.is_empty() {
        return origin.to_owned();
    }
    url_key(origin).unwrap_or_else(|| origin.trim().to_ascii_lowercase())
}

/// Whether two origins are the same address.
pub fn same(a: &str, b: &str) -> bool {
    !a.is_empty() && !b.is_empty() && key(a) == key(b)
}

/// A command line with its program resolved to the file it runs.
fn local_key(cmd: &str) -> Option<String> {
    let mut argv: Vec<String> = serde_json::from_str(cmd).ok()?;
    let program = argv.first_mut()?;
    if let Some(resolved) = resolve_program(program) {
        *program = resolved;
    }
    Some(format!(
        "{LOCAL_PREFIX}{}",
        serde_json::to_string(&argv).unwrap_or_default()
    ))
}

/// The real path of `program`: as given when it holds a `/`, else the first match in the
/// `PATH` local servers get by default; symbolic links followed.
fn resolve_program(program: &str) -> Option<String> {
    let path = if program.contains('/') {
        std::path::PathBuf::from(program)
    } else {
        std::env::split_paths(crate::stdio_server::config::DEFAULT_PATH)
            .map(|d| d.join(program))
            .find(|p| p.is_file())?
    };
    std::fs::canonicalize(path)
        .ok()
        .map(|p| p.display().to_string())
}

fn url_key(url: &str) -> Option<String> {
    let url = url.trim();
    let (scheme, rest) = url.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    let a = Authority::parse(authority.as_bytes()).ok()?;
    let host = host_key(&a.host);
    let port = a.port.unwrap_or(default_port);
    let path_end = tail.find(['?', '#']).unwrap_or(tail.len());
    Some(format!(
        "{scheme}://{host}:{port}{}",
        path_key(&tail[..path_end])
    ))
}

fn host_key(host: &str) -> String {
    let host = host.trim_end_matches('.');
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let parsed = bare
        .parse::<IpAddr>()
        .or_else(|_| numeric_ipv4(bare).map(IpAddr::V4).ok_or(()));
    let loopback = match parsed {
        Ok(IpAddr::V4(v4)) => v4.is_loopback() || v4.is_unspecified(),
        Ok(IpAddr::V6(v6)) => {
            v6.is_loopback()
                || v6.is_unspecified()
                || v6
                    .to_ipv4_mapped()
                    .is_some_and(|v4: Ipv4Addr| v4.is_loopback() || v4.is_unspecified())
        }
        Err(_) => host == "localhost" || host.ends_with(".localhost"),
    };
    if loopback {
        return "loopback".into();
    }
    match parsed {
        // One spelling of an address: `10.1` and `0x0a000001` are 10.0.0.1.
        Ok(IpAddr::V6(v6)) => format!("[{v6}]"),
        Ok(IpAddr::V4(v4)) => v4.to_string(),
        Err(_) => host.to_owned(),
    }
}

/// An IPv4 address in any form the system's resolver accepts (inet_aton): one to four
/// parts, each decimal, `0x` hexadecimal or `0` octal, the last filling the bytes left
/// (`127.1`, `2130706433`, `0x7f000001`, `0177.0.0.1`).
fn numeric_ipv4(host: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = host.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut values = Vec::with_capacity(parts.len());
    for p in &parts {
        let (digits, radix) = if let Some(h) = p.strip_prefix("0x").or_else(|| p.strip_prefix("0X"))
        {
            (h, 16)
        } else if p.len() > 1 && p.starts_with('0') {
            (&p[1..], 8)
        } else {
            (*p, 10)
        };
        if digits.is_empty() && radix != 16 {
            return None;
        }
        let v = if digits.is_empty() {
            0
        } else {
            u32::from_str_radix(digits, radix).ok()?
        };
        values.push(v);
    }
    let (last, leading) = values.split_last()?;
    if leading.iter().any(|&v| v > 255) {
        return None;
    }
    let room = 8 * (4 - leading.len() as u32);
    if room < 32 && *last >= 1 << room {
        return None;
    }
    let mut n = *last;
    for (i, &v) in leading.iter().enumerate() {
        n |= v << (24 - 8 * i as u32);
    }
    Some(Ipv4Addr::from(n))
}

fn path_key(path: &str) -> String {
    let decoded = percent_decode(path).to_lowercase();
    let mut segments: Vec<&str> = Vec::new();
    for seg in decoded.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    format!("/{}", segments.join("/"))
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push(h * 16 + l);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(c: u8) -> Option<u8> {
    (c as char).to_digit(16).and_then(|d| u8::try_from(d).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_numeric_spelling_of_an_ipv4_address_is_one_key() {
        for spelled in [
            "http://127.1:9411/mcp",
            "http://0x7f000001:9411/mcp",
            "http://2130706433:9411/mcp",
            "http://0177.0.0.1:9411/mcp",
            "http://127.0.1:9411/mcp",
            "http://0:9411/mcp",
        ] {
            assert!(same(spelled, "http://127.0.0.1:9411/mcp"), "{spelled}");
        }
        assert!(same("http://10.1:80/mcp", "http://10.0.0.1/mcp"));
        assert!(same("http://0x0a.0x1.0.0:80/x", "http://10.1.0.0/x"));
        assert!(!same("http://10.1:80/mcp", "http://10.0.0.2/mcp"));
        assert_eq!(numeric_ipv4("256.1"), None);
        assert_eq!(numeric_ipv4("1.2.3.4.5"), None);
        assert_eq!(numeric_ipv4("08"), None);
        assert_eq!(numeric_ipv4("example"), None);
        assert_eq!(numeric_ipv4("1.2.65536"), None);
    }

    #[test]
    fn every_spelling_of_one_address_is_one_key() {
        let base = "http://127.0.0.1:8080/mcp";
        for other in [
            "http://localhost:8080/mcp",
            "HTTP://LocalHost:8080/mcp/",
            "http://127.0.0.2:8080/mcp?v=1",
            "http://[::1]:8080//mcp/#x",
            "http://user@0.0.0.0:8080/a/../MCP",
            "http://127.0.0.1:8080/%6dcp",
            "http://foo.localhost:8080/mcp/.",
        ] {
            assert!(
                same(base, other),
                "{other}: {} vs {}",
                key(other),
                key(base)
            );
        }
        assert!(same("https://Example.COM./x", "https://example.com:443/x/"));
        assert!(same(
            "https://[2001:DB8::0:1]/m",
            "https://[2001:db8::1]:443/m"
        ));
    }

    #[test]
    fn a_program_is_one_key_however_it_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("interp3.11");
        std::fs::write(&real, "").unwrap();
        let alias = dir.path().join("interp3");
        std::os::unix::fs::symlink(&real, &alias).unwrap();
        let cmd = |p: &std::path::Path, arg: &str| {
            of_server("", Some(&[p.display().to_string(), arg.to_string()]))
        };
        assert!(same(&cmd(&alias, "s.py"), &cmd(&real, "s.py")));
        assert!(same(
            &cmd(&dir.path().join("./interp3"), "s.py"),
            &cmd(&real, "s.py")
        ));
        assert!(!same(&cmd(&alias, "s.py"), &cmd(&real, "t.py")));
        // A program that is nowhere is compared as written.
        let missing = dir.path().join("gone");
        assert!(same(&cmd(&missing, "s.py"), &cmd(&missing, "s.py")));
        assert!(!same(&cmd(&missing, "s.py"), &cmd(&real, "s.py")));
    }

    #[test]
    fn different_addresses_are_different_keys() {
        let base = "http://127.0.0.1:8080/mcp";
        for other in [
            "http://127.0.0.1:8081/mcp",
            "https://127.0.0.1:8080/mcp",
            "http://127.0.0.1:8080/mcp2",
            "http://example.com:8080/mcp",
            "",
        ] {
            assert!(!same(base, other), "{other}");
        }
        assert!(!same("", ""), "unknown origins match nothing");
        let cmd = vec!["python3".to_string(), "s.py".to_string()];
        let local = of_server("", Some(&cmd));
        assert!(same(&local, &of_server("", Some(&cmd))));
        assert!(!same(&local, &of_server("", Some(&cmd[..1]))));
        assert_eq!(key("not a url"), "not a url");
        assert_eq!(key("stdio:not json"), "stdio:not json");
        assert_eq!(key("http://%zz:1/"), "http://%zz:1/");
        assert_eq!(percent_decode("%"), "%");
        assert_eq!(percent_decode("a%2"), "a%2");
    }
}
