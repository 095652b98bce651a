//! The real `toolwall` binary as the benchmark runs it: a temporary directory with its
//! config (ledger on a real file, builtin worker, the policy rules), the process started
//! with `serve` or `stdio`, its worker found, and the ledger read back with SQLite after it
//! stopped.

use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::policy_rules;
use crate::procstat;

/// How long the harness waits for the gateway to start or stop.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// A temporary state directory and the config that points into it.
pub struct Setup {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub sock: PathBuf,
    pub admin: PathBuf,
    pub ledger: PathBuf,
}

fn config_text(dir: &Path, with_rules: bool) -> String {
    config_text_http(dir, with_rules, None)
}

/// The bench config, with the HTTP door on `127.0.0.1:port` when given.
fn config_text_http(dir: &Path, with_rules: bool, http_port: Option<u16>) -> String {
    let d = dir.display();
    let rules = if with_rules {
        policy_rules::TWENTY_RULES
    } else {
        ""
    };
    let http = http_port
        .map(|p| format!("http = \"127.0.0.1:{p}\"\n"))
        .unwrap_or_default();
    format!(
        "[listen]\nunix = \"{d}/mcp.sock\"\n{http}\n[ledger]\npath = \"{d}/state/ledger.db\"\n\n\
         [admin]\nsocket = \"{d}/admin.sock\"\n{rules}"
    )
}

/// Whether this build's config accepts `[[policy.rules]]` (the policy engine is in), checked
/// with the library the binary is built from. Err: the config fails for another reason.
pub fn config_takes_rules() -> Result<bool, String> {
    let dir = Path::new("/nonexistent-bench-dir");
    match toolwall::config::Config::from_toml(&config_text(dir, true), "bench config") {
        Ok(_) => Ok(true),
        Err(with) => match toolwall::config::Config::from_toml(&config_text(dir, false), "bench") {
            Ok(_) => {
                let why = with.to_string().replace('\n', " ");
                crate::note(&format!(
                    "policy: this build's config refuses the rules ({why}); running with none"
                ));
                Ok(false)
            }
            Err(e) => Err(format!("the bench config does not load: {e}")),
        },
    }
}

impl Setup {
    pub fn new(with_rules: bool) -> std::io::Result<Setup> {
        Setup::with_http(with_rules, None)
    }

    /// As [`Setup::new`], with the HTTP door on a loopback port.
    pub fn with_http(with_rules: bool, http_port: Option<u16>) -> std::io::Result<Setup> {
        let dir = tempfile::Builder::new()
            .prefix("toolwall-bench")
            .tempdir()?;
        let config = dir.path().join("toolwall.toml");
        std::fs::write(&config, config_text_http(dir.path(), with_rules, http_port))?;
        Ok(Setup {
            config,
            sock: dir.path().join("mcp.sock"),
            admin: dir.path().join("admin.sock"),
            ledger: dir.path().join("state/ledger.db"),
            dir,
        })
    }

    /// As [`Setup::new`], with `extra` appended to the config (tables of its own); `f`
    /// gets the directory first, to write what the tables refer to.
    pub fn with_extra(
        with_rules: bool,
        extra: impl FnOnce(&Path) -> std::io::Result<String>,
    ) -> std::io::Result<Setup> {
        let setup = Setup::new(with_rules)?;
        let more = extra(setup.dir.path())?;
        let mut text = std::fs::read_to_string(&setup.config)?;
        text.push('\n');
        text.push_str(&more);
        std::fs::write(&setup.config, text)?;
        Ok(setup)
    }

    /// `toolwall MODE --config FILE`, stdin and stdout as given, stderr collected.
    pub fn spawn(&self, bin: &Path, mode: &str, io: Stdio) -> std::io::Result<Running> {
        let mut child = Command::new(bin)
            .arg(mode)
            .arg("--config")
            .arg(&self.config)
            .current_dir(self.dir.path())
            .stdin(if mode == "stdio" {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(io)
            .stderr(Stdio::piped())
            .spawn()?;
        let log = collect_stderr(child.stderr.take(), mode);
        let running = Running { child, log };
        running.wait_for_log("info: ready")?;
        Ok(running)
    }

    /// `tool_calls` rows in the ledger: (all, allowed). None when there is no ledger file.
    pub fn ledger_rows(&self) -> Result<Option<(u64, u64)>, String> {
        if !self.ledger.exists() {
            return Ok(None);
        }
        let conn = rusqlite::Connection::open_with_flags(
            &self.ledger,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .map_err(|e| format!("open the ledger: {e}"))?;
        let count = |sql: &str| {
            conn.query_row(sql, [], |r| r.get::<_, i64>(0))
                .map(|n| n.max(0) as u64)
                .map_err(|e| format!("{sql}: {e}"))
        };
        Ok(Some((
            count("SELECT count(*) FROM tool_calls")?,
            count("SELECT count(*) FROM tool_calls WHERE decision = 'allowed'")?,
        )))
    }
}

/// A running toolwall process and its stderr lines.
pub struct Running {
    pub child: Child,
    pub log: Arc<Mutex<Vec<String>>>,
}

fn collect_stderr(stderr: Option<ChildStderr>, mode: &str) -> Arc<Mutex<Vec<String>>> {
    let log = Arc::new(Mutex::new(Vec::new()));
    if let Some(stderr) = stderr {
        let lines = Arc::clone(&log);
        let echo = std::env::var_os("TOOLWALL_BENCH_ECHO").is_some();
        let mode = mode.to_string();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if echo {
                    eprintln!("[toolwall {mode}] {line}");
                }
                if let Ok(mut l) = lines.lock() {
                    l.push(line);
                }
            }
        });
    }
    log
}

impl Running {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_text(&self) -> String {
        self.log.lock().map(|l| l.join("\n")).unwrap_or_default()
    }

    fn wait_for_log(&self, needle: &str) -> std::io::Result<()> {
        let deadline = Instant::now() + PATIENCE;
        while Instant::now() < deadline {
            if self.log_text().contains(needle) {
                return Ok(());
            }
            if procstat::cpu_seconds(self.pid()).is_none() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Err(std::io::Error::other(format!(
            "toolwall never logged {needle:?}; its log:\n{}",
            self.log_text()
        )))
    }

    /// The builtin worker: from the admin socket's status when given, else the one child.
    pub fn worker_pid(&self, admin: Option<&Path>) -> Option<u32> {
        if let Some(path) = admin
            && let Some(pid) = status_worker_pid(path)
        {
            return Some(pid);
        }
        procstat::children_of(self.pid()).first().copied()
    }

    /// SIGTERM, then wait for the exit.
    pub fn stop(&mut self) -> Result<(), String> {
        // SAFETY: kill on the pid of a child we own and have not reaped.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        self.wait_exit()
    }

    pub fn wait_exit(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(()),
                Ok(Some(status)) => {
                    return Err(format!(
                        "toolwall exited with {status}:\n{}",
                        self.log_text()
                    ));
                }
                Ok(None) if Instant::now() > deadline => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return Err("toolwall did not exit in time; killed".into());
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => return Err(format!("wait for toolwall: {e}")),
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `{"op":"status"}` on the admin socket → `workers[0].pid`.
fn status_worker_pid(admin: &Path) -> Option<u32> {
    let mut s = UnixStream::connect(admin).ok()?;
    s.set_read_timeout(Some(PATIENCE)).ok()?;
    s.write_all(b"{\"op\":\"status\"}\n").ok()?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).ok()?;
    let status: Value = serde_json::from_str(&line).ok()?;
    status["workers"][0]["pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
}
