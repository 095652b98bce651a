//! Ways to hold a door that the first floods did not try, against the real binary: a client
//! that keeps failing authentication or only asks for `/health`, answers pipelined and never
//! read, one principal filling every seat in flight, a held call whose client hangs up while
//! its bytes are not read, and a pipelined burst that would keep the loop to itself.

mod common;

use common::PATIENCE;
use common::flood::{Ended, rss, wait_end};
use common::http::{HttpGateway, Req, echo_in_session, modern, open_session};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const ASK_ECHO: &str = r#"
[[policy.rules]]
id = "ask-echo"
action = "ask"
tool = "local__echo"
arg = { path = "text", contains = "ASK" }
reason = "a human looks at these"
"#;

const BAD_TOKEN: &str = "twt_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";

fn metrics(gw: &HttpGateway) -> String {
    let admin = gw.token("ops", "admin", "never");
    let mut http = gw.http();
    let r = http.call(&Req::new("GET", "/metrics", gw.port).bearer(&admin));
    assert_eq!(r.status, 200);
    r.text()
}

fn counted(text: &str, line_prefix: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(line_prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

fn pending(gw: &HttpGateway) -> Vec<Value> {
    let out = gw.cli(&["approvals", "--json"]);
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).expect("approvals --json");
    v["pending"].as_array().cloned().unwrap_or_default()
}

fn wait_pending(gw: &HttpGateway, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let p = pending(gw);
        if p.len() == n {
            return p;
        }
        assert!(Instant::now() < deadline, "never {n} calls pending: {p:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn echo_modern(port: u16, id: u64, text: &str, token: &str) -> Vec<u8> {
    modern(
        port,
        id,
        "tools/call",
        json!({"name": "local__echo", "arguments": {"text": text}}),
        Some("local__echo"),
    )
    .bearer(token)
    .bytes()
}

/// Send `piece`s with a pause between them until the server closes the connection (a write
/// fails or a read sees the end) or `PATIENCE` runs out; answers are read as they come.
/// Returns whether the server closed it.
fn keep_sending_until_closed(stream: &mut TcpStream, pieces: &[Vec<u8>], pause: Duration) -> bool {
    stream
        .set_read_timeout(Some(Duration::from_millis(10)))
        .unwrap();
    let deadline = Instant::now() + PATIENCE;
    let mut chunk = [0u8; 4096];
    while Instant::now() < deadline {
        for piece in pieces {
            if stream.write_all(piece).is_err() {
                return true;
            }
            std::thread::sleep(pause);
            loop {
                match stream.read(&mut chunk) {
                    Ok(0) => return true,
                    Ok(_) => continue,
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) =>
                    {
                        break;
                    }
                    Err(_) => return true,
                }
            }
        }
    }
    false
}

#[test]
fn a_refused_token_closes_the_connection_so_bad_heads_never_hold_the_door() {
    let gw = HttpGateway::start("", "[http]\nmax_connections = 4\n");
    let token = gw.client_token("alice");
    let bad = Req::post_mcp(gw.port, &json!({})).bearer(BAD_TOKEN).bytes();
    // Every seat taken by a client with a bad token, each trying again and again.
    let mut holders: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut s = TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
            s.set_read_timeout(Some(PATIENCE)).unwrap();
            s.write_all(&bad).unwrap();
            s
        })
        .collect();
    for s in &mut holders {
        // The 401 is the connection's last word: the server closes after it.
        let end = wait_end(s);
        assert_ne!(
            end,
            Ended::Open,
            "a connection refused its token stays open"
        );
        assert_eq!(
            end.status(),
            Some(401),
            "{:?}",
            String::from_utf8_lossy(end.said())
        );
    }
    // And the door is free for a good client.
    let mut http = gw.http();
    let session = open_session(&mut http, gw.port, Some(&token));
    let r = http.call(&echo_in_session(gw.port, 2, &session, "in").bearer(&token));
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn health_alone_never_keeps_a_seat_unauthenticated_or_after_one_call() {
    let gw = HttpGateway::start(
        "",
        "[http]\nauth_timeout_secs = 2\nkeepalive_idle_secs = 2\nhead_timeout_secs = 2\n",
    );
    let token = gw.client_token("alice");
    let health = Req::new("GET", "/health", gw.port).bytes();
    // Each /health head trickled in two pieces, again and again.
    let half = health.len() / 2;
    let pieces = [health[..half].to_vec(), health[half..].to_vec()];
    let mut unauthenticated = TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    assert!(
        keep_sending_until_closed(&mut unauthenticated, &pieces, Duration::from_millis(300)),
        "a client sending only /health kept its seat for {PATIENCE:?} (http.auth_timeout_secs = 2)"
    );
    // One authenticated call, then only /health: the keep-alive deadline runs from the call.
    let mut http = gw.http();
    http.send_raw(&echo_modern(gw.port, 1, "one call", &token));
    let r = http.response().expect("the call is answered");
    assert_eq!(r.status, 200, "{}", r.text());
    let mut stream = http.stream;
    assert!(
        keep_sending_until_closed(&mut stream, &pieces, Duration::from_millis(300)),
        "an authenticated client sending only /health after one call kept its seat for {PATIENCE:?} (http.keepalive_idle_secs = 2)"
    );
    let m = metrics(&gw);
    assert!(
        counted(
            &m,
            "toolwall_connections_closed_total{door=\"http\",reason=\"auth_timeout\"}"
        ) >= 1,
        "{m}"
    );
    assert!(
        counted(
            &m,
            "toolwall_connections_closed_total{door=\"http\",reason=\"idle_timeout\"}"
        ) >= 1,
        "{m}"
    );
}

