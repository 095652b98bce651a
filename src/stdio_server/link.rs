//! MCP over a local server's stdin and stdout, in its host: start the program under a
//! leader (`crate::workspace::launch`, the walls of `ProgramWalls`), write one message per
//! line, read its answers, notifications and stderr on a thread of its own, and never
//! block on it: every wait has a deadline, and a program that exits, writes something
//! that is not JSON-RPC, writes a line beyond `max_body_bytes`, stops reading its stdin or
//! does not answer its handshake breaks the instance — every request waiting on it fails
//! at once with an error naming the server, and the instance is stopped (SIGTERM, then
//! SIGKILL to every process it started). The upstream's watcher starts it again with
//! backoff.
//!
//! Memory is bounded: one line in progress (`max_body_bytes`), the answers of the
//! requests in flight (one per pool thread), at most [`MAX_QUEUED_NOTICES`] notifications
//! and server requests waiting for the watcher (list changes are a bit each, never
//! dropped), and the stderr log's tail and batch.

use serde_json::{Value, json};
use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::lines::{LineSplitter, Overflow, Piece};
use super::stderr_log::{StderrLog, redact};
use crate::aggregator::channel::LineChannel;
use crate::aggregator::error::{UpstreamError, UpstreamErrorCode, quote_upstream};
use crate::aggregator::exchange::{Notice, Reply};
use crate::aggregator::message::{Incoming, RpcFailure, classify};
use crate::aggregator::upstream::EventSink;
use crate::sandbox::ProgramWalls;
use crate::workspace::launch::{LaunchSpec, launch};

/// Notifications and server requests held for the watcher; beyond, they are counted and
/// dropped (list changes are kept apart and never dropped).
pub const MAX_QUEUED_NOTICES: usize = 256;
/// Progress tokens whose dropped messages are counted apart until the watcher takes them.
const MAX_DROP_TOKENS: usize = 64;
/// How often the stderr lines gathered are sent to the gateway, at most.
const STDERR_BATCH_EVERY: Duration = Duration::from_millis(250);
/// Read size from the program's pipes.
const READ_CHUNK: usize = 64 * 1024;
/// Stderr lines quoted in an error.
const ERROR_TAIL_LINES: usize = 5;
/// After stdout closed, how long to wait for the exit status that says why.
const EXIT_REPORT_WAIT: Duration = Duration::from_millis(300);

/// What the host knows about running its server.
pub struct LinkConfig {
    pub server: String,
    /// The program's arguments (`argv[0]` as configured, found on `path` at each start).
    pub argv: Vec<String>,
    /// The program's `PATH`.
    pub path: String,
    pub cwd: PathBuf,
    /// `NAME=value`, secrets included.
    pub env: Vec<String>,
    /// The secret variables and values, never to be shown (stderr and errors are
    /// redacted).
    pub secrets: Vec<(String, String)>,
    /// One request: its answer, or one message written.
    pub timeout: Duration,
    /// From the start of the program to the first answer it gives.
    pub start_timeout: Duration,
    /// How long a `server/discover` probe waits.
    pub discover_timeout: Duration,
    pub stop_grace: Duration,
    /// Longest line on stdout.
    pub max_line: usize,
    pub stderr_lines_per_sec: u32,
}

/// What a waiting request gets.
type Answer = Result<String, RpcFailure>;

#[derive(Default)]
struct Shared {
    /// Requests in flight, by id, and their answer once it came.
    waiting: HashMap<u64, Option<Answer>>,
    /// Requests in `waiting` whose caller gave up (a cancelled call).
    abandoned: HashSet<u64>,
    /// Requests of agents' calls in `waiting`, with what the server sent for the call
    /// (log messages, requests) while it was the only one: see `post_for_call`.
    for_calls: HashMap<u64, VecDeque<Notice>>,
    /// The progress token each agent's call in flight sent (its `_meta.progressToken`),
    /// to the call's request id: a call's progress joins its own queue, ahead of its
    /// answer. Through the watcher's queue, an answer could overtake its progress (another
    /// thread drains that queue) and the progress then met a call already ended.
    call_tokens: HashMap<String, u64>,
    /// The program has answered something: requests are bounded by `timeout` from now on
    /// (before, by `start_timeout` from its start).
    answered: bool,
    broken: Option<UpstreamError>,
    notices: VecDeque<Notice>,
    /// Messages for the watcher dropped (a full queue, beyond the size bounds), by the
    /// progress token they named (at most [`MAX_DROP_TOKENS`]; the rest under `None`).
    dropped_notices: HashMap<Option<String>, u64>,
    /// Messages for an agent's call dropped (its queue full, beyond the size bounds), by
    /// the call's request id: handed to the call with its notices.
    dropped_for_calls: HashMap<u64, u64>,
    /// `notifications/{tools,resources,prompts}/list_changed` seen, one bit each.
    list_changed: u8,
    /// The program's pid, once its leader said it.
    pid: Option<i32>,
}

