//! The tools against real local servers: real sockets, real ureq, the real policy. Each
//! test allows its server's 127.0.0.1 port on purpose, as an operator would.

use base64::Engine;
use serde_json::{Value, json};

use super::test_server::{BINARY, TestServer, lines_text, long_text};
use super::*;

fn cfg_for(server: &TestServer) -> HttpToolsConfig {
    HttpToolsConfig {
        allow: vec![format!("127.0.0.1:{}", server.port)],
        connect_timeout_secs: 1,
        timeout_secs: 2,
        max_body_bytes: 1024 * 1024,
        ..HttpToolsConfig::default()
    }
}

fn text_of(out: &ToolOutcome) -> &str {
    out.result["content"][0]["text"].as_str().unwrap_or("")
}

fn is_error(out: &ToolOutcome) -> bool {
    out.result["isError"] == json!(true)
}

fn error_code(out: &ToolOutcome) -> &str {
    out.result["structuredContent"]["error"]["code"]
        .as_str()
        .unwrap_or("")
}

fn assert_refused(out: &ToolOutcome, code: &str) {
    assert!(is_error(out), "{}", out.result);
    assert_eq!(error_code(out), code, "{}", out.result);
    assert_eq!(out.facts.outcome, code);
    assert!(text_of(out).starts_with(code), "{}", text_of(out));
}

#[test]
fn definitions_name_three_read_only_tools() {
    let defs = tool_definitions();
    let names: Vec<&str> = defs.iter().filter_map(|d| d["name"].as_str()).collect();
    assert_eq!(names, ["fetch_http", "grep_http", "http_headers"]);
    for d in &defs {
        assert_eq!(d["inputSchema"]["type"], "object");
        assert_eq!(d["annotations"]["readOnlyHint"], true);
        assert_eq!(d["annotations"]["openWorldHint"], true);
        assert!(d["description"].as_str().unwrap_or("").len() > 20);
    }
}

#[test]
fn fetch_html_as_markdown() {
    let server = TestServer::start();
    let cfg = cfg_for(&server);
    let out = call_tool("fetch_http", &json!({"url": server.url("/html")}), &cfg);
    assert!(!is_error(&out), "{}", out.result);
    let text = text_of(&out);
    assert!(text.contains("# Main heading"), "{text}");
    assert!(text.contains("**bold**"), "{text}");
    assert!(
        text.contains("[a link](https://example.com/docs)"),
        "{text}"
    );
    assert!(text.contains("beta item"), "{text}");
    assert!(text.contains("Caf\u{e9} cr\u{e8}me"), "{text}");
    assert!(!text.contains("not shown"), "{text}");
    assert!(!text.contains("color: red"), "{text}");
    let sc = &out.result["structuredContent"];
    assert_eq!(sc["status"], 200);
    assert_eq!(sc["format"], "markdown");
    assert_eq!(sc["body_kind"], "html");
    assert_eq!(sc["truncated"], false);
    assert_eq!(sc["next_start_index"], Value::Null);
    assert_eq!(out.facts.outcome, "ok");
    assert_eq!(out.facts.status, Some(200));
    assert_eq!(out.facts.url, server.url("/html"));
    assert_eq!(out.facts.resolved, [format!("127.0.0.1:{}", server.port)]);
    assert!(out.facts.redirects.is_empty());
}

#[test]
fn fetch_html_as_text_and_raw() {
    let server = TestServer::start();
    let cfg = cfg_for(&server);
    let out = call_tool(
        "fetch_http",
        &json!({"url": server.url("/html"), "format": "text"}),
        &cfg,
    );
    let text = text_of(&out);
    assert!(!is_error(&out), "{}", out.result);
    assert!(text.contains("Main heading"), "{text}");
    assert!(
        text.contains("First paragraph with bold text and a link."),
        "{text}"
    );
    assert!(!text.contains("**") && !text.contains("# "), "{text}");
    assert!(!text.contains("not shown"), "{text}");

    let out = call_tool(
        "fetch_http",
        &json!({"url": server.url("/html"), "format": "raw", "max_length": 100000}),
        &cfg,
    );
    assert_eq!(text_of(&out), test_server::HTML_PAGE);
}

