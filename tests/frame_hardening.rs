//! The frame contract's hardening matrix, against the real gateway over a real unix socket.

mod common;

use common::*;
use serde_json::json;
use toolwall_relay::frame::{self, FLAG_NOTIFICATION, HEADER_LEN, MAGIC, MAX_TOTAL, VERSION};

/// A hand-built frame with any header field set.
#[allow(clippy::too_many_arguments)]
fn raw_frame(
    magic: u16,
    version: u8,
    header_len: u8,
    sid: u32,
    flags: u16,
    name: &[u8],
    payload: &[u8],
    total_delta: i64,
) -> Vec<u8> {
    let total = (HEADER_LEN + name.len() + payload.len()) as i64 + total_delta;
    let mut b = (total as u32).to_be_bytes().to_vec();
    b.extend(magic.to_be_bytes());
    b.extend([version, header_len]);
    b.extend(sid.to_be_bytes());
    b.extend(flags.to_be_bytes());
    b.extend((name.len() as u16).to_be_bytes());
    b.extend((payload.len() as u32).to_be_bytes());
    b.extend(name);
    b.extend(payload);
    b
}

const PING: &[u8] = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;

fn assert_alive(c: &mut FramedClient) {
    let r = c.call("ping", json!({}));
    assert_eq!(r["result"], json!({}), "connection still serves: {r}");
}

#[test]
fn inner_header_faults_answer_32600_and_the_connection_lives() {
    let gw = TestGateway::start("");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "bad magic",
            raw_frame(0x1234, VERSION, 16, 1, 0, b"n", PING, 0),
        ),
        ("bad version", raw_frame(MAGIC, 9, 16, 2, 0, b"n", PING, 0)),
        (
            "bad header length",
            raw_frame(MAGIC, VERSION, 12, 3, 0, b"n", PING, 0),
        ),
        (
            "bad flags",
            raw_frame(MAGIC, VERSION, 16, 4, 0x0100, b"n", PING, 0),
        ),
        (
            "name too long",
            raw_frame(MAGIC, VERSION, 16, 5, 0, &[b'x'; 129], PING, 0),
        ),
        (
            "name not UTF-8",
            raw_frame(MAGIC, VERSION, 16, 6, 0, &[0xff, 0xfe], PING, 0),
        ),
    ];
    let mut c = gw.connect();
    for (what, bytes) in cases {
        c.send_raw(&bytes);
        let r = c
            .recv()
            .unwrap_or_else(|| panic!("{what}: connection closed"));
        let sid = u32::from_be_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        assert_eq!(r.stream, sid, "{what}: answered on its stream");
        assert_eq!(r.body["error"]["code"], -32600, "{what}: {}", r.body);
        assert_eq!(r.flags, 0);
    }
    c.next_sid = 100;
    assert_alive(&mut c);
}

#[test]
fn length_mismatch_is_refused_on_its_stream() {
    let gw = TestGateway::start("");
    let mut c = gw.connect();
    // total_len says 5 bytes more than name + payload: the frame is read whole (it is
    // within bounds) and refused; the 5 trailing bytes belong to it.
    let mut bytes = raw_frame(MAGIC, VERSION, 16, 7, 0, b"n", PING, 5);
    bytes.extend([b' '; 5]);
    c.send_raw(&bytes);
    let r = c.recv().expect("answer");
    assert_eq!(r.stream, 7);
    assert_eq!(r.body["error"]["code"], -32600);
    c.next_sid = 8;
    assert_alive(&mut c);
}

#[test]
fn bad_outer_length_closes_and_the_next_connection_works() {
    let gw = TestGateway::start("");
    for total in [(MAX_TOTAL + 1) as u32, 3u32, u32::MAX] {
        let mut c = gw.connect();
        let mut bytes = total.to_be_bytes().to_vec();
        bytes.extend([0u8; 16]);
        c.send_raw(&bytes);
        assert!(c.closed_by_peer(), "total {total} closes the connection");
    }
    let mut next = gw.connect();
    assert_alive(&mut next);
}

#[test]
fn oversized_echo_is_refused_and_the_next_connection_works() {
    let gw = TestGateway::start("");
    let mut c = gw.connect();
    let text = "a".repeat(1_100_000);
    let msg = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"local__echo","arguments":{"text": text}}});
    // The codec refuses to build it; send the bytes a broken client would.
    let payload = msg.to_string();
    let bytes = raw_frame(MAGIC, VERSION, 16, 1, 0, b"n", payload.as_bytes(), 0);
    let _ = std::io::Write::write_all(&mut c.stream, &bytes);
    assert!(c.closed_by_peer(), "a 1.1 MB frame closes its connection");
    let mut next = gw.connect();
    let r = next.tool("local__echo", json!({"text": "still here"}));
    assert_eq!(r["result"]["content"][0]["text"], "still here");
    // A 1 MB echo (within the frame limit) goes through whole.
    let big = "b".repeat(1_000_000);
    let r = next.tool("local__echo", json!({"text": big}));
    assert_eq!(
        r["result"]["content"][0]["text"].as_str().map(str::len),
        Some(1_000_000)
    );
}

