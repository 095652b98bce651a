//! Ships each signed head off the gateway's loop: a thread of its own writes it to the
//! head file next to the ledger (the last signed head, which the next gateway compares
//! with the database it opens) and runs `[ledger] anchor_command` with the head as one
//! JSON line on stdin, so an operator can send it off the machine (syslog, a WORM bucket).
//!
//! The loop leaves each head in a one-slot mailbox and never waits: when the command is
//! slower than checkpoints come, a head not yet shipped is replaced by the next one (which
//! covers it) and counted. A command that fails, or runs past `anchor_timeout_ms` (then it
//! is killed), is logged; the ledger goes on.

use std::io::{Read as _, Write as _};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::signing::SignedHead;

/// Bytes of the command's stderr kept for the log.
const STDERR_KEEP: usize = 2048;

/// Where and how signed heads go.
#[derive(Debug, Clone)]
pub struct AnchorConfig {
    /// The last signed head, rewritten (0600) for each.
    pub head_file: PathBuf,
    /// Program and arguments (no shell); `None`: only the head file.
    pub command: Option<Vec<String>>,
    pub timeout: Duration,
}

#[derive(Default)]
struct Mailbox {
    head: Option<SignedHead>,
    closed: bool,
    skipped: u64,
}

pub struct Anchor {
    mailbox: Arc<(Mutex<Mailbox>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Anchor {
    pub fn start(config: AnchorConfig) -> std::io::Result<Anchor> {
        let mailbox = Arc::new((Mutex::new(Mailbox::default()), Condvar::new()));
        let theirs = Arc::clone(&mailbox);
        let thread = std::thread::Builder::new()
            .name("ledger-anchor".into())
            .spawn(move || run(&config, &theirs))?;
        Ok(Anchor {
            mailbox,
            thread: Some(thread),
        })
    }

    /// Hands a head to the thread without waiting for it.
    pub fn send(&self, head: SignedHead) {
        let (lock, wake) = &*self.mailbox;
        let Ok(mut mailbox) = lock.lock() else {
            return;
        };
        if mailbox.head.replace(head).is_some() {
            mailbox.skipped += 1;
            crate::warn!(
                "ledger anchor: the anchor command is slower than checkpoints; {} signed heads \
                 skipped (each later one covers them)",
                mailbox.skipped
            );
        }
        wake.notify_one();
    }
}

impl Drop for Anchor {
    fn drop(&mut self) {
        // The thread ships the head still waiting (bounded by the command's timeout).
        let (lock, wake) = &*self.mailbox;
        if let Ok(mut mailbox) = lock.lock() {
            mailbox.closed = true;
        }
        wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(config: &AnchorConfig, mailbox: &(Mutex<Mailbox>, Condvar)) {
    let (lock, wake) = mailbox;
    loop {
        let head = {
            let Ok(mut guard) = lock.lock() else {
                return;
            };
            loop {
                if let Some(head) = guard.head.take() {
                    break head;
                }
                if guard.closed {
                    return;
                }
                guard = match wake.wait(guard) {
                    Ok(g) => g,
                    Err(_) => return,
                };
            }
        };
        let line = head.to_json();
        if let Err(e) = write_head_file(&config.head_file, &line) {
            crate::warn!(
                "ledger anchor: cannot write the signed head to {}: {e}",
                config.head_file.display()
            );
        }
        if let Some(command) = &config.command
            && let Err(e) = run_command(command, &line, config.timeout)
        {
            crate::warn!(
                "ledger anchor: anchor_command {:?} failed for the head of group {}: {e}",
                command.first().map(String::as_str).unwrap_or(""),
                head.seq
            );
        }
    }
}

/// Replaces the head file atomically (0600).
pub fn write_head_file(path: &Path, line: &str) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(line.as_bytes())?;
    file.write_all(b"\n")?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Reads the last signed head written next to a ledger, if any.
pub fn read_head_file(path: &Path) -> Result<Option<SignedHead>, String> {
    match crate::config::read_bounded(path, 4096) {
        Ok(text) => SignedHead::from_json(text.trim()).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

fn run_command(command: &[String], line: &str, timeout: Duration) -> Result<(), String> {
    let (program, args) = command.split_first().ok_or("empty command")?;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        // A command that does not read its stdin gets EPIPE here; its exit status says more.
        let _ = stdin.write_all(line.as_bytes());
        let _ = stdin.write_all(b"\n");
    }
    let mut stderr = child.stderr.take();
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "still running after {} ms; killed",
                    timeout.as_millis()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(format!("waiting for it: {e}")),
        }
    };
    if status.success() {
        return Ok(());
    }
    let mut said = Vec::new();
    if let Some(err) = stderr.as_mut() {
        let _ = err.take(STDERR_KEEP as u64).read_to_end(&mut said);
    }
    let said = String::from_utf8_lossy(&said);
    let said = said.trim();
    Err(if said.is_empty() {
        format!("exited with {status}")
    } else {
        format!("exited with {status}: {said}")
    })
}
