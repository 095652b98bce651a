//! The gateway's side of its workers: start each one on a socketpair, accept it only when
//! its confinement report passes, move RPC bytes, reap it when it exits and start it again
//! with backoff. The loop turns what happens here into [`WorkerEvent`]s for the core.

use mio::net::UnixStream;
use mio::{Registry, Token};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::mcp::catalog::WorkerId;
use crate::sandbox::{self, ConfinementReport, Role, SandboxConfig};
use crate::transport::write_interest::WriteInterest;
use crate::workers::rpc::{self, Message, RpcReader};
use crate::workers::settings::WorkerSettings;
use crate::workers::worker_main::MAX_SETTINGS_BYTES;

/// Time a worker has to send `ready`.
pub const START_TIMEOUT: Duration = Duration::from_secs(15);
/// First restart delay; doubles per consecutive failure up to [`MAX_BACKOFF`].
pub const MIN_BACKOFF: Duration = Duration::from_millis(100);
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A worker up this long before it died restarts without accumulated backoff.
pub const STABLE_AFTER: Duration = Duration::from_secs(30);
/// Bytes queued for a worker before calls to it are refused as busy.
pub const MAX_WORKER_BACKLOG: usize = 64 * 1024 * 1024;

/// Who starts a worker, and as which user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerHost {
    /// The gateway, as its own user (the builtin and aggregator; a host of agent programs
    /// when `[sandbox] run_agents_as_gateway_user` allows it, see `allowed_probes`).
    Gateway,
    /// The agent launcher, as agent user number `identity`, in the cgroup `cgroup` when
    /// cgroups are in force; its report must show `uid`.
    AgentUser {
        identity: usize,
        uid: u32,
        cgroup: Option<std::path::PathBuf>,
    },
    /// Never started, and why (toolwall cannot switch users): the worker stays down.
    Refused(String),
}

/// A worker process: one the gateway spawned, or one the launcher started with the
/// gateway as its parent (`CLONE_PARENT`), known by pid. Either way the gateway is the
/// parent: it reaps it, and until then the pid cannot be reused.
#[derive(Debug)]
enum WorkerChild {
    Spawned(Child),
    Adopted(u32),
}

impl WorkerChild {
    fn id(&self) -> u32 {
        match self {
            WorkerChild::Spawned(c) => c.id(),
            WorkerChild::Adopted(pid) => *pid,
        }
    }

