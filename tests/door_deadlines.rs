//! Stage deadlines the floods do not reach, against the real binary: a framed connection
//! idle too long is closed while pings or a call in flight keep another alive; a reader
//! that stops reading is closed at the write stall; the admin socket's own reserve and
//! deadline. Each close is counted in `/metrics`. A connection cut off or displaced is
//! told why in its own protocol, naming the limit that applied.

mod common;

use common::flood::{Ended, wait_end};
use common::http::{HttpGateway, Req};
use common::{FramedClient, PATIENCE};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

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

#[test]
fn idle_framed_connections_close_but_pings_and_calls_in_flight_keep_them() {
    let gw = HttpGateway::start(
        "",
        r#"
[gateway]
idle_timeout_secs = 2

[[policy.rules]]
id = "ask-echo"
action = "ask"
tool = "local__echo"
"#,
    );
    // Quiet after one exchange: closed.
    let mut quiet = gw.connect();
    assert_eq!(quiet.call("ping", json!({}))["result"], json!({}));
    // A held call keeps its connection alive past the idle deadline.
    let mut busy = gw.connect();
    let sid = busy.request(
        json!("held"),
        "tools/call",
        Some(json!({"name": "local__echo", "arguments": {"text": "wait"}})),
    );
    // Pings every half second keep this one alive.
    let mut pinging = gw.connect();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        assert_eq!(pinging.call("ping", json!({}))["result"], json!({}));
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(quiet.closed_by_peer(), "an idle connection is closed");
    assert_eq!(pinging.call("ping", json!({}))["result"], json!({}));
    // The held call is still there to approve, and its agent gets the answer.
    let out = gw.cli(&["approvals", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = v["pending"][0]["id"].to_string();
    assert!(gw.cli(&["approve", &id]).status.success());
    let r = busy.recv().expect("the held call is answered");
    assert_eq!(r.stream, sid);
    let m = metrics(&gw);
    assert!(
        counted(
            &m,
            "toolwall_connections_closed_total{door=\"framed\",reason=\"idle_timeout\"}"
        ) >= 1,
        "{m}"
    );
}

#[test]
fn a_reader_that_stops_reading_is_closed_at_the_write_stall() {
    let gw = HttpGateway::start("", "[gateway]\nwrite_stall_secs = 2\n");
    let mut c = gw.connect();
    // Ask for far more output than the socket buffers hold, and never read it.
    let text = "x".repeat(512 * 1024);
    for i in 0..40 {
        let msg = json!({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                         "params": {"name": "local__echo", "arguments": {"text": text}}});
        let mut frame = Vec::new();
        toolwall_relay::frame::encode(&mut frame, i + 1, 0, "agent", msg.to_string().as_bytes())
            .unwrap();
        if c.stream.write_all(&frame).is_err() {
            break;
        }
    }
    std::thread::sleep(Duration::from_secs(4));
    let m = metrics(&gw);
    assert!(
        counted(
            &m,
            "toolwall_connections_closed_total{door=\"framed\",reason=\"write_stall\"}"
        ) >= 1,
        "{m}"
    );
    // The stalled connection is gone: reading now ends at EOF after what was queued.
    c.stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert_ne!(wait_end(&mut c.stream), Ended::Open);
    // Everyone else is served.
    let mut other = gw.connect();
    assert_eq!(other.call("ping", json!({}))["result"], json!({}));
}

#[test]
fn partial_lines_cannot_hold_the_admin_reserve() {
    let gw = HttpGateway::start("", "max_connections = 2\ntimeout_secs = 30\n");
    // Both seats are taken by connections that sent the start of a command and went quiet.
    let holders: Vec<UnixStream> = (0..2)
        .map(|_| {
            let mut s = UnixStream::connect(&gw.admin).unwrap();
            s.write_all(br#"{"cmd":"sta"#).unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..2 {
        let out = gw.cli(&["status"]);
        assert!(
            out.status.success(),
            "the operator is locked out: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    drop(holders);
}

#[test]
fn the_admin_socket_has_its_own_reserve_and_deadline() {
    // The base config ends inside its [admin] table: these keys land there.
    let gw = HttpGateway::start("", "max_connections = 2\ntimeout_secs = 2\n");
    // Two silent admin connections take the reserve. The operator still gets in: the
    // oldest silent one gives up its seat and is told why, in a line (before, silent
    // connections held the reserve until their deadline and the operator was refused).
    let mut silent: Vec<UnixStream> = (0..2)
        .map(|_| UnixStream::connect(&gw.admin).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let out = gw.cli(&["status"]);
    assert!(
        out.status.success(),
        "the operator is locked out: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let oldest = silent.remove(0);
    oldest.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut line = String::new();
    BufReader::new(&oldest).read_line(&mut line).unwrap();
    let v: Value = serde_json::from_str(&line).expect("a JSON error line");
    assert_eq!(v["ok"], false);
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("admin.max_connections")
    );
    // Agents never take the admin reserve, and the silent ones are closed at the deadline.
    let mut agent = FramedClient::connect(&gw.sock);
    assert_eq!(agent.call("ping", json!({}))["result"], json!({}));
    for mut s in silent {
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        assert_ne!(wait_end(&mut s), Ended::Open, "admin.timeout_secs");
    }
    let out = gw.cli(&["status"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("seats: framed "), "{text}");
}

/// The admin socket's `status`: seats taken on the framed door.
fn framed_seats(gw: &HttpGateway) -> u64 {
    let mut s = UnixStream::connect(&gw.admin).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s.write_all(b"{\"op\":\"status\"}\n").unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    let v: Value = serde_json::from_str(&line).expect("status is JSON");
    v["seats"]["framed"]["taken"].as_u64().expect("seats")
}

/// A peer whose share (`gateway.max_connections_per_peer`) is full makes room by closing
/// its own oldest silent connection; that connection is told the per-peer limit (before:
/// `gateway.max_connections`, the door's, which was far from full).
#[test]
fn a_connection_displaced_for_its_peers_share_is_told_that_limit() {
    let gw = HttpGateway::start(
        "",
        "[gateway]\nmax_connections = 50\nmax_connections_per_peer = 2\n",
    );
    let mut silent = vec![gw.connect(), gw.connect()];
    let deadline = Instant::now() + PATIENCE;
    while framed_seats(&gw) < 2 {
        assert!(
            Instant::now() < deadline,
            "the two connections are never seated"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // A third of the same uid is served: the oldest silent one gives up its seat.
    let mut third = gw.connect();
    assert_eq!(third.call("ping", json!({}))["result"], json!({}));
    let displaced = silent.remove(0);
    let mut displaced = displaced;
    let refusal = displaced
        .recv()
        .expect("the displaced connection gets an error frame");
    assert_eq!(refusal.stream, 0, "{}", refusal.body);
    let message = refusal.body["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        message.contains("gateway.max_connections_per_peer"),
        "{}",
        refusal.body
    );
    assert_eq!(
        refusal.body["error"]["data"]["limit"], "gateway.max_connections_per_peer",
        "{}",
        refusal.body
    );
    assert!(displaced.closed_by_peer());
}

/// A framed peer that sends half a frame and stalls is cut off at
/// `gateway.frame_timeout_secs` with an error frame naming that deadline, then EOF (a
/// lingering close, as the HTTP door's 408): before, it got a bare close with no word.
#[test]
fn a_half_frame_is_answered_with_an_error_naming_the_frame_deadline() {
    let gw = HttpGateway::start("", "[gateway]\nframe_timeout_secs = 2\n");
    let mut c = gw.connect();
    // One call answered first: the connection is an agent's, not a silent one.
    assert_eq!(c.call("ping", json!({}))["result"], json!({}));
    let mut bytes = Vec::new();
    toolwall_relay::frame::encode(&mut bytes, 9, 0, "agent", b"{\"jsonrpc\":\"2.0\",\"id\":1}")
        .unwrap();
    c.send_raw(&bytes[..bytes.len() / 2]);
    let error = c
        .recv()
        .expect("an error frame before the connection closes");
    assert_eq!(error.stream, 0, "{}", error.body);
    assert_eq!(error.body["id"], Value::Null, "{}", error.body);
    assert!(
        error.body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("gateway.frame_timeout_secs"),
        "{}",
        error.body
    );
    assert_eq!(
        error.body["error"]["data"]["limit"],
        "gateway.frame_timeout_secs"
    );
    // Lingering: the rest it sends is read away, and the close is an EOF, not a reset.
    c.send_raw(&bytes[bytes.len() / 2..]);
    let mut rest = [0u8; 64];
    use std::io::Read;
    assert_eq!(
        c.stream.read(&mut rest).expect("EOF, not a reset"),
        0,
        "nothing more is answered"
    );
    let m = metrics(&gw);
    assert!(
        counted(
            &m,
            "toolwall_connections_closed_total{door=\"framed\",reason=\"frame_timeout\"}"
        ) >= 1,
        "{m}"
    );
}

/// The frame deadline bounds one frame, not a run of them: a client whose every write ends
/// one frame and begins the next (a buffered writer, a proxy that re-chunks) always has a
/// partial frame buffered, yet each frame arrives whole well within the deadline, so it is
/// served past the deadline, every frame answered; frames the door refuses (a request on
/// stream 0) count as arrived too.
#[test]
fn writes_that_each_end_one_frame_and_begin_the_next_are_not_a_late_frame() {
    let gw = HttpGateway::start("", "[gateway]\nframe_timeout_secs = 2\n");
    for refused in [false, true] {
        let mut c = gw.connect();
        let stream = |i: u32| if refused { 0 } else { i + 1 };
        let frames: Vec<Vec<u8>> = (0..25u32)
            .map(|i| {
                let msg = json!({"jsonrpc": "2.0", "id": i, "method": "ping"});
                let mut frame = Vec::new();
                toolwall_relay::frame::encode(
                    &mut frame,
                    stream(i),
                    0,
                    "agent",
                    msg.to_string().as_bytes(),
                )
                .unwrap();
                frame
            })
            .collect();
        // 25 frames, one every 0.2 s: 5 s in all, each frame's bytes 0.2 s apart at most.
        let half = |f: &Vec<u8>| f.len() / 2;
        c.send_raw(&frames[0][..half(&frames[0])]);
        for i in 0..frames.len() {
            std::thread::sleep(Duration::from_millis(200));
            let mut piece = frames[i][half(&frames[i])..].to_vec();
            if let Some(next) = frames.get(i + 1) {
                piece.extend_from_slice(&next[..half(next)]);
            }
            c.send_raw(&piece);
        }
        for i in 0..frames.len() as u32 {
            let reply = c
                .recv()
                .unwrap_or_else(|| panic!("frame {} answered (refused: {refused})", i + 1));
            assert_eq!(reply.stream, stream(i), "{:?}", reply.body);
            if refused {
                assert!(reply.body["error"].is_object(), "{:?}", reply.body);
                assert!(
                    !reply.body.to_string().contains("frame_timeout_secs"),
                    "{:?}",
                    reply.body
                );
            } else {
                assert_eq!(reply.body["result"], json!({}), "{:?}", reply.body);
            }
        }
    }
}
