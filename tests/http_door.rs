//! The Streamable HTTP door over real sockets against the real binary: every status code,
//! both MCP eras, tokens, Origin and Host, health and metrics, keep-alive, pipelining,
//! concurrency, slow and oversized requests, TLS, and policy.

mod common;

use common::http::{
    HttpGateway, LEGACY, MODERN, Req, echo_in_session, initialize, modern, open_session,
    result_text, rpc,
};
use common::{BIN, PATIENCE, query_json, wait_timeout};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn echo_call(id: u64, text: &str) -> Value {
    rpc(
        id,
        "tools/call",
        json!({"name": "local__echo", "arguments": {"text": text}}),
    )
}

/// Wait until `check` holds for `what` (bounded by PATIENCE).
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !check() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn post_answers_200_202_400_415_406_and_404() {
    let gw = HttpGateway::start("", "");
    let token = gw.client_token("alice");
    let mut http = gw.http();

    // 200 JSON for a request (initialize opens the session the rest uses).
    let init = http.call(&gw.post(&initialize(1)).bearer(&token));
    assert_eq!(init.status, 200, "{}", init.text());
    assert!(
        init.header("Content-Type")
            .is_some_and(|v| v.starts_with("application/json")),
        "{:?}",
        init.headers
    );
    assert_eq!(init.json()["id"], 1);
    assert_eq!(init.json()["result"]["protocolVersion"], LEGACY);
    let session = init
        .header("Mcp-Session-Id")
        .expect("session id")
        .to_owned();
    let with_session = |body: &Value| {
        gw.post(body)
            .bearer(&token)
            .session(&session)
            .header("MCP-Protocol-Version", LEGACY)
    };

    // 202 without a body for a notification and for a response.
    for message in [
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 77, "result": {}}),
        json!({"jsonrpc": "2.0", "id": 78, "error": {"code": -1, "message": "no"}}),
    ] {
        let r = http.call(&with_session(&message));
        assert_eq!(r.status, 202, "{message}: {}", r.text());
        assert!(r.body.is_empty(), "202 has no body: {}", r.text());
    }

    let r = http.call(&with_session(&rpc(2, "tools/list", json!({}))));
    assert_eq!(r.status, 200);
    assert!(
        r.json()["result"]["tools"]
            .as_array()
            .is_some_and(|t| !t.is_empty())
    );

    // 400 for a batch and for bodies that are not one JSON-RPC message.
    let batch = json!([rpc(3, "tools/list", json!({})), rpc(4, "ping", json!({}))]);
    for body in [
        batch.to_string(),
        "{\"foo\": 1}".to_owned(),
        "this is not json".to_owned(),
        "\"a string\"".to_owned(),
        "{\"jsonrpc\": \"1.0\", \"id\": 5, \"method\": \"ping\"}".to_owned(),
        String::new(),
    ] {
        let r = http.call(&with_session(&json!(null)).body(body.clone().into_bytes()));
        assert_eq!(r.status, 400, "{body:?}: {}", r.text());
        assert!(r.json()["error"]["code"].is_i64(), "{}", r.text());
    }

    // 415 for a Content-Type other than application/json.
    for ct in [
        Some("text/plain"),
        Some("application/json; charset=latin1"),
        None,
    ] {
        let mut req = with_session(&rpc(6, "ping", json!({}))).without("Content-Type");
        if let Some(ct) = ct {
            req = req.header("Content-Type", ct);
        }
        let r = http.call(&req);
        assert_eq!(r.status, 415, "{ct:?}: {}", r.text());
    }
    let r = http.call(
        &with_session(&rpc(7, "ping", json!({})))
            .set("Content-Type", "application/json; charset=utf-8"),
    );
    assert_eq!(r.status, 200, "a UTF-8 charset is fine: {}", r.text());

    // 406 when Accept lacks either type.
    for accept in [
        Some("application/json"),
        Some("text/event-stream"),
        Some("*/*"),
        Some("application/json, text/event-stream;q=0"),
        None,
    ] {
        let mut req = with_session(&rpc(8, "ping", json!({}))).without("Accept");
        if let Some(a) = accept {
            req = req.header("Accept", a);
        }
        let r = http.call(&req);
        assert_eq!(r.status, 406, "{accept:?}: {}", r.text());
    }

    // 404 on other paths.
    for path in ["/", "/mcp/", "/MCP", "/mcp/x", "/sse", "/healthz"] {
        let mut req = with_session(&rpc(9, "ping", json!({})));
        req.path = path.into();
        let r = http.call(&req);
        assert_eq!(r.status, 404, "{path}: {}", r.text());
    }

    // All on one keep-alive connection; it still works.
    let r = http.call(&with_session(&rpc(10, "ping", json!({}))));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["result"], json!({}));
}

#[test]
fn get_and_delete_on_mcp_per_era() {
    let gw = HttpGateway::start("", "");
    let token = gw.client_token("alice");
    let mut http = gw.http();
    let session = open_session(&mut http, gw.port, Some(&token));

    // Nothing is served on GET (no standalone SSE stream), in either era: 405 with Allow.
    for version in [None, Some(LEGACY), Some(MODERN)] {
        let mut req = Req::new("GET", "/mcp", gw.port)
            .bearer(&token)
            .header("Accept", "text/event-stream");
        if let Some(v) = version {
            req = req.header("MCP-Protocol-Version", v);
        }
        if version == Some(LEGACY) {
            req = req.session(&session);
        }
        let r = http.call(&req);
        assert_eq!(r.status, 405, "GET {version:?}: {}", r.text());
        let allow = r.header("Allow").expect("405 names what is allowed");
        assert!(allow.contains("POST"), "{allow}");
    }
    for method in ["PUT", "PATCH"] {
        let r = http.call(&Req::new(method, "/mcp", gw.port).bearer(&token));
        assert_eq!(r.status, 405, "{method}");
        assert!(r.header("Allow").is_some());
    }

    // Modern era: no session, so DELETE is not served either.
    let r = http.call(
        &Req::new("DELETE", "/mcp", gw.port)
            .bearer(&token)
            .header("MCP-Protocol-Version", MODERN),
    );
    assert_eq!(r.status, 405, "{}", r.text());
    assert_eq!(r.header("Allow"), Some("POST"));

    // Legacy era: DELETE ends the session named by the header.
    let r = http.call(&Req::new("DELETE", "/mcp", gw.port).bearer(&token));
    assert_eq!(r.status, 400, "DELETE without a session id: {}", r.text());
    let r = http.call(
        &Req::new("DELETE", "/mcp", gw.port)
            .bearer(&token)
            .session(&session)
            .header("MCP-Protocol-Version", LEGACY),
    );
    assert_eq!(r.status, 204, "{}", r.text());
    assert!(r.body.is_empty());
}

