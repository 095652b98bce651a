//! Who may use which workspace, decided in the gateway (workers never see principals).
//!
//! A `ws` tool names its workspace in `worker`, by id or by name, and the name is looked up
//! only among the workspaces the caller owns: a workspace of another owner is "not found",
//! exactly like one that does not exist, so nothing about it leaks.

use globset::{GlobBuilder, GlobMatcher};
use serde_json::{Value, json};
use std::path::PathBuf;

use super::config::WorkspacesConfig;
use super::error::{WsError, WsErrorCode};
use super::id::workspace_id;

/// Compiles one `owners` entry. `*` and `?` match any characters (principals hold no
/// path separators that matter), `[...]` classes work; matching is case-sensitive.
pub fn owner_glob(pattern: &str) -> Result<GlobMatcher, String> {
    if pattern.is_empty() {
        return Err("an empty owner matches nobody".into());
    }
    GlobBuilder::new(pattern)
        .literal_separator(false)
        .backslash_escape(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| format!("{pattern:?}: {e}"))
}

/// One workspace as the gateway routes to it.
#[derive(Debug, Clone)]
pub struct WorkspaceEntry {
    pub id: String,
    pub name: String,
    pub root: PathBuf,
    owners: Vec<GlobMatcher>,
}

impl WorkspaceEntry {
    pub fn owned_by(&self, principal: &str) -> bool {
        !principal.is_empty() && self.owners.iter().any(|g| g.is_match(principal))
    }
}

/// Every configured workspace with its id and compiled owners; built once per config load,
/// then pure lookups.
#[derive(Debug, Clone, Default)]
pub struct WorkspaceDirectory {
    entries: Vec<WorkspaceEntry>,
}

/// What `workers_list` shows of a workspace's worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerState {
    /// Attested and serving.
    Online,
    /// Starting, restarting, or refused by its attestation.
    Offline,
}

impl WorkerState {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Online => "online",
            WorkerState::Offline => "offline",
        }
    }
}

impl WorkspaceDirectory {
    /// Builds the directory; fails on what [`WorkspacesConfig::validate`] refuses too
    /// (a missing root, a bad owner glob).
    pub fn new(cfg: &WorkspacesConfig) -> Result<WorkspaceDirectory, String> {
        let mut entries = Vec::with_capacity(cfg.0.len());
        for (name, ws) in &cfg.0 {
            let root = ws
                .canonical_root()
                .map_err(|e| format!("[workspaces.{name}] root: {e}"))?;
            let owners = ws
                .owners
                .iter()
                .map(|o| owner_glob(o))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("[workspaces.{name}] owners: {e}"))?;
            entries.push(WorkspaceEntry {
                id: workspace_id(name, &root),
                name: name.clone(),
                root,
                owners,
            });
        }
        Ok(WorkspaceDirectory { entries })
    }

    pub fn entries(&self) -> &[WorkspaceEntry] {
        &self.entries
    }

    /// The workspaces `principal` owns, in name order.
    pub fn owned_by<'a>(&'a self, principal: &'a str) -> impl Iterator<Item = &'a WorkspaceEntry> {
        self.entries.iter().filter(move |e| e.owned_by(principal))
    }

    /// The workspace `worker` names (an id or a name) among those `principal` owns.
    pub fn resolve(
        &self,
        principal: &str,
        worker: Option<&str>,
    ) -> Result<&WorkspaceEntry, WsError> {
        let Some(worker) = worker.filter(|w| !w.is_empty()) else {
            return Err(WsError::invalid(
                "worker is required: a workspace id (wrk_...) or name; ws__workers_list lists yours",
            ));
        };
        self.entries
            .iter()
            .find(|e| e.owned_by(principal) && (e.id == worker || e.name == worker))
            .ok_or_else(|| {
                WsError::new(
                    WsErrorCode::WorkerNotFound,
                    format!("no workspace {worker:?} among yours; ws__workers_list lists them"),
                )
            })
    }

    /// The `workers_list` result for `principal`: its workspaces with their state.
    pub fn workers_list(&self, principal: &str, state: impl Fn(&str) -> WorkerState) -> Value {
        let workers: Vec<Value> = self
            .owned_by(principal)
            .map(|e| {
                json!({
                    "id": e.id,
                    "name": e.name,
                    "root": e.root,
                    "state": state(&e.id).as_str(),
                })
            })
            .collect();
        json!({ "workers": workers })
    }
}