/// A client that sends requests and never reads the answers.
fn unread_burst(port: u16, burst: std::sync::Arc<Vec<u8>>) -> std::thread::JoinHandle<()> {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    // A small receive buffer: the answers pile up in the gateway, not in this kernel.
    let small: libc::c_int = 4096;
    // SAFETY: a valid socket and a c_int option of the right size.
    unsafe {
        use std::os::fd::AsRawFd;
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            &small as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
    std::thread::spawn(move || {
        let mut s = s;
        // Blocks once the gateway stops reading; ends when it closes the connection.
        let _ = s.write_all(&burst);
        std::thread::sleep(PATIENCE);
    })
}

#[test]
fn answers_nobody_reads_are_bounded_and_their_reader_is_closed() {
    let gw = HttpGateway::start("", "[http]\nwrite_stall_secs = 2\nauth_timeout_secs = 3\n");
    let before = rss(gw.pid());
    // 22,000 pipelined /health each: more than 8 MiB of answers per connection.
    let burst = std::sync::Arc::new(Req::new("GET", "/health", gw.port).bytes().repeat(22_000));
    let _clients: Vec<_> = (0..8)
        .map(|_| unread_burst(gw.port, burst.clone()))
        .collect();
    let deadline = Instant::now() + PATIENCE;
    let closed = |m: &str| {
        counted(
            m,
            "toolwall_connections_closed_total{door=\"http\",reason=\"write_stall\"}",
        ) + counted(
            m,
            "toolwall_connections_closed_total{door=\"http\",reason=\"auth_timeout\"}",
        )
    };
    let ended = loop {
        let n = closed(&metrics(&gw));
        if n >= 8 || Instant::now() > deadline {
            break n;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let during = rss(gw.pid());
    common::flood::report(
        "http 8 x 22,000 pipelined /health never read",
        before,
        during,
        None,
    );
    assert_eq!(
        ended, 8,
        "every client that never reads its answers is closed"
    );
    // The answers queued in the gateway are bounded (http.max_queued_output_bytes), not
    // 8 MiB per connection.
    let grew = during.peak_kib.saturating_sub(before.now_kib);
    assert!(grew < 24 * 1024, "the gateway grew by {grew} KiB");
    // The door serves others.
    let mut http = gw.http();
    let r = http.call(&Req::new("GET", "/health", gw.port));
    assert_eq!(r.status, 200);
}

#[test]
fn one_principal_cannot_take_every_call_in_flight() {
    let gw = HttpGateway::start(
        "",
        &format!("[gateway]\nmax_in_flight_total = 8\n{ASK_ECHO}"),
    );
    let bob = gw.client_token("bob");
    // One uid asks for every seat (its default share is a quarter of the total: 2).
    let mut hog = gw.connect();
    let streams: Vec<u32> = (0..8)
        .map(|i| {
            hog.request(
                json!(i),
                "tools/call",
                Some(json!({"name": "local__echo", "arguments": {"text": format!("ASK {i}")}})),
            )
        })
        .collect();
    let mut refused = 0;
    while refused < 6 {
        let reply = hog.recv().expect("the calls beyond the share are refused");
        assert!(streams.contains(&reply.stream));
        let message = reply.body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("gateway.max_in_flight_per_principal"),
            "{}",
            reply.body
        );
        assert_eq!(
            reply.body["error"]["data"]["limit"],
            "gateway.max_in_flight_per_principal"
        );
        refused += 1;
    }
    wait_pending(&gw, 2);
    // Counted, not recorded one by one.
    let admin = gw.token("ops", "admin", "never");
    let r = gw
        .http()
        .call(&Req::new("GET", "/metrics", gw.port).bearer(&admin));
    assert!(
        r.text().contains("toolwall_share_refusals_total 6"),
        "{}",
        r.text()
    );
    // Another principal is served at once.
    let mut http = gw.http();
    http.send_raw(&echo_modern(gw.port, 1, "bob is served", &bob));
    let r = http.response().expect("another principal is served");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("bob is served"), "{}", r.text());
}

#[test]
fn the_share_of_one_principal_follows_a_reload() {
    let gw = HttpGateway::start(
        "",
        &format!("[gateway]\nmax_in_flight_total = 8\n{ASK_ECHO}"),
    );
    let ask = |agent: &mut common::FramedClient, i: u64| {
        agent.request(
            json!(i),
            "tools/call",
            Some(json!({"name": "local__echo", "arguments": {"text": format!("ASK {i}")}})),
        )
    };
    let refused = |agent: &mut common::FramedClient| {
        let reply = agent.recv().expect("a call beyond the share is refused");
        reply.body["error"]["data"]["limit"] == "gateway.max_in_flight_per_principal"
    };
    let mut agent = gw.connect();
    for i in 0..3 {
        ask(&mut agent, i);
    }
    // The default share is a quarter of the total: 2 held, the third refused.
    assert!(refused(&mut agent));
    wait_pending(&gw, 2);
    // The operator raises the share and reloads: it holds for the next calls.
    let config = std::fs::read_to_string(&gw.config_path).unwrap().replace(
        "max_in_flight_total = 8\n",
        "max_in_flight_total = 8\nmax_in_flight_per_principal = 4\n",
    );
    std::fs::write(&gw.config_path, config).unwrap();
    assert!(gw.cli(&["reload"]).status.success());
    for i in 10..13 {
        ask(&mut agent, i);
    }
    wait_pending(&gw, 4);
    assert!(
        refused(&mut agent),
        "the fifth call is beyond the new share"
    );
}

#[test]
fn a_held_call_ends_cancelled_when_its_client_hangs_up_while_unread() {
    let gw = HttpGateway::start("", ASK_ECHO);
    let token = gw.client_token("alice");
    // A held call, and more pipelined behind it than the connection reads while it waits.
    let mut bytes = echo_modern(gw.port, 1, "ASK hold me", &token);
    for i in 0..60 {
        bytes.extend_from_slice(&echo_modern(gw.port, 100 + i, "plain", &token));
    }
    let mut s = TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    s.write_all(&bytes).unwrap();
    wait_pending(&gw, 1);
    drop(s);
    wait_pending(&gw, 0);
    gw.wait_rows("the held call's row says cancelled", |rows| {
        rows.len() == 1 && rows[0]["decision"] == "cancelled"
    });
}

#[test]
fn a_pipelined_burst_does_not_keep_the_loop_to_itself() {
    let gw = HttpGateway::start("", ASK_ECHO);
    let token = gw.client_token("alice");
    let admin = gw.token("ops", "admin", "never");
    // A held call, and 20,000 /health pipelined behind it, buffered while it waits.
    const N: u64 = 20_000;
    let mut burst = echo_modern(gw.port, 1, "ASK first", &token);
    burst.extend_from_slice(
        &Req::new("GET", "/health", gw.port)
            .bytes()
            .repeat(N as usize),
    );
    let mut s = TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    let mut reader = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = s.write_all(&burst);
        s
    });
    // Its answers are read as they come.
    let answers = std::thread::spawn(move || {
        let mut n = 0u64;
        let mut buf = vec![0u8; 1 << 16];
        let mut carry = Vec::new();
        reader.set_read_timeout(Some(PATIENCE)).unwrap();
        while n < N + 1 {
            match reader.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(k) => {
                    carry.extend_from_slice(&buf[..k]);
                    n += carry.windows(9).filter(|w| w == b"HTTP/1.1 ").count() as u64;
                    let keep = carry.len().min(8);
                    carry.drain(..carry.len() - keep);
                }
            }
        }
        n
    });
    let p = wait_pending(&gw, 1);
    let mut other = gw.http();
    // Approve: the burst is released; another client asks how many answers went out.
    assert!(
        gw.cli(&["approve", &p[0]["id"].to_string()])
            .status
            .success()
    );
    let started = Instant::now();
    let r = other.call(&Req::new("GET", "/metrics", gw.port).bearer(&admin));
    let waited = started.elapsed();
    assert_eq!(r.status, 200);
    let served_before = counted(&r.text(), "toolwall_http_responses_total{status=\"200\"}");
    eprintln!(
        "FAIRNESS another client was answered in {waited:?}, after {served_before} of the burst's {N} answers"
    );
    assert!(
        served_before < N / 2,
        "another client waited for {served_before} of {N} pipelined answers"
    );
    let _ = writer.join();
    assert_eq!(
        answers.join().unwrap(),
        N + 1,
        "every pipelined request is answered"
    );
}

