//! `toolwall worker workspace`: one workspace's shell and file tools.
//!
//! Start: scrub fds, read the settings, create the private temp dir, open /dev/null, then
//! confine (Landlock write root, deny-list seccomp; see `sandbox-profiles/workspace.*`)
//! while still single-threaded, attest, say `ready`. Then one mio loop carries the RPC
//! channel and every task's pipes; the file tools run on a small pool of threads whose
//! answers come back through a waker. Tasks outlive the calls that started them (an
//! agent's disconnect changes nothing) and end with the worker: when it exits, every
//! task's leader sees its control pipe close and kills the task.

use mio::net::UnixStream;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use serde_json::{Value, json};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::args::{self, ShellArgs, TaskArgs, unwrap_input};
use super::error::{WsError, WsErrorCode, ok_result};
use super::files;
use super::find;
use super::launch::{LaunchSpec, Launched, launch};
use super::paths::WorkspaceRoot;
use super::settings::WorkspaceWorkerSettings;
use super::system_info::system_info;
use super::tasks::{Exit, NEXT_ACTIONS, Stream, TaskAction, Tasks, WaitKind};
use super::tools;
use crate::sandbox::{self, ConfinementReport, Role};
use crate::transport::write_interest::WriteInterest;
use crate::workers::agent_host_start::confine_and_attest;
use crate::workers::pool_calls::{self, CancelledCalls, PoolCalls};
use crate::workers::rpc::{ListKind, Message, Op, RpcError, RpcReader};
use crate::workers::worker_main::{flush, push, read_settings};

const RPC: Token = Token(0);
const WAKE: Token = Token(1);
/// Task pipes use tokens from here: three per slot (stdout, stderr, status).
const FIRST_TASK_TOKEN: usize = 16;
/// How often a leader that has not exited yet is looked at again.
const REAP_RETRY: Duration = Duration::from_millis(20);

/// Run the worker; returns the process exit code.
pub fn run() -> i32 {
    let role = Role::Workspace;
    if let Err(e) = sandbox::scrub_inherited_fds() {
        crate::error!("worker {role}: cannot close inherited fds: {e}");
        return 3;
    }
    let settings: WorkspaceWorkerSettings = match read_settings() {
        Ok(s) => s,
        Err(e) => {
            crate::error!("worker {role}: bad or missing settings on stdin: {e}");
            return 2;
        }
    };
    let name = settings.name.clone();
    // Who we are, before anything else: a host of agent programs never runs as root or as
    // toolwall's own user unless the configuration allowed the latter.
    if let Err(e) = check_identity(&settings)
        && settings.sandbox_mode == sandbox::SandboxMode::Enforce
    {
        crate::error!("workspace {name}: {e}");
        return 3;
    }
    match settings.workspace.canonical_root() {
        Ok(root) if root == settings.workspace.root => {}
        Ok(root) => {
            crate::error!(
                "workspace {name}: root {} is not canonical (it resolves to {})",
                settings.workspace.root.display(),
                root.display()
            );
            return 2;
        }
        Err(e) => {
            crate::error!("workspace {name}: root: {e}");
            return 2;
        }
    }
    if let Err(e) = check_root_writable(&settings) {
        crate::error!("workspace {name}: {e}");
        return 2;
    }
    let walls = match sandbox::ProgramWalls::new(role, settings.rlimits()) {
        Ok(w) => w,
        Err(e) => {
            crate::error!("workspace {name}: the programs' walls: {e}");
            return 3;
        }
    };
    // Before confinement: the private temp dir and the stdin of every command.
    if let Err(e) = make_tmp_dir(&settings) {
        crate::error!(
            "workspace {name}: temp dir {}: {e}",
            settings.tmp_dir().display()
        );
        return 2;
    }
    let devnull = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        Ok(f) => OwnedFd::from(f),
        Err(e) => {
            crate::error!("workspace {name}: /dev/null: {e}");
            return 2;
        }
    };
    let grant = settings.grant();
    let host = match confine_and_attest(
        role,
        &name,
        &grant,
        settings.sandbox_mode,
        settings.agent.gateway_uid,
    ) {
        Ok(h) => h,
        Err(code) => return code,
    };
    let (report, probe_context, std_stream) = (host.report, host.probe_context, host.rpc);
    let root = match WorkspaceRoot::open(settings.root()) {
        Ok(r) => r,
        Err(e) => {
            crate::error!("workspace {name}: opening the root: {e}");
            return 2;
        }
    };
    if crate::workers::worker_main::say_ready(role, &report, &std_stream).is_err() {
        return 4;
    }
    let worker = Worker::new(settings, root, devnull, report, walls, probe_context);
    match worker.and_then(|w| w.serve(UnixStream::from_std(std_stream))) {
        Ok(()) => 0,
        Err(e) => {
            crate::error!("worker {role} ({name}): {e}");
            5
        }
    }
}

