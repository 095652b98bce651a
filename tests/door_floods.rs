//! Doors that stay open: silent, slow, half-sent and unauthenticated floods against the real
//! binary, on the HTTP door and the framed unix socket. Each test checks that a normal client
//! is still served, that the hostile connections end within their deadlines, and that the
//! operator's way in (admin socket, `/health`) answers; it prints what the flood cost (the
//! gateway's resident memory) and how long the normal client waited (reported, never
//! asserted: the machine is shared).

mod common;

use common::flood::{self, Ended, ReadWrite, Trickle, rss, until_served, wait_all_end};
use common::http::{HttpGateway, Req, echo_in_session, initialize, open_session, result_text};
use common::{FramedClient, PATIENCE};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// A normal HTTP client: a legacy session and one echo. None when the door refused it
/// (503, or closed before answering); a wrong answer fails the test.
fn http_client_served(port: u16, token: &str) -> Option<()> {
    let stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut http = common::http::Http::over(stream);
    http.stream
        .write_all(&Req::post_mcp(port, &initialize(1)).bearer(token).bytes())
        .ok()?;
    let init = http.response()?;
    if init.status == 503 {
        return None;
    }
    assert_eq!(init.status, 200, "initialize: {}", init.text());
    let session = init.header("Mcp-Session-Id").expect("session").to_owned();
    let r = http.call(&echo_in_session(port, 2, &session, "still served").bearer(token));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(result_text(&r.json()), "still served");
    Some(())
}

/// A normal framed agent: one echo. None when refused (an error frame, a close, a reset).
fn framed_client_served(path: &std::path::Path) -> Option<()> {
    let mut c = FramedClient::connect(path);
    let msg = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                     "params": {"name": "local__echo", "arguments": {"text": "agent served"}}});
    let mut frame = Vec::new();
    toolwall_relay::frame::encode(&mut frame, 1, 0, "agent", msg.to_string().as_bytes()).unwrap();
    c.stream.write_all(&frame).ok()?;
    loop {
        let reply = c.recv()?;
        if reply.stream == 1 {
            assert_eq!(
                reply.body["result"]["content"][0]["text"], "agent served",
                "{}",
                reply.body
            );
            return Some(());
        }
        // A refusal names the limit; the connection then closes.
        if reply.body["error"].is_object() {
            return None;
        }
    }
}

fn health(port: u16) -> Option<u16> {
    let stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut http = common::http::Http::over(stream);
    http.stream
        .write_all(&Req::new("GET", "/health", port).bytes())
        .ok()?;
    http.response().map(|r| r.status)
}

fn boxed<S: ReadWrite + 'static>(v: Vec<S>) -> Vec<Box<dyn ReadWrite>> {
    v.into_iter()
        .map(|s| Box::new(s) as Box<dyn ReadWrite>)
        .collect()
}

/// `/metrics` with an admin token.
fn metrics(gw: &HttpGateway, admin_token: &str) -> String {
    let mut http = gw.http();
    let r = http.call(&Req::new("GET", "/metrics", gw.port).bearer(admin_token));
    assert_eq!(r.status, 200, "{}", r.text());
    r.text()
}

