//! Drives the real toolwall-relay binary against a test gateway on a real unix socket.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolwall_relay::frame::{
    self, Decoded, Decoder, FLAG_NOTIFICATION, HEADER_LEN, MAX_NAME, MAX_TOTAL,
};

/// Upper bound on any single wait, so a broken relay fails a test instead of hanging it.
const WAIT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(20);
const RELAY: &str = env!("CARGO_BIN_EXE_toolwall-relay");

struct Gateway {
    listener: UnixListener,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Gateway {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gw.sock");
        let listener = UnixListener::bind(&path).unwrap();
        listener.set_nonblocking(true).unwrap();
        Gateway {
            listener,
            path,
            _dir: dir,
        }
    }

    fn target(&self) -> String {
        format!("unix:{}", self.path.display())
    }

    fn try_accept(&self) -> Option<Conn> {
        try_accept_from(&self.listener)
    }

    fn accept(&self) -> Conn {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(conn) = self.try_accept() {
                return conn;
            }
            assert!(Instant::now() < deadline, "the relay never connected");
            thread::sleep(POLL);
        }
    }
}

#[derive(Debug)]
struct Frame {
    stream_id: u32,
    flags: u16,
    name: String,
    payload: Vec<u8>,
}

impl Frame {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.payload).unwrap()
    }
}

enum Item {
    Meta(String),
    Frame(Frame),
}

struct Conn {
    stream: UnixStream,
    buf: Vec<u8>,
    decoder: Decoder,
}

impl Conn {
    fn next(&mut self) -> Item {
        loop {
            let item = match self.decoder.decode(&self.buf).unwrap() {
                Decoded::NeedMore => None,
                Decoded::Meta { name, consumed } => Some((Item::Meta(name.to_owned()), consumed)),
                Decoded::Frame {
                    header,
                    name,
                    payload,
                    consumed,
                } => Some((
                    Item::Frame(Frame {
                        stream_id: header.stream_id,
                        flags: header.flags,
                        name: name.to_owned(),
                        payload: payload.to_vec(),
                    }),
                    consumed,
                )),
                Decoded::Invalid { fault, .. } => panic!("relay sent an invalid frame: {fault}"),
            };
            if let Some((item, consumed)) = item {
                self.buf.drain(..consumed);
                return item;
            }
            let mut chunk = [0u8; 64 * 1024];
            let n = self
                .stream
                .read(&mut chunk)
                .expect("reading from the relay");
            assert!(n > 0, "the relay closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn meta(&mut self) -> String {
        match self.next() {
            Item::Meta(name) => name,
            Item::Frame(f) => panic!("expected the meta line, got {f:?}"),
        }
    }

    fn frame(&mut self) -> Frame {
        match self.next() {
            Item::Frame(f) => f,
            Item::Meta(name) => panic!("unexpected meta line {name:?}"),
        }
    }

    fn send_frame(&mut self, stream_id: u32, flags: u16, payload: &[u8]) {
        let mut out = Vec::new();
        frame::encode(&mut out, stream_id, flags, "", payload).unwrap();
        self.stream.write_all(&out).unwrap();
    }

    /// Answer a request frame with a result naming its id.
    fn reply(&mut self, request: &Frame, result: Value) {
        let reply = json!({"jsonrpc": "2.0", "id": request.json()["id"], "result": result});
        self.send_frame(request.stream_id, 0, reply.to_string().as_bytes());
    }
}

struct Relay {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Receiver<String>,
}

impl Relay {
    fn start(args: &[&str]) -> Self {
        let mut child = Command::new(RELAY)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = child.stdout.take().unwrap();
        let (tx, stdout) = mpsc::channel();
        thread::spawn(move || {
            let mut pending = Vec::new();
            let mut chunk = [0u8; 64 * 1024];
            while let Ok(n) = out.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                pending.extend_from_slice(&chunk[..n]);
                while let Some(nl) = pending.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=nl).collect();
                    let line = String::from_utf8(line[..nl].to_vec()).expect("stdout is UTF-8");
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            }
        });
        Relay {
            stdin: child.stdin.take(),
            child,
            stdout,
        }
    }