/// The worker must run as its agent user (real, effective and saved ids, no other group),
/// or, when the configuration allowed it, as toolwall's own user; never as root.
fn check_identity(settings: &WorkspaceWorkerSettings) -> Result<(), String> {
    check_agent_identity(&settings.agent)
}

/// The check of [`check_identity`] for any host of agent programs (a local server's too).
pub(crate) fn check_agent_identity(
    agent: &super::settings::AgentExpectation,
) -> Result<(), String> {
    let (mut r, mut e, mut s) = (0, 0, 0);
    let (mut gr, mut ge, mut gs) = (0, 0, 0);
    // SAFETY: out-pointers to local integers.
    unsafe {
        libc::getresuid(&mut r, &mut e, &mut s);
        libc::getresgid(&mut gr, &mut ge, &mut gs);
    }
    if [r, e, s].contains(&0) {
        return Err(
            "refusing to run agent programs as root: the gateway starts this worker as the agent user"
                .into(),
        );
    }
    match &agent.user {
        Some(user) => {
            if [r, e, s] != [user.uid; 3] || [gr, ge, gs] != [user.gid; 3] {
                return Err(format!(
                    "running as uid {r}/{e}/{s} gid {gr}/{ge}/{gs}, not as the agent user {user}"
                ));
            }
            // SAFETY: a zero-length query returns the count only.
            let groups = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
            let mut list = vec![0; groups.max(0) as usize];
            // SAFETY: a buffer of the size the kernel gave.
            let n = unsafe { libc::getgroups(list.len() as i32, list.as_mut_ptr()) };
            list.truncate(n.max(0) as usize);
            if list.iter().any(|g| *g != user.gid) {
                return Err(format!(
                    "supplementary groups {list:?} beyond the agent user's group {}",
                    user.gid
                ));
            }
        }
        None => {
            if r != agent.gateway_uid {
                return Err(format!(
                    "running as uid {r}, neither an agent user nor toolwall's uid {}",
                    agent.gateway_uid
                ));
            }
        }
    }
    Ok(())
}

/// The agent user must be able to work in the root: a clear error here beats every
/// command failing with `Permission denied`.
fn check_root_writable(settings: &WorkspaceWorkerSettings) -> Result<(), String> {
    let Some(c) = crate::sandbox::c_path(settings.root()) else {
        return Err("the root holds a NUL byte".into());
    };
    // SAFETY: a valid C string; access() checks with the real ids, which are ours.
    if unsafe { libc::access(c.as_ptr(), libc::R_OK | libc::W_OK | libc::X_OK) } != 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        let user = settings
            .agent
            .user
            .as_ref()
            .map_or_else(|| format!("uid {uid}"), |u| u.name.clone());
        return Err(format!(
            "root {}: the user agent programs run as ({user}, uid {uid}) cannot read, write and enter it ({e}); give it to that user: chown -R {user}: {}",
            settings.root().display(),
            settings.root().display()
        ));
    }
    Ok(())
}

