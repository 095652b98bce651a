//! Hostile clients for the door tests: silent, slow and half-sent connections held open
//! from threads of the test, and what they cost the gateway (its resident memory, read
//! from /proc) and a normal client (the time until it is served, reported, never asserted).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::PATIENCE;

/// Resident memory of a process, KiB: now (VmRSS) and the peak so far (VmHWM).
#[derive(Debug, Clone, Copy)]
pub struct Rss {
    pub now_kib: u64,
    pub peak_kib: u64,
}

pub fn rss(pid: u32) -> Rss {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"))
    };
    Rss {
        now_kib: field("VmRSS:"),
        peak_kib: field("VmHWM:"),
    }
}

pub fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// One line for the report: what a flood cost.
pub fn report(name: &str, before: Rss, during: Rss, served_in: Option<Duration>) {
    let served = served_in.map_or("not measured".to_owned(), |d| format!("{d:?}"));
    eprintln!(
        "FLOOD {name}: gateway RSS {:.1} MiB before, {:.1} MiB during (peak {:.1} MiB); a normal client was served in {served}",
        mib(before.now_kib),
        mib(during.now_kib),
        mib(during.peak_kib),
    );
}

/// Raise this process's open-file limit so it can hold `n` connections (and the gateway
/// raises its own); fails with the reason when the hard limit is below.
pub fn allow_descriptors(n: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write one rlimit.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        if limit.rlim_cur < n {
            assert!(
                limit.rlim_max >= n,
                "this test holds {n} connections; the hard open-file limit is {}",
                limit.rlim_max
            );
            limit.rlim_cur = n;
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
        }
    }
}

/// `n` TCP connections to the door that never send a byte.
pub fn silent_tcp(port: u16, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|_| {
            let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
            s.set_read_timeout(Some(PATIENCE)).unwrap();
            s
        })
        .collect()
}

/// `n` framed unix connections that never send a byte.
pub fn silent_unix(path: &Path, n: usize) -> Vec<UnixStream> {
    (0..n)
        .map(|_| {
            let s = UnixStream::connect(path).expect("connect");
            s.set_read_timeout(Some(PATIENCE)).unwrap();
            s
        })
        .collect()
}

/// How a held connection ended, as its client saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// The server closed it (EOF or reset) after sending `said` (possibly nothing).
    Closed { said: Vec<u8> },
    /// Still open after the wait.
    Open,
}

impl Ended {
    pub fn said(&self) -> &[u8] {
        match self {
            Ended::Closed { said } => said,
            Ended::Open => b"",
        }
    }

    /// The HTTP status the server sent before closing, if any.
    pub fn status(&self) -> Option<u16> {
        let said = std::str::from_utf8(self.said()).ok()?;
        said.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
    }
}

/// Read until the server closes the stream or `PATIENCE` runs out.
pub fn wait_end(stream: &mut impl Read) -> Ended {
    let deadline = Instant::now() + PATIENCE;
    let mut said = Vec::new();
    let mut chunk = [0u8; 4096];
    while Instant::now() < deadline {
        match stream.read(&mut chunk) {
            Ok(0) => return Ended::Closed { said },
            Ok(n) => said.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Ended::Closed { said },
        }
    }
    Ended::Open
}

/// Wait for every stream to end, in parallel (each read waits up to `PATIENCE`).
pub fn wait_all_end<S: Read + Send + 'static>(streams: Vec<S>) -> Vec<Ended> {
    let chunks: Vec<Vec<S>> = {
        let mut out: Vec<Vec<S>> = (0..16).map(|_| Vec::new()).collect();
        for (i, s) in streams.into_iter().enumerate() {
            out[i % 16].push(s);
        }
        out
    };
    let handles: Vec<JoinHandle<Vec<(usize, Ended)>>> = chunks
        .into_iter()
        .enumerate()
        .map(|(k, chunk)| {
            std::thread::spawn(move || {
                chunk
                    .into_iter()
                    .enumerate()
                    .map(|(i, mut s)| (i * 16 + k, wait_end(&mut s)))
                    .collect()
            })
        })
        .collect();
    let mut all: Vec<(usize, Ended)> = handles
        .into_iter()
        .flat_map(|h| h.join().expect("reader thread"))
        .collect();
    all.sort_by_key(|(i, _)| *i);
    all.into_iter().map(|(_, e)| e).collect()
}

/// Connections that each send `prefix` at once, then one byte of `drip` every `every`,
/// from one background thread, until stopped or the server stops reading.
pub struct Trickle {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<Box<dyn ReadWrite>>>>,
}

pub trait ReadWrite: Read + Write + Send {}
impl<T: Read + Write + Send> ReadWrite for T {}

impl Trickle {
    pub fn start(
        mut streams: Vec<Box<dyn ReadWrite>>,
        prefix: Vec<u8>,
        drip: Vec<u8>,
        every: Duration,
    ) -> Trickle {
        for s in streams.iter_mut() {
            let _ = s.write_all(&prefix);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut at = 0usize;
            let mut alive: Vec<bool> = vec![true; streams.len()];
            while !flag.load(Ordering::Relaxed) && alive.iter().any(|a| *a) {
                std::thread::sleep(every);
                let byte = [drip[at % drip.len().max(1)]];
                at += 1;
                for (s, ok) in streams.iter_mut().zip(alive.iter_mut()) {
                    if *ok && s.write_all(&byte).is_err() {
                        *ok = false;
                    }
                }
            }
            streams
        });
        Trickle {
            stop,
            thread: Some(thread),
        }
    }

    /// Stop dripping and hand the streams back (to see how they ended).
    pub fn stop(mut self) -> Vec<Box<dyn ReadWrite>> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .map(|t| t.join().expect("trickle thread"))
            .unwrap_or_default()
    }
}

impl Drop for Trickle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Run `attempt` until it returns `Some`, at most `PATIENCE`; returns the value and how long
/// it took from the first try.
pub fn until_served<T>(what: &str, mut attempt: impl FnMut() -> Option<T>) -> (T, Duration) {
    let start = Instant::now();
    loop {
        if let Some(v) = attempt() {
            return (v, start.elapsed());
        }
        assert!(
            start.elapsed() < PATIENCE,
            "{what}: not served within {PATIENCE:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
