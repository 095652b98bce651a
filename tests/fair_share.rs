//! Fair sharing between principals, against the real binary: one principal that pipelines
//! large calls and never reads its answers is held to its share of the bytes in flight
//! (`gateway.max_bytes_in_flight_per_principal`) while another principal is served, and a
//! connection that hangs up takes its calls with it.

mod common;

use common::http::{HttpGateway, modern};
use serde_json::json;
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
