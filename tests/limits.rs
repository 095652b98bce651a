//! Named limits at work: the in-flight bound per connection (reading pauses; nothing is
//! read ahead) and the call timeouts (the agent is told which key, the row says error).

mod common;

use common::*;
use serde_json::json;
use std::net::TcpListener;
use std::time::{Duration, Instant};

/// A server that accepts and never answers.
fn silent_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming().flatten() {
            held.push(s);
        }
    });
    port
}

#[test]
fn in_flight_bound_pauses_reading_and_resumes() {
    let port = silent_server();
    let gw = TestGateway::start(&format!(
        "[gateway]\nmax_in_flight_per_connection = 2\ntool_call_timeout_secs = 2\n\n[builtin.http]\nallow = [\"127.0.0.1:{port}\"]\ntimeout_secs = 30\n"
    ));
    let mut c = gw.connect();
    let url = format!("http://127.0.0.1:{port}/");
    for i in 0..2 {
        c.request(
            json!(format!("slow{i}")),
            "tools/call",
            Some(json!({"name": "local__fetch_http", "arguments": {"url": url}})),
        );
    }
    c.request(
        json!("echo"),
        "tools/call",
        Some(json!({"name": "local__echo", "arguments": {"text": "third"}})),
    );
    // Two calls occupy the connection: the third is not even read, so it has no row.
    gw.wait_rows("two rows", |r| r.len() == 2);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        gw.tool_calls().len(),
        2,
        "the third request waits in the socket, unread"
    );
    // When the two time out, reading resumes and the echo is served.
    let mut answers = Vec::new();
    while answers.len() < 3 {
        answers.push(c.recv().expect("answers").body);
    }
    let echo = answers.iter().find(|a| a["id"] == "echo").unwrap();
    assert_eq!(echo["result"]["content"][0]["text"], "third");
    for a in answers.iter().filter(|a| a["id"] != "echo") {
        let err = &a["result"]["structuredContent"]["error"];
        assert_eq!(err["code"], "timeout", "{a}");
        assert!(
            err["message"]
                .as_str()
                .unwrap()
                .contains("gateway.tool_call_timeout_secs"),
            "names the key: {a}"
        );
    }
    let rows = gw.wait_rows("three rows", |r| {
        r.len() == 3 && r.iter().all(|x| !x["duration_us"].is_null())
    });
    let timed_out: Vec<_> = rows
        .iter()
        .filter(|r| r["tool_name"] == "fetch_http")
        .collect();
    assert_eq!(timed_out.len(), 2);
    for r in timed_out {
        assert_eq!(r["decision"], "error");
        assert!(
            r["error_message"].as_str().unwrap().contains("timed out"),
            "{r}"
        );
    }
}

#[test]
fn total_in_flight_bound_holds_other_connections_too() {
    let port = silent_server();
    let gw = TestGateway::start(&format!(
        "[gateway]\nmax_in_flight_total = 3\n# one uid here: its share is the whole total\nmax_in_flight_per_principal = 3\ntool_call_timeout_secs = 2\n\n[builtin.http]\nallow = [\"127.0.0.1:{port}\"]\n"
    ));
    let url = format!("http://127.0.0.1:{port}/");
    let mut a = gw.connect();
    for i in 0..3 {
        a.request(
            json!(i),
            "tools/call",
            Some(json!({"name": "local__fetch_http", "arguments": {"url": url}})),
        );
    }
    gw.wait_rows("three rows", |r| r.len() == 3);
    // Another connection's call waits until the total drops.
    let mut b = gw.connect();
    let started = Instant::now();
    let r = b.tool("local__echo", json!({"text": "later"}));
    assert_eq!(r["result"]["content"][0]["text"], "later");
    let rows = gw.tool_calls();
    let fetches_done = rows
        .iter()
        .filter(|r| r["tool_name"] == "fetch_http" && !r["duration_us"].is_null())
        .count();
    assert!(
        fetches_done >= 1,
        "the echo was read only after a fetch ended (waited {:?})",
        started.elapsed()
    );
}

#[test]
fn a_zero_limit_is_refused_naming_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.toml");
    std::fs::write(
        &path,
        base_config(dir.path(), "[gateway]\nrequest_timeout_secs = 0\n"),
    )
    .unwrap();
    let out = std::process::Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("gateway.request_timeout_secs"));
}

