//! toolwall run as a non-root service user, as `systemd/toolwall.service` runs it
//! (`User=toolwall`, `AmbientCapabilities=CAP_SETUID CAP_SETGID CAP_SETPCAP`), emulated with
//! `setpriv`; and as a plain user without those capabilities. Needs root to set that up
//! (the tests run as root here and in CI).

mod common;

use serde_json::{Value, json};
use std::os::unix::fs::MetadataExt;

use common::{SERVICE_CAPS, TestGateway};

const SERVICE_USER: &str = "toolwall-test-svc";

/// The capability sets of a process, from /proc.
fn caps(pid: u64) -> [(String, u64); 5] {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let field = |name: &str| {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} missing"));
        let hex = line.split_whitespace().nth(1).expect("value");
        u64::from_str_radix(hex, 16).expect("hex")
    };
    ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"].map(|n| (n.to_string(), field(n)))
}

fn uid_of(pid: u64) -> u32 {
    std::fs::metadata(format!("/proc/{pid}"))
        .expect("proc")
        .uid()
}

/// A gateway with one workspace owned by this process's uid, run as `user` holding
/// `keep` (setpriv capability list, empty for none).
fn gateway(
    user: &toolwall::launcher::AgentIdentity,
    keep: &str,
    extra: &str,
    root_owner: &toolwall::launcher::AgentIdentity,
    ready_line: &'static str,
) -> TestGateway {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = std::fs::canonicalize(dir.path()).expect("canonical");
    let root = base.join("ws");
    std::fs::create_dir(&root).expect("mkdir");
    // SAFETY: getuid cannot fail.
    let me = unsafe { libc::getuid() };
    let config = common::base_config(
        &base,
        &format!(
            "{extra}\n[workspaces.mine]\nroot = \"{}\"\nowners = [\"uid:{me}\"]\n",
            root.display()
        ),
    );
    common::give_to(&root, root_owner);
    TestGateway::start_until(
        dir,
        &config,
        Some((user.clone(), keep.to_string())),
        ready_line,
    )
}

fn status(gw: &TestGateway) -> Value {
    gw.admin(json!({"op": "status"}))
}

fn worker<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["workers"]
        .as_array()
        .and_then(|w| w.iter().find(|w| w["name"] == name))
        .unwrap_or_else(|| panic!("no worker {name}: {status}"))
}

