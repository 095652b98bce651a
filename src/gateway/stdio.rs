//! stdin/stdout as one connection of the loop. A reader thread feeds stdin chunks through a
//! bounded channel (a full channel stops it reading: backpressure) and wakes the loop; a
//! writer thread owns stdout, so a slow reader of our output never blocks the loop. stdout
//! carries protocol only.

use mio::Waker;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, SyncSender, TryRecvError, channel, sync_channel};
use std::thread::JoinHandle;

/// Chunks of stdin buffered between the reader thread and the loop.
const INPUT_CHUNKS: usize = 8;
const CHUNK: usize = 64 * 1024;

pub struct StdioSide {
    input: Receiver<Vec<u8>>,
    output: Option<Sender<Vec<u8>>>,
    /// Bytes handed to the writer and not yet written.
    pub pending_out: Arc<AtomicUsize>,
    pub output_failed: Arc<AtomicBool>,
    writer: Option<JoinHandle<()>>,
    pub eof: bool,
}

impl StdioSide {
    pub fn start(waker: Arc<Waker>) -> std::io::Result<StdioSide> {
        let (in_tx, in_rx): (SyncSender<Vec<u8>>, _) = sync_channel(INPUT_CHUNKS);
        let reader_waker = Arc::clone(&waker);
        std::thread::Builder::new()
            .name("stdin".into())
            .spawn(move || {
                let mut stdin = std::io::stdin().lock();
                // One buffer for every read; each chunk is copied out at its size.
                let mut buf = vec![0u8; CHUNK];
                loop {
                    let n = match stdin.read(&mut buf) {
                        Ok(n) => n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(_) => 0,
                    };
                    let chunk = buf[..n].to_vec();
                    let eof = n == 0;
                    if in_tx.send(chunk).is_err() {
                        return;
                    }
                    let _ = reader_waker.wake();
                    if eof {
                        return;
                    }
                }
            })?;
        let (out_tx, out_rx) = channel::<Vec<u8>>();
        let pending_out = Arc::new(AtomicUsize::new(0));
        let output_failed = Arc::new(AtomicBool::new(false));
        let pending = Arc::clone(&pending_out);
        let failed = Arc::clone(&output_failed);
        let writer = std::thread::Builder::new()
            .name("stdout".into())
            .spawn(move || {
                let mut stdout = std::io::stdout().lock();
                while let Ok(bytes) = out_rx.recv() {
                    let len = bytes.len();
                    let ok = stdout
                        .write_all(&bytes)
                        .and_then(|_| stdout.flush())
                        .is_ok();
                    pending.fetch_sub(len, Ordering::AcqRel);
                    if !ok {
                        failed.store(true, Ordering::Release);
                        let _ = waker.wake();
                        return;
                    }
                    if pending.load(Ordering::Acquire) == 0 {
                        let _ = waker.wake();
                    }
                }
            })?;
        Ok(StdioSide {
            input: in_rx,
            output: Some(out_tx),
            pending_out,
            output_failed,
            writer: Some(writer),
            eof: false,
        })
    }

    /// The next chunk of stdin, if one is waiting. An empty chunk is EOF.
    pub fn try_input(&mut self) -> Option<Vec<u8>> {
        if self.eof {
            return None;
        }
        match self.input.try_recv() {
            Ok(chunk) => {
                if chunk.is_empty() {
                    self.eof = true;
                }
                Some(chunk)
            }
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => {
                self.eof = true;
                Some(Vec::new())
            }
        }
    }

    pub fn write(&mut self, mut bytes: Vec<u8>) {
        bytes.push(b'\n');
        self.pending_out.fetch_add(bytes.len(), Ordering::AcqRel);
        if let Some(tx) = &self.output
            && tx.send(bytes).is_err()
        {
            self.output_failed.store(true, Ordering::Release);
        }
    }

    pub fn pending(&self) -> usize {
        self.pending_out.load(Ordering::Acquire)
    }

    /// Wait for everything queued to reach stdout.
    pub fn finish(&mut self) {
        self.output.take();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

/// Who answers `ask` rules for the agent that started `toolwall stdio` (process `agent_pid`):
/// the operator, only if the admin socket exists and the agent's uid cannot connect to it
/// (it is not root and does not own the socket, which is 0600). Anything unknown refuses.
pub fn ask_route(admin_socket: Option<&Path>, agent_pid: i32) -> crate::gateway::core::AskRoute {
    use crate::gateway::core::AskRoute;
    let Some(owner) = admin_socket
        .and_then(|p| std::fs::metadata(p).ok())
        .map(|m| m.uid())
    else {
        return AskRoute::Refuse;
    };
    match process_uids(agent_pid) {
        Some(uids) if uids.iter().all(|&u| u != 0 && u != owner) => AskRoute::Operator,
        _ => AskRoute::Refuse,
    }
}

/// The real, effective, saved and filesystem uids of a process, from /proc.
fn process_uids(pid: i32) -> Option<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    let uids: Vec<u32> = line
        .split_whitespace()
        .filter_map(|u| u.parse().ok())
        .collect();
    (uids.len() == 4).then_some(uids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::core::AskRoute;

    #[test]
    fn the_agents_own_admin_socket_refuses_asks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("admin.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
        // Our own pid plays the agent: same uid as the socket's owner.
        let me = std::process::id() as i32;
        assert_eq!(ask_route(Some(&socket), me), AskRoute::Refuse);
        assert_eq!(
            ask_route(None, me),
            AskRoute::Refuse,
            "no socket, no operator"
        );
        assert_eq!(
            ask_route(Some(&socket), -1),
            AskRoute::Refuse,
            "unknown agent"
        );
        assert_eq!(process_uids(me).map(|u| u.len()), Some(4));
    }
}