#[test]
fn legacy_sessions_are_issued_required_checked_and_ended() {
    let gw = HttpGateway::start("", "");
    let alice = gw.client_token("alice");
    let bob = gw.client_token("bob");
    let mut http = gw.http();

    let session = open_session(&mut http, gw.port, Some(&alice));
    assert!(
        !session.is_empty() && session.bytes().all(|b| (0x21..=0x7e).contains(&b)),
        "visible ASCII: {session:?}"
    );
    let other = open_session(&mut http, gw.port, Some(&alice));
    assert_ne!(session, other, "every initialize opens its own session");

    let list = |id| gw.post(&rpc(id, "tools/list", json!({}))).bearer(&alice);

    let r = http.call(&list(1).header("MCP-Protocol-Version", LEGACY));
    assert_eq!(r.status, 400, "missing session id: {}", r.text());
    assert_eq!(r.json()["id"], 1, "the id is echoed");

    let unknown = "0".repeat(64);
    for id in [unknown.as_str(), "not-a-session", "~"] {
        let r = http.call(&list(2).session(id));
        assert_eq!(r.status, 404, "unknown session {id:?}: {}", r.text());
    }

    // Another principal cannot use alice's session.
    let r = http.call(
        &gw.post(&rpc(3, "tools/list", json!({})))
            .bearer(&bob)
            .session(&session),
    );
    assert_eq!(r.status, 404, "{}", r.text());

    let r = http.call(
        &list(4)
            .session(&session)
            .header("MCP-Protocol-Version", "2025-03-26"),
    );
    assert_eq!(r.status, 400, "not the negotiated version: {}", r.text());
    let r = http.call(
        &list(5)
            .session(&session)
            .header("MCP-Protocol-Version", "banana"),
    );
    assert_eq!(r.status, 400, "{}", r.text());

    let r = http.call(
        &list(6)
            .session(&session)
            .header("MCP-Protocol-Version", LEGACY),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = http.call(&list(7).session(&session));
    assert_eq!(
        r.status,
        200,
        "the version header may be left out: {}",
        r.text()
    );

    let delete = |id: &str| {
        Req::new("DELETE", "/mcp", gw.port)
            .bearer(&alice)
            .session(id)
    };
    assert_eq!(http.call(&delete(&session)).status, 204);
    let r = http.call(&list(8).session(&session));
    assert_eq!(r.status, 404, "ended session: {}", r.text());
    assert_eq!(http.call(&delete(&session)).status, 404, "ended twice");

    // The other session lives on.
    let r = http.call(&echo_in_session(gw.port, 9, &other, "still here").bearer(&alice));
    assert_eq!(r.status, 200);
    assert_eq!(result_text(&r.json()), "still here");
}

#[test]
fn sessions_are_bounded_per_principal_and_end_when_idle() {
    let gw = HttpGateway::start(
        "",
        "[http]\nmax_sessions_per_principal = 2\nsession_idle_secs = 1\n",
    );
    let alice = gw.client_token("alice");
    let bob = gw.client_token("bob");
    let port = gw.port;
    let mut http = gw.http();
    let list = |id: &str, token: &str| {
        gw.post(&rpc(1, "tools/list", json!({})))
            .bearer(token)
            .session(id)
    };

    // A third session of alice ends her least recently used one; bob's is not touched.
    let bobs = open_session(&mut http, port, Some(&bob));
    let first = open_session(&mut http, port, Some(&alice));
    let second = open_session(&mut http, port, Some(&alice));
    assert_eq!(
        http.call(&list(&first, &alice)).status,
        200,
        "first is now the most recent"
    );
    let third = open_session(&mut http, port, Some(&alice));
    assert_eq!(
        http.call(&list(&second, &alice)).status,
        404,
        "least recently used ended"
    );
    assert_eq!(http.call(&list(&first, &alice)).status, 200);
    assert_eq!(http.call(&list(&third, &alice)).status, 200);
    assert_eq!(http.call(&list(&bobs, &bob)).status, 200);

    // Unused for longer than session_idle_secs: gone.
    std::thread::sleep(Duration::from_millis(2500));
    for (id, token) in [(&first, &alice), (&third, &alice), (&bobs, &bob)] {
        let r = http.call(&list(id, token));
        assert_eq!(r.status, 404, "idle session: {}", r.text());
    }
}

#[test]
fn http_1_0_closes_unless_asked_to_keep_alive() {
    let gw = HttpGateway::start("", "");
    let mut http = gw.http();
    http.send_raw(
        format!(
            "GET /health HTTP/1.0\r\nHost: 127.0.0.1:{}\r\n\r\n",
            gw.port
        )
        .as_bytes(),
    );
    assert_eq!(http.response().map(|r| r.status), Some(200));
    assert!(http.closed_by_peer(), "HTTP/1.0 closes by default");
    let mut http = gw.http();
    let keep = format!(
        "GET /health HTTP/1.0\r\nHost: 127.0.0.1:{}\r\nConnection: keep-alive\r\n\r\n",
        gw.port
    );
    http.send_raw(keep.as_bytes());
    assert_eq!(http.response().map(|r| r.status), Some(200));
    http.send_raw(keep.as_bytes());
    assert_eq!(http.response().map(|r| r.status), Some(200), "kept alive");
}

#[test]
fn modern_era_discover_headers_versions_and_result_shape() {
    let gw = HttpGateway::start("", "[http]\ncache_ttl_ms = 1500\n");
    let token = gw.client_token("alice");
    let mut http = gw.http();
    let port = gw.port;

    let r = http.call(&modern(port, 1, "server/discover", json!({}), None).bearer(&token));
    assert_eq!(r.status, 200, "{}", r.text());
    let result = &r.json()["result"];
    let versions: Vec<&str> = result["supportedVersions"]
        .as_array()
        .expect("supportedVersions")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(versions.first(), Some(&MODERN), "{versions:?}");
    assert!(versions.contains(&LEGACY), "{versions:?}");
    assert_eq!(result["resultType"], "complete");
    assert_eq!(result["ttlMs"], 1500);
    assert_eq!(result["cacheScope"], "public");
    assert!(result["capabilities"]["tools"].is_object());
    assert_eq!(
        result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "toolwall"
    );
    assert!(
        r.header("Mcp-Session-Id").is_none(),
        "no session in the modern era"
    );

    let r = http.call(&modern(port, 2, "tools/list", json!({}), None).bearer(&token));
    assert_eq!(r.status, 200, "{}", r.text());
    let result = &r.json()["result"];
    assert_eq!(result["resultType"], "complete");
    assert_eq!(result["ttlMs"], 1500);
    assert_eq!(result["cacheScope"], "private");
    assert!(
        result["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "local__echo")
    );

    let call = |id, name: &str, header_name: Option<&str>| {
        modern(
            port,
            id,
            "tools/call",
            json!({"name": name, "arguments": {"text": "modern hello"}}),
            header_name,
        )
        .bearer(&token)
    };
    let r = http.call(&call(3, "local__echo", Some("local__echo")));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["result"]["resultType"], "complete");
    assert_eq!(result_text(&r.json()), "modern hello");

    // Headers that do not mirror the body: 400 with -32020.
    let mismatches = [
        call(4, "local__echo", Some("local__other")),
        call(5, "local__echo", None),
        call(6, "local__echo", Some("local__echo")).set("Mcp-Method", "tools/list"),
        call(7, "local__echo", Some("local__echo")).without("Mcp-Method"),
        call(8, "local__echo", Some("local__echo")).set("Mcp-Method", "TOOLS/CALL"),
        call(9, "local__echo", Some("local__echo")).header("Mcp-Method", "tools/call"),
    ];
    for req in mismatches {
        let r = http.call(&req);
        assert_eq!(r.status, 400, "{:?}: {}", req.headers, r.text());
        assert_eq!(r.error_code(), Some(-32020), "{}", r.text());
    }
    // A legacy version header makes the request legacy, whatever its _meta says: without
    // a session it is refused all the same.
    let r = http.call(
        &modern(port, 9, "tools/list", json!({}), None)
            .bearer(&token)
            .set("MCP-Protocol-Version", "2025-06-18"),
    );
    assert_eq!(r.status, 400, "{}", r.text());

    // An unsupported version: 400, -32022 and the supported list.
    let mut future = modern(port, 10, "tools/list", json!({}), None)
        .bearer(&token)
        .set("MCP-Protocol-Version", "2099-01-01");
    let mut body: Value = serde_json::from_slice(&future.body).unwrap();
    body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!("2099-01-01");
    future.body = body.to_string().into_bytes();
    let r = http.call(&future);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.error_code(), Some(-32022), "{}", r.text());
    let supported = &r.json()["error"]["data"]["supported"];
    assert!(
        supported
            .as_array()
            .is_some_and(|v| v.contains(&json!(MODERN)) && v.contains(&json!(LEGACY))),
        "{}",
        r.text()
    );
    assert_eq!(r.json()["id"], 10);

    // Legacy-only methods do not exist in the modern era.
    let r = http.call(&modern(port, 11, "ping", json!({}), None).bearer(&token));
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(r.error_code(), Some(-32601));

    // The ledger row of the modern call names the principal and the door.
    let rows = gw.wait_rows("the modern call", |rows| !rows.is_empty());
    assert_eq!(rows.len(), 1, "only the well-formed call ran: {rows:#?}");
    assert_eq!(rows[0]["principal"], "alice");
    assert_eq!(rows[0]["transport"], "http");
}

