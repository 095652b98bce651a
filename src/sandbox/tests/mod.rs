//! Tests of the sandbox in real child processes (see `child.rs`) and of the profiles.

mod child;
mod profiles;
mod verdict;

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use super::{
    Role, RoleGrant, SandboxConfig, SandboxMode, child_pre_exec, observe_process,
    role_grant_defaults,
};

/// Selects the child routine when the test executable is re-run.
const CHILD_ROUTINE_ENV: &str = "TOOLWALL_SANDBOX_TEST_CHILD";
/// Prefix of the parameters passed to a child routine.
const CHILD_PARAM_PREFIX: &str = "TOOLWALL_SANDBOX_TEST_";
/// A name no hosts file lists, so looking it up goes to the nameserver.
const UNLISTED_NAME: &str = "toolwall-sandbox-test.invalid";
/// Bound on waiting for a child's message, so a broken child fails the test, never hangs it.
const CHILD_MESSAGE_WAIT: Duration = Duration::from_secs(120);
/// Where the pre-exec test plants a leaked fd in the child.
const LEAKED_FD: i32 = 100;

fn env_param(name: &str) -> Result<String, String> {
    std::env::var(format!("{CHILD_PARAM_PREFIX}{name}")).map_err(|e| format!("{name}: {e}"))
}

/// A child started as the gateway starts a worker: env cleared, RPC socket at fd 3.
struct ChildProcess {
    child: Child,
    rpc: UnixStream,
    env_names: Vec<String>,
}

impl ChildProcess {
    fn spawn(routine: &str, params: &[(&str, String)], cfg: &SandboxConfig) -> ChildProcess {
        Self::spawn_with(routine, params, cfg, None)
    }

    /// `leak_fd`: an fd duplicated without close-on-exec into the child as fd
    /// [`LEAKED_FD`], standing for whatever a gateway might leak.
    fn spawn_with(
        routine: &str,
        params: &[(&str, String)],
        cfg: &SandboxConfig,
        leak_fd: Option<i32>,
    ) -> ChildProcess {
        let (ours, theirs) = UnixStream::pair().expect("socketpair");
        let mut cmd = Command::new(std::env::current_exe().expect("current exe"));
        cmd.env_clear()
            .env(CHILD_ROUTINE_ENV, routine)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let mut env_names = vec![CHILD_ROUTINE_ENV.to_string()];
        for (name, value) in params {
            let key = format!("{CHILD_PARAM_PREFIX}{name}");
            cmd.env(&key, value);
            env_names.push(key);
        }
        env_names.sort();
        // SAFETY: both closures make only async-signal-safe system calls.
        unsafe {
            if let Some(src) = leak_fd {
                cmd.pre_exec(move || {
                    let rc = if src == LEAKED_FD {
                        libc::fcntl(LEAKED_FD, libc::F_SETFD, 0)
                    } else {
                        libc::dup2(src, LEAKED_FD)
                    };
                    if rc < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            cmd.pre_exec(child_pre_exec(theirs.as_raw_fd(), cfg));
        }
        let child = cmd.spawn().expect("spawn child");
        drop(theirs);
        ours.set_read_timeout(Some(CHILD_MESSAGE_WAIT))
            .expect("read timeout");
        ChildProcess {
            child,
            rpc: ours,
            env_names,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn message(&mut self) -> Value {
        let mut line = String::new();
        BufReader::new(&self.rpc)
            .read_line(&mut line)
            .expect("child message");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("child sent {line:?}: {e}"))
    }

    /// Tells the child it may exit and checks that it did so cleanly.
    fn finish(mut self) {
        let _ = self.rpc.write_all(b"exit\n");
        let status = self.child.wait().expect("wait child");
        assert!(status.success(), "child exited with {status}");
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A tiny HTTP/1.1 server answering every request with `hello`, on its own thread.
fn http_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind http");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
                match stream.read(&mut byte) {
                    Ok(1) => head.push(byte[0]),
                    _ => break,
                }
            }
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
            );
        }
    });
    port
}