    fn kill(&mut self) -> std::io::Result<()> {
        match self {
            WorkerChild::Spawned(c) => c.kill(),
            WorkerChild::Adopted(pid) => {
                // SAFETY: kill(2) on our own unreaped child.
                if unsafe { libc::kill(*pid as libc::pid_t, libc::SIGKILL) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            }
        }
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on our own unreaped child.
        unsafe {
            libc::kill(self.id() as libc::pid_t, sig);
        }
    }

    fn try_wait(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        match self {
            WorkerChild::Spawned(c) => c.try_wait(),
            WorkerChild::Adopted(pid) => reap_pid(*pid, libc::WNOHANG),
        }
    }

    fn wait(&mut self) {
        match self {
            WorkerChild::Spawned(c) => {
                let _ = c.wait();
            }
            WorkerChild::Adopted(pid) => {
                let _ = reap_pid(*pid, 0);
            }
        }
    }
}

/// waitpid on a child the launcher created for us.
fn reap_pid(pid: u32, flags: libc::c_int) -> std::io::Result<Option<std::process::ExitStatus>> {
    let mut status = 0;
    loop {
        // SAFETY: waiting for our own child.
        let rc = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, flags) };
        if rc == 0 {
            return Ok(None);
        }
        if rc > 0 {
            return Ok(Some(std::process::ExitStatus::from_raw(status)));
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[derive(Debug, Clone)]
pub struct WorkerSpec {
    /// Unique name, shown in status and errors (`builtin`).
    pub name: String,
    pub role: Role,
    /// The catalog server it serves (`local`).
    pub server: String,
    pub settings: WorkerSettings,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerState {
    Starting,
    Ready,
    /// Stopped; restarts at the time given.
    Down,
}

impl WorkerState {
    pub fn as_str(&self) -> &'static str {
        match self {
            WorkerState::Starting => "starting",
            WorkerState::Ready => "ready",
            WorkerState::Down => "down",
        }
    }
}

#[derive(Debug)]
pub enum WorkerEvent {
    /// Attested: may get work. Carries warnings (warn mode).
    Ready(WorkerId, Vec<String>),
    Message(WorkerId, Message),
    /// Gone (exited, killed, broke the protocol, refused): its calls fail now.
    Gone(WorkerId, String),
    /// Started (pid) — for the ledger.
    Started(WorkerId, u32),
    /// Its exit status, once reaped.
    Exited(WorkerId, u32, String),
}

pub struct WorkerProc {
    pub spec: WorkerSpec,
    pub id: WorkerId,
    pub token: Token,
    child: Option<WorkerChild>,
    stream: Option<UnixStream>,
    /// Registered writable only while `out` holds bytes.
    write_interest: WriteInterest,
    reader: RpcReader,
    out: Vec<u8>,
    pub state: WorkerState,
    pub pid: Option<u32>,
    pub report: Option<ConfinementReport>,
    pub warnings: Vec<String>,
    pub restarts: u32,
    /// Starts tried, successful or not.
    pub attempts: u32,
    pub last_exit: Option<String>,
    backoff: Duration,
    started_at: Instant,
    ready_at: Option<Instant>,
    restart_at: Option<Instant>,
    /// Gone was reported for this incarnation.
    gone: bool,
    /// Do not restart (shutdown).
    retired: bool,
    /// Taken out of the config (reload): SIGKILL at this time if it has not exited, and
    /// forgotten once reaped.
    removed_kill_at: Option<Instant>,
    /// What the worker reads on stdin instead of `spec.settings`, for a role with settings
    /// of its own (the workspace role).
    stdin_settings: Option<Vec<u8>>,
    pub host: WorkerHost,
    /// Probes this worker's report must carry beyond its role's (one per secret the
    /// config names), each denied.
    pub extra_probes: Vec<String>,
    /// Probes allowed to succeed by the configuration, each a loud warning
    /// (`run_agents_as_gateway_user`).
    pub allowed_probes: Vec<String>,
}

impl WorkerProc {
    /// Attested, or refused or failed at least once.
    pub fn settled(&self) -> bool {
        self.state == WorkerState::Ready || (self.attempts > 0 && self.state == WorkerState::Down)
    }
}

/// A pipe already holding the worker's settings, its write end closed: the worker reads
/// stdin to EOF before it confines itself. Bounded by [`MAX_SETTINGS_BYTES`]; the pipe is
/// grown to hold them whole, so nothing here can block.
pub fn settings_pipe(settings: &[u8]) -> std::io::Result<OwnedFd> {
    use std::io::Write as _;
    if settings.len() > MAX_SETTINGS_BYTES {
        return Err(std::io::Error::other(format!(
            "worker settings of {} bytes exceed {MAX_SETTINGS_BYTES}",
            settings.len()
        )));
    }
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| std::io::Error::other(format!("pipe: {e}")))?;
    if settings.len() >= 64 * 1024 {
        // SAFETY: F_SETPIPE_SZ on a pipe we own; the result is checked.
        let size = unsafe {
            libc::fcntl(
                write.as_raw_fd(),
                libc::F_SETPIPE_SZ,
                settings.len() as libc::c_int,
            )
        };
        if size < 0 || (size as usize) < settings.len() {
            return Err(std::io::Error::other(format!(
                "cannot grow a pipe to {} bytes for the worker settings (fs.pipe-max-size)",
                settings.len()
            )));
        }
    }
    let mut write = std::fs::File::from(write);
    write.write_all(settings)?;
    Ok(read)
}

pub struct Supervisor {
    pub workers: Vec<WorkerProc>,
    sandbox: SandboxConfig,
    exe: std::path::PathBuf,
    /// How agent programs are hosted (the launcher, when toolwall can switch users).
    pub agents: Option<crate::launcher::AgentPlan>,
    /// The secrets the config names: every worker added hides them and must prove, one
    /// probe each, that it cannot read them.
    secrets: Vec<crate::sandbox::SecretPath>,
}

impl Supervisor {
    pub fn new(sandbox: SandboxConfig) -> Supervisor {
        Supervisor {
            workers: Vec::new(),
            sandbox,
            // The running binary's own inode, even if the file was replaced since.
            exe: std::path::PathBuf::from("/proc/self/exe"),
            agents: None,
            secrets: Vec::new(),
        }
    }