/// Every cell of every table of the ledger file, as text.
fn ledger_cells(gw: &HttpGateway) -> Vec<(String, String)> {
    let conn = gw.ledger();
    let tables: Vec<String> =
        query_json(&conn, "SELECT name FROM sqlite_master WHERE type = 'table'")
            .into_iter()
            .filter_map(|r| r["name"].as_str().map(str::to_owned))
            .collect();
    let mut cells = Vec::new();
    for table in tables {
        for row in query_json(&conn, &format!("SELECT * FROM \"{table}\"")) {
            for (column, value) in row.as_object().unwrap() {
                let text = match value {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                cells.push((format!("{table}.{column}"), text));
            }
        }
    }
    cells
}

#[test]
fn bad_tokens_get_401_and_nothing_is_processed_and_no_token_is_ever_written() {
    let dir = tempfile::tempdir().unwrap();
    let gw = HttpGateway::start_with_env(dir, "", "", &[("TOOLWALL_DEBUG", "1")]);
    let expiring = gw.token("mallory", "client", "1s");
    let alice = gw.client_token("alice");
    let revoked = gw.client_token("mallory");
    let admin = gw.token("mallory", "admin", "never");

    let listed = String::from_utf8(gw.cli(&["token", "list"]).stdout).unwrap();
    let revoked_id = listed
        .lines()
        .filter(|l| l.contains("mallory") && l.contains("client") && l.contains("never"))
        .find_map(|l| l.split_whitespace().next())
        .expect("the revocable token's id")
        .to_owned();
    let out = gw.cli(&["token", "revoke", &revoked_id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eventually("the 1s token to expire", || {
        let list = String::from_utf8(gw.cli(&["token", "list"]).stdout).unwrap();
        list.lines().filter(|l| l.contains("expired")).count() == 1
    });

    let bad_auth: Vec<(&str, Option<String>)> = vec![
        ("missing", None),
        ("empty bearer", Some("Bearer ".into())),
        ("other scheme", Some(format!("Basic {alice}"))),
        ("malformed", Some("Bearer not-a-token".into())),
        ("unknown", Some(format!("Bearer twt_{}", "A".repeat(43)))),
        (
            "truncated",
            Some(format!("Bearer {}", &alice[..alice.len() - 1])),
        ),
        ("two tokens", Some(format!("Bearer {alice} {alice}"))),
        ("expired", Some(format!("Bearer {expiring}"))),
        ("revoked", Some(format!("Bearer {revoked}"))),
        ("admin kind on /mcp", Some(format!("Bearer {admin}"))),
    ];
    let requests = |kind: usize| match kind {
        0 => gw.post(&initialize(1)),
        1 => gw.post(&echo_call(2, "SHOULD-NOT-RUN")),
        _ => modern(
            gw.port,
            3,
            "tools/call",
            json!({"name": "local__echo", "arguments": {"text": "SHOULD-NOT-RUN"}}),
            Some("local__echo"),
        ),
    };
    for (what, auth) in &bad_auth {
        for kind in 0..3 {
            let mut req = requests(kind);
            if let Some(a) = auth {
                req = req.header("Authorization", a);
            }
            // A refused token ends its connection (a client that keeps failing must not
            // keep its seat): a fresh one for each.
            let mut http = gw.http();
            let r = http.call(&req);
            assert_eq!(r.status, 401, "{what} / {kind}: {}", r.text());
            assert_eq!(r.header("Connection"), Some("close"), "{what} / {kind}");
            assert!(
                http.closed_by_peer(),
                "{what} / {kind}: closed after the 401"
            );
            let challenge = r.header("WWW-Authenticate").unwrap_or("");
            assert!(challenge.starts_with("Bearer"), "{what}: {challenge:?}");
            assert!(r.header("Mcp-Session-Id").is_none());
        }
    }
    // DELETE and GET are refused the same way.
    for method in ["DELETE", "GET"] {
        let r = gw
            .http()
            .call(&Req::new(method, "/mcp", gw.port).bearer(&admin));
        assert_eq!(r.status, 401, "{method}");
    }

    // A good token works, and its principal is the row's.
    let mut http = gw.http();
    let session = open_session(&mut http, gw.port, Some(&alice));
    let r = http.call(&echo_in_session(gw.port, 4, &session, "alice was here").bearer(&alice));
    assert_eq!(result_text(&r.json()), "alice was here");
    let rows = gw.wait_rows("alice's call", |rows| !rows.is_empty());
    assert_eq!(
        rows.len(),
        1,
        "no refused request reached a tool: {rows:#?}"
    );
    assert_eq!(rows[0]["principal"], "alice");
    assert_eq!(rows[0]["transport"], "http");

    // Nothing of a refused request was recorded: no row, no event names mallory or the
    // text of the refused calls (connects and disconnects name the TCP peer only).
    for (column, text) in ledger_cells(&gw) {
        if column.starts_with("tokens.") {
            continue;
        }
        assert!(!text.contains("SHOULD-NOT-RUN"), "{column}: {text}");
        assert!(!text.contains("mallory"), "{column}: {text}");
    }
    let initializes = gw.events("initialize");
    assert_eq!(initializes.len(), 1, "{initializes:#?}");

    // No token text anywhere: ledger cells, the database files, the log.
    let tokens = [&expiring, &alice, &revoked, &admin];
    for (column, text) in ledger_cells(&gw) {
        for t in tokens {
            assert!(!text.contains(t.as_str()), "a token in {column}");
            // The secret part alone (after the prefix) must not appear either.
            assert!(!text.contains(&t[4..]), "a token's secret in {column}");
        }
    }
    for entry in std::fs::read_dir(gw.ledger.parent().unwrap()).unwrap() {
        let path = entry.unwrap().path();
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        for t in tokens {
            assert!(
                !bytes.windows(t.len() - 4).any(|w| w == &t.as_bytes()[4..]),
                "a token in {}",
                path.display()
            );
        }
    }
    let log = gw.log();
    assert!(log.contains("info: ready"), "the log was captured");
    for t in tokens {
        assert!(!log.contains(&t[4..]), "a token in the log:\n{log}");
    }
}

#[test]
fn http_auth_none_is_refused_off_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let port = common::http::free_port();
    let config = common::http::http_config(dir.path(), port, "http_auth = \"none\"", "").replace(
        &format!("http = \"127.0.0.1:{port}\""),
        &format!("http = \"0.0.0.0:{port}\""),
    );
    let path = dir.path().join("toolwall.toml");
    std::fs::write(&path, config).unwrap();
    let mut child = std::process::Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&path)
        .current_dir(dir.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = wait_timeout(&mut child, PATIENCE).expect("the gateway exits");
    assert!(!status.success(), "must refuse to start; log:\n{err}");
    assert!(err.contains("http_auth"), "names the key:\n{err}");
    assert!(!err.contains("info: ready"), "{err}");
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "nothing listens"
    );
}

#[test]
fn http_auth_none_on_loopback_serves_everyone_as_anonymous() {
    let gw = HttpGateway::start("http_auth = \"none\"", "");
    assert!(
        gw.log().contains("http_auth = \"none\""),
        "the log says tokens are off:\n{}",
        gw.log()
    );
    let mut http = gw.http();
    let session = open_session(&mut http, gw.port, None);
    let r = http.call(&echo_in_session(gw.port, 2, &session, "open door"));
    assert_eq!(result_text(&r.json()), "open door");
    let rows = gw.wait_rows("the call", |rows| !rows.is_empty());
    assert_eq!(rows[0]["principal"], "anonymous");
}

#[test]
fn origin_is_checked_against_public_url() {
    let gw = HttpGateway::start("public_url = \"http://127.0.0.1:{port}/mcp\"", "");
    let token = gw.client_token("alice");
    let port = gw.port;
    let mut http = gw.http();
    let list = |origin: Option<&str>| {
        let mut req = modern(port, 1, "tools/list", json!({}), None).bearer(&token);
        if let Some(o) = origin {
            req = req.header("Origin", o);
        }
        req
    };

    let r = http.call(&list(None));
    assert_eq!(
        r.status,
        200,
        "no Origin: judged by the token: {}",
        r.text()
    );
    let r = http.call(&list(Some(&format!("http://127.0.0.1:{port}"))));
    assert_eq!(r.status, 200, "matching Origin: {}", r.text());
    let r = http.call(
        &gw.post(&initialize(1))
            .header("Origin", &format!("http://127.0.0.1:{port}")),
    );
    assert_eq!(
        r.status, 401,
        "a matching Origin does not replace the token"
    );
    // A 401 ends the connection.
    let mut http = gw.http();

    for origin in [
        "http://evil.example".to_owned(),
        format!("http://evil.example:{port}"),
        format!("https://127.0.0.1:{port}"),
        format!("http://127.0.0.1:{}", port.wrapping_add(1)),
        format!("http://localhost:{port}"),
        "null".to_owned(),
        "::::".to_owned(),
        String::new(),
        format!("http://127.0.0.1:{port}/mcp/../x"),
    ] {
        let r = http.call(&list(Some(&origin)));
        assert_eq!(r.status, 403, "Origin {origin:?}: {}", r.text());
    }

    // Host must name this server.
    let r = http.call(&list(None).set("Host", &format!("localhost:{port}")));
    assert_eq!(
        r.status,
        200,
        "localhost on a loopback listener: {}",
        r.text()
    );
    for host in [
        format!("evil.example:{port}"),
        "evil.example".to_owned(),
        format!("127.0.0.1:{}", port.wrapping_add(1)),
        format!("127.0.0.2:{port}"),
    ] {
        let r = http.call(&list(None).set("Host", &host));
        assert_eq!(r.status, 403, "Host {host:?}: {}", r.text());
    }
    // Refusals of the head itself may close the connection: a fresh one for each.
    let mut http = gw.http();
    let r = http.call(&list(None).without("Host"));
    assert!(matches!(r.status, 400 | 403), "no Host: {}", r.status);
    let mut http = gw.http();
    let r = http.call(&list(None).header("Host", "evil.example"));
    assert!(matches!(r.status, 400 | 403), "two Hosts: {}", r.status);
    assert!(gw.tool_calls().is_empty());
}

#[test]
fn without_public_url_every_origin_is_refused() {
    let gw = HttpGateway::start("", "");
    let token = gw.client_token("alice");
    let port = gw.port;
    let mut http = gw.http();
    let req = || modern(port, 1, "tools/list", json!({}), None).bearer(&token);
    assert_eq!(http.call(&req()).status, 200);
    for origin in [
        format!("http://127.0.0.1:{port}"),
        "http://localhost".into(),
    ] {
        let r = http.call(&req().header("Origin", &origin));
        assert_eq!(r.status, 403, "{origin}: {}", r.text());
    }
    let r = http.call(&req().set("Host", &format!("evil.example:{port}")));
    assert_eq!(r.status, 403, "{}", r.text());
}

#[test]
fn health_needs_no_token_and_metrics_need_an_admin_token() {
    let gw = HttpGateway::start("", "");
    let client = gw.client_token("alice");
    let admin = gw.token("ops", "admin", "30d");
    let mut http = gw.http();

    let r = http.call(&Req::new("GET", "/health", gw.port));
    assert_eq!(r.status, 200, "{}", r.text());
    let health = r.json();
    assert_eq!(health["mcp_enabled"], true);
    assert_eq!(health["status"], "ok");
    for key in ["version", "workers", "sandbox", "ledger"] {
        assert!(!health[key].is_null(), "{key} in {health}");
    }

    // Some traffic for the counters.
    let session = open_session(&mut http, gw.port, Some(&client));
    let r = http.call(&echo_in_session(gw.port, 2, &session, "count me").bearer(&client));
    assert_eq!(r.status, 200);

    let metrics = |auth: Option<&str>| {
        let mut req = Req::new("GET", "/metrics", gw.port);
        if let Some(t) = auth {
            req = req.bearer(t);
        }
        req
    };
    for (what, auth) in [("none", None), ("client", Some(client.as_str()))] {
        // A refused token ends its connection: a fresh one for each.
        let r = gw.http().call(&metrics(auth));
        assert!(
            matches!(r.status, 401 | 403),
            "{what} token on /metrics: {}",
            r.status
        );
    }
    let r = http.call(&metrics(Some(&admin)));
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.header("Content-Type")
            .is_some_and(|v| v.starts_with("text/plain")),
        "{:?}",
        r.headers
    );
    let text = r.text();
    for name in [
        "toolwall_requests_total",
        "toolwall_policy_decisions_total",
        "toolwall_tool_call_duration_seconds_bucket",
        "toolwall_requests_in_flight",
        "toolwall_connections",
        "toolwall_worker_restarts_total",
        "toolwall_ledger_commit_duration_seconds",
        "toolwall_ledger_commit_failures_total",
    ] {
        assert!(text.contains(name), "{name} in:\n{text}");
    }
    assert!(
        text.lines()
            .any(|l| l.starts_with("toolwall_requests_total{") && l.contains("tools/call")),
        "the call was counted:\n{text}"
    );
    assert!(
        text.lines().any(
            |l| l.starts_with("toolwall_tool_call_duration_seconds_count") && !l.ends_with(" 0")
        ),
        "{text}"
    );
    // Every sample line is `name{labels} value` or `name value`.
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let value = line.rsplit(' ').next().unwrap();
        assert!(value.parse::<f64>().is_ok(), "bad sample line {line:?}");
        assert!(line.starts_with("toolwall_"), "{line}");
    }
}