#[test]
fn json_faults() {
    let gw = TestGateway::start("");
    let mut c = gw.connect();
    c.send_frame(1, 0, b"{not json");
    let r = c.recv().unwrap();
    assert_eq!(
        (r.stream, r.body["error"]["code"].as_i64()),
        (1, Some(-32700))
    );
    assert_eq!(r.body["id"], serde_json::Value::Null);
    c.send_frame(2, 0, br#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#);
    assert_eq!(c.recv().unwrap().body["error"]["code"], -32600, "batch");
    c.send_frame(3, 0, b"42");
    assert_eq!(
        c.recv().unwrap().body["error"]["code"],
        -32600,
        "not an object"
    );
    // A request frame that carries a notification.
    c.send_frame(
        4,
        0,
        br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    );
    let r = c.recv().unwrap();
    assert_eq!(
        (r.stream, r.body["error"]["code"].as_i64()),
        (4, Some(-32600))
    );
    // A notification frame that carries an id.
    c.send_frame(0, FLAG_NOTIFICATION, PING);
    let r = c.recv().unwrap();
    assert_eq!(r.body["error"]["code"], -32600);
    assert_eq!(r.body["id"], 1);
    // A notification frame on a non-zero stream.
    c.send_frame(
        9,
        FLAG_NOTIFICATION,
        br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    );
    assert_eq!(c.recv().unwrap().body["error"]["code"], -32600);
    c.next_sid = 10;
    assert_alive(&mut c);
}

#[test]
fn stream_id_reuse_and_decrease_close_the_connection() {
    let gw = TestGateway::start("");
    let mut c = gw.connect();
    c.send_frame(5, 0, PING);
    assert_eq!(c.recv().unwrap().stream, 5);
    c.send_frame(5, 0, PING);
    assert!(c.closed_by_peer(), "reuse closes");
    let mut d = gw.connect();
    d.send_frame(9, 0, PING);
    assert_eq!(d.recv().unwrap().stream, 9);
    d.send_frame(3, 0, PING);
    assert!(d.closed_by_peer(), "decrease closes");
}

#[test]
fn meta_line_names_the_client() {
    let gw = TestGateway::start("");
    let mut c = gw.connect();
    c.send_raw(&frame::meta_line_for("my agent"));
    c.name = String::new();
    let r = c.tool("local__echo", json!({"text": "x"}));
    assert_eq!(r["result"]["content"][0]["text"], "x");
    let rows = gw.wait_rows("one row", |r| r.len() == 1);
    assert_eq!(rows[0]["process_name"], "my_agent");
}

#[test]
fn slow_sender_is_closed_after_the_frame_timeout() {
    let gw = TestGateway::start("[gateway]\nframe_timeout_secs = 1\n");
    let mut c = gw.connect();
    let mut bytes = Vec::new();
    frame::encode(&mut bytes, 1, 0, "n", PING).unwrap();
    c.send_raw(&bytes[..10]);
    let started = std::time::Instant::now();
    assert!(
        c.closed_by_peer(),
        "an incomplete frame is not waited for forever"
    );
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(900),
        "not before the timeout"
    );
    let mut next = gw.connect();
    assert_alive(&mut next);
}

#[test]
fn pipelined_requests_are_all_answered() {
    let gw = TestGateway::start("");
    let mut c = gw.connect();
    let n = 500;
    for i in 0..n {
        let msg = json!({"jsonrpc":"2.0","id":i,"method":"tools/call","params":{"name":"local__echo","arguments":{"text": format!("m{i}")}}});
        c.send_frame(i + 1, 0, msg.to_string().as_bytes());
    }
    let mut seen = std::collections::HashSet::new();
    for _ in 0..n {
        let r = c.recv().expect("answer");
        let id = r.body["id"].as_u64().unwrap() as u32;
        assert_eq!(r.stream, id + 1);
        assert_eq!(r.body["result"]["content"][0]["text"], format!("m{id}"));
        seen.insert(id);
    }
    assert_eq!(seen.len(), n as usize);
    gw.wait_rows("every call recorded", |r| r.len() == n as usize);
}

#[test]
fn calls_sent_before_a_broken_frame_are_answered_then_the_connection_closes() {
    // Whether the calls before a broken frame arrive in their own writes or in one write
    // with it, they were taken: each is answered and recorded, the peer is told why, and
    // only then is it closed.
    let gw = TestGateway::start("");
    for (round, broken) in ["reused stream id", "bad length"].iter().enumerate() {
        let mut c = gw.connect();
        let mut bytes = Vec::new();
        for sid in 1..=3u32 {
            let msg = json!({"jsonrpc": "2.0", "id": sid, "method": "tools/call",
                             "params": {"name": "local__echo",
                                        "arguments": {"text": format!("{broken} {sid}")}}});
            frame::encode(&mut bytes, sid, 0, "n", msg.to_string().as_bytes()).unwrap();
        }
        match *broken {
            "reused stream id" => frame::encode(&mut bytes, 2, 0, "n", PING).unwrap(),
            _ => {
                bytes.extend(3u32.to_be_bytes());
                bytes.extend([0u8; 16]);
            }
        }
        c.send_raw(&bytes);
        let mut answered = Vec::new();
        let mut told = None;
        while let Some(r) = c.recv() {
            if r.stream == 0 {
                told = Some(r.body);
                continue;
            }
            assert_eq!(
                r.body["result"]["content"][0]["text"],
                format!("{broken} {}", r.stream),
                "{:?}",
                r.body
            );
            answered.push(r.stream);
        }
        answered.sort_unstable();
        assert_eq!(
            answered,
            [1, 2, 3],
            "{broken}: every call taken is answered"
        );
        let told = told.unwrap_or_else(|| panic!("{broken}: the peer is told why"));
        assert_eq!(told["error"]["code"], -32600, "{told}");
        let said = told["error"]["message"].as_str().unwrap_or_default();
        let names = match *broken {
            "reused stream id" => "stream id 2 reused",
            _ => "frame length 3 outside",
        };
        assert!(said.starts_with(names), "names the fault: {said}");
        let rows = gw.wait_rows("the calls recorded", |r| r.len() == 3 * (round + 1));
        assert!(rows.iter().all(|r| r["decision"] == "allowed"), "{rows:#?}");
    }
    let mut next = gw.connect();
    assert_alive(&mut next);
}
