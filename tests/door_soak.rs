//! A soak of good and hostile clients together against the real binary, for a bounded time
//! (`TOOLWALL_SOAK_SECS`, default 20; longer by hand): good agents on the HTTP door (legacy
//! and modern era) and the framed socket call `local__echo` in loops while hostile ones
//! come and go — silent, slow heads, bad tokens with large bodies, 2 MiB bodies, half
//! frames, garbage. Every good call must be answered correctly, every answer must have its
//! committed ledger row, no seat may be left taken, and the gateway's memory must come back
//! near where it started.

mod common;

use common::PATIENCE;
use common::flood::{mib, rss};
use common::http::{HttpGateway, Req, echo_in_session, modern, open_session, result_text};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

fn soak_secs() -> u64 {
    std::env::var("TOOLWALL_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20)
}

/// Run `f` in a loop on its own thread until `stop`.
fn spawn_loop(
    stop: &Arc<AtomicBool>,
    mut f: impl FnMut(u64) + Send + 'static,
) -> std::thread::JoinHandle<()> {
    let stop = Arc::clone(stop);
    std::thread::spawn(move || {
        let mut n = 0;
        while !stop.load(Ordering::Relaxed) {
            f(n);
            n += 1;
        }
    })
}

fn connect(port: u16) -> Option<TcpStream> {
    let s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    Some(s)
}

/// Read whatever comes until EOF, an error or the read timeout.
fn drain(s: &mut impl Read) {
    let mut sink = [0u8; 65536];
    while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
}

#[test]
fn good_calls_are_all_answered_among_hostile_clients_and_memory_comes_back() {
    let gw = HttpGateway::start(
        "",
        "[http]\nmax_connections = 48\naccept_timeout_secs = 2\nhead_timeout_secs = 2\n\
         body_timeout_secs = 3\n\n[gateway]\nmax_connections = 128\nmax_connections_per_peer = 64\n\
         accept_timeout_secs = 2\nframe_timeout_secs = 2\nlinger_secs = 1\n",
    );
    let port = gw.port;
    let good_token = Arc::new(gw.client_token("good"));
    let bad_token = "twt_this-token-does-not-exist-but-has-the-right-length-00";
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();

    // Good agents first, on connections they keep: two legacy and two modern HTTP
    // clients, four framed ones.
    for t in 0..4u64 {
        let token = Arc::clone(&good_token);
        let answered = Arc::clone(&answered);
        let mut http = common::http::Http::connect(port);
        let session = (t % 2 == 0).then(|| open_session(&mut http, port, Some(&token)));
        threads.push(spawn_loop(&stop, move |n| {
            let text = format!("good-http-{t}-{n}");
            let req = match &session {
                Some(s) => echo_in_session(port, n + 10, s, &text),
                None => modern(
                    port,
                    n + 10,
                    "tools/call",
                    json!({"name": "local__echo", "arguments": {"text": text}}),
                    Some("local__echo"),
                ),
            };
            let r = http.call(&req.bearer(&token));
            assert_eq!(r.status, 200, "{}", r.text());
            assert_eq!(result_text(&r.json()), text);
            answered.fetch_add(1, Ordering::Relaxed);
        }));
    }
    for t in 0..4u64 {
        let answered = Arc::clone(&answered);
        let mut c = gw.connect();
        threads.push(spawn_loop(&stop, move |n| {
            let text = format!("good-framed-{t}-{n}");
            let r = c.tool("local__echo", json!({"text": text}));
            assert_eq!(r["result"]["content"][0]["text"], text, "{r}");
            answered.fetch_add(1, Ordering::Relaxed);
        }));
    }
    std::thread::sleep(Duration::from_secs(1));
    let baseline = rss(gw.pid());

    // Hostile clients: three threads of each kind, one connection at a time each.
    let head = format!("POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Slow: ");
    let bad = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {bad_token}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Expect: 100-continue\r\nContent-Length: 1048576\r\n\r\n"
    );
    let big = Arc::new(
        Req::post_mcp(port, &json!({}))
            .bearer(&good_token)
            .body(vec![b' '; 2 * 1024 * 1024])
            .bytes(),
    );
    let mut partial = Vec::new();
    toolwall_relay::frame::encode(&mut partial, 1, 0, "x", &[b' '; 4096]).unwrap();
    partial.truncate(100);
    for _ in 0..3 {
        threads.push(spawn_loop(&stop, move |n| {
            // Silent: held a while, then dropped (or closed by the door).
            if let Some(mut s) = connect(port) {
                if n % 3 == 0 {
                    drain(&mut s);
                } else {
                    std::thread::sleep(Duration::from_millis(300));
                }
            }
        }));
        let head = head.clone();
        threads.push(spawn_loop(&stop, move |_| {
            // A slow head, a byte every 100 ms until the door cuts it off.
            if let Some(mut s) = connect(port) {
                let _ = s.write_all(head.as_bytes());
                s.set_nonblocking(true).unwrap();
                for _ in 0..40 {
                    if s.write_all(b"a").is_err() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }));
        let bad = bad.clone();
        threads.push(spawn_loop(&stop, move |_| {
            // A bad token with a large body sent anyway.
            if let Some(mut s) = connect(port) {
                let _ = s.write_all(bad.as_bytes());
                let _ = s.write_all(&[b' '; 65536]);
                drain(&mut s);
            }
        }));
        let big = Arc::clone(&big);
        threads.push(spawn_loop(&stop, move |_| {
            // 2 MiB that the door refuses with 413.
            if let Some(mut s) = connect(port) {
                let _ = s.write_all(&big);
                drain(&mut s);
            }
        }));
        let sock = gw.sock.clone();
        let partial = partial.clone();
        threads.push(spawn_loop(&stop, move |n| {
            // Framed: silent, half a frame, or garbage.
            if let Ok(mut s) = UnixStream::connect(&sock) {
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                match n % 3 {
                    0 => std::thread::sleep(Duration::from_millis(300)),
                    1 => {
                        let _ = s.write_all(&partial);
                        drain(&mut s);
                    }
                    _ => {
                        let _ = s.write_all(&[0xff; 64]);
                        drain(&mut s);
                    }
                }
            }
        }));
    }

    let secs = soak_secs();
    let mut peak = baseline;
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(500));
        let now = rss(gw.pid());
        if now.now_kib > peak.now_kib {
            peak = now;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("a client thread failed");
    }
    let total = answered.load(Ordering::Relaxed);
    assert!(total > 0);

    // Every answer has its committed row.
    let rows: Vec<Value> = common::query_json(
        &gw.ledger(),
        "SELECT arguments, decision FROM tool_calls WHERE arguments LIKE '%good-%'",
    );
    let allowed = rows.iter().filter(|r| r["decision"] == "allowed").count() as u64;
    assert_eq!(allowed, total, "every good answer has its allowed row");

    // Every connection ends (the hostile ones within their deadlines): no seat is left
    // taken but the status request's own.
    let deadline = Instant::now() + PATIENCE;
    let seats = loop {
        let status = gw.admin(json!({"op": "status"}));
        let s = status["seats"].clone();
        // The good clients' connections closed with their threads too.
        if s["lingering"]["taken"] == 0 && s["http"]["taken"] == 0 && s["framed"]["taken"] == 0 {
            break s;
        }
        assert!(Instant::now() < deadline, "seats never came back: {s}");
        std::thread::sleep(Duration::from_millis(200));
    };
    std::thread::sleep(Duration::from_secs(2));
    let after = rss(gw.pid());
    eprintln!(
        "SOAK {secs} s: {total} good calls answered and committed; gateway RSS {:.1} MiB at the start, \
         {:.1} MiB at its highest, {:.1} MiB after (peak since start {:.1} MiB); seats after: {seats}",
        mib(baseline.now_kib),
        mib(peak.now_kib),
        mib(after.now_kib),
        mib(after.peak_kib),
    );
    assert!(
        after.now_kib <= baseline.now_kib + 8 * 1024,
        "memory did not come back: {} KiB at the start, {} KiB after",
        baseline.now_kib,
        after.now_kib
    );
}