#[test]
fn slicing_by_characters_continues_to_the_end() {
    let server = TestServer::start();
    let cfg = cfg_for(&server);
    let whole = long_text();
    let mut joined = String::new();
    let mut start = 0u64;
    let mut calls = 0;
    loop {
        calls += 1;
        assert!(calls < 100, "no end in sight");
        let out = call_tool(
            "fetch_http",
            &json!({"url": server.url("/long"), "start_index": start, "max_length": 3000}),
            &cfg,
        );
        assert!(!is_error(&out), "{}", out.result);
        let sc = &out.result["structuredContent"];
        assert_eq!(sc["total_chars"], whole.chars().count());
        assert_eq!(sc["start_index"], start);
        let text = text_of(&out);
        match sc["next_start_index"].as_u64() {
            Some(next) => {
                assert_eq!(next, start + 3000);
                assert_eq!(sc["truncated"], true);
                let note = format!("start_index={next}");
                assert!(text.contains(&note), "{text}");
                let shown = text.split("\n\n[Showing characters").next().unwrap_or("");
                assert_eq!(shown.chars().count(), 3000);
                joined.push_str(shown);
                start = next;
            }
            None => {
                joined.push_str(text);
                break;
            }
        }
    }
    assert_eq!(joined, whole);
    assert!(calls > 1);

    let out = call_tool(
        "fetch_http",
        &json!({"url": server.url("/long"), "start_index": 10_000_000}),
        &cfg,
    );
    assert_refused(&out, "invalid_arguments");
}

#[test]
fn gzip_bodies_are_decoded_and_bombs_stopped() {
    let server = TestServer::start();
    let cfg = cfg_for(&server);
    let out = call_tool("fetch_http", &json!({"url": server.url("/gzip")}), &cfg);
    assert!(!is_error(&out), "{}", out.result);
    assert!(
        text_of(&out).contains("# Main heading"),
        "{}",
        text_of(&out)
    );

    let out = call_tool(
        "fetch_http",
        &json!({"url": server.url("/gzip-bomb")}),
        &cfg,
    );
    assert_refused(&out, "too_large");
}

#[test]
fn big_bodies_are_too_large() {
    let server = TestServer::start();
    let cfg = cfg_for(&server);
    for path in ["/huge", "/huge-chunked"] {
        let out = call_tool("fetch_http", &json!({"url": server.url(path)}), &cfg);
        assert_refused(&out, "too_large");
        assert_eq!(out.facts.status, Some(200));
    }
    // The same body under a larger cap is fine.
    let cfg = HttpToolsConfig {
        max_body_bytes: 4 * 1024 * 1024,
        ..cfg_for(&server)
    };
    let out = call_tool(
        "fetch_http",
        &json!({"url": server.url("/huge"), "max_length": 10}),
        &cfg,
    );
    assert!(!is_error(&out), "{}", out.result);
    assert_eq!(
        out.result["structuredContent"]["total_chars"],
        2 * 1024 * 1024
    );
}

#[test]
fn slow_bodies_time_out() {
    let server = TestServer::start();
    let cfg = HttpToolsConfig {
        timeout_secs: 1,
        ..cfg_for(&server)
    };
    let out = call_tool("fetch_http", &json!({"url": server.url("/slow")}), &cfg);
    assert_refused(&out, "timeout");
}