/// Waits until the workspace worker is ready (its root was handed over after start).
fn ready_workspace(gw: &TestGateway) -> Value {
    let deadline = std::time::Instant::now() + common::PATIENCE * 3;
    loop {
        let s = status(gw);
        if worker(&s, "workspace:mine")["state"] == "ready" {
            return s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never ready: {s}\n{}",
            gw.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn under_the_units_capabilities_only_the_launcher_keeps_any_and_agents_are_not_toolwall() {
    let svc = common::ensure_user(SERVICE_USER);
    let agent = common::agent_user();
    let gw = gateway(&svc, SERVICE_CAPS, "", &agent, "info: ready");
    let s = ready_workspace(&gw);
    assert_eq!(s["agents"]["mode"], "agent_user", "{s}");
    // The gateway runs as the service user and holds nothing, not even a bounding set.
    let gateway_pid = u64::from(gw.pid());
    assert_eq!(uid_of(gateway_pid), svc.uid);
    for (set, value) in caps(gateway_pid) {
        assert_eq!(value, 0, "gateway {set}");
    }
    // The launcher keeps CAP_SETUID, CAP_SETGID, CAP_SETPCAP: bits 6, 7, 8.
    let launcher = s["agents"]["launcher_pid"].as_u64().expect("launcher pid");
    let held = caps(launcher);
    assert_eq!(held[1].1, 0x1c0, "launcher {held:?}");
    assert_eq!(held[3].1, 0x1c0, "launcher {held:?}");
    assert_eq!(held[4].1, 0, "launcher ambient {held:?}");
    // Every worker holds nothing, bounding set included; the builtin runs as the service
    // user, the workspace as the agent user.
    for (name, uid) in [("builtin", svc.uid), ("workspace:mine", agent.uid)] {
        let w = worker(&s, name);
        let pid = w["pid"].as_u64().expect("pid");
        assert_eq!(uid_of(pid), uid, "{name}");
        for (set, value) in caps(pid) {
            assert_eq!(value, 0, "{name} {set}");
        }
        assert_eq!(w["confinement"]["bounding_set_cleared"], true, "{w}");
    }
    // The state belongs to the service user, and agent programs cannot touch it: the
    // attack that reached it when agent programs ran as toolwall.
    let state = gw.dir.path().join("state");
    assert_eq!(std::fs::metadata(&state).expect("state").uid(), svc.uid);
    let mode_before = std::fs::metadata(&state).expect("state").mode();
    let mut client = gw.connect();
    for command in [
        format!("chmod 0777 {}", state.display()),
        format!("touch -h -d 2001-01-01 {}", gw.admin.display()),
        format!("cat {}", gw.ledger.display()),
    ] {
        let r = client.tool(
            "ws__shell_run",
            json!({"worker": "mine", "command": command}),
        );
        let r = &r["result"]["structuredContent"];
        assert_eq!(r["status"], "failed", "{command}: {r}");
    }
    assert_eq!(
        std::fs::metadata(&state).expect("state").mode(),
        mode_before
    );
    let id = client.tool(
        "ws__shell_run",
        json!({"worker": "mine", "command": "id -u"}),
    );
    assert_eq!(
        id["result"]["structuredContent"]["stdout"],
        format!("{}\n", agent.uid)
    );
}

#[test]
fn without_the_capabilities_workspaces_stay_offline_and_say_why() {
    let svc = common::ensure_user(SERVICE_USER);
    let gw = gateway(
        &svc,
        "",
        "",
        &common::agent_user(),
        "serving agents while a worker is down",
    );
    let s = status(&gw);
    assert_eq!(s["agents"]["mode"], "refused", "{s}");
    let detail = s["agents"]["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("CAP_SETUID"), "{detail}");
    assert!(detail.contains("run_agents_as_gateway_user"), "{detail}");
    let w = worker(&s, "workspace:mine");
    assert_eq!(w["state"], "down", "{w}");
    assert!(
        w["last_exit"]
            .as_str()
            .unwrap_or_default()
            .contains("CAP_SETUID"),
        "{w}"
    );
    let mut client = gw.connect();
    let r = client.tool(
        "ws__shell_run",
        json!({"worker": "mine", "command": "id -u"}),
    );
    assert_eq!(
        r["result"]["structuredContent"]["error"]["code"], "worker_offline",
        "{r}"
    );
    // The rest of the gateway serves.
    let echo = client.tool("local__echo", json!({"text": "still here"}));
    assert!(echo.to_string().contains("still here"), "{echo}");
    let text = String::from_utf8_lossy(&gw.cli(&["status"]).stdout).into_owned();
    assert!(
        text.contains("agent programs: REFUSED (workspaces offline)"),
        "{text}"
    );
}

#[test]
fn run_agents_as_gateway_user_runs_them_as_toolwall_and_says_so_loudly() {
    let svc = common::ensure_user(SERVICE_USER);
    // The root must be the service user's in this mode.
    let gw = gateway(
        &svc,
        "",
        "[sandbox]\nrun_agents_as_gateway_user = true\n",
        &svc,
        "info: ready",
    );
    let s = ready_workspace(&gw);
    assert_eq!(s["agents"]["mode"], "gateway_user", "{s}");
    let w = worker(&s, "workspace:mine");
    let warnings = w["warnings"].to_string();
    assert!(warnings.contains("run_as_gateway_user"), "{w}");
    assert!(warnings.contains("configured exception"), "{w}");
    let mut client = gw.connect();
    let id = client.tool(
        "ws__shell_run",
        json!({"worker": "mine", "command": "id -u"}),
    );
    assert_eq!(
        id["result"]["structuredContent"]["stdout"],
        format!("{}\n", svc.uid),
        "{id}"
    );
    let text = String::from_utf8_lossy(&gw.cli(&["status"]).stdout).into_owned();
    assert!(text.contains("AS TOOLWALL'S OWN USER"), "{text}");
}
