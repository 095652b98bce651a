//! Child routines: the test executable re-run with `TOOLWALL_SANDBOX_TEST_CHILD` set.
//!
//! They run from `.init_array`, before the test harness's `main` starts its threads, so the
//! process is single-threaded like a real worker when it confines itself. Each routine
//! sends one JSON line on fd 3 (the RPC socket, as for a worker) and, when asked, waits for
//! the parent to say it has looked at it from outside.

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use super::super::{
    RPC_FD, Role, RoleGrant, SandboxConfig, SandboxMode, attest, child_pre_exec, confine,
    scrub_inherited_fds,
};
use super::{CHILD_ROUTINE_ENV, env_param};

#[used]
#[unsafe(link_section = ".init_array")]
static RUN_SANDBOX_TEST_CHILD: extern "C" fn() = run_child_routine;

extern "C" fn run_child_routine() {
    let Ok(routine) = std::env::var(CHILD_ROUTINE_ENV) else {
        return;
    };
    let code = match routine.as_str() {
        "confined_worker" => confined_worker(),
        "pre_exec_state" => pre_exec_state(),
        "threads_before_confine" => threads_before_confine(),
        "landlock_only" => landlock_only(),
        "orphan_spawner" => orphan_spawner(),
        "sleeper" => sleeper(),
        other => {
            eprintln!("unknown child routine {other}");
            2
        }
    };
    std::process::exit(code);
}

fn rpc() -> UnixStream {
    // SAFETY: fd 3 is the socketpair end the parent placed there; this process owns it,
    // and every routine takes it once.
    unsafe { UnixStream::from_raw_fd(RPC_FD) }
}

fn send(rpc: &mut UnixStream, message: &Value) {
    let mut line = message.to_string();
    line.push('\n');
    if let Err(e) = rpc.write_all(line.as_bytes()) {
        eprintln!("child: sending to the parent failed: {e}");
    }
}

/// Blocks until the parent writes a line or closes the socket.
fn wait_for_parent(rpc: &mut UnixStream) {
    let mut line = String::new();
    let _ = BufReader::new(rpc).read_line(&mut line);
}

/// The fds open in this process (the listing's own fd included).
fn open_fds() -> Value {
    match std::fs::read_dir("/proc/self/fd") {
        Ok(entries) => {
            let mut fds: Vec<i64> = entries
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect();
            fds.sort_unstable();
            json!(fds)
        }
        Err(e) => json!(format!("error: {e}")),
    }
}

fn errno_of(e: &std::io::Error) -> Value {
    match e.raw_os_error() {
        Some(n) => json!(n),
        None => json!(e.to_string()),
    }
}

/// Scrub, confine, attest; then the work a real worker does, from threads started inside
/// the sandbox.
fn confined_worker() -> i32 {
    let mut rpc_stream = rpc();
    let outcome = (|| -> Result<Value, String> {
        let role: Role = env_param("ROLE")?.parse()?;
        let mode: SandboxMode = env_param("MODE")?.parse()?;
        let grant: RoleGrant =
            serde_json::from_str(&env_param("GRANT")?).map_err(|e| e.to_string())?;
        scrub_inherited_fds().map_err(|e| format!("scrub: {e}"))?;
        let mut report = confine(role, &grant, mode).map_err(|e| format!("confine: {e}"))?;
        report.probes = attest(&grant);
        let workload = std::thread::Builder::new()
            .name("pool-0".to_string())
            .spawn(move || worker_workload(role))
            .map_err(|e| format!("thread spawn inside the sandbox: {e}"))?
            .join()
            .map_err(|_| "workload thread panicked".to_string())?;
        Ok(json!({ "report": report, "workload": workload }))
    })();
    let message = match outcome {
        Ok(v) => v,
        Err(e) => json!({ "error": e }),
    };
    send(&mut rpc_stream, &message);
    wait_for_parent(&mut rpc_stream);
    0
}