impl Shared {
    /// The queue of the one agent's call waiting, when there is exactly one.
    fn only_call(&mut self) -> Option<&mut VecDeque<Notice>> {
        match self.for_calls.len() {
            1 => self.for_calls.values_mut().next(),
            _ => None,
        }
    }

    /// The request id of the one agent's call waiting, when there is exactly one.
    fn only_call_id(&self) -> Option<u64> {
        match self.for_calls.len() {
            1 => self.for_calls.keys().next().copied(),
            _ => None,
        }
    }

    /// One message for the one call waiting dropped.
    fn drop_for_call(&mut self, id: u64) {
        *self.dropped_for_calls.entry(id).or_insert(0) += 1;
    }

    /// One message for the watcher dropped; `token` is the progress token it named.
    fn drop_notice(&mut self, token: Option<String>) {
        let token = token.filter(|_| self.dropped_notices.len() < MAX_DROP_TOKENS);
        *self.dropped_notices.entry(token).or_insert(0) += 1;
    }
}

/// One run of the program.
struct Instance {
    started: Instant,
    leader: libc::pid_t,
    stdin: Mutex<Option<OwnedFd>>,
    control: Mutex<OwnedFd>,
    shared: Mutex<Shared>,
    /// Requests waiting for their answer (or their call's notices) wait here.
    cond: Condvar,
    /// The watcher (`listen`) waits here, woken only for what is its own (notices, list
    /// changes, drops, a break): an answer to a call wakes the call alone, not a second
    /// thread per call.
    watch_cond: Condvar,
}

impl Instance {
    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Broken (the first reason wins): every waiter wakes and fails.
    fn break_with(&self, e: UpstreamError) {
        let mut sh = self.lock();
        if sh.broken.is_none() {
            sh.broken = Some(e);
        }
        drop(sh);
        self.cond.notify_all();
        self.watch_cond.notify_all();
    }

    fn broken(&self) -> Option<UpstreamError> {
        self.lock().broken.clone()
    }

    /// `T`: SIGTERM to every process of the program; `K`: SIGKILL.
    fn signal(&self, byte: u8) {
        let fd = self.control.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: writing one byte to our own pipe (non-blocking).
        unsafe {
            libc::write(fd.as_raw_fd(), [byte].as_ptr().cast(), 1);
        }
    }

    /// Stop the program: close its stdin (a well-behaved server exits), SIGTERM, then
    /// SIGKILL after `grace`, from a thread of its own so nobody waits for it.
    fn stop(self: &Arc<Self>, grace: Duration) {
        self.stdin.lock().unwrap_or_else(|p| p.into_inner()).take();
        self.signal(b'T');
        let me = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("stop-server".into())
            .spawn(move || {
                std::thread::sleep(grace);
                me.signal(b'K');
            });
        if spawned.is_err() {
            self.signal(b'K');
        }
    }
}

/// The channel to one local server (see the module documentation).
pub struct StdioLink {
    cfg: LinkConfig,
    walls: ProgramWalls,
    events: EventSink,
    current: Mutex<Option<Arc<Instance>>>,
    starts: AtomicU64,
    legacy: AtomicBool,
}

impl StdioLink {
    pub fn new(cfg: LinkConfig, walls: ProgramWalls, events: EventSink) -> StdioLink {
        StdioLink {
            cfg,
            walls,
            events,
            current: Mutex::new(None),
            starts: AtomicU64::new(0),
            legacy: AtomicBool::new(false),
        }
    }

    fn name(&self) -> &str {
        &self.cfg.server
    }

    fn error(&self, code: UpstreamErrorCode, what: impl std::fmt::Display) -> UpstreamError {
        UpstreamError::new(code, format!("server {}: {what}", self.name()))
    }