#[test]
fn metrics_public_serves_metrics_without_a_token() {
    let gw = HttpGateway::start("metrics_public = true", "");
    let mut http = gw.http();
    let r = http.call(&Req::new("GET", "/metrics", gw.port));
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("toolwall_requests_total"));
    // /mcp still needs a token.
    assert_eq!(http.call(&gw.post(&initialize(1))).status, 401);
}

/// The door counts its responses by status (`toolwall_http_responses_total`).
#[test]
fn metrics_count_http_responses_by_status() {
    let gw = HttpGateway::start("metrics_public = true", "");
    let mut http = gw.http();
    assert_eq!(http.call(&Req::new("GET", "/health", gw.port)).status, 200);
    assert_eq!(http.call(&Req::new("GET", "/nowhere", gw.port)).status, 404);
    assert_eq!(http.call(&gw.post(&initialize(1))).status, 401);
    // A 401 ends the connection.
    let mut http = gw.http();
    let text = http.call(&Req::new("GET", "/metrics", gw.port)).text();
    for status in ["200", "404", "401"] {
        assert!(
            text.contains(&format!(
                "toolwall_http_responses_total{{status=\"{status}\"}}"
            )),
            "status {status} counted:\n{text}"
        );
    }
}

#[test]
fn other_refusals_411_417_431_505_and_503() {
    let gw = HttpGateway::start(
        "",
        "[http]\nmax_headers = 8\nmax_head_bytes = 2048\nmax_connections = 4\nmax_sessions = 3\n",
    );
    let token = gw.client_token("alice");
    let port = gw.port;
    let status_of = |raw: &[u8]| {
        let mut http = gw.http();
        http.send_raw(raw);
        http.response().map(|r| r.status)
    };
    let post = gw.post(&initialize(1)).bearer(&token);

    // 411: a chunked body; 501: another transfer coding; 400: Transfer-Encoding together
    // with Content-Length.
    let head_without_length = {
        let bytes = post.clone().bytes();
        let head_end = bytes.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        String::from_utf8(bytes[..head_end].to_vec())
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with("Content-Length"))
            .collect::<Vec<_>>()
            .join("\r\n")
    };
    let chunked = format!(
        "{head_without_length}\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{{}}\r\n0\r\n\r\n"
    );
    assert_eq!(status_of(chunked.as_bytes()), Some(411));
    let gzip = format!("{head_without_length}\r\nTransfer-Encoding: gzip\r\n\r\n");
    assert_eq!(status_of(gzip.as_bytes()), Some(501));
    let both = post.clone().header("Transfer-Encoding", "chunked").bytes();
    assert_eq!(status_of(&both), Some(400));
    // 417: an Expect we do not know; 100 Continue for the one we do.
    assert_eq!(
        status_of(&post.clone().header("Expect", "teapot").bytes()),
        Some(417)
    );
    let mut http = gw.http();
    let bytes = post.clone().header("Expect", "100-continue").bytes();
    let head_end = bytes.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    http.send_raw(&bytes[..head_end]);
    assert_eq!(http.response().map(|r| r.status), Some(100));
    http.send_raw(&bytes[head_end..]);
    assert_eq!(http.response().map(|r| r.status), Some(200));
    drop(http);
    // 431: too many headers, or too long a head.
    let mut many = post.clone();
    for i in 0..10 {
        many = many.header(&format!("X-Pad-{i}"), "x");
    }
    assert_eq!(status_of(&many.bytes()), Some(431));
    let long = post.clone().header("X-Pad", &"y".repeat(4096));
    assert_eq!(status_of(&long.bytes()), Some(431));
    // 505: HTTP/2 in an HTTP/1 request line.
    let mut h2 = post.clone().bytes();
    h2.splice(
        ..b"POST /mcp HTTP/1.1".len(),
        b"POST /mcp HTTP/2.0".iter().copied(),
    );
    assert_eq!(status_of(&h2), Some(505));
    // 400: garbage.
    assert_eq!(status_of(b"\x00\x01\x02 nonsense\r\n\r\n"), Some(400));

    // 503: more sessions than max_sessions (the 100-continue initialize opened one).
    let mut http = gw.http();
    let first = open_session(&mut http, port, Some(&token));
    let _second = open_session(&mut http, port, Some(&token));
    let r = http.call(&post);
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(
        http.call(
            &Req::new("DELETE", "/mcp", port)
                .bearer(&token)
                .session(&first)
        )
        .status,
        204
    );
    assert_eq!(http.call(&post).status, 200, "room again after DELETE");
    drop(http);

    // 503 with Retry-After beyond max_connections, while /health is still answered.
    // Connections with an accepted head whose body is still arriving hold their seats
    // (connections that said nothing, whose head is still trickling in, or that sit idle
    // between requests would make room); one principal may hold half the door, so
    // four principals take its four seats as the connections above free theirs.
    let busy_probe = gw.post(&rpc(9, "tools/list", json!({}))).bearer(&token);
    let mut held = Vec::new();
    for who in ["p1", "p2", "p3", "p4"] {
        let t = gw.client_token(who);
        eventually("a body-in-progress connection held", || {
            let mut h = gw.http();
            let head = gw
                .post(&json!({}))
                .bearer(&t)
                .set("Content-Length", "100")
                .body(Vec::new())
                .bytes();
            let head = String::from_utf8(head)
                .unwrap()
                .replace("Content-Length: 0\r\n", "");
            h.send_raw(head.as_bytes());
            h.stream
                .set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            // Refused: a 503 comes back at once; held: nothing comes.
            let refused = h.response().is_some();
            h.stream.set_read_timeout(Some(PATIENCE)).unwrap();
            if !refused {
                held.push(h);
            }
            !refused
        });
    }
    let mut extra = gw.http();
    let r = extra.call(&busy_probe);
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.header("Retry-After").is_some(), "{:?}", r.headers);
    assert!(extra.closed_by_peer(), "a refused connection closes");
    let mut extra = gw.http();
    assert_eq!(
        extra.call(&Req::new("GET", "/health", port)).status,
        200,
        "/health is answered on a full door"
    );
    drop(held);
    eventually("a connection seat to free up", || {
        let mut h = gw.http();
        h.send(&busy_probe);
        h.response().is_some_and(|r| r.status == 400)
    });
}