/// A server that records the first byte a client sends (0x16 opens a TLS handshake) and
/// answers with plain text, which ends the handshake with an error.
fn tls_first_byte_server() -> (u16, mpsc::Receiver<u8>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind tls");
    let port = listener.local_addr().expect("addr").port();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
            let mut first = [0u8; 1];
            if stream.read_exact(&mut first).is_ok() {
                let _ = tx.send(first[0]);
            }
            let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\nnot tls\n");
        }
    });
    (port, rx)
}

fn grant_for(role: Role, ports: &[u16], probe_dir: &std::path::Path) -> RoleGrant {
    let mut grant = role_grant_defaults(role);
    grant.tcp_connect_ports.extend_from_slice(ports);
    grant.forbidden_probe_dir = probe_dir.to_path_buf();
    grant
}

fn lookup_here(host: &str) -> Result<Vec<String>, String> {
    (host, 80)
        .to_socket_addrs()
        .map(|addrs| {
            let mut v: Vec<String> = addrs.map(|a| a.to_string()).collect();
            v.sort();
            v.dedup();
            v
        })
        .map_err(|e| e.to_string())
}

/// getaddrinfo with AI_ADDRCONFIG and no socket type: glibc then asks netlink which
/// address families are configured (the sandbox refuses AF_NETLINK) and sorts several
/// results. Returns the number of results, or the error code.
fn lookup_with_addrconfig(host: &str) -> Result<usize, i32> {
    let name = std::ffi::CString::new(host).map_err(|_| libc::EAI_NONAME)?;
    // SAFETY: zeroed hints are valid; the result list is freed below.
    unsafe {
        let mut hints: libc::addrinfo = std::mem::zeroed();
        hints.ai_flags = libc::AI_ADDRCONFIG;
        hints.ai_family = libc::AF_UNSPEC;
        let mut res: *mut libc::addrinfo = std::ptr::null_mut();
        let rc = libc::getaddrinfo(name.as_ptr(), std::ptr::null(), &hints, &mut res);
        if rc != 0 {
            return Err(rc);
        }
        let mut count = 0;
        let mut cur = res;
        while !cur.is_null() {
            count += 1;
            cur = (*cur).ai_next;
        }
        libc::freeaddrinfo(res);
        Ok(count)
    }
}

/// Runs one confined worker of `role` and checks it from inside (report, workload) and
/// outside (/proc).
fn run_confined_worker(role: Role) {
    run_confined_worker_in(role, SandboxMode::Enforce);
}