fn make_tmp_dir(settings: &WorkspaceWorkerSettings) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let dir = settings.tmp_dir();
    match std::fs::symlink_metadata(&dir) {
        Ok(m) if m.is_dir() => {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
        }
        Ok(_) => Err(std::io::Error::other("exists and is not a directory")),
        Err(_) => std::fs::DirBuilder::new().mode(0o700).create(&dir),
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `tsk_` + 12 hex digits from the kernel's random pool.
fn new_task_id() -> String {
    let mut bytes = [0u8; 6];
    // SAFETY: a valid buffer of the size given.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        // Unique within this worker either way.
        let t = now_ms().to_be_bytes();
        bytes.copy_from_slice(&t[2..]);
    }
    let mut id = String::from("tsk_");
    for b in bytes {
        id.push_str(&format!("{b:02x}"));
    }
    id
}

/// A task's pipes, held by the loop while it runs.
struct TaskPipes {
    id: String,
    /// The task's own cgroup, removed once its leader is reaped.
    cgroup: Option<std::path::PathBuf>,
    leader: libc::pid_t,
    streams: [Option<OwnedFd>; 3],
    control: OwnedFd,
    status: Vec<u8>,
}

/// A file tool call for the pool.
struct Job {
    rpc: u64,
    name: String,
    args: Value,
}

/// Answers from the pool, waiting for the loop.
type Done = Arc<Mutex<Vec<(u64, Value)>>>;

/// What the pool threads share.
struct FileTools {
    root: WorkspaceRoot,
    settings: WorkspaceWorkerSettings,
}

impl FileTools {
    fn call(&self, name: &str, arguments: &Value) -> Result<Value, WsError> {
        let cfg = &self.settings.workspace;
        match name {
            tools::FILE_LIST => files::list(&self.root, cfg, &args::parse(name, arguments)?),
            tools::FILE_READ => files::read(&self.root, cfg, &args::parse(name, arguments)?),
            tools::FILE_WRITE => files::write(&self.root, cfg, &args::parse(name, arguments)?),
            tools::FILE_EDIT => files::edit(&self.root, cfg, &args::parse(name, arguments)?),
            tools::FILE_FIND => find::find(&self.root, cfg, &args::parse(name, arguments)?),
            tools::FILE_SEARCH => find::search(&self.root, cfg, &args::parse(name, arguments)?),
            other => Err(WsError::new(
                WsErrorCode::Internal,
                format!("{other} is not a file tool"),
            )),
        }
    }
}

struct Worker {
    settings: Arc<WorkspaceWorkerSettings>,
    /// What every task's leader applies to the programs it runs.
    walls: sandbox::ProgramWalls,
    /// What the attestation needs from before confinement, for re-runs.
    probe_context: sandbox::WorkspaceProbeContext,
    env: Vec<String>,
    devnull: OwnedFd,
    report: ConfinementReport,
    tasks: Tasks,
    slots: Vec<Option<TaskPipes>>,
    unreaped: Vec<(libc::pid_t, Option<std::path::PathBuf>)>,
    out: Vec<u8>,
    /// File tool calls at the pool, and those of them the gateway cancelled.
    calls: PoolCalls,
    jobs: SyncSender<Job>,
    done: Done,
    poll: Poll,
}

fn response(id: u64, ok: Option<String>, error: Option<RpcError>) -> Message {
    Message::Response {
        id,
        ok,
        error,
        facts: None,
    }
}

