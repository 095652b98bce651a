//! The ways in that the benchmark drives, behind one trait, so that a new door (HTTP
//! `POST /mcp` with keep-alive, when the gateway has it) is one more `open_*` function and
//! one more line in `all_doors`.

use std::io::{BufRead, BufReader};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::baseline;
use crate::load::ClientConn;
use crate::options::Level;
use crate::procstat;
use crate::toolwall_proc::{Running, Setup};
use crate::wire::Wire;

/// A process behind a door, for CPU and memory: its role and pid.
#[derive(Debug, Clone)]
pub struct Proc {
    pub role: &'static str,
    pub pid: u32,
}

/// The ledger's word after a door's runs.
#[derive(Debug, Clone)]
pub enum LedgerCheck {
    /// A baseline: nothing to record.
    NotApplicable,
    Checked {
        rows: u64,
        allowed: u64,
        answered: u64,
    },
    /// This build's ledger writes no file (the interface stand-in): nothing to count.
    NoLedger,
    Failed(String),
}

impl LedgerCheck {
    pub fn ok(&self) -> bool {
        match self {
            LedgerCheck::Checked {
                rows,
                allowed,
                answered,
            } => rows == answered && allowed == answered,
            LedgerCheck::Failed(_) => false,
            _ => true,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            LedgerCheck::NotApplicable => "-".into(),
            LedgerCheck::Checked {
                rows,
                allowed,
                answered,
            } => {
                let verdict = if self.ok() { "OK" } else { "MISMATCH" };
                format!("{verdict}: {rows} rows ({allowed} allowed) for {answered} answers")
            }
            LedgerCheck::NoLedger => "no ledger file (ledger stand-in build)".into(),
            LedgerCheck::Failed(why) => format!("MISMATCH: {why}"),
        }
    }
}

/// One way into an echo server: toolwall's doors and the baselines.
pub trait Door {
    fn name(&self) -> &str;
    /// Whether this door runs at `level` (a process per agent serves one connection).
    fn runs_at(&self, level: Level) -> bool;
    /// Open one client connection, ready for calls.
    fn connect(&mut self) -> Result<ClientConn, String>;
    /// The processes serving the connections opened so far.
    fn processes(&self) -> Vec<Proc>;
    /// Stop, and check the ledger against `answered` calls.
    fn finish(&mut self, answered: u64) -> LedgerCheck;
}

pub const BASELINE_ONE_HOP: &str = "baseline 1-hop";
pub const BASELINE_TWO_HOP: &str = "baseline 2-hop";

/// Everything the doors need to start.
pub struct Ctx {
    pub toolwall_bin: PathBuf,
    pub relay_bin: Option<PathBuf>,
    pub with_rules: bool,
    /// Whether the library's ledger writes a file (else row counts are not checked).
    pub ledger_is_real: bool,
}

/// A door, or why it is skipped this run.
pub type Opened = Result<Box<dyn Door>, String>;

/// Starts a door.
pub type Opener = fn(&Ctx) -> Opened;

/// Every door in the order they run: baselines first, so the ratios exist when toolwall's
/// rows are printed.
pub fn all_doors() -> Vec<(&'static str, Opener)> {
    vec![
        (BASELINE_ONE_HOP, open_one_hop),
        (BASELINE_TWO_HOP, open_two_hop),
        ("toolwall unix", open_toolwall_unix),
        ("toolwall stdio", open_toolwall_stdio),
        ("toolwall relay", open_toolwall_relay),
        ("toolwall http", open_toolwall_http),
        (
            crate::stdio_doors::DIRECT,
            crate::stdio_doors::open_direct as Opener,
        ),
        (
            crate::stdio_doors::THROUGH,
            crate::stdio_doors::open_through as Opener,
        ),
        (
            crate::stdio_doors::SDK_DIRECT,
            crate::stdio_doors::open_sdk_direct as Opener,
        ),
        (
            crate::stdio_doors::SDK_THROUGH,
            crate::stdio_doors::open_sdk_through as Opener,
        ),
    ]
}

pub fn framed_conn(path: &Path) -> Result<ClientConn, String> {
    let stream =
        UnixStream::connect(path).map_err(|e| format!("connect {}: {e}", path.display()))?;
    ClientConn::from_socket(OwnedFd::from(stream), Wire::Framed).map_err(|e| e.to_string())
}

/// A baseline server process: the bench binary re-executed in a role; returns once it
/// listens.
struct BaselineProc {
    child: Child,
}

