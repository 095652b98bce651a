//! The doors "stdio server": a call to a local MCP server over stdio, through toolwall as
//! a local server (`[servers.NAME] command`, confined, attested, every call through policy
//! and the ledger) against the same client speaking to the same server directly over its
//! stdin and stdout, in the same run. The ratio of the two p50s at one call in flight is
//! the figure the issue asks for (goal: at most 1.5×). Two servers: a trivial echo
//! (`benches/gateway/stdio_echo.py`, stdlib only, ~16 µs a call: the worst case for the
//! ratio) and the official Python SDK's server (`benches/gateway/sdk_echo.py`, what people
//! run; skipped with a note when its venv is absent).

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::doors::{Ctx, Door, LedgerCheck, Opened, Proc, Served, framed_conn};
use crate::load::ClientConn;
use crate::options::Level;
use crate::report::RunRow;
use crate::toolwall_proc::Setup;
use crate::wire::Wire;

pub const DIRECT: &str = "stdio server direct";
pub const THROUGH: &str = "toolwall stdio server";
pub const SDK_DIRECT: &str = "sdk stdio server direct";
pub const SDK_THROUGH: &str = "toolwall sdk stdio server";

/// The venv `scripts/install-test-deps.sh python` makes, with the MCP Python SDK.
fn sdk_venv() -> PathBuf {
    Path::new(crate::WORKSPACE).join("target/mcp-venv")
}

/// The venv's `lib/python3.X/site-packages`, when there is one.
fn sdk_site_packages() -> Option<PathBuf> {
    let lib = sdk_venv().join("lib");
    std::fs::read_dir(&lib)
        .ok()?
        .flatten()
        .map(|e| e.path().join("site-packages"))
        .find(|p| p.join("mcp").is_dir())
}

/// One of the two servers: how to start it, and what its client says first.
struct Program {
    /// The door's name when called directly.
    direct: &'static str,
    /// `[servers.NAME]` and the tool's name through toolwall (`NAME__echo`).
    server: &'static str,
    tool: &'static str,
    interpreter: PathBuf,
    script: PathBuf,
    /// The venv's site-packages (`PYTHONPATH`) and the venv, readable by the server.
    venv: Option<(PathBuf, PathBuf)>,
    /// The MCP handshake (`initialize`, `notifications/initialized`) before the calls:
    /// the SDK's server refuses calls without it; the trivial echo needs none.
    handshake: bool,
}

fn echo_program() -> Program {
    Program {
        direct: DIRECT,
        server: "echo",
        tool: "echo__echo",
        interpreter: PathBuf::from("python3"),
        script: Path::new(crate::WORKSPACE).join("benches/gateway/stdio_echo.py"),
        venv: None,
        handshake: false,
    }
}

/// The SDK's server, or why its pair is skipped.
fn sdk_program() -> Result<Program, String> {
    let Some(site) = sdk_site_packages() else {
        return Err(format!(
            "needs the MCP Python SDK's venv ({} without the mcp package): run scripts/install-test-deps.sh python",
            sdk_venv().display()
        ));
    };
    // The system's Python with the venv's packages, both ways: the venv's interpreter may
    // be one the agent user cannot reach (as in tests/local_servers.rs).
    Ok(Program {
        direct: SDK_DIRECT,
        server: "sdk",
        tool: "sdk__echo",
        interpreter: PathBuf::from("/usr/bin/python3"),
        script: Path::new(crate::WORKSPACE).join("benches/gateway/sdk_echo.py"),
        venv: Some((site, sdk_venv())),
        handshake: true,
    })
}