/// `[http]` limits the loop itself applies (connections, timers) follow a reload like the
/// ones the endpoint applies.
#[test]
fn http_limits_follow_a_reload() {
    let gw = HttpGateway::start("", "[http]\nmax_connections = 1\n");
    let port = gw.port;
    let token = gw.client_token("alice");
    let health = || Req::new("GET", "/health", port);
    // A connection whose accepted head waits for its body holds the one seat.
    let mut first = gw.http();
    let head = gw
        .post(&json!({}))
        .bearer(&token)
        .set("Content-Length", "100")
        .body(Vec::new())
        .bytes();
    let head = String::from_utf8(head)
        .unwrap()
        .replace("Content-Length: 0\r\n", "");
    first.send_raw(head.as_bytes());
    std::thread::sleep(Duration::from_millis(100));
    let mut second = gw.http();
    let r = second.call(&gw.post(&initialize(1)).bearer(&token));
    assert_eq!(r.status, 503, "max_connections = 1 holds: {}", r.text());

    let config = std::fs::read_to_string(&gw.config_path).unwrap();
    std::fs::write(
        &gw.config_path,
        config.replace("max_connections = 1", "max_connections = 4"),
    )
    .unwrap();
    unsafe {
        libc::kill(gw.pid() as i32, libc::SIGHUP);
    }
    gw.wait_for_log("http door settings and certificate reloaded");
    let mut held = vec![first];
    for _ in 0..3 {
        let mut h = gw.http();
        let r = h.call(&health());
        assert_eq!(
            r.status,
            200,
            "max_connections = 4 after the reload: {}",
            r.text()
        );
        held.push(h);
    }
}