fn run_confined_worker_in(role: Role, mode: SandboxMode) {
    let http_port = http_server();
    let (tls_port, tls_first_bytes) = tls_first_byte_server();
    // Listening, but not granted: a refusal can only come from the sandbox.
    let ungranted = TcpListener::bind("127.0.0.1:0").expect("bind ungranted");
    let ungranted_port = ungranted.local_addr().expect("addr").port();
    let probe_dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(probe_dir.path().join("ledger.sqlite"), b"secret").expect("ledger file");
    let grant = grant_for(role, &[http_port, tls_port], probe_dir.path());

    let mut child = ChildProcess::spawn(
        "confined_worker",
        &[
            ("ROLE", role.to_string()),
            ("MODE", mode.to_string()),
            ("GRANT", serde_json::to_string(&grant).expect("grant json")),
            ("HTTP_PORT", http_port.to_string()),
            ("TLS_PORT", tls_port.to_string()),
            ("DENIED_PORT", ungranted_port.to_string()),
        ],
        &SandboxConfig::default(),
    );
    let message = child.message();
    assert!(message.get("error").is_none(), "child failed: {message}");

    // From outside, while the child waits (its work is done: nothing may be left open).
    let seen = observe_process(child.pid()).expect("observe child");
    assert_eq!(seen.seccomp_mode, Some(2), "Seccomp in /proc status");
    assert_eq!(seen.no_new_privs, Some(true), "NoNewPrivs in /proc status");
    assert_eq!(seen.open_fds, vec![0, 1, 2, 3], "open fds of the worker");
    let mut env_names = seen.environment_names.clone();
    env_names.sort();
    assert_eq!(env_names, child.env_names, "worker environment");

    let report: super::ConfinementReport =
        serde_json::from_value(message["report"].clone()).expect("report");
    for probe in &report.probes {
        assert!(
            probe.denied,
            "probe {} not denied: {}",
            probe.name, probe.detail
        );
    }
    assert_eq!(report.role, role.to_string());
    assert_eq!(report.mode, mode.to_string());
    assert!(report.notes.is_empty(), "{:?}", report.notes);
    assert!(
        report.landlock_abi >= 6,
        "landlock ABI {}",
        report.landlock_abi
    );
    assert_eq!(report.landlock, "fully_enforced");
    assert!(report.seccomp && report.no_new_privs && report.capabilities_cleared);
    assert_eq!(report.verdict(SandboxMode::Enforce), Ok(Vec::new()));
    assert_eq!(report.verdict(SandboxMode::Warn), Ok(Vec::new()));
    let detail = |name: &str| {
        report
            .probes
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.detail.clone())
            .unwrap_or_default()
    };
    // The layer each refusal comes from. The aggregator may not even open a file.
    let read_refusal = match role {
        Role::Builtin => "EACCES",
        Role::Aggregator => "EPERM",
        Role::Workspace | Role::StdioServer => {
            unreachable!(
                "the roles that run programs have their own tests (tests/workspace.rs, tests/local_servers.rs)"
            )
        }
    };
    assert!(
        detail("read_probe_dir").contains(read_refusal),
        "{}",
        detail("read_probe_dir")
    );
    assert!(detail("connect_ungranted_port").contains("EACCES"));
    assert!(detail("clone3").contains("ENOSYS"), "{}", detail("clone3"));
    assert!(detail("fork").contains("EPERM"));
    assert!(detail("signal_parent").contains("landlock scope"));

    let work = &message["workload"];
    assert_eq!(work["pool_threads_joined"], 4, "{work}");
    assert_eq!(work["mio_waker"]["Ok"], "woken", "{work}");
    assert_eq!(work["http_by_address"]["Ok"], "200 hello", "{work}");
    assert_eq!(
        work["connect_listening_ungranted"],
        libc::EACCES,
        "connect to a listening, ungranted port: {work}"
    );
    assert_eq!(work["netlink_socket"], libc::EPERM, "{work}");
    // A raw system call number with the x32 bit, in every allow-list role.
    assert_eq!(work["x32_getpid"], libc::EPERM, "{work}");
    // The https attempt produced a real ClientHello (rustls + ring ran) and failed on the
    // server's plain-text answer, not on the sandbox.
    let first = tls_first_bytes
        .recv_timeout(CHILD_MESSAGE_WAIT)
        .expect("the TLS server saw a connection");
    assert_eq!(first, 0x16, "first byte of a TLS handshake record");
    let https = work["https_handshake"]["Err"].as_str().unwrap_or_default();
    assert!(!https.is_empty(), "{work}");
    assert!(
        !https.contains("os error 1)") && !https.contains("os error 13)"),
        "https failed on the sandbox: {https}"
    );

    if role == Role::Builtin {
        assert_eq!(
            work["dns_localhost"]["Ok"],
            serde_json::json!(lookup_here("localhost").expect("localhost here")),
            "{work}"
        );
        assert_eq!(work["http_by_name"]["Ok"], "200 hello", "{work}");
        let here = lookup_with_addrconfig("localhost");
        assert!(
            matches!(here, Ok(n) if n > 1),
            "several results here: {here:?}"
        );
        assert_eq!(work["dns_addrconfig"], serde_json::json!(here), "{work}");
        // A lookup that goes to the nameserver behaves inside as it does outside.
        let here = lookup_here(UNLISTED_NAME);
        let inside = &work["dns_unlisted"];
        match &here {
            Ok(addrs) => assert_eq!(inside["Ok"], serde_json::json!(addrs), "{work}"),
            Err(e) => assert_eq!(inside["Err"], serde_json::json!(e), "{work}"),
        }
    }

    // The probes created nothing in the forbidden directory.
    let names: Vec<String> = std::fs::read_dir(probe_dir.path())
        .expect("read probe dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    assert_eq!(names, vec!["ledger.sqlite".to_string()]);
    child.finish();
}

