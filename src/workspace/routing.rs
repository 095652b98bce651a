//! The gateway's part of the `ws` server, as pure functions: which worker a call goes to,
//! what the gateway answers itself, and the settings each workspace worker starts with.
//!
//! Flow of a `tools/call` of `ws__TOOL`:
//! 1. [`normalize_arguments`] before policy, so rules see `command` whether or not the
//!    agent wrapped the arguments in `input`;
//! 2. policy as for any tool;
//! 3. [`route_call`]: `workers_list` is answered here (it spans workspaces); every other
//!    tool goes to the worker of the workspace `worker` names among the caller's own, or is
//!    answered here with `worker_not_found` / `worker_offline` / `invalid_arguments`.

use serde_json::Value;
use std::borrow::Cow;
use std::path::{Path, PathBuf};

use super::args::{unwrap_input, unwrap_input_text};
use super::config::WorkspacesConfig;
use super::error::{WsError, WsErrorCode, ok_result};
use super::ownership::{WorkerState, WorkspaceDirectory, worker_argument};
use super::settings::WorkspaceWorkerSettings;
use super::tools;
use crate::sandbox::SandboxMode;

/// Where a `ws` call goes.
#[derive(Debug, Clone, PartialEq)]
pub enum WsRoute {
    /// The gateway answers with this `CallToolResult` (a result or an `isError` refusal).
    Answer(Value),
    /// To the worker of this workspace, with these (unwrapped) arguments.
    Forward {
        workspace_id: String,
        arguments: Value,
    },
}

/// The arguments as policy and the worker should see them: unwrapped from `input`.
pub fn normalize_arguments(arguments: &str) -> Cow<'_, str> {
    unwrap_input_text(arguments)
}

/// Routes `ws__{tool}` called by `principal`. `state` tells whether a workspace's worker
/// is online (by id).
pub fn route_call(
    directory: &WorkspaceDirectory,
    principal: &str,
    tool: &str,
    arguments: &Value,
    state: impl Fn(&str) -> WorkerState,
) -> WsRoute {
    if !arguments.is_object() {
        return WsRoute::Answer(WsError::invalid("arguments must be a JSON object").to_result());
    }
    let inner = unwrap_input(arguments);
    if tool == tools::WORKERS_LIST {
        return WsRoute::Answer(ok_result(directory.workers_list(principal, state)));
    }
    if !tools::ALL.contains(&tool) {
        return WsRoute::Answer(
            WsError::invalid(format!("the ws server has no tool {tool}")).to_result(),
        );
    }
    let entry = match directory.resolve(principal, worker_argument(inner)) {
        Ok(e) => e,
        Err(e) => return WsRoute::Answer(e.to_result()),
    };
    if state(&entry.id) != WorkerState::Online {
        return WsRoute::Answer(
            WsError::new(
                WsErrorCode::WorkerOffline,
                format!(
                    "workspace {} ({}) is offline: its worker is starting, restarting or was refused by its attestation",
                    entry.name, entry.id
                ),
            )
            .to_result(),
        );
    }
    WsRoute::Forward {
        workspace_id: entry.id.clone(),
        arguments: inner.clone(),
    }
}

/// Settings for every workspace's worker. `protected`: toolwall's own files (the config
/// file and any corp config, the ledger's directory, the admin and agent sockets, token and
/// TLS key files); they and every other workspace's root are hidden from each workspace.
/// `ledger_dir` is the directory the attestation proves unreadable.
pub fn worker_settings(
    cfg: &WorkspacesConfig,
    protected: &[PathBuf],
    ledger_dir: &Path,
    mode: SandboxMode,
) -> Result<Vec<WorkspaceWorkerSettings>, String> {
    let ledger_dir = std::fs::canonicalize(ledger_dir).unwrap_or_else(|_| ledger_dir.to_path_buf());
    let mut all_protected = protected.to_vec();
    all_protected.push(ledger_dir.clone());
    cfg.validate(&all_protected)?;
    let directory = WorkspaceDirectory::new(cfg)?;
    let mut out = Vec::new();
    for entry in directory.entries() {
        let Some(ws) = cfg.0.get(&entry.name) else {
            continue;
        };
        let mut hidden: Vec<PathBuf> = protected.to_vec();
        hidden.push(ledger_dir.clone());
        hidden.extend(
            directory
                .entries()
                .iter()
                .filter(|e| e.id != entry.id)
                .map(|e| e.root.clone()),
        );
        let mut workspace = ws.clone();
        workspace.root = entry.root.clone();
        out.push(WorkspaceWorkerSettings {
            sandbox_mode: mode,
            id: entry.id.clone(),
            name: entry.name.clone(),
            workspace,
            hidden_paths: hidden,
            forbidden_probe_dir: ledger_dir.clone(),
            agent: Default::default(),
            secrets: Vec::new(),
            task_cgroups: None,
        });
    }
    Ok(out)
}