fn worker_workload(role: Role) -> Value {
    let port = |name: &str| env_param(name).ok().and_then(|p| p.parse::<u16>().ok());
    let mut out = serde_json::Map::new();

    // A pool of threads, started and joined inside the sandbox.
    let pool: Vec<_> = (0..4)
        .map(|i| std::thread::Builder::new().spawn(move || i * 2))
        .collect();
    let joined = pool.into_iter().filter_map(|h| h.ok()?.join().ok()).count();
    out.insert("pool_threads_joined".into(), json!(joined));

    out.insert("mio_waker".into(), json!(mio_round_trip()));

    if role == Role::Builtin {
        out.insert(
            "dns_localhost".into(),
            json!(lookup("localhost", 80).map_err(|e| e.to_string())),
        );
        out.insert(
            "dns_addrconfig".into(),
            json!(super::lookup_with_addrconfig("localhost")),
        );
        out.insert(
            "dns_unlisted".into(),
            json!(lookup(super::UNLISTED_NAME, 80).map_err(|e| e.to_string())),
        );
    }

    if let Some(http) = port("HTTP_PORT") {
        out.insert(
            "http_by_address".into(),
            json!(http_get(&format!("http://127.0.0.1:{http}/"))),
        );
        if role == Role::Builtin {
            out.insert(
                "http_by_name".into(),
                json!(http_get(&format!("http://localhost:{http}/"))),
            );
        }
    }
    if let Some(tls) = port("TLS_PORT") {
        out.insert(
            "https_handshake".into(),
            json!(http_get(&format!("https://127.0.0.1:{tls}/"))),
        );
    }
    if let Some(denied) = port("DENIED_PORT") {
        let result = TcpStream::connect(("127.0.0.1", denied));
        out.insert(
            "connect_listening_ungranted".into(),
            match result {
                Ok(_) => json!("connected"),
                Err(e) => errno_of(&e),
            },
        );
    }
    // getpid by its x32 number: the ABI guard answers EPERM (outside any filter this
    // kernel, without x32, answers ENOSYS).
    // SAFETY: getpid changes nothing, whatever ABI runs it.
    let x32 = unsafe { libc::syscall(0x4000_0000 | libc::SYS_getpid) };
    out.insert(
        "x32_getpid".into(),
        if x32 >= 0 {
            json!("ran")
        } else {
            errno_of(&std::io::Error::last_os_error())
        },
    );
    // SAFETY: plain socket call; closed if it was created.
    let netlink = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    out.insert(
        "netlink_socket".into(),
        if netlink >= 0 {
            // SAFETY: closing the fd just created.
            unsafe { libc::close(netlink) };
            json!("created")
        } else {
            errno_of(&std::io::Error::last_os_error())
        },
    );
    Value::Object(out)
}

fn lookup(host: &str, port: u16) -> std::io::Result<Vec<String>> {
    let mut addrs: Vec<String> = (host, port)
        .to_socket_addrs()?
        .map(|a| a.to_string())
        .collect();
    addrs.sort();
    addrs.dedup();
    Ok(addrs)
}

/// A blocking ureq GET as the HTTP tools do it: an agent with timeouts (so its resolver
/// runs on a thread of its own), rustls with ring for https.
fn http_get(url: &str) -> Result<String, String> {
    let agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(30)))
        .timeout_connect(Some(Duration::from_secs(10)))
        .build()
        .new_agent();
    let mut response = agent.get(url).call().map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = response
        .body_mut()
        .read_to_string()
        .map_err(|e| e.to_string())?;
    Ok(format!("{status} {body}"))
}

/// A mio poll loop woken from another thread through its eventfd waker, with the RPC
/// socket registered as the worker's loop does.
fn mio_round_trip() -> Result<String, String> {
    use mio::unix::SourceFd;
    use mio::{Events, Interest, Poll, Token, Waker};
    let mut poll = Poll::new().map_err(|e| format!("poll: {e}"))?;
    let rpc_fd = RPC_FD;
    poll.registry()
        .register(&mut SourceFd(&rpc_fd), Token(3), Interest::READABLE)
        .map_err(|e| format!("register: {e}"))?;
    let waker = Arc::new(Waker::new(poll.registry(), Token(1)).map_err(|e| format!("waker: {e}"))?);
    let remote = Arc::clone(&waker);
    let waking = std::thread::spawn(move || remote.wake());
    let mut events = Events::with_capacity(8);
    let mut woken = false;
    for _ in 0..100 {
        poll.poll(&mut events, Some(Duration::from_secs(10)))
            .map_err(|e| format!("poll: {e}"))?;
        if events.iter().any(|e| e.token() == Token(1)) {
            woken = true;
            break;
        }
    }
    waking
        .join()
        .map_err(|_| "waker thread panicked".to_string())?
        .map_err(|e| format!("wake: {e}"))?;
    poll.registry()
        .deregister(&mut SourceFd(&rpc_fd))
        .map_err(|e| format!("deregister: {e}"))?;
    if woken {
        Ok("woken".to_string())
    } else {
        Err("never woken".to_string())
    }
}

/// What `child_pre_exec` and `scrub_inherited_fds` left: reported, nothing confined.
fn pre_exec_state() -> i32 {
    let fds_before = open_fds();
    let fd3_cloexec_before = {
        // SAFETY: fcntl F_GETFD on an fd number.
        let flags = unsafe { libc::fcntl(RPC_FD, libc::F_GETFD) };
        flags >= 0 && flags & libc::FD_CLOEXEC != 0
    };
    let scrub = scrub_inherited_fds().map_err(|e| e.to_string());
    let mut pdeathsig: libc::c_int = -1;
    let limit = |resource| {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: valid out-pointer.
        unsafe { libc::getrlimit(resource, &mut l) };
        json!([l.rlim_cur, l.rlim_max])
    };
    // SAFETY: plain queries about this process.
    let (pid, sid, pgid) = unsafe {
        libc::prctl(
            libc::PR_GET_PDEATHSIG,
            &mut pdeathsig as *mut libc::c_int,
            0,
            0,
            0,
        );
        (libc::getpid(), libc::getsid(0), libc::getpgid(0))
    };
    let message = json!({
        "pid": pid, "sid": sid, "pgid": pgid, "pdeathsig": pdeathsig,
        "nofile": limit(libc::RLIMIT_NOFILE), "core": limit(libc::RLIMIT_CORE),
        "as": limit(libc::RLIMIT_AS),
        "fds_before_scrub": fds_before, "fd3_cloexec_before_scrub": fd3_cloexec_before,
        "scrub": scrub,
    });
    let mut rpc_stream = rpc();
    send(&mut rpc_stream, &message);
    wait_for_parent(&mut rpc_stream);
    0
}

