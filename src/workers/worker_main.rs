//! `toolwall worker ROLE`: the process that runs tool code.
//!
//! Order matters: drop inherited fds, confine (Landlock + seccomp) while still single-
//! threaded, probe the confinement, say `ready` with the report, and only then start the
//! thread pool and the RPC loop. Zero-I/O tools (echo) answer on the loop thread; blocking
//! ones go to a bounded pool, whose answers come back through a waker.

use mio::net::UnixStream;
use mio::{Events, Poll, Token, Waker};
use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};

use crate::aggregator::worker::AggregatorRole;
use crate::sandbox::{self, Role};
use crate::tools;
use crate::transport::write_interest::WriteInterest;
use crate::workers::pool_calls::{self, CancelledCalls, PoolCalls};
use crate::workers::rpc::{self, ListKind, Message, Op, RpcError, RpcReader};
use crate::workers::settings::WorkerSettings;

/// The RPC socket's fd in a worker.
pub const RPC_FD: i32 = 3;
/// Largest settings document a worker reads from stdin.
pub const MAX_SETTINGS_BYTES: usize = 1024 * 1024;

const RPC: Token = Token(0);
const WAKE: Token = Token(1);

struct Job {
    id: u64,
    name: String,
    args: String,
}

/// Answers from pool threads waiting for the loop.
type Done = Arc<Mutex<Vec<Message>>>;

/// Run a worker; returns the process exit code.
pub fn run(role: Role) -> i32 {
    if role == Role::Workspace {
        // Its own settings, attestation and loop (it runs programs as tasks).
        return crate::workspace::worker::run();
    }
    if role == Role::StdioServer {
        // Its own settings and attestation; it runs one local server's program.
        return crate::stdio_server::host::run();
    }
    if let Err(e) = sandbox::scrub_inherited_fds() {
        crate::error!("worker {role}: cannot close inherited fds: {e}");
        return 3;
    }
    let settings: WorkerSettings = match read_settings() {
        Ok(s) => s,
        Err(e) => {
            crate::error!("worker {role}: bad or missing settings on stdin: {e}");
            return 2;
        }
    };
    let grant = settings.grant();
    let mut report = match sandbox::confine(role, &grant, settings.sandbox_mode) {
        Ok(r) => r,
        Err(e) => {
            crate::error!("worker {role}: confinement failed: {e:?}");
            return 3;
        }
    };
    report.probes = sandbox::attest(&grant);
    // SAFETY: fd 3 is the RPC socket the gateway placed there; nothing else owns it.
    let std_stream = unsafe { std::os::unix::net::UnixStream::from_raw_fd(RPC_FD) };
    if say_ready(role, &report, &std_stream).is_err() {
        return 4;
    }
    match serve(role, settings, report, UnixStream::from_std(std_stream)) {
        Ok(()) => 0,
        Err(e) => {
            crate::error!("worker {role}: {e}");
            5
        }
    }
}