fn metric(text: &str, prefix: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[test]
fn silent_http_connections_never_hold_the_door() {
    let gw = HttpGateway::start("", "[http]\nmax_connections = 8\n");
    let token = gw.client_token("alice");
    let admin = gw.token("ops", "admin", "never");
    let before = rss(gw.pid());
    // More silent connections than the door has slots.
    let silent = flood::silent_tcp(gw.port, 40);
    std::thread::sleep(Duration::from_millis(300));
    let ((), served_in) = until_served("a normal HTTP client under a silent flood", || {
        http_client_served(gw.port, &token)
    });
    assert_eq!(health(gw.port), Some(200));
    let during = rss(gw.pid());
    flood::report(
        "http silent x40 (max_connections 8)",
        before,
        during,
        Some(served_in),
    );
    // Every silent connection ends: beyond the limit with a 503, else closed at the accept
    // deadline (http.accept_timeout_secs).
    let ends = wait_all_end(silent);
    let open = ends.iter().filter(|e| **e == Ended::Open).count();
    assert_eq!(open, 0, "silent connections still open after {PATIENCE:?}");
    for e in &ends {
        assert!(
            e.status().is_none_or(|s| s == 503),
            "a silent connection got {:?}",
            String::from_utf8_lossy(e.said())
        );
    }
    let m = metrics(&gw, &admin);
    assert!(
        metric(
            &m,
            "toolwall_connections_closed_total{door=\"http\",reason=\"accept_timeout\"}"
        ) + metric(&m, "toolwall_connections_refused_total{door=\"http\"")
            >= 32,
        "closes and refusals are counted:\n{m}"
    );
}

#[test]
fn slow_heads_are_cut_off_and_never_hold_the_door() {
    let gw = HttpGateway::start("", "[http]\nmax_connections = 8\n");
    let token = gw.client_token("alice");
    let before = rss(gw.pid());
    let slow = boxed(flood::silent_tcp(gw.port, 8));
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nX-Slow: ",
        gw.port
    );
    let trickle = Trickle::start(
        slow,
        head.into_bytes(),
        b"abcdefgh".to_vec(),
        Duration::from_millis(200),
    );
    std::thread::sleep(Duration::from_millis(500));
    let ((), served_in) = until_served("a normal HTTP client under a slow-head flood", || {
        http_client_served(gw.port, &token)
    });
    let during = rss(gw.pid());
    flood::report(
        "http slow-head x8 (max_connections 8)",
        before,
        during,
        Some(served_in),
    );
    let ends = wait_all_end(trickle.stop());
    for e in &ends {
        assert_ne!(*e, Ended::Open, "a slow head was never cut off");
        assert!(
            e.status().is_none_or(|s| s == 408 || s == 503),
            "{:?}",
            String::from_utf8_lossy(e.said())
        );
    }
}

#[test]
fn slow_bodies_of_one_principal_leave_room_for_others() {
    // One principal may hold half the door's connections by default.
    let gw = HttpGateway::start(
        "",
        "[http]\nmax_connections = 8\nrequest_timeout_secs = 3\n",
    );
    let flooder = gw.client_token("flooder");
    let alice = gw.client_token("alice");
    let before = rss(gw.pid());
    let head = Req::post_mcp(gw.port, &json!({}))
        .bearer(&flooder)
        .set("Content-Length", "4000")
        .body(Vec::new());
    let mut head_bytes = head.bytes();
    // Req::bytes adds its own Content-Length for POST: drop the one for the empty body.
    let text = String::from_utf8(head_bytes.clone()).unwrap();
    head_bytes = text.replace("Content-Length: 0\r\n", "").into_bytes();
    let slow = boxed(flood::silent_tcp(gw.port, 8));
    let trickle = Trickle::start(
        slow,
        head_bytes,
        b"{\"a\":1}   ".to_vec(),
        Duration::from_millis(200),
    );
    std::thread::sleep(Duration::from_millis(500));
    let ((), served_in) = until_served("another principal under a slow-body flood", || {
        http_client_served(gw.port, &alice)
    });
    let during = rss(gw.pid());
    flood::report(
        "http slow-body x8, one principal (max_connections 8)",
        before,
        during,
        Some(served_in),
    );
    std::thread::sleep(Duration::from_secs(4));
    let ends = wait_all_end(trickle.stop());
    let mut busy = 0;
    for e in &ends {
        assert_ne!(*e, Ended::Open, "a slow body was never cut off");
        match e.status() {
            Some(503) => {
                busy += 1;
                let said = String::from_utf8_lossy(e.said()).to_lowercase();
                assert!(said.contains("retry-after:"), "{said}");
            }
            Some(408) | None => {}
            other => panic!("a slow body got {other:?}"),
        }
    }
    assert!(
        busy >= 4,
        "the principal's connections beyond its share get 503: {busy}"
    );
}

#[test]
fn bad_tokens_get_401_before_any_body_or_100_continue() {
    let gw = HttpGateway::start("", "");
    let token = gw.client_token("alice");
    let before = rss(gw.pid());
    let head = Req::post_mcp(gw.port, &json!({}))
        .bearer("twt_not-a-real-token-at-all-but-long-enough-123456")
        .header("Expect", "100-continue")
        .body(Vec::new())
        .bytes();
    let head = String::from_utf8(head)
        .unwrap()
        .replace("Content-Length: 0\r\n", "Content-Length: 1048576\r\n");
    let mut conns = flood::silent_tcp(gw.port, 200);
    for c in conns.iter_mut() {
        c.write_all(head.as_bytes()).unwrap();
    }
    // Each gets 401 at once, never 100 Continue; then the attacker sends its body anyway.
    for c in conns.iter_mut() {
        let mut got = Vec::new();
        let mut chunk = [0u8; 1024];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            match c.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&chunk[..n]),
            }
        }
        let said = String::from_utf8_lossy(&got);
        assert!(said.starts_with("HTTP/1.1 401 "), "{said}");
        let _ = c.write_all(&vec![b' '; 64 * 1024]);
    }
    let during = rss(gw.pid());
    let ((), served_in) = until_served("a normal HTTP client under a bad-token flood", || {
        http_client_served(gw.port, &token)
    });
    flood::report(
        "http bad-token x200 with 1 MiB bodies",
        before,
        during,
        Some(served_in),
    );
    assert!(
        during.now_kib < before.now_kib + 64 * 1024,
        "200 unauthenticated connections cost {} KiB",
        during.now_kib - before.now_kib
    );
    assert_eq!(
        gw.tool_calls().len(),
        1,
        "nothing of a refused request is processed"
    );
}