    fn current(&self) -> Option<Arc<Instance>> {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The running instance, or why there is none.
    fn live(&self) -> Result<Arc<Instance>, UpstreamError> {
        let inst = self.current().ok_or_else(|| {
            self.error(UpstreamErrorCode::ServerDown, "its program is not running")
        })?;
        match inst.broken() {
            Some(e) => Err(e),
            None => Ok(inst),
        }
    }

    fn start(&self) -> Result<Arc<Instance>, UpstreamError> {
        let fail = |what: String| self.error(UpstreamErrorCode::ServerDown, what);
        // Its state directory is its own again (another server of its uid may have opened it).
        super::state_dir::secure_home(&self.cfg.env).map_err(fail)?;
        // Found again at each start: a runtime or package installed meanwhile is used.
        let program = super::host::resolve_program(
            self.cfg.argv.first().map_or("", String::as_str),
            &self.cfg.path,
            &self.cfg.cwd,
        )
        .map_err(fail)?;
        let mut spec = LaunchSpec::program(
            &program,
            &self.cfg.argv,
            &self.cfg.cwd,
            &self.cfg.env,
            &self.walls,
        )
        .map_err(|e| fail(format!("cannot start its program: {e}")))?;
        spec.eof_grace = self.cfg.stop_grace;
        let (stdin_read, stdin_write) =
            pipe().map_err(|e| fail(format!("cannot make its stdin: {e}")))?;
        set_nonblocking(&stdin_write).map_err(|e| fail(format!("stdin: {e}")))?;
        let launched = launch(&spec, &stdin_read)
            .map_err(|e| fail(format!("cannot start its program: {e}")))?;
        drop(stdin_read);
        let n = self.starts.fetch_add(1, Ordering::Relaxed) + 1;
        let inst = Arc::new(Instance {
            started: Instant::now(),
            leader: launched.leader,
            stdin: Mutex::new(Some(stdin_write)),
            control: Mutex::new(launched.control),
            shared: Mutex::new(Shared::default()),
            cond: Condvar::new(),
            watch_cond: Condvar::new(),
        });
        let reader = Reader {
            server: self.cfg.server.clone(),
            inst: Arc::clone(&inst),
            stdout: launched.stdout,
            stderr: launched.stderr,
            status: launched.status,
            max_line: self.cfg.max_line,
            stderr_log: StderrLog::new(
                self.cfg.stderr_lines_per_sec,
                &self.cfg.secrets,
                Instant::now(),
            ),
            secrets: self.cfg.secrets.clone(),
            events: Arc::clone(&self.events),
            start: n,
        };
        if let Err(e) = std::thread::Builder::new()
            .name("server-out".into())
            .spawn(move || reader.run())
        {
            inst.signal(b'K');
            return Err(fail(format!("cannot start its reader thread: {e}")));
        }
        crate::debug!(
            "server {}: started its program (start {n}, leader pid {})",
            self.name(),
            inst.leader
        );
        Ok(inst)
    }

    /// Write one line, waiting at most until `deadline` for the program to take it.
    fn write_line(
        &self,
        inst: &Instance,
        body: &[u8],
        deadline: Instant,
    ) -> Result<(), UpstreamError> {
        let mut line;
        let bytes: &[u8] = if body.contains(&b'\n') {
            // A raw line break can only be JSON whitespace: write the compact form.
            let v: Value = serde_json::from_slice(body).map_err(|e| {
                self.error(
                    UpstreamErrorCode::InvalidArguments,
                    format!("a message is not JSON: {e}"),
                )
            })?;
            line = v.to_string().into_bytes();
            line.push(b'\n');
            &line
        } else {
            line = Vec::with_capacity(body.len() + 1);
            line.extend_from_slice(body);
            line.push(b'\n');
            &line
        };
        let guard = inst.stdin.lock().unwrap_or_else(|p| p.into_inner());
        let Some(fd) = guard.as_ref() else {
            return Err(self.error(UpstreamErrorCode::ServerDown, "its stdin is closed"));
        };
        let mut done = 0;
        while done < bytes.len() {
            if let Some(e) = inst.broken() {
                return Err(e);
            }
            // SAFETY: writing from a valid buffer to our own non-blocking pipe.
            let n = unsafe {
                libc::write(
                    fd.as_raw_fd(),
                    bytes[done..].as_ptr().cast(),
                    bytes.len() - done,
                )
            };
            if n > 0 {
                done += n as usize;
                continue;
            }
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        let e = self.error(
                            UpstreamErrorCode::Timeout,
                            format!(
                                "its program does not read its stdin: {} of {} bytes of a message were taken in {} s (servers.{}.timeout_secs)",
                                done,
                                bytes.len(),
                                self.cfg.timeout.as_secs(),
                                self.name()
                            ),
                        );
                        inst.break_with(e.clone());
                        inst.signal(b'K');
                        return Err(e);
                    }
                    wait_fd(
                        fd.as_raw_fd(),
                        libc::POLLOUT,
                        left.min(Duration::from_secs(1)),
                    );
                }
                _ => {
                    let e = self.error(
                        UpstreamErrorCode::ConnectFailed,
                        format!("writing to its stdin: {err}"),
                    );
                    inst.break_with(e.clone());
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Send `body` and, with `want`, wait for the answer until the request's deadline
    /// (`timeout`, or `start_timeout` from the start while the program has not answered
    /// yet), or `probe` when given.
    fn exchange(
        &self,
        body: &[u8],
        want: Option<u64>,
        probe: Option<Duration>,
        mut for_call: Option<&mut dyn FnMut(Notice)>,
    ) -> Result<Option<Answer>, UpstreamError> {
        let inst = self.live()?;
        let now = Instant::now();
        let answered = inst.lock().answered;
        let mut deadline = if answered {
            now + self.cfg.timeout
        } else {
            (inst.started + self.cfg.start_timeout).max(now + Duration::from_millis(1))
        };
        if let Some(p) = probe {
            deadline = deadline.min(now + p);
        }
        if let Some(id) = want {
            let mut sh = inst.lock();
            sh.waiting.insert(id, None);
            if for_call.is_some() {
                sh.for_calls.insert(id, VecDeque::new());
                if let Some(token) = sent_progress_token(body) {
                    sh.call_tokens.insert(token, id);
                }
            }
        }
        let written = self.write_line(&inst, body, deadline);
        let Some(id) = want else {
            return written.map(|()| None);
        };
        // However this ends, the call's queue goes (what is left in it: for nobody).
        let _queue = ForCall { inst: &inst, id };
        if let Err(e) = written {
            inst.lock().waiting.remove(&id);
            return Err(e);
        }
        let mut sh = inst.lock();
        loop {
            if let Some(sink) = for_call.as_mut() {
                let mut mine: Vec<Notice> = sh
                    .for_calls
                    .get_mut(&id)
                    .map(|q| q.drain(..).collect())
                    .unwrap_or_default();
                if let Some(count) = sh.dropped_for_calls.remove(&id) {
                    mine.push(Notice::Dropped {
                        progress_token: None,
                        count,
                    });
                }
                if !mine.is_empty() {
                    drop(sh);
                    for n in mine {
                        sink(n);
                    }
                    sh = inst.lock();
                    continue;
                }
            }
            if let Some(Some(_)) = sh.waiting.get(&id) {
                sh.abandoned.remove(&id);
                return Ok(sh.waiting.remove(&id).flatten());
            }
            if sh.abandoned.remove(&id) {
                sh.waiting.remove(&id);
                // The caller sees the cancellation (Upstream::request_in), not this.
                return Err(self.error(
                    UpstreamErrorCode::Internal,
                    "the call was cancelled before its answer came",
                ));
            }
            if let Some(e) = &sh.broken {
                let e = e.clone();
                sh.waiting.remove(&id);
                return Err(e);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                sh.waiting.remove(&id);
                if probe.is_some() {
                    return Ok(None);
                }
                let e = if sh.answered {
                    self.error(
                        UpstreamErrorCode::Timeout,
                        format!(
                            "no answer within {} s (servers.{}.timeout_secs)",
                            self.cfg.timeout.as_secs(),
                            self.name()
                        ),
                    )
                } else {
                    self.error(
                        UpstreamErrorCode::Timeout,
                        format!(
                            "its program did not answer within {} s of its start (servers.{}.start_timeout_secs)",
                            self.cfg.start_timeout.as_secs(),
                            self.name()
                        ),
                    )
                };
                return Err(e);
            }
            sh = inst
                .cond
                .wait_timeout(sh, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }

    /// Stop the running program, if any (the host is going away).
    pub fn stop(&self) {
        if let Some(inst) = self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            inst.break_with(self.error(UpstreamErrorCode::ServerDown, "it is stopping"));
            inst.stop(self.cfg.stop_grace);
        }
    }
}

fn reply(answer: Option<Answer>) -> Reply {
    Reply {
        status: 200,
        session_id: None,
        answer,
    }
}

/// Removes a call's queue of notices when its request ends, however it ends.
struct ForCall<'a> {
    inst: &'a Instance,
    id: u64,
}

impl Drop for ForCall<'_> {
    fn drop(&mut self) {
        let mut sh = self.inst.lock();
        sh.for_calls.remove(&self.id);
        sh.dropped_for_calls.remove(&self.id);
        let id = self.id;
        sh.call_tokens.retain(|_, call| *call != id);
    }
}

impl LineChannel for StdioLink {
    fn open(&self) -> Result<(), UpstreamError> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(inst) = current.as_ref() {
            if inst.broken().is_none() {
                return Ok(());
            }
            inst.stop(self.cfg.stop_grace);
        }
        *current = Some(self.start()?);
        Ok(())
    }