impl BaselineProc {
    fn start(args: &[&Path], role: &str) -> Result<BaselineProc, String> {
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let mut child = Command::new(exe)
            .arg(role)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("start {role}: {e}"))?;
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            let _ = BufReader::new(out).read_line(&mut line);
        }
        if line.trim() != "ready" {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{role} did not start"));
        }
        Ok(BaselineProc { child })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for BaselineProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct OneHop {
    _dir: tempfile::TempDir,
    sock: PathBuf,
    echo: BaselineProc,
}

fn open_one_hop(_: &Ctx) -> Opened {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let sock = dir.path().join("echo.sock");
    let echo = BaselineProc::start(&[&sock], baseline::ECHO_ROLE)?;
    Ok(Box::new(OneHop {
        _dir: dir,
        sock,
        echo,
    }))
}

impl Door for OneHop {
    fn name(&self) -> &str {
        BASELINE_ONE_HOP
    }
    fn runs_at(&self, _: Level) -> bool {
        true
    }
    fn connect(&mut self) -> Result<ClientConn, String> {
        framed_conn(&self.sock)
    }
    fn processes(&self) -> Vec<Proc> {
        vec![Proc {
            role: "echo",
            pid: self.echo.pid(),
        }]
    }
    fn finish(&mut self, _: u64) -> LedgerCheck {
        LedgerCheck::NotApplicable
    }
}

struct TwoHop {
    _dir: tempfile::TempDir,
    sock: PathBuf,
    forward: BaselineProc,
    echo: BaselineProc,
}

fn open_two_hop(_: &Ctx) -> Opened {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let echo_sock = dir.path().join("echo.sock");
    let sock = dir.path().join("fwd.sock");
    let echo = BaselineProc::start(&[&echo_sock], baseline::ECHO_ROLE)?;
    let forward = BaselineProc::start(&[&sock, &echo_sock], baseline::FORWARD_ROLE)?;
    Ok(Box::new(TwoHop {
        _dir: dir,
        sock,
        forward,
        echo,
    }))
}

impl Door for TwoHop {
    fn name(&self) -> &str {
        BASELINE_TWO_HOP
    }
    fn runs_at(&self, _: Level) -> bool {
        true
    }
    fn connect(&mut self) -> Result<ClientConn, String> {
        framed_conn(&self.sock)
    }
    fn processes(&self) -> Vec<Proc> {
        vec![
            Proc {
                role: "forwarder",
                pid: self.forward.pid(),
            },
            Proc {
                role: "echo",
                pid: self.echo.pid(),
            },
        ]
    }
    fn finish(&mut self, _: u64) -> LedgerCheck {
        LedgerCheck::NotApplicable
    }
}

/// `toolwall serve` and what is needed to count its ledger rows.
pub struct Served {
    pub setup: Setup,
    gateway: Running,
    worker: Option<u32>,
    ledger_is_real: bool,
}

impl Served {
    fn start(ctx: &Ctx) -> Result<Served, String> {
        Served::start_with(ctx, Setup::new(ctx.with_rules).map_err(|e| e.to_string())?)
    }

    /// `toolwall serve` on `setup`.
    pub fn start_with(ctx: &Ctx, setup: Setup) -> Result<Served, String> {
        let gateway = setup
            .spawn(&ctx.toolwall_bin, "serve", Stdio::null())
            .map_err(|e| e.to_string())?;
        let worker = gateway.worker_pid(Some(&setup.admin));
        Ok(Served {
            setup,
            gateway,
            worker,
            ledger_is_real: ctx.ledger_is_real,
        })
    }

    pub fn processes(&self) -> Vec<Proc> {
        let mut p = vec![Proc {
            role: "gateway",
            pid: self.gateway.pid(),
        }];
        if let Some(pid) = self.worker {
            p.push(Proc {
                role: "worker",
                pid,
            });
        }
        p
    }

    pub fn finish(&mut self, answered: u64) -> LedgerCheck {
        if let Err(e) = self.gateway.stop() {
            return LedgerCheck::Failed(e);
        }
        check_ledger(&self.setup, answered, self.ledger_is_real)
    }
}

fn check_ledger(setup: &Setup, answered: u64, ledger_is_real: bool) -> LedgerCheck {
    match setup.ledger_rows() {
        Ok(Some((rows, allowed))) => LedgerCheck::Checked {
            rows,
            allowed,
            answered,
        },
        Ok(None) if !ledger_is_real => LedgerCheck::NoLedger,
        Ok(None) => LedgerCheck::Failed(format!(
            "no ledger file at {} after {answered} answers",
            setup.ledger.display()
        )),
        Err(e) => LedgerCheck::Failed(e),
    }
}

