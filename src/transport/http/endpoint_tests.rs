//! The endpoint's decisions, driven by requests read by the real request reader and a real
//! token store in a temporary SQLite file.

use super::*;
use crate::tokens::{NewToken, TokenStore};
use crate::transport::http::request::{Progress, RequestLimits, RequestReader};
use crate::transport::http::response::tests::{Parsed, parse};
use std::time::Duration;

struct Fixture {
    _dir: tempfile::TempDir,
    store: TokenStore,
    client: NewToken,
    endpoint: Endpoint,
    now: Instant,
}

const NOW_MS: i64 = 1_787_400_000_000;
const LISTEN: &str = "127.0.0.1:9210";

fn settings() -> DoorSettings {
    DoorSettings {
        listen: LISTEN.parse().unwrap(),
        tls: false,
        public_url: None,
        auth: HttpAuth::Tokens,
        metrics_public: false,
        http: HttpConfig::default(),
    }
}

fn fixture_with(settings: DoorSettings) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = TokenStore::open(&dir.path().join("ledger.db")).unwrap();
    let client = store
        .create("alice", TokenKind::Client, None, NOW_MS - 1000)
        .unwrap();
    Fixture {
        _dir: dir,
        store,
        client,
        endpoint: Endpoint::new(settings).unwrap(),
        now: Instant::now(),
    }
}

fn fixture() -> Fixture {
    fixture_with(settings())
}

/// Read one request from raw bytes with the real reader.
fn read(raw: &[u8]) -> Request {
    match RequestReader::new(RequestLimits::default())
        .poll_whole(raw)
        .unwrap()
    {
        Progress::Ready(r) => r,
        other => panic!("{other:?}"),
    }
}

/// A request built from a head (without Content-Length) and a body.
fn raw(method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Vec<u8> {
    let mut out = format!("{method} {path} HTTP/1.1\r\n");
    for (name, value) in headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    out.into_bytes()
}

const MODERN_META: &str = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;

impl Fixture {
    fn bearer(&self) -> String {
        format!("Bearer {}", self.client.secret)
    }

    fn decide(&mut self, raw: &[u8]) -> Decision {
        let request = read(raw);
        self.endpoint
            .decide(&request, raw, &self.store, self.now, NOW_MS)
    }

    /// POST /mcp with the usual headers plus `extra`.
    fn post(&mut self, extra: &[(&str, &str)], body: &str) -> Decision {
        let auth = self.bearer();
        let mut headers = vec![
            ("Host", LISTEN),
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("Authorization", auth.as_str()),
        ];
        for (name, value) in extra {
            headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
            headers.push((name, value));
        }
        headers.retain(|(_, v)| !v.is_empty());
        let bytes = raw("POST", "/mcp", &headers, body);
        self.decide(&bytes)
    }

    fn modern(&mut self, method: &str, params: &str, extra: &[(&str, &str)]) -> Decision {
        let mut headers = vec![
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", method),
        ];
        headers.extend_from_slice(extra);
        let body = format!(r#"{{"jsonrpc":"2.0","id":41,"method":"{method}","params":{params}}}"#);
        self.post(&headers, &body)
    }

    /// Initialize a legacy session; returns its id.
    fn initialize(&mut self, version: &str) -> String {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"{version}","capabilities":{{}},"clientInfo":{{"name":"t","version":"1"}}}}}}"#
        );
        let Decision::Call { call, .. } = self.post(&[], &body) else {
            panic!("initialize not dispatched")
        };
        assert_eq!(
            call.era,
            Era::Legacy {
                version: protocol::negotiate(Some(version)),
                session: None
            }
        );
        let answer = jsonrpc::result_response(
            &call.id,
            &protocol::initialize_result(call.era.version(), false).to_string(),
        );
        let response = parse(&self.endpoint.answer(&call, &answer, self.now).bytes);
        assert_eq!(response.status, 200);
        response
            .header("mcp-session-id")
            .expect("session id")
            .to_owned()
    }
}

fn respond(d: Decision) -> Parsed {
    match d {
        Decision::Respond(r) => parse(&r.bytes),
        other => panic!("expected a response, got {other:?}"),
    }
}

