//! The walls against a hostile program, tried as an attacker would: every command goes
//! through the real gateway (`toolwall serve`) and `ws__shell_run`, and each test checks
//! from outside that nothing happened. The gateway runs as this test process's user: root
//! here and in CI (the case where agent programs used to run as uid 0), or a service user
//! with the unit's capabilities under `tests/walls-as-service-user.sh`.
//!
//! Before the agent uid, the seccomp additions and the secret carve-outs, every one of
//! these attacks succeeded (checked against the base commit, see the commit message).

mod common;

use serde_json::{Value, json};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::TestGateway;

/// The agent user of the other workspace: workspaces that must not touch each other's file
/// metadata get a user each.
const OTHER_AGENT: &str = "toolwall-test-other";

/// A gateway with one workspace `mine` (owned by this uid) and another, `theirs` (its own
/// agent user), plus
/// a tools directory granted read-only that also holds a TLS key and an upstream token
/// (files any user may read: only the carve-outs keep them from agent programs).
struct Setup {
    gw: TestGateway,
    base: PathBuf,
    root: PathBuf,
}

fn uid() -> u32 {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() }
}

fn setup(workspace_extra: &str, extra: &str) -> Setup {
    setup_as(&common::agent_user(), workspace_extra, extra)
}

/// As [`setup`], with `mine` run as `user` (its `agent_user` is set when it is not the
/// default one).
fn setup_as(user: &toolwall::launcher::AgentIdentity, workspace_extra: &str, extra: &str) -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = std::fs::canonicalize(dir.path()).expect("canonical");
    for d in ["ws", "theirs", "tools/tls", "tools/tokens", "tools/bin"] {
        std::fs::create_dir_all(base.join(d)).expect("mkdir");
    }
    std::fs::write(base.join("theirs/notes.txt"), "theirs\n").expect("write");
    let key = base.join("tools/tls/key.pem");
    let cert = base.join("tools/tls/cert.pem");
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("cert");
    std::fs::write(&cert, made.cert.pem()).expect("cert");
    std::fs::write(&key, made.signing_key.serialize_pem()).expect("key");
    std::fs::write(base.join("tools/tokens/upstream"), "tok-0123456789\n").expect("token");
    for f in [&key, &cert, &base.join("tools/tokens/upstream")] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    }
    std::fs::write(base.join("tools/bin/hello"), "#!/bin/sh\necho hello\n").expect("tool");
    std::fs::set_permissions(
        base.join("tools/bin/hello"),
        std::fs::Permissions::from_mode(0o755),
    )
    .expect("chmod");
    common::give_to(&base.join("ws"), user);
    common::give_to(&base.join("theirs"), &common::ensure_user(OTHER_AGENT));
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let root = base.join("ws");
    // base_config opens [listen]; the HTTP door with TLS goes in that table.
    let config = common::base_config(&base, "");
    let config = config.replacen(
        "[listen]\n",
        &format!(
            "[listen]\nhttp = \"127.0.0.1:0\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\n",
            cert.display(),
            key.display()
        ),
        1,
    );
    let config = format!(
        r#"{config}
[gateway]
tool_call_timeout_secs = 20

[workspaces.mine]
root = "{root}"
owners = ["uid:{uid}"]
read_only_paths = ["{tools}"]
{agent_user}
{workspace_extra}

[workspaces.theirs]
root = "{base}/theirs"
owners = ["uid:4242424"]
agent_user = "{other}"

[servers.upstream]
url = "http://127.0.0.1:9/mcp"
bearer_token_file = "{base}/tools/tokens/upstream"
enabled = false

{extra}
"#,
        root = root.display(),
        uid = uid(),
        tools = base.join("tools").display(),
        base = base.display(),
        other = common::ensure_user(OTHER_AGENT).name,
        agent_user = if user.name == toolwall::launcher::DEFAULT_AGENT_USER {
            String::new()
        } else {
            format!("agent_user = \"{}\"", user.name)
        },
    );
    let gw = TestGateway::start_with(dir, &config);
    Setup { gw, base, root }
}

impl Setup {
    fn agent(&self) -> common::FramedClient {
        self.gw.connect()
    }