    /// The secrets every worker added from now on hides and probes.
    pub fn set_secrets(&mut self, secrets: Vec<crate::sandbox::SecretPath>) {
        self.secrets = secrets;
    }

    /// The secrets workers hide and probe.
    pub fn secrets(&self) -> &[crate::sandbox::SecretPath] {
        &self.secrets
    }

    pub fn add(&mut self, mut spec: WorkerSpec, id: WorkerId, token: Token) {
        spec.settings.secrets = self.secrets.clone();
        let extra_probes = self.secrets.iter().map(|s| s.probe_name()).collect();
        self.workers.push(WorkerProc {
            spec,
            id,
            token,
            child: None,
            stream: None,
            write_interest: WriteInterest::default(),
            reader: RpcReader::default(),
            out: Vec::new(),
            state: WorkerState::Down,
            pid: None,
            report: None,
            warnings: Vec::new(),
            restarts: 0,
            attempts: 0,
            last_exit: None,
            backoff: MIN_BACKOFF,
            started_at: Instant::now(),
            ready_at: None,
            restart_at: Some(Instant::now()),
            gone: true,
            retired: false,
            removed_kill_at: None,
            stdin_settings: None,
            host: WorkerHost::Gateway,
            extra_probes,
            allowed_probes: Vec::new(),
        });
    }

    /// Like [`Supervisor::add`], for a worker that reads `stdin_settings` (JSON) instead of
    /// its spec's `settings`.
    pub fn add_with_settings(
        &mut self,
        spec: WorkerSpec,
        id: WorkerId,
        token: Token,
        stdin_settings: Vec<u8>,
    ) {
        self.add(spec, id, token);
        if let Some(w) = self.workers.last_mut() {
            w.stdin_settings = Some(stdin_settings);
        }
    }

    /// Like [`Supervisor::add_with_settings`], for a worker that hosts agent programs:
    /// started as `host` says; the probes of `allowed_probes` may succeed (a configured
    /// exception, warned about). Its settings must carry the secrets too.
    pub fn add_program_host(
        &mut self,
        spec: WorkerSpec,
        id: WorkerId,
        token: Token,
        stdin_settings: Vec<u8>,
        host: WorkerHost,
        allowed_probes: Vec<String>,
    ) {
        self.add_with_settings(spec, id, token, stdin_settings);
        if let Some(w) = self.workers.last_mut() {
            if let WorkerHost::Refused(why) = &host {
                // Never started: down for good, and settled (so the gateway serves the rest).
                w.retired = true;
                w.restart_at = None;
                w.attempts = 1;
                w.last_exit = Some(why.clone());
            }
            w.host = host;
            w.allowed_probes = allowed_probes;
        }
    }

    /// Start the worker `id` again with new settings (a local server whose configuration
    /// changed on reload): it is stopped now and starts again at once, without the backoff
    /// earlier failures built up.
    pub fn restart_with_settings(
        &mut self,
        id: WorkerId,
        stdin_settings: Vec<u8>,
        registry: &Registry,
        now: Instant,
        events: &mut Vec<WorkerEvent>,
    ) {
        let Some(w) = self.workers.iter_mut().find(|w| w.id == id) else {
            return;
        };
        w.stdin_settings = Some(stdin_settings);
        w.backoff = MIN_BACKOFF;
        let why = format!("worker {} restarts: its configuration changed", w.spec.name);
        Self::take_down(w, registry, why, now, events);
    }

    /// Stop the worker `id` for good (its server was taken out of the config): its
    /// channel closes now, so the host ends and its leader stops the program (SIGTERM to
    /// the program's processes, SIGKILL after their grace); the host itself gets SIGKILL
    /// after `grace` if it is still there. It is forgotten once reaped.
    pub fn remove(
        &mut self,
        id: WorkerId,
        grace: Duration,
        registry: &Registry,
        now: Instant,
        events: &mut Vec<WorkerEvent>,
    ) {
        let Some(i) = self.workers.iter().position(|w| w.id == id) else {
            return;
        };
        let w = &mut self.workers[i];
        w.retired = true;
        w.restart_at = None;
        if let Some(mut s) = w.stream.take() {
            let _ = registry.deregister(&mut s);
        }
        w.out.clear();
        w.state = WorkerState::Down;
        if !w.gone {
            w.gone = true;
            let why = format!(
                "worker {} stopped: its server was removed from the config",
                w.spec.name
            );
            w.last_exit = Some(why.clone());
            events.push(WorkerEvent::Gone(w.id, why));
        }
        if w.child.is_none() {
            self.workers.remove(i);
            return;
        }
        w.removed_kill_at = Some(now + grace);
    }

