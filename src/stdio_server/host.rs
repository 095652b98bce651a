//! `toolwall worker stdio-server`: the host of one local server.
//!
//! Started by the agent launcher as the server's agent user (or, when configured, as
//! toolwall's own user). In order: scrub fds, read the settings, check who it runs as,
//! make the private state directory, confine itself (Landlock: the system directories,
//! `read_paths`, its state directory and `write_paths`; the deny-list seccomp of
//! `sandbox-profiles/stdio-server.json`; no IP socket without `network`, no IP datagram socket with it), attest, say
//! `ready`. The gateway then sends `configure` (with the secret variables) only if the
//! attestation passed, and only then is the program started — under a leader that scopes
//! its signals, applies its rlimits and programs filter, and on the host's end stops
//! every process it started (see `crate::workspace::launch`). The host serves the same
//! RPC as the aggregator, for this one server, with the aggregator's client code
//! (`crate::aggregator::upstream`) over [`super::link::StdioLink`].

use mio::net::UnixStream;
use mio::{Events, Poll, Token, Waker};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::config::child_env;
use super::link::{LinkConfig, StdioLink};
use super::rpc_output::RpcOutput;
use super::settings::HostSettings;
use crate::aggregator::channel::Channel;
use crate::aggregator::setup::UpstreamSetup;
use crate::aggregator::upstream::EventSink;
use crate::aggregator::worker::{AggregatorRole, ChannelFactory, Outbox};
use crate::sandbox::{self, ConfinementReport, Role};
use crate::transport::write_interest::WriteInterest;
use crate::workers::agent_host_start::confine_and_attest;
use crate::workers::rpc::{Message, Op, RpcReader};
use crate::workers::worker_main::{read_settings, say_ready};

const RPC: Token = Token(0);
const WAKE: Token = Token(1);

/// Run the host; returns the process exit code.
pub fn run() -> i32 {
    let role = Role::StdioServer;
    if let Err(e) = sandbox::scrub_inherited_fds() {
        crate::error!("worker {role}: cannot close inherited fds: {e}");
        return 3;
    }
    let settings: HostSettings = match read_settings() {
        Ok(s) => s,
        Err(e) => {
            crate::error!("worker {role}: bad or missing settings on stdin: {e}");
            return 2;
        }
    };
    let name = settings.name.clone();
    if let Err(e) = crate::workspace::worker::check_agent_identity(&settings.agent)
        && settings.sandbox_mode == sandbox::SandboxMode::Enforce
    {
        crate::error!("server {name}: {e}");
        return 3;
    }
    if let Err(e) = make_state_dir(&settings) {
        crate::error!("server {name}: {e}");
        return 2;
    }
    // SAFETY: getuid cannot fail.
    if let Err(e) = super::state_dir::secure(&settings.state_dir, unsafe { libc::getuid() }) {
        crate::error!("server {name}: {e}");
        return 2;
    }
    let walls = match sandbox::ProgramWalls::new(role, settings.rlimits()) {
        Ok(w) => w,
        Err(e) => {
            crate::error!("server {name}: the program's walls: {e}");
            return 3;
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
    if say_ready(role, &report, &std_stream).is_err() {
        return 4;
    }
    match serve(settings, walls, report, probe_context, std_stream) {
        Ok(()) => 0,
        Err(e) => {
            crate::error!("worker {role} ({name}): {e}");
            5
        }
    }
}

/// The private state directory (and its temp dir), ours alone: created when missing,
/// refused when it is not a directory this user owns.
fn make_state_dir(s: &HostSettings) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    for dir in [s.state_dir.clone(), s.tmp_dir()] {
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() && m.uid() == uid => {
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
                    .map_err(|e| format!("state directory {}: {e}", dir.display()))?;
            }
            Ok(m) if m.is_dir() => {
                return Err(format!(
                    "state directory {} belongs to uid {}, not to the user the server runs as (uid {uid}); chown it to that user or remove it",
                    dir.display(),
                    m.uid()
                ));
            }
            Ok(_) => {
                return Err(format!(
                    "state directory {} exists and is not a directory",
                    dir.display()
                ));
            }
            Err(_) => std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&dir)
                .map_err(|e| {
                    format!(
                        "cannot create the state directory {} as uid {uid}: {e}; its parent must be writable by that user ([servers] state_dir)",
                        dir.display()
                    )
                })?,
        }
    }
    Ok(())
}

/// `program` found the way `execvp` would: a name with a `/` as it is (relative to the
/// working directory), else the first executable file of that name on `PATH`.
pub fn resolve_program(program: &str, path_var: &str, cwd: &Path) -> Result<PathBuf, String> {
    let executable = |p: &Path| {
        let Some(c) = sandbox::c_path(p) else {
            return false;
        };
        // SAFETY: a valid C string.
        p.is_file() && unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0
    };
    if program.contains('/') {
        let p = if Path::new(program).is_absolute() {
            PathBuf::from(program)
        } else {
            cwd.join(program)
        };
        return if executable(&p) {
            Ok(p)
        } else {
            Err(format!(
                "{program} is not an executable file it may run (a program outside /usr, /bin and /lib needs its directory in read_paths)"
            ))
        };
    }
    for dir in path_var.split(':') {
        let dir = if dir.is_empty() {
            cwd.to_path_buf()
        } else {
            PathBuf::from(dir)
        };
        let candidate = dir.join(program);
        if executable(&candidate) {
            return Ok(candidate);
        }
    }
    Err(format!(
        "{program} was not found on PATH ({path_var}), or not where it may run from: a runtime outside /usr, /bin and /lib needs its directory in read_paths (and PATH in env)"
    ))
}