#[test]
fn framed_held_calls_end_when_their_agent_hangs_up_past_the_in_flight_bound() {
    let gw = HttpGateway::start("", ASK_ECHO);
    // More held calls than one connection may have in flight (64): reading it stops.
    let mut agent = gw.connect();
    for i in 0..70 {
        agent.request(
            json!(i),
            "tools/call",
            Some(json!({"name": "local__echo", "arguments": {"text": format!("ASK {i}")}})),
        );
    }
    wait_pending(&gw, 64);
    drop(agent);
    // Nobody is left to answer them: they end, and their rows say cancelled.
    wait_pending(&gw, 0);
    gw.wait_rows("every held call cancelled", |rows| {
        rows.len() >= 64 && rows.iter().all(|r| r["decision"] == "cancelled")
    });
}

#[test]
fn framed_requests_sent_with_their_end_of_input_are_answered_and_the_end_is_seen() {
    // The gateway stops reading a connection when a read returns less than it had room
    // for; an end of input that came with the bytes (one readiness event for both) must
    // still be read, or the agent's hang-up would never be seen.
    let gw = HttpGateway::start("", ASK_ECHO);
    for round in 0..20 {
        // A ping and then the end: the answer comes, then the gateway closes.
        let mut agent = gw.connect();
        let sid = agent.request(json!(round), "ping", Some(json!({})));
        agent.stream.shutdown(std::net::Shutdown::Write).unwrap();
        let reply = agent.recv().expect("the ping is answered");
        assert_eq!(reply.stream, sid);
        assert_eq!(reply.body["result"], json!({}));
        assert!(
            agent.closed_by_peer(),
            "round {round}: the end of input is seen"
        );
        // A held call and then the end: nobody is left to approve it, so it ends.
        let mut asker = gw.connect();
        asker.request(
            json!(round),
            "tools/call",
            Some(json!({"name": "local__echo", "arguments": {"text": "ASK held"}})),
        );
        asker.stream.shutdown(std::net::Shutdown::Write).unwrap();
        gw.wait_rows("the held call cancelled", |rows| {
            rows.len() == round + 1 && rows.iter().all(|r| r["decision"] == "cancelled")
        });
    }
    assert!(pending(&gw).is_empty());
}

#[test]
fn a_held_call_whose_agent_stops_sending_is_answered_before_the_connection_closes() {
    // The agent sends a call that is held, then closes its sending side: nobody can
    // approve the call through it any more, so the call ends; the agent still reads, so
    // it gets that answer, and only then does the gateway close.
    let gw = HttpGateway::start("", ASK_ECHO);
    for round in 0..5 {
        let mut agent = gw.connect();
        let sid = agent.request(
            json!(round),
            "tools/call",
            Some(json!({"name": "local__echo", "arguments": {"text": "ASK then stop"}})),
        );
        wait_pending(&gw, 1);
        agent.stream.shutdown(std::net::Shutdown::Write).unwrap();
        let reply = agent
            .recv()
            .unwrap_or_else(|| panic!("round {round}: the held call is answered"));
        assert_eq!(reply.stream, sid);
        assert_eq!(reply.body["id"], json!(round), "{:?}", reply.body);
        assert!(
            agent.closed_by_peer(),
            "round {round}: then the gateway closes"
        );
        wait_pending(&gw, 0);
    }
}
