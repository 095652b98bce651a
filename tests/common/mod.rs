//! Test harness: the real `toolwall` binary with a temporary config, framed clients over
//! real unix sockets, and the real ledger file read with SQLite.

#![allow(dead_code)]

pub mod deps;
pub mod flood;
pub mod http;

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use toolwall_relay::frame::{self, Decoded};

pub const BIN: &str = env!("CARGO_BIN_EXE_toolwall");

/// Set to a user name, the gateways of the tests run as that user with the capabilities
/// the shipped unit grants (`tests/walls-as-service-user.sh`); unset, as this process.
pub const SERVICE_USER_ENV: &str = "TOOLWALL_TEST_SERVICE_USER";
/// What `systemd/toolwall.service` grants (CapabilityBoundingSet=, AmbientCapabilities=).
pub const SERVICE_CAPS: &str = "+setuid,+setgid,+setpcap";

/// The service user the gateways run as, when [`SERVICE_USER_ENV`] names one (created
/// when missing).
pub fn service_user() -> Option<toolwall::launcher::AgentIdentity> {
    let name = std::env::var(SERVICE_USER_ENV)
        .ok()
        .filter(|n| !n.is_empty())?;
    Some(ensure_user(&name))
}

/// How long a test waits for anything before failing (never asserted as a speed).
pub const PATIENCE: Duration = Duration::from_secs(20);

pub struct TestGateway {
    /// The log line `spawn` waits for (`info: ready`, or what a test expects instead).
    pub ready_line: &'static str,
    /// The user the gateway runs as and the capabilities it holds (setpriv syntax), when
    /// not this process's.
    pub run_as: Option<(toolwall::launcher::AgentIdentity, String)>,
    pub dir: tempfile::TempDir,
    pub child: Option<Child>,
    pub config_path: PathBuf,
    pub sock: PathBuf,
    pub admin: PathBuf,
    pub ledger: PathBuf,
    pub stderr: Arc<Mutex<Vec<String>>>,
}

/// The config every test starts from; `extra` is appended (later tables may not repeat
/// these ones).
pub fn base_config(dir: &Path, extra: &str) -> String {
    format!(
        r#"
[listen]
unix = "{d}/mcp.sock"

[ledger]
path = "{d}/state/ledger.db"

[admin]
socket = "{d}/admin.sock"

{extra}
"#,
        d = dir.display()
    )
}

impl TestGateway {
    pub fn start(extra: &str) -> TestGateway {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = base_config(dir.path(), extra);
        Self::start_with(dir, &config)
    }

    pub fn start_with(dir: tempfile::TempDir, config: &str) -> TestGateway {
        let run_as = service_user().map(|u| (u, SERVICE_CAPS.to_string()));
        Self::start_as(dir, config, run_as)
    }

    /// As [`TestGateway::start_with`], the gateway run as `run_as`: a user and the
    /// capabilities it keeps (`+setuid,+setgid`, or empty for none), ambient, as a unit's
    /// `AmbientCapabilities=` gives them.
    pub fn start_as(
        dir: tempfile::TempDir,
        config: &str,
        run_as: Option<(toolwall::launcher::AgentIdentity, String)>,
    ) -> TestGateway {
        Self::start_until(dir, config, run_as, "info: ready")
    }

    /// As [`TestGateway::start_as`], waiting for the log line `ready_line`.
    pub fn start_until(
        dir: tempfile::TempDir,
        config: &str,
        run_as: Option<(toolwall::launcher::AgentIdentity, String)>,
        ready_line: &'static str,
    ) -> TestGateway {
        let config_path = dir.path().join("toolwall.toml");
        std::fs::write(&config_path, config).expect("write config");
        let mut gw = TestGateway {
            ready_line,
            run_as,
            sock: dir.path().join("mcp.sock"),
            admin: dir.path().join("admin.sock"),
            ledger: dir.path().join("state/ledger.db"),
            config_path,
            dir,
            child: None,
            stderr: Arc::new(Mutex::new(Vec::new())),
        };
        gw.spawn();
        gw
    }

