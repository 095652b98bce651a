//! Cancellation over HTTP against the real binary: a legacy-era `notifications/cancelled`
//! finds its call from any connection of the same session (and only of that session); a
//! call of either era is cancelled when its client closes the connection. Either way the call
//! leaves the approval queue or its worker is told, nobody is answered, and the ledger row
//! says `cancelled`.

mod common;

use common::PATIENCE;
use common::http::{HttpGateway, LEGACY, echo_in_session, modern, open_session};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const ASK_ECHO: &str = r#"
[[policy.rules]]
id = "ask-echo"
action = "ask"
tool = "local__echo"
reason = "a human looks at every echo"
"#;

fn pending(gw: &HttpGateway) -> Vec<Value> {
    let out = gw.cli(&["approvals", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("approvals --json");
    v["pending"].as_array().cloned().unwrap_or_default()
}

fn wait_pending(gw: &HttpGateway, n: usize) {
    let deadline = Instant::now() + PATIENCE;
    while pending(gw).len() != n {
        assert!(Instant::now() < deadline, "never {n} calls pending");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn cancel(id: Value) -> Value {
    json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
           "params": {"requestId": id, "reason": "the user pressed stop"}})
}

#[test]
fn a_legacy_cancel_from_another_connection_of_the_session_cancels_the_call() {
    let gw = HttpGateway::start("", ASK_ECHO);
    let token = gw.client_token("alice");
    let mut first = gw.http();
    let session = open_session(&mut first, gw.port, Some(&token));
    first.send(&echo_in_session(gw.port, 7, &session, "cancel me").bearer(&token));
    wait_pending(&gw, 1);

    // Another principal's session, and the right session with the wrong id, cancel nothing.
    let bob = gw.client_token("bob");
    let mut other = gw.http();
    let bob_session = open_session(&mut other, gw.port, Some(&bob));
    let r = other.call(
        &gw.post(&cancel(json!(7)))
            .bearer(&bob)
            .session(&bob_session)
            .header("MCP-Protocol-Version", LEGACY),
    );
    assert_eq!(r.status, 202);
    let mut second = gw.http();
    let r = second.call(
        &gw.post(&cancel(json!(8)))
            .bearer(&token)
            .session(&session)
            .header("MCP-Protocol-Version", LEGACY),
    );
    assert_eq!(r.status, 202);
    assert_eq!(
        pending(&gw).len(),
        1,
        "only the session's own cancel counts"
    );

    // The cancel, on a second connection of the same session.
    let r = second.call(
        &gw.post(&cancel(json!(7)))
            .bearer(&token)
            .session(&session)
            .header("MCP-Protocol-Version", LEGACY),
    );
    assert_eq!(r.status, 202, "{}", r.text());
    wait_pending(&gw, 0);
    // No answer is sent for a cancelled request: its event stream ends without one.
    first.assert_stream_ends_without_answer();
    let rows = gw.wait_rows("a cancelled row", |rows| {
        rows.len() == 1 && rows[0]["decision"] == "cancelled"
    });
    assert!(
        rows[0]["error_message"]
            .as_str()
            .unwrap()
            .contains("the user pressed stop"),
        "{}",
        rows[0]
    );
    let events = gw.events("cancelled");
    assert!(
        events
            .iter()
            .any(|e| e["detail"].as_str().unwrap().contains("\"found\":true")),
        "{events:?}"
    );
    // The session goes on: the next call is held, approved and answered.
    second.send(&echo_in_session(gw.port, 9, &session, "next").bearer(&token));
    wait_pending(&gw, 1);
    let id = pending(&gw)[0]["id"].to_string();
    assert!(gw.cli(&["approve", &id]).status.success());
    let r = second.response().expect("the next call is answered");
    assert_eq!(common::http::result_text(&r.json()), "next");
}

#[test]
fn a_modern_call_is_cancelled_when_its_client_closes_the_connection() {
    let gw = HttpGateway::start("", ASK_ECHO);
    let token = gw.client_token("alice");
    let mut http = gw.http();
    http.send(
        &modern(
            gw.port,
            3,
            "tools/call",
            json!({"name": "local__echo", "arguments": {"text": "walk away"}}),
            Some("local__echo"),
        )
        .bearer(&token),
    );
    wait_pending(&gw, 1);
    drop(http);
    wait_pending(&gw, 0);
    let rows = gw.wait_rows("a cancelled row", |rows| {
        rows.len() == 1 && rows[0]["decision"] == "cancelled"
    });
    assert!(
        rows[0]["error_message"]
            .as_str()
            .unwrap()
            .contains("closed the connection"),
        "{}",
        rows[0]
    );
}

#[test]
fn a_legacy_held_call_ends_with_its_connection() {
    // Legacy era: a call held for approval has nobody left to answer once its client
    // closes: it ends as cancelled and can no longer be approved (an approval would run
    // the tool for an answer nobody gets).
    let gw = HttpGateway::start("", ASK_ECHO);
    let token = gw.client_token("alice");
    let mut http = gw.http();
    let session = open_session(&mut http, gw.port, Some(&token));
    http.send(&echo_in_session(gw.port, 5, &session, "still here").bearer(&token));
    wait_pending(&gw, 1);
    let p = pending(&gw);
    drop(http);
    wait_pending(&gw, 0);
    let out = gw.cli(&["approve", &p[0]["id"].to_string()]);
    assert!(!out.status.success(), "approved after its agent left");
    gw.wait_rows("a cancelled row", |rows| {
        rows.len() == 1 && rows[0]["decision"] == "cancelled"
    });
}

/// A local HTTP server that takes every connection and answers nothing for `hold`; counts
/// the connections it got.
fn slow_site(hold: Duration) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&hits);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(s) = stream else { continue };
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::thread::spawn(move || {
                std::thread::sleep(hold);
                drop(s);
            });
        }
    });
    (port, hits)
}