impl Worker {
    fn new(
        settings: WorkspaceWorkerSettings,
        root: WorkspaceRoot,
        devnull: OwnedFd,
        report: ConfinementReport,
        walls: sandbox::ProgramWalls,
        probe_context: sandbox::WorkspaceProbeContext,
    ) -> std::io::Result<Worker> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKE)?);
        let done: Done = Arc::new(Mutex::new(Vec::new()));
        let settings = Arc::new(settings);
        let shared = Arc::new(FileTools {
            root,
            settings: (*settings).clone(),
        });
        let calls = PoolCalls::default();
        let jobs = start_pool(&settings, &shared, &done, &waker, calls.shared())?;
        Ok(Worker {
            env: settings.task_env(),
            tasks: Tasks::new(settings.task_limits()),
            settings,
            walls,
            probe_context,
            devnull,
            report,
            slots: Vec::new(),
            unreaped: Vec::new(),
            out: Vec::new(),
            calls,
            jobs,
            done,
            poll,
        })
    }

    fn serve(mut self, mut stream: UnixStream) -> std::io::Result<()> {
        self.poll
            .registry()
            .register(&mut stream, RPC, WriteInterest::INITIAL)?;
        let mut write_interest = WriteInterest::default();
        let mut reader = RpcReader::default();
        let mut events = Events::with_capacity(128);
        loop {
            let timeout = self.next_timeout(Instant::now());
            match self.poll.poll(&mut events, timeout) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            let mut eof = false;
            for event in events.iter() {
                match event.token() {
                    RPC if event.is_readable() => eof |= reader.read_from(&mut stream)?,
                    RPC | WAKE => {}
                    Token(t) if t >= FIRST_TASK_TOKEN => {
                        let slot = (t - FIRST_TASK_TOKEN) / 3;
                        let which = (t - FIRST_TASK_TOKEN) % 3;
                        self.on_task_fd(slot, which, Instant::now());
                    }
                    _ => {}
                }
            }
            loop {
                match reader.next_message() {
                    Ok(Some(msg)) => self.on_message(msg),
                    Ok(None) => break,
                    Err(fault) => {
                        return Err(std::io::Error::other(format!("from the gateway: {fault}")));
                    }
                }
            }
            let finished =
                std::mem::take(&mut *self.done.lock().unwrap_or_else(|p| p.into_inner()));
            for (rpc, result) in finished {
                if self.calls.ended(rpc) {
                    // Word that it ended, not its answer: the gateway keeps the call's
                    // place in the file tools' lane until then.
                    push(
                        &mut self.out,
                        &crate::workers::worker_main::cancelled_end(rpc),
                    );
                    continue;
                }
                push(
                    &mut self.out,
                    &response(rpc, Some(result.to_string()), None),
                );
            }
            let now = Instant::now();
            self.tasks.on_timer(now);
            self.apply_actions();
            self.reap();
            flush(&mut stream, &mut self.out)?;
            write_interest.update(!self.out.is_empty(), |interest| {
                self.poll.registry().reregister(&mut stream, RPC, interest)
            })?;
            if eof {
                // The gateway closed its end: nothing more will be asked. Returning closes
                // every control pipe, and each task's leader then kills its task.
                return Ok(());
            }
        }
    }

    fn next_timeout(&self, now: Instant) -> Option<Duration> {
        let mut next = self
            .tasks
            .next_deadline()
            .map(|d| d.saturating_duration_since(now));
        if !self.unreaped.is_empty() {
            next = Some(next.map_or(REAP_RETRY, |n| n.min(REAP_RETRY)));
        }
        next
    }

    fn on_message(&mut self, msg: Message) {
        let Message::Request { id, op } = msg else {
            return;
        };
        let reply = match op {
            Op::List {
                kind: ListKind::Tools,
            } => Some(response(
                id,
                Some(Value::Array(tools::definitions()).to_string()),
                None,
            )),
            Op::List { .. } => Some(response(id, Some("[]".into()), None)),
            Op::Configure { .. } | Op::ListUpstream { .. } => Some(response(
                id,
                None,
                Some(RpcError {
                    kind: "invalid_request".into(),
                    message: "the workspace worker takes its settings on stdin only and reaches no upstream server".into(),
                }),
            )),
            Op::ReadResource { .. } | Op::GetPrompt { .. } | Op::Forward { .. } => Some(response(
                id,
                None,
                Some(RpcError {
                    kind: "not_found".into(),
                    message: "the workspace worker serves no resources or prompts".into(),
                }),
            )),
            // Answers to upstream requests are the aggregator's; none is owed.
            Op::Answer { .. } => None,
            Op::Cancel { target: t } => {
                // A waiting call stops waiting; its task goes on.
                self.tasks.forget(t);
                // Kept only while its file call is queued or running (a queued one is
                // skipped by the thread that takes it).
                self.calls.cancel(t, false);
                None
            }
            Op::Attest => {
                self.report.probes =
                    sandbox::attest_workspace(&self.settings.grant(), &self.probe_context);
                Some(response(
                    id,
                    Some(serde_json::to_string(&self.report).unwrap_or_default()),
                    None,
                ))
            }
            Op::CallTool { tool, args, .. } => self.call_tool(id, tool, Some(&args)),
        };
        if let Some(reply) = reply {
            push(&mut self.out, &reply);
        }
    }

    /// A tool call: answered now (`Some`), or later by a task or the pool (`None`).
    fn call_tool(&mut self, id: u64, name: String, arguments: Option<&str>) -> Option<Message> {
        let value = |result: Result<Value, WsError>| {
            let result = match result {
                Ok(v) => ok_result(v),
                Err(e) => e.to_result(),
            };
            Some(response(id, Some(result.to_string()), None))
        };
        if !tools::ALL.contains(&name.as_str()) {
            return Some(response(
                id,
                None,
                Some(RpcError {
                    kind: "unknown_tool".into(),
                    message: format!("no tool named {name}"),
                }),
            ));
        }
        let parsed: Value = match serde_json::from_str(arguments.unwrap_or("{}")) {
            Ok(v) => v,
            Err(e) => {
                return value(Err(WsError::invalid(format!(
                    "arguments are not JSON: {e}"
                ))));
            }
        };
        let arguments = unwrap_input(&parsed).clone();
        // The gateway routed the call here; a `worker` naming another workspace is a bug
        // or a forgery, and gets the same answer as an unknown one.
        if let Some(w) = arguments.get("worker").and_then(Value::as_str)
            && w != self.settings.id
            && w != self.settings.name
        {
            return value(Err(WsError::new(
                WsErrorCode::WorkerNotFound,
                format!("no workspace {w:?} here"),
            )));
        }
        let now = Instant::now();
        match name.as_str() {
            tools::WORKERS_LIST => value(Ok(json!({ "workers": [self.identity()] }))),
            tools::SYSTEM_INFO => value(Ok(self.system_info())),
            tools::SHELL_RUN => {
                let args: ShellArgs = match args::parse(&name, &arguments) {
                    Ok(a) => a,
                    Err(e) => return value(Err(e)),
                };
                let wait = self.wait_for(args.timeout);
                match self.start_task(&args.command, None, now) {
                    Ok(task) => match self.tasks.wait(id, &task, wait, WaitKind::ShellRun, now) {
                        Ok(()) => {
                            self.apply_actions();
                            None
                        }
                        Err(e) => value(Err(e)),
                    },
                    Err(e) => value(Err(e)),
                }
            }
            tools::SHELL_DISPATCH => {
                let args: ShellArgs = match args::parse(&name, &arguments) {
                    Ok(a) => a,
                    Err(e) => return value(Err(e)),
                };
                let runtime = args.timeout.map(Duration::from_secs_f64);
                value(self.start_task(&args.command, runtime, now).map(|task| {
                    json!({
                        "status": "running",
                        "task_id": task,
                        "hint": format!("Task {task} started. Use ws__task_wait to wait for it, ws__task_get to check on it, or ws__task_cancel to stop it."),
                        "next_actions": NEXT_ACTIONS,
                    })
                }))
            }
            tools::TASK_GET => value(
                args::parse::<TaskArgs>(&name, &arguments)
                    .and_then(|a| self.tasks.get(&a.task_id, now)),
            ),
            tools::TASK_LIST => value(
                args::parse::<args::WorkerOnly>(&name, &arguments).map(|_| self.tasks.list(now)),
            ),
            tools::TASK_WAIT | tools::TASK_CANCEL => {
                let args: TaskArgs = match args::parse(&name, &arguments) {
                    Ok(a) => a,
                    Err(e) => return value(Err(e)),
                };
                let outcome = if name == tools::TASK_WAIT {
                    let wait = self.wait_for(args.timeout);
                    self.tasks
                        .wait(id, &args.task_id, wait, WaitKind::TaskWait, now)
                } else {
                    self.tasks.cancel(id, &args.task_id, now)
                };
                match outcome {
                    Ok(()) => {
                        self.apply_actions();
                        None
                    }
                    Err(e) => value(Err(e)),
                }
            }
            _ => {
                let job = Job {
                    rpc: id,
                    name,
                    args: arguments,
                };
                match self.jobs.try_send(job) {
                    Ok(()) => {
                        self.calls.held(id);
                        None
                    }
                    Err(TrySendError::Full(_)) => value(Err(WsError::new(
                        WsErrorCode::Busy,
                        format!(
                            "the workspace's file tools are busy: {} threads and a queue of {} in use (threads, queue)",
                            self.settings.workspace.threads, self.settings.workspace.queue
                        ),
                    ))),
                    Err(TrySendError::Disconnected(_)) => value(Err(WsError::new(
                        WsErrorCode::Internal,
                        "the file tools' threads are gone",
                    ))),
                }
            }
        }
    }

    fn wait_for(&self, timeout: Option<f64>) -> Duration {
        let w = &self.settings.workspace;
        let max = w.max_wait_secs as f64;
        Duration::from_secs_f64(timeout.unwrap_or(w.default_timeout_secs as f64).min(max))
    }

    fn identity(&self) -> Value {
        json!({
            "id": self.settings.id,
            "name": self.settings.name,
            "root": self.settings.root(),
            "state": "online",
        })
    }

    fn system_info(&self) -> Value {
        let w = &self.settings.workspace;
        let network = match w.network.ports() {
            [] => json!(false),
            ports => json!(ports),
        };
        let workspace = json!({
            "id": self.settings.id,
            "name": self.settings.name,
            "root": self.settings.root(),
            "tmp_dir": self.settings.tmp_dir(),
            "tools": tools::ALL,
            "network": network,
            "read_only_paths": w.read_only_paths,
            "limits": {
                "max_tasks": w.max_tasks,
                "output_cap_bytes": w.output_cap_bytes,
                "task_max_runtime_secs": w.task_max_runtime_secs,
                "task_cpu_secs": w.task_cpu_secs,
                "task_max_processes": w.task_max_processes,
                "task_max_file_size_bytes": w.task_max_file_size_bytes,
                "max_wait_secs": w.max_wait_secs,
                "max_read_bytes": w.max_read_bytes,
                "max_write_bytes": w.max_write_bytes,
            },
            "tasks_held": self.tasks.len(),
        });
        let confinement = serde_json::to_value(&self.report).unwrap_or(Value::Null);
        system_info(workspace, confinement)
    }

    fn start_task(
        &mut self,
        command: &str,
        runtime: Option<Duration>,
        now: Instant,
    ) -> Result<String, WsError> {
        if command.trim().is_empty() {
            return Err(WsError::invalid("command is empty"));
        }
        self.tasks.admit(now)?;
        let mut spec = LaunchSpec::new(command, self.settings.root(), &self.env, &self.walls)
            .map_err(WsError::invalid)?;
        let id = new_task_id();
        let mut cgroup_dir = None;
        if let Some(cfg) = &self.settings.task_cgroups {
            match super::task_cgroup::make(cfg, &id) {
                Ok(c) => {
                    spec.cgroup_procs = Some(c.procs);
                    cgroup_dir = Some(c.dir);
                }
                // The workspace's cgroup still holds the task; said once per failure.
                Err(e) => crate::warn!(
                    "workspace {}: task {id} runs without a cgroup of its own: {e}",
                    self.settings.name
                ),
            }
        }
        let launched = launch(&spec, &self.devnull).map_err(|e| {
            if let Some(dir) = &cgroup_dir {
                super::task_cgroup::remove(dir);
            }
            WsError::new(WsErrorCode::IoError, format!("starting the command: {e}"))
        })?;
        drop(spec);
        self.tasks
            .insert(id.clone(), command.to_owned(), now, now_ms(), runtime);
        if let Err(e) = self.register(&id, launched, cgroup_dir) {
            crate::error!("workspace {}: task {id}: {e}", self.settings.name);
            self.tasks.on_exit(&id, Exit::Lost, now);
            for stream in [Stream::Stdout, Stream::Stderr] {
                self.tasks.on_stream_closed(&id, stream, now);
            }
        }
        let detail = json!({
            "workspace": self.settings.id,
            "task_id": id,
            "command": command,
        });
        push(
            &mut self.out,
            &Message::Event {
                kind: "task_started".into(),
                detail: detail.to_string(),
            },
        );
        Ok(id)
    }

    fn register(
        &mut self,
        id: &str,
        launched: Launched,
        cgroup: Option<std::path::PathBuf>,
    ) -> std::io::Result<()> {
        let slot = match self.slots.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        let Launched {
            leader,
            stdout,
            stderr,
            status,
            control,
        } = launched;
        let pipes = TaskPipes {
            id: id.to_owned(),
            cgroup,
            leader,
            streams: [Some(stdout), Some(stderr), Some(status)],
            control,
            status: Vec::with_capacity(8),
        };
        for (k, fd) in pipes.streams.iter().enumerate() {
            if let Some(fd) = fd {
                self.poll.registry().register(
                    &mut SourceFd(&fd.as_raw_fd()),
                    Token(FIRST_TASK_TOKEN + slot * 3 + k),
                    Interest::READABLE,
                )?;
            }
        }
        self.slots[slot] = Some(pipes);
        Ok(())
    }

    /// A task's pipe is readable (or closed).
    fn on_task_fd(&mut self, slot: usize, which: usize, now: Instant) {
        let Some(Some(pipes)) = self.slots.get_mut(slot) else {
            return;
        };
        let id = pipes.id.clone();
        let Some(fd) = pipes.streams[which].as_ref() else {
            return;
        };
        let raw = fd.as_raw_fd();
        let mut buf = [0u8; 64 * 1024];
        let mut closed = false;
        let mut status_bytes = Vec::new();
        loop {
            // SAFETY: reading into a valid buffer from our own fd.
            let n = unsafe { libc::read(raw, buf.as_mut_ptr().cast(), buf.len()) };
            if n > 0 {
                let bytes = &buf[..n as usize];
                match which {
                    0 => self.tasks.on_output(&id, Stream::Stdout, bytes),
                    1 => self.tasks.on_output(&id, Stream::Stderr, bytes),
                    _ => status_bytes.extend_from_slice(bytes),
                }
                continue;
            }
            if n == 0 {
                closed = true;
                break;
            }
            match std::io::Error::last_os_error().kind() {
                std::io::ErrorKind::Interrupted => continue,
                std::io::ErrorKind::WouldBlock => break,
                _ => {
                    closed = true;
                    break;
                }
            }
        }
        let Some(Some(pipes)) = self.slots.get_mut(slot) else {
            return;
        };
        if which == 2 {
            let had = pipes.status.len();
            pipes.status.extend_from_slice(&status_bytes);
            pipes.status.truncate(8);
            let status = pipes.status.clone();
            if had < 4 && status.len() >= 4 {
                let pid = i32::from_ne_bytes([status[0], status[1], status[2], status[3]]);
                self.tasks.set_pid(&id, pid);
            }
            if had < 8 && status.len() == 8 {
                let wait = i32::from_ne_bytes([status[4], status[5], status[6], status[7]]);
                self.tasks.on_exit(&id, Exit::from_wait_status(wait), now);
            } else if closed && status.len() < 8 {
                // The leader died without a word.
                self.tasks.on_exit(&id, Exit::Lost, now);
            }
        }
        if closed {
            if let Some(Some(pipes)) = self.slots.get_mut(slot)
                && let Some(fd) = pipes.streams[which].take()
            {
                let _ = self
                    .poll
                    .registry()
                    .deregister(&mut SourceFd(&fd.as_raw_fd()));
            }
            match which {
                0 => self.tasks.on_stream_closed(&id, Stream::Stdout, now),
                1 => self.tasks.on_stream_closed(&id, Stream::Stderr, now),
                _ => {}
            }
        }
        self.apply_actions();
    }

    fn slot_of(&self, task: &str) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.as_ref().is_some_and(|p| p.id == task))
    }

    fn signal(&mut self, task: &str, byte: u8) {
        if let Some(slot) = self.slot_of(task)
            && let Some(pipes) = &self.slots[slot]
        {
            // SAFETY: writing one byte to our own non-blocking pipe.
            unsafe { libc::write(pipes.control.as_raw_fd(), [byte].as_ptr().cast(), 1) };
        }
    }

    fn apply_actions(&mut self) {
        for action in self.tasks.take_actions() {
            match action {
                TaskAction::Terminate { task } => self.signal(&task, b'T'),
                TaskAction::Kill { task } => self.signal(&task, b'K'),
                TaskAction::Reply { rpc, result } => {
                    push(
                        &mut self.out,
                        &response(rpc, Some(result.to_string()), None),
                    );
                }
                TaskAction::Finished { task, summary } => {
                    if let Some(slot) = self.slot_of(&task)
                        && let Some(pipes) = self.slots[slot].take()
                    {
                        for fd in pipes.streams.iter().flatten() {
                            let _ = self
                                .poll
                                .registry()
                                .deregister(&mut SourceFd(&fd.as_raw_fd()));
                        }
                        self.unreaped.push((pipes.leader, pipes.cgroup));
                    }
                    let mut detail = summary;
                    detail["workspace"] = json!(self.settings.id);
                    push(
                        &mut self.out,
                        &Message::Event {
                            kind: "task_finished".into(),
                            detail: detail.to_string(),
                        },
                    );
                }
            }
        }
    }

    /// Collects leaders that exited.
    fn reap(&mut self) {
        self.unreaped.retain(|(pid, cgroup)| {
            let mut status = 0;
            // SAFETY: waiting for our own child without blocking.
            let r = unsafe { libc::waitpid(*pid, &mut status, libc::WNOHANG) };
            if r != 0
                && let Some(dir) = cgroup
            {
                super::task_cgroup::remove(dir);
            }
            r == 0
        });
    }
}