/// `initialize` and `notifications/initialized`, answered before the first call (ids of
/// calls start at 1 in the load client; the handshake uses 0, answered before any call).
fn handshake(
    stdin: &mut std::process::ChildStdin,
    stdout: &mut std::process::ChildStdout,
) -> Result<(), String> {
    let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"toolwall-bench","version":"1"}}}"#;
    stdin
        .write_all(format!("{init}\n").as_bytes())
        .map_err(|e| format!("initialize: {e}"))?;
    stdin.flush().map_err(|e| format!("initialize: {e}"))?;
    // One line, read byte by byte: nothing of the calls' answers may be read ahead here.
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        use std::io::Read;
        match stdout.read(&mut byte) {
            Ok(0) => return Err("the server closed stdout during initialize".into()),
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) if line.len() > 1 << 20 => return Err("initialize: answer too long".into()),
            Ok(_) => line.push(byte[0]),
            Err(e) => return Err(format!("initialize: {e}")),
        }
    }
    if !String::from_utf8_lossy(&line).contains("\"result\"") {
        return Err(format!(
            "initialize failed: {}",
            String::from_utf8_lossy(&line[..line.len().min(300)])
        ));
    }
    stdin
        .write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n")
        .map_err(|e| format!("initialized: {e}"))?;
    stdin.flush().map_err(|e| format!("initialized: {e}"))
}

/// The server started directly, one process per connection, like an agent starting it.
struct Direct {
    program: Program,
    current: Option<Child>,
}

pub fn open_direct(_: &Ctx) -> Opened {
    Ok(Box::new(Direct {
        program: echo_program(),
        current: None,
    }))
}

pub fn open_sdk_direct(_: &Ctx) -> Opened {
    Ok(Box::new(Direct {
        program: sdk_program()?,
        current: None,
    }))
}

impl Direct {
    fn end_current(&mut self) {
        if let Some(mut c) = self.current.take() {
            // It got EOF on stdin when its connection was dropped.
            let _ = c.wait();
        }
    }
}

impl Door for Direct {
    fn name(&self) -> &str {
        self.program.direct
    }
    fn runs_at(&self, level: Level) -> bool {
        level.conns == 1
    }
    fn connect(&mut self) -> Result<ClientConn, String> {
        self.end_current();
        let mut command = Command::new(&self.program.interpreter);
        if let Some((site, _)) = &self.program.venv {
            command.env("PYTHONPATH", site);
        }
        let mut child = command
            .arg(&self.program.script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("start {}: {e}", self.program.script.display()))?;
        let (Some(mut stdin), Some(mut stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("the server without pipes".into());
        };
        self.current = Some(child);
        if self.program.handshake {
            handshake(&mut stdin, &mut stdout)?;
        }
        Ok(ClientConn {
            rx: OwnedFd::from(stdout).into(),
            tx: OwnedFd::from(stdin).into(),
            wire: Wire::Lines,
            tool: "echo",
        })
    }
    fn processes(&self) -> Vec<Proc> {
        self.current
            .iter()
            .map(|c| Proc {
                role: "server",
                pid: c.id(),
            })
            .collect()
    }
    fn finish(&mut self, _: u64) -> LedgerCheck {
        self.end_current();
        LedgerCheck::NotApplicable
    }
}

/// The same server as `[servers.NAME]` of `toolwall serve`, called as `NAME__echo` over
/// the framed unix door.
struct Through {
    name: &'static str,
    tool: &'static str,
    served: Served,
}

pub fn open_through(ctx: &Ctx) -> Opened {
    through(ctx, THROUGH, echo_program())
}

pub fn open_sdk_through(ctx: &Ctx) -> Opened {
    through(ctx, SDK_THROUGH, sdk_program()?)
}

fn through(ctx: &Ctx, name: &'static str, program: Program) -> Opened {
    let mut read_paths = vec![
        program
            .script
            .parent()
            .unwrap_or(Path::new("/"))
            .display()
            .to_string(),
    ];
    let mut env = String::new();
    if let Some((site, venv)) = &program.venv {
        read_paths.push(venv.display().to_string());
        env = format!(
            "env = {{ PYTHONPATH = {} }}\nstart_timeout_secs = 30\n",
            serde_json::to_string(&site.display().to_string()).map_err(|e| e.to_string())?
        );
    }
    let command = serde_json::to_string(&[
        program.interpreter.display().to_string(),
        program.script.display().to_string(),
    ])
    .map_err(|e| e.to_string())?;
    let read_paths = serde_json::to_string(&read_paths).map_err(|e| e.to_string())?;
    let server = program.server;
    let setup = Setup::with_extra(ctx.with_rules, |dir| {
        use std::os::unix::fs::PermissionsExt;
        // The agent user enters the state directory's parent (tempdirs are 0700).
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))?;
        // SAFETY: geteuid cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        let sandbox = if root {
            ""
        } else {
            // Without CAP_SETUID the server runs as this user (loudly reported).
            "[sandbox]\nrun_agents_as_gateway_user = true\n"
        };
        Ok(format!(
            "{sandbox}[servers]\nstate_dir = \"{d}/servers\"\n\n[servers.{server}]\ncommand = {command}\nread_paths = {read_paths}\n{env}pin = \"off\"\n",
            d = dir.display(),
        ))
    })
    .map_err(|e| e.to_string())?;
    let served = Served::start_with(ctx, setup)?;
    // Ready does not wait for local servers: their tools come once they have listed.
    wait_listed(&served.setup.sock, program.tool)?;
    Ok(Box::new(Through {
        name,
        tool: program.tool,
        served,
    }))
}

