//! Helpers for the Streamable HTTP door: a gateway listening on a free loopback port, tokens
//! made with the real CLI, and a small HTTP/1.1 client over a real TCP (or TLS) stream that
//! writes requests byte for byte and reads responses by `Content-Length`.

use super::{BIN, PATIENCE, TestGateway, base_config, wait_timeout};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The modern era's protocol version.
pub const MODERN: &str = "2026-07-28";
/// A legacy protocol version clients negotiate with `initialize`.
pub const LEGACY: &str = "2025-11-25";

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral port")
        .port()
}

/// The config of a gateway whose HTTP door listens on 127.0.0.1:`port`. `listen_extra` goes
/// into `[listen]`, `extra` after it (other tables); `{port}` in either becomes the port.
pub fn http_config(dir: &Path, port: u16, listen_extra: &str, extra: &str) -> String {
    let listen = format!("http = \"127.0.0.1:{port}\"\n{listen_extra}");
    let config =
        base_config(dir, extra).replacen("[listen]\n", &format!("[listen]\n{listen}\n"), 1);
    config.replace("{port}", &port.to_string())
}

/// A running gateway with its HTTP door.
pub struct HttpGateway {
    pub gw: TestGateway,
    pub port: u16,
}

impl std::ops::Deref for HttpGateway {
    type Target = TestGateway;
    fn deref(&self) -> &TestGateway {
        &self.gw
    }
}

impl std::ops::DerefMut for HttpGateway {
    fn deref_mut(&mut self) -> &mut TestGateway {
        &mut self.gw
    }
}

impl HttpGateway {
    /// Start `toolwall serve` with the HTTP door on a free port (see [`http_config`]).
    pub fn start(listen_extra: &str, extra: &str) -> HttpGateway {
        Self::start_in(tempfile::tempdir().expect("tempdir"), listen_extra, extra)
    }

    /// Like [`HttpGateway::start`] in a directory the test prepared (certificates, say).
    /// Another process may take the port between the probe and the bind; then it retries
    /// with another one.
    pub fn start_in(dir: tempfile::TempDir, listen_extra: &str, extra: &str) -> HttpGateway {
        Self::start_with_env(dir, listen_extra, extra, &[])
    }

    /// Like [`HttpGateway::start_in`] with more environment variables for the gateway.
    pub fn start_with_env(
        dir: tempfile::TempDir,
        listen_extra: &str,
        extra: &str,
        envs: &[(&str, &str)],
    ) -> HttpGateway {
        let config_path = dir.path().join("toolwall.toml");
        let mut last_log = String::new();
        for _ in 0..5 {
            let port = free_port();
            let config = http_config(dir.path(), port, listen_extra, extra);
            std::fs::write(&config_path, &config).expect("write config");
            let stderr = Arc::new(Mutex::new(Vec::new()));
            let mut child = Command::new(BIN)
                .arg("serve")
                .arg("--config")
                .arg(&config_path)
                .current_dir(dir.path())
                .envs(envs.iter().copied())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn toolwall serve");
            collect_lines(child.stderr.take().expect("stderr"), Arc::clone(&stderr));
            let deadline = Instant::now() + PATIENCE;
            let ready = loop {
                let log = stderr.lock().unwrap().join("\n");
                if log.contains("info: ready") {
                    break true;
                }
                if matches!(child.try_wait(), Ok(Some(_))) || Instant::now() > deadline {
                    break false;
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            if ready {
                let gw = TestGateway {
                    run_as: None,
                    ready_line: "info: ready",
                    sock: dir.path().join("mcp.sock"),
                    admin: dir.path().join("admin.sock"),
                    ledger: dir.path().join("state/ledger.db"),
                    config_path,
                    dir,
                    child: Some(child),
                    stderr,
                };
                return HttpGateway { gw, port };
            }
            let _ = child.kill();
            let _ = wait_timeout(&mut child, PATIENCE);
            last_log = stderr.lock().unwrap().join("\n");
            if !last_log.contains("in use") {
                break;
            }
        }
        panic!("the gateway with an HTTP door did not start; log:\n{last_log}");
    }

    /// A new TCP connection to the door.
    pub fn http(&self) -> Http<TcpStream> {
        Http::connect(self.port)
    }

    /// `toolwall token create`; returns the token (the last line it prints).
    pub fn token(&self, principal: &str, kind: &str, expires: &str) -> String {
        let out = self.cli(&[
            "token",
            "create",
            "--principal",
            principal,
            "--kind",
            kind,
            "--expires",
            expires,
        ]);
        assert!(
            out.status.success(),
            "token create failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).expect("token output is UTF-8");
        let token = text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        assert!(token.starts_with("twt_"), "no token in: {text}");
        token.trim().to_owned()
    }

    /// A client token for `principal` that never expires.
    pub fn client_token(&self, principal: &str) -> String {
        self.token(principal, "client", "never")
    }

    /// A POST /mcp with the headers every MCP client sends.
    pub fn post(&self, body: &Value) -> Req {
        Req::post_mcp(self.port, body)
    }
}

/// Push each line of `stream` into `lines` (echoed with TOOLWALL_TEST_ECHO set).
pub fn collect_lines(stream: impl Read + Send + 'static, lines: Arc<Mutex<Vec<String>>>) {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            if std::env::var_os("TOOLWALL_TEST_ECHO").is_some() {
                eprintln!("[gw] {line}");
            }
            lines.lock().unwrap().push(line);
        }
    });
}