#[test]
fn binary_is_refused_unless_raw() {
    let server = TestServer::start();
    let cfg = cfg_for(&server);
    for path in ["/binary", "/binary-undeclared"] {
        let out = call_tool("fetch_http", &json!({"url": server.url(path)}), &cfg);
        assert_refused(&out, "unsupported_content");
        let out = call_tool(
            "grep_http",
            &json!({"url": server.url(path), "pattern": "PNG"}),
            &cfg,
        );
        assert_refused(&out, "unsupported_content");
        let out = call_tool(
            "fetch_http",
            &json!({"url": server.url(path), "format": "raw"}),
            &cfg,
        );
        assert!(!is_error(&out), "{}", out.result);
        let sc = &out.result["structuredContent"];
        assert_eq!(sc["encoding"], "base64");
        let encoded = text_of(&out).lines().nth(1).unwrap_or("");
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap();
        assert_eq!(decoded, BINARY);
    }
}

#[test]
fn legacy_charset_is_decoded() {
    let server = TestServer::start();
    let out = call_tool(
        "fetch_http",
        &json!({"url": server.url("/latin1")}),
        &cfg_for(&server),
    );
    assert_eq!(text_of(&out), "caf\u{e9} \u{20ac}uro");
}

#[test]
fn redirects_are_followed_and_checked_each_hop() {
    let server = TestServer::start();
    let cfg = cfg_for(&server);
    let out = call_tool(
        "fetch_http",
        &json!({"url": server.url("/redirect-absolute")}),
        &cfg,
    );
    assert!(!is_error(&out), "{}", out.result);
    assert!(text_of(&out).contains("# Main heading"));
    assert_eq!(
        out.facts.redirects,
        [server.url("/redirect-relative"), server.url("/html")]
    );
    assert_eq!(out.facts.resolved.len(), 3);
    assert_eq!(
        out.result["structuredContent"]["final_url"],
        server.url("/html")
    );

    // A numeric form of the allowed address is the allowed address.
    let out = call_tool(
        "fetch_http",
        &json!({"url": server.url("/redirect-numeric")}),
        &cfg,
    );
    assert!(!is_error(&out), "{}", out.result);

    for (path, refused_addr) in [
        (
            "/redirect-other-loopback",
            Some(format!("127.0.0.2:{}", server.port)),
        ),
        ("/redirect-metadata", Some("169.254.169.254:80".to_string())),
        ("/redirect-v6-loopback", None),
        ("/redirect-scheme", None),
    ] {
        let out = call_tool("fetch_http", &json!({"url": server.url(path)}), &cfg);
        assert_refused(&out, "address_refused");
        assert_eq!(out.facts.status, Some(302), "{path}");
        assert_eq!(out.facts.redirects.len(), 1, "{path}");
        if let Some(addr) = refused_addr {
            assert_eq!(out.facts.resolved.last(), Some(&addr), "{path}");
        }
    }

    let out = call_tool(
        "fetch_http",
        &json!({"url": server.url("/redirect-loop")}),
        &cfg,
    );
    assert_refused(&out, "http_error");
    assert_eq!(out.facts.redirects.len(), 5);
    assert_eq!(out.facts.resolved.len(), 6);

    let cfg = HttpToolsConfig {
        max_redirects: 0,
        ..cfg_for(&server)
    };
    let out = call_tool(
        "fetch_http",
        &json!({"url": server.url("/redirect-relative")}),
        &cfg,
    );
    assert_refused(&out, "http_error");
}

#[test]
fn loopback_needs_the_exception() {
    let server = TestServer::start();
    let no_exception = HttpToolsConfig {
        extra_ports: vec![server.port],
        ..cfg_for(&server)
    };
    let no_exception = HttpToolsConfig {
        allow: vec![],
        ..no_exception
    };
    for url in [
        server.url("/html"),
        format!("http://2130706433:{}/html", server.port),
        format!("http://0x7f.1:{}/html", server.port),
        format!("http://0177.0.0.1:{}/html", server.port),
        format!("http://127.1:{}/html", server.port),
        format!("http://127.0.0.1.:{}/html", server.port),
        format!("http://[::ffff:127.0.0.1]:{}/html", server.port),
        format!("http://localhost:{}/html", server.port),
    ] {
        let out = call_tool("fetch_http", &json!({"url": url}), &no_exception);
        assert_refused(&out, "address_refused");
        assert!(!out.facts.resolved.is_empty(), "{url}");
    }
    // Without extra_ports or an exception the port itself is refused, before any lookup.
    let bare = HttpToolsConfig {
        allow: vec![],
        ..cfg_for(&server)
    };
    let out = call_tool("fetch_http", &json!({"url": server.url("/html")}), &bare);
    assert_refused(&out, "address_refused");
    assert!(out.facts.resolved.is_empty());

    // With the exception, the numeric forms reach the same server.
    let cfg = cfg_for(&server);
    for url in [
        format!("http://2130706433:{}/html", server.port),
        format!("http://0x7f.1:{}/html", server.port),
        format!("http://127.1:{}/html", server.port),
    ] {
        let out = call_tool("fetch_http", &json!({"url": url}), &cfg);
        assert!(!is_error(&out), "{url}: {}", out.result);
    }
}