/// Ask `tools/list` over the framed door until `tool` is in it (at most 60 s).
fn wait_listed(sock: &Path, tool: &str) -> Result<(), String> {
    use std::io::Read;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let needle = format!("\"{tool}\"");
    let mut seq = 1u32;
    loop {
        let mut conn = framed_conn(sock)?;
        let mut out = conn.wire.preamble();
        let request = format!(r#"{{"jsonrpc":"2.0","id":{seq},"method":"tools/list"}}"#);
        conn.wire.encode(seq, request.as_bytes(), &mut out)?;
        conn.tx
            .write_all(&out)
            .map_err(|e| format!("tools/list: {e}"))?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 65536];
        let listed = loop {
            if let Some(reply) = conn.wire.decode(&buf)? {
                break String::from_utf8_lossy(reply.payload).contains(&needle);
            }
            let n = conn
                .rx
                .read(&mut chunk)
                .map_err(|e| format!("tools/list: {e}"))?;
            if n == 0 {
                return Err("the gateway closed the connection during tools/list".into());
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        if listed {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(format!("{tool} was never listed"));
        }
        seq += 1;
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

impl Door for Through {
    fn name(&self) -> &str {
        self.name
    }
    fn runs_at(&self, level: Level) -> bool {
        level.conns == 1
    }
    fn connect(&mut self) -> Result<ClientConn, String> {
        let mut conn = framed_conn(&self.served.setup.sock)?;
        conn.tool = self.tool;
        Ok(conn)
    }
    fn processes(&self) -> Vec<Proc> {
        self.served.processes()
    }
    fn finish(&mut self, answered: u64) -> LedgerCheck {
        self.served.finish(answered)
    }
}

/// The figures: p50 through toolwall over p50 direct, for each pair, at each level both
/// ran.
pub fn note_ratio(rows: &[RunRow]) {
    for (direct_door, through_door, what) in [
        (DIRECT, THROUGH, "stdio server (trivial echo)"),
        (
            SDK_DIRECT,
            SDK_THROUGH,
            "stdio server (official Python SDK)",
        ),
    ] {
        for through in rows.iter().filter(|r| r.door == through_door) {
            if let Some(direct) = rows
                .iter()
                .find(|r| r.door == direct_door && r.level == through.level)
            {
                crate::note(&format!(
                    "{what} at {} in flight: p50 {:.0} µs through toolwall vs {:.0} µs direct: {:.2}× (goal ≤ 1.5×); p99 {:.0} vs {:.0} µs",
                    through.level.in_flight(),
                    through.p50_us,
                    direct.p50_us,
                    through.p50_us / direct.p50_us,
                    through.p99_us,
                    direct.p99_us
                ));
            }
        }
    }
}