    fn reset(&self, why: &UpstreamError) {
        if let Some(inst) = self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            inst.break_with(why.clone());
            inst.stop(self.cfg.stop_grace);
        }
    }

    fn post(&self, body: &[u8], want: Option<u64>) -> Result<Reply, UpstreamError> {
        let answer = self.exchange(body, want, None, None)?;
        if want.is_some() && answer.is_none() {
            return Err(self.error(UpstreamErrorCode::BadResponse, "no answer"));
        }
        Ok(reply(answer))
    }

    fn post_for_call(
        &self,
        body: &[u8],
        want: Option<u64>,
        notice: &mut dyn FnMut(Notice),
    ) -> Result<Reply, UpstreamError> {
        let answer = self.exchange(body, want, None, Some(notice))?;
        if want.is_some() && answer.is_none() {
            return Err(self.error(UpstreamErrorCode::BadResponse, "no answer"));
        }
        Ok(reply(answer))
    }

    fn probe(&self, body: &[u8], want: u64) -> Result<Reply, UpstreamError> {
        let answer = self.exchange(body, Some(want), Some(self.cfg.discover_timeout), None)?;
        Ok(Reply {
            // No answer in time: a legacy server that ignores what comes before
            // `initialize`.
            status: if answer.is_some() { 200 } else { 0 },
            session_id: None,
            answer,
        })
    }

    fn listen(
        &self,
        body: Option<&[u8]>,
        notice: &mut dyn FnMut(Notice),
    ) -> Result<(), UpstreamError> {
        let inst = self.live()?;
        if let Some(body) = body {
            self.write_line(&inst, body, Instant::now() + self.cfg.timeout)?;
        }
        loop {
            let (batch, bits, broken) = {
                let mut sh = inst.lock();
                while sh.notices.is_empty()
                    && sh.list_changed == 0
                    && sh.dropped_notices.is_empty()
                    && sh.broken.is_none()
                {
                    sh = inst.watch_cond.wait(sh).unwrap_or_else(|p| p.into_inner());
                }
                let mut batch: Vec<Notice> = sh.notices.drain(..).collect();
                batch.extend(sh.dropped_notices.drain().map(|(progress_token, count)| {
                    Notice::Dropped {
                        progress_token,
                        count,
                    }
                }));
                let bits = std::mem::take(&mut sh.list_changed);
                (batch, bits, sh.broken.clone())
            };
            for (bit, method) in LIST_CHANGED {
                if bits & bit != 0 {
                    notice(Notice::Notification {
                        method: method.to_string(),
                        params: None,
                    });
                }
            }
            for n in batch {
                notice(n);
            }
            if let Some(e) = broken {
                return Err(e);
            }
        }
    }

    fn abandon(&self, want: u64) {
        let Some(inst) = self.current() else {
            return;
        };
        let mut sh = inst.lock();
        // Only a request still waiting: the set never holds ids nobody will look for.
        if sh.waiting.contains_key(&want) {
            sh.abandoned.insert(want);
            drop(sh);
            inst.cond.notify_all();
        }
    }

    fn describe(&self) -> Value {
        let (pid, running) = match self.current() {
            Some(inst) => {
                let sh = inst.lock();
                (sh.pid, sh.broken.is_none())
            }
            None => (None, false),
        };
        json!({
            "transport": "stdio",
            "pid": pid.filter(|_| running),
            "starts": self.starts.load(Ordering::Relaxed),
        })
    }

    fn note_legacy(&self) {
        self.legacy.store(true, Ordering::Relaxed);
    }

    fn knows_legacy(&self) -> bool {
        self.legacy.load(Ordering::Relaxed)
    }
}