#[test]
fn a_thousand_quiet_connections_per_door_cost_under_64_mib() {
    let gw = HttpGateway::start(
        "",
        "[http]\nmax_connections = 1000\n\n[gateway]\nmax_connections = 2100\nmax_connections_per_peer = 1000\n",
    );
    flood::allow_descriptors(4096);
    let token = gw.client_token("alice");
    let base = rss(gw.pid());
    // HTTP: half silent, half a slow head of 8 KiB (under the head limit) still arriving.
    let mut http = flood::silent_tcp(gw.port, 1000);
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nX-Pad: {}",
        gw.port,
        "p".repeat(8 * 1024)
    );
    for c in http.iter_mut().skip(500) {
        c.write_all(head.as_bytes()).unwrap();
    }
    std::thread::sleep(Duration::from_millis(1500));
    let with_http = rss(gw.pid());
    let ((), served_http) = until_served("a normal HTTP client beside 1000 quiet ones", || {
        http_client_served(gw.port, &token)
    });
    flood::report(
        "http 500 silent + 500 slow 8 KiB heads",
        base,
        with_http,
        Some(served_http),
    );
    // Framed: half silent, half a frame whose header promises 1 MiB and 4 KiB of it.
    let mut framed = flood::silent_unix(&gw.sock, 1000);
    let mut partial = Vec::new();
    toolwall_relay::frame::encode(&mut partial, 1, 0, "x", &vec![b' '; 1024 * 1024]).unwrap();
    partial.truncate(4096);
    for c in framed.iter_mut().skip(500) {
        c.write_all(&partial).unwrap();
    }
    std::thread::sleep(Duration::from_millis(1500));
    let with_framed = rss(gw.pid());
    let ((), served_framed) = until_served("a normal agent beside 1000 quiet ones", || {
        framed_client_served(&gw.sock)
    });
    flood::report(
        "framed 500 silent + 500 half frames",
        with_http,
        with_framed,
        Some(served_framed),
    );
    let http_cost = with_http.now_kib.saturating_sub(base.now_kib);
    let framed_cost = with_framed.now_kib.saturating_sub(with_http.now_kib);
    eprintln!(
        "MEMORY 1000 quiet HTTP connections: {http_cost} KiB; 1000 quiet framed connections: {framed_cost} KiB"
    );
    assert!(
        http_cost < 64 * 1024,
        "1000 HTTP connections cost {http_cost} KiB"
    );
    assert!(
        framed_cost < 64 * 1024,
        "1000 framed connections cost {framed_cost} KiB"
    );
    drop(http);
    drop(framed);
}