fn call(d: Decision) -> Call {
    match d {
        Decision::Call { call, .. } => call,
        other => panic!("expected a call, got {other:?}"),
    }
}

/// Read a head alone (its body may be over the limit: never read).
fn head(raw: &[u8]) -> Request {
    match RequestReader::new(RequestLimits::default())
        .poll(raw)
        .unwrap()
    {
        Progress::Head(r) => r,
        other => panic!("{other:?}"),
    }
}

#[test]
fn identity_is_judged_before_the_declared_body_size() {
    let mut f = fixture();
    let over = (HttpConfig::default().max_body_bytes + 1).to_string();
    let auth = f.bearer();
    let decide = |f: &mut Fixture, method: &str, path: &str, auth: Option<&str>| {
        let mut text = format!(
            "{method} {path} HTTP/1.1\r\nHost: {LISTEN}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
        );
        if let Some(a) = auth {
            text.push_str(&format!("Authorization: {a}\r\n"));
        }
        text.push_str(&format!("Content-Length: {over}\r\n\r\n"));
        let request = head(text.as_bytes());
        assert!(request.body_over_limit.is_some());
        match f.endpoint.decide_head(&request, &f.store, f.now, NOW_MS) {
            HeadDecision::Respond(r) => parse(&r.bytes).status,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(decide(&mut f, "POST", "/mcp", None), 401);
    assert_eq!(decide(&mut f, "POST", "/mcp", Some("Bearer tw_nope")), 401);
    assert_eq!(decide(&mut f, "POST", "/mcp", Some(&auth)), 413);
    assert_eq!(
        decide(&mut f, "DELETE", "/mcp", Some(&auth)),
        413,
        "no session ended"
    );
    assert_eq!(decide(&mut f, "POST", "/nope", Some(&auth)), 404);
    assert_eq!(decide(&mut f, "GET", "/metrics", None), 401);
    assert_eq!(decide(&mut f, "GET", "/health", None), 413);
}

#[test]
fn routes() {
    let mut f = fixture();
    let r = respond(f.decide(&raw("GET", "/nope", &[("Host", LISTEN)], "")));
    assert_eq!(r.status, 404);
    assert!(matches!(
        f.decide(&raw("GET", "/health", &[("Host", LISTEN)], "")),
        Decision::Health { keep_alive: true }
    ));
    let r = respond(f.decide(&raw("POST", "/health", &[("Host", LISTEN)], "")));
    assert_eq!((r.status, r.header("allow")), (405, Some("GET")));
    let auth = f.bearer();
    for method in ["GET", "PUT", "OPTIONS"] {
        let r = respond(f.decide(&raw(
            method,
            "/mcp",
            &[("Host", LISTEN), ("Authorization", &auth)],
            "",
        )));
        assert_eq!(
            (r.status, r.header("allow")),
            (405, Some("POST, DELETE")),
            "{method}"
        );
    }
    // The query string does not change the route.
    assert!(matches!(
        f.decide(&raw("GET", "/health?x=1", &[("Host", LISTEN)], "")),
        Decision::Health { .. }
    ));
}

#[test]
fn host_checks() {
    let mut f = fixture();
    for (host, status) in [
        ("127.0.0.1:9210", 0),
        ("localhost:9210", 0),
        ("LOCALHOST:9210", 0),
        ("evil.example.com", 403),
        ("evil.example.com:9210", 403),
        ("127.0.0.1", 403),
        ("127.0.0.1:80", 403),
        ("bad host", 400),
    ] {
        let d = f.decide(&raw("GET", "/health", &[("Host", host)], ""));
        match (d, status) {
            (Decision::Health { .. }, 0) => {}
            (d, s) => assert_eq!(respond(d).status, s, "{host}"),
        }
    }
    // HTTP/1.0 without Host is refused where hosts are checked.
    let r = respond(f.decide(b"GET /health HTTP/1.0\r\n\r\n"));
    assert_eq!(r.status, 400);
}

#[test]
fn hosts_with_public_url_and_wildcard() {
    let mut s = settings();
    s.listen = "0.0.0.0:9210".parse().unwrap();
    let mut f = fixture_with(s.clone());
    assert!(matches!(
        f.decide(&raw("GET", "/health", &[("Host", "anything.example")], "")),
        Decision::Health { .. }
    ));
    assert!(
        f.endpoint
            .startup_notes()
            .iter()
            .any(|n| n.contains("any Host"))
    );

    s.public_url = Some("https://mcp.example.com/mcp".into());
    s.http.allowed_hosts = vec!["lb.internal".into()];
    let mut f = fixture_with(s);
    for (host, ok) in [
        ("mcp.example.com:443", true),
        ("mcp.example.com", false), // plain-HTTP door: no port means 80
        ("lb.internal:1234", true),
        ("127.0.0.1:9210", true),
        ("evil.example.com", false),
    ] {
        let d = f.decide(&raw("GET", "/health", &[("Host", host)], ""));
        assert_eq!(matches!(d, Decision::Health { .. }), ok, "{host}");
    }
}

#[test]
fn origin_checks() {
    let mut f = fixture();
    let r = respond(f.decide(&raw(
        "GET",
        "/health",
        &[("Host", LISTEN), ("Origin", "http://127.0.0.1:9210")],
        "",
    )));
    assert_eq!(r.status, 403, "no public_url: any Origin is refused");
    assert!(
        f.endpoint
            .startup_notes()
            .iter()
            .any(|n| n.contains("Origin"))
    );

    let mut s = settings();
    s.public_url = Some("http://127.0.0.1:9210".into());
    let mut f = fixture_with(s);
    for (origin, ok) in [
        ("http://127.0.0.1:9210", true),
        ("HTTP://127.0.0.1:9210", true),
        ("http://127.0.0.1:9211", false),
        ("https://127.0.0.1:9210", false),
        ("http://evil.example.com", false),
        ("null", false),
        ("http://127.0.0.1:9210/path", false),
    ] {
        let d = f.decide(&raw(
            "GET",
            "/health",
            &[("Host", LISTEN), ("Origin", origin)],
            "",
        ));
        match d {
            Decision::Health { .. } => assert!(ok, "{origin}"),
            d => {
                assert!(!ok, "{origin}");
                assert_eq!(respond(d).status, 403);
            }
        }
    }
    // No Origin at all: judged by the token alone.
    assert!(matches!(
        f.decide(&raw("GET", "/health", &[("Host", LISTEN)], "")),
        Decision::Health { .. }
    ));
}

#[test]
fn tokens_every_bad_kind() {
    let mut f = fixture();
    let admin = f
        .store
        .create("ops", TokenKind::Admin, None, NOW_MS - 10)
        .unwrap();
    let expired = f
        .store
        .create(
            "old",
            TokenKind::Client,
            Some(Duration::from_secs(1)),
            NOW_MS - 5000,
        )
        .unwrap();
    let revoked = f
        .store
        .create("gone", TokenKind::Client, None, NOW_MS - 10)
        .unwrap();
    f.store.revoke(revoked.info.id, NOW_MS - 5).unwrap();
    let unknown = crate::tokens::secret::generate().unwrap();
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#;
    let cases: Vec<(String, &str)> = vec![
        (String::new(), "Bearer realm=\"toolwall\""),
        ("Basic Zm9vOmJhcg==".into(), "invalid_token"),
        ("Bearer not-a-token".into(), "invalid_token"),
        (format!("Bearer {unknown}"), "invalid_token"),
        (format!("Bearer {}", expired.secret), "expired"),
        (format!("Bearer {}", revoked.secret), "revoked"),
        (format!("Bearer {}", admin.secret), "kind admin cannot"),
    ];
    for (auth, expect) in cases {
        let r = respond(f.post(&[("Authorization", &auth)], body));
        assert_eq!(r.status, 401, "{auth}");
        let challenge = r.header("www-authenticate").unwrap();
        assert!(challenge.starts_with("Bearer"), "{challenge}");
        assert!(challenge.contains(expect), "{challenge} vs {expect}");
        assert!(
            !String::from_utf8_lossy(&r.body).contains("twt_"),
            "no token echoed"
        );
    }
    assert_eq!(f.endpoint.sessions().len(), 0, "nothing processed");
    // A valid client token goes through.
    assert!(matches!(f.post(&[], body), Decision::Call { .. }));
}

#[test]
fn metrics_need_an_admin_token_unless_public() {
    let mut f = fixture();
    let admin = f
        .store
        .create("ops", TokenKind::Admin, None, NOW_MS - 10)
        .unwrap();
    let client = f.bearer();
    let r = respond(f.decide(&raw("GET", "/metrics", &[("Host", LISTEN)], "")));
    assert_eq!(r.status, 401);
    let r = respond(f.decide(&raw(
        "GET",
        "/metrics",
        &[("Host", LISTEN), ("Authorization", &client)],
        "",
    )));
    assert_eq!(r.status, 401);
    let bearer = format!("Bearer {}", admin.secret);
    assert!(matches!(
        f.decide(&raw(
            "GET",
            "/metrics",
            &[("Host", LISTEN), ("Authorization", &bearer)],
            ""
        )),
        Decision::Metrics { .. }
    ));
    let mut s = settings();
    s.metrics_public = true;
    let mut f = fixture_with(s);
    assert!(matches!(
        f.decide(&raw("GET", "/metrics", &[("Host", LISTEN)], "")),
        Decision::Metrics { .. }
    ));
    let r = parse(&f.endpoint.metrics("x 1\n", true).bytes);
    assert_eq!(r.header("content-type"), Some(PROMETHEUS_TEXT));
}

#[test]
fn auth_none_only_on_loopback() {
    let mut s = settings();
    s.auth = HttpAuth::None;
    s.listen = "0.0.0.0:9210".parse().unwrap();
    let err = Endpoint::new(s.clone()).err().unwrap();
    assert!(err.contains("loopback"), "{err}");
    s.listen = "192.168.1.10:9210".parse().unwrap();
    assert!(Endpoint::new(s.clone()).is_err());
    s.listen = "[::1]:9210".parse().unwrap();
    let e = Endpoint::new(s.clone()).unwrap();
    assert!(
        e.startup_notes()
            .iter()
            .any(|n| n.contains("NOT authenticated"))
    );
    s.listen = LISTEN.parse().unwrap();
    let mut f = fixture_with(s);
    let d = f.post(
        &[("Authorization", "")],
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#,
    );
    assert_eq!(call(d).principal, ANONYMOUS_PRINCIPAL);
}

#[test]
fn accept_and_content_type() {
    let mut f = fixture();
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#;
    for accept in [
        "",
        "application/json",
        "text/event-stream",
        "*/*",
        "application/json, text/event-stream;q=0",
        "application/*, text/*",
    ] {
        let r = respond(f.post(&[("Accept", accept)], body));
        assert_eq!(r.status, 406, "{accept:?}");
    }
    for accept in [
        "text/event-stream, application/json",
        "Application/JSON;q=0.9, TEXT/EVENT-STREAM",
        "application/json;q=0.5,text/event-stream;q=1",
    ] {
        assert!(
            matches!(f.post(&[("Accept", accept)], body), Decision::Call { .. }),
            "{accept}"
        );
    }
    for ct in [
        "",
        "text/plain",
        "application/jsonx",
        "application/json; charset=latin1",
    ] {
        let r = respond(f.post(&[("Content-Type", ct)], body));
        assert_eq!(r.status, 415, "{ct:?}");
    }
    for ct in [
        "application/json; charset=utf-8",
        "application/json;charset=\"UTF-8\"",
        "APPLICATION/JSON",
    ] {
        assert!(
            matches!(f.post(&[("Content-Type", ct)], body), Decision::Call { .. }),
            "{ct}"
        );
    }
}

#[test]
fn bodies_that_are_not_one_message() {
    let mut f = fixture();
    for (body, code) in [
        (
            r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
            jsonrpc::INVALID_REQUEST,
        ),
        ("{nope", jsonrpc::PARSE_ERROR),
        ("", jsonrpc::PARSE_ERROR),
        ("42", jsonrpc::INVALID_REQUEST),
        (r#"{"jsonrpc":"2.0","id":1}"#, jsonrpc::INVALID_REQUEST),
    ] {
        let r = respond(f.post(&[], body));
        assert_eq!(r.status, 400, "{body}");
        assert_eq!(r.json()["error"]["code"], code, "{body}");
    }
}

#[test]
fn legacy_session_lifecycle() {
    let mut f = fixture();
    let session = f.initialize("2025-06-18");
    assert!(session.bytes().all(|b| (0x21..=0x7e).contains(&b)));
    let sid = session.as_str();

    // initialized notification: 202, handed to the core.
    let d = f.post(
        &[
            ("Mcp-Session-Id", sid),
            ("MCP-Protocol-Version", "2025-06-18"),
        ],
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    );
    let Decision::Notify {
        ack,
        era,
        principal,
        ..
    } = d
    else {
        panic!()
    };
    assert_eq!(parse(&ack.bytes).status, 202);
    assert!(parse(&ack.bytes).body.is_empty());
    assert_eq!(principal, "alice");
    assert_eq!(
        era,
        Era::Legacy {
            version: "2025-06-18",
            session: Some(session.clone())
        }
    );

    // A request in the session, with and without the version header.
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}"#;
    let c = call(f.post(
        &[
            ("Mcp-Session-Id", sid),
            ("MCP-Protocol-Version", "2025-06-18"),
        ],
        list,
    ));
    assert_eq!(c.era.version(), "2025-06-18");
    assert_eq!(c.method, "tools/list");
    assert_eq!(c.id, "2");
    let c2 = call(f.post(&[("Mcp-Session-Id", sid)], list));
    assert_eq!(c2.era, c.era);
    // The legacy answer goes out as the core wrote it.
    let answer = br#"{"jsonrpc":"2.0","id":2,"result":{"tools":[]}}"#;
    let r = parse(&f.endpoint.answer(&c, answer, f.now).bytes);
    assert_eq!((r.status, r.body.as_slice()), (200, &answer[..]));
    // Legacy errors are 200 too.
    let err = jsonrpc::error_response(Some("2"), jsonrpc::METHOD_NOT_FOUND, "nope", None);
    assert_eq!(parse(&f.endpoint.answer(&c, &err, f.now).bytes).status, 200);

    // Missing, unknown, another principal's, mismatched version.
    let r = respond(f.post(&[], list));
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["id"], 2);
    assert_eq!(
        respond(f.post(&[("Mcp-Session-Id", &"0".repeat(64))], list)).status,
        404
    );
    assert_eq!(
        respond(f.post(&[("Mcp-Session-Id", "garbage")], list)).status,
        404
    );
    assert_eq!(
        respond(f.post(
            &[
                ("Mcp-Session-Id", sid),
                ("MCP-Protocol-Version", "2025-11-25")
            ],
            list
        ))
        .status,
        400
    );
    let bob = f
        .store
        .create("bob", TokenKind::Client, None, NOW_MS - 1)
        .unwrap();
    let bob_auth = format!("Bearer {}", bob.secret);
    assert_eq!(
        respond(f.post(
            &[("Mcp-Session-Id", sid), ("Authorization", &bob_auth)],
            list
        ))
        .status,
        404
    );
    let bob_delete = raw(
        "DELETE",
        "/mcp",
        &[
            ("Host", LISTEN),
            ("Authorization", &bob_auth),
            ("Mcp-Session-Id", sid),
        ],
        "",
    );
    assert_eq!(respond(f.decide(&bob_delete)).status, 404);

    // DELETE ends it; afterwards the id is unknown.
    let auth = f.bearer();
    let delete = raw(
        "DELETE",
        "/mcp",
        &[
            ("Host", LISTEN),
            ("Authorization", &auth),
            ("Mcp-Session-Id", sid),
            ("MCP-Protocol-Version", "2025-06-18"),
        ],
        "",
    );
    let r = respond(f.decide(&delete));
    assert_eq!(r.status, 204);
    assert_eq!(respond(f.decide(&delete)).status, 404);
    assert_eq!(
        respond(f.post(&[("Mcp-Session-Id", sid)], list)).status,
        404
    );
    let no_session = raw(
        "DELETE",
        "/mcp",
        &[("Host", LISTEN), ("Authorization", &auth)],
        "",
    );
    assert_eq!(respond(f.decide(&no_session)).status, 400);
    let modern_delete = raw(
        "DELETE",
        "/mcp",
        &[
            ("Host", LISTEN),
            ("Authorization", &auth),
            ("MCP-Protocol-Version", "2026-07-28"),
        ],
        "",
    );
    let r = respond(f.decide(&modern_delete));
    assert_eq!((r.status, r.header("allow")), (405, Some("POST")));
}

#[test]
fn legacy_sessions_expire_and_are_bounded() {
    let mut s = settings();
    s.http.max_sessions = 2;
    s.http.session_idle_secs = 10;
    let mut f = fixture_with(s);
    let first = f.initialize("2025-11-25");
    f.initialize("2025-11-25");
    let bob = f
        .store
        .create("bob", TokenKind::Client, None, NOW_MS - 1)
        .unwrap();
    let bob_auth = format!("Bearer {}", bob.secret);
    let init = r#"{"jsonrpc":"2.0","id":9,"method":"initialize","params":{"protocolVersion":"2025-11-25"}}"#;
    let r = respond(f.post(&[("Authorization", &bob_auth)], init));
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["id"], 9);
    f.now += Duration::from_secs(11);
    assert_eq!(f.endpoint.sweep(f.now), 2);
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    assert_eq!(
        respond(f.post(&[("Mcp-Session-Id", &first)], list)).status,
        404
    );
    assert!(matches!(
        f.post(&[("Authorization", &bob_auth)], init),
        Decision::Call { .. }
    ));
}