#[test]
fn a_legacy_cancel_reaches_a_call_already_at_its_worker() {
    let (site, hits) = slow_site(Duration::from_secs(15));
    let gw = HttpGateway::start(
        "",
        &format!("[builtin.http]\nallow = [\"127.0.0.1:{site}\"]\ntimeout_secs = 30\n"),
    );
    let token = gw.client_token("alice");
    let mut first = gw.http();
    let session = open_session(&mut first, gw.port, Some(&token));
    let call = json!({"jsonrpc": "2.0", "id": "slow-1", "method": "tools/call",
                      "params": {"name": "local__fetch_http",
                                 "arguments": {"url": format!("http://127.0.0.1:{site}/slow")}}});
    first.send(
        &gw.post(&call)
            .bearer(&token)
            .session(&session)
            .header("MCP-Protocol-Version", LEGACY),
    );
    // The tool is working on it: the site got its connection.
    let deadline = Instant::now() + PATIENCE;
    while hits.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "the fetch never reached the site"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let started = Instant::now();
    let mut second = gw.http();
    let r = second.call(
        &gw.post(&cancel(json!("slow-1")))
            .bearer(&token)
            .session(&session)
            .header("MCP-Protocol-Version", LEGACY),
    );
    assert_eq!(r.status, 202);
    first.assert_stream_ends_without_answer();
    let rows = gw.wait_rows("a cancelled row", |rows| {
        rows.iter().any(|r| r["decision"] == "cancelled")
    });
    eprintln!(
        "CANCEL at the worker: row cancelled {:?} after the cancel was sent (the site holds the fetch 15 s)",
        started.elapsed()
    );
    assert_eq!(rows.len(), 1, "{rows:?}");
    // The door serves the session on.
    let r = second.call(&echo_in_session(gw.port, 2, &session, "on").bearer(&token));
    assert_eq!(common::http::result_text(&r.json()), "on");
}

/// A client that closes its connection while its call is at the worker has hung up, in
/// either era: the gateway sees only the end of its input (a FIN) until a write fails, and
/// treats that as the hang-up it is (as proxies do): the call is cancelled at once, the
/// worker told and the row `cancelled`. Before, a legacy-era call ran on until its answer
/// found the connection gone (here: the site holds the fetch 60 s).
#[test]
fn a_client_that_closes_while_its_call_runs_cancels_it_at_once() {
    let (site, hits) = slow_site(Duration::from_secs(60));
    let gw = HttpGateway::start(
        "",
        &format!("[builtin.http]\nallow = [\"127.0.0.1:{site}\"]\ntimeout_secs = 60\n"),
    );
    let token = gw.client_token("alice");
    let mut http = gw.http();
    let session = open_session(&mut http, gw.port, Some(&token));
    let call = json!({"jsonrpc": "2.0", "id": "walk-away", "method": "tools/call",
                      "params": {"name": "local__fetch_http",
                                 "arguments": {"url": format!("http://127.0.0.1:{site}/slow")}}});
    http.send(
        &gw.post(&call)
            .bearer(&token)
            .session(&session)
            .header("MCP-Protocol-Version", LEGACY),
    );
    let deadline = Instant::now() + PATIENCE;
    while hits.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "the fetch never reached the site"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(http);
    let rows = gw.wait_rows("a cancelled row", |rows| {
        rows.iter().any(|r| r["decision"] == "cancelled")
    });
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(
        rows[0]["error_message"]
            .as_str()
            .unwrap_or_default()
            .contains("closed the connection"),
        "{}",
        rows[0]
    );
}