    /// Runs a command in `mine` to its end; returns the structured result.
    fn sh(&self, command: &str) -> Value {
        let mut agent = self.agent();
        let r = agent.tool(
            "ws__shell_run",
            json!({"worker": "mine", "command": command, "timeout": 60}),
        );
        let s = r["result"]["structuredContent"].clone();
        assert!(
            s["status"] == "completed" || s["status"] == "failed",
            "{command}: {r}"
        );
        s
    }
}

fn refused(r: &Value) -> bool {
    let err = r["stderr"].as_str().unwrap_or_default();
    r["status"] == "failed"
        && (err.contains("Permission denied") || err.contains("Operation not permitted"))
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).expect("stat").mode() & 0o7777
}

fn mtime(p: &Path) -> i64 {
    std::fs::symlink_metadata(p).expect("stat").mtime()
}

#[test]
fn agent_programs_run_as_the_agent_user_never_as_root_or_toolwall() {
    let s = setup("", "");
    let agent = common::agent_user();
    let r = s.sh("id -u; id -g; id -G");
    assert_eq!(
        r["stdout"],
        format!("{}\n{}\n{}\n", agent.uid, agent.gid, agent.gid),
        "{r}"
    );
    assert_ne!(agent.uid, uid());
    // Files made by commands and by the file tools alike belong to the agent user.
    let made = s.sh("echo x > by_shell.txt");
    assert_eq!(made["status"], "completed", "{made}");
    let mut client = s.agent();
    let w = client.tool(
        "ws__file_write",
        json!({"worker": "mine", "path": "by_tool.txt", "content": "y"}),
    );
    assert!(w["result"].get("isError").is_none(), "{w}");
    for f in ["by_shell.txt", "by_tool.txt"] {
        assert_eq!(
            std::fs::metadata(s.root.join(f)).expect("stat").uid(),
            agent.uid,
            "{f}"
        );
    }
    // Status names the user agent programs run as.
    let status = s.gw.admin(json!({"op": "status"}));
    assert_eq!(status["agents"]["mode"], "agent_user", "{status}");
    assert_eq!(status["agents"]["users"][0]["uid"], agent.uid, "{status}");
    let text = s.gw.cli(&["status"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!("agent programs: run as {}", agent.name)),
        "{text}"
    );
}

#[test]
fn metadata_of_toolwalls_files_and_other_workspaces_cannot_change() {
    let s = setup("", "");
    let state = s.base.join("state");
    let admin = s.base.join("admin.sock");
    let theirs = s.base.join("theirs");
    let before = [
        (state.clone(), mode(&state), mtime(&state)),
        (admin.clone(), mode(&admin), mtime(&admin)),
        (theirs.clone(), mode(&theirs), mtime(&theirs)),
    ];
    let attempts = [
        format!("chmod 0777 {}", state.display()),
        format!("chmod 0777 {}", admin.display()),
        format!("chmod 000 {}", theirs.display()),
        format!("touch -h -d 2001-01-01 {}", state.display()),
        format!("touch -h -d 2001-01-01 {}", admin.display()),
        format!(
            "python3 -c 'import os; os.setxattr(\"{}\", \"user.x\", b\"1\")'",
            theirs.display()
        ),
    ];
    for a in &attempts {
        let r = s.sh(a);
        assert!(refused(&r), "{a} was not refused: {r}");
    }
    for (path, m, t) in before {
        assert_eq!(mode(&path), m, "{}", path.display());
        assert_eq!(mtime(&path), t, "{}", path.display());
    }
}

#[test]
fn no_set_user_id_file_can_be_made_in_the_root() {
    let s = setup("", "");
    let attempts = [
        "cp /usr/bin/id ./id_copy && chmod 4755 ./id_copy",
        "cp /usr/bin/id ./id_gid && chmod g+s ./id_gid",
        "install -m 4755 /usr/bin/id ./id_installed",
        "python3 -c 'import os; os.close(os.open(\"made_setuid\", os.O_CREAT | os.O_WRONLY, 0o4755))'",
    ];
    for a in attempts {
        let r = s.sh(a);
        assert!(refused(&r), "{a} was not refused: {r}");
    }
    for entry in std::fs::read_dir(&s.root).expect("read_dir") {
        let path = entry.expect("entry").path();
        assert_eq!(
            mode(&path) & 0o6000,
            0,
            "{} has a set-id bit",
            path.display()
        );
    }
    // And the copy, run by another user, is no one but that user.
    let copy = s.root.join("id_copy");
    if copy.exists() {
        let out = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&copy)
            .arg("-u")
            .output()
            .expect("setpriv");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "65534");
    }
    // chmod +x still works: that is how scripts run.
    let r = s.sh("printf '#!/bin/sh\\necho ran\\n' > run.sh && chmod +x run.sh && ./run.sh");
    assert_eq!(r["stdout"], "ran\n", "{r}");
}