#[test]
fn idle_keep_alive_connections_are_closed() {
    let gw = HttpGateway::start("", "[http]\nkeepalive_idle_secs = 1\n");
    let mut http = gw.http();
    assert_eq!(http.call(&Req::new("GET", "/health", gw.port)).status, 200);
    assert!(http.closed_by_peer(), "an idle connection is closed");
}

#[test]
fn keep_alive_and_pipelined_requests_are_answered_in_order() {
    let gw = HttpGateway::start("", "");
    let token = gw.client_token("alice");
    let mut http = gw.http();
    let session = open_session(&mut http, gw.port, Some(&token));

    // Several requests, one at a time, on the one connection.
    for i in 0..5 {
        let r = http
            .call(&echo_in_session(gw.port, 10 + i, &session, &format!("ka {i}")).bearer(&token));
        assert_eq!(r.status, 200);
        assert_eq!(r.header("Connection"), Some("keep-alive"));
        assert_eq!(result_text(&r.json()), format!("ka {i}"));
    }

    // Pipelined: many requests in one write, of different kinds; answers come in order.
    let mut burst = Vec::new();
    let mut expected = Vec::new();
    for i in 0..12u64 {
        let req = match i % 4 {
            0 => echo_in_session(gw.port, 100 + i, &session, &format!("pipe {i}")),
            1 => gw
                .post(&rpc(100 + i, "tools/list", json!({})))
                .session(&session),
            2 => gw
                .post(&json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}))
                .session(&session),
            _ => Req::new("GET", "/health", gw.port),
        };
        burst.extend_from_slice(&req.bearer(&token).bytes());
        expected.push(i);
    }
    http.send_raw(&burst);
    for i in expected {
        let r = http.response().unwrap_or_else(|| panic!("answer {i}"));
        match i % 4 {
            0 => {
                assert_eq!(r.json()["id"], 100 + i);
                assert_eq!(result_text(&r.json()), format!("pipe {i}"));
            }
            1 => {
                assert_eq!(r.json()["id"], 100 + i);
                assert!(r.json()["result"]["tools"].is_array());
            }
            2 => assert_eq!(r.status, 202),
            _ => assert_eq!(r.json()["mcp_enabled"], true),
        }
    }

    // Connection: close is honoured after the answer.
    let r = http.call(
        &echo_in_session(gw.port, 200, &session, "bye")
            .bearer(&token)
            .header("Connection", "close"),
    );
    assert_eq!(r.status, 200);
    assert!(http.closed_by_peer(), "closed after Connection: close");
    assert_eq!(gw.tool_calls().len(), 9);
}