/// The tool definitions for the `ws` server (bare names; the catalog adds `ws__`).
pub fn catalog_definitions() -> Vec<Value> {
    tools::definitions()
}

/// Whether `principal` owns any workspace: a gateway may hide the `ws` tools from those
/// who own none.
pub fn has_workspaces(directory: &WorkspaceDirectory, principal: &str) -> bool {
    directory.owned_by(principal).next().is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace::config::WorkspaceConfig;
    use std::collections::BTreeMap;

    fn setup() -> (tempfile::TempDir, WorkspacesConfig, WorkspaceDirectory) {
        let dir = tempfile::tempdir().expect("tempdir");
        for d in ["a", "b", "state"] {
            std::fs::create_dir_all(dir.path().join(d)).expect("mkdir");
        }
        let ws = |root: &str, owner: &str| WorkspaceConfig {
            root: dir.path().join(root),
            owners: vec![owner.into()],
            ..WorkspaceConfig::default()
        };
        let cfg = WorkspacesConfig(BTreeMap::from([
            ("a".to_string(), ws("a", "uid:1")),
            ("b".to_string(), ws("b", "uid:2")),
        ]));
        let d = WorkspaceDirectory::new(&cfg).expect("directory");
        (dir, cfg, d)
    }

    fn error_code(route: &WsRoute) -> String {
        match route {
            WsRoute::Answer(v) => v["structuredContent"]["error"]["code"]
                .as_str()
                .unwrap_or("")
                .to_string(),
            other => panic!("forwarded: {other:?}"),
        }
    }

    #[test]
    fn calls_route_to_the_callers_workspace_or_are_answered_here() {
        let (_d, _cfg, d) = setup();
        let json = |t: &str| -> Value { serde_json::from_str(t).expect("json") };
        let online = |_: &str| WorkerState::Online;
        let r = route_call(
            &d,
            "uid:1",
            "shell_run",
            &json(r#"{"input":{"worker":"a","command":"ls"}}"#),
            online,
        );
        let WsRoute::Forward {
            workspace_id,
            arguments,
        } = r
        else {
            panic!("not forwarded: {r:?}");
        };
        assert!(workspace_id.starts_with("wrk_"));
        assert_eq!(arguments.to_string(), r#"{"command":"ls","worker":"a"}"#);
        let other = route_call(
            &d,
            "uid:1",
            "shell_run",
            &json(r#"{"worker":"b","command":"ls"}"#),
            online,
        );
        assert_eq!(error_code(&other), "worker_not_found");
        let missing = route_call(&d, "uid:1", "file_read", &json(r#"{"path":"x"}"#), online);
        assert_eq!(error_code(&missing), "invalid_arguments");
        let offline = route_call(&d, "uid:1", "task_list", &json(r#"{"worker":"a"}"#), |_| {
            WorkerState::Offline
        });
        assert_eq!(error_code(&offline), "worker_offline");
        let list = route_call(&d, "uid:2", "workers_list", &json("{}"), online);
        let WsRoute::Answer(v) = list else {
            panic!("answered here")
        };
        assert_eq!(v["structuredContent"]["workers"][0]["name"], "b");
        assert_eq!(
            error_code(&route_call(&d, "uid:1", "x", &json("{}"), online)),
            "invalid_arguments"
        );
        assert_eq!(
            error_code(&route_call(&d, "uid:1", "task_list", &json("[1]"), online)),
            "invalid_arguments"
        );
        assert!(has_workspaces(&d, "uid:2") && !has_workspaces(&d, "uid:3"));
    }

    #[test]
    fn each_worker_is_hidden_the_other_roots_and_toolwalls_files() {
        let (dir, cfg, d) = setup();
        let config_file = dir.path().join("toolwall.toml");
        std::fs::write(&config_file, "").expect("write");
        let all = worker_settings(
            &cfg,
            std::slice::from_ref(&config_file),
            &dir.path().join("state"),
            SandboxMode::Enforce,
        )
        .expect("settings");
        assert_eq!(all.len(), 2);
        let a = &all[0];
        assert_eq!(a.name, "a");
        assert_eq!(a.id, d.entries()[0].id);
        let b_root = &d.entries()[1].root;
        assert!(a.hidden_paths.contains(b_root));
        assert!(a.hidden_paths.contains(&config_file));
        assert!(a.hidden_paths.iter().any(|p| p.ends_with("state")));
        assert!(!a.hidden_paths.contains(&d.entries()[0].root));
        assert!(a.workspace.root.is_absolute());
    }
}
