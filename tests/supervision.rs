//! Worker supervision and crash safety: a worker killed mid-call, a gateway killed under
//! load, a graceful stop. Real processes, real signals, the real ledger.

mod common;

use common::*;
use serde_json::json;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

/// An HTTP server on 127.0.0.1 that answers after `delay`.
fn slow_server(delay: Duration) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                std::thread::sleep(delay);
                let body = "slow body";
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    port
}

fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn worker_killed_mid_call_fails_the_call_and_comes_back() {
    let port = slow_server(Duration::from_secs(30));
    let gw = TestGateway::start(&format!("[builtin.http]\nallow = [\"127.0.0.1:{port}\"]\n"));
    let mut c = gw.connect();
    let pid = gw.worker_pid();
    let url = format!("http://127.0.0.1:{port}/");
    let sid = c.request(
        json!("slow"),
        "tools/call",
        Some(json!({"name": "local__fetch_http", "arguments": {"url": url}})),
    );
    // The row exists before the tool is reached.
    gw.wait_rows("the pending row", |r| r.len() == 1);
    unsafe {
        libc::kill(pid as i32, libc::SIGKILL);
    }
    let r = c.recv().expect("an answer, not silence");
    assert_eq!(r.stream, sid);
    assert_eq!(r.body["result"]["isError"], true, "{}", r.body);
    let err = &r.body["result"]["structuredContent"]["error"];
    assert_eq!(err["code"], "worker_unavailable");
    assert!(
        err["message"].as_str().unwrap().contains("builtin"),
        "names the worker: {err}"
    );
    let rows = gw.wait_rows("the row ends in error", |r| r[0]["decision"] == "error");
    assert!(
        rows[0]["error_message"]
            .as_str()
            .unwrap()
            .contains("builtin")
    );
    // It comes back, with a new pid, and the next call works.
    wait_until("a restarted worker", || {
        let s = gw.admin(json!({"op": "status"}));
        s["workers"][0]["state"] == "ready" && s["workers"][0]["pid"] != json!(pid)
    });
    let r = c.tool("local__echo", json!({"text": "back"}));
    assert_eq!(r["result"]["content"][0]["text"], "back");
    assert!(!gw.events("worker_exit").is_empty());
    assert!(gw.events("worker_start").len() >= 2);
    // No zombie: the old pid is gone from /proc (reaped).
    wait_until("the old worker reaped", || {
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
    });
}

#[test]
fn gateway_killed_under_load_every_received_answer_has_its_row() {
    let mut gw = TestGateway::start("");
    let sock = gw.sock.clone();
    let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let sock = sock.clone();
            let received = std::sync::Arc::clone(&received);
            std::thread::spawn(move || {
                let mut c = FramedClient::connect(&sock);
                for i in 0..100_000 {
                    let text = format!("k{t}-{i}");
                    c.request(
                        json!(text.clone()),
                        "tools/call",
                        Some(json!({"name": "local__echo", "arguments": {"text": text}})),
                    );
                    match c.recv() {
                        Some(r) if r.body["result"]["content"][0]["text"] == json!(text) => {
                            received.lock().unwrap().push(text);
                        }
                        _ => return,
                    }
                }
            })
        })
        .collect();
    wait_until("some load", || received.lock().unwrap().len() > 500);
    let mut child = gw.child.take().unwrap();
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    for t in threads {
        t.join().unwrap();
    }
    let received = received.lock().unwrap().clone();
    let ledger = gw.ledger();
    let mut stmt = ledger
        .prepare("SELECT count(*) FROM tool_calls WHERE request_id = ?1 AND decision = 'allowed' AND duration_us IS NOT NULL")
        .unwrap();
    for text in &received {
        let id = json!(text).to_string();
        let n: i64 = stmt.query_row([&id], |r| r.get(0)).unwrap();
        assert_eq!(n, 1, "answer {text} has its committed row");
    }
}

#[test]
fn sigterm_drains_and_exits_zero_with_no_worker_left() {
    let port = slow_server(Duration::from_millis(1500));
    let mut gw = TestGateway::start(&format!("[builtin.http]\nallow = [\"127.0.0.1:{port}\"]\n"));
    let worker = gw.worker_pid();
    let mut c = gw.connect();
    let url = format!("http://127.0.0.1:{port}/");
    c.request(
        json!("slow"),
        "tools/call",
        Some(json!({"name": "local__fetch_http", "arguments": {"url": url, "format": "raw"}})),
    );
    gw.wait_rows("the pending row", |r| r.len() == 1);
    let status = gw.terminate();
    assert!(status.success(), "exit 0: {status:?}\n{}", gw.log());
    // The call in flight was finished, not cut.
    let r = c.recv().expect("the in-flight call is answered");
    assert!(
        r.body["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or("")
            .contains("slow body"),
        "{}",
        r.body
    );
    assert!(
        !std::path::Path::new(&format!("/proc/{worker}")).exists(),
        "no worker left"
    );
    assert!(!gw.sock.exists(), "socket file removed");
    let rows = gw.tool_calls();
    assert_eq!(rows[0]["decision"], "allowed");
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

#[test]
fn worker_restarts_leak_no_fd_and_leave_no_zombie() {
    let gw = TestGateway::start("");
    let mut c = gw.connect();
    c.tool("local__echo", json!({"text": "warm"}));
    let before = open_fds(gw.pid());
    for round in 0..3 {
        let pid = gw.worker_pid();
        unsafe {
            libc::kill(pid as i32, libc::SIGKILL);
        }
        wait_until("a restarted worker", || {
            let s = gw.admin(json!({"op": "status"}));
            s["workers"][0]["state"] == "ready" && s["workers"][0]["pid"] != json!(pid)
        });
        wait_until("the old worker reaped", || {
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
        });
        let r = c.tool("local__echo", json!({"text": format!("round {round}")}));
        assert_eq!(r["result"]["content"][0]["text"], format!("round {round}"));
    }
    // The admin connections of wait_until are closed by now; allow the loop a turn.
    wait_until("fds back to where they were", || {
        open_fds(gw.pid()) == before
    });
    let status = gw.admin(json!({"op": "status"}));
    assert_eq!(status["workers"][0]["restarts"], 3);
}

#[test]
fn a_second_sigterm_stops_at_once_keeping_committed_rows() {
    let port = slow_server(Duration::from_secs(60));
    let mut gw = TestGateway::start(&format!(
        "[gateway]\ndrain_secs = 60\n\n[builtin.http]\nallow = [\"127.0.0.1:{port}\"]\n"
    ));
    let mut c = gw.connect();
    let url = format!("http://127.0.0.1:{port}/");
    c.request(
        json!("slow"),
        "tools/call",
        Some(json!({"name": "local__fetch_http", "arguments": {"url": url}})),
    );
    gw.wait_rows("the pending row", |r| r.len() == 1);
    let mut child = gw.child.take().unwrap();
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    gw.wait_for_log("stopping:");
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    // Well before the 60 s drain: the second signal does not wait for the call.
    let status = wait_timeout(&mut child, PATIENCE).expect("exits on the second SIGTERM");
    assert!(status.success());
    let r = c
        .recv()
        .expect("the call in flight is answered, not dropped");
    assert_eq!(
        r.body["result"]["structuredContent"]["error"]["code"],
        "shutting_down"
    );
    let rows = gw.tool_calls();
    assert_eq!(rows[0]["decision"], "error");
    assert!(
        rows[0]["error_message"]
            .as_str()
            .unwrap()
            .contains("stopping")
    );
}
