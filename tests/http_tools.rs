//! The built-in HTTP tools through the real gateway and the real confined worker, against
//! local HTTP servers: conversion, slicing, grep, headers, the address policy (refusals
//! and an exception on purpose), redirects, and the ledger's facts.

mod common;

use common::*;
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::TcpListener;

/// A tiny HTTP server: `route(path)` gives (status line, extra headers, body).
fn serve(route: fn(&str, u16) -> (String, String, Vec<u8>)) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let mut buf = [0u8; 4096];
            let n = s.read(&mut buf).unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]);
            let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
            let (status, headers, body) = route(&path, port);
            let _ = write!(
                s,
                "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = s.write_all(&body);
        }
    });
    port
}

fn site(path: &str, port: u16) -> (String, String, Vec<u8>) {
    match path {
        "/page" => (
            "200 OK".into(),
            "Content-Type: text/html; charset=utf-8\r\n".into(),
            b"<html><head><title>T</title><script>evil()</script></head><body><h1>Hello</h1><p>first <b>bold</b> para</p><ul><li>one</li><li>two</li></ul></body></html>".to_vec(),
        ),
        "/long" => ("200 OK".into(), "Content-Type: text/plain\r\n".into(), "abcdefghij".repeat(100).into_bytes()),
        "/lines" => (
            "200 OK".into(),
            "Content-Type: text/plain\r\n".into(),
            (1..=20).map(|i| format!("line {i}{}\n", if i == 10 { " NEEDLE" } else { "" })).collect::<String>().into_bytes(),
        ),
        "/binary" => ("200 OK".into(), "Content-Type: application/octet-stream\r\n".into(), vec![0, 1, 2, 255]),
        "/to-metadata" => ("302 Found".into(), "Location: http://169.254.169.254/latest\r\n".into(), vec![]),
        "/to-page" => ("301 Moved".into(), format!("Location: http://127.0.0.1:{port}/page\r\n"), vec![]),
        _ => ("404 Not Found".into(), "Content-Type: text/plain\r\n".into(), b"nope".to_vec()),
    }
}