const LIST_CHANGED: [(u8, &str); 3] = [
    (1, "notifications/tools/list_changed"),
    (2, "notifications/resources/list_changed"),
    (4, "notifications/prompts/list_changed"),
];

fn list_changed_bit(method: &str) -> Option<u8> {
    LIST_CHANGED
        .iter()
        .find(|(_, m)| *m == method)
        .map(|(b, _)| *b)
}

/// The thread that reads one instance's stdout, stderr and leader status.
struct Reader {
    server: String,
    inst: Arc<Instance>,
    stdout: OwnedFd,
    stderr: OwnedFd,
    status: OwnedFd,
    max_line: usize,
    stderr_log: StderrLog,
    secrets: Vec<(String, String)>,
    events: EventSink,
    /// Which start of the program this is (1 for the first).
    start: u64,
}

impl Reader {
    fn error(&self, code: UpstreamErrorCode, what: impl std::fmt::Display) -> UpstreamError {
        UpstreamError::new(code, format!("server {}: {what}", self.server))
    }

    /// The error, with the program's last stderr lines.
    fn with_tail(&self, mut e: UpstreamError) -> UpstreamError {
        e.message
            .push_str(&self.stderr_log.tail_text(ERROR_TAIL_LINES));
        e
    }

    fn run(mut self) {
        let mut out_lines = LineSplitter::new(self.max_line, Overflow::Fail);
        let mut err_lines = LineSplitter::new(self.stderr_log.read_limit(), Overflow::Cut);
        let mut buf = vec![0u8; READ_CHUNK];
        let mut status = Vec::with_capacity(8);
        let (mut out_open, mut err_open, mut status_open) = (true, true, true);
        let mut pieces = Vec::new();
        let mut last_batch = Instant::now();
        // When stdout closed before the exit status came: how long we still wait for it.
        let mut exit_wait: Option<Instant> = None;
        loop {
            let mut fds = [
                pollfd(if out_open {
                    self.stdout.as_raw_fd()
                } else {
                    -1
                }),
                pollfd(if err_open {
                    self.stderr.as_raw_fd()
                } else {
                    -1
                }),
                pollfd(if status_open {
                    self.status.as_raw_fd()
                } else {
                    -1
                }),
            ];
            let timeout_ms = if exit_wait.is_some() { 50 } else { 250 };
            // SAFETY: a valid array of pollfds.
            unsafe { libc::poll(fds.as_mut_ptr(), 3, timeout_ms) };
            let now = Instant::now();
            if out_open && fds[0].revents != 0 {
                match read_some(&self.stdout, &mut buf) {
                    ReadOutcome::Data(n) => {
                        out_lines.feed(&buf[..n], &mut pieces);
                        self.stdout_pieces(&mut pieces);
                    }
                    ReadOutcome::Again => {}
                    ReadOutcome::End => {
                        out_open = false;
                        out_lines.finish(&mut pieces);
                        self.stdout_pieces(&mut pieces);
                        exit_wait = Some(now + EXIT_REPORT_WAIT);
                    }
                }
            }
            if err_open && fds[1].revents != 0 {
                // Bounded per turn, so a flood on stderr cannot starve stdout.
                match read_some(&self.stderr, &mut buf) {
                    ReadOutcome::Data(n) => {
                        err_lines.feed(&buf[..n], &mut pieces);
                        for p in pieces.drain(..) {
                            if let Piece::Line { text, cut } = p {
                                self.stderr_log.line(&text, cut, now);
                            }
                        }
                    }
                    ReadOutcome::Again => {}
                    ReadOutcome::End => {
                        err_open = false;
                        err_lines.finish(&mut pieces);
                        for p in pieces.drain(..) {
                            if let Piece::Line { text, cut } = p {
                                self.stderr_log.line(&text, cut, now);
                            }
                        }
                    }
                }
            }
            if status_open && fds[2].revents != 0 {
                let mut b = [0u8; 8];
                match read_some(&self.status, &mut b) {
                    ReadOutcome::Data(n) => {
                        status.extend_from_slice(&b[..n]);
                        if status.len() >= 4 {
                            let pid =
                                i32::from_ne_bytes([status[0], status[1], status[2], status[3]]);
                            let mut sh = self.inst.lock();
                            if sh.pid.is_none() {
                                sh.pid = Some(pid);
                                drop(sh);
                                self.emit_pid();
                            }
                        }
                    }
                    ReadOutcome::Again => {}
                    ReadOutcome::End => status_open = false,
                }
                if status.len() >= 8 {
                    status_open = false;
                }
            }
            if now.saturating_duration_since(last_batch) >= STDERR_BATCH_EVERY {
                last_batch = now;
                self.send_stderr();
            }
            // The leader reported the program's exit (every process of it is gone).
            if !status_open {
                let why = match status.get(4..8) {
                    Some(s) => describe_wait(i32::from_ne_bytes([s[0], s[1], s[2], s[3]])),
                    None => "its program's leader ended without a report".to_owned(),
                };
                // What it still wrote on stderr, for the message.
                drain_stderr(&self.stderr, &mut err_lines, &mut self.stderr_log, &mut buf);
                let e = self.with_tail(self.error(UpstreamErrorCode::ConnectFailed, why));
                self.inst.break_with(e);
                break;
            }
            if let Some(at) = exit_wait
                && now >= at
            {
                exit_wait = None;
                let e = self.with_tail(self.error(
                    UpstreamErrorCode::ConnectFailed,
                    "its program closed its stdout",
                ));
                self.inst.break_with(e);
                self.inst.signal(b'K');
            }
            if self.inst.broken().is_some() && out_open {
                // Broken for another reason (garbage, a stalled stdin): no more reading.
                out_open = false;
            }
        }
        self.send_stderr();
        // The leader exits once it has reported: reap it.
        let mut st = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(self.inst.leader, &mut st, 0) };
        self.emit_pid();
    }

    fn stdout_pieces(&mut self, pieces: &mut Vec<Piece>) {
        for p in pieces.drain(..) {
            if self.inst.broken().is_some() {
                continue;
            }
            match p {
                Piece::TooLong => {
                    let e = self.with_tail(self.error(
                        UpstreamErrorCode::TooLarge,
                        format!(
                            "its program wrote a line of more than {} bytes on stdout (servers.max_body_bytes)",
                            self.max_line
                        ),
                    ));
                    self.inst.break_with(e);
                    self.inst.signal(b'K');
                }
                Piece::Line { text, .. } => self.message(&text),
            }
        }
    }

    /// One line from stdout: the answer to a request, a notification, a server request,
    /// or a fault that breaks the instance.
    fn message(&mut self, line: &[u8]) {
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        let text = match std::str::from_utf8(line) {
            Ok(t) => t,
            Err(_) => return self.garbage(line, "it is not UTF-8".into()),
        };
        let id = answer_id(text);
        match classify(text, id.unwrap_or(0)) {
            Ok(Incoming::Answer(a)) => {
                let mut sh = self.inst.lock();
                sh.answered = true;
                if let Some(slot) = id.and_then(|id| sh.waiting.get_mut(&id)) {
                    *slot = Some(a);
                    drop(sh);
                    self.inst.cond.notify_all();
                }
            }
            Ok(Incoming::Notification { method, params }) => {
                let mut sh = self.inst.lock();
                let own_call = (method == "notifications/progress")
                    .then(|| params.as_ref()?.get("progressToken"))
                    .flatten()
                    .and_then(|t| sh.call_tokens.get(&t.to_string()).copied());
                if let Some(bit) = list_changed_bit(&method) {
                    sh.list_changed |= bit;
                } else if let Some(call) = own_call {
                    match sh.for_calls.get_mut(&call) {
                        Some(q) if q.len() < MAX_QUEUED_NOTICES => {
                            q.push_back(Notice::Notification { method, params })
                        }
                        _ => sh.drop_for_call(call),
                    }
                } else if method == "notifications/message"
                    && let Some(call) = sh.only_call_id()
                {
                    match sh.only_call() {
                        Some(q) if q.len() < MAX_QUEUED_NOTICES => {
                            q.push_back(Notice::Notification { method, params })
                        }
                        _ => sh.drop_for_call(call),
                    }
                } else if sh.notices.len() < MAX_QUEUED_NOTICES {
                    sh.notices
                        .push_back(Notice::Notification { method, params });
                } else {
                    sh.drop_notice(progress_token(params.as_ref()));
                }
                drop(sh);
                self.inst.cond.notify_all();
                self.inst.watch_cond.notify_all();
            }
            Ok(Incoming::ServerRequest { id, method, params }) => {
                let mut sh = self.inst.lock();
                sh.answered = true;
                if let Some(call) = sh.only_call_id() {
                    match sh.only_call() {
                        Some(q) if q.len() < MAX_QUEUED_NOTICES => {
                            q.push_back(Notice::ServerRequest { id, method, params })
                        }
                        _ => sh.drop_for_call(call),
                    }
                } else if sh.notices.len() < MAX_QUEUED_NOTICES {
                    sh.notices
                        .push_back(Notice::ServerRequest { id, method, params });
                } else {
                    sh.drop_notice(None);
                }
                drop(sh);
                self.inst.cond.notify_all();
                self.inst.watch_cond.notify_all();
            }
            Ok(Incoming::Dropped {
                method,
                request,
                progress_token,
                ..
            }) => {
                // Judged on its envelope, never parsed: counted for the call it would go
                // to (a log message or request while one call waits), else the watcher.
                let mut sh = self.inst.lock();
                let for_call = request.is_some() || method == "notifications/message";
                match sh.only_call_id().filter(|_| for_call) {
                    Some(call) => sh.drop_for_call(call),
                    None => sh.drop_notice(progress_token),
                }
                drop(sh);
                self.inst.cond.notify_all();
                self.inst.watch_cond.notify_all();
            }
            Ok(Incoming::Unrelated) => {
                // An answer to an id nobody waits for (a request that timed out).
                self.inst.lock().answered = true;
            }
            Err(why) => self.garbage(line, why),
        }
    }

    fn garbage(&mut self, line: &[u8], why: String) {
        let shown = redact(&self.secrets, &String::from_utf8_lossy(line));
        let e = self.with_tail(self.error(
            UpstreamErrorCode::BadResponse,
            format!(
                "its program wrote something other than a JSON-RPC message on stdout ({}): {}",
                quote_upstream(&why, 120),
                quote_upstream(&shown, 120)
            ),
        ));
        self.inst.break_with(e);
        self.inst.signal(b'K');
    }

    fn send_stderr(&mut self) {
        if let Some((lines, dropped)) = self.stderr_log.take_batch() {
            (self.events)(
                "stderr",
                json!({"server": self.server, "lines": lines, "dropped": dropped}),
            );
        }
    }

    fn emit_pid(&self) {
        let sh = self.inst.lock();
        (self.events)(
            "server_process",
            json!({"server": self.server, "pid": sh.pid, "running": sh.broken.is_none(),
                   "starts": self.start}),
        );
    }
}