    /// The next free worker token at or above `base`.
    pub fn next_token(&self, base: usize) -> Token {
        Token(
            self.workers
                .iter()
                .map(|w| w.token.0 + 1)
                .max()
                .unwrap_or(base)
                .max(base),
        )
    }

    fn index(&self, token: Token) -> Option<usize> {
        self.workers.iter().position(|w| w.token == token)
    }

    pub fn owns(&self, token: Token) -> bool {
        self.index(token).is_some()
    }

    /// Start the worker at `i`.
    fn spawn(
        &mut self,
        i: usize,
        registry: &Registry,
        now: Instant,
        events: &mut Vec<WorkerEvent>,
    ) {
        let w = &mut self.workers[i];
        w.restart_at = None;
        w.attempts += 1;
        let launcher = match (&w.host, self.agents.as_mut().map(|a| &mut a.hosting)) {
            (
                WorkerHost::AgentUser {
                    identity, cgroup, ..
                },
                Some(crate::launcher::AgentHosting::Launcher(l)),
            ) => Some((l, *identity, cgroup.clone())),
            (WorkerHost::AgentUser { .. }, _) => {
                let why = format!("cannot start worker {}: no agent launcher", w.spec.name);
                crate::error!("{why}");
                w.last_exit = Some(why);
                Self::schedule_restart(w, now);
                return;
            }
            _ => None,
        };
        let result = (|| -> std::io::Result<(WorkerChild, UnixStream)> {
            let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
            let settings = match &w.stdin_settings {
                Some(s) => s.clone(),
                None => serde_json::to_vec(&w.spec.settings).map_err(std::io::Error::other)?,
            };
            let settings_pipe = settings_pipe(&settings)?;
            let theirs: OwnedFd = theirs.into();
            let child = if let Some((launcher, identity, cgroup)) = launcher {
                use std::os::fd::AsFd;
                let cgroup_dir = match &cgroup {
                    Some(dir) => Some(std::fs::File::open(dir).map_err(|e| {
                        std::io::Error::other(format!("cgroup {}: {e}", dir.display()))
                    })?),
                    None => None,
                };
                match launcher.spawn(
                    w.spec.role,
                    identity,
                    theirs.as_fd(),
                    settings_pipe.as_fd(),
                    cgroup_dir.as_ref().map(|f| f.as_fd()),
                ) {
                    Ok(pid) => WorkerChild::Adopted(pid),
                    Err(e) => {
                        if let Some(pid) = e.pid {
                            // Created and failed before its exec: ours to reap.
                            WorkerChild::Adopted(pid).wait();
                        }
                        return Err(std::io::Error::other(e.message));
                    }
                }
            } else {
                let theirs_raw = theirs.as_raw_fd();
                let mut confine_child = sandbox::child_pre_exec(theirs_raw, &self.sandbox);
                let mut cmd = Command::new(&self.exe);
                cmd.arg("worker")
                    .arg(w.spec.role.to_string())
                    .env_clear()
                    .stdin(Stdio::from(settings_pipe))
                    .stdout(Stdio::null())
                    .stderr(Stdio::inherit());
                // SAFETY: only async-signal-safe calls run between fork and exec.
                unsafe {
                    cmd.pre_exec(move || {
                        let mut empty: libc::sigset_t = std::mem::zeroed();
                        libc::sigemptyset(&mut empty);
                        // The gateway blocks signals for its signalfd; a worker must not inherit that.
                        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
                        confine_child()
                    });
                }
                WorkerChild::Spawned(cmd.spawn()?)
            };
            drop(theirs);
            ours.set_nonblocking(true)?;
            let mut stream = UnixStream::from_std(ours);
            registry.register(&mut stream, w.token, WriteInterest::INITIAL)?;
            Ok((child, stream))
        })();
        match result {
            Ok((child, stream)) => {
                w.pid = Some(child.id());
                events.push(WorkerEvent::Started(w.id, child.id()));
                w.child = Some(child);
                w.stream = Some(stream);
                w.write_interest = WriteInterest::default();
                w.reader = RpcReader::default();
                w.out.clear();
                w.state = WorkerState::Starting;
                w.started_at = now;
                w.ready_at = None;
                w.report = None;
                w.gone = false;
            }
            Err(e) => {
                let why = format!("cannot start worker {}: {e}", w.spec.name);
                crate::error!("{why}");
                w.last_exit = Some(why);
                Self::schedule_restart(w, now);
            }
        }
    }