#[test]
fn failed_initialize_opens_no_session() {
    let mut f = fixture();
    let c = call(f.post(
        &[],
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#,
    ));
    let err = jsonrpc::error_response(Some("1"), jsonrpc::LEDGER_UNAVAILABLE, "ledger down", None);
    let r = parse(&f.endpoint.answer(&c, &err, f.now).bytes);
    assert_eq!(r.status, 200);
    assert!(r.header("mcp-session-id").is_none());
    assert!(f.endpoint.sessions().is_empty());
}

#[test]
fn modern_requests() {
    let mut f = fixture();
    let c = call(f.modern("server/discover", &format!("{{{MODERN_META}}}"), &[]));
    assert_eq!(
        c.era,
        Era::Modern {
            version: "2026-07-28"
        }
    );
    assert_eq!(c.id, "41");
    // The core's discover answer gains the modern fields.
    let answer = jsonrpc::result_response("41", &era::discover_result("hi").to_string());
    let r = parse(&f.endpoint.answer(&c, &answer, f.now).bytes);
    assert_eq!(r.status, 200);
    assert!(r.header("mcp-session-id").is_none());
    let v = r.json();
    assert_eq!(v["result"]["resultType"], "complete");
    assert_eq!(v["result"]["cacheScope"], "public");
    assert_eq!(v["result"]["ttlMs"], 0);
    assert_eq!(
        v["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "toolwall"
    );
    // Errors from the core get the modern status.
    let err = jsonrpc::error_response(Some("41"), jsonrpc::METHOD_NOT_FOUND, "nope", None);
    assert_eq!(parse(&f.endpoint.answer(&c, &err, f.now).bytes).status, 404);

    // A session header is ignored in the modern era.
    let c = call(f.modern(
        "tools/list",
        &format!("{{{MODERN_META}}}"),
        &[("Mcp-Session-Id", "whatever")],
    ));
    assert_eq!(
        c.era,
        Era::Modern {
            version: "2026-07-28"
        }
    );

    // tools/call checks Mcp-Name against params.name (decoding base64, trimming OWS).
    let params = format!(r#"{{"name":"local__echo","arguments":{{}},{MODERN_META}}}"#);
    assert!(matches!(
        f.modern("tools/call", &params, &[("Mcp-Name", "  local__echo  ")]),
        Decision::Call { .. }
    ));
    assert!(matches!(
        f.modern(
            "tools/call",
            &params,
            &[("mcp-name", "=?base64?bG9jYWxfX2VjaG8=?=")]
        ),
        Decision::Call { .. }
    ));
    for name in ["", "wrong", "LOCAL__ECHO", "=?base64?bG9jYWxfX2VjaG8?="] {
        let r = respond(f.modern("tools/call", &params, &[("Mcp-Name", name)]));
        assert_eq!(
            (r.status, r.json()["error"]["code"].as_i64()),
            (400, Some(era::HEADER_MISMATCH)),
            "{name:?}"
        );
        assert_eq!(r.json()["id"], 41);
    }
}

#[test]
fn modern_refusals_carry_the_id() {
    let mut f = fixture();
    let meta = format!("{{{MODERN_META}}}");
    // Mcp-Method missing, wrong, wrong case; header names in any case are fine.
    let r = respond(f.modern("tools/list", &meta, &[("Mcp-Method", "")]));
    assert_eq!(
        (
            r.status,
            r.json()["error"]["code"].as_i64(),
            r.json()["id"].as_i64()
        ),
        (400, Some(era::HEADER_MISMATCH), Some(41))
    );
    let r = respond(f.modern("tools/list", &meta, &[("Mcp-Method", "prompts/list")]));
    assert_eq!(r.json()["error"]["code"], era::HEADER_MISMATCH);
    let r = respond(f.modern("tools/list", &meta, &[("Mcp-Method", "TOOLS/LIST")]));
    assert_eq!(r.json()["error"]["code"], era::HEADER_MISMATCH);
    assert!(matches!(
        f.modern("tools/list", &meta, &[("MCP-METHOD", "tools/list")]),
        Decision::Call { .. }
    ));

    // _meta missing or incomplete: -32602.
    for params in [
        "{}",
        r#"{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}"#,
    ] {
        let r = respond(f.modern("server/discover", params, &[]));
        assert_eq!(
            (r.status, r.json()["error"]["code"].as_i64()),
            (400, Some(jsonrpc::INVALID_PARAMS)),
            "{params}"
        );
        assert_eq!(r.json()["id"], 41);
    }
    // clientInfo is optional.
    assert!(matches!(
        f.modern("server/discover", &meta, &[]),
        Decision::Call { .. }
    ));

    // Unsupported version (header and body agree): -32022 with the list.
    let odd = r#"{"_meta":{"io.modelcontextprotocol/protocolVersion":"v999.0.0","io.modelcontextprotocol/clientCapabilities":{}}}"#;
    let r = respond(f.modern(
        "server/discover",
        odd,
        &[("MCP-Protocol-Version", "v999.0.0")],
    ));
    assert_eq!(r.status, 400);
    let v = r.json();
    assert_eq!(v["error"]["code"], era::UNSUPPORTED_PROTOCOL_VERSION);
    assert_eq!(v["error"]["data"]["requested"], "v999.0.0");
    assert_eq!(
        v["error"]["data"]["supported"],
        serde_json::json!(era::supported_versions())
    );
    // Header and body disagree: -32020.
    let r = respond(f.modern("server/discover", odd, &[]));
    assert_eq!(r.json()["error"]["code"], era::HEADER_MISMATCH);
    // Without the header but with modern _meta: the header is required.
    let body = format!(r#"{{"jsonrpc":"2.0","id":5,"method":"tools/list","params":{meta}}}"#);
    let r = respond(f.post(&[("Mcp-Method", "tools/list")], &body));
    assert_eq!(
        (r.status, r.json()["error"]["code"].as_i64()),
        (400, Some(era::HEADER_MISMATCH))
    );

    // Methods of the legacy era only: 404 with -32601.
    for method in LEGACY_ONLY_METHODS {
        let r = respond(f.modern(method, &meta, &[]));
        assert_eq!(
            (r.status, r.json()["error"]["code"].as_i64()),
            (404, Some(jsonrpc::METHOD_NOT_FOUND)),
            "{method}"
        );
        assert_eq!(r.json()["id"], 41);
    }
}

#[test]
fn modern_notifications_are_accepted() {
    let mut f = fixture();
    let d = f.post(
        &[("MCP-Protocol-Version", "2026-07-28")],
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}"#,
    );
    let Decision::Notify { ack, era, .. } = d else {
        panic!()
    };
    assert_eq!(parse(&ack.bytes).status, 202);
    assert!(era.is_modern());
}

#[test]
fn health_reports() {
    let f = fixture();
    let report = HealthReport {
        serving: true,
        workers: serde_json::json!({"builtin": "ready"}),
        sandbox: serde_json::json!("enforced"),
        ledger: serde_json::json!({"ok": true}),
    };
    let r = parse(&f.endpoint.health(&report, true).bytes);
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["mcp_enabled"], true);
    assert_eq!(v["status"], "ok");
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    let r = parse(
        &f.endpoint
            .health(
                &HealthReport {
                    serving: false,
                    ..report
                },
                false,
            )
            .bytes,
    );
    assert_eq!(r.status, 503);
    assert_eq!(r.header("connection"), Some("close"));
}

#[test]
fn fixed_responses_close() {
    let r = parse_error_response(&ParseError {
        status: 413,
        reason: "request body too large",
    });
    assert!(r.close);
    assert_eq!(parse(&r.bytes).status, 413);
    assert!(timeout_response().close);
    let busy = busy_response("http.max_connections", 7);
    assert!(busy.close);
    let p = parse(&busy.bytes);
    assert_eq!(p.status, 503);
    assert_eq!(p.header("retry-after"), Some("7"));
    assert!(String::from_utf8_lossy(&p.body).contains("http.max_connections"));
}

#[test]
fn reconfigure_keeps_sessions() {
    let mut f = fixture();
    let session = f.initialize("2025-11-25");
    let mut s = settings();
    s.public_url = Some("http://127.0.0.1:9210".into());
    f.endpoint.reconfigure(s.clone()).unwrap();
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    assert!(matches!(
        f.post(&[("Mcp-Session-Id", &session)], list),
        Decision::Call { .. }
    ));
    s.auth = HttpAuth::None;
    s.listen = "0.0.0.0:1".parse().unwrap();
    assert!(f.endpoint.reconfigure(s).is_err());
    assert_eq!(f.endpoint.settings().listen, LISTEN.parse().unwrap());
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    fn header_value() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(String::new()),
            Just("2026-07-28".to_owned()),
            Just("2025-11-25".to_owned()),
            "[ -~]{0,40}",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Any body and any values of the headers the endpoint reads: a decision, never a
        /// panic, and a refusal is always a whole HTTP response.
        #[test]
        fn no_panic_on_any_body_or_header(
            body in proptest::collection::vec(any::<u8>(), 0..512),
            json_like in "\\{\"jsonrpc\":\"2.0\",(\"id\":[0-9a\"]{1,3},)?\"method\":\"[a-z/]{0,16}\"(,\"params\":\\{\"_meta\":\\{[ -~]{0,40}\\}\\})?\\}",
            use_json in any::<bool>(),
            version in header_value(),
            method in header_value(),
            name in header_value(),
            session in header_value(),
            origin in header_value(),
            host in prop_oneof![Just(LISTEN.to_owned()), "[ -~]{1,30}"],
        ) {
            let mut f = fixture();
            let auth = f.bearer();
            let body = if use_json { json_like.into_bytes() } else { body };
            let mut head = format!(
                "POST /mcp HTTP/1.1\r\nHost: {host}\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n",
                body.len()
            );
            for (n, v) in [("MCP-Protocol-Version", &version), ("Mcp-Method", &method), ("Mcp-Name", &name), ("Mcp-Session-Id", &session), ("Origin", &origin)] {
                if !v.is_empty() {
                    head.push_str(&format!("{n}: {v}\r\n"));
                }
            }
            head.push_str("\r\n");
            let mut raw = head.into_bytes();
            raw.extend_from_slice(&body);
            let Ok(Progress::Ready(request)) = RequestReader::new(RequestLimits::default()).poll_whole(&raw) else {
                return Ok(());
            };
            match f.endpoint.decide(&request, &raw, &f.store, f.now, NOW_MS) {
                Decision::Respond(r) => {
                    let p = parse(&r.bytes);
                    prop_assert!(p.status >= 200);
                }
                Decision::Call { call, message } => {
                    prop_assert_eq!(message, request.body.clone());
                    let answer = jsonrpc::result_response(&call.id, "{}");
                    let r = f.endpoint.answer(&call, &answer, f.now);
                    prop_assert!(parse(&r.bytes).status == 200);
                }
                Decision::Notify { ack, .. } => prop_assert_eq!(parse(&ack.bytes).status, 202),
                Decision::Health { .. } | Decision::Metrics { .. } => prop_assert!(false),
            }
        }
    }
}