/// A System V segment of another process, readable and writable by everyone.
#[test]
fn system_v_ipc_of_other_processes_is_out_of_reach() {
    let s = setup("", "");
    let key: libc::key_t = 0x7457_0000 | (std::process::id() as libc::key_t & 0xffff);
    // SAFETY: a fresh segment of ours, removed at the end.
    let id = unsafe { libc::shmget(key, 4096, libc::IPC_CREAT | libc::IPC_EXCL | 0o666) };
    assert!(id >= 0, "shmget: {}", std::io::Error::last_os_error());
    // SAFETY: attaching our own segment, writing within it, detaching.
    unsafe {
        let at = libc::shmat(id, std::ptr::null(), 0);
        assert_ne!(at as isize, -1);
        std::ptr::copy_nonoverlapping(b"secret".as_ptr(), at.cast::<u8>(), 6);
        libc::shmdt(at);
    }
    let read = format!(
        "perl -e '$id = shmget({key}, 0, 0); defined $id or die \"shmget: $!\\n\"; shmread($id, $b, 0, 6) or die \"shmread: $!\\n\"; print $b'"
    );
    let write = format!(
        "perl -e '$id = shmget({key}, 0, 0); defined $id or die \"shmget: $!\\n\"; shmwrite($id, \"HACKED\", 0, 6) or die \"shmwrite: $!\\n\"'"
    );
    let queue = "perl -e 'use IPC::SysV qw(IPC_PRIVATE IPC_CREAT); defined msgget(IPC_PRIVATE, IPC_CREAT | 0600) or die \"msgget: $!\\n\"'";
    let sem = "perl -e 'use IPC::SysV qw(IPC_PRIVATE IPC_CREAT); defined semget(IPC_PRIVATE, 1, IPC_CREAT | 0600) or die \"semget: $!\\n\"'";
    let results: Vec<(String, Value)> = [read, write, queue.to_string(), sem.to_string()]
        .into_iter()
        .map(|c| {
            let r = s.sh(&c);
            (c, r)
        })
        .collect();
    let mut content = [0u8; 6];
    // SAFETY: attaching our own segment to read it, then removing it.
    unsafe {
        let at = libc::shmat(id, std::ptr::null(), 0);
        std::ptr::copy_nonoverlapping(at.cast::<u8>(), content.as_mut_ptr(), 6);
        libc::shmdt(at);
        libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut());
    }
    for (c, r) in &results {
        assert!(refused(r), "{c} was not refused: {r}");
    }
    assert_eq!(&content, b"secret");
}

#[test]
fn listen_without_bind_is_refused_even_with_network_ports() {
    let s = setup("network = [80]", "");
    let r = s
        .sh("python3 -c 'import socket; s = socket.socket(); s.listen(1); print(s.getsockname())'");
    assert!(refused(&r), "listen was not refused: {r}");
    // Connecting out to a granted port still works as before (a refused connection is
    // the network answering, not the sandbox).
    let out = s.sh(
        "python3 -c 'import socket\ntry:\n socket.create_connection((\"127.0.0.1\", 80), 2)\nexcept ConnectionRefusedError:\n print(\"refused by the network\")'",
    );
    assert_eq!(out["status"], "completed", "{out}");
}

