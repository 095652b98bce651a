//! The workspace worker, run for real: `toolwall worker workspace` started the way the
//! gateway starts it (empty environment, RPC socketpair at fd 3, settings on stdin), driven
//! over its RPC protocol. Confinement is checked from outside: what a command tries and
//! what is (not) there afterwards. The tests at the bottom go through the real gateway.

mod common;

use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use toolwall::sandbox::{ConfinementReport, SandboxConfig, SandboxMode, child_pre_exec};
use toolwall::workers::rpc::{self, Message, Op, RpcReader};
use toolwall::workspace::WorkspaceWorkerSettings;
use toolwall::workspace::config::{Network, WorkspaceConfig, WorkspacesConfig};
use toolwall::workspace::routing::worker_settings;
use toolwall::workspace::settings::AgentExpectation;

use common::{BIN, PATIENCE};

/// A temporary tree: the workspace root, toolwall's state and config next to it, a tools
/// directory granted read-only (holding a hidden config), and another owner's workspace.
struct Tree {
    _dir: tempfile::TempDir,
    base: PathBuf,
}

impl Tree {
    fn new() -> Tree {
        let dir = tempfile::tempdir().expect("tempdir");
        let base = std::fs::canonicalize(dir.path()).expect("canonical");
        for d in ["ws", "state", "tools/bin", "tools/secret", "other"] {
            std::fs::create_dir_all(base.join(d)).expect("mkdir");
        }
        std::fs::write(base.join("state/ledger.db"), "ledger rows").expect("ledger");
        std::fs::write(base.join("toolwall.toml"), "[admin]\n").expect("config");
        std::fs::write(base.join("tools/readme.txt"), "tool docs\n").expect("readme");
        std::fs::write(base.join("tools/secret/corp.toml"), "corp secret\n").expect("corp");
        std::fs::write(base.join("other/theirs.txt"), "not yours\n").expect("other");
        let hello = base.join("tools/bin/hello");
        std::fs::write(&hello, "#!/bin/sh\necho hello from a tool\n").expect("script");
        std::fs::set_permissions(&hello, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        // The root belongs to the agent user, as an operator must set it up; the rest stays
        // root's (toolwall's, another owner's).
        common::give_to_agent(&base.join("ws"));
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        Tree { _dir: dir, base }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.base.join(rel)
    }

    /// The settings the gateway would compute for workspace `ws`.
    fn settings(&self, edit: impl FnOnce(&mut WorkspaceConfig)) -> WorkspaceWorkerSettings {
        let mut ws = WorkspaceConfig {
            root: self.path("ws"),
            owners: vec!["uid:1000".into()],
            read_only_paths: vec![self.path("tools")],
            ..WorkspaceConfig::default()
        };
        edit(&mut ws);
        let other = WorkspaceConfig {
            root: self.path("other"),
            owners: vec!["uid:2000".into()],
            ..WorkspaceConfig::default()
        };
        let cfg = WorkspacesConfig(
            [("ws".to_string(), ws), ("other".to_string(), other)]
                .into_iter()
                .collect(),
        );
        let protected = [
            self.path("toolwall.toml"),
            self.path("tools/secret/corp.toml"),
        ];
        let all = worker_settings(&cfg, &protected, &self.path("state"), SandboxMode::Enforce)
            .expect("worker settings");
        let mut settings = all
            .into_iter()
            .find(|s| s.name == "ws")
            .expect("ws settings");
        settings.agent = AgentExpectation {
            user: Some(common::agent_user()),
            // SAFETY: getuid cannot fail.
            gateway_uid: unsafe { libc::getuid() },
        };
        settings
    }
}

/// A running workspace worker and its RPC channel.
struct Worker {
    child: Child,
    rpc: UnixStream,
    reader: RpcReader,
    next_id: u64,
    events: Vec<(String, Value)>,
    report: ConfinementReport,
    settings: WorkspaceWorkerSettings,
}

impl Worker {
    fn start(settings: WorkspaceWorkerSettings) -> Worker {
        let (ours, theirs) = UnixStream::pair().expect("socketpair");
        let mut cmd = Command::new(BIN);
        cmd.arg("worker")
            .arg("workspace")
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        // As the launcher starts it: the agent user first (that clears the parent-death
        // signal), then the gateway's preparation.
        if let Some(user) = &settings.agent.user {
            common::run_as(&mut cmd, user);
        }
        // SAFETY: child_pre_exec only makes async-signal-safe calls.
        unsafe {
            cmd.pre_exec(child_pre_exec(
                theirs.as_raw_fd(),
                &SandboxConfig::default(),
            ));
        }
        let mut child = cmd.spawn().expect("spawn worker");
        drop(theirs);
        let text = serde_json::to_vec(&settings).expect("settings json");
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(&text).expect("write settings");
        drop(stdin);
        ours.set_read_timeout(Some(PATIENCE)).expect("timeout");
        let mut w = Worker {
            child,
            rpc: ours,
            reader: RpcReader::default(),
            next_id: 1,
            events: Vec::new(),
            report: ConfinementReport {
                role: String::new(),
                landlock_abi: 0,
                landlock: String::new(),
                seccomp: false,
                no_new_privs: false,
                capabilities_cleared: false,
                bounding_set_cleared: false,
                mode: String::new(),
                uid: None,
                gid: None,
                probes: Vec::new(),
                notes: Vec::new(),
            },
            settings,
        };
        match w.recv() {
            Message::Ready {
                role,
                confinement,
                pid,
                ..
            } => {
                assert_eq!(role, "workspace");
                assert_eq!(pid, w.child.id());
                w.report = confinement;
            }
            other => panic!("first message is not ready: {other:?}"),
        }
        w
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn root(&self) -> &Path {
        &self.settings.workspace.root
    }

    fn recv(&mut self) -> Message {
        loop {
            match self.reader.next_message().expect("well-formed rpc") {
                Some(m) => return m,
                None => {
                    let spare = self.reader.spare();
                    let n = self.rpc.read(spare).unwrap_or(0);
                    self.reader.filled(n);
                    assert!(n > 0, "the worker closed its channel or went silent");
                }
            }
        }
    }

    fn send(&mut self, op: Op) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let msg = Message::Request { id, op };
        let mut out = Vec::new();
        rpc::encode(&mut out, &msg).expect("encode");
        self.rpc.write_all(&out).expect("send");
        id
    }