/// The progress token a notification names, when it is a string (the gateway's are).
/// The `params._meta.progressToken` a request carries, as JSON text (the key the
/// token's notifications are matched by); None without one.
fn sent_progress_token(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Body {
        #[serde(default)]
        params: Option<Params>,
    }
    #[derive(serde::Deserialize)]
    struct Params {
        #[serde(rename = "_meta", default)]
        meta: Option<Meta>,
    }
    #[derive(serde::Deserialize)]
    struct Meta {
        #[serde(rename = "progressToken", default)]
        progress_token: Option<Value>,
    }
    let token = serde_json::from_slice::<Body>(body)
        .ok()?
        .params?
        .meta?
        .progress_token?;
    matches!(token, Value::String(_) | Value::Number(_)).then(|| token.to_string())
}

fn progress_token(params: Option<&Value>) -> Option<String> {
    params?
        .get("progressToken")?
        .as_str()
        .map(|t| t.chars().take(64).collect())
}

/// The numeric id of a response (our requests use numbers); `None` for anything else.
fn answer_id(text: &str) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct Id<'a> {
        #[serde(borrow, default)]
        id: Option<&'a serde_json::value::RawValue>,
        #[serde(default)]
        method: Option<serde::de::IgnoredAny>,
    }
    let parsed: Id = serde_json::from_str(text).ok()?;
    if parsed.method.is_some() {
        return None;
    }
    parsed.id?.get().trim().parse().ok()
}