    fn connected(gateway: &Gateway, extra: &[&str]) -> (Relay, Conn) {
        let target = gateway.target();
        let mut args = vec!["--connect", target.as_str()];
        args.extend_from_slice(extra);
        let relay = Relay::start(&args);
        let conn = gateway.accept();
        (relay, conn)
    }

    fn send_bytes(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(bytes).unwrap();
        stdin.flush().unwrap();
    }

    fn send(&mut self, line: &str) {
        self.send_bytes(format!("{line}\n").as_bytes());
    }

    fn request(&mut self, id: Value, method: &str) {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": {}}).to_string());
    }

    fn try_line(&self, timeout: Duration) -> Option<Value> {
        match self.stdout.recv_timeout(timeout) {
            Ok(line) => Some(serde_json::from_str(&line).expect("stdout carries JSON only")),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => panic!("the relay's stdout closed"),
        }
    }

    fn line(&self) -> Value {
        self.try_line(WAIT).expect("no stdout line from the relay")
    }

    fn close_stdin(&mut self) {
        self.stdin = None;
    }

    fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "the relay did not exit");
            thread::sleep(POLL);
        }
    }

    /// stdout has ended (the process is exiting).
    fn assert_stdout_ends(&self) {
        match self.stdout.recv_timeout(WAIT) {
            Err(RecvTimeoutError::Disconnected) => {}
            other => panic!("expected the end of stdout, got {other:?}"),
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn assert_error(line: &Value, id: Value, code: i64) -> String {
    assert_eq!(line["jsonrpc"], "2.0", "{line}");
    assert_eq!(line["id"], id, "{line}");
    assert_eq!(line["error"]["code"], code, "{line}");
    line["error"]["message"].as_str().unwrap().to_owned()
}

fn parent_comm() -> String {
    let comm = std::fs::read_to_string("/proc/self/comm").unwrap();
    comm.trim_end_matches('\n')
        .chars()
        .map(|c| {
            if c.is_control() || c.is_whitespace() {
                '_'
            } else {
                c
            }
        })
        .collect()
}

#[test]
fn meta_line_names_the_parent_by_default() {
    let gateway = Gateway::new();
    let (mut relay, mut conn) = Relay::connected(&gateway, &[]);
    let name = conn.meta();
    assert_eq!(name, parent_comm());
    relay.request(json!(1), "ping");
    assert_eq!(conn.frame().name, name);
}

#[test]
fn given_names_are_sanitised_and_cut() {
    let gateway = Gateway::new();
    let (mut relay, mut conn) = Relay::connected(&gateway, &["--name", "my agent\tv2\u{7}"]);
    assert_eq!(conn.meta(), "my_agent_v2_");
    relay.request(json!(1), "ping");
    assert_eq!(conn.frame().name, "my_agent_v2_");

    let long = format!("a{}", "é".repeat(MAX_NAME));
    let (mut relay, mut conn) = Relay::connected(&gateway, &["--name", &long]);
    let name = conn.meta();
    assert!(
        name.len() <= MAX_NAME && name.len() > MAX_NAME - 2,
        "{}",
        name.len()
    );
    assert!(long.starts_with(&name));
    relay.request(json!(1), "ping");
    assert_eq!(conn.frame().name, name);
}

#[test]
fn requests_and_notifications_are_framed() {
    let gateway = Gateway::new();
    let (mut relay, mut conn) = Relay::connected(&gateway, &["--name", "t"]);
    conn.meta();
    let lines = [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":"two","method":"tools/list"}"#,
        r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#,
    ];
    for line in lines {
        relay.send(line);
    }
    let expected = [(1, 0), (0, FLAG_NOTIFICATION), (2, 0), (3, 0)];
    for (line, (stream_id, flags)) in lines.iter().zip(expected) {
        let f = conn.frame();
        assert_eq!((f.stream_id, f.flags), (stream_id, flags), "{line}");
        assert_eq!(f.payload, line.as_bytes());
        assert_eq!(f.name, "t");
    }
    // A gateway notification (stream 0) reaches stdout as it is.
    let note = r#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#;
    conn.send_frame(0, FLAG_NOTIFICATION, note.as_bytes());
    assert_eq!(relay.line()["method"], "notifications/tools/list_changed");
}

#[test]
fn replies_out_of_order() {
    let gateway = Gateway::new();
    let (mut relay, mut conn) = Relay::connected(&gateway, &[]);
    conn.meta();
    for id in 1..=3 {
        relay.request(json!(id), "tools/call");
    }
    let frames: Vec<Frame> = (0..3).map(|_| conn.frame()).collect();
    for i in [2, 0, 1] {
        conn.reply(&frames[i], json!({"n": i}));
        let line = relay.line();
        assert_eq!(line["id"], json!(i + 1));
        assert_eq!(line["result"]["n"], json!(i));
    }
}

#[test]
fn invalid_lines_are_answered_locally() {
    let gateway = Gateway::new();
    let (mut relay, mut conn) = Relay::connected(&gateway, &[]);
    conn.meta();
    for (line, code) in [
        ("not json", -32700),
        ("[1,2]", -32600),
        ("42", -32600),
        (r#"{"id":1}"#, -32600),
        (r#"{"id":1,"method":7}"#, -32600),
    ] {
        relay.send(line);
        assert_error(&relay.line(), Value::Null, code);
    }
    relay.send("");
    relay.send("  \r");
    // A response from the agent (to a request the gateway relayed) goes on stream 0 with
    // the notification flag: it opens no stream and nothing answers it.
    relay.send(r#"{"jsonrpc":"2.0","id":"toolwall-5","result":{}}"#);
    let f = conn.frame();
    assert_eq!(f.stream_id, 0);
    assert_eq!(f.flags, 0x0001, "a notification frame");
    assert_eq!(f.json()["id"], "toolwall-5");
    relay.request(json!(9), "ping");
    let f = conn.frame();
    assert_eq!(f.stream_id, 1, "the first request's stream");
    assert_eq!(f.json()["id"], 9);
    conn.reply(&f, json!({}));
    assert_eq!(
        relay.line()["id"],
        9,
        "no reply to the forwarded response came first"
    );
}

#[test]
fn oversized_lines_are_refused_and_the_relay_goes_on() {
    let gateway = Gateway::new();
    let (mut relay, mut conn) = Relay::connected(&gateway, &["--name", "t"]);
    conn.meta();
    let limit = MAX_TOTAL - HEADER_LEN - 1;

    // The id comes last, as some clients write it.
    let big = format!(
        r#"{{"method":"tools/call","params":{{"text":"{}"}},"jsonrpc":"2.0","id":77}}"#,
        "a".repeat(MAX_TOTAL)
    );
    relay.send(&big);
    let message = assert_error(&relay.line(), json!(77), -32001);
    assert!(message.contains(&limit.to_string()), "{message}");

    // No id to be found: null.
    relay.send(&"x".repeat(limit + 1));
    assert_error(&relay.line(), Value::Null, -32001);

    // A line exactly at the limit still goes through.
    let prefix = r#"{"jsonrpc":"2.0","id":78,"method":"tools/call","params":{"text":""#;
    let suffix = r#""}}"#;
    let fill = "b".repeat(limit - prefix.len() - suffix.len());
    let exact = format!("{prefix}{fill}{suffix}");
    assert_eq!(exact.len(), limit);
    relay.send(&exact);
    let f = conn.frame();
    assert_eq!(f.stream_id, 1, "the oversized lines were not sent");
    assert_eq!(f.payload.len(), limit);
    conn.reply(&f, json!({}));
    assert_eq!(relay.line()["id"], 78);

    relay.request(json!(79), "ping");
    let f = conn.frame();
    assert_eq!((f.stream_id, f.json()["id"].clone()), (2, json!(79)));
}

#[test]
fn disconnect_fails_pending_and_reconnects_without_replay() {
    let gateway = Gateway::new();
    let (mut relay, mut conn) = Relay::connected(&gateway, &["--name", "agent"]);
    assert_eq!(conn.meta(), "agent");
    relay.request(json!(1), "tools/call");
    relay.request(json!("b"), "ping");
    assert_eq!(conn.frame().stream_id, 1);
    assert_eq!(conn.frame().stream_id, 2);
    drop(conn);

    let mut errors: Vec<(Value, String)> = (0..2)
        .map(|_| {
            let line = relay.line();
            let message = assert_error(&line, line["id"].clone(), -32001);
            (line["id"].clone(), message)
        })
        .collect();
    errors.sort_by_key(|(id, _)| id.to_string());
    assert_eq!(
        errors,
        [
            (
                json!("b"),
                "transport disconnected before ping response".to_owned()
            ),
            (
                json!(1),
                "transport disconnected before tools/call response".to_owned()
            ),
        ]
    );

    // The next request reconnects: meta again, stream ids from 1, and no replay.
    relay.request(json!(3), "tools/list");
    let mut conn = gateway.accept();
    assert_eq!(conn.meta(), "agent");
    let f = conn.frame();
    assert_eq!(
        (f.stream_id, f.json()["method"].clone()),
        (1, json!("tools/list"))
    );
    conn.reply(&f, json!({"tools": []}));
    assert_eq!(relay.line()["id"], 3);
    relay.request(json!(4), "ping");
    let f = conn.frame();
    assert_eq!((f.stream_id, f.json()["id"].clone()), (2, json!(4)));
}

#[test]
fn stdin_eof_waits_for_pending_replies() {
    let gateway = Gateway::new();
    let (mut relay, mut conn) = Relay::connected(&gateway, &[]);
    conn.meta();
    relay.request(json!(1), "tools/call");
    let f = conn.frame();
    relay.close_stdin();
    // Had the relay quit at EOF, this reply would find no stdout.
    conn.reply(&f, json!({"late": true}));
    let line = relay.line();
    assert_eq!(
        (line["id"].clone(), line["result"]["late"].clone()),
        (json!(1), json!(true))
    );
    relay.assert_stdout_ends();
    assert_eq!(relay.wait_exit().code(), Some(0));
}

#[test]
fn stdin_eof_drain_is_bounded() {
    let gateway = Gateway::new();
    let (mut relay, mut conn) = Relay::connected(&gateway, &["--drain-timeout", "1"]);
    conn.meta();
    relay.request(json!(1), "tools/call");
    conn.frame();
    relay.close_stdin();
    let message = assert_error(&relay.line(), json!(1), -32001);
    assert!(message.contains("tools/call"), "{message}");
    assert_eq!(relay.wait_exit().code(), Some(0));
    drop(conn);
}

#[test]
fn connect_failure_is_answered_and_retried() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("late.sock");
    let target = format!("unix:{}", path.display());
    let mut relay = Relay::start(&["--connect", &target]);

    relay.request(json!(1), "ping");
    let message = assert_error(&relay.line(), json!(1), -32001);
    assert!(message.contains(&target), "{message}");
    assert!(message.contains("os error 2"), "{message}");

    // Once the gateway is up, a later request gets through (after the backoff): each
    // request is either answered with an error or arrives on a new connection.
    let listener = UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + 3 * WAIT;
    'requests: for id in 2.. {
        relay.request(json!(id), "ping");
        loop {
            assert!(Instant::now() < deadline, "never reconnected");
            if let Some(line) = relay.try_line(POLL) {
                assert_error(&line, json!(id), -32001);
                continue 'requests;
            }
            if let Some(mut conn) = try_accept_from(&listener) {
                conn.meta();
                let f = conn.frame();
                assert_eq!((f.stream_id, f.json()["id"].clone()), (1, json!(id)));
                break 'requests;
            }
        }
    }
    relay.close_stdin();
    assert_eq!(relay.wait_exit().code(), Some(0));
}

fn try_accept_from(listener: &UnixListener) -> Option<Conn> {
    match listener.accept() {
        Ok((stream, _)) => {
            stream.set_nonblocking(false).unwrap();
            stream.set_read_timeout(Some(WAIT)).unwrap();
            Some(Conn {
                stream,
                buf: Vec::new(),
                decoder: Decoder::new(),
            })
        }
        Err(e) if e.kind() == ErrorKind::WouldBlock => None,
        Err(e) => panic!("accept: {e}"),
    }
}

#[test]
fn gateway_faults_fail_only_what_they_must() {
    let gateway = Gateway::new();
    let (mut relay, mut conn) = Relay::connected(&gateway, &[]);
    conn.meta();
    relay.request(json!(1), "ping");
    relay.request(json!(2), "ping");
    let first = conn.frame();
    let second = conn.frame();

    // A reply spanning lines is dropped; its request is answered locally.
    conn.send_frame(
        first.stream_id,
        0,
        b"{\"jsonrpc\":\"2.0\",\n\"id\":1,\"result\":{}}",
    );
    assert_error(&relay.line(), json!(1), -32603);
    // A reply for no pending stream is dropped; the connection lives on.
    conn.send_frame(99, 0, br#"{"jsonrpc":"2.0","id":99,"result":{}}"#);
    conn.reply(&second, json!({}));
    assert_eq!(relay.line()["id"], 2);

    // An unframeable stream drops the connection: pending requests get -32001.
    relay.request(json!(3), "tools/call");
    conn.frame();
    conn.stream.write_all(&u32::MAX.to_be_bytes()).unwrap();
    let message = assert_error(&relay.line(), json!(3), -32001);
    assert_eq!(message, "transport disconnected before tools/call response");
}

#[test]
fn command_line() {
    let help = Command::new(RELAY).arg("--help").output().unwrap();
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("--connect"));

    let version = Command::new(RELAY).arg("--version").output().unwrap();
    assert!(version.status.success());
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("toolwall-relay "));

    for (args, needle) in [
        (&["--connect", "tcp:127.0.0.1:1"][..], "tcp:127.0.0.1:1"),
        (&["--connect", "vsock:two:5002"], "vsock:two:5002"),
        (&["--drain-timeout", "-1"], "-1"),
        (&["--frobnicate"], "--frobnicate"),
    ] {
        let out = Command::new(RELAY)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

#[test]
fn many_in_flight_with_a_small_pending_limit() {
    const REQUESTS: u64 = 300;
    const BATCH: usize = 4;
    let gateway = Gateway::new();
    let (mut relay, mut conn) = Relay::connected(&gateway, &["--max-pending", "4"]);
    conn.meta();
    // The relay stops reading stdin at the limit, so stdin is fed from its own thread.
    let mut stdin = relay.stdin.take().unwrap();
    let writer = thread::spawn(move || {
        for id in 0..REQUESTS {
            let line = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call"});
            stdin.write_all(format!("{line}\n").as_bytes()).unwrap();
        }
    });
    let mut next_stream_id = 1;
    let mut answered = 0;
    while answered < REQUESTS as usize {
        let batch: Vec<Frame> = (0..BATCH.min(REQUESTS as usize - answered))
            .map(|_| conn.frame())
            .collect();
        for f in &batch {
            assert_eq!(f.stream_id, next_stream_id);
            next_stream_id += 1;
        }
        // At the limit nothing more may be sent before a reply (a check that can only
        // fail when the relay overruns its limit).
        assert!(conn.buf.is_empty(), "a request past --max-pending was sent");
        conn.stream.set_nonblocking(true).unwrap();
        let mut probe = [0u8; 1];
        match conn.stream.read(&mut probe) {
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            other => panic!("a request past --max-pending was sent: {other:?}"),
        }
        conn.stream.set_nonblocking(false).unwrap();
        for f in batch.iter().rev() {
            conn.reply(f, json!({}));
        }
        answered += batch.len();
    }
    writer.join().unwrap();
    let mut ids: Vec<u64> = (0..REQUESTS)
        .map(|_| relay.line()["id"].as_u64().unwrap())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..REQUESTS).collect::<Vec<_>>());
}
