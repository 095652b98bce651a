//! Fair sharing between principals, against the real binary: one principal that pipelines
//! large calls and never reads its answers is held to its share of the bytes in flight
//! (`gateway.max_bytes_in_flight_per_principal`) while another principal is served, and a
//! connection that hangs up takes its calls with it.

mod common;

use common::http::{HttpGateway, modern};
use serde_json::{Value, json};
use std::io::Write;

const BYTES_KEY: &str = "gateway.max_bytes_in_flight_per_principal";

#[test]
fn a_principal_that_never_reads_is_held_to_its_byte_share_while_another_is_served() {
    let gw = HttpGateway::start(
        "",
        "[gateway]\nmax_bytes_in_flight_per_principal = 4000000\n",
    );
    let bob = gw.client_token("bob");
    // The hog (uid 0 on the framed socket) pipelines 40 echo calls of 400 KB (16 MB) and
    // reads nothing until it has sent them all.
    let mut hog = gw.connect();
    let mut writer = hog.stream.try_clone().expect("clone");
    let text = "h".repeat(400_000);
    let calls = 40u64;
    let sender = std::thread::spawn(move || {
        let mut out = Vec::new();
        for i in 0..calls {
            let msg = json!({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                "params": {"name": "local__echo", "arguments": {"text": text}}});
            out.clear();
            toolwall_relay::frame::encode(
                &mut out,
                i as u32 + 1,
                0,
                "hog",
                msg.to_string().as_bytes(),
            )
            .expect("encode");
            if writer.write_all(&out).is_err() {
                return false;
            }
        }
        true
    });
    // Another principal is served while the hog holds its share.
    let mut http = gw.http();
    let req = modern(
        gw.port,
        1,
        "tools/call",
        json!({"name": "local__echo", "arguments": {"text": "bob is served"}}),
        Some("local__echo"),
    )
    .bearer(&bob);
    http.send(&req);
    let r = http.response().expect("bob is answered");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("bob is served"), "{}", r.text());
    // Now the hog reads: some calls were answered, the rest refused naming the key.
    let (mut answered, mut refused) = (0, 0);
    for _ in 0..calls {
        let reply = hog
            .recv()
            .expect("every call of the hog is answered or refused");
        if reply.body["error"]["data"]["limit"] == BYTES_KEY {
            let message = reply.body["error"]["message"].as_str().unwrap_or_default();
            assert!(message.contains(BYTES_KEY), "{}", reply.body);
            refused += 1;
        } else {
            assert!(
                reply.body["result"].to_string().contains("hhhh"),
                "{}",
                &reply.body.to_string()[..200.min(reply.body.to_string().len())]
            );
            answered += 1;
        }
    }
    assert!(sender.join().unwrap(), "the hog could send every call");
    assert!(answered > 0, "calls within the share run");
    assert!(
        refused > 0,
        "calls beyond 4 MB of unread answers and requests are refused ({answered} answered)"
    );
}

// ---- an upstream server's pool ---------------------------------------------------------------

/// `tests/fixtures/hostile_upstream.py` over HTTP, steered through POST /control.
struct Upstream {
    child: std::process::Child,
    port: u16,
}

