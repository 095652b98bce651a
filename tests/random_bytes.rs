//! Random bytes at every door: the gateway neither panics nor grows without bound, and the
//! next client is served.

mod common;

use common::*;
use proptest::prelude::*;
use serde_json::json;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap()
}

#[test]
fn framed_door_survives_random_bytes() {
    let gw = TestGateway::start("[gateway]\nframe_timeout_secs = 1\n");
    let sock = gw.sock.clone();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 48,
        ..ProptestConfig::default()
    });
    runner
        .run(&proptest::collection::vec(any::<u8>(), 0..4096), |bytes| {
            let mut s = UnixStream::connect(&sock).unwrap();
            // A prefix that looks like a frame makes the decoder go deeper sometimes.
            let _ = s.write_all(&bytes);
            drop(s);
            Ok(())
        })
        .unwrap();
    // Valid-looking frames with random inner headers and payloads.
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 48,
        ..ProptestConfig::default()
    });
    runner
        .run(
            &(
                any::<u32>(),
                any::<u16>(),
                proptest::collection::vec(any::<u8>(), 0..2048),
            ),
            |(sid, flags, payload)| {
                let mut s = UnixStream::connect(&sock).unwrap();
                let mut b = ((16 + payload.len()) as u32).to_be_bytes().to_vec();
                b.extend(0x4D43u16.to_be_bytes());
                b.extend([1, 16]);
                b.extend(sid.to_be_bytes());
                b.extend(flags.to_be_bytes());
                b.extend(0u16.to_be_bytes());
                b.extend((payload.len() as u32).to_be_bytes());
                b.extend(&payload);
                let _ = s.write_all(&b);
                Ok(())
            },
        )
        .unwrap();
    // Unbounded growth would show after a flood of garbage on one connection.
    let before = rss_kib(gw.pid());
    let mut s = UnixStream::connect(&sock).unwrap();
    let junk: Vec<u8> = (0..(1usize << 20))
        .map(|i| (i * 7919 % 251) as u8)
        .collect();
    for _ in 0..64 {
        if s.write_all(&junk).is_err() {
            break; // closed: the first bad length ends it
        }
    }
    drop(s);
    let mut c = gw.connect();
    let r = c.tool("local__echo", json!({"text": "alive"}));
    assert_eq!(r["result"]["content"][0]["text"], "alive");
    let after = rss_kib(gw.pid());
    assert!(
        after < before + 32 * 1024,
        "peak RSS grew from {before} KiB to {after} KiB"
    );
    assert!(!gw.log().contains("panicked"), "{}", gw.log());
}

#[test]
fn stdio_door_survives_random_lines() {
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("toolwall.toml");
    std::fs::write(&config_path, base_config(dir.path(), "")).unwrap();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 8,
        ..ProptestConfig::default()
    });
    runner
        .run(&proptest::collection::vec(any::<u8>(), 0..8192), |bytes| {
            let mut child = Command::new(BIN)
                .args(["stdio", "--config"])
                .arg(&config_path)
                .current_dir(dir.path())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            {
                let mut stdin = child.stdin.take().unwrap();
                let _ = stdin.write_all(&bytes);
                let _ = stdin
                    .write_all(b"\n{\"jsonrpc\":\"2.0\",\"id\":\"last\",\"method\":\"ping\"}\n");
            }
            let out = child.wait_with_output().unwrap();
            prop_assert!(
                out.status.success(),
                "stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let stdout = String::from_utf8_lossy(&out.stdout);
            for line in stdout.lines() {
                prop_assert!(
                    serde_json::from_str::<serde_json::Value>(line).is_ok(),
                    "stdout carries JSON only: {line}"
                );
            }
            prop_assert!(
                stdout.contains("\"id\":\"last\""),
                "the ping after the garbage is answered"
            );
            Ok(())
        })
        .unwrap();
}

#[test]
fn http_door_survives_random_bytes() {
    let gw = common::http::HttpGateway::start(
        "http_auth = \"none\"\n",
        "[http]\nrequest_timeout_secs = 1\n",
    );
    let port = gw.port;
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 48,
        ..ProptestConfig::default()
    });
    runner
        .run(&proptest::collection::vec(any::<u8>(), 0..4096), |bytes| {
            let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            let _ = s.write_all(&bytes);
            Ok(())
        })
        .unwrap();
    // Heads that parse, with random bodies and lengths.
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 48,
        ..ProptestConfig::default()
    });
    runner
        .run(&(proptest::collection::vec(any::<u8>(), 0..2048), 0usize..4096), |(body, claimed)| {
            let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            let head = format!(
                "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {claimed}\r\n\r\n"
            );
            let _ = s.write_all(head.as_bytes());
            let _ = s.write_all(&body);
            Ok(())
        })
        .unwrap();
    let mut c = gw.connect();
    let r = c.tool("local__echo", json!({"text": "alive"}));
    assert_eq!(r["result"]["content"][0]["text"], "alive");
    assert!(!gw.log().contains("panicked"), "{}", gw.log());
}