#[test]
fn no_secret_the_config_names_can_be_read_by_any_means() {
    let s = setup("", "");
    let tools = s.base.join("tools");
    let targets = [
        tools.join("tls/key.pem"),
        tools.join("tls/cert.pem"),
        tools.join("tokens/upstream"),
        s.base.join("toolwall.toml"),
        s.base.join("state/ledger.db"),
        s.base.join("state"),
    ];
    for t in &targets {
        // A directory is listed, a file read; `stat` is not covered (a known limit).
        let ways: &[&str] = if t.is_dir() {
            &["ls", "find"]
        } else {
            &["cat", "base64", "head -c 1"]
        };
        for how in ways {
            let c = format!("{how} {}", t.display());
            let r = s.sh(&c);
            assert!(refused(&r), "{c} was not refused: {r}");
            assert!(
                !r["stdout"].as_str().unwrap_or_default().contains("PRIVATE"),
                "{r}"
            );
        }
    }
    // The rest of the read-only tree stays readable and runnable.
    let ok = s.sh(&format!("{}", tools.join("bin/hello").display()));
    assert_eq!(ok["stdout"], "hello\n", "{ok}");
    // Every worker proved it, one probe per secret.
    let status = s.gw.admin(json!({"op": "status"}));
    for w in status["workers"].as_array().expect("workers") {
        let probes = w["confinement"]["probes"].as_array().expect("probes");
        for what in [
            "tls_key",
            "tls_cert",
            "bearer_token_file:upstream",
            "ledger",
            "config",
        ] {
            let name = format!("read_secret:{what}");
            let p = probes
                .iter()
                .find(|p| p["name"] == name.as_str())
                .unwrap_or_else(|| panic!("{} has no probe {name}: {w}", w["name"]));
            assert_eq!(p["denied"], true, "{p}");
        }
    }
}

#[test]
fn root_only_files_in_etc_are_not_readable() {
    let s = setup("", "");
    // A file in /etc no one but its owner may read, and not among the profile's hidden
    // paths: the uid switch, not Landlock, keeps it.
    let hidden = [
        "/etc/shadow",
        "/etc/gshadow",
        "/etc/shadow-",
        "/etc/gshadow-",
    ];
    let mut candidates = Vec::new();
    for dir in ["/etc", "/etc/security"] {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if let Ok(m) = std::fs::symlink_metadata(&p)
                && m.is_file()
                && m.uid() == 0
                && m.mode() & 0o044 == 0
                && !hidden.contains(&p.to_str().unwrap_or_default())
            {
                candidates.push(p);
            }
        }
    }
    if candidates.is_empty() {
        eprintln!("SKIPPED: no root-only file in /etc or /etc/security on this machine");
        return;
    }
    for p in candidates.iter().take(5) {
        let c = format!("cat {}", p.display());
        let r = s.sh(&c);
        assert!(refused(&r), "{c} was not refused: {r}");
    }
}