/// An agent that sends a burst of large calls and stops reading: the answers queue in the
/// gateway (the socket is full, so it waits for write readiness), other agents are served
/// meanwhile, and when the agent reads again every answer arrives whole. Requests this
/// large also fill the worker's channel in both directions, so the gateway and the worker
/// wait for write readiness there too.
#[test]
fn answers_wait_for_an_agent_that_stops_reading() {
    let gw = TestGateway::start("");
    let mut slow = gw.connect();
    let calls = 20;
    let text = |i: usize| format!("{i:04}-{}", "x".repeat(200 * 1024));
    for i in 0..calls {
        slow.request(
            json!(i),
            "tools/call",
            Some(json!({"name": "local__echo", "arguments": {"text": text(i)}})),
        );
    }
    // The answers (4 MB) cannot all fit in the socket: most wait in the gateway.
    gw.wait_rows("every call answered", |rows| {
        rows.len() == calls
            && rows
                .iter()
                .all(|r| r["decision"] == "allowed" && !r["duration_us"].is_null())
    });
    let mut other = gw.connect();
    let echo = other.tool("local__echo", json!({"text": "still served"}));
    assert_eq!(echo["result"]["content"][0]["text"], "still served");

    let mut seen = vec![false; calls];
    for _ in 0..calls {
        let reply = slow.recv().expect("every queued answer arrives");
        let i = reply.body["id"].as_u64().expect("numeric id") as usize;
        assert_eq!(
            reply.body["result"]["content"][0]["text"].as_str(),
            Some(text(i).as_str()),
            "answer {i} whole"
        );
        seen[i] = true;
    }
    assert!(seen.iter().all(|s| *s));
}

/// A site that takes connections and never answers; notes when one is closed by its
/// client.
fn silent_site_noting_hang_ups() -> (u16, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    use std::io::Read;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let closed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = std::sync::Arc::clone(&closed);
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let flag = std::sync::Arc::clone(&flag);
            std::thread::spawn(move || {
                let mut sink = [0u8; 4096];
                while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
                flag.store(true, std::sync::atomic::Ordering::SeqCst);
            });
        }
    });
    (port, closed)
}

/// A site that answers every request with `ok` at once and records the paths it was asked.
fn recording_site() -> (u16, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let paths = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = std::sync::Arc::clone(&paths);
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let mut line = String::new();
            let _ = BufReader::new(&s).read_line(&mut line);
            if let Some(path) = line.split(' ').nth(1) {
                seen.lock().unwrap().push(path.to_owned());
            }
            let _ =
                s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
        }
    });
    (port, paths)
}

/// A call cancelled while it waits in the builtin worker's own queue never runs: the
/// worker's one thread is held by a fetch the gateway already gave up on (its slot freed
/// after one more timeout), the next call queues behind it at the worker and is cancelled
/// there; when the thread frees, the cancelled call is skipped (its site is never asked)
/// and its end frees the slot for the next call. Before, the queued call ran anyway.
#[test]
fn a_call_cancelled_in_the_workers_queue_never_runs() {
    let (slow, given_up) = silent_site_noting_hang_ups();
    let (site, paths) = recording_site();
    let gw = TestGateway::start(&format!(
        "[gateway]\ntool_call_timeout_secs = 2\n\n[builtin]\nthreads = 1\nqueue = 4\n\n\
         [builtin.http]\nallow = [\"127.0.0.1:{slow}\", \"127.0.0.1:{site}\"]\ntimeout_secs = 8\n"
    ));
    let mut c = gw.connect();
    let fetch = |url: String| json!({"name": "local__fetch_http", "arguments": {"url": url}});
    // The worker's thread is held by a fetch of a site that never answers (8 s).
    let first = c.request(
        json!("held"),
        "tools/call",
        Some(fetch(format!("http://127.0.0.1:{slow}/"))),
    );
    let r = c.recv().expect("the held call times out at the gateway");
    assert_eq!(r.stream, first);
    // Its slot stays taken one more timeout (2 s), then the next call goes to the worker,
    // which queues it behind the busy thread.
    std::thread::sleep(Duration::from_secs(3));
    c.request(
        json!("queued"),
        "tools/call",
        Some(fetch(format!("http://127.0.0.1:{site}/queued"))),
    );
    std::thread::sleep(Duration::from_millis(500));
    c.notify(
        "notifications/cancelled",
        Some(json!({"requestId": "queued", "reason": "not any more"})),
    );
    gw.wait_rows("the queued call cancelled", |rows| {
        rows.iter().any(|r| {
            r["decision"] == "cancelled"
                && r["error_message"]
                    .as_str()
                    .is_some_and(|m| m.contains("not any more"))
        })
    });
    // The thread gives up on the silent site (builtin.http.timeout_secs) and takes the
    // next job from its queue: the cancelled one, which it would run at once.
    let deadline = std::time::Instant::now() + PATIENCE;
    while !given_up.load(std::sync::atomic::Ordering::SeqCst) {
        assert!(
            std::time::Instant::now() < deadline,
            "the fetch never ended"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(1));
    // The next call goes once the worker says the cancelled one ended, and is served.
    let next = c.request(
        json!("next"),
        "tools/call",
        Some(fetch(format!("http://127.0.0.1:{site}/next"))),
    );
    let r = loop {
        let r = c.recv().expect("the next call is answered");
        if r.stream == next {
            break r;
        }
    };
    assert_ne!(r.body["result"]["isError"], json!(true), "{}", r.body);
    assert_eq!(
        *paths.lock().unwrap(),
        vec!["/next".to_owned()],
        "the cancelled call never reached its site"
    );
}