    /// The answer to request `id` (events on the way are kept).
    fn answer(&mut self, id: u64) -> Value {
        loop {
            match self.recv() {
                Message::Response {
                    id: got, ok, error, ..
                } if got == id => {
                    assert!(error.is_none(), "rpc error: {error:?}");
                    return serde_json::from_str(&ok.expect("ok")).expect("json");
                }
                Message::Event { kind, detail } => {
                    let detail = serde_json::from_str(&detail).unwrap_or(Value::Null);
                    self.events.push((kind, detail));
                }
                other => panic!("unexpected message: {other:?}"),
            }
        }
    }

    /// A tool call's CallToolResult.
    fn call(&mut self, tool: &str, mut args: Value) -> Value {
        args["worker"] = json!(self.settings.name);
        let id = self.send(call_op(tool, args));
        self.answer(id)
    }

    fn ok(&mut self, tool: &str, args: Value) -> Value {
        let r = self.call(tool, args);
        assert!(r.get("isError").is_none(), "{tool} failed: {r}");
        r["structuredContent"].clone()
    }

    fn err(&mut self, tool: &str, args: Value) -> (String, String) {
        let r = self.call(tool, args);
        assert_eq!(r["isError"], true, "{tool} should fail: {r}");
        let e = &r["structuredContent"]["error"];
        assert!(e["mcp_error_code"].is_i64(), "{r}");
        (
            e["code"].as_str().unwrap_or_default().to_owned(),
            e["message"].as_str().unwrap_or_default().to_owned(),
        )
    }

    /// Runs a command to its end.
    fn sh(&mut self, command: &str) -> Value {
        let r = self.ok("shell_run", json!({"command": command, "timeout": 60}));
        assert_ne!(r["status"], "running", "{command}: {r}");
        r
    }