struct ToolwallUnix {
    served: Served,
}

fn open_toolwall_unix(ctx: &Ctx) -> Opened {
    Ok(Box::new(ToolwallUnix {
        served: Served::start(ctx)?,
    }))
}

impl Door for ToolwallUnix {
    fn name(&self) -> &str {
        "toolwall unix"
    }
    fn runs_at(&self, _: Level) -> bool {
        true
    }
    fn connect(&mut self) -> Result<ClientConn, String> {
        framed_conn(&self.served.setup.sock)
    }
    fn processes(&self) -> Vec<Proc> {
        self.served.processes()
    }
    fn finish(&mut self, answered: u64) -> LedgerCheck {
        self.served.finish(answered)
    }
}

/// `toolwall stdio`: one process per connection, like an agent that starts it as its MCP
/// server. The ledger file is shared by the processes, one after the other.
struct ToolwallStdio {
    setup: Setup,
    bin: PathBuf,
    current: Option<Running>,
    ledger_is_real: bool,
}

fn open_toolwall_stdio(ctx: &Ctx) -> Opened {
    Ok(Box::new(ToolwallStdio {
        setup: Setup::new(ctx.with_rules).map_err(|e| e.to_string())?,
        bin: ctx.toolwall_bin.clone(),
        current: None,
        ledger_is_real: ctx.ledger_is_real,
    }))
}

impl ToolwallStdio {
    /// The previous process got EOF when its connection was dropped: wait for it to leave.
    fn end_current(&mut self) -> Result<(), String> {
        match self.current.take() {
            Some(mut running) => running.wait_exit(),
            None => Ok(()),
        }
    }
}

impl Door for ToolwallStdio {
    fn name(&self) -> &str {
        "toolwall stdio"
    }
    fn runs_at(&self, level: Level) -> bool {
        level.conns == 1
    }
    fn connect(&mut self) -> Result<ClientConn, String> {
        self.end_current()?;
        let mut running = self
            .setup
            .spawn(&self.bin, "stdio", Stdio::piped())
            .map_err(|e| e.to_string())?;
        let (Some(stdin), Some(stdout)) = (running.child.stdin.take(), running.child.stdout.take())
        else {
            return Err("toolwall stdio without pipes".into());
        };
        self.current = Some(running);
        Ok(ClientConn {
            rx: OwnedFd::from(stdout).into(),
            tx: OwnedFd::from(stdin).into(),
            wire: Wire::Lines,
            tool: crate::wire::ECHO_TOOL,
        })
    }
    fn processes(&self) -> Vec<Proc> {
        let Some(running) = &self.current else {
            return Vec::new();
        };
        let mut p = vec![Proc {
            role: "gateway",
            pid: running.pid(),
        }];
        if let Some(pid) = running.worker_pid(None) {
            p.push(Proc {
                role: "worker",
                pid,
            });
        }
        p
    }
    fn finish(&mut self, answered: u64) -> LedgerCheck {
        if let Err(e) = self.end_current() {
            return LedgerCheck::Failed(e);
        }
        check_ledger(&self.setup, answered, self.ledger_is_real)
    }
}

/// The guest relay (`toolwall-relay --connect unix:...`) in front of `toolwall serve`: the
/// whole path an agent in a VM takes, minus vsock. One relay process per connection.
struct ToolwallRelay {
    served: Served,
    relay_bin: PathBuf,
    relays: Vec<Child>,
}

fn open_toolwall_relay(ctx: &Ctx) -> Opened {
    let relay_bin = ctx
        .relay_bin
        .clone()
        .ok_or("the toolwall-relay binary could not be built")?;
    Ok(Box::new(ToolwallRelay {
        served: Served::start(ctx)?,
        relay_bin,
        relays: Vec::new(),
    }))
}

impl ToolwallRelay {
    fn end_relays(&mut self) {
        for mut r in self.relays.drain(..) {
            // Each got EOF on stdin when its connection was dropped.
            let _ = r.wait();
        }
    }
}