#[test]
fn concurrent_clients_each_get_their_own_answers() {
    let gw = HttpGateway::start("", "");
    let token = Arc::new(gw.client_token("alice"));
    let port = gw.port;
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let token = Arc::clone(&token);
            std::thread::spawn(move || {
                let mut http = common::http::Http::connect(port);
                let modern_client = t % 2 == 0;
                let session = (!modern_client).then(|| open_session(&mut http, port, Some(&token)));
                for i in 0..6u64 {
                    let text = format!("thread {t} call {i}");
                    let req = match &session {
                        Some(s) => echo_in_session(port, i + 1, s, &text),
                        None => modern(
                            port,
                            i + 1,
                            "tools/call",
                            json!({"name": "local__echo", "arguments": {"text": text}}),
                            Some("local__echo"),
                        ),
                    };
                    let r = http.call(&req.bearer(&token));
                    assert_eq!(r.status, 200, "{}", r.text());
                    assert_eq!(r.json()["id"], i + 1);
                    assert_eq!(result_text(&r.json()), text);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("client thread");
    }
    let rows = gw.wait_rows("48 calls", |rows| rows.len() == 48);
    assert!(
        rows.iter()
            .all(|r| r["principal"] == "alice" && r["decision"] == "allowed")
    );
}

/// The server answered 408 and closed, or closed at once; a client left waiting fails.
fn cut_off(slow: &mut common::http::Http<TcpStream>) {
    if let Some(r) = slow.response() {
        assert_eq!(r.status, 408, "{}", r.text());
    }
    assert!(slow.closed_by_peer(), "the slow connection was not closed");
}

#[test]
fn slow_clients_are_cut_off_and_oversized_bodies_get_413() {
    let gw = HttpGateway::start(
        "",
        "[http]\nrequest_timeout_secs = 1\nmax_body_bytes = 4096\n",
    );
    let token = gw.client_token("alice");

    // Half a request, then silence: 408 or a closed connection.
    let mut slow = gw.http();
    let whole = gw.post(&initialize(1)).bearer(&token).bytes();
    slow.send_raw(&whole[..whole.len() / 2]);
    // A 408, or closed without a word; either way the connection ends (a read that only
    // timed out is neither, and fails here).
    cut_off(&mut slow);
    // Half a head (no blank line yet) too.
    let mut slow = gw.http();
    slow.send_raw(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    cut_off(&mut slow);

    // A body larger than max_body_bytes: 413 from the Content-Length alone.
    let mut big = gw.http();
    let huge = format!("{{\"pad\": \"{}\"}}", "x".repeat(5000));
    let req = gw.post(&json!(null)).bearer(&token).body(huge.into_bytes());
    let bytes = req.bytes();
    let head_end = bytes.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    big.send_raw(&bytes[..head_end]);
    let r = big.response().expect("413 before the body is sent");
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(big.closed_by_peer(), "the connection closes after 413");

    // And with the body sent anyway.
    let mut big = gw.http();
    let _ = big.stream.write_all(&bytes);
    let r = big.response().expect("413");
    assert_eq!(r.status, 413);

    // Default limit (1 MiB + 4 KiB) on another gateway's door is also enforced (for a
    // client with a valid token: without one it is 401 whatever the size).
    let gw2 = HttpGateway::start("", "");
    let token2 = gw2.client_token("bob");
    let mut big = gw2.http();
    big.send_raw(
        format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nAuthorization: Bearer {token2}\r\n\
             Content-Length: {}\r\n\r\n",
            gw2.port,
            1024 * 1024 + 4096 + 1
        )
        .as_bytes(),
    );
    assert_eq!(big.response().expect("413").status, 413);

    // The door still serves everyone else.
    let mut ok = gw.http();
    let session = open_session(&mut ok, gw.port, Some(&token));
    let r = ok.call(&echo_in_session(gw.port, 2, &session, "fine").bearer(&token));
    assert_eq!(result_text(&r.json()), "fine");
}

/// Identity is judged before size: a request with a missing or bad token is 401 whatever
/// its Content-Length says (an unauthenticated client learns no limit, and its body is never
/// read), a good token with a body over `max_body_bytes` is still 413, and `/health` keeps
/// answering without a token (413 for a body over the limit, as before).
#[test]
fn a_bad_token_is_refused_before_the_body_size_is_judged() {
    let gw = HttpGateway::start("", "[http]\nmax_body_bytes = 4096\n");
    let token = gw.client_token("alice");
    let head = |auth: &str, path: &str, method: &str, length: usize| {
        format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\n{auth}Content-Length: {length}\r\n\r\n",
            gw.port
        )
    };
    for (what, auth) in [
        ("no token", String::new()),
        (
            "a bad token",
            "Authorization: Bearer tw_not-a-real-token\r\n".to_owned(),
        ),
        (
            "a malformed header",
            "Authorization: Basic YTpi\r\n".to_owned(),
        ),
    ] {
        for length in [4097, 1 << 30] {
            let mut c = gw.http();
            c.send_raw(head(&auth, "/mcp", "POST", length).as_bytes());
            let r = c.response().expect("an answer to the head alone");
            assert_eq!(
                r.status,
                401,
                "{what}, Content-Length {length}: {}",
                r.text()
            );
            assert!(
                c.closed_by_peer(),
                "{what}: the connection closes after 401"
            );
        }
        // The body sent anyway changes nothing.
        let mut c = gw.http();
        let mut bytes = head(&auth, "/mcp", "POST", 5000).into_bytes();
        bytes.extend(std::iter::repeat_n(b'x', 5000));
        let _ = c.stream.write_all(&bytes);
        assert_eq!(c.response().expect("401").status, 401, "{what}");
    }
    // A good token: the size is judged, 413 as before, and the connection closes.
    let mut c = gw.http();
    c.send_raw(
        head(
            &format!("Authorization: Bearer {token}\r\n"),
            "/mcp",
            "POST",
            4097,
        )
        .as_bytes(),
    );
    let r = c.response().expect("413");
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(c.closed_by_peer());
    // /health needs no token: answered, and over the limit 413 as before.
    let mut c = gw.http();
    c.send_raw(head("", "/health", "GET", 4097).as_bytes());
    assert_eq!(c.response().expect("413").status, 413);
    let r = gw.http().call(&Req::new("GET", "/health", gw.port));
    assert_eq!(r.status, 200, "{}", r.text());
    // The door serves its clients all along.
    let mut ok = gw.http();
    let session = open_session(&mut ok, gw.port, Some(&token));
    let r = ok.call(&echo_in_session(gw.port, 2, &session, "fine").bearer(&token));
    assert_eq!(result_text(&r.json()), "fine");
}

fn tls_client_config(
    cert_der: rustls::pki_types::CertificateDer<'static>,
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert_der).expect("add the test root");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

#[test]
fn tls_carries_a_whole_mcp_exchange() {
    let dir = tempfile::tempdir().unwrap();
    let root = write_test_certificate(dir.path());
    let listen = format!(
        "tls_cert = \"{d}/cert.pem\"\ntls_key = \"{d}/key.pem\"\n\
         public_url = \"https://localhost:{{port}}/mcp\"\n",
        d = dir.path().display()
    );
    let gw = HttpGateway::start_in(dir, &listen, "");
    assert!(gw.log().contains("https://"), "{}", gw.log());
    let token = gw.client_token("alice");
    let port = gw.port;

    let config = tls_client_config(root);
    let connect = || {
        let tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
        tcp.set_read_timeout(Some(PATIENCE)).unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let conn = rustls::ClientConnection::new(Arc::clone(&config), name).unwrap();
        common::http::Http::over(rustls::StreamOwned::new(conn, tcp))
    };
    let mut https = connect();
    let host = format!("localhost:{port}");
    let origin = format!("https://localhost:{port}");

    // Legacy era, start to end, on one TLS connection.
    let init = https.call(&gw.post(&initialize(1)).bearer(&token).set("Host", &host));
    assert_eq!(init.status, 200, "{}", init.text());
    assert_eq!(
        https.stream.conn.alpn_protocol(),
        Some(&b"http/1.1"[..]),
        "ALPN"
    );
    let session = init.header("Mcp-Session-Id").unwrap().to_owned();
    let r = https.call(
        &gw.post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .bearer(&token)
            .session(&session)
            .set("Host", &host),
    );
    assert_eq!(r.status, 202);
    let r = https.call(
        &gw.post(&rpc(2, "tools/list", json!({})))
            .bearer(&token)
            .session(&session)
            .set("Host", &host)
            .header("Origin", &origin),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json()["result"]["tools"].is_array());
    let r = https.call(
        &echo_in_session(port, 3, &session, "over tls")
            .bearer(&token)
            .set("Host", &host),
    );
    assert_eq!(result_text(&r.json()), "over tls");
    let r = https.call(
        &Req::new("DELETE", "/mcp", port)
            .bearer(&token)
            .session(&session)
            .set("Host", &host),
    );
    assert_eq!(r.status, 204);

    // An Origin with the wrong scheme is refused over TLS too.
    let r = https.call(
        &modern(port, 4, "tools/list", json!({}), None)
            .bearer(&token)
            .set("Host", &host)
            .header("Origin", &format!("http://localhost:{port}")),
    );
    assert_eq!(r.status, 403);

    // Modern era on a second connection, pipelined through TLS.
    let mut https = connect();
    let mut burst = Vec::new();
    for i in 0..3u64 {
        let req = modern(
            port,
            10 + i,
            "tools/call",
            json!({"name": "local__echo", "arguments": {"text": format!("tls {i}")}}),
            Some("local__echo"),
        )
        .bearer(&token)
        .set("Host", &host);
        burst.extend_from_slice(&req.bytes());
    }
    https.send_raw(&burst);
    for i in 0..3u64 {
        let r = https.response().expect("answer");
        assert_eq!(r.json()["id"], 10 + i);
        assert_eq!(result_text(&r.json()), format!("tls {i}"));
    }

    // Plain HTTP on the TLS port gets no HTTP answer.
    let mut plain = TcpStream::connect(("127.0.0.1", port)).unwrap();
    plain.set_read_timeout(Some(PATIENCE)).unwrap();
    plain
        .write_all(&Req::new("GET", "/health", port).bytes())
        .unwrap();
    let mut reply = Vec::new();
    let _ = plain.read_to_end(&mut reply);
    assert!(
        !reply.starts_with(b"HTTP/"),
        "{:?}",
        String::from_utf8_lossy(&reply)
    );

    let rows = gw.wait_rows("4 calls", |rows| rows.len() == 4);
    assert!(
        rows.iter()
            .all(|r| r["transport"] == "http" && r["principal"] == "alice")
    );
}

/// Write a fresh self-signed certificate for `localhost` to cert.pem and key.pem in `dir`.
fn write_test_certificate(dir: &std::path::Path) -> rustls::pki_types::CertificateDer<'static> {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])
        .expect("generate a test certificate");
    let key_path = dir.join("key.pem");
    std::fs::write(dir.join("cert.pem"), certified.cert.pem()).unwrap();
    std::fs::write(&key_path, certified.signing_key.serialize_pem()).unwrap();
    std::fs::set_permissions(
        &key_path,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    certified.cert.der().clone()
}

#[test]
fn tls_certificate_is_reloaded_on_sighup_and_a_bad_one_is_not_taken() {
    let dir = tempfile::tempdir().unwrap();
    let first = write_test_certificate(dir.path());
    let listen = format!(
        "tls_cert = \"{d}/cert.pem\"\ntls_key = \"{d}/key.pem\"\n",
        d = dir.path().display()
    );
    let gw = HttpGateway::start_in(dir, &listen, "");
    let port = gw.port;
    let connect = |root: &rustls::pki_types::CertificateDer<'static>| {
        let tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
        tcp.set_read_timeout(Some(PATIENCE)).unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let conn = rustls::ClientConnection::new(tls_client_config(root.clone()), name).unwrap();
        common::http::Http::over(rustls::StreamOwned::new(conn, tcp))
    };
    let health = || Req::new("GET", "/health", port).set("Host", &format!("localhost:{port}"));
    let mut old = connect(&first);
    assert_eq!(old.call(&health()).status, 200);

    let second = write_test_certificate(gw.dir.path());
    unsafe {
        libc::kill(gw.pid() as i32, libc::SIGHUP);
    }
    gw.wait_for_log("certificate reloaded");
    let mut new = connect(&second);
    assert_eq!(
        new.call(&health()).status,
        200,
        "new connections get the new certificate"
    );
    let mut stale = connect(&first);
    let refused = stale.stream.write_all(&health().bytes()).is_err() || stale.response().is_none();
    assert!(refused, "the old certificate is no longer served");
    assert_eq!(
        old.call(&health()).status,
        200,
        "open connections keep theirs"
    );

    // A broken pair is refused and the last good one stays.
    std::fs::write(gw.dir.path().join("cert.pem"), "not a certificate").unwrap();
    unsafe {
        libc::kill(gw.pid() as i32, libc::SIGHUP);
    }
    gw.wait_for_log("http door kept its previous settings");
    let mut again = connect(&second);
    assert_eq!(again.call(&health()).status, 200);
}