fn start_pool(
    settings: &WorkspaceWorkerSettings,
    tools: &Arc<FileTools>,
    done: &Done,
    waker: &Arc<Waker>,
    cancelled: CancelledCalls,
) -> std::io::Result<SyncSender<Job>> {
    let (tx, rx) = sync_channel::<Job>(settings.workspace.queue);
    let rx = Arc::new(Mutex::new(rx));
    for n in 0..settings.workspace.threads {
        let rx: Arc<Mutex<Receiver<Job>>> = Arc::clone(&rx);
        let done = Arc::clone(done);
        let waker = Arc::clone(waker);
        let tools = Arc::clone(tools);
        let cancelled = Arc::clone(&cancelled);
        std::thread::Builder::new()
            .name(format!("files-{n}"))
            .spawn(move || {
                loop {
                    let job = {
                        let guard = rx.lock().unwrap_or_else(|p| p.into_inner());
                        match guard.recv() {
                            Ok(job) => job,
                            Err(_) => return,
                        }
                    };
                    // Cancelled while it waited in the queue: it never runs (the loop
                    // sends word that it ended instead of this).
                    let result = if pool_calls::skips(&cancelled, job.rpc) {
                        Value::Null
                    } else {
                        match tools.call(&job.name, &job.args) {
                            Ok(v) => ok_result(v),
                            Err(e) => e.to_result(),
                        }
                    };
                    done.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((job.rpc, result));
                    let _ = waker.wake();
                }
            })?;
    }
    Ok(tx)
}