    pub fn spawn(&mut self) {
        let mut command = match &self.run_as {
            Some((user, caps)) => {
                // As a unit runs it: a service user holding only the given capabilities
                // (ambient), owning its state directory (what is in it keeps its owner:
                // workspace roots belong to their agent users).
                for p in [self.dir.path(), self.config_path.as_path()] {
                    std::os::unix::fs::chown(p, Some(user.uid), Some(user.gid))
                        .expect("chown to the service user");
                }
                searchable_above(self.dir.path());
                let caps = if caps.is_empty() {
                    String::new()
                } else {
                    format!(",{caps}")
                };
                let mut c = Command::new("setpriv");
                c.arg(format!("--reuid={}", user.uid))
                    .arg(format!("--regid={}", user.gid))
                    .arg("--init-groups")
                    .arg(format!("--inh-caps=-all{caps}"))
                    .arg(format!("--ambient-caps=-all{caps}"))
                    .arg(format!("--bounding-set=-all{caps}"))
                    .arg("--no-new-privs")
                    .arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        let mut child = command
            .arg("serve")
            .arg("--config")
            .arg(&self.config_path)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn toolwall serve");
        let stderr = child.stderr.take().expect("stderr");
        let lines = Arc::clone(&self.stderr);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if std::env::var_os("TOOLWALL_TEST_ECHO").is_some() {
                    eprintln!("[gw] {line}");
                }
                lines.lock().unwrap().push(line);
            }
        });
        self.child = Some(child);
        self.wait_for_log(self.ready_line);
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Wait until a stderr line contains `needle`; panics with the log on timeout.
    pub fn wait_for_log(&self, needle: &str) {
        let deadline = Instant::now() + PATIENCE;
        while Instant::now() < deadline {
            if self.log().contains(needle) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("gateway never logged {needle:?}; log:\n{}", self.log());
    }

    pub fn log(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }

    pub fn connect(&self) -> FramedClient {
        FramedClient::connect(&self.sock)
    }

    pub fn admin(&self, request: Value) -> Value {
        let mut s = UnixStream::connect(&self.admin).expect("admin connect");
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        s.write_all(format!("{request}\n").as_bytes()).unwrap();
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).unwrap();
        serde_json::from_str(&line).expect("admin answer is JSON")
    }

