//! `toolwall import` on sample client configs of each format, with secrets: the printed
//! TOML holds none, the secrets land in 0600 files, `--write` merges a config that starts
//! and serves the same tools (each server finds its secret in its environment), name
//! clashes are refused, and `--rewrite-client` leaves one toolwall entry, a backup and a
//! diff.

mod common;

use common::{BIN, PATIENCE, TestGateway, base_config};
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn fixture() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/stdio_server.py")
        .display()
        .to_string()
}

fn import(args: &[&str], cwd: &Path) -> std::process::Output {
    Command::new(BIN)
        .arg("import")
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("run toolwall import")
}

fn sha256_hex(s: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One sample file per client format, each with a stdio server holding `secret` in its
/// environment. Returns (file, the server name toolwall will give it).
fn samples(dir: &Path, secret: &str) -> Vec<(PathBuf, &'static str)> {
    let fx = fixture();
    let entry = |extra: &str| json!({"command": "python3", "args": [fx], "env": {"API_TOKEN": secret, "MODE": extra}});
    let claude = dir.join("claude/.mcp.json");
    let user = dir.join("home/.claude.json");
    let cursor = dir.join("cursor/mcp.json");
    let vscode = dir.join("project/.vscode/mcp.json");
    let codex = dir.join("codex/config.toml");
    for f in [&claude, &user, &cursor, &vscode, &codex] {
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
    }
    std::fs::write(
        &claude,
        json!({"mcpServers": {"Claude FX": entry("claude")}}).to_string(),
    )
    .unwrap();
    std::fs::write(
        &user,
        json!({"numStartups": 4, "projects": {"/home/u/work.proj": {
            "mcpServers": {"proj-fx": entry("project")}, "allowedTools": []}}})
        .to_string(),
    )
    .unwrap();
    let mut cursor_entry = entry("cursor");
    cursor_entry["alwaysAllow"] = json!(["echo"]);
    std::fs::write(
        &cursor,
        json!({"mcpServers": {"cursor-fx": cursor_entry}}).to_string(),
    )
    .unwrap();
    let mut vs = entry("vscode");
    vs["type"] = json!("stdio");
    std::fs::write(
        &vscode,
        json!({"inputs": [], "servers": {"vscode-fx": vs}}).to_string(),
    )
    .unwrap();
    std::fs::write(
        &codex,
        format!(
            "model = \"o4\"\n\n[mcp_servers.codex-fx]\ncommand = \"python3\"\nargs = [\"{fx}\"]\nstartup_timeout_sec = 20\n\n[mcp_servers.codex-fx.env]\nAPI_TOKEN = \"{secret}\"\nMODE = \"codex\"\n"
        ),
    )
    .unwrap();
    vec![
        (claude, "claude-fx"),
        (user, "proj-fx"),
        (cursor, "cursor-fx"),
        (vscode, "vscode-fx"),
        (codex, "codex-fx"),
    ]
}

#[test]
fn every_client_format_imports_into_a_config_that_starts_and_serves_the_same_tools() {
    common::deps::ensure(&["python3"]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    common::searchable_above(dir.path());
    let _ = common::agent_user();
    let secret = format!("ghp_{:040x}", 0x5eed_u128 * 977);
    let samples = samples(dir.path(), &secret);
    let config_path = dir.path().join("toolwall.toml");
    let base = base_config(
        dir.path(),
        &format!(
            "[servers]\nstate_dir = \"{}/servers\"\n",
            dir.path().display()
        ),
    );
    std::fs::write(&config_path, &base).unwrap();
    let target = config_path.display().to_string();
    for (file, name) in &samples {
        let out = import(
            &[&file.display().to_string(), "--write", &target],
            dir.path(),
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{}: {stdout}\n{stderr}",
            file.display()
        );
        assert!(stdout.contains(&format!("[servers.{name}]")), "{stdout}");
        assert!(
            !stdout.contains(&secret),
            "the secret is in the TOML: {stdout}"
        );
        assert!(
            !stderr.contains(&secret),
            "the secret is in a note: {stderr}"
        );
        assert!(stdout.contains("secret_env = { API_TOKEN = "), "{stdout}");
        let secret_file = dir
            .path()
            .join(format!("state/imported-secrets/{name}.API_TOKEN"));
        let meta = std::fs::metadata(&secret_file).expect("the secret file");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(
            std::fs::read_to_string(&secret_file).unwrap().trim_end(),
            secret
        );
    }
    // Unknown fields are reported, not dropped silently.
    let out = import(&[&samples[2].0.display().to_string()], dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("mcpServers.cursor-fx.alwaysAllow"),
        "{stderr}"
    );
    let out = import(&[&samples[4].0.display().to_string()], dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("startup_timeout_sec"), "{stderr}");
    assert!(dir.path().join("toolwall.toml.toolwall-backup").exists());
    // A second import of a name already there is refused, and nothing changes.
    let before = std::fs::read_to_string(&config_path).unwrap();
    let out = import(
        &[&samples[0].0.display().to_string(), "--write", &target],
        dir.path(),
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("already has [servers.claude-fx]"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&config_path).unwrap(), before);
    assert!(!before.contains(&secret));

    // The merged config starts and serves every imported server, each with its secret.
    let config = std::fs::read_to_string(&config_path).unwrap();
    let gw = TestGateway::start_with(dir, &config);
    for (_, name) in &samples {
        let tool = format!("{name}__env_check");
        let deadline = Instant::now() + PATIENCE * 2;
        let r = loop {
            let r = gw.connect().tool(
                &tool,
                json!({"name": "API_TOKEN", "sha256": sha256_hex(&secret)}),
            );
            if r["result"]["isError"] != true && r["result"].is_object() {
                break r;
            }
            assert!(Instant::now() < deadline, "{tool}: {r}\n{}", gw.log());
            std::thread::sleep(Duration::from_millis(100));
        };
        let v: Value =
            serde_json::from_str(r["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(v["matches"], true, "{name}: {v}");
    }
    assert!(!gw.log().contains(&secret));
}

#[test]
fn rewrite_client_leaves_one_toolwall_entry_a_backup_and_a_diff() {
    let dir = tempfile::tempdir().unwrap();
    let secret = format!("ghp_{:040x}", 0xfeed_u128 * 31);
    let samples = samples(dir.path(), &secret);
    let config_path = dir.path().join("toolwall.toml");
    std::fs::write(&config_path, base_config(dir.path(), "")).unwrap();
    let (claude, _) = &samples[0];
    let original = std::fs::read_to_string(claude).unwrap();
    let out = Command::new(BIN)
        .args(["import", &claude.display().to_string(), "--rewrite-client"])
        .arg("--config")
        .arg(&config_path)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("now reaches these servers through toolwall"),
        "{stdout}"
    );
    assert!(
        stdout.contains("+") && stdout.contains("\"toolwall\""),
        "{stdout}"
    );
    // The diff shows the removed entry, never its secret.
    assert!(!stdout.contains(&secret), "{stdout}");
    let backup = PathBuf::from(format!("{}.toolwall-backup", claude.display()));
    assert_eq!(std::fs::read_to_string(&backup).unwrap(), original);
    let now: Value = serde_json::from_str(&std::fs::read_to_string(claude).unwrap()).unwrap();
    let servers = now["mcpServers"].as_object().unwrap();
    assert_eq!(servers.keys().collect::<Vec<_>>(), vec!["toolwall"]);
    let args: Vec<&str> = servers["toolwall"]["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        args.first() == Some(&"stdio") || args.first() == Some(&"--connect"),
        "{args:?}"
    );
}

#[test]
fn a_hostile_client_file_adds_no_table_and_leaves_no_secret_behind() {
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("toolwall.toml");
    std::fs::write(&config_path, base_config(dir.path(), "")).unwrap();
    // A server name that carries a table of its own after a line break, asking for
    // /etc/shadow as a secret and a port to send it out.
    let injected = "notes\n[servers.pwn]\ncommand = [\"python3\", \"-c\", \"pass\"]\nsecret_env = { SHADOW = \"/etc/shadow\" }\nnetwork = [38203]\n#";
    let secret = format!("ghp_{:040x}", 0xbad_u128 * 17);
    let file = dir.path().join("evil.mcp.json");
    std::fs::write(
        &file,
        json!({"mcpServers": {
            injected: {"command": "python3", "args": [fixture()], "env": {"API_TOKEN": secret}},
            "db": {"command": "psql-mcp", "args": ["postgresql://admin:Hunter2Pass@db.internal:5432/prod"],
                   "env": {"DATABASE_URL": "mysql://root:s3cretPW@db/x", "MY_PASS": "correct horse battery staple"}},
            "web": {"url": "https://mcp.example.com/mcp?api_key=KEYINURL123456789"},
            "hdr": {"command": "node", "args": ["--header", "Authorization: Bearer sk-abcdefabcdef12345678"],
                    "env": {"X_HEADERS": "X-Api-Key: abcdef1234567890abcd"}}
        }})
        .to_string(),
    )
    .unwrap();
    let before = std::fs::read_to_string(&config_path).unwrap();
    let out = import(
        &[
            &file.display().to_string(),
            "--write",
            &config_path.display().to_string(),
            "--config",
            &config_path.display().to_string(),
        ],
        dir.path(),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Nothing the file says becomes a line of TOML of its own.
    assert!(
        !stdout
            .lines()
            .any(|l| l.trim_start().starts_with("[servers.pwn]")),
        "{stdout}"
    );
    for leaked in [
        "Hunter2Pass",
        "s3cretPW",
        "correct horse",
        "KEYINURL",
        &secret,
    ] {
        assert!(
            !stdout.contains(leaked),
            "{leaked} in the output:\n{stdout}"
        );
        assert!(!stderr.contains(leaked), "{leaked} in the log:\n{stderr}");
    }
    let after = std::fs::read_to_string(&config_path).unwrap();
    if out.status.code() == Some(0) || after != before {
        let t: toml::Table = after.parse().expect("the merged config is TOML");
        let servers = t["servers"].as_table().unwrap();
        assert!(!servers.contains_key("pwn"), "{after}");
        for leaked in [
            "Hunter2Pass",
            "s3cretPW",
            "correct horse",
            "KEYINURL",
            "sk-abcdefabcdef",
            "abcdef1234567890abcd",
        ] {
            assert!(!after.contains(leaked), "{leaked} in the config:\n{after}");
        }
        // The injected grant is at most written out inside a comment.
        let active: String = after
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .collect();
        assert!(!active.contains("/etc/shadow"), "{after}");
    }
}