impl Door for ToolwallRelay {
    fn name(&self) -> &str {
        "toolwall relay"
    }
    fn runs_at(&self, level: Level) -> bool {
        level.conns == 1
    }
    fn connect(&mut self) -> Result<ClientConn, String> {
        self.end_relays();
        let mut child = Command::new(&self.relay_bin)
            .arg("--connect")
            .arg(format!("unix:{}", self.served.setup.sock.display()))
            .arg("--name")
            .arg(crate::wire::CLIENT_NAME)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("start toolwall-relay: {e}"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("toolwall-relay without pipes".into());
        };
        self.relays.push(child);
        Ok(ClientConn {
            rx: OwnedFd::from(stdout).into(),
            tx: OwnedFd::from(stdin).into(),
            wire: Wire::Lines,
            tool: crate::wire::ECHO_TOOL,
        })
    }
    fn processes(&self) -> Vec<Proc> {
        let mut p = self.served.processes();
        p.extend(self.relays.iter().map(|r| Proc {
            role: "relay",
            pid: r.id(),
        }));
        p
    }
    fn finish(&mut self, answered: u64) -> LedgerCheck {
        self.end_relays();
        self.served.finish(answered)
    }
}

/// HTTP `POST /mcp` with keep-alive, the legacy era: each connection initializes its own
/// session with a client token (created with `toolwall token create`), then sends its
/// calls with `Mcp-Session-Id`, `MCP-Protocol-Version` and `Authorization` headers.
struct ToolwallHttp {
    served: Served,
    port: u16,
    token: String,
}

fn open_toolwall_http(ctx: &Ctx) -> Opened {
    // A free loopback port: bind, read it back, release it for the gateway.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("free port: {e}"))?
        .port();
    let setup = Setup::with_http(ctx.with_rules, Some(port)).map_err(|e| e.to_string())?;
    let out = Command::new(&ctx.toolwall_bin)
        .args(["token", "create", "--principal", "bench", "--config"])
        .arg(&setup.config)
        .current_dir(setup.dir.path())
        .output()
        .map_err(|e| format!("toolwall token create: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let token = text
        .split_whitespace()
        .find(|w| w.starts_with("twt_"))
        .ok_or_else(|| format!("no token in the output of toolwall token create: {text}"))?
        .to_owned();
    let gateway = setup
        .spawn(&ctx.toolwall_bin, "serve", Stdio::null())
        .map_err(|e| e.to_string())?;
    let worker = gateway.worker_pid(Some(&setup.admin));
    Ok(Box::new(ToolwallHttp {
        served: Served {
            setup,
            gateway,
            worker,
            ledger_is_real: ctx.ledger_is_real,
        },
        port,
        token,
    }))
}

impl Door for ToolwallHttp {
    fn name(&self) -> &str {
        "toolwall http"
    }
    fn runs_at(&self, _: Level) -> bool {
        true
    }
    fn connect(&mut self) -> Result<ClientConn, String> {
        use std::io::{Read, Write};
        let host = format!("127.0.0.1:{}", self.port);
        let mut stream =
            std::net::TcpStream::connect(&host).map_err(|e| format!("connect {host}: {e}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let body = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}"#;
        let request = format!(
            "POST /mcp HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nAuthorization: Bearer {}\r\n\
             Content-Length: {}\r\n\r\n{body}",
            self.token,
            body.len()
        );
        stream
            .write_all(request.as_bytes())
            .map_err(|e| e.to_string())?;
        // Read the whole response (head + Content-Length body) to learn the session id.
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let probe = Wire::Http {
            host: host.clone(),
            path: "/mcp".into(),
            headers: String::new(),
        };
        let session = loop {
            let n = stream.read(&mut chunk).map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("the gateway closed the connection during initialize".into());
            }
            buf.extend_from_slice(&chunk[..n]);
            if probe.decode(&buf)?.is_some() {
                let head = String::from_utf8_lossy(&buf);
                let id = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("mcp-session-id")
                            .then(|| v.trim().to_owned())
                    })
                    .ok_or("initialize answered without Mcp-Session-Id")?;
                break id;
            }
        };
        let headers = format!(
            "Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2025-06-18\r\nAuthorization: Bearer {}\r\n",
            self.token
        );
        ClientConn::from_socket(
            std::os::fd::OwnedFd::from(stream),
            Wire::Http {
                host,
                path: "/mcp".into(),
                headers,
            },
        )
        .map_err(|e| e.to_string())
    }
    fn processes(&self) -> Vec<Proc> {
        self.served.processes()
    }
    fn finish(&mut self, answered: u64) -> LedgerCheck {
        self.served.finish(answered)
    }
}

/// The worker's pid is found once the gateway is up; a door whose worker was not found
/// still runs, without the worker's figures.
pub fn describe_procs(procs: &[Proc]) -> String {
    procs
        .iter()
        .map(|p| {
            let alive = procstat::cpu_seconds(p.pid).is_some();
            format!("{} {}{}", p.role, p.pid, if alive { "" } else { " (gone)" })
        })
        .collect::<Vec<_>>()
        .join(", ")
}