fn text(r: &Value) -> String {
    r["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn code(r: &Value) -> Option<String> {
    r["result"]["structuredContent"]["error"]["code"]
        .as_str()
        .map(str::to_owned)
}

#[test]
fn fetch_grep_and_headers_through_the_confined_worker() {
    let port = serve(site);
    let gw = TestGateway::start(&format!("[builtin.http]\nallow = [\"127.0.0.1:{port}\"]\n"));
    let mut c = gw.connect();
    let base = format!("http://127.0.0.1:{port}");
    let list = c.call("tools/list", json!({}));
    for t in [
        "local__fetch_http",
        "local__grep_http",
        "local__http_headers",
    ] {
        assert!(list.to_string().contains(t), "{t} listed");
    }
    // HTML to markdown and to text; scripts never come through.
    let md = text(&c.tool("local__fetch_http", json!({"url": format!("{base}/page")})));
    assert!(
        md.contains("# Hello") && md.contains("**bold**") && !md.contains("evil"),
        "{md}"
    );
    let plain = text(&c.tool(
        "local__fetch_http",
        json!({"url": format!("{base}/page"), "format": "text"}),
    ));
    assert!(
        plain.contains("Hello") && !plain.contains("**") && !plain.contains("<b>"),
        "{plain}"
    );
    // Slicing by characters, with the next start index.
    let r = c.tool(
        "local__fetch_http",
        json!({"url": format!("{base}/long"), "format": "raw", "max_length": 100}),
    );
    let first = text(&r);
    assert!(first.starts_with("abcdefghij"), "{first}");
    assert!(
        r.to_string().contains("100"),
        "says where the next slice starts: {r}"
    );
    // grep: numbered lines with context.
    let g = text(&c.tool(
        "local__grep_http",
        json!({"url": format!("{base}/lines"), "pattern": "NEEDLE", "context_lines": 1}),
    ));
    assert!(
        g.contains("10")
            && g.contains("NEEDLE")
            && g.contains("line 9")
            && g.contains("line 11")
            && !g.contains("line 5\n"),
        "{g}"
    );
    // headers.
    let h = text(&c.tool(
        "local__http_headers",
        json!({"url": format!("{base}/page"), "method": "HEAD"}),
    ));
    assert!(
        h.contains("200") && h.to_lowercase().contains("content-type"),
        "{h}"
    );
    // Binary refused unless raw; a redirect followed to an allowed place; an HTTP error.
    assert_eq!(
        code(&c.tool(
            "local__fetch_http",
            json!({"url": format!("{base}/binary")})
        ))
        .as_deref(),
        Some("unsupported_content")
    );
    assert!(
        text(&c.tool(
            "local__fetch_http",
            json!({"url": format!("{base}/to-page")})
        ))
        .contains("Hello")
    );
    assert_eq!(
        code(&c.tool(
            "local__fetch_http",
            json!({"url": format!("{base}/missing")})
        ))
        .as_deref(),
        Some("http_error")
    );
    // The ledger has the URL, the address connected to and the outcome.
    let rows = gw.wait_rows("8 rows", |r| {
        r.len() == 8 && r.iter().all(|x| !x["duration_us"].is_null())
    });
    assert!(rows.iter().any(|r| r["tool_name"] == "fetch_http"));
    let facts = gw.events("tool_facts");
    assert!(
        facts.iter().any(|f| {
            let d = f["detail"].as_str().unwrap_or("");
            d.contains(&format!("127.0.0.1:{port}")) && d.contains("/page")
        }),
        "{facts:#?}"
    );
}

#[test]
fn the_address_policy_refuses_internal_targets_and_tricks() {
    let port = serve(site);
    // Only this port is an exception; loopback in general is not.
    let gw = TestGateway::start(&format!("[builtin.http]\nallow = [\"127.0.0.1:{port}\"]\n"));
    let mut c = gw.connect();
    let refused = [
        "http://127.0.0.1:1/".to_owned(),
        "http://localhost/".into(),
        "http://2130706433/".into(),
        "http://0x7f.1/".into(),
        "http://[::ffff:127.0.0.1]/".into(),
        "http://10.0.0.1/".into(),
        "http://169.254.169.254/latest/meta-data".into(),
        "http://100.64.0.1/".into(),
        "http://[fd00::1]/".into(),
        "http://user:pass@example.com/".into(),
        "file:///etc/passwd".into(),
        format!("http://127.0.0.1:{port}/to-metadata"),
    ];
    for url in refused {
        let r = c.tool("local__fetch_http", json!({"url": url}));
        assert_eq!(r["result"]["isError"], true, "{url}: {r}");
        let got = code(&r).unwrap_or_default();
        assert!(
            got == "address_refused" || got == "invalid_arguments",
            "{url}: {got} {r}"
        );
    }
    // The worker is still fine.
    assert!(
        text(&c.tool(
            "local__fetch_http",
            json!({"url": format!("http://127.0.0.1:{port}/page")})
        ))
        .contains("Hello")
    );
}

#[test]
fn ten_slow_fetches_do_not_delay_an_echo() {
    // A server that never answers: fetches wait for their timeout.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming().flatten() {
            held.push(s);
        }
    });
    let gw = TestGateway::start(&format!(
        "[builtin.http]\nallow = [\"127.0.0.1:{port}\"]\ntimeout_secs = 20\n"
    ));
    let mut c = gw.connect();
    for i in 0..10 {
        c.request(json!(format!("slow{i}")), "tools/call", Some(json!({"name": "local__fetch_http", "arguments": {"url": format!("http://127.0.0.1:{port}/")}})));
    }
    // The echo is answered while every fetch is still waiting on the silent server: it
    // did not queue behind them.
    let r = c.tool("local__echo", json!({"text": "quick"}));
    assert_eq!(text(&r), "quick");
    let rows = gw.tool_calls();
    let pending = rows
        .iter()
        .filter(|r| r["tool_name"] == "fetch_http" && r["duration_us"].is_null())
        .count();
    assert_eq!(
        pending, 10,
        "all ten fetches still in flight when the echo came back: {rows:#?}"
    );
}