    fn schedule_restart(w: &mut WorkerProc, now: Instant) {
        if w.retired {
            return;
        }
        let stable = w
            .ready_at
            .is_some_and(|t| now.saturating_duration_since(t) >= STABLE_AFTER);
        if stable {
            w.backoff = MIN_BACKOFF;
        }
        w.restart_at = Some(now + w.backoff);
        w.backoff = (w.backoff * 2).min(MAX_BACKOFF);
        w.state = WorkerState::Down;
    }

    /// Stop an incarnation: close the channel, kill the process (reaped later), and
    /// report it gone once.
    fn take_down(
        w: &mut WorkerProc,
        registry: &Registry,
        why: String,
        now: Instant,
        events: &mut Vec<WorkerEvent>,
    ) {
        if let Some(mut s) = w.stream.take() {
            let _ = registry.deregister(&mut s);
        }
        if let Some(child) = w.child.as_mut() {
            let _ = child.kill();
        }
        w.out.clear();
        if !w.gone {
            w.gone = true;
            w.last_exit = Some(why.clone());
            events.push(WorkerEvent::Gone(w.id, why));
        }
        if w.child.is_none() {
            Self::schedule_restart(w, now);
        } else {
            w.state = WorkerState::Down;
        }
    }

    /// Readable/writable on a worker's channel; `hung_up` when the event says the worker
    /// closed its side.
    pub fn on_io(
        &mut self,
        token: Token,
        registry: &Registry,
        now: Instant,
        hung_up: bool,
        events: &mut Vec<WorkerEvent>,
    ) {
        let Some(i) = self.index(token) else { return };
        let mode = self.sandbox.mode;
        let w = &mut self.workers[i];
        let Some(stream) = w.stream.as_mut() else {
            return;
        };
        let mut fault: Option<String> = None;
        loop {
            let spare = w.reader.spare();
            let spare_len = spare.len();
            match stream.read(spare) {
                Ok(0) => {
                    w.reader.filled(0);
                    fault = Some("closed its channel".into());
                    break;
                }
                // A short read emptied the socket (as in the gateway's connections: the
                // next arrival raises a new event), unless the worker hung up: then read
                // on to its end of file.
                Ok(n) if n < spare_len && !hung_up => {
                    w.reader.filled(n);
                    break;
                }
                Ok(n) => w.reader.filled(n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    w.reader.filled(0);
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => w.reader.filled(0),
                Err(e) => {
                    w.reader.filled(0);
                    fault = Some(format!("channel error: {e}"));
                    break;
                }
            }
        }
        loop {
            match w.reader.next_message() {
                Ok(None) => break,
                Err(e) => {
                    fault = Some(format!("broke the protocol: {e}"));
                    break;
                }
                Ok(Some(msg)) => match (&w.state, msg) {
                    (
                        WorkerState::Starting,
                        Message::Ready {
                            role,
                            pid,
                            confinement,
                            ..
                        },
                    ) => {
                        if role != w.spec.role.to_string() || Some(pid) != w.pid {
                            fault = Some(format!("sent a ready message for role {role} pid {pid}"));
                            break;
                        }
                        if let WorkerHost::AgentUser { uid, .. } = &w.host
                            && confinement.uid != Some(*uid)
                        {
                            fault = Some(format!(
                                "runs as uid {:?}, not as its agent user's uid {uid}",
                                confinement.uid
                            ));
                            break;
                        }
                        match confinement.verdict_with(mode, &w.extra_probes, &w.allowed_probes) {
                            Ok(warnings) => {
                                for warning in &warnings {
                                    crate::warn!(
                                        "worker {} (pid {pid}) runs unconfined in part: {warning}",
                                        w.spec.name
                                    );
                                }
                                w.report = Some(confinement);
                                w.warnings = warnings.clone();
                                w.state = WorkerState::Ready;
                                w.ready_at = Some(now);
                                events.push(WorkerEvent::Ready(w.id, warnings));
                            }
                            Err(why) => {
                                w.report = Some(confinement);
                                fault = Some(format!("failed its confinement attestation: {why}"));
                                break;
                            }
                        }
                    }
                    (WorkerState::Starting, _) => {
                        fault = Some("spoke before its ready message".into());
                        break;
                    }
                    (WorkerState::Ready, Message::Ready { .. }) => {
                        fault = Some("sent a second ready message".into());
                        break;
                    }
                    (WorkerState::Ready, msg) => events.push(WorkerEvent::Message(w.id, msg)),
                    (WorkerState::Down, _) => break,
                },
            }
        }
        if fault.is_none()
            && let Err(e) = Self::flush(w, registry)
        {
            fault = Some(format!("channel error: {e}"));
        }
        if let Some(why) = fault {
            let pid = w.pid.unwrap_or(0);
            let why = format!("worker {} (pid {pid}) {why}", w.spec.name);
            crate::error!("{why}");
            Self::take_down(w, registry, why, now, events);
        }
    }

    fn flush(w: &mut WorkerProc, registry: &Registry) -> std::io::Result<()> {
        let Some(stream) = w.stream.as_mut() else {
            return Ok(());
        };
        let mut written = 0;
        while written < w.out.len() {
            match stream.write(&w.out[written..]) {
                Ok(0) => return Err(std::io::Error::other("channel closed")),
                Ok(n) => written += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        w.out.drain(..written);
        let token = w.token;
        w.write_interest.update(!w.out.is_empty(), |interest| {
            registry.reregister(stream, token, interest)
        })
    }

    /// Queue a message for a worker. Err when the worker cannot take it.
    pub fn send(&mut self, id: WorkerId, msg: &Message) -> Result<(), String> {
        let Some(w) = self.workers.iter_mut().find(|w| w.id == id) else {
            return Err("no such worker".into());
        };
        if w.state != WorkerState::Ready || w.stream.is_none() {
            return Err(format!("worker {} is not ready", w.spec.name));
        }
        if w.out.len() > MAX_WORKER_BACKLOG {
            return Err(format!(
                "worker {} has {} bytes queued",
                w.spec.name,
                w.out.len()
            ));
        }
        rpc::encode(&mut w.out, msg).map_err(|e| e.to_string())?;
        Ok(())
    }

    /// Write what `send` queued.
    pub fn flush_all(&mut self, registry: &Registry, now: Instant, events: &mut Vec<WorkerEvent>) {
        for w in &mut self.workers {
            if w.out.is_empty() {
                continue;
            }
            if let Err(e) = Self::flush(w, registry) {
                let why = format!(
                    "worker {} (pid {}) channel error: {e}",
                    w.spec.name,
                    w.pid.unwrap_or(0)
                );
                Self::take_down(w, registry, why, now, events);
            }
        }
    }

    /// After SIGCHLD: reap every worker that exited.
    pub fn reap(&mut self, registry: &Registry, now: Instant, events: &mut Vec<WorkerEvent>) {
        if let Some(plan) = self.agents.as_mut()
            && let crate::launcher::AgentHosting::Launcher(l) = &mut plan.hosting
            && let Some(how) = l.exited()
        {
            let why = format!(
                "the agent launcher exited ({how}): hosts of agent programs cannot start again"
            );
            crate::error!("{why}");
            plan.hosting = crate::launcher::AgentHosting::Refused(why);
        }
        for w in &mut self.workers {
            let Some(child) = w.child.as_mut() else {
                continue;
            };
            match child.try_wait() {
                Ok(Some(status)) => {
                    let pid = child.id();
                    let how = match (status.code(), status.signal()) {
                        (Some(code), _) => format!("exited with code {code}"),
                        (None, Some(sig)) => format!("killed by signal {sig}"),
                        _ => "ended".to_owned(),
                    };
                    w.child = None;
                    kill_cgroup(&w.host, &w.spec.name);
                    events.push(WorkerEvent::Exited(w.id, pid, how.clone()));
                    let why = format!("worker {} (pid {pid}) {how}", w.spec.name);
                    if !w.gone && !w.retired {
                        crate::error!("{why}");
                    }
                    // With no child left, this also schedules the restart.
                    Self::take_down(w, registry, why, now, events);
                }
                Ok(None) => {}
                Err(e) => crate::warn!("waiting for worker {}: {e}", w.spec.name),
            }
        }
        self.workers
            .retain(|w| w.removed_kill_at.is_none() || w.child.is_some());
    }

    pub fn next_deadline(&self) -> Option<Instant> {
        self.workers
            .iter()
            .filter_map(|w| match w.state {
                WorkerState::Starting => Some(w.started_at + START_TIMEOUT),
                WorkerState::Down if w.child.is_none() && !w.retired => w.restart_at,
                WorkerState::Down if w.child.is_some() => w.removed_kill_at,
                _ => None,
            })
            .min()
    }

    /// Start workers whose restart time came; stop ones that never said ready.
    pub fn on_timers(&mut self, registry: &Registry, now: Instant, events: &mut Vec<WorkerEvent>) {
        for i in 0..self.workers.len() {
            let w = &mut self.workers[i];
            match w.state {
                WorkerState::Starting if now >= w.started_at + START_TIMEOUT => {
                    let why = format!(
                        "worker {} (pid {}) sent no ready message within {} s",
                        w.spec.name,
                        w.pid.unwrap_or(0),
                        START_TIMEOUT.as_secs()
                    );
                    crate::error!("{why}");
                    Self::take_down(w, registry, why, now, events);
                }
                WorkerState::Down
                    if w.child.is_some() && w.removed_kill_at.is_some_and(|t| t <= now) =>
                {
                    if let Some(child) = w.child.as_mut() {
                        let _ = child.kill();
                    }
                    w.removed_kill_at = Some(now + MAX_BACKOFF);
                }
                WorkerState::Down
                    if w.child.is_none()
                        && !w.retired
                        && w.restart_at.is_some_and(|t| t <= now) =>
                {
                    if w.pid.is_some() {
                        w.restarts += 1;
                    }
                    self.spawn(i, registry, now, events);
                }
                _ => {}
            }
        }
    }

    pub fn all_ready(&self) -> bool {
        self.workers.iter().all(|w| w.state == WorkerState::Ready)
    }

    /// Every worker either attested or has been refused or failed at least once: agents
    /// can be served (calls to a worker that is down get `worker_unavailable`).
    pub fn all_settled(&self) -> bool {
        self.workers.iter().all(WorkerProc::settled)
    }

    /// Stop every worker: close channels, SIGTERM, then SIGKILL after `grace`; reap all.
    pub fn shutdown(&mut self, registry: &Registry, grace: Duration) {
        for w in &mut self.workers {
            w.retired = true;
            if let Some(mut s) = w.stream.take() {
                let _ = registry.deregister(&mut s);
            }
            if let Some(child) = &w.child {
                child.signal(libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + grace;
        for w in &mut self.workers {
            if let Some(mut child) = w.child.take() {
                loop {
                    match child.try_wait() {
                        Ok(Some(_)) | Err(_) => break,
                        Ok(None) if Instant::now() >= deadline => {
                            let _ = child.kill();
                            child.wait();
                            break;
                        }
                        Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            }
            w.state = WorkerState::Down;
        }
        // What is left in a host's cgroup (its program's processes, stopping within
        // their grace, or ones that detached from it) gets until the same deadline, then
        // SIGKILL, all of it.
        for w in &self.workers {
            if let WorkerHost::AgentUser {
                cgroup: Some(dir), ..
            } = &w.host
            {
                while crate::launcher::cgroup_tree::populated(dir) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(5));
                }
                kill_cgroup(&w.host, &w.spec.name);
            }
        }
    }

    pub fn kill_now(&mut self) {
        for w in &mut self.workers {
            w.retired = true;
            if let Some(mut child) = w.child.take() {
                let _ = child.kill();
                child.wait();
            }
            kill_cgroup(&w.host, &w.spec.name);
        }
    }
}

/// A host of agent programs in a cgroup of its own has been reaped: whatever is left in
/// that cgroup (a process that left its process group and session, or outlived the
/// host's leader) is killed, so nothing of it runs on once its host is gone and the next
/// incarnation starts in an empty cgroup.
fn kill_cgroup(host: &WorkerHost, name: &str) {
    if let WorkerHost::AgentUser {
        cgroup: Some(dir), ..
    } = host
        && let Err(e) = crate::launcher::cgroup_tree::kill_all(dir)
    {
        crate::warn!("worker {name}: killing what is left in its cgroup: {e}");
    }
}