#[test]
fn refusals_without_a_connection() {
    let cfg = HttpToolsConfig::default();
    for (url, code) in [
        ("ftp://example.com/", "address_refused"),
        ("http://user:pw@example.com/", "address_refused"),
        (
            "http://169.254.169.254/latest/meta-data/",
            "address_refused",
        ),
        ("http://[fd00::1]/", "address_refused"),
        ("http://[64:ff9b::a9fe:a9fe]/", "address_refused"),
        ("http://example.com:22/", "address_refused"),
        ("not a url", "invalid_arguments"),
        ("http://%31%32%37.0.0.1/", "invalid_arguments"),
        ("http://1.2.3.09/", "invalid_arguments"),
    ] {
        let out = call_tool("fetch_http", &json!({"url": url}), &cfg);
        assert_refused(&out, code);
        assert_eq!(out.facts.status, None, "{url}");
    }
}

#[test]
fn argument_errors() {
    let cfg = HttpToolsConfig::default();
    for (tool, args) in [
        ("fetch_http", json!({})),
        ("fetch_http", json!({"url": 5})),
        (
            "fetch_http",
            json!({"url": "http://8.8.8.8/", "format": "pdf"}),
        ),
        (
            "fetch_http",
            json!({"url": "http://8.8.8.8/", "max_length": 0}),
        ),
        (
            "fetch_http",
            json!({"url": "http://8.8.8.8/", "start_index": -1}),
        ),
        (
            "fetch_http",
            json!({"url": "http://8.8.8.8/", "surprise": 1}),
        ),
        ("grep_http", json!({"url": "http://8.8.8.8/"})),
        (
            "grep_http",
            json!({"url": "http://8.8.8.8/", "pattern": "("}),
        ),
        (
            "grep_http",
            json!({"url": "http://8.8.8.8/", "pattern": "a".repeat(2000)}),
        ),
        (
            "grep_http",
            json!({"url": "http://8.8.8.8/", "pattern": "a", "max_matches": 0}),
        ),
        (
            "http_headers",
            json!({"url": "http://8.8.8.8/", "method": "POST"}),
        ),
        ("no_such_tool", json!({"url": "http://8.8.8.8/"})),
    ] {
        let out = call_tool(tool, &args, &cfg);
        assert_refused(&out, "invalid_arguments");
        assert!(out.facts.resolved.is_empty(), "{tool} {args}");
    }
}

#[test]
fn errors_from_the_server_and_the_network() {
    let server = TestServer::start();
    let cfg = cfg_for(&server);
    let out = call_tool("fetch_http", &json!({"url": server.url("/missing")}), &cfg);
    assert_refused(&out, "http_error");
    assert_eq!(out.facts.status, Some(404));
    assert!(text_of(&out).contains("404"), "{}", text_of(&out));

    // A port nobody listens on: bind, note the port, close.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let cfg = HttpToolsConfig {
        allow: vec![format!("127.0.0.1:{port}")],
        ..cfg_for(&server)
    };
    let out = call_tool(
        "fetch_http",
        &json!({"url": format!("http://127.0.0.1:{port}/")}),
        &cfg,
    );
    assert_refused(&out, "connect_failed");
    assert_eq!(out.facts.resolved, [format!("127.0.0.1:{port}")]);
}