/// The worker's first words on the RPC channel: who it is and the proof of its
/// confinement, written whole while the socket is still blocking; then it goes
/// non-blocking for the loop.
pub(crate) fn say_ready(
    role: Role,
    report: &sandbox::ConfinementReport,
    stream: &std::os::unix::net::UnixStream,
) -> std::io::Result<()> {
    let mut hello = Vec::new();
    let ready = Message::Ready {
        role: role.to_string(),
        pid: std::process::id(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        confinement: report.clone(),
    };
    rpc::encode(&mut hello, &ready).map_err(|e| std::io::Error::other(e.to_string()))?;
    let mut writer = stream;
    writer.write_all(&hello)?;
    stream.set_nonblocking(true)
}

/// The settings the gateway wrote into our stdin pipe (JSON, no secrets), read to EOF
/// before confinement.
pub(crate) fn read_settings<T: serde::de::DeserializeOwned>() -> Result<T, String> {
    let mut text = Vec::new();
    std::io::stdin()
        .lock()
        .take(MAX_SETTINGS_BYTES as u64 + 1)
        .read_to_end(&mut text)
        .map_err(|e| e.to_string())?;
    if text.len() > MAX_SETTINGS_BYTES {
        return Err(format!("more than {MAX_SETTINGS_BYTES} bytes"));
    }
    serde_json::from_slice(&text).map_err(|e| e.to_string())
}

fn serve(
    role: Role,
    settings: WorkerSettings,
    report: sandbox::ConfinementReport,
    mut stream: UnixStream,
) -> std::io::Result<()> {
    let mut poll = Poll::new()?;
    poll.registry()
        .register(&mut stream, RPC, WriteInterest::INITIAL)?;
    let mut write_interest = WriteInterest::default();
    let waker = Arc::new(Waker::new(poll.registry(), WAKE)?);
    let done: Done = Arc::new(Mutex::new(Vec::new()));
    let settings = Arc::new(settings);
    // The aggregator starts its threads per upstream server when it is configured; the
    // builtin's pool starts now.
    let mut aggregator = (role == Role::Aggregator)
        .then(|| AggregatorRole::new(Arc::clone(&done), Arc::clone(&waker)));
    // Calls at the pool (or the aggregator's), and those the gateway cancelled.
    let mut calls = PoolCalls::default();
    let jobs = if aggregator.is_some() {
        sync_channel::<Job>(0).0
    } else {
        start_pool(&settings, &done, &waker, calls.shared())?
    };

    let mut reader = RpcReader::default();
    let mut out: Vec<u8> = Vec::new();
    let mut events = Events::with_capacity(64);
    let mut report = report;
    loop {
        poll.poll(&mut events, None)?;
        let mut eof = false;
        for event in events.iter() {
            if event.token() == RPC && event.is_readable() {
                eof |= reader.read_from(&mut stream)?;
            }
        }
        loop {
            match reader.next_message() {
                Ok(Some(Message::Request { id, op }))
                    if aggregator.is_some() && aggregator_op(&op) =>
                {
                    if let Some(reply) = aggregator.as_mut().and_then(|a| a.handle(id, op)) {
                        push(&mut out, &reply);
                    }
                }
                Ok(Some(Message::Request {
                    op: Op::Answer { call, answer },
                    ..
                })) => {
                    if let Some(a) = aggregator.as_ref() {
                        a.answer(call, answer);
                    }
                }
                Ok(Some(msg)) if aggregator.is_some() && cancel_target(&msg).is_some() => {
                    // The aggregator closes the call's upstream connection (and tells a
                    // legacy upstream); its response is replaced by word that it ended,
                    // if the aggregator still holds the call (else it was answered).
                    if let (Some(a), Some(t)) = (aggregator.as_ref(), cancel_target(&msg)) {
                        let held = a.cancel(t);
                        calls.cancel(t, held);
                    }
                }
                Ok(Some(msg)) => handle(
                    role,
                    &settings,
                    msg,
                    &jobs,
                    &mut out,
                    &mut calls,
                    &mut report,
                ),
                Ok(None) => break,
                Err(fault) => {
                    return Err(std::io::Error::other(format!("from the gateway: {fault}")));
                }
            }
        }
        let finished = std::mem::take(&mut *done.lock().unwrap_or_else(|p| p.into_inner()));
        for msg in finished {
            if let Message::Response { id, .. } = &msg
                && calls.ended(*id)
            {
                // Not its answer (the call is over), but word that it ended: the gateway
                // keeps the call's pool slot until then (`fair_lanes.rs`).
                push(&mut out, &cancelled_end(*id));
                continue;
            }
            push(&mut out, &msg);
        }
        flush(&mut stream, &mut out)?;
        write_interest.update(!out.is_empty(), |interest| {
            poll.registry().reregister(&mut stream, RPC, interest)
        })?;
        if eof {
            // The gateway closed its end: nothing more will be asked.
            return Ok(());
        }
    }
}

/// Ops the aggregator role serves itself; cancel and attest stay with the common handler
/// (a cancel reaches the aggregator too), answers go to [`AggregatorRole::answer`].
fn aggregator_op(op: &Op) -> bool {
    !matches!(
        op,
        Op::Cancel { .. } | Op::Attest | Op::Answer { .. } | Op::List { .. }
    )
}

/// What a worker sends when a cancelled call's thread ends, instead of its answer.
pub(crate) fn cancelled_end(id: u64) -> Message {
    Message::Response {
        id,
        ok: None,
        error: Some(RpcError {
            kind: "cancelled".into(),
            message: "the call was cancelled".into(),
        }),
        facts: None,
    }
}

fn cancel_target(msg: &Message) -> Option<u64> {
    match msg {
        Message::Request {
            op: Op::Cancel { target },
            ..
        } => Some(*target),
        _ => None,
    }
}

pub(crate) fn push(out: &mut Vec<u8>, msg: &Message) {
    if let Err(fault) = rpc::encode(out, msg)
        && let Message::Response { id, .. } = msg
    {
        let error = Message::Response {
            id: *id,
            ok: None,
            error: Some(RpcError {
                kind: "too_large".into(),
                message: fault.to_string(),
            }),
            facts: None,
        };
        let _ = rpc::encode(out, &error);
    }
}

pub(crate) fn flush(stream: &mut impl Write, out: &mut Vec<u8>) -> std::io::Result<()> {
    let mut written = 0;
    while written < out.len() {
        match stream.write(&out[written..]) {
            Ok(0) => return Err(std::io::Error::other("rpc socket closed")),
            Ok(n) => written += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    out.drain(..written);
    Ok(())
}

fn response_ok(id: u64, ok: String, facts: Option<String>) -> Message {
    Message::Response {
        id,
        ok: Some(ok),
        error: None,
        facts,
    }
}

fn response_err(id: u64, kind: &str, message: String) -> Message {
    Message::Response {
        id,
        ok: None,
        error: Some(RpcError {
            kind: kind.to_owned(),
            message,
        }),
        facts: None,
    }
}

fn tool_list(role: Role) -> String {
    let mut tools = Vec::new();
    if role == Role::Builtin {
        tools.push(tools::echo::definition());
        tools.extend(tools::http::tool_definitions());
    }
    serde_json::Value::Array(tools).to_string()
}

#[allow(clippy::too_many_arguments)]
fn handle(
    role: Role,
    settings: &WorkerSettings,
    msg: Message,
    jobs: &SyncSender<Job>,
    out: &mut Vec<u8>,
    calls: &mut PoolCalls,
    report: &mut sandbox::ConfinementReport,
) {
    let Message::Request { id, op } = msg else {
        return;
    };
    let reply = match op {
        Op::List {
            kind: ListKind::Tools,
        } => response_ok(id, tool_list(role), None),
        Op::List { .. } => response_ok(id, "[]".into(), None),
        Op::ListUpstream { .. } => response_err(
            id,
            "not_found",
            format!("the {role} worker reaches no upstream server"),
        ),
        Op::ReadResource { .. } | Op::GetPrompt { .. } | Op::Forward { .. } => response_err(
            id,
            "not_found",
            format!("the {role} worker serves no resources or prompts"),
        ),
        Op::Configure { .. } => response_err(
            id,
            "invalid_request",
            format!("the {role} worker takes no configuration"),
        ),
        // Only the aggregator relays upstream requests; no response is owed.
        Op::Answer { .. } => return,
        Op::Cancel { target } => {
            // Kept only for a call the pool still holds (a cancel that crossed its answer
            // is forgotten); a queued one is skipped by the thread that takes it.
            calls.cancel(target, false);
            return;
        }
        Op::Attest => {
            report.probes = sandbox::attest(&settings.grant());
            response_ok(id, serde_json::to_string(report).unwrap_or_default(), None)
        }
        Op::CallTool {
            tool: name, args, ..
        } => {
            if name == tools::echo::NAME {
                response_ok(id, tools::echo::call(&args), None)
            } else {
                match jobs.try_send(Job { id, name, args }) {
                    Ok(()) => {
                        calls.held(id);
                        return;
                    }
                    Err(TrySendError::Full(_)) => response_err(
                        id,
                        "busy",
                        format!(
                            "the {role} worker is busy: {} threads and a queue of {} are in use (builtin.threads, builtin.queue)",
                            settings.threads, settings.queue
                        ),
                    ),
                    Err(TrySendError::Disconnected(_)) => {
                        response_err(id, "internal", "the worker's pool is gone".into())
                    }
                }
            }
        }
    };
    push(out, &reply);
}

fn start_pool(
    settings: &Arc<WorkerSettings>,
    done: &Done,
    waker: &Arc<Waker>,
    cancelled: CancelledCalls,
) -> std::io::Result<SyncSender<Job>> {
    let (tx, rx) = sync_channel::<Job>(settings.queue);
    let rx = Arc::new(Mutex::new(rx));
    for n in 0..settings.threads {
        let rx: Arc<Mutex<Receiver<Job>>> = Arc::clone(&rx);
        let done = Arc::clone(done);
        let waker = Arc::clone(waker);
        let settings = Arc::clone(settings);
        let cancelled = Arc::clone(&cancelled);
        std::thread::Builder::new()
            .name(format!("tool-{n}"))
            .spawn(move || {
                loop {
                    let job = {
                        let guard = rx.lock().unwrap_or_else(|p| p.into_inner());
                        match guard.recv() {
                            Ok(job) => job,
                            Err(_) => return,
                        }
                    };
                    // Cancelled while it waited in the queue: it never runs.
                    let msg = if pool_calls::skips(&cancelled, job.id) {
                        cancelled_end(job.id)
                    } else {
                        run_job(&settings, job)
                    };
                    done.lock().unwrap_or_else(|p| p.into_inner()).push(msg);
                    let _ = waker.wake();
                }
            })?;
    }
    Ok(tx)
}

fn run_job(settings: &WorkerSettings, job: Job) -> Message {
    let args: serde_json::Value = match serde_json::from_str(&job.args) {
        Ok(v) => v,
        Err(e) => {
            return response_err(
                job.id,
                "invalid_arguments",
                format!("arguments are not JSON: {e}"),
            );
        }
    };
    let http_tools = [
        tools::http::FETCH_HTTP,
        tools::http::GREP_HTTP,
        tools::http::HTTP_HEADERS,
    ];
    if !http_tools.contains(&job.name.as_str()) {
        return response_err(
            job.id,
            "unknown_tool",
            format!("no tool named {}", job.name),
        );
    }
    let outcome = tools::http::call_tool(&job.name, &args, &settings.http);
    let facts = serde_json::to_string(&outcome.facts).ok();
    response_ok(job.id, outcome.result.to_string(), facts)
}
