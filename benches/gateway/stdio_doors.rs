//! The door "stdio server": a call to a trivial stdio echo server
//! (`benches/gateway/stdio_echo.py`), through toolwall as a local server
//! (`[servers.echo] command`, confined, attested, every call through policy and the ledger)
//! against the same client speaking to the same server directly over its stdin and stdout,
//! in the same run. The ratio of the two p50s at one call in flight is the figure the
//! issue asks for (goal: at most 1.5×).

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

fn echo_script() -> PathBuf {
    Path::new(crate::WORKSPACE).join("benches/gateway/stdio_echo.py")
}

/// The server started directly, one process per connection, like an agent starting it.
struct Direct {
    current: Option<Child>,
}

pub fn open_direct(_: &Ctx) -> Opened {
    Ok(Box::new(Direct { current: None }))
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
        DIRECT
    }
    fn runs_at(&self, level: Level) -> bool {
        level.conns == 1
    }
    fn connect(&mut self) -> Result<ClientConn, String> {
        self.end_current();
        let mut child = Command::new("python3")
            .arg(echo_script())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("start the echo server: {e}"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("the echo server without pipes".into());
        };
        self.current = Some(child);
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

/// The same server as `[servers.echo]` of `toolwall serve`, called as `echo__echo` over
/// the framed unix door.
struct Through {
    served: Served,
}

pub fn open_through(ctx: &Ctx) -> Opened {
    let script = echo_script();
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
            "{sandbox}[servers]\nstate_dir = \"{d}/servers\"\n\n[servers.echo]\ncommand = [\"python3\", \"{s}\"]\nread_paths = [\"{r}\"]\npin = \"off\"\n",
            d = dir.display(),
            s = script.display(),
            r = script.parent().unwrap_or(Path::new("/")).display(),
        ))
    })
    .map_err(|e| e.to_string())?;
    let served = Served::start_with(ctx, setup)?;
    // Ready does not wait for local servers: their tools come once they have listed.
    wait_listed(&served.setup.sock, "echo__echo")?;
    Ok(Box::new(Through { served }))
}

/// Ask `tools/list` over the framed door until `tool` is in it (at most 60 s).
fn wait_listed(sock: &Path, tool: &str) -> Result<(), String> {
    use std::io::{Read, Write};
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
        THROUGH
    }
    fn runs_at(&self, level: Level) -> bool {
        level.conns == 1
    }
    fn connect(&mut self) -> Result<ClientConn, String> {
        let mut conn = framed_conn(&self.served.setup.sock)?;
        conn.tool = "echo__echo";
        Ok(conn)
    }
    fn processes(&self) -> Vec<Proc> {
        self.served.processes()
    }
    fn finish(&mut self, answered: u64) -> LedgerCheck {
        self.served.finish(answered)
    }
}

/// The figure: p50 through toolwall over p50 direct, at each level both ran.
pub fn note_ratio(rows: &[RunRow]) {
    for through in rows.iter().filter(|r| r.door == THROUGH) {
        if let Some(direct) = rows
            .iter()
            .find(|r| r.door == DIRECT && r.level == through.level)
        {
            crate::note(&format!(
                "stdio server at {} in flight: p50 {:.0} µs through toolwall vs {:.0} µs direct: {:.2}× (goal ≤ 1.5×); p99 {:.0} vs {:.0} µs",
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