#[test]
fn grep_numbers_lines_with_context() {
    let server = TestServer::start();
    let cfg = cfg_for(&server);
    let out = call_tool(
        "grep_http",
        &json!({"url": server.url("/lines"), "pattern": "MARK", "context_lines": 1, "max_matches": 3}),
        &cfg,
    );
    assert!(!is_error(&out), "{}", out.result);
    assert_eq!(
        text_of(&out),
        "9-row 9\n10:row 10 MARK\n11-row 11\n--\n19-row 19\n20:row 20 MARK\n21-row 21\n--\n\
         29-row 29\n30:row 30 MARK\n31-row 31\n\n[Stopped after 3 matching lines; more lines match.]"
    );
    let sc = &out.result["structuredContent"];
    assert_eq!(sc["matches"], 3);
    assert_eq!(sc["more_matches"], true);
    assert_eq!(sc["lines"], lines_text().lines().count());

    // Output is sliced like fetch_http's.
    let out = call_tool(
        "grep_http",
        &json!({"url": server.url("/lines"), "pattern": "row", "context_lines": 0,
                "max_matches": 1000, "max_length": 50}),
        &cfg,
    );
    assert_eq!(out.result["structuredContent"]["next_start_index"], 50);
    assert!(text_of(&out).contains("start_index=50"));

    // HTML is searched in its plain-text rendering.
    let out = call_tool(
        "grep_http",
        &json!({"url": server.url("/html"), "pattern": "(?i)BETA", "context_lines": 0}),
        &cfg,
    );
    let text = text_of(&out);
    assert!(
        text.contains(":beta item") || text.contains(":* beta item"),
        "{text}"
    );
    assert!(!text.contains("<li>"), "{text}");

    let out = call_tool(
        "grep_http",
        &json!({"url": server.url("/lines"), "pattern": "absent"}),
        &cfg,
    );
    assert!(!is_error(&out));
    assert!(text_of(&out).starts_with("No line"), "{}", text_of(&out));
}

#[test]
fn headers_with_head_and_get() {
    let server = TestServer::start();
    let cfg = cfg_for(&server);
    for method in ["HEAD", "GET"] {
        let out = call_tool(
            "http_headers",
            &json!({"url": server.url("/html"), "method": method}),
            &cfg,
        );
        assert!(!is_error(&out), "{}", out.result);
        let text = text_of(&out);
        assert!(text.starts_with("HTTP/1.1 200 OK\n"), "{text}");
        assert!(text.contains("x-test: yes"), "{text}");
        assert!(text.contains("content-type: text/html"), "{text}");
        let sc = &out.result["structuredContent"];
        assert_eq!(sc["method"], method);
        assert_eq!(sc["status"], 200);
        assert!(
            sc["headers"]
                .as_array()
                .unwrap()
                .contains(&json!(["x-test", "yes"]))
        );
    }
    // Redirects are reported, not followed.
    let out = call_tool(
        "http_headers",
        &json!({"url": server.url("/redirect-metadata")}),
        &cfg,
    );
    assert!(!is_error(&out), "{}", out.result);
    assert!(text_of(&out).contains("location: http://169.254.169.254/"));
    assert_eq!(out.facts.status, Some(302));
    assert!(out.facts.redirects.is_empty());
}

#[test]
fn deep_html_is_flattened_not_fatal() {
    let server = TestServer::start();
    let cfg = cfg_for(&server);
    for format in ["markdown", "text"] {
        let out = call_tool(
            "fetch_http",
            &json!({"url": server.url("/deep"), "format": format}),
            &cfg,
        );
        assert!(!is_error(&out), "{}", out.result);
        assert!(text_of(&out).contains("bottom text"));
        assert_eq!(out.result["structuredContent"]["html_flattened"], true);
    }
}