#[test]
fn builtin_worker_is_confined_attested_and_still_works() {
    run_confined_worker(Role::Builtin);
}

#[test]
fn aggregator_worker_is_confined_attested_and_still_works() {
    run_confined_worker(Role::Aggregator);
}

#[test]
fn warn_mode_still_confines_fully_where_the_kernel_can() {
    run_confined_worker_in(Role::Builtin, SandboxMode::Warn);
}

#[test]
fn landlock_alone_refuses_writes_reads_exec_connect_bind_and_signals() {
    let ungranted = TcpListener::bind("127.0.0.1:0").expect("bind ungranted");
    let ungranted_port = ungranted.local_addr().expect("addr").port();
    let probe_dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(probe_dir.path().join("ledger.sqlite"), b"secret").expect("ledger file");
    let mut grant = grant_for(Role::Builtin, &[], probe_dir.path());
    grant.read_paths.push("/nonexistent/toolwall".into());
    let mut child = ChildProcess::spawn(
        "landlock_only",
        &[
            ("GRANT", serde_json::to_string(&grant).expect("grant json")),
            ("DENIED_PORT", ungranted_port.to_string()),
        ],
        &SandboxConfig::default(),
    );
    let out = child.message();
    assert!(out.get("error").is_none(), "{out}");
    assert_eq!(out["state"], "fully_enforced");
    assert_eq!(
        out["notes"],
        serde_json::json!(["read path /nonexistent/toolwall is missing; not granted"])
    );
    let eacces = serde_json::json!(libc::EACCES);
    for key in [
        "create_in_tmp",
        "create_in_probe_dir",
        "mkdir_in_tmp",
        "remove_in_probe_dir",
        "read_probe_dir",
        "read_ungranted_passwd",
        "connect_ungranted",
        "bind",
    ] {
        assert_eq!(out[key], eacces, "{key}: {out}");
    }
    assert_eq!(out["read_granted_hosts"], "allowed", "{out}");
    let probes: Vec<super::Probe> = serde_json::from_value(out["probes"].clone()).expect("probes");
    let by_name = |name: &str| probes.iter().find(|p| p.name == name).cloned().expect(name);
    // Landlock denies exec before the kernel reads the argument vector.
    assert!(by_name("exec").denied && by_name("exec").detail.contains("EACCES"));
    assert!(
        by_name("signal_parent").denied,
        "{:?}",
        by_name("signal_parent")
    );
    // Without seccomp a process can be created: the fork probe reports it and reaps it.
    let fork = by_name("fork");
    assert!(!fork.denied && fork.detail.contains("reaped"), "{fork:?}");
    let clone3 = by_name("clone3");
    assert!(
        !clone3.denied && clone3.detail.contains("EINVAL"),
        "{clone3:?}"
    );
    // Nothing left behind: no child, nothing created, nothing removed.
    let seen = observe_process(child.pid()).expect("observe");
    assert_eq!(seen.open_fds, vec![0, 1, 2, 3]);
    assert_eq!(seen.no_new_privs, Some(true));
    assert_eq!(seen.seccomp_mode, Some(0));
    let children = std::fs::read_to_string(format!(
        "/proc/{pid}/task/{pid}/children",
        pid = child.pid()
    ))
    .unwrap_or_default();
    assert_eq!(children.trim(), "", "children left behind");
    let names: Vec<String> = std::fs::read_dir(probe_dir.path())
        .expect("read probe dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    assert_eq!(names, vec!["ledger.sqlite".to_string()]);
    assert!(!std::path::Path::new("/tmp/toolwall-landlock-only").exists());
    child.finish();
}

#[test]
fn pre_exec_sets_session_deathsig_rpc_fd_and_limits_and_scrub_closes_leaks() {
    let leaked = std::fs::File::open("/proc/self/exe").expect("open a file to leak");
    let cfg = SandboxConfig {
        mode: SandboxMode::Enforce,
        max_open_files: 64,
        max_address_space_bytes: Some(64 * 1024 * 1024 * 1024),
        ..SandboxConfig::default()
    };
    let mut child = ChildProcess::spawn_with("pre_exec_state", &[], &cfg, Some(leaked.as_raw_fd()));
    let state = child.message();
    let pid = i64::from(child.pid());
    assert_eq!(state["pid"], pid);
    assert_eq!(state["sid"], pid, "a session of its own");
    assert_eq!(state["pgid"], pid, "a process group of its own");
    assert_eq!(state["pdeathsig"], libc::SIGKILL);
    assert_eq!(state["nofile"], serde_json::json!([64, 64]));
    assert_eq!(state["core"], serde_json::json!([0, 0]));
    let gib64 = 64u64 * 1024 * 1024 * 1024;
    assert_eq!(state["as"], serde_json::json!([gib64, gib64]));
    assert_eq!(
        state["fd3_cloexec_before_scrub"], false,
        "fd 3 must survive exec"
    );
    let before: Vec<i64> = serde_json::from_value(state["fds_before_scrub"].clone()).expect("fds");
    assert!(
        before.contains(&3) && before.contains(&i64::from(LEAKED_FD)),
        "before scrub: {before:?}"
    );
    assert_eq!(state["scrub"]["Ok"], Value::Null, "{state}");
    assert!(state["scrub"].get("Err").is_none(), "{state}");
    let seen = observe_process(child.pid()).expect("observe");
    assert_eq!(seen.open_fds, vec![0, 1, 2, 3]);
    assert_eq!(
        seen.seccomp_mode,
        Some(0),
        "nothing confined in this routine"
    );
    child.finish();
}

#[test]
fn confine_refuses_when_a_thread_already_runs() {
    let mut child = ChildProcess::spawn("threads_before_confine", &[], &SandboxConfig::default());
    let outcome = child.message();
    let error = outcome["error"].as_str().unwrap_or_default();
    assert!(error.contains("2 threads running"), "{outcome}");
    // Refused before anything was applied.
    let seen = observe_process(child.pid()).expect("observe");
    assert_eq!(seen.seccomp_mode, Some(0));
    assert_eq!(seen.no_new_privs, Some(false));
    child.finish();
}

#[test]
fn worker_dies_with_its_parent() {
    let mut spawner = ChildProcess::spawn("orphan_spawner", &[], &SandboxConfig::default());
    let message = spawner.message();
    let sleeper = message["sleeper_pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("spawner: {message}"));
    let status = spawner.child.wait().expect("spawner exit");
    assert!(status.success());
    // The sleeper ignores EOF and sleeps for an hour; only SIGKILL from the parent-death
    // signal ends it early. Gone, or a zombie waiting for its new parent to reap it.
    let stat_path = format!("/proc/{sleeper}/stat");
    let mut state = String::new();
    for _ in 0..600 {
        state = match std::fs::read_to_string(&stat_path) {
            Err(_) => "gone".to_string(),
            Ok(stat) => stat
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().next())
                .unwrap_or_default()
                .to_string(),
        };
        if state == "gone" || state == "Z" || state == "X" {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        state == "gone" || state == "Z" || state == "X",
        "sleeper {sleeper} still alive after its parent died (state {state})"
    );
}

#[test]
fn observe_process_reads_this_process() {
    let seen = observe_process(std::process::id()).expect("observe self");
    assert!(seen.seccomp_mode.is_some() && seen.no_new_privs.is_some());
    assert!(seen.open_fds.contains(&0));
}