    /// Waits until `task_get` satisfies `check`.
    fn until(&mut self, task: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let t = self.ok("task_get", json!({"task_id": task}));
            if check(&t) {
                return t;
            }
            assert!(
                Instant::now() < deadline,
                "task {task} never showed {what}: {t}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether any process is in process group `pgid`.
fn group_alive(pgid: i32) -> bool {
    // SAFETY: signal 0 only checks.
    unsafe { libc::kill(-pgid, 0) == 0 }
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks.
    unsafe { libc::kill(pid, 0) == 0 }
}

fn wait_gone(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while check() {
        assert!(Instant::now() < deadline, "{what} still there");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn refused(r: &Value) -> bool {
    let err = r["stderr"].as_str().unwrap_or_default();
    r["status"] == "failed"
        && (err.contains("Permission denied") || err.contains("Operation not permitted"))
}

#[test]
fn the_worker_attests_a_workspace_confinement_and_passes_the_verdict() {
    let tree = Tree::new();
    let w = Worker::start(tree.settings(|_| {}));
    let report = &w.report;
    assert_eq!(report.role, "workspace");
    assert_eq!(report.landlock, "fully_enforced");
    assert!(report.seccomp && report.no_new_privs && report.capabilities_cleared);
    assert_eq!(report.verdict(SandboxMode::Enforce), Ok(Vec::new()));
    let probe = |name: &str| {
        report
            .probes
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("probe {name} missing: {:?}", report.probes))
            .clone()
    };
    for name in ["fork", "posix_spawn", "exec"] {
        let p = probe(name);
        assert!(!p.denied && p.detail.contains("allowed by design"), "{p:?}");
    }
    for name in [
        "create_file_tmp",
        "create_file_probe_dir",
        "create_file_outside_root",
        "read_probe_dir",
        "read_hidden_paths",
        "connect_ungranted_port",
        "bind_tcp",
        "unix_socket",
        "udp_socket",
        "signal_parent",
        "child_create_file_tmp",
        "child_signal_gateway",
        "child_new_user_namespace",
        "clone3",
    ] {
        assert!(probe(name).denied, "{:?}", probe(name));
    }
    assert!(
        probe("child_create_file_tmp")
            .detail
            .contains("inherited by the child")
    );
    assert!(probe("signal_parent").detail.contains("landlock scope"));
    // From outside: seccomp and no_new_privs on, nothing of ours in its environment.
    let seen = toolwall::sandbox::observe_process(w.child.id()).expect("observe");
    assert_eq!(seen.seccomp_mode, Some(2));
    assert_eq!(seen.no_new_privs, Some(true));
    assert!(
        seen.environment_names.is_empty(),
        "{:?}",
        seen.environment_names
    );
    // The private temp dir exists, owner-only.
    let tmp = std::fs::metadata(tree.path("ws/.toolwall-tmp")).expect("tmp dir");
    assert_eq!(tmp.permissions().mode() & 0o777, 0o700);
}

#[test]
fn commands_cannot_write_outside_read_secrets_connect_or_signal() {
    let tree = Tree::new();
    let listener = TcpListener::bind("127.0.0.1:0").expect("listen");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port();
    let mut w = Worker::start(tree.settings(|_| {}));
    let marker = format!("/tmp/toolwall-ws-escape-{}", std::process::id());
    let me = std::process::id();
    let worker = w.pid();
    let ledger = tree.path("state/ledger.db");
    let attempts = [
        format!("touch {marker}"),
        "echo x > ../escape.txt".to_string(),
        format!("cat {}", ledger.display()),
        format!("ls {}", tree.path("state").display()),
        format!("cat {}", tree.path("toolwall.toml").display()),
        format!("cat {}", tree.path("tools/secret/corp.toml").display()),
        format!("cat {}", tree.path("other/theirs.txt").display()),
        format!("echo x > {}", tree.path("tools/planted").display()),
        format!("kill -0 {me}"),
        format!("kill -0 {worker}"),
        "kill -0 $PPID".to_string(),
        format!(
            "perl -MIO::Socket::INET -e 'IO::Socket::INET->new(PeerAddr => \"127.0.0.1:{port}\") or die \"connect: $!\\n\"'"
        ),
        "perl -MSocket -e 'socket(my $s, AF_UNIX, SOCK_STREAM, 0) or die \"unix socket: $!\\n\"'"
            .to_string(),
        "perl -MSocket -e 'socket(my $s, AF_INET, SOCK_DGRAM, 0) or die \"udp socket: $!\\n\"'"
            .to_string(),
    ];
    let mut attempts = attempts.to_vec();
    // Hidden by the profile (the worker runs as the files' owner when the gateway is root).
    if Path::new("/etc/shadow").exists() {
        attempts.push("cat /etc/shadow".to_string());
    }
    for attempt in &attempts {
        let r = w.sh(attempt);
        assert!(refused(&r), "{attempt} was not refused: {r}");
    }
    // Nothing got out, nothing came in.
    assert!(!Path::new(&marker).exists());
    assert!(!tree.path("escape.txt").exists());
    assert!(!tree.path("tools/planted").exists());
    assert!(
        listener.accept().is_err(),
        "a connection reached the listener"
    );
    assert!(alive(me as i32) && alive(worker));
    // What is granted works: the root, the tools tree (minus its hidden file), /usr.
    let ok = w.sh(&format!(
        "echo inside > inside.txt && cat inside.txt && cat {} && {} && ls /usr/bin/env && head -c 0 /etc/passwd",
        tree.path("tools/readme.txt").display(),
        tree.path("tools/bin/hello").display()
    ));
    assert_eq!(ok["status"], "completed", "{ok}");
    assert_eq!(
        ok["stdout"],
        "inside\ntool docs\nhello from a tool\n/usr/bin/env\n"
    );
    // Each refusal is on record: one task_finished event per command, with its status.
    let failed = w
        .events
        .iter()
        .filter(|(k, d)| k == "task_finished" && d["status"] == "failed")
        .count();
    assert_eq!(failed, attempts.len());
}

#[test]
fn network_ports_grant_tcp_to_those_ports_only() {
    let tree = Tree::new();
    let granted = TcpListener::bind("127.0.0.1:0").expect("listen");
    let denied = TcpListener::bind("127.0.0.1:0").expect("listen");
    denied.set_nonblocking(true).expect("nonblocking");
    let (gp, dp) = (
        granted.local_addr().expect("addr").port(),
        denied.local_addr().expect("addr").port(),
    );
    let mut w = Worker::start(tree.settings(|ws| ws.network = Network::Ports(vec![gp])));
    assert_eq!(w.report.verdict(SandboxMode::Enforce), Ok(Vec::new()));
    let connect = |port: u16| {
        format!(
            "perl -MIO::Socket::INET -e 'IO::Socket::INET->new(PeerAddr => \"127.0.0.1:{port}\") or die \"connect: $!\\n\"; print \"connected\\n\"'"
        )
    };
    let ok = w.sh(&connect(gp));
    assert_eq!(ok["stdout"], "connected\n", "{ok}");
    assert!(granted.accept().is_ok());
    let no = w.sh(&connect(dp));
    assert!(refused(&no), "{no}");
    assert!(denied.accept().is_err());
}

#[test]
fn every_file_tool_works_inside_and_refuses_outside() {
    let tree = Tree::new();
    let mut w = Worker::start(tree.settings(|ws| ws.max_read_bytes = 16));
    // Wrapped or flat arguments mean the same.
    let name = w.settings.name.clone();
    let id = w.send(call_op("file_write", json!({"input": {"worker": name, "path": "src/lib.rs", "content": "pub fn a() {}\npub fn b() {}\n", "create_dirs": true}})));
    let wrote = w.answer(id);
    assert_eq!(wrote["structuredContent"]["created"], true, "{wrote}");
    assert_eq!(
        std::fs::read_to_string(w.root().join("src/lib.rs")).expect("on disk"),
        "pub fn a() {}\npub fn b() {}\n"
    );
    let read = w.ok("file_read", json!({"path": "src/lib.rs"}));
    assert_eq!(read["content"], "pub fn a() {}\npu");
    assert_eq!(read["next_offset"], 16);
    let rest = w.ok("file_read", json!({"path": "src/lib.rs", "offset": 16}));
    assert_eq!(rest["content"], "b fn b() {}\n");
    assert_eq!(rest["eof"], true);
    w.ok(
        "file_write",
        json!({"path": "blob", "content": "AAEC/w==", "encoding": "base64"}),
    );
    let blob = w.ok("file_read", json!({"path": "blob"}));
    assert_eq!(
        (blob["encoding"].as_str(), blob["content"].as_str()),
        (Some("base64"), Some("AAEC/w=="))
    );
    let list = w.ok("file_list", json!({}));
    let names: Vec<&str> = list["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert_eq!(names, vec![".toolwall-tmp", "blob", "src"]);
    // Edit: a mismatch writes nothing and names the operation.
    let (code, message) = w.err(
        "file_edit",
        json!({"path": "src/lib.rs", "operations": [{"old": "fn a", "new": "fn x"}, {"old": "fn", "new": "f"}]}),
    );
    assert_eq!(code, "edit_mismatch");
    assert!(
        message.contains("operation 2 of 2") && message.contains("occurs 2 times"),
        "{message}"
    );
    assert!(
        std::fs::read_to_string(w.root().join("src/lib.rs"))
            .expect("read")
            .contains("fn a")
    );
    let edited = w.ok(
        "file_edit",
        json!({"path": "src/lib.rs", "operations": [{"old": "fn a", "new": "fn x"}, {"old": "fn", "new": "const fn", "count": 2}]}),
    );
    assert_eq!(edited["replacements"], 3);
    assert_eq!(
        std::fs::read_to_string(w.root().join("src/lib.rs")).expect("read"),
        "pub const fn x() {}\npub const fn b() {}\n"
    );
    let found = w.ok("file_find", json!({"pattern": "*.rs"}));
    assert_eq!(
        found["matches"],
        json!([{"path": "src/lib.rs", "type": "file"}])
    );
    let hits = w.ok("file_search", json!({"pattern": r"fn \w\(", "regex": true}));
    assert_eq!(hits["matches"].as_array().map(Vec::len), Some(2), "{hits}");
    assert_eq!(hits["skipped_binary"], 1);
    // Outside: absolute, `..`, and a link a command planted.
    w.sh(&format!(
        "ln -s {} leak && ln -s /etc escape_dir",
        tree.path("toolwall.toml").display()
    ));
    for (tool, args) in [
        ("file_read", json!({"path": "/etc/hostname"})),
        ("file_read", json!({"path": "../toolwall.toml"})),
        ("file_read", json!({"path": "leak"})),
        (
            "file_write",
            json!({"path": "escape_dir/x", "content": "x"}),
        ),
        ("file_list", json!({"path": "escape_dir"})),
        ("file_find", json!({"pattern": "*", "root": "../state"})),
        ("file_search", json!({"pattern": "x", "root": "/"})),
        (
            "file_edit",
            json!({"path": "leak", "operations": [{"old": "a", "new": "b"}]}),
        ),
    ] {
        let (code, message) = w.err(tool, args.clone());
        assert_eq!(code, "path_outside_workspace", "{tool} {args}: {message}");
    }
    let (code, _) = w.err("file_read", json!({"path": "missing"}));
    assert_eq!(code, "not_found");
    let (code, _) = w.err(
        "file_write",
        json!({"path": "big", "content": "x".repeat(5 * 1024 * 1024)}),
    );
    assert_eq!(code, "too_large");
    // Another workspace named in `worker` is not found here either.
    let id = w.send(call_op("task_list", json!({"worker": "other"})));
    let r = w.answer(id);
    assert_eq!(r["structuredContent"]["error"]["code"], "worker_not_found");
    // workers_list and system_info.
    let me = w.ok("workers_list", json!({}));
    assert_eq!(me["workers"][0]["id"], json!(w.settings.id));
    let info = w.ok("system_info", json!({}));
    assert_eq!(info["os"], "Linux");
    assert_eq!(info["workspace"]["network"], false);
    assert_eq!(info["confinement"]["role"], "workspace");
    assert!(info["cpus"].as_u64().unwrap_or(0) >= 1);
}

#[test]
fn a_slow_command_turns_into_a_task_that_can_be_waited_for() {
    let tree = Tree::new();
    let mut w = Worker::start(tree.settings(|_| {}));
    let r = w.ok(
        "shell_run",
        json!({"command": "echo started; while [ ! -e go ]; do sleep 0.02; done; echo finished", "timeout": 0.2}),
    );
    assert_eq!(r["status"], "running", "{r}");
    assert_eq!(
        r["next_actions"],
        json!(["check_later", "wait_longer", "cancel"])
    );
    assert!(
        r["hint"]
            .as_str()
            .is_some_and(|h| h.contains("ws__task_wait"))
    );
    let task = r["task_id"].as_str().expect("task id").to_owned();
    w.until(&task, "its first line", |t| t["stdout"] == "started\n");
    let listed = w.ok("task_list", json!({}));
    assert_eq!(listed["tasks"][0]["task_id"], json!(task));
    assert_eq!(listed["tasks"][0]["status"], "running");
    // A short wait while it still cannot end answers running again.
    let again = w.ok("task_wait", json!({"task_id": task, "timeout": 0.05}));
    assert_eq!(again["status"], "running");
    w.ok("file_write", json!({"path": "go", "content": ""}));
    let done = w.ok("task_wait", json!({"task_id": task, "timeout": 60}));
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["stdout"], "started\nfinished\n");
    assert_eq!(done["exit_code"], 0);
    assert!(done.get("hint").is_none());
    let failed = w.sh("echo oops >&2; exit 3");
    assert_eq!(
        (failed["status"].as_str(), failed["exit_code"].as_i64()),
        (Some("failed"), Some(3))
    );
    assert_eq!(failed["stderr"], "oops\n");
    let (code, _) = w.err("task_get", json!({"task_id": "tsk_000000000000"}));
    assert_eq!(code, "task_not_found");
}

#[test]
fn cancel_kills_the_whole_task_even_what_left_its_process_group() {
    let tree = Tree::new();
    let mut w = Worker::start(tree.settings(|ws| ws.cancel_grace_ms = 200));
    // The shell ignores SIGTERM (so SIGKILL must follow), a child sleeps in the group,
    // and one escapes into a session of its own.
    let task = w.ok(
        "shell_dispatch",
        json!({"command": "trap '' TERM; sleep 1000 & setsid sh -c 'echo $$ > escaped.pid; exec sleep 1000' & echo up; wait"}),
    )["task_id"]
        .as_str()
        .expect("task id")
        .to_owned();
    let running = w.until(&task, "its pid and the escapee", |t| {
        t["pid"].is_i64() && t["stdout"] == "up\n"
    });
    let pgid = running["pid"].as_i64().expect("pid") as i32;
    let escaped_file = w.root().join("escaped.pid");
    let deadline = Instant::now() + PATIENCE;
    let escaped: i32 = loop {
        if let Ok(text) = std::fs::read_to_string(&escaped_file)
            && let Ok(pid) = text.trim().parse()
        {
            break pid;
        }
        assert!(Instant::now() < deadline, "the escapee never wrote its pid");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(group_alive(pgid) && alive(escaped));
    // SAFETY: getpgid of a live pid.
    assert_ne!(
        unsafe { libc::getpgid(escaped) },
        pgid,
        "the escapee left the group"
    );
    let cancelled = w.ok("task_cancel", json!({"task_id": task}));
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert_eq!(
        cancelled["signal"],
        libc::SIGKILL,
        "SIGTERM was ignored: {cancelled}"
    );
    // Gone by the time the answer came: the leader reaps every process before reporting.
    assert!(!group_alive(pgid), "process group {pgid} survived");
    assert!(!alive(escaped), "escapee {escaped} survived");
    let again = w.ok("task_cancel", json!({"task_id": task}));
    assert_eq!(again["status"], "cancelled");
}

#[test]
fn output_is_capped_and_limits_apply_per_task() {
    let tree = Tree::new();
    let mut w = Worker::start(tree.settings(|ws| {
        ws.output_cap_bytes = 1000;
        ws.task_max_file_size_bytes = 10_000;
        ws.task_cpu_secs = 77;
        ws.task_max_processes = 3000;
    }));
    let big = w.sh("head -c 100000 /dev/zero | tr '\\0' y; echo; echo the end");
    assert_eq!(big["status"], "completed");
    assert_eq!(big["truncated"], true);
    assert_eq!(big["stdout_bytes"], 100_000 + 1 + 8);
    let out = big["stdout"].as_str().expect("stdout");
    assert!(
        out.starts_with("yyyy") && out.ends_with("the end\n"),
        "head and tail kept"
    );
    assert!(out.contains("bytes omitted (output_cap_bytes)"));
    assert!(out.len() < 1000, "{}", out.len());
    // rlimits as the command sees them (dash: -f in 512-byte blocks).
    let limits = w.sh("ulimit -t; ulimit -p; ulimit -f");
    assert_eq!(limits["stdout"], "77\n3000\n19\n");
    let fsize = w.sh("head -c 20000 /dev/zero > big.bin");
    assert_eq!(fsize["status"], "failed");
    let size = std::fs::metadata(w.root().join("big.bin"))
        .map(|m| m.len())
        .unwrap_or(0);
    assert!(size <= 10_000, "{size}");
}

#[test]
fn tasks_are_bounded_timed_out_and_survive_a_call_that_gave_up() {
    let tree = Tree::new();
    let mut w = Worker::start(tree.settings(|ws| {
        ws.max_tasks = 2;
        ws.cancel_grace_ms = 100;
    }));
    let timed = w.ok(
        "shell_dispatch",
        json!({"command": "sleep 1000", "timeout": 0.3}),
    );
    let timed = timed["task_id"].as_str().expect("id").to_owned();
    let waited = w.ok("task_wait", json!({"task_id": timed, "timeout": 60}));
    assert_eq!(waited["status"], "timed_out", "{waited}");
    // A call waiting on a command is cancelled (its agent left): no answer comes, and the
    // command goes on to its end.
    let id = w.send(call_op("shell_run", json!({"worker": "ws", "command": "while [ ! -e go ]; do sleep 0.02; done; echo done", "timeout": 60})));
    w.send(Op::Cancel { target: id });
    let list = w.ok("task_list", json!({}));
    let waiting = list["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .find(|t| t["status"] == "running")
        .and_then(|t| t["task_id"].as_str())
        .expect("the abandoned command still runs")
        .to_owned();
    // Two tasks held, one running: a third command replaces the finished one; a fourth
    // finds both slots running.
    let third = w.ok("shell_dispatch", json!({"command": "sleep 1000"}));
    let third = third["task_id"].as_str().expect("id").to_owned();
    let (code, _) = w.err("task_get", json!({"task_id": timed}));
    assert_eq!(code, "task_not_found", "the finished task made room");
    let (code, message) = w.err("shell_run", json!({"command": "true"}));
    assert_eq!(code, "too_many_tasks", "{message}");
    w.ok("task_cancel", json!({"task_id": third}));
    w.ok("file_write", json!({"path": "go", "content": ""}));
    let done = w.ok("task_wait", json!({"task_id": waiting, "timeout": 60}));
    assert_eq!(done["stdout"], "done\n");
    // The answer to the abandoned call never came: the next message answers a new call.
    let probe = w.send(call_op("task_list", json!({"worker": "ws"})));
    loop {
        match w.recv() {
            Message::Response { id: got, .. } => {
                assert_eq!(got, probe, "an answer came for the cancelled call {id}");
                break;
            }
            Message::Event { .. } => {}
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn when_the_worker_goes_its_tasks_go_with_it() {
    let tree = Tree::new();
    let mut w = Worker::start(tree.settings(|_| {}));
    let task = w.ok(
        "shell_dispatch",
        json!({"command": "sleep 1000 & sleep 1000"}),
    );
    let task = task["task_id"].as_str().expect("id").to_owned();
    let pgid = w.until(&task, "its pid", |t| t["pid"].is_i64())["pid"]
        .as_i64()
        .expect("pid") as i32;
    assert!(group_alive(pgid));
    // The gateway closing the channel ends the worker; its tasks' leaders kill the rest.
    w.rpc.shutdown(std::net::Shutdown::Both).expect("shutdown");
    let status = common::wait_timeout(&mut w.child, PATIENCE).expect("the worker exits");
    assert!(status.success(), "{status}");
    wait_gone("the task's process group", || group_alive(pgid));
}

// ---- end to end through the gateway ---------------------------------------------------

fn gateway_with_workspaces(extra: &str) -> (common::TestGateway, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = std::fs::canonicalize(dir.path())
        .expect("canonical")
        .join("ws");
    std::fs::create_dir_all(&root).expect("mkdir");
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let config = common::base_config(
        dir.path(),
        &format!(
            r#"
[workspaces.mine]
root = "{root}"
owners = ["uid:{uid}"]

[workspaces.theirs]
root = "{dir}/theirs"
owners = ["uid:4242424"]

{extra}
"#,
            root = root.display(),
            dir = dir.path().display(),
        ),
    );
    std::fs::create_dir_all(dir.path().join("theirs")).expect("mkdir");
    common::give_to_agent(&root);
    common::give_to_agent(&dir.path().join("theirs"));
    (common::TestGateway::start_with(dir, &config), root)
}

#[test]
fn gateway_serves_ws_only_for_the_callers_workspaces() {
    let (gw, _root) = gateway_with_workspaces("");
    let mut agent = gw.connect();
    let list = agent.tool("ws__workers_list", json!({}));
    let workers = &list["result"]["structuredContent"]["workers"];
    assert_eq!(workers.as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(workers[0]["name"], "mine");
    let theirs = agent.tool(
        "ws__shell_run",
        json!({"worker": "theirs", "command": "true"}),
    );
    assert_eq!(
        theirs["result"]["structuredContent"]["error"]["code"],
        "worker_not_found"
    );
    let ran = agent.tool(
        "ws__shell_run",
        json!({"input": {"worker": "mine", "command": "echo hi"}}),
    );
    assert_eq!(
        ran["result"]["structuredContent"]["stdout"], "hi\n",
        "{ran}"
    );
    let rows = gw.wait_rows("three ws rows", |rows| {
        rows.iter().filter(|r| r["server_name"] == "ws").count() == 3
    });
    assert!(
        rows.iter()
            .all(|r| r["server_name"] != "ws" || r["decision"] != "pending")
    );
}

#[test]
fn policy_blocks_rm_rf_in_ws_shell_run_even_when_wrapped() {
    let (gw, root) = gateway_with_workspaces(
        r#"
[[policy.rules]]
id = "no-rm-rf"
action = "block"
tool = "ws__shell_run"
arg = { path = "command", matches = 'rm\s+-rf' }
reason = "no recursive deletes"
"#,
    );
    std::fs::write(root.join("keep"), "x").expect("write");
    let mut agent = gw.connect();
    for args in [
        json!({"worker": "mine", "command": "rm -rf keep"}),
        json!({"input": {"worker": "mine", "command": "rm -rf keep"}}),
    ] {
        let r = agent.tool("ws__shell_run", args);
        assert_eq!(
            r["result"]["structuredContent"]["error"]["code"], "policy_blocked",
            "{r}"
        );
    }
    assert!(root.join("keep").exists());
    let rows = gw.wait_rows("two denied rows", |rows| {
        rows.iter()
            .filter(|r| r["decision"] == "denied" && r["policy_rule"] == "no-rm-rf")
            .count()
            == 2
    });
    assert!(!rows.is_empty());
}

#[test]
fn a_task_survives_its_agents_disconnect() {
    let (gw, root) = gateway_with_workspaces("");
    let mut agent = gw.connect();
    let r = agent.tool(
        "ws__shell_run",
        json!({"worker": "mine", "command": "while [ ! -e go ]; do sleep 0.02; done; echo survived > out.txt", "timeout": 0.2}),
    );
    let task = r["result"]["structuredContent"]["task_id"]
        .as_str()
        .expect("running task")
        .to_owned();
    drop(agent);
    std::fs::write(root.join("go"), "").expect("go");
    let mut again = gw.connect();
    let done = again.tool(
        "ws__task_wait",
        json!({"worker": "mine", "task_id": task, "timeout": 60}),
    );
    assert_eq!(
        done["result"]["structuredContent"]["status"], "completed",
        "{done}"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("out.txt")).expect("out"),
        "survived\n"
    );
    let finished = gw.events("worker_event");
    assert!(
        finished
            .iter()
            .any(|e| e["detail"].as_str().unwrap_or("").contains("task_finished"))
    );
}

#[test]
fn a_healthy_workspace_worker_is_confined_in_status_health_and_a_live_reattestation() {
    // Fork and exec are the workspace's job: the one verdict must not count them as gaps.
    let (gw, _root) = gateway_with_workspaces("");
    let mut agent = gw.connect();
    let ran = agent.tool(
        "ws__shell_run",
        json!({"worker": "mine", "command": "true"}),
    );
    assert_eq!(ran["result"]["isError"], Value::Null, "{ran}");
    let status = gw.admin(json!({"op": "status"}));
    let workers = status["workers"].as_array().expect("workers");
    assert!(workers.iter().any(|w| w["role"] == "workspace"), "{status}");
    for w in workers {
        assert_eq!(w["confined"], true, "{w}");
        assert_eq!(w["gaps"], json!([]), "{w}");
    }
    let asked = gw.admin(json!({"op": "attest"}));
    assert_eq!(asked["asked"], workers.len(), "{asked}");
    let deadline = std::time::Instant::now() + common::PATIENCE;
    loop {
        let events = gw.events("worker_reattested");
        if events.len() == workers.len() {
            for e in events {
                let detail: Value = serde_json::from_str(e["detail"].as_str().unwrap()).unwrap();
                assert_eq!(detail["confined"], true, "{detail:#}");
            }
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not every worker re-attested"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A file call cancelled while it waits in the file tools' queue never runs, and the
/// worker says it ended (`cancelled`) so the gateway frees its place in the lane. Before,
/// the queued write ran anyway and nothing was sent for it.
#[test]
fn a_file_call_cancelled_in_the_queue_never_runs_and_ends_as_cancelled() {
    let tree = Tree::new();
    // Many short lines: a search keeps the one thread busy for a second or more.
    let lines = "a\n".repeat(1024 * 1024);
    for n in 0..12 {
        std::fs::write(tree.path(&format!("ws/f{n}.txt")), &lines).expect("write");
    }
    let mut w = Worker::start(tree.settings(|ws| {
        ws.threads = 1;
        ws.queue = 4;
        ws.scan_time_limit_ms = 3000;
    }));
    let name = w.settings.name.clone();
    let search = w.send(call_op(
        "file_search",
        json!({"worker": name, "pattern": "zzz"}),
    ));
    let write = w.send(call_op(
        "file_write",
        json!({"worker": name, "path": "cancelled.txt", "content": "ran"}),
    ));
    w.send(Op::Cancel { target: write });
    let mut ends = std::collections::HashMap::new();
    while ends.len() < 2 {
        if let Message::Response { id, error, .. } = w.recv() {
            ends.insert(id, error.map(|e| e.kind));
        }
    }
    assert_eq!(ends[&search], None, "the search is answered");
    assert_eq!(ends[&write].as_deref(), Some("cancelled"), "{ends:?}");
    assert!(
        !w.root().join("cancelled.txt").exists(),
        "the cancelled write never ran"
    );
}

/// A `call_tool` of the workspace worker's own `tool`.
fn call_op(tool: &str, args: Value) -> Op {
    Op::CallTool {
        tool: tool.to_owned(),
        args: args.to_string(),
        upstream: None,
    }
}