#[test]
fn policy_applies_over_http_like_any_door() {
    let gw = HttpGateway::start(
        "",
        r#"
[[policy.rules]]
id = "no-echo-over-http"
action = "block"
tool = "local__echo"
transport = "http"
reason = "echo is for local agents"

[[policy.rules]]
id = "no-bob"
action = "block"
principal = "bob"
reason = "bob is suspended"
"#,
    );
    let alice = gw.client_token("alice");
    let bob = gw.client_token("bob");
    let mut http = gw.http();
    let session = open_session(&mut http, gw.port, Some(&alice));

    let r = http.call(&echo_in_session(gw.port, 2, &session, "blocked?").bearer(&alice));
    assert_eq!(r.status, 200, "a refusal is a tool result: {}", r.text());
    let body = r.json();
    assert_eq!(body["result"]["isError"], true, "{body}");
    assert_eq!(
        body["result"]["structuredContent"]["error"]["code"],
        "policy_blocked"
    );
    assert_eq!(
        body["result"]["structuredContent"]["error"]["rule"],
        "no-echo-over-http"
    );

    // Modern era: the same rule.
    let r = http.call(
        &modern(
            gw.port,
            3,
            "tools/call",
            json!({"name": "local__echo", "arguments": {"text": "modern"}}),
            Some("local__echo"),
        )
        .bearer(&alice),
    );
    assert_eq!(
        r.json()["result"]["structuredContent"]["error"]["code"],
        "policy_blocked"
    );
    assert_eq!(r.json()["result"]["resultType"], "complete");

    // The token's principal is what principal rules see.
    let r = http.call(
        &modern(
            gw.port,
            4,
            "tools/call",
            json!({"name": "local__http_headers", "arguments": {"url": "http://127.0.0.1:9/"}}),
            Some("local__http_headers"),
        )
        .bearer(&bob),
    );
    assert_eq!(
        r.json()["result"]["structuredContent"]["error"]["rule"],
        "no-bob",
        "{}",
        r.text()
    );

    // The unix door is not matched by the http rule.
    let mut framed = gw.connect();
    framed.call(
        "initialize",
        json!({"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
    );
    let r = framed.tool("local__echo", json!({"text": "unix is fine"}));
    assert_eq!(r["result"]["content"][0]["text"], "unix is fine", "{r}");

    let rows = gw.wait_rows("4 rows", |rows| rows.len() == 4);
    let http_rows: Vec<&Value> = rows.iter().filter(|r| r["transport"] == "http").collect();
    assert_eq!(http_rows.len(), 3);
    for row in &http_rows {
        assert_eq!(row["decision"], "denied", "{row}");
    }
    assert_eq!(http_rows[0]["policy_rule"], "no-echo-over-http");
    assert_eq!(http_rows[0]["principal"], "alice");
    assert_eq!(http_rows[2]["policy_rule"], "no-bob");
    assert_eq!(http_rows[2]["principal"], "bob");
    let unix_row = rows.iter().find(|r| r["transport"] != "http").unwrap();
    assert_eq!(unix_row["decision"], "allowed");
}

/// While the gateway drains after SIGTERM it cannot take calls: `/health` says 503 on a
/// connection that was already open.
#[test]
fn health_is_503_while_draining() {
    // A silent upstream keeps one call in flight, so the drain lasts.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = silent.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in silent.incoming().flatten() {
            held.push(s);
        }
    });
    let gw = HttpGateway::start(
        "http_auth = \"none\"\n",
        &format!(
            "[gateway]\ndrain_secs = 5\n\n[builtin.http]\nallow = [\"127.0.0.1:{upstream}\"]\n"
        ),
    );
    let mut health = gw.http();
    let ok = health.call(&Req::new("GET", "/health", gw.port));
    assert_eq!(ok.status, 200);
    let mut busy = gw.http();
    let session = open_session(&mut busy, gw.port, None);
    let call = Req::post_mcp(gw.port, &rpc(7, "tools/call", serde_json::json!({"name": "local__fetch_http", "arguments": {"url": format!("http://127.0.0.1:{upstream}/")}})))
        .session(&session)
        .header("MCP-Protocol-Version", "2025-11-25");
    busy.send(&call);
    std::thread::sleep(std::time::Duration::from_millis(300));
    unsafe { libc::kill(gw.pid() as i32, libc::SIGTERM) };
    std::thread::sleep(std::time::Duration::from_millis(300));
    let draining = health.call(&Req::new("GET", "/health", gw.port));
    assert_eq!(draining.status, 503, "{}", draining.text());
    assert_eq!(draining.json()["mcp_enabled"], true);
}

/// A modern `tools/call` that names its tool twice (`params.name` repeated) is refused,
/// whatever `Mcp-Name` says or whether it is sent: the header check and the pipeline read
/// one body, never two readings of it. Nothing runs and no row is written.
#[test]
fn a_repeated_params_name_is_refused_before_any_check_or_call() {
    let gw = HttpGateway::start("", "");
    let token = gw.client_token("alice");
    let mut http = gw.http();
    let body = |id: u64| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"local__nothing","arguments":{{"text":"twice"}},"name":"local__echo","_meta":{{"io.modelcontextprotocol/protocolVersion":"{MODERN}","io.modelcontextprotocol/clientCapabilities":{{}}}}}}}}"#
        )
        .into_bytes()
    };
    for (id, name, version) in [
        (1, None, true),
        (2, Some("local__echo"), true),
        (3, Some("local__nothing"), true),
        (4, None, false),
    ] {
        let mut req = Req::post_mcp(gw.port, &json!({}))
            .body(body(id))
            .bearer(&token)
            .header("Mcp-Method", "tools/call");
        if version {
            req = req.header("MCP-Protocol-Version", MODERN);
        }
        if let Some(n) = name {
            req = req.header("Mcp-Name", n);
        }
        let r = http.call(&req);
        assert_eq!(r.status, 400, "{id}: {}", r.text());
        assert_eq!(r.error_code(), Some(-32602), "{id}: {}", r.text());
        assert!(r.text().contains("repeats a key"), "{id}: {}", r.text());
    }
    // The same call said once is served: the refusal was the repeat.
    let r = http.call(
        &modern(
            gw.port,
            5,
            "tools/call",
            json!({"name": "local__echo", "arguments": {"text": "once"}}),
            Some("local__echo"),
        )
        .bearer(&token),
    );
    assert_eq!(result_text(&r.json()), "once", "{}", r.text());
    let rows = gw.tool_calls();
    assert_eq!(rows.len(), 1, "{rows:?}");
}