fn describe_wait(status: i32) -> String {
    if libc::WIFEXITED(status) {
        format!("its program exited with code {}", libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        format!(
            "its program was killed by signal {}",
            libc::WTERMSIG(status)
        )
    } else {
        format!("its program ended (status {status})")
    }
}

fn drain_stderr(fd: &OwnedFd, lines: &mut LineSplitter, log: &mut StderrLog, buf: &mut [u8]) {
    let mut pieces = Vec::new();
    // Bounded: what is in the pipe now, a few reads at most.
    for _ in 0..16 {
        match read_some(fd, buf) {
            ReadOutcome::Data(n) => lines.feed(&buf[..n], &mut pieces),
            ReadOutcome::End => {
                lines.finish(&mut pieces);
                break;
            }
            ReadOutcome::Again => break,
        }
    }
    let now = Instant::now();
    for p in pieces {
        if let Piece::Line { text, cut } = p {
            log.line(&text, cut, now);
        }
    }
}

enum ReadOutcome {
    Data(usize),
    Again,
    End,
}

fn read_some(fd: &OwnedFd, buf: &mut [u8]) -> ReadOutcome {
    loop {
        // SAFETY: reading into a valid buffer from our own non-blocking pipe.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n > 0 {
            return ReadOutcome::Data(n as usize);
        }
        if n == 0 {
            return ReadOutcome::End;
        }
        match io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) => return ReadOutcome::Again,
            _ => return ReadOutcome::End,
        }
    }
}

fn pollfd(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

fn wait_fd(fd: RawFd, events: libc::c_short, d: Duration) {
    let mut p = [libc::pollfd {
        fd,
        events,
        revents: 0,
    }];
    let ms = d.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: a valid pollfd.
    unsafe { libc::poll(p.as_mut_ptr(), 1, ms) };
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: a valid array of two fds.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh fds nobody else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: fcntl on an fd we own.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answer_ids_are_numbers_of_responses_only() {
        assert_eq!(
            answer_id(r#"{"jsonrpc":"2.0","id":7,"result":{}}"#),
            Some(7)
        );
        assert_eq!(answer_id(r#"{"jsonrpc":"2.0","id":"7","result":{}}"#), None);
        assert_eq!(
            answer_id(r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#),
            None
        );
        assert_eq!(answer_id("garbage"), None);
        assert_eq!(
            list_changed_bit("notifications/prompts/list_changed"),
            Some(4)
        );
        assert!(describe_wait(0).contains("code 0"));
    }
}