impl Upstream {
    fn start() -> Upstream {
        use std::io::BufRead;
        let mut child = std::process::Command::new("python3")
            .arg(
                std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join("tests/fixtures/hostile_upstream.py"),
            )
            .args(["--port", "0"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("python3 runs the fixture");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .strip_prefix("PORT ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("fixture said {line:?}"));
        Upstream { child, port }
    }

    fn control(&self, body: Value) -> Value {
        use std::io::Read;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).expect("control");
        s.set_read_timeout(Some(common::PATIENCE)).unwrap();
        let body = body.to_string();
        write!(
            s,
            "POST /control HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let (_, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
        serde_json::from_str(body).expect("control answers JSON")
    }

    /// tools/call requests the server has received.
    fn calls(&self) -> u64 {
        self.control(json!({"action": "counts"}))["counts"]["tools/call"]
            .as_u64()
            .unwrap_or(0)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_listed(gw: &HttpGateway, tool: &str) {
    let deadline = std::time::Instant::now() + common::PATIENCE;
    let mut c = gw.connect();
    loop {
        let v = c.call("tools/list", json!({}));
        if v.to_string().contains(tool) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{tool} never listed");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A gateway whose server `fx` takes a second per call, with a pool of one thread and a
/// queue of nine.
fn slow_pool() -> (Upstream, HttpGateway) {
    let up = Upstream::start();
    up.control(json!({"action": "set", "call_delay": 1.0}));
    let gw = HttpGateway::start(
        "",
        &format!(
            "[servers]\nrefresh_secs = 0\nthreads = 1\nqueue = 9\n\n[servers.fx]\nurl = \"http://127.0.0.1:{}/mcp\"\n",
            up.port
        ),
    );
    wait_listed(&gw, "fx__search");
    (up, gw)
}

#[test]
fn another_principal_goes_next_in_an_upstream_pool_however_many_calls_one_queued() {
    const SHARE_KEY: &str = "gateway.pool_share_percent";
    let (up, gw) = slow_pool();
    let bob = gw.client_token("bob");
    // The hog (uid 0) asks for six calls: its share is half of the ten seats, so five run
    // or wait and the sixth is refused naming the key.
    let mut hog = gw.connect();
    let search = json!({"name": "fx__search", "arguments": {"q": "hog"}});
    let streams: Vec<u32> = (0..6)
        .map(|i| hog.request(json!(i), "tools/call", Some(search.clone())))
        .collect();
    let refused = hog.recv().expect("the sixth call is refused at once");
    assert_eq!(refused.stream, streams[5], "{}", refused.body);
    assert!(
        refused.body.to_string().contains(SHARE_KEY),
        "{}",
        refused.body
    );
    // Refused before any row: a hog that retries cannot fill the ledger with refusals.
    assert_eq!(refused.body["error"]["data"]["limit"], SHARE_KEY);
    let hog_rows = gw
        .tool_calls()
        .iter()
        .filter(|r| r["principal"] == "uid:0")
        .count();
    assert_eq!(hog_rows, 5, "the refusal is counted, not recorded");
    // Bob's call waits one turn, not behind the hog's four waiting calls.
    let mut http = gw.http();
    http.send(
        &modern(
            gw.port,
            1,
            "tools/call",
            json!({"name": "fx__search", "arguments": {"q": "bob"}}),
            Some("fx__search"),
        )
        .bearer(&bob),
    );
    let r = http.response().expect("bob is answered");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("called search"), "{}", r.text());
    let reached = up.calls();
    assert!(
        reached < 6,
        "bob's call went before the hog's waiting calls ({reached} calls reached the server)"
    );
}

#[test]
fn a_hang_up_cancels_its_calls_and_the_waiting_ones_never_start() {
    let (up, gw) = slow_pool();
    let mut hog = gw.connect();
    let search = json!({"name": "fx__search", "arguments": {"q": "hog"}});
    for i in 0..4 {
        hog.request(json!(i), "tools/call", Some(search.clone()));
    }
    // One runs upstream, three wait; then the hog hangs up.
    let deadline = std::time::Instant::now() + common::PATIENCE;
    while up.calls() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no call reached the server"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    drop(hog);
    let rows = gw.wait_rows("every hog call ended", |rows| {
        rows.len() == 4 && rows.iter().all(|r| !r["duration_us"].is_null())
    });
    // Time for a call that would still start to reach the server.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let reached = up.calls();
    let cancelled = rows.iter().filter(|r| r["decision"] == "cancelled").count();
    assert_eq!(
        cancelled, 4,
        "every unanswered call ends cancelled: {rows:#?}"
    );
    assert!(
        reached <= 2,
        "calls waiting when the hog hung up never reached the server ({reached} did)"
    );
}

/// A workspace worker's file-tool threads are shared fairly too: one principal (uid 0 on
/// the framed socket) floods `file_search` over a large tree; another (`bob`, over HTTP)
/// asks for `file_list` meanwhile and is served once a thread frees, not told `busy`.
/// Before, workspace calls bypassed the lanes: the hog's calls filled the worker's one
/// thread and its queue, and bob's call was refused by the worker.
#[test]
fn another_principal_is_served_by_a_workspace_one_principal_floods() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = std::fs::canonicalize(dir.path())
        .expect("canonical")
        .join("ws");
    std::fs::create_dir_all(&root).expect("mkdir");
    // Files of many short lines: a search reads each line through the pattern, which
    // keeps a thread busy for seconds (up to scan_time_limit_ms, checked between files).
    let lines = "a\n".repeat(1024 * 1024);
    for n in 0..12 {
        std::fs::write(root.join(format!("f{n}.txt")), &lines).expect("write");
    }
    common::give_to_agent(&root);
    let gw = HttpGateway::start_in(
        dir,
        "",
        &format!(
            "[workspaces.shared]\nroot = \"{}\"\nowners = [\"uid:0\", \"bob\"]\nthreads = 1\nqueue = 1\nscan_time_limit_ms = 4000\n",
            root.display()
        ),
    );
    wait_listed(&gw, "ws__file_search");
    let bob = gw.client_token("bob");
    let mut hog = gw.connect();
    let search = json!({"name": "ws__file_search",
                        "arguments": {"worker": "shared", "pattern": "zzz"}});
    for i in 0..3 {
        hog.request(json!(i), "tools/call", Some(search.clone()));
    }
    // The hog's first search holds the thread.
    gw.wait_rows("the hog's calls recorded", |rows| {
        rows.iter().filter(|r| r["principal"] == "uid:0").count() >= 2
    });
    let mut http = gw.http();
    http.send(
        &modern(
            gw.port,
            1,
            "tools/call",
            json!({"name": "ws__file_list", "arguments": {"worker": "shared", "path": "."}}),
            Some("ws__file_list"),
        )
        .bearer(&bob),
    );
    let r = http.response().expect("bob is answered");
    assert_eq!(r.status, 200, "{}", r.text());
    let answer: Value = r.answer();
    assert_ne!(
        answer["result"]["isError"],
        json!(true),
        "bob's call is served, not refused: {answer}"
    );
    assert!(answer.to_string().contains("f0.txt"), "{answer}");
    // The hog held its share (half of one thread and a queue of one): its other two
    // searches were refused naming the key.
    let refused = (0..3)
        .filter_map(|_| hog.recv())
        .filter(|r| r.body.to_string().contains("gateway.pool_share_percent"))
        .count();
    assert_eq!(refused, 2);
}