    /// Run the CLI against this gateway's config.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(BIN)
            .args(args)
            .arg("--config")
            .arg(&self.config_path)
            .current_dir(self.dir.path())
            .output()
            .expect("run toolwall")
    }

    pub fn ledger(&self) -> rusqlite::Connection {
        rusqlite::Connection::open_with_flags(
            &self.ledger,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .expect("open ledger")
    }

    /// tool_calls rows as JSON objects, oldest first.
    pub fn tool_calls(&self) -> Vec<Value> {
        query_json(&self.ledger(), "SELECT * FROM tool_calls ORDER BY id")
    }

    pub fn events(&self, kind: &str) -> Vec<Value> {
        let conn = self.ledger();
        let mut stmt = conn
            .prepare("SELECT * FROM events WHERE kind = ?1 ORDER BY id")
            .unwrap();
        rows_json(&mut stmt, [kind])
    }

    /// Wait until `check` holds for the tool_calls rows.
    pub fn wait_rows(&self, what: &str, check: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let rows = self.tool_calls();
            if check(&rows) {
                return rows;
            }
            if Instant::now() > deadline {
                panic!("ledger never showed {what}; rows: {rows:#?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn worker_pid(&self) -> u32 {
        let status = self.admin(json!({"op": "status"}));
        status["workers"][0]["pid"].as_u64().expect("worker pid") as u32
    }

    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        wait_timeout(&mut child, PATIENCE).expect("gateway exits after SIGTERM")
    }
}

impl Drop for TestGateway {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A child process that is killed and reaped when the test ends, even by a panic (a
/// leaked child keeps the test runner's pipes open).
pub struct ChildGuard(pub Child);

impl std::ops::Deref for ChildGuard {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for ChildGuard {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

pub fn wait_timeout(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn query_json(conn: &rusqlite::Connection, sql: &str) -> Vec<Value> {
    let mut stmt = conn.prepare(sql).unwrap();
    rows_json(&mut stmt, [])
}

fn rows_json<P: rusqlite::Params>(stmt: &mut rusqlite::Statement, params: P) -> Vec<Value> {
    let names: Vec<String> = stmt.column_names().map(|s| s.to_string()).collect();
    let mut rows = stmt.query(params).unwrap();
    let mut out = Vec::new();
    while let Some(row) = rows.next().unwrap() {
        let mut obj = serde_json::Map::new();
        for (i, name) in names.iter().enumerate() {
            let v = match row.get_ref(i).unwrap() {
                rusqlite::types::ValueRef::Null => Value::Null,
                rusqlite::types::ValueRef::Integer(n) => json!(n),
                rusqlite::types::ValueRef::Real(f) => json!(f),
                rusqlite::types::ValueRef::Text(t) => json!(String::from_utf8_lossy(t)),
                rusqlite::types::ValueRef::Blob(b) => json!(String::from_utf8_lossy(b)),
            };
            obj.insert(name.clone(), v);
        }
        out.push(Value::Object(obj));
    }
    out
}

/// A framed client, as the relay is, over a real unix socket.
pub struct FramedClient {
    pub stream: UnixStream,
    pub next_sid: u32,
    buf: Vec<u8>,
    pub name: String,
}

#[derive(Debug)]
pub struct Reply {
    pub stream: u32,
    pub flags: u16,
    pub body: Value,
}

impl FramedClient {
    pub fn connect(path: &Path) -> FramedClient {
        // A socket file can exist a moment before its listener listens (systemd's).
        let deadline = Instant::now() + PATIENCE;
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e)
                    if e.kind() == std::io::ErrorKind::ConnectionRefused
                        && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("connect framed socket {}: {e}", path.display()),
            }
        };
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
        FramedClient {
            stream,
            next_sid: 1,
            buf: Vec::new(),
            name: "test-agent".into(),
        }
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write");
    }

    pub fn send_frame(&mut self, sid: u32, flags: u16, payload: &[u8]) {
        let mut out = Vec::new();
        frame::encode(&mut out, sid, flags, &self.name, payload).expect("encode");
        self.send_raw(&out);
    }

    /// Send a request; returns its stream id.
    pub fn request(&mut self, id: Value, method: &str, params: Option<Value>) -> u32 {
        let mut msg = json!({"jsonrpc": "2.0", "id": id, "method": method});
        if let Some(p) = params {
            msg["params"] = p;
        }
        let sid = self.next_sid;
        self.next_sid += 1;
        self.send_frame(sid, 0, msg.to_string().as_bytes());
        sid
    }

    pub fn notify(&mut self, method: &str, params: Option<Value>) {
        let mut msg = json!({"jsonrpc": "2.0", "method": method});
        if let Some(p) = params {
            msg["params"] = p;
        }
        self.send_frame(0, frame::FLAG_NOTIFICATION, msg.to_string().as_bytes());
    }

    /// Request and wait for its answer (other frames in between are skipped).
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let id = json!(self.next_sid as u64 * 10);
        let sid = self.request(id.clone(), method, Some(params));
        loop {
            let reply = self
                .recv()
                .unwrap_or_else(|| panic!("no answer to {method}"));
            if reply.stream == sid {
                assert_eq!(reply.body["id"], id, "answer carries the request id");
                return reply.body;
            }
        }
    }

    pub fn tool(&mut self, name: &str, arguments: Value) -> Value {
        self.call("tools/call", json!({"name": name, "arguments": arguments}))
    }

    /// The next frame, or None when the connection closed (or the wait ran out).
    pub fn recv(&mut self) -> Option<Reply> {
        loop {
            match frame::decode_frame(&self.buf) {
                Ok(Decoded::Frame {
                    header,
                    payload,
                    consumed,
                    ..
                }) => {
                    let body = serde_json::from_slice(payload).expect("gateway sends JSON");
                    let reply = Reply {
                        stream: header.stream_id,
                        flags: header.flags,
                        body,
                    };
                    self.buf.drain(..consumed);
                    return Some(reply);
                }
                Ok(Decoded::NeedMore) => {}
                other => panic!("gateway sent a bad frame: {other:?}"),
            }
            let mut chunk = [0u8; 65536];
            match self.stream.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// True when the gateway closed the connection (EOF or reset) within the wait.
    pub fn closed_by_peer(&mut self) -> bool {
        let mut chunk = [0u8; 65536];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }
}

/// Run `toolwall stdio` with the given config, feed it `lines`, return stdout lines.
pub fn stdio_session(
    config_path: &Path,
    cwd: &Path,
    lines: &[String],
) -> (Vec<Value>, std::process::ExitStatus, String) {
    let mut child = Command::new(BIN)
        .arg("stdio")
        .arg("--config")
        .arg(config_path)
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn toolwall stdio");
    {
        let mut stdin = child.stdin.take().unwrap();
        for l in lines {
            stdin.write_all(l.as_bytes()).unwrap();
            stdin.write_all(b"\n").unwrap();
        }
    }
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = wait_timeout(&mut child, PATIENCE).expect("stdio exits at EOF");
    let values = out
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {l}"))
        })
        .collect();
    (values, status, err)
}

/// The default agent user (`toolwall-agent`), created as `serve` would create it when this
/// machine has none yet. The tests run as root, like CI.
pub fn agent_user() -> toolwall::launcher::AgentIdentity {
    use toolwall::launcher::identity;
    static AGENT: std::sync::OnceLock<toolwall::launcher::AgentIdentity> =
        std::sync::OnceLock::new();
    AGENT
        .get_or_init(|| match identity::lookup(identity::DEFAULT_AGENT_USER) {
            Ok(Some(i)) => i,
            _ => identity::create_default_user().expect("create the agent user"),
        })
        .clone()
}

/// A system user for tests (created when missing), as an operator would make one for a
/// workspace that gets its own agent user.
pub fn ensure_user(name: &str) -> toolwall::launcher::AgentIdentity {
    use toolwall::launcher::identity;
    for _ in 0..20 {
        if let Ok(Some(i)) = identity::lookup(name) {
            return i;
        }
        // Another test may hold the passwd lock: look again, then retry.
        let _ = Command::new("useradd")
            .args([
                "--system",
                "--user-group",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                name,
            ])
            .stderr(Stdio::null())
            .status();
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("cannot create the test user {name}");
}

/// Hands `path` (and everything under it) to the agent user, as an operator must for a
/// workspace root, and makes every directory above it searchable.
pub fn give_to_agent(path: &Path) {
    give_to(path, &agent_user());
}

/// Hands `path` (and everything under it) to `agent`; every directory above it searchable.
pub fn give_to(path: &Path, agent: &toolwall::launcher::AgentIdentity) {
    fn walk(p: &Path, uid: u32, gid: u32) {
        std::os::unix::fs::lchown(p, Some(uid), Some(gid)).expect("chown to the agent user");
        if p.is_dir() && !p.is_symlink() {
            for e in std::fs::read_dir(p).expect("read_dir") {
                walk(&e.expect("entry").path(), uid, gid);
            }
        }
    }
    walk(path, agent.uid, agent.gid);
    searchable_above(path);
}

/// Makes every directory above `path` searchable by others (tempdirs are 0700).
pub fn searchable_above(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mut dir = path.parent();
    while let Some(d) = dir {
        if let Ok(meta) = std::fs::metadata(d) {
            let mode = meta.permissions().mode();
            if mode & 0o011 != 0o011 {
                let _ = std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode | 0o011));
            }
        }
        dir = d.parent();
    }
}

/// Makes `cmd` run as `who` (its uid and gid, no other group), the way the agent
/// launcher starts a host of agent programs. Register before any other pre_exec closure:
/// a credential change clears the parent-death signal those may arm.
pub fn run_as(cmd: &mut Command, who: &toolwall::launcher::AgentIdentity) {
    use std::os::unix::process::CommandExt;
    let (uid, gid) = (who.uid, who.gid);
    // SAFETY: only async-signal-safe system calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let groups = [gid];
            if libc::setgroups(1, groups.as_ptr()) != 0
                || libc::setresgid(gid, gid, gid) != 0
                || libc::setresuid(uid, uid, uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
