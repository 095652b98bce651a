//! The files in systemd/ and examples/: systemd's own checks of the units, the security
//! exposure, the units agreeing with the example configs and with the daemon's door names,
//! and the install script's dry run.

#[path = "common/deps.rs"]
mod deps;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use toolwall::config::Config;
use toolwall::systemd::{
    DOOR_HTTP, DOOR_UNIX, DOOR_VSOCK, InheritedSocket, SocketKind, match_listeners,
    wanted_listeners,
};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `Key=Value` lines of a unit file, by key, in order (sections are not told apart: no key
/// used here appears in two sections).
fn unit(name: &str) -> BTreeMap<String, Vec<String>> {
    let text = std::fs::read_to_string(repo().join("systemd").join(name)).unwrap();
    let mut keys: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with('[') {
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("{name}: not a Key=Value line: {line}"));
        keys.entry(key.to_string())
            .or_default()
            .push(value.to_string());
    }
    keys
}

fn one<'a>(keys: &'a BTreeMap<String, Vec<String>>, key: &str) -> &'a str {
    match keys.get(key).map(Vec::as_slice) {
        Some([value]) => value,
        other => panic!("{key}: expected one value, found {other:?}"),
    }
}

fn seconds(value: &str) -> u64 {
    value
        .strip_suffix('s')
        .unwrap_or(value)
        .parse()
        .unwrap_or_else(|_| panic!("{value} is not a number of seconds"))
}