/// The channel to the server, made when the gateway's `configure` brings the secrets.
fn channel_factory(
    settings: Arc<HostSettings>,
    walls: Arc<Mutex<Option<sandbox::ProgramWalls>>>,
) -> ChannelFactory {
    Arc::new(move |setup: &UpstreamSetup, events: EventSink| {
        let walls = walls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| "the server's channel exists already".to_string())?;
        let s = &settings;
        let cwd = s.cwd();
        let env: Vec<String> = child_env(&s.env, &s.state_dir, &setup.secret_env, &s.network)
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let secrets = setup
            .secret_env
            .iter()
            .map(|(k, v)| (k.clone(), v.expose().to_owned()))
            .collect();
        let cfg = LinkConfig {
            server: s.name.clone(),
            argv: s.command.clone(),
            path: s.path_var(),
            cwd,
            env,
            secrets,
            timeout: Duration::from_secs(s.timeout_secs),
            start_timeout: Duration::from_secs(s.start_timeout_secs),
            discover_timeout: Duration::from_millis(s.discover_timeout_ms),
            stop_grace: Duration::from_millis(s.stop_grace_ms),
            max_line: s.max_body_bytes,
            stderr_lines_per_sec: s.stderr_lines_per_sec,
        };
        Ok(Channel::Lines(Arc::new(StdioLink::new(cfg, walls, events))))
    })
}

fn serve(
    settings: HostSettings,
    walls: sandbox::ProgramWalls,
    mut report: ConfinementReport,
    probe_context: sandbox::WorkspaceProbeContext,
    std_stream: std::os::unix::net::UnixStream,
) -> std::io::Result<()> {
    // Written by the loop and by the pool threads that answer (see `rpc_output.rs`); the
    // mio handle only reads.
    let output = RpcOutput::new(std_stream.try_clone()?);
    let mut stream = UnixStream::from_std(std_stream);
    let mut poll = Poll::new()?;
    poll.registry()
        .register(&mut stream, RPC, WriteInterest::INITIAL)?;
    let mut write_interest = WriteInterest::default();
    let waker = Arc::new(Waker::new(poll.registry(), WAKE)?);
    let done: Outbox = Arc::new(Mutex::new(Vec::new()));
    let grant = settings.grant();
    let settings = Arc::new(settings);
    let walls = Arc::new(Mutex::new(Some(walls)));
    let mut upstream = AggregatorRole::with_channels(
        Arc::clone(&done),
        Arc::clone(&waker),
        channel_factory(Arc::clone(&settings), walls),
    );
    upstream.answer_directly(RpcOutput::direct(&output, &done, &waker));
    let mut reader = RpcReader::default();
    let mut replies: Vec<Message> = Vec::new();
    let mut events = Events::with_capacity(64);
    let mut buf_eof = false;
    loop {
        poll.poll(&mut events, None)?;
        for event in events.iter() {
            if event.token() == RPC && event.is_readable() {
                buf_eof |= reader.read_from(&mut stream)?;
            }
        }
        loop {
            match reader.next_message() {
                Ok(Some(Message::Request {
                    op: Op::Cancel { target },
                    ..
                })) => {
                    // Marked before the call's thread can answer: its late answer is
                    // dropped (`RpcOutput::queue`). The link is cancelled (a legacy
                    // server is told; a queued call never starts). A call no longer
                    // held here was answered already: its mark is forgotten, so the set
                    // holds at most the calls queued or running (`servers.threads` +
                    // `servers.queue`).
                    RpcOutput::lock(&output).cancel(target);
                    if !upstream.cancel(target) {
                        RpcOutput::lock(&output).forget(target);
                    }
                }
                Ok(Some(Message::Request { id, op: Op::Attest })) => {
                    report.probes = sandbox::attest_workspace(&grant, &probe_context);
                    replies.push(Message::Response {
                        id,
                        ok: Some(serde_json::to_string(&report).unwrap_or_default()),
                        error: None,
                        facts: None,
                    });
                }
                Ok(Some(Message::Request {
                    op: Op::Answer { call, answer },
                    ..
                })) => upstream.answer(call, answer),
                Ok(Some(Message::Request { id, op })) => {
                    if let Some(reply) = upstream.handle(id, op) {
                        replies.push(reply);
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(fault) => {
                    return Err(std::io::Error::other(format!("from the gateway: {fault}")));
                }
            }
        }
        let left = {
            let mut o = RpcOutput::lock(&output);
            o.queue_outbox(&done);
            for reply in replies.drain(..) {
                o.queue(&reply);
            }
            o.flush()?
        };
        write_interest.update(left, |interest| {
            poll.registry().reregister(&mut stream, RPC, interest)
        })?;
        if buf_eof {
            // The gateway closed its end: the host ends, and its leader stops the program
            // (SIGTERM, then SIGKILL after stop_grace_ms).
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_found_like_execvp() {
        let dir = tempfile::tempdir().unwrap();
        let sh = resolve_program("sh", "/nonexistent:/bin:/usr/bin", dir.path()).unwrap();
        assert!(sh.ends_with("sh"));
        assert!(resolve_program("/bin/sh", "", dir.path()).is_ok());
        let err = resolve_program("surely-no-such-program-here", "/bin", dir.path()).unwrap_err();
        assert!(err.contains("read_paths"), "{err}");
        // Not executable: not found.
        let f = dir.path().join("data");
        std::fs::write(&f, "x").unwrap();
        assert!(resolve_program("./data", "", dir.path()).is_err());
    }
}