#[test]
fn inotify_on_toolwalls_state_is_refused() {
    let s = setup("", "");
    let c = format!(
        "python3 -c '
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
if fd < 0:
    raise SystemExit(\"inotify_init1: \" + os.strerror(ctypes.get_errno()))
wd = libc.inotify_add_watch(fd, b\"{}\", 0xfff)
if wd < 0:
    raise SystemExit(\"inotify_add_watch: \" + os.strerror(ctypes.get_errno()))
print(\"watching\")
'",
        s.base.join("state").display()
    );
    let r = s.sh(&c);
    assert!(refused(&r), "{r}");
}

#[test]
fn file_read_of_a_fifo_or_device_answers_at_once() {
    let s = setup("", "");
    let made = s.sh("mkfifo pipe && ln -s /dev/zero zero_link");
    assert_eq!(made["status"], "completed", "{made}");
    let mut client = s.agent();
    let started = Instant::now();
    let r = client.tool("ws__file_read", json!({"worker": "mine", "path": "pipe"}));
    let took = started.elapsed();
    let e = &r["result"]["structuredContent"]["error"];
    assert_eq!(e["code"], "not_regular_file", "{r}");
    assert!(
        e["message"].as_str().unwrap_or_default().contains("FIFO"),
        "{r}"
    );
    // Bounded by the gateway's tool timeout (20 s) had it blocked; never asserted as a
    // speed, only that it did not wait for the timeout.
    assert!(took < Duration::from_secs(15), "{took:?}");
    for tool in ["ws__file_edit", "ws__file_search"] {
        let args = if tool == "ws__file_edit" {
            json!({"worker": "mine", "path": "pipe", "operations": [{"old": "a", "new": "b"}]})
        } else {
            json!({"worker": "mine", "pattern": "x"})
        };
        let r = client.tool(tool, args);
        assert!(r.get("result").is_some(), "{tool}: {r}");
    }
    // Regular files still read.
    let w = s.sh("echo hi > plain.txt");
    assert_eq!(w["status"], "completed");
    let r = client.tool(
        "ws__file_read",
        json!({"worker": "mine", "path": "plain.txt"}),
    );
    assert_eq!(r["result"]["structuredContent"]["content"], "hi\n", "{r}");
}

#[test]
fn a_syscall_number_with_the_x32_bit_is_refused() {
    let s = setup("", "");
    // getpid's number with the x32 bit: EPERM from the filter; a kernel without x32
    // would say ENOSYS, one with it would run it.
    let r = s.sh("python3 -c '
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
r = libc.syscall(0x40000000 | 39)
print(r, os.strerror(ctypes.get_errno()))
'");
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["stdout"], "-1 Operation not permitted\n", "{r}");
    // unshare by its x32 number, likewise.
    let r = s.sh("python3 -c '
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print(libc.syscall(0x40000000 | 272, 0x10000000), os.strerror(ctypes.get_errno()))
'");
    assert_eq!(r["stdout"], "-1 Operation not permitted\n", "{r}");
}

/// Forks until the kernel refuses; prints how many children it got, then lets the task's
/// end take them all.
const FORK_BOMB: &str = "python3 -c '
import os, time
n = 0
for i in range(200):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    n += 1
print(n)
'";

#[test]
fn a_fork_bomb_stops_at_the_process_limit_of_the_agent_user() {
    // Its own agent user: RLIMIT_NPROC counts every process and thread of the user, and
    // other tests' workers run as the shared one.
    let user = common::ensure_user("toolwall-test-nproc");
    let s = setup_as(&user, "task_max_processes = 50", "");
    let r = s.sh(FORK_BOMB);
    let started: u32 = r["stdout"]
        .as_str()
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{r}"));
    // 50 processes of the agent user, the worker's threads, the task's leader and the
    // interpreter among them.
    assert!(
        started < 50,
        "{started} children against a limit of 50: {r}"
    );
    assert!(started > 0, "{r}");
}

#[test]
fn a_fork_bomb_and_a_memory_hog_stop_at_their_cgroup() {
    let probe = setup("", "");
    let status = probe.gw.admin(json!({"op": "status"}));
    let cgroups = status["agents"]["cgroups"].clone();
    let text = String::from_utf8_lossy(&probe.gw.cli(&["status"]).stdout).into_owned();
    drop(probe);
    if cgroups["in_force"] != true {
        // Status says so, and the test cannot run here.
        assert!(text.contains("cgroups: NOT in force"), "{text}");
        eprintln!(
            "\n\n*** SKIPPED: cgroup limits are not in force here ({}). The fork bomb and memory hog tests need a delegated cgroup v2 (systemd Delegate=yes with the pids and memory controllers). ***\n\n",
            cgroups["reason"]
        );
        return;
    }
    let s = setup(
        "pids_max = 60\nmemory_max_bytes = 134217728\ntask_max_processes = 30\ntask_memory_max_bytes = 67108864",
        "",
    );
    let text = String::from_utf8_lossy(&s.gw.cli(&["status"]).stdout).into_owned();
    assert!(text.contains("pids.max 60"), "{text}");
    let bomb = s.sh(FORK_BOMB);
    let started: u32 = bomb["stdout"]
        .as_str()
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{bomb}"));
    assert!(
        started < 30,
        "{started} children in a task limited to 30: {bomb}"
    );
    let hog = s.sh("python3 -c 'b = bytearray(512 * 1024 * 1024); print(len(b))'");
    assert_eq!(hog["status"], "failed", "{hog}");
    // The workspace lives on.
    let ok = s.sh("echo alive");
    assert_eq!(ok["stdout"], "alive\n", "{ok}");
}

/// The walls leave the work possible: a small project built inside the root, as an agent
/// would (git, chmod +x, Python, npm), with the file tools alongside.
#[test]
fn the_workspace_tools_still_build_a_small_project() {
    let s = setup("", "");
    let mut client = s.agent();
    let w = client.tool(
        "ws__file_write",
        json!({"worker": "mine", "path": "app/main.py", "create_dirs": true,
               "content": "import sys\nprint('sum', sum(int(a) for a in sys.argv[1:]))\n"}),
    );
    assert!(w["result"].get("isError").is_none(), "{w}");
    let steps = [
        (
            "git init",
            "git init -q . && git config user.email agent@example.com && git config user.name agent",
        ),
        (
            "a script",
            "printf '#!/bin/sh\\npython3 app/main.py \"$@\"\\n' > run.sh && chmod +x run.sh && ./run.sh 1 2 3",
        ),
        (
            "git add and commit",
            "git add -A && git commit -q -m 'first' && git log --oneline | wc -l",
        ),
        (
            "a Python module",
            "mkdir -p pkg && echo 'def f(): return 42' > pkg/__init__.py && python3 -c 'import pkg; print(pkg.f())'",
        ),
        (
            "a temp file",
            "t=$(mktemp) && echo ok > \"$t\" && cat \"$t\" && rm \"$t\"",
        ),
        (
            "git status after an edit",
            "echo more >> run.sh && git status --short run.sh",
        ),
    ];
    let mut outputs = Vec::new();
    for (what, command) in steps {
        let r = s.sh(command);
        assert_eq!(r["status"], "completed", "{what}: {r}");
        outputs.push(r["stdout"].as_str().unwrap_or_default().to_string());
    }
    assert_eq!(outputs[1], "sum 6\n");
    assert_eq!(outputs[2].trim(), "1");
    assert_eq!(outputs[3], "42\n");
    assert_eq!(outputs[4], "ok\n");
    assert_eq!(outputs[5], " M run.sh\n");
    let mode = std::fs::metadata(s.root.join("run.sh"))
        .expect("stat")
        .mode();
    assert_eq!(mode & 0o111, 0o111, "{mode:o}");
    // npm, where installed: a package and one of its scripts, offline.
    if std::path::Path::new("/usr/bin/npm").exists() {
        let r = s.sh(
            "npm init -y >/dev/null && npm pkg set scripts.hello='node -e \"console.log(6*7)\"' && npm run -s hello",
        );
        assert_eq!(r["status"], "completed", "{r}");
        assert_eq!(r["stdout"], "42\n", "{r}");
    } else {
        eprintln!("SKIPPED npm: /usr/bin/npm is not installed");
    }
    // The file tools see what the commands made.
    let read = client.tool("ws__file_read", json!({"worker": "mine", "path": "run.sh"}));
    assert!(
        read["result"]["structuredContent"]["content"]
            .as_str()
            .unwrap_or_default()
            .starts_with("#!/bin/sh"),
        "{read}"
    );
}

#[test]
fn xattrs_dnotify_datagrams_and_abstract_names_are_refused() {
    // Found by an attack run: Landlock does not cover these outside the root.
    let s = setup("", "");
    let outside = s.base.join("world-writable.txt");
    std::fs::write(&outside, "x").expect("write");
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let dgram = s.base.join("host-dgram.sock");
    let listener = std::os::unix::net::UnixDatagram::bind(&dgram).expect("bind");
    std::fs::set_permissions(&dgram, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    listener.set_nonblocking(true).expect("nonblocking");
    let c = format!(
        "python3 -c '
import os, socket, fcntl
results = []
try:
    os.setxattr(\"{outside}\", \"user.tw\", b\"pwned\")
    results.append(\"setxattr\")
except OSError:
    pass
try:
    fd = os.open(\"/usr/share\", os.O_RDONLY | os.O_DIRECTORY)
    fcntl.fcntl(fd, 1026, 0x80000004)
    results.append(\"dnotify\")
except OSError:
    pass
try:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.sendto(b\"forged\", \"{dgram}\")
    results.append(\"dgram\")
except OSError:
    pass
try:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.bind(\"\\0toolwall-squat\")
    results.append(\"abstract\")
except OSError:
    pass
print(\"done\", results)
'",
        outside = outside.display(),
        dgram = dgram.display()
    );
    let r = s.sh(&c);
    assert_eq!(r["stdout"].as_str().map(str::trim), Some("done []"), "{r}");
    let mut buf = [0u8; 64];
    assert!(listener.recv(&mut buf).is_err(), "a datagram arrived");
    // A stream pair still works (event loops use them).
    let ok = s.sh(
        "python3 -c 'import socket; a, b = socket.socketpair(); a.send(b\"x\"); print(b.recv(1))'",
    );
    assert_eq!(ok["stdout"].as_str().map(str::trim), Some("b'x'"), "{ok}");
}