fn run_script(script: &str, args: &[&str]) -> (bool, String) {
    deps::ensure(&["systemd"]);
    let out = Command::new(repo().join("systemd").join(script))
        .args(args)
        .env("TOOLWALL_BIN", env!("CARGO_BIN_EXE_toolwall"))
        .output()
        .unwrap_or_else(|e| panic!("{script}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

// ---- systemd's own checks ------------------------------------------------------------------

#[test]
fn systemd_analyze_verify_is_clean() {
    let (ok, out) = run_script("verify.sh", &[]);
    assert!(ok, "{out}");
    assert!(out.contains("4 units clean"), "{out}");
}

#[test]
fn security_exposure_is_at_most_2_0() {
    let (ok, out) = run_script("check-security.sh", &[]);
    assert!(ok, "{out}");
    let figure: f64 = out
        .lines()
        .find_map(|l| l.strip_prefix("exposure of systemd/toolwall.service: "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no figure in: {out}"));
    assert!(figure <= 2.0, "{out}");
    // The check fails above its limit.
    let (ok, out) = run_script("check-security.sh", &["0.0"]);
    assert!(!ok && out.contains("is above 0.0"), "{out}");
}

// ---- what the service promises -------------------------------------------------------------

#[test]
fn service_lifecycle_settings() {
    let s = unit("toolwall.service");
    assert_eq!(one(&s, "Type"), "notify");
    assert_eq!(one(&s, "NotifyAccess"), "main");
    assert_eq!(
        one(&s, "ExecStart"),
        "/usr/bin/toolwall serve --config /etc/toolwall/toolwall.toml"
    );
    assert_eq!(one(&s, "ExecReload"), "/bin/kill -HUP $MAINPID");
    assert_eq!(one(&s, "Restart"), "on-failure");
    assert_eq!(seconds(one(&s, "WatchdogSec")), 30);
    assert_eq!(one(&s, "KillMode"), "mixed");
    assert_eq!(one(&s, "StateDirectory"), "toolwall");
    assert_eq!(one(&s, "RuntimeDirectory"), "toolwall");
    assert_eq!(one(&s, "RuntimeDirectoryPreserve"), "yes");
    assert_eq!(one(&s, "User"), "toolwall");
    assert_eq!(one(&s, "UMask"), "0077");
    // Drain (default 30 s) plus refusing, committing and stopping the workers fits.
    let drain = toolwall::config::GatewayConfig::default().drain_secs;
    assert!(seconds(one(&s, "TimeoutStopSec")) >= drain + 10);
}

#[test]
fn service_sandbox_settings() {
    let s = unit("toolwall.service");
    for (key, value) in [
        ("NoNewPrivileges", "yes"),
        // Exactly what the agent launcher needs to switch to the agent user, and to empty
        // the bounding set of what it starts; the gateway drops them at start.
        ("CapabilityBoundingSet", "CAP_SETUID CAP_SETGID CAP_SETPCAP"),
        ("AmbientCapabilities", "CAP_SETUID CAP_SETGID CAP_SETPCAP"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateDevices", "yes"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectKernelLogs", "yes"),
        ("ProtectControlGroups", "yes"),
        ("ProtectClock", "yes"),
        ("ProtectHostname", "yes"),
        ("ProtectProc", "invisible"),
        ("ProcSubset", "pid"),
        (
            "RestrictAddressFamilies",
            "AF_UNIX AF_INET AF_INET6 AF_VSOCK",
        ),
        ("RestrictNamespaces", "yes"),
        ("LockPersonality", "yes"),
        ("MemoryDenyWriteExecute", "yes"),
        ("RestrictRealtime", "yes"),
        ("RestrictSUIDSGID", "yes"),
        ("SystemCallArchitectures", "native"),
    ] {
        assert_eq!(one(&s, key), value, "{key}");
    }
    // Workers confine themselves under the service's filter: Landlock and seccomp allowed.
    let filter = s["SystemCallFilter"].join(" ");
    for call in [
        "@system-service",
        "landlock_create_ruleset",
        "landlock_add_rule",
        "landlock_restrict_self",
        "seccomp",
        "capset",
        "@setuid",
    ] {
        assert!(
            filter.split_whitespace().any(|w| w == call),
            "{call} missing from {filter}"
        );
    }
    assert!(s["SystemCallFilter"][0].starts_with("@system-service"));
    // Left out on purpose (each with its reason in the file).
    for key in [
        "PrivateNetwork",
        "PrivateUsers",
        "IPAddressDeny",
        "DynamicUser",
    ] {
        assert!(!s.contains_key(key), "{key} is set");
    }
}

/// The socket units, the door names the daemon matches, and the example configs agree.
#[test]
fn socket_units_name_the_doors_the_daemon_knows() {
    let mut passed = Vec::new();
    for (name, door) in [
        ("toolwall.socket", DOOR_UNIX),
        ("toolwall-vsock.socket", DOOR_VSOCK),
        ("toolwall-http.socket", DOOR_HTTP),
    ] {
        let s = unit(name);
        assert_eq!(one(&s, "FileDescriptorName"), door, "{name}");
        assert_eq!(one(&s, "Service"), "toolwall.service", "{name}");
        let listen = one(&s, "ListenStream");
        passed.push((door, listen.to_string()));
    }
    assert_eq!(
        passed,
        vec![
            (DOOR_UNIX, "/run/toolwall/mcp.sock".to_string()),
            (DOOR_VSOCK, "vsock::5002".to_string()),
            (DOOR_HTTP, "127.0.0.1:9210".to_string()),
        ]
    );
    let unix = unit("toolwall.socket");
    assert_eq!(one(&unix, "SocketMode"), "0660");
    assert_eq!(one(&unix, "SocketGroup"), "toolwall");
}

/// What systemd would pass for the shipped socket units, as the kernel would describe it.
fn shipped_sockets() -> Vec<InheritedSocket> {
    let devnull = || std::fs::File::open("/dev/null").unwrap().into();
    vec![
        InheritedSocket {
            fd: devnull(),
            name: DOOR_UNIX.into(),
            kind: SocketKind::Unix {
                path: "/run/toolwall/mcp.sock".into(),
            },
        },
        InheritedSocket {
            fd: devnull(),
            name: DOOR_VSOCK.into(),
            kind: SocketKind::Vsock {
                cid: u32::MAX,
                port: 5002,
            },
        },
    ]
}

// ---- the example configs -------------------------------------------------------------------

fn check_service_paths(config: &Config, name: &str) {
    // Inside the unit's StateDirectory= and RuntimeDirectory=.
    assert!(
        config.ledger.path.starts_with("/var/lib/toolwall"),
        "{name}: ledger {:?}",
        config.ledger.path
    );
    assert!(
        config.admin.socket.starts_with("/run/toolwall"),
        "{name}: admin {:?}",
        config.admin.socket
    );
    assert_eq!(
        config.listen.unix.as_deref(),
        Some(Path::new("/run/toolwall/mcp.sock")),
        "{name}"
    );
}

#[test]
fn minimal_example_loads() {
    let path = repo().join("examples/minimal.toml");
    let config = Config::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
    check_service_paths(&config, "minimal.toml");
    // toolwall.socket passes what this config asks for, and nothing needs binding.
    let mut sockets = shipped_sockets();
    sockets.truncate(1);
    let plan = match_listeners(sockets, &wanted_listeners(&config.listen));
    assert_eq!(plan.adopted.len(), 1);
    assert!(plan.to_bind.is_empty() && plan.explanations.is_empty());
}

#[test]
fn full_example_loads() {
    let path = repo().join("examples/toolwall.toml");
    let config = Config::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
    check_service_paths(&config, "toolwall.toml");
    assert_eq!(config.listen.vsock, Some(5002));
    let stop = seconds(one(&unit("toolwall.service"), "TimeoutStopSec"));
    assert!(config.gateway.drain_secs + 10 <= stop);
    let plan = match_listeners(shipped_sockets(), &wanted_listeners(&config.listen));
    assert_eq!(plan.adopted.len(), 2);
    assert!(plan.to_bind.is_empty());
    assert!(plan.explanations.is_empty(), "{:?}", plan.explanations);
}

// ---- install.sh ----------------------------------------------------------------------------

/// Existence, size and modification time of what a real install would touch.
fn snapshot(paths: &[&str]) -> Vec<(String, Option<(u64, std::time::SystemTime)>)> {
    paths
        .iter()
        .map(|p| {
            let meta = std::fs::metadata(p).ok();
            (
                p.to_string(),
                meta.map(|m| (m.len(), m.modified().unwrap())),
            )
        })
        .collect()
}

#[test]
fn install_dry_run_shows_every_step_and_changes_nothing() {
    let prefix = tempfile::tempdir().unwrap();
    let prefix_str = prefix.path().to_str().unwrap();
    let touched = [
        "/etc/systemd/system/toolwall.service",
        "/etc/systemd/system/toolwall.socket",
        "/etc/systemd/system/toolwall-vsock.socket",
        "/etc/systemd/system/toolwall-http.socket",
        "/etc/sysusers.d/toolwall.conf",
        "/etc/toolwall",
        "/etc/toolwall/toolwall.toml",
    ];
    let before = snapshot(&touched);
    let release = repo().join("target/release/toolwall");
    let release_before = snapshot(&[release.to_str().unwrap()]);

    let (ok, out) = run_script("install.sh", &["--prefix", prefix_str, "--dry-run"]);
    assert!(ok, "{out}");
    let expected = [
        "would run: cargo build --release --locked --bin toolwall".to_string(),
        format!("would run: install -D -m 0755 target/release/toolwall {prefix_str}/bin/toolwall"),
        "would run: install -D -m 0644 systemd/toolwall.sysusers /etc/sysusers.d/toolwall.conf"
            .to_string(),
        format!(
            "would run: install -D -m 0644 systemd/toolwall.service /etc/systemd/system/toolwall.service (with ExecStart={prefix_str}/bin/toolwall ...)"
        ),
        "would run: install -D -m 0644 systemd/toolwall.socket /etc/systemd/system/toolwall.socket"
            .to_string(),
        "would run: systemctl daemon-reload".to_string(),
        "would run: systemctl enable --now toolwall.socket".to_string(),
        "-- dry run: nothing was changed".to_string(),
    ];
    let lines: Vec<&str> = out.lines().collect();
    let mut at = 0;
    for want in &expected {
        let found = lines[at..].iter().position(|l| l == want);
        let Some(found) = found else {
            panic!("missing or out of order: {want}\n{out}");
        };
        at += found + 1;
    }
    // The config: created from the example, or kept.
    assert!(
        out.contains("examples/toolwall.toml /etc/toolwall/toolwall.toml")
            || out.contains("-- keeping the existing /etc/toolwall/toolwall.toml"),
        "{out}"
    );
    // The user: created, or found.
    assert!(
        out.contains("would run: systemd-sysusers /etc/sysusers.d/toolwall.conf")
            || out.contains("would run: useradd --system")
            || out.contains("-- user toolwall exists"),
        "{out}"
    );
    // Every action is a "would run" line; nothing ran.
    assert!(!out.lines().any(|l| l.starts_with("+ ")), "{out}");
    assert_eq!(std::fs::read_dir(prefix.path()).unwrap().count(), 0);
    assert_eq!(snapshot(&touched), before);
    assert_eq!(snapshot(&[release.to_str().unwrap()]), release_before);
}

#[test]
fn install_refuses_bad_arguments() {
    for args in [
        &["--prefix", "relative/dir", "--dry-run"][..],
        &["--bogus"][..],
        &["--prefix"][..],
    ] {
        let (ok, out) = run_script("install.sh", args);
        assert!(!ok, "{args:?}: {out}");
        assert!(out.contains("install.sh:"), "{out}");
    }
}
