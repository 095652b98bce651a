//! What some tests need beyond the Rust toolchain, installed by the tests themselves so a
//! plain `cargo test --workspace` works on a fresh clone: each test asks for the parts it
//! uses before it uses them, and `scripts/install-test-deps.sh` (idempotent, one installer
//! at a time under a lock in `target/`) returns at once when they are in place.
//!
//! Parts: `python3` (the system Python, for the fixture servers), `python` (the official
//! MCP Python SDK in `target/mcp-venv`), `systemd` (systemd-analyze and
//! systemd-socket-activate), `node` (Node 22, the conformance suite and the Inspector in
//! `target/third-party`).

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Install (or confirm) `parts`, once per part per test process; panics with the
/// installer's output when it fails (it needs the package registries).
pub fn ensure(parts: &[&str]) {
    static DONE: Mutex<Option<HashMap<String, Result<(), String>>>> = Mutex::new(None);
    let mut done = DONE.lock().unwrap_or_else(|p| p.into_inner());
    let done = done.get_or_insert_with(HashMap::new);
    let missing: Vec<&str> = parts
        .iter()
        .copied()
        .filter(|p| !done.contains_key(*p))
        .collect();
    if !missing.is_empty() {
        let result = run_installer(&missing);
        for p in &missing {
            done.insert((*p).to_owned(), result.clone());
        }
    }
    for p in parts {
        if let Some(Err(e)) = done.get(*p) {
            panic!("{e}");
        }
    }
}

fn run_installer(parts: &[&str]) -> Result<(), String> {
    let script = repo().join("scripts/install-test-deps.sh");
    let out = Command::new(&script)
        .args(parts)
        .current_dir(repo())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("run {}: {e}", script.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "scripts/install-test-deps.sh {} failed ({}); it needs the package registries:\n{}\n{}",
            parts.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}