/// An HTTP request, written out exactly as built.
#[derive(Debug, Clone)]
pub struct Req {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Req {
    /// A request with only `Host: 127.0.0.1:port`.
    pub fn new(method: &str, path: &str, port: u16) -> Req {
        Req {
            method: method.into(),
            path: path.into(),
            headers: vec![("Host".into(), format!("127.0.0.1:{port}"))],
            body: Vec::new(),
        }
    }

    /// POST /mcp with Content-Type and Accept as the spec asks, and `body` as JSON.
    pub fn post_mcp(port: u16, body: &Value) -> Req {
        Req::new("POST", "/mcp", port)
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream")
            .body(body.to_string().into_bytes())
    }

    /// Add a header (a repeated name adds another line).
    pub fn header(mut self, name: &str, value: &str) -> Req {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Drop every header called `name`.
    pub fn without(mut self, name: &str) -> Req {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self
    }

    /// Replace every header called `name` by one with `value`.
    pub fn set(self, name: &str, value: &str) -> Req {
        self.without(name).header(name, value)
    }

    pub fn bearer(self, token: &str) -> Req {
        self.header("Authorization", &format!("Bearer {token}"))
    }

    pub fn session(self, id: &str) -> Req {
        self.header("Mcp-Session-Id", id)
    }

    pub fn body(mut self, body: Vec<u8>) -> Req {
        self.body = body;
        self
    }

    /// The bytes on the wire; POST always carries a Content-Length.
    pub fn bytes(&self) -> Vec<u8> {
        let mut out = format!("{} {} HTTP/1.1\r\n", self.method, self.path).into_bytes();
        for (name, value) in &self.headers {
            out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
        if self.method == "POST" || !self.body.is_empty() {
            out.extend_from_slice(format!("Content-Length: {}\r\n", self.body.len()).as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&self.body);
        out
    }
}

/// An HTTP response as read from the wire.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    /// The first header called `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "response body is not JSON ({e}): {:?}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The JSON-RPC error code of the body, if it is an error.
    pub fn error_code(&self) -> Option<i64> {
        self.json()["error"]["code"].as_i64()
    }

    /// The messages of an event-stream body, in order (each event's `data` lines joined).
    pub fn events(&self) -> Vec<Value> {
        self.text()
            .split("\n\n")
            .filter_map(|event| {
                let data: Vec<&str> = event
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(|d| d.strip_prefix(' ').unwrap_or(d))
                    .collect();
                (!data.is_empty()).then(|| {
                    serde_json::from_str(&data.join("\n")).expect("an event's data is JSON")
                })
            })
            .collect()
    }

    /// The JSON-RPC answer: the body, or the last event of an event stream.
    pub fn answer(&self) -> Value {
        if self.header("content-type") == Some("text/event-stream") {
            return self.events().pop().expect("the stream holds the answer");
        }
        self.json()
    }
}

/// A client connection: requests out, responses in, in order.
pub struct Http<S> {
    pub stream: S,
    buf: Vec<u8>,
}

impl Http<TcpStream> {
    pub fn connect(port: u16) -> Http<TcpStream> {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to the HTTP door");
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
        stream.set_nodelay(true).unwrap();
        Http::over(stream)
    }
}

impl<S: Read + Write> Http<S> {
    pub fn over(stream: S) -> Http<S> {
        Http {
            stream,
            buf: Vec::new(),
        }
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write request");
        self.stream.flush().expect("flush request");
    }

    pub fn send(&mut self, req: &Req) {
        self.send_raw(&req.bytes());
    }

    /// The next response, or None when the server closed the connection (or the wait ran
    /// out) before a whole one arrived.
    pub fn response(&mut self) -> Option<Resp> {
        loop {
            if let Some((resp, used)) = parse_response(&self.buf) {
                self.buf.drain(..used);
                return Some(resp);
            }
            let mut chunk = [0u8; 65536];
            match self.stream.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Send `req` and read its response.
    pub fn call(&mut self, req: &Req) -> Resp {
        self.send(req);
        self.response()
            .unwrap_or_else(|| panic!("no response to {} {}", req.method, req.path))
    }

    /// The next response is an event stream that ends with no message in it (a cancelled
    /// call's).
    pub fn assert_stream_ends_without_answer(&mut self) {
        let r = self.response().expect("the cancelled call's stream ends");
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-type"), Some("text/event-stream"));
        assert!(r.events().is_empty(), "no answer: {:?}", r.events());
    }

    /// True when the server closes the connection (EOF or reset) within the wait, with no
    /// further response bytes.
    pub fn closed_by_peer(&mut self) -> bool {
        let mut chunk = [0u8; 4096];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return self.buf.is_empty(),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }
}

/// A whole response at the start of `buf` and the bytes it used.
fn parse_response(buf: &[u8]) -> Option<(Resp, usize)> {
    let mut slots = [httparse::EMPTY_HEADER; 64];
    let mut parsed = httparse::Response::new(&mut slots);
    let head_len = match parsed.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return None,
        Err(e) => panic!(
            "the server sent a malformed response ({e}): {:?}",
            String::from_utf8_lossy(buf)
        ),
    };
    let status = parsed.code.expect("status code");
    let headers: Vec<(String, String)> = parsed
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_owned(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect();
    let length = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.trim().parse::<usize>().expect("numeric Content-Length"))
        .unwrap_or(0);
    let chunked = headers.iter().any(|(n, v)| {
        n.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    if chunked {
        // Only an answer streamed as events is chunked.
        let (body, used) = dechunk(&buf[head_len..])?;
        return Some((
            Resp {
                status,
                headers,
                body,
            },
            head_len + used,
        ));
    }
    if buf.len() < head_len + length {
        return None;
    }
    let body = buf[head_len..head_len + length].to_vec();
    Some((
        Resp {
            status,
            headers,
            body,
        },
        head_len + length,
    ))
}

/// A whole chunked body at the start of `buf`: the body and the bytes it used.
fn dechunk(buf: &[u8]) -> Option<(Vec<u8>, usize)> {
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let line_end = at + buf[at..].windows(2).position(|w| w == b"\r\n")?;
        let size = std::str::from_utf8(&buf[at..line_end]).expect("chunk size");
        let size = usize::from_str_radix(size.trim(), 16).expect("hex chunk size");
        at = line_end + 2;
        if buf.len() < at + size + 2 {
            return None;
        }
        if size == 0 {
            return Some((body, at + 2));
        }
        body.extend_from_slice(&buf[at..at + size]);
        assert_eq!(
            &buf[at + size..at + size + 2],
            b"\r\n",
            "chunk ends with CRLF"
        );
        at += size + 2;
    }
}

/// A JSON-RPC request.
pub fn rpc(id: u64, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

/// A legacy `initialize` request.
pub fn initialize(id: u64) -> Value {
    rpc(
        id,
        "initialize",
        json!({
            "protocolVersion": LEGACY,
            "capabilities": {},
            "clientInfo": {"name": "toolwall-tests", "version": "1"}
        }),
    )
}

/// Open a legacy session on `http` (initialize, then notifications/initialized); returns
/// the session id. `token` None sends no Authorization.
pub fn open_session<S: Read + Write>(http: &mut Http<S>, port: u16, token: Option<&str>) -> String {
    let mut req = Req::post_mcp(port, &initialize(1));
    if let Some(t) = token {
        req = req.bearer(t);
    }
    let resp = http.call(&req);
    assert_eq!(resp.status, 200, "initialize: {}", resp.text());
    let session = resp
        .header("Mcp-Session-Id")
        .expect("initialize answers with Mcp-Session-Id")
        .to_owned();
    let mut note = Req::post_mcp(
        port,
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .session(&session)
    .header("MCP-Protocol-Version", LEGACY);
    if let Some(t) = token {
        note = note.bearer(t);
    }
    let ack = http.call(&note);
    assert_eq!(ack.status, 202, "notifications/initialized: {}", ack.text());
    session
}

/// A modern-era (2026-07-28) request: `_meta` in the params and the mirrored headers.
/// `name` goes into `Mcp-Name` (tools/call, prompts/get, resources/read).
pub fn modern(port: u16, id: u64, method: &str, mut params: Value, name: Option<&str>) -> Req {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    let mut req = Req::post_mcp(port, &rpc(id, method, params))
        .header("MCP-Protocol-Version", MODERN)
        .header("Mcp-Method", method);
    if let Some(n) = name {
        req = req.header("Mcp-Name", n);
    }
    req
}

/// A legacy `tools/call` of `local__echo` in `session`.
pub fn echo_in_session(port: u16, id: u64, session: &str, text: &str) -> Req {
    Req::post_mcp(
        port,
        &rpc(
            id,
            "tools/call",
            json!({"name": "local__echo", "arguments": {"text": text}}),
        ),
    )
    .session(session)
    .header("MCP-Protocol-Version", LEGACY)
}

/// The text of a tools/call result.
pub fn result_text(body: &Value) -> String {
    body["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text content in {body}"))
        .to_owned()
}
