//! The daemon under systemd's protocols, with the test in systemd's place: readiness,
//! status, watchdog and reload over a NOTIFY_SOCKET the test owns; socket activation
//! through the real `systemd-socket-activate`; reload and SIGTERM under load.

mod common;

use common::*;
use serde_json::json;
use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn config_in(dir: &std::path::Path, extra: &str) -> std::path::PathBuf {
    let path = dir.join("toolwall.toml");
    std::fs::write(&path, base_config(dir, extra)).unwrap();
    path
}

/// Datagrams received on the notify socket, with their arrival times.
fn collect(sock: UnixDatagram) -> Arc<Mutex<Vec<(Instant, String)>>> {
    let got = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&got);
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        loop {
            match sock.recv(&mut buf) {
                Ok(n) => sink.lock().unwrap().push((
                    Instant::now(),
                    String::from_utf8_lossy(&buf[..n]).into_owned(),
                )),
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => return,
            }
        }
    });
    got
}

fn wait_msg(got: &Arc<Mutex<Vec<(Instant, String)>>>, needle: &str) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some((_, m)) = got.lock().unwrap().iter().find(|(_, m)| m.contains(needle)) {
            return m.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no {needle:?} among {:?}",
            got.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn ready_status_watchdog_reload_and_stop_over_notify_socket() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_in(dir.path(), "");
    let notify_path = dir.path().join("notify.sock");
    let got = collect(UnixDatagram::bind(&notify_path).unwrap());
    let mut child = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&config)
        .current_dir(dir.path())
        .env("NOTIFY_SOCKET", &notify_path)
        .env("WATCHDOG_USEC", "400000")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ready = wait_msg(&got, "READY=1");
    assert!(
        ready.contains("STATUS="),
        "ready carries a status line: {ready}"
    );
    // Readiness comes only after the socket is there and the worker attested.
    assert!(dir.path().join("mcp.sock").exists());
    let ledger = rusqlite::Connection::open(dir.path().join("state/ledger.db")).unwrap();
    let attested: i64 = ledger
        .query_row(
            "SELECT count(*) FROM events WHERE kind = 'worker_ready'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(attested, 1);
    // Watchdog: every 200 ms (half of 400 ms), from the loop.
    let start = Instant::now();
    std::thread::sleep(Duration::from_millis(2000));
    let pings = got
        .lock()
        .unwrap()
        .iter()
        .filter(|(t, m)| *t >= start && m.contains("WATCHDOG=1"))
        .count();
    assert!(
        (4..=20).contains(&pings),
        "about 10 pings in 2 s at half the interval, got {pings}"
    );
    // A status line follows the calls.
    let mut c = FramedClient::connect(&dir.path().join("mcp.sock"));
    c.tool("local__echo", json!({"text": "x"}));
    wait_msg(&got, "1 calls");
    // Reload: RELOADING=1 with MONOTONIC_USEC, then READY=1 again.
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    let reloading = wait_msg(&got, "RELOADING=1");
    assert!(reloading.contains("MONOTONIC_USEC="), "{reloading}");
    let n_ready = || {
        got.lock()
            .unwrap()
            .iter()
            .filter(|(_, m)| m.contains("READY=1") && !m.contains("RELOADING"))
            .count()
    };
    let deadline = Instant::now() + PATIENCE;
    while n_ready() < 2 {
        assert!(Instant::now() < deadline, "READY=1 after the reload");
        std::thread::sleep(Duration::from_millis(10));
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    wait_msg(&got, "STOPPING=1");
    let status = wait_timeout(&mut child, PATIENCE).expect("exits");
    assert!(status.success());
}

#[test]
fn socket_activation_through_systemd_socket_activate() {
    common::deps::ensure(&["systemd"]);
    if Command::new("systemd-socket-activate")
        .arg("--help")
        .output()
        .is_err()
    {
        panic!(
            "systemd-socket-activate is missing: scripts/install-test-deps.sh installs the systemd package"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("activated.sock");
    let config = config_in(dir.path(), "").to_path_buf();
    // The config names the same path systemd listens on; it must be adopted, not bound.
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("mcp.sock", "activated.sock");
    std::fs::write(&config, text).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "[listen]\n",
        &format!("[listen]\nhttp = \"127.0.0.1:{port}\"\nhttp_auth = \"none\"\n"),
    );
    std::fs::write(&config, text).unwrap();
    let mut child = ChildGuard(
        Command::new("systemd-socket-activate")
            .arg("-l")
            .arg(&sock)
            .arg("-l")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--fdname=mcp-unix:mcp-http")
            .arg(BIN)
            .args(["serve", "--config"])
            .arg(&config)
            .current_dir(dir.path())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stderr = child.stderr.take().unwrap();
    let log = Arc::new(Mutex::new(String::new()));
    let sink = Arc::clone(&log);
    std::thread::spawn(move || {
        use std::io::BufRead;
        for l in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let mut g = sink.lock().unwrap();
            g.push_str(&l);
            g.push('\n');
        }
    });
    // systemd-socket-activate accepts nothing itself: connecting starts toolwall.
    let deadline = Instant::now() + PATIENCE;
    while !sock.exists() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut c = FramedClient::connect(&sock);
    let r = c.tool("local__echo", json!({"text": "activated"}));
    assert_eq!(r["result"]["content"][0]["text"], "activated");
    // The HTTP door on the socket systemd passed, on the same process.
    let mut tcp = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    tcp.set_read_timeout(Some(PATIENCE)).unwrap();
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    use std::io::{Read, Write};
    write!(
        tcp,
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: ping\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    let _ = tcp.read_to_string(&mut answer);
    assert!(
        answer.starts_with("HTTP/1.1 "),
        "an HTTP answer on the activated port: {answer}"
    );
    let text = log.lock().unwrap().clone();
    assert_eq!(
        text.matches("using the socket systemd passed").count(),
        2,
        "{text}"
    );
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = wait_timeout(&mut child, PATIENCE).expect("exits");
    assert!(status.success(), "{}", log.lock().unwrap());
    assert!(
        sock.exists(),
        "the socket file belongs to systemd and is not removed"
    );
}

/// Clients calling echo in a loop; returns (answered ok, refused as stopping, other).
fn load(
    sock: std::path::PathBuf,
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    stopping: Arc<AtomicU64>,
    bad: Arc<Mutex<Vec<String>>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut c = FramedClient::connect(&sock);
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            i += 1;
            let text = format!("load-{i}");
            c.request(
                json!(text.clone()),
                "tools/call",
                Some(json!({"name": "local__echo", "arguments": {"text": text}})),
            );
            match c.recv() {
                Some(r) if r.body["result"]["content"][0]["text"] == json!(text) => {
                    ok.fetch_add(1, Ordering::Relaxed);
                }
                Some(r) if r.body["error"]["code"] == -32005 => {
                    stopping.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Some(r) => {
                    bad.lock().unwrap().push(r.body.to_string());
                    return;
                }
                None => {
                    bad.lock().unwrap().push(format!("no answer to {text}"));
                    return;
                }
            }
        }
    })
}

#[test]
fn reload_under_load_fails_no_call() {
    let gw = TestGateway::start("");
    let (stop, ok, stopping) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let bad = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            load(
                gw.sock.clone(),
                Arc::clone(&stop),
                Arc::clone(&ok),
                Arc::clone(&stopping),
                Arc::clone(&bad),
            )
        })
        .collect();
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(100));
        let out = gw.cli(&["reload"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    assert!(bad.lock().unwrap().is_empty(), "{:?}", bad.lock().unwrap());
    assert!(ok.load(Ordering::Relaxed) > 20);
    assert_eq!(gw.events("reload").len(), 5);
}

#[test]
fn sigterm_under_load_answers_or_refuses_every_call_and_records_every_answer() {
    let mut gw = TestGateway::start("");
    let worker = gw.worker_pid();
    let (stop, ok, stopping) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let bad = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..6)
        .map(|_| {
            load(
                gw.sock.clone(),
                Arc::clone(&stop),
                Arc::clone(&ok),
                Arc::clone(&stopping),
                Arc::clone(&bad),
            )
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let status = gw.terminate();
    for c in clients {
        c.join().unwrap();
    }
    assert!(status.success(), "exit 0: {status:?}");
    assert!(
        bad.lock().unwrap().is_empty(),
        "every call answered or refused as stopping: {:?}",
        bad.lock().unwrap()
    );
    let answered = ok.load(Ordering::Relaxed);
    assert!(answered > 0 && stopping.load(Ordering::Relaxed) > 0);
    let n: i64 = gw
        .ledger()
        .query_row("SELECT count(*) FROM tool_calls WHERE decision = 'allowed' AND duration_us IS NOT NULL", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n as u64, answered, "every answered call has its row");
    assert!(
        !std::path::Path::new(&format!("/proc/{worker}")).exists(),
        "no worker left"
    );
    // The WAL was checkpointed away.
    let wal = gw.ledger.with_extension("db-wal");
    assert!(
        !wal.exists() || std::fs::metadata(&wal).unwrap().len() == 0,
        "WAL checkpointed at stop"
    );
}