#[test]
fn silent_framed_flood_leaves_the_operator_and_agents_a_way_in() {
    let gw = HttpGateway::start("", "[gateway]\nmax_connections = 64\n");
    let before = rss(gw.pid());
    let silent = flood::silent_unix(&gw.sock, 80);
    std::thread::sleep(Duration::from_millis(300));
    // The operator's commands answer.
    for args in [&["status"][..], &["approvals"][..], &["reload"][..]] {
        let out = gw.cli(args);
        assert!(
            out.status.success(),
            "toolwall {args:?} under a framed flood: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(health(gw.port), Some(200), "/health under a framed flood");
    let ((), served_in) = until_served("an agent under a silent framed flood", || {
        framed_client_served(&gw.sock)
    });
    let during = rss(gw.pid());
    flood::report(
        "framed silent x80 (max_connections 64)",
        before,
        during,
        Some(served_in),
    );
    let ends = wait_all_end(silent);
    assert!(
        ends.iter().all(|e| *e != Ended::Open),
        "silent framed connections are closed (gateway.accept_timeout_secs)"
    );
}

#[test]
fn half_frame_flood_is_cut_off() {
    let gw = HttpGateway::start(
        "",
        "[gateway]\nmax_connections = 64\nframe_timeout_secs = 3\n",
    );
    let before = rss(gw.pid());
    let mut half = flood::silent_unix(&gw.sock, 80);
    let mut bytes = Vec::new();
    toolwall_relay::frame::encode(&mut bytes, 1, 0, "x", b"{\"jsonrpc\":\"2.0\"}").unwrap();
    for c in half.iter_mut() {
        let _ = c.write_all(&bytes[..10]);
    }
    // The operator's way in is open while the flood holds the agent seats.
    let out = gw.cli(&["approvals"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        health(gw.port),
        Some(200),
        "/health under a half-frame flood"
    );
    let ((), served_in) = until_served("an agent under a half-frame flood", || {
        framed_client_served(&gw.sock)
    });
    let during = rss(gw.pid());
    flood::report(
        "framed half-frame x80 (max_connections 64)",
        before,
        during,
        Some(served_in),
    );
    let ends = wait_all_end(half);
    assert!(
        ends.iter().all(|e| *e != Ended::Open),
        "half frames are cut off"
    );
}

const ASK_ECHO: &str = r#"
[[policy.rules]]
id = "ask-echo"
action = "ask"
tool = "local__echo"
reason = "a human looks at every echo"
"#;

fn pending_approvals(gw: &HttpGateway) -> Vec<Value> {
    let out = gw.cli(&["approvals", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("approvals --json");
    v["pending"].as_array().cloned().unwrap_or_default()
}

#[test]
fn operator_approves_and_health_answers_while_every_agent_slot_is_taken() {
    let gw = HttpGateway::start(
        "",
        &format!("[gateway]\nmax_connections = 6\nmax_connections_per_peer = 6\n{ASK_ECHO}"),
    );
    // Six agents, each with a call held for approval: every agent slot is busy.
    let mut agents: Vec<(FramedClient, u32)> = (0..6)
        .map(|i| {
            let mut c = gw.connect();
            let sid = c.request(
                json!(i),
                "tools/call",
                Some(json!({"name": "local__echo", "arguments": {"text": format!("held {i}")}})),
            );
            (c, sid)
        })
        .collect();
    let (pending, _) = until_served("six held calls", || {
        let p = pending_approvals(&gw);
        (p.len() == 6).then_some(p)
    });
    // A seventh agent gets a clear refusal, not a reset.
    let mut extra = gw.connect();
    extra.request(
        json!(99),
        "tools/call",
        Some(json!({"name": "local__echo", "arguments": {"text": "x"}})),
    );
    let refusal = extra.recv().expect("a refusal frame before the close");
    assert_eq!(refusal.body["error"]["code"], -32000, "{}", refusal.body);
    assert!(
        refusal.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("gateway.max_connections"),
        "{}",
        refusal.body
    );
    assert!(extra.closed_by_peer());
    // The operator: status, reload, approvals and approve; and /health.
    for args in [&["status"][..], &["reload"][..]] {
        let out = gw.cli(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(
        health(gw.port),
        Some(200),
        "/health while every agent slot is taken"
    );
    let id = pending[0]["id"].to_string();
    let out = gw.cli(&["approve", &id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = pending[0]["arguments"].as_str().unwrap().to_owned();
    let answered = agents.iter_mut().any(|(c, sid)| {
        c.stream
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let got = c.recv();
        c.stream.set_read_timeout(Some(PATIENCE)).unwrap();
        got.is_some_and(|r| {
            r.stream == *sid
                && text.contains(
                    r.body["result"]["content"][0]["text"]
                        .as_str()
                        .unwrap_or("?"),
                )
        })
    });
    assert!(answered, "the approved call's agent got its answer");
}

#[test]
fn beyond_a_limit_clients_get_a_clear_refusal_not_a_reset() {
    let gw = HttpGateway::start(
        "",
        &format!(
            "[http]\nmax_connections = 2\n\n[gateway]\nmax_connections = 5\nmax_connections_per_peer = 2\n{ASK_ECHO}"
        ),
    );
    let token = gw.client_token("alice");
    let bob = gw.client_token("bob");
    // Two HTTP connections busy with held calls (modern era: no session needed).
    let mut busy = Vec::new();
    for (i, t) in [&token, &bob].into_iter().enumerate() {
        let mut h = gw.http();
        let call = common::http::modern(
            gw.port,
            i as u64 + 1,
            "tools/call",
            json!({"name": "local__echo", "arguments": {"text": "held"}}),
            Some("local__echo"),
        )
        .bearer(t);
        h.send(&call);
        busy.push(h);
    }
    until_served("two held HTTP calls", || {
        (pending_approvals(&gw).len() == 2).then_some(())
    });
    let mut third = gw.http();
    third.send(&gw.post(&initialize(1)).bearer(&token));
    let r = third.response().expect("a 503, not a reset");
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.header("Retry-After").is_some(), "{:?}", r.headers);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("http.max_connections")
    );
    // Two framed agents busy; a third of the same uid gets an error frame, then EOF.
    let mut agents = Vec::new();
    for i in 0..2 {
        let mut c = gw.connect();
        c.request(
            json!(i),
            "tools/call",
            Some(json!({"name": "local__echo", "arguments": {"text": "held"}})),
        );
        agents.push(c);
    }
    until_served("four held calls", || {
        (pending_approvals(&gw).len() == 4).then_some(())
    });
    let mut c = FramedClient::connect(&gw.sock);
    let refusal = c.recv().expect("an error frame");
    assert_eq!(refusal.body["error"]["code"], -32000, "{}", refusal.body);
    assert!(
        refusal.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_connections_per_peer"),
        "{}",
        refusal.body
    );
    assert!(c.closed_by_peer());
}

/// A client that sends a 2 MiB body without waiting for `100 Continue` always reads its
/// 413: the door answers, half-closes and reads the rest away before it closes.
#[test]
fn a_two_mib_body_is_always_seen_refused() {
    let gw = HttpGateway::start("", "");
    let token = gw.client_token("alice");
    let script = r#"
import http.client, sys
port, token, rounds = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
body = b"x" * (2 * 1024 * 1024)
seen = []
for i in range(rounds):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "Authorization": "Bearer " + token}
    if i % 2:
        headers["Expect"] = "100-continue"
    try:
        c.request("POST", "/mcp", body=body, headers=headers)
        r = c.getresponse()
        r.read()
        seen.append(str(r.status))
    except Exception as e:
        seen.append(type(e).__name__)
    finally:
        c.close()
print(" ".join(seen))
"#;
    common::deps::ensure(&["python3"]);
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(gw.port.to_string())
        .arg(&token)
        .arg("30")
        .output()
        .expect("python3 runs (scripts/install-test-deps.sh debian)");
    let seen = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers: Vec<&str> = seen.split_whitespace().collect();
    assert_eq!(answers.len(), 30, "{seen}");
    assert!(
        answers.iter().all(|a| *a == "413"),
        "every 2 MiB POST sees 413: {seen}"
    );
}

#[test]
fn deadlines_are_armed_from_the_first_accept() {
    // No connection was ever serviced: the first one is silent.
    let gw = HttpGateway::start("", "");
    let mut s = TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    assert_ne!(
        flood::wait_end(&mut s),
        Ended::Open,
        "a lone silent connection is closed"
    );
    let mut u = UnixStream::connect(&gw.sock).unwrap();
    u.set_read_timeout(Some(PATIENCE)).unwrap();
    assert_ne!(
        flood::wait_end(&mut u),
        Ended::Open,
        "a lone silent framed connection is closed"
    );
    // A normal session is unaffected.
    let token = gw.client_token("alice");
    let mut http = gw.http();
    let session = open_session(&mut http, gw.port, Some(&token));
    let r = http.call(&echo_in_session(gw.port, 2, &session, "fine").bearer(&token));
    assert_eq!(result_text(&r.json()), "fine");
}

#[test]
fn a_thousand_quiet_tls_connections_cost_under_64_mib() {
    let dir = tempfile::tempdir().unwrap();
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let key = dir.path().join("key.pem");
    std::fs::write(dir.path().join("cert.pem"), certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let d = dir.path().display().to_string();
    let gw = HttpGateway::start_in(
        dir,
        &format!("tls_cert = \"{d}/cert.pem\"\ntls_key = \"{d}/key.pem\"\n"),
        "[http]\nmax_connections = 1000\n\n[gateway]\nmax_connections = 1100\n",
    );
    let mut roots = rustls::RootCertStore::empty();
    roots.add(certified.cert.der().clone()).unwrap();
    let config = std::sync::Arc::new(
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth(),
    );
    flood::allow_descriptors(4096);
    let base = rss(gw.pid());
    // Half complete the handshake and go quiet; half send a ClientHello and stop there.
    let mut held = Vec::new();
    for i in 0..1000 {
        let mut tcp = TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
        tcp.set_read_timeout(Some(PATIENCE)).unwrap();
        let mut tls = rustls::ClientConnection::new(
            std::sync::Arc::clone(&config),
            "localhost".try_into().unwrap(),
        )
        .unwrap();
        if i % 2 == 0 {
            while tls.is_handshaking() {
                tls.complete_io(&mut tcp).expect("handshake");
            }
        } else {
            let mut hello = Vec::new();
            tls.write_tls(&mut hello).unwrap();
            tcp.write_all(&hello).unwrap();
        }
        held.push((tcp, tls));
    }
    std::thread::sleep(Duration::from_millis(1500));
    let during = rss(gw.pid());
    let cost = during.now_kib.saturating_sub(base.now_kib);
    eprintln!(
        "MEMORY 1000 quiet TLS connections (500 after the handshake, 500 mid-handshake): {cost} KiB"
    );
    flood::report(
        "https 500 handshaken + 500 half-handshaken",
        base,
        during,
        None,
    );
    assert!(cost < 64 * 1024, "1000 TLS connections cost {cost} KiB");
}

#[test]
fn a_full_framed_door_leaves_the_http_door_its_own_seats() {
    // One local uid (the test's) may take every framed seat; none of them is HTTP's.
    let gw = HttpGateway::start(
        "",
        "[gateway]\nmax_connections = 6\nmax_connections_per_peer = 6\n[http]\nmax_connections = 4\n",
    );
    let token = gw.client_token("carol");
    // Six proven framed agents (each answered a ping), so none can be displaced.
    let mut framed: Vec<FramedClient> = (0..6)
        .map(|_| {
            let mut c = FramedClient::connect(&gw.sock);
            let r = c.call("ping", json!({}));
            assert!(r["result"].is_object(), "{r}");
            c
        })
        .collect();
    // The framed door is full: a seventh framed agent is refused in words.
    assert_eq!(
        framed_client_served(&gw.sock),
        None,
        "the framed door holds its own budget"
    );
    // An HTTP principal is served at once: its door's seats are its own.
    assert_eq!(
        http_client_served(gw.port, &token),
        Some(()),
        "an HTTP client is refused while framed agents fill gateway.max_connections"
    );
    // And the framed agents are all still there.
    for c in framed.iter_mut() {
        let r = c.call("ping", json!({}));
        assert!(r["result"].is_object(), "{r}");
    }
    let status = gw.cli(&["status", "--json"]);
    let s: Value = serde_json::from_slice(&status.stdout).unwrap_or(Value::Null);
    assert_eq!(s["seats"]["framed"]["taken"], 6, "{s}");
    assert_eq!(s["seats"]["framed"]["limit"], 6, "{s}");
}

/// Write `bytes` to every stream without blocking, for `secs`, as far as each is read:
/// a client that sends all it can while the gateway takes only what its budget allows.
fn push_all<S: Write>(streams: &mut [S], bytes: &[u8], secs: u64) -> usize {
    let mut sent = vec![0usize; streams.len()];
    let until = std::time::Instant::now() + Duration::from_secs(secs);
    while std::time::Instant::now() < until {
        let mut moved = false;
        for (s, at) in streams.iter_mut().zip(sent.iter_mut()) {
            while *at < bytes.len() {
                match s.write(&bytes[*at..]) {
                    Ok(n) if n > 0 => {
                        *at += n;
                        moved = true;
                    }
                    _ => break,
                }
            }
        }
        if !moved {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    sent.iter().sum()
}

#[test]
fn near_whole_frames_and_bodies_hold_a_bounded_budget() {
    let gw = HttpGateway::start(
        "",
        "[gateway]\nmax_connections = 600\nmax_connections_per_peer = 600\n\
         frame_timeout_secs = 12\n\
         [http]\nmax_connections = 300\nmax_connections_per_principal = 300\n\
         body_timeout_secs = 12\n",
    );
    flood::allow_descriptors(4096);
    let alice = gw.client_token("alice");
    let bob = gw.client_token("bob");
    let admin = gw.token("ops", "admin", "never");
    // A large message is read whole (a grant for its size) when nobody holds the budget.
    let big = "b".repeat(600 * 1024);
    let mut agent = FramedClient::connect(&gw.sock);
    let r = agent.tool("local__echo", json!({"text": big}));
    assert_eq!(
        r["result"]["content"][0]["text"],
        big.as_str(),
        "a 600 KB echo"
    );
    let base = rss(gw.pid());
    // Framed: 500 connections of one uid, each a frame promising ~1 MiB and all but its
    // last byte.
    let mut frame = Vec::new();
    toolwall_relay::frame::encode(&mut frame, 1, 0, "x", &vec![b' '; 1024 * 1024 - 64]).unwrap();
    frame.pop();
    let mut framed = flood::silent_unix(&gw.sock, 500);
    for s in &framed {
        s.set_nonblocking(true).unwrap();
    }
    let sent = push_all(&mut framed, &frame, 4);
    let with_framed = rss(gw.pid());
    // A normal agent (small messages need no grant) is served beside them.
    let ((), served_framed) = until_served("a normal agent beside 500 near-whole frames", || {
        framed_client_served(&gw.sock)
    });
    flood::report(
        "framed 500 near-whole 1 MiB frames",
        base,
        with_framed,
        Some(served_framed),
    );
    let framed_cost = with_framed.now_kib.saturating_sub(base.now_kib);
    eprintln!(
        "MEMORY 500 near-whole frames ({} MiB sent): {framed_cost} KiB",
        sent >> 20
    );
    assert!(
        framed_cost < 48 * 1024,
        "500 near-whole frames held {framed_cost} KiB"
    );
    // HTTP: 250 connections of alice, each a head accepted and 1 MiB - 1 of its body.
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {alice}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: local__echo\r\n\
         Content-Length: {}\r\n\r\n",
        gw.port,
        1024 * 1024
    );
    let mut request = head.into_bytes();
    request.extend(std::iter::repeat_n(b' ', 1024 * 1024 - 1));
    let mut http = flood::silent_tcp(gw.port, 250);
    for s in &http {
        s.set_nonblocking(true).unwrap();
    }
    push_all(&mut http, &request, 4);
    let with_http = rss(gw.pid());
    // Another principal's large body is read and answered: alice holds only her share.
    let ((), served_bob) = until_served("bob's 600 KB call beside alice's flood", || {
        let stream = TcpStream::connect(("127.0.0.1", gw.port)).ok()?;
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
        let mut h = common::http::Http::over(stream);
        let session = open_session(&mut h, gw.port, Some(&bob));
        let r = h.call(&echo_in_session(gw.port, 2, &session, &big).bearer(&bob));
        (r.status == 200 && result_text(&r.json()) == big).then_some(())
    });
    flood::report(
        "http 250 near-whole 1 MiB bodies of one principal",
        with_framed,
        with_http,
        Some(served_bob),
    );
    let http_cost = with_http.now_kib.saturating_sub(with_framed.now_kib);
    eprintln!("MEMORY 250 near-whole bodies: {http_cost} KiB");
    assert!(
        http_cost < 48 * 1024,
        "250 near-whole bodies held {http_cost} KiB"
    );
    let m = metrics(&gw, &admin);
    assert!(
        metric(&m, "toolwall_partial_pauses_total{door=\"framed\"}") > 0,
        "framed pauses are counted: {m}"
    );
    assert!(
        metric(&m, "toolwall_partial_pauses_total{door=\"http\"}") > 0,
        "http pauses are counted: {m}"
    );
    // Frames and bodies that never finish are cut off at their deadline, waiting or not.
    for s in &framed {
        s.set_nonblocking(false).unwrap();
        s.set_read_timeout(Some(PATIENCE)).unwrap();
    }
    for s in &http {
        s.set_nonblocking(false).unwrap();
        s.set_read_timeout(Some(PATIENCE)).unwrap();
    }
    let ends = wait_all_end(framed);
    assert!(
        ends.iter().all(|e| *e != Ended::Open),
        "near-whole frames are cut off at gateway.frame_timeout_secs"
    );
    let ends = wait_all_end(http);
    assert!(
        ends.iter().all(|e| *e != Ended::Open),
        "near-whole bodies are cut off at http.body_timeout_secs"
    );
    // Once they are gone, every grant has come back.
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let m = metrics(&gw, &admin);
        if metric(&m, "toolwall_partial_bytes ") == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "grants never came back: {m}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_listing_flood_writes_a_bounded_number_of_ledger_rows() {
    let mut gw = HttpGateway::start("", "");
    let admin = gw.token("ops", "admin", "never");
    let mut agent = FramedClient::connect(&gw.sock);
    // 600 listings, pipelined 50 at a time, then a call: its row is written as ever.
    for batch in 0..12 {
        let sids: Vec<u32> = (0..50)
            .map(|i| agent.request(json!(batch * 50 + i), "tools/list", Some(json!({}))))
            .collect();
        let mut answered = 0;
        while answered < sids.len() {
            let r = agent.recv().expect("a listing answered");
            if sids.contains(&r.stream) {
                assert!(r.body["result"]["tools"].is_array(), "{}", r.body);
                answered += 1;
            }
        }
    }
    let r = agent.tool("local__echo", json!({"text": "a call after the flood"}));
    assert_eq!(r["result"]["content"][0]["text"], "a call after the flood");
    let rows = gw.wait_rows("the call's row", |rows| {
        rows.iter()
            .any(|r| r["tool_name"] == "echo" && r["decision"] == "allowed")
    });
    assert_eq!(rows.len(), 1, "one row per call");
    let listed = gw.events("list");
    assert!(
        listed.len() <= 2,
        "600 listings wrote {} list rows",
        listed.len()
    );
    let m = metrics(&gw, &admin);
    assert_eq!(
        metric(&m, "toolwall_list_events_coalesced_total"),
        599,
        "{m}"
    );
    // The counted listings are recorded as one summary (at the latest when it stops).
    drop(agent);
    assert!(gw.terminate().success());
    let summaries = gw.events("list_summary");
    let counted: u64 = summaries
        .iter()
        .filter_map(|e| {
            let d: Value = match &e["detail"] {
                Value::String(text) => serde_json::from_str(text).ok()?,
                other => other.clone(),
            };
            (d["method"] == "tools/list")
                .then(|| d["count"].as_u64())
                .flatten()
        })
        .sum();
    assert_eq!(counted, 599, "{summaries:?}");
}

/// A framed agent of another uid: one 600 KB echo from a child process running as `who`;
/// true when the echo came back whole.
const LARGE_ECHO_PY: &str = r#"
import json, socket, struct, sys
text = "u" * (600 * 1024)
msg = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                  "params": {"name": "local__echo", "arguments": {"text": text}}}).encode()
name = b"other"
body = struct.pack(">HBBIHHI", 0x4D43, 1, 16, 1, 0, len(name), len(msg)) + name + msg
s = socket.socket(socket.AF_UNIX); s.settimeout(20); s.connect(sys.argv[1])
s.sendall(struct.pack(">I", len(body)) + body)
def exact(n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c: sys.exit("closed")
        b += c
    return b
while True:
    total = struct.unpack(">I", exact(4))[0]
    frame = exact(total)
    sid, name_len = struct.unpack(">I", frame[4:8])[0], struct.unpack(">H", frame[10:12])[0]
    if sid == 1:
        reply = json.loads(frame[16 + name_len:])
        print("ECHO", len(reply["result"]["content"][0]["text"]))
        break
"#;

#[test]
fn another_uid_reads_its_large_frame_beside_a_flood_of_near_whole_ones() {
    let gw = HttpGateway::start(
        "",
        // The flood's uid could take the whole budget but for its share.
        "[gateway]\nmax_connections = 600\nmax_connections_per_peer = 600\n\
         max_partial_bytes = 8388608\nmax_partial_bytes_per_peer = 4194304\n",
    );
    let other = common::agent_user();
    std::fs::set_permissions(
        &gw.sock,
        std::os::unix::fs::PermissionsExt::from_mode(0o666),
    )
    .unwrap();
    common::searchable_above(&gw.sock);
    // This uid: 400 frames promising ~1 MiB, all but the last byte sent.
    let mut frame = Vec::new();
    toolwall_relay::frame::encode(&mut frame, 1, 0, "x", &vec![b' '; 1024 * 1024 - 64]).unwrap();
    frame.pop();
    let mut flood = flood::silent_unix(&gw.sock, 400);
    for s in &flood {
        s.set_nonblocking(true).unwrap();
    }
    push_all(&mut flood, &frame, 3);
    // The other uid's share is its own: its 600 KB frame is read and answered.
    let mut cmd = std::process::Command::new("python3");
    cmd.args(["-c", LARGE_ECHO_PY, gw.sock.to_str().unwrap()]);
    common::run_as(&mut cmd, &other);
    let out = cmd.output().expect("python3");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&format!("ECHO {}", 600 * 1024)),
        "another uid's large frame beside a flood: {said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(flood);
}