/// Landlock alone, without seccomp: each refusal the full confinement gets from seccomp
/// first must also come from Landlock (EACCES), so neither layer rests on the other.
fn landlock_only() -> i32 {
    let mut rpc_stream = rpc();
    let outcome = (|| -> Result<Value, String> {
        let grant: RoleGrant =
            serde_json::from_str(&env_param("GRANT")?).map_err(|e| e.to_string())?;
        let denied_port: u16 = env_param("DENIED_PORT")?
            .parse()
            .map_err(|e| format!("{e}"))?;
        scrub_inherited_fds().map_err(|e| format!("scrub: {e}"))?;
        let mut notes = Vec::new();
        let state = super::super::landlock_rules::restrict(Role::Builtin, &grant, &mut notes)?;
        let probe_dir = grant.forbidden_probe_dir.clone();
        let errno = |r: std::io::Result<()>| match r {
            Ok(()) => json!("allowed"),
            Err(e) => errno_of(&e),
        };
        let created = |path: std::path::PathBuf| {
            errno(
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(path)
                    .map(drop),
            )
        };
        let read = |path: &str| errno(std::fs::read(path).map(drop));
        Ok(json!({
            "state": state.as_str(),
            "notes": notes,
            "create_in_tmp": created("/tmp/toolwall-landlock-only".into()),
            "create_in_probe_dir": created(probe_dir.join("x")),
            "mkdir_in_tmp": errno(std::fs::create_dir("/tmp/toolwall-landlock-only-dir")),
            "remove_in_probe_dir": errno(std::fs::remove_file(probe_dir.join("ledger.sqlite"))),
            "read_probe_dir": errno(std::fs::read_dir(&probe_dir).map(drop)),
            "read_granted_hosts": read("/etc/hosts"),
            "read_ungranted_passwd": read("/etc/passwd"),
            "connect_ungranted": errno(TcpStream::connect(("127.0.0.1", denied_port)).map(drop)),
            "bind": errno(std::net::TcpListener::bind(("127.0.0.1", 0)).map(drop)),
            "probes": attest(&grant),
        }))
    })();
    let message = match outcome {
        Ok(v) => v,
        Err(e) => json!({ "error": e }),
    };
    send(&mut rpc_stream, &message);
    wait_for_parent(&mut rpc_stream);
    0
}

/// A thread already running: confine must refuse in enforce mode, before applying anything.
fn threads_before_confine() -> i32 {
    let mut rpc_stream = rpc();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let early = std::thread::spawn(move || {
        let _ = stop_rx.recv();
    });
    let grant = super::super::role_grant_defaults(Role::Builtin);
    let outcome = match confine(Role::Builtin, &grant, SandboxMode::Enforce) {
        Ok(report) => json!({ "confined": report }),
        Err(e) => json!({ "error": e.to_string() }),
    };
    send(&mut rpc_stream, &outcome);
    wait_for_parent(&mut rpc_stream);
    let _ = stop_tx.send(());
    let _ = early.join();
    0
}

/// Starts a sleeper worker as the gateway would, reports its pid, and exits without
/// waiting: the parent-death signal must take the sleeper down.
fn orphan_spawner() -> i32 {
    let mut rpc_stream = rpc();
    let outcome = (|| -> Result<Value, String> {
        let (ours, theirs) = UnixStream::pair().map_err(|e| e.to_string())?;
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut cmd = std::process::Command::new(exe);
        cmd.env_clear()
            .env(CHILD_ROUTINE_ENV, "sleeper")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null());
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        // SAFETY: child_pre_exec's closure is async-signal-safe.
        unsafe {
            cmd.pre_exec(child_pre_exec(
                theirs.as_raw_fd(),
                &SandboxConfig::default(),
            ));
        }
        let sleeper = cmd.spawn().map_err(|e| e.to_string())?;
        drop(theirs);
        // The sleeper says it is past its checks before we leave.
        let mut ready = [0u8; 1];
        (&ours).read_exact(&mut ready).map_err(|e| e.to_string())?;
        std::mem::forget(ours);
        Ok(json!({ "sleeper_pid": sleeper.id() }))
    })();
    let message = match outcome {
        Ok(v) => v,
        Err(e) => json!({ "error": e }),
    };
    send(&mut rpc_stream, &message);
    // Exit at once, leaving the sleeper unreaped: only its parent-death signal ends it.
    0
}

fn sleeper() -> i32 {
    if let Err(e) = scrub_inherited_fds() {
        eprintln!("sleeper: {e}");
        return 3;
    }
    let mut rpc_stream = rpc();
    let _ = rpc_stream.write_all(b"r");
    // Ignores EOF on purpose: only a signal ends this process.
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