/// The `worker` argument of a `ws` call, after [`super::args::unwrap_input`].
pub fn worker_argument(arguments: &Value) -> Option<&str> {
    arguments.get("worker").and_then(Value::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace::config::WorkspaceConfig;
    use std::collections::BTreeMap;

    fn directory(dir: &std::path::Path) -> WorkspaceDirectory {
        for d in ["alice", "bob", "shared"] {
            std::fs::create_dir_all(dir.join(d)).expect("mkdir");
        }
        let ws = |root: &str, owners: &[&str]| WorkspaceConfig {
            root: dir.join(root),
            owners: owners.iter().map(|s| s.to_string()).collect(),
            ..WorkspaceConfig::default()
        };
        let cfg = WorkspacesConfig(BTreeMap::from([
            ("alice-proj".to_string(), ws("alice", &["uid:1000"])),
            (
                "bob-proj".to_string(),
                ws("bob", &["uid:1001", "token:bob-*"]),
            ),
            ("shared".to_string(), ws("shared", &["uid:*"])),
        ]));
        WorkspaceDirectory::new(&cfg).expect("directory")
    }

    #[test]
    fn a_principal_resolves_only_its_own_workspaces_by_id_or_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = directory(dir.path());
        let alice = d.resolve("uid:1000", Some("alice-proj")).expect("by name");
        let by_id = d.resolve("uid:1000", Some(&alice.id)).expect("by id");
        assert_eq!(by_id.name, "alice-proj");
        // Bob's workspace, by name or id, is not found for alice: same code as a missing one.
        let bob_id = d
            .resolve("uid:1001", Some("bob-proj"))
            .expect("bob")
            .id
            .clone();
        for other in ["bob-proj", bob_id.as_str(), "nope"] {
            let e = d.resolve("uid:1000", Some(other)).expect_err("not alice's");
            assert_eq!(e.code, WsErrorCode::WorkerNotFound, "{other}");
        }
        assert!(d.resolve("token:bob-ci", Some("bob-proj")).is_ok());
        assert!(d.resolve("token:bobby", Some("bob-proj")).is_err());
        assert_eq!(
            d.resolve("uid:1000", None).expect_err("missing").code,
            WsErrorCode::InvalidArguments
        );
        assert_eq!(
            d.resolve("uid:1000", Some("")).expect_err("empty").code,
            WsErrorCode::InvalidArguments
        );
        // An empty principal owns nothing, even under a `*` owner.
        assert!(d.resolve("", Some("shared")).is_err());
    }

    #[test]
    fn workers_list_shows_only_the_callers_workspaces() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = directory(dir.path());
        let list = d.workers_list("uid:1000", |_| WorkerState::Online);
        let names: Vec<&str> = list["workers"]
            .as_array()
            .expect("array")
            .iter()
            .filter_map(|w| w["name"].as_str())
            .collect();
        assert_eq!(names, vec!["alice-proj", "shared"]);
        assert_eq!(list["workers"][0]["state"], "online");
        assert!(
            list["workers"][0]["id"]
                .as_str()
                .is_some_and(|id| id.starts_with("wrk_"))
        );
        let none = d.workers_list("uid:4242", |_| WorkerState::Online);
        assert_eq!(none["workers"].as_array().map(Vec::len), Some(1));
        let none = d.workers_list("cid:3", |_| WorkerState::Online);
        assert_eq!(none["workers"], json!([]));
    }
}
