//! `[workspaces.NAME]` in the config file: the directories agents may work in, who owns
//! each, and the limits of the tools that act in it. Every limit has a key and a default.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// All workspaces, by name (`[workspaces.NAME]`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WorkspacesConfig(pub BTreeMap<String, WorkspaceConfig>);

/// Default of `output_cap_bytes`: 1 MiB of command output kept per task.
pub const DEFAULT_OUTPUT_CAP_BYTES: usize = 1024 * 1024;
/// Largest `output_cap_bytes` (a finished task's result must fit one RPC message).
pub const MAX_OUTPUT_CAP_BYTES: usize = 4 * 1024 * 1024;
/// Largest `max_read_bytes` and `max_write_bytes` (base64 and JSON must fit one message).
pub const MAX_TRANSFER_BYTES: usize = 8 * 1024 * 1024;
/// Largest `max_tasks`: a running task holds 4 fds of the worker, whose open files are
/// limited by `[sandbox] max_open_files` (1024 by default).
pub const MAX_TASKS: usize = 200;
/// Largest `threads`.
pub const MAX_THREADS: usize = 64;
/// Smallest `memory_max_bytes` and `task_memory_max_bytes`: 16 MiB.
pub const MIN_MEMORY_MAX_BYTES: u64 = 16 * 1024 * 1024;
/// Longest workspace name.
pub const MAX_NAME_LEN: usize = 64;

/// One workspace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkspaceConfig {
    /// The directory agents work in (must exist). Landlock lets the worker and its programs
    /// write only under it.
    pub root: PathBuf,
    /// Principals that own the workspace, as globs (`uid:1000`, `token:ci-*`). Nobody
    /// else sees it.
    pub owners: Vec<String>,
    /// `false` (no network at all) or the TCP ports programs may connect to.
    pub network: Network,
    /// Extra paths programs may read and execute (toolchains); the system's `/usr`, `/lib`,
    /// `/lib64`, `/bin` and `/etc` are readable by default.
    pub read_only_paths: Vec<PathBuf>,
    /// The environment of every command; nothing is inherited. `PATH`, `HOME`, `TMPDIR`,
    /// `TMP`, `TEMP` and `LANG` get defaults unless set here.
    pub env: BTreeMap<String, String>,
    /// Tasks held at once, running or finished; finished ones are dropped oldest first to
    /// make room, and a new command is refused (`too_many_tasks`) when all are running.
    pub max_tasks: usize,
    /// Output kept per task (stdout and stderr together; the head and the tail of each
    /// stream are kept, the middle is dropped and counted).
    pub output_cap_bytes: usize,
    /// Seconds a finished task stays readable (`task_get`, `task_list`).
    pub task_retention_secs: u64,
    /// Seconds any task may run before it is cancelled (`timed_out`); `shell_dispatch`'s
    /// `timeout` may only lower it.
    pub task_max_runtime_secs: u64,
    /// RLIMIT_CPU of every process of a task, in CPU seconds.
    pub task_cpu_secs: u64,
    /// RLIMIT_NPROC of a task. The kernel counts every process of the user the gateway
    /// runs as (not only this task's), so keep it above what that user already runs.
    pub task_max_processes: u64,
    /// RLIMIT_FSIZE of every process of a task: the largest file it may write.
    pub task_max_file_size_bytes: u64,
    /// `shell_run`'s soft timeout and `task_wait`'s wait, when the call gives none.
    pub default_timeout_secs: u64,
    /// Longest wait a call may ask for (`shell_run`, `task_wait`). Keep it below
    /// `[gateway] tool_call_timeout_secs`, or the gateway gives up on the call first.
    pub max_wait_secs: u64,
    /// Milliseconds between SIGTERM and SIGKILL when a task is cancelled.
    pub cancel_grace_ms: u64,
    /// Bytes of output a still-running task shows in `preview`.
    pub preview_bytes: usize,
    /// Largest `file_read` chunk.
    pub max_read_bytes: usize,
    /// Largest `file_write` content and largest file `file_edit` rewrites.
    pub max_write_bytes: usize,
    /// Entries `file_list` returns.
    pub max_list_entries: usize,
    /// Results `file_find` and `file_search` return.
    pub max_matches: usize,
    /// Files and directories `file_find` and `file_search` look at before they stop.
    pub max_scan_entries: usize,
    /// Files larger than this are skipped by `file_search`.
    pub max_search_file_bytes: u64,
    /// Milliseconds `file_find` and `file_search` may spend before they stop.
    pub scan_time_limit_ms: u64,
    /// Threads of the worker for the file tools (commands need none).
    pub threads: usize,
    /// File tool calls queued beyond busy threads (then `busy`).
    pub queue: usize,
    /// cgroup v2 (where toolwall has a delegated cgroup): most processes of the whole
    /// workspace (`pids.max`).
    pub pids_max: u64,
    /// cgroup v2: most memory of the whole workspace in bytes (`memory.max`, swap closed);
    /// unset: no limit.
    pub memory_max_bytes: Option<u64>,
    /// cgroup v2: the workspace's CPU share against the others and toolwall (`cpu.weight`,
    /// 1 to 10000; the kernel's default is 100).
    pub cpu_weight: Option<u64>,
    /// cgroup v2: most memory of one task in bytes; unset: the workspace's limit only.
    /// (A task's `pids.max` is `task_max_processes`.)
    pub task_memory_max_bytes: Option<u64>,
    /// The user this workspace's worker and commands run as; `[sandbox] agent_user` when
    /// unset. Workspaces sharing a user can change the metadata (mode, times) of each
    /// other's files; give each its own user to separate them.
    pub agent_user: Option<String>,
}

impl Default for WorkspaceConfig {
    fn default() -> Self {
        WorkspaceConfig {
            root: PathBuf::new(),
            owners: Vec::new(),
            network: Network::Off,
            read_only_paths: Vec::new(),
            env: BTreeMap::new(),
            max_tasks: 32,
            output_cap_bytes: DEFAULT_OUTPUT_CAP_BYTES,
            task_retention_secs: 3600,
            task_max_runtime_secs: 3600,
            task_cpu_secs: 3600,
            task_max_processes: 4096,
            task_max_file_size_bytes: 1024 * 1024 * 1024,
            default_timeout_secs: 30,
            max_wait_secs: 240,
            cancel_grace_ms: 2000,
            preview_bytes: 4096,
            max_read_bytes: 1024 * 1024,
            max_write_bytes: 4 * 1024 * 1024,
            max_list_entries: 1000,
            max_matches: 200,
            max_scan_entries: 50_000,
            max_search_file_bytes: 4 * 1024 * 1024,
            scan_time_limit_ms: 10_000,
            threads: 4,
            queue: 64,
            pids_max: 4096,
            memory_max_bytes: None,
            cpu_weight: None,
            task_memory_max_bytes: None,
            agent_user: None,
        }
    }
}

/// `network = false` or `network = [443, 8080]`. `true` is refused: ports are always named.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Network {
    #[default]
    Off,
    Ports(Vec<u16>),
}

impl Network {
    /// The TCP ports granted (empty: no network, not even a socket).
    pub fn ports(&self) -> &[u16] {
        match self {
            Network::Off => &[],
            Network::Ports(p) => p,
        }
    }
}

#[derive(Deserialize, Serialize)]
#[serde(untagged)]
enum NetworkRepr {
    Flag(bool),
    Ports(Vec<u16>),
}

impl Serialize for Network {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Network::Off => NetworkRepr::Flag(false).serialize(s),
            Network::Ports(p) => NetworkRepr::Ports(p.clone()).serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Network {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match NetworkRepr::deserialize(d).map_err(|_| {
            D::Error::custom("network must be false or a list of TCP ports, such as [443]")
        })? {
            NetworkRepr::Flag(false) => Ok(Network::Off),
            NetworkRepr::Flag(true) => Err(D::Error::custom(
                "network = true is not accepted: list the TCP ports programs may connect to, such as [443]",
            )),
            NetworkRepr::Ports(p) if p.is_empty() => Ok(Network::Off),
            NetworkRepr::Ports(p) if p.contains(&0) => {
                Err(D::Error::custom("network: port 0 is not a port"))
            }
            NetworkRepr::Ports(mut p) => {
                p.sort_unstable();
                p.dedup();
                Ok(Network::Ports(p))
            }
        }
    }
}

/// Whether `name` may name a workspace: 1 to 64 of `[A-Za-z0-9_.-]`, not starting with
/// `wrk_` (the prefix of ids, so a name never reads as one).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && !name.starts_with(crate::workspace::id::ID_PREFIX)
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// Whether `a` and `b` overlap (one holds the other).
fn nested(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

impl WorkspacesConfig {
    /// Checks every workspace against the rules a loaded config must meet; `protected` are
    /// the paths no workspace may hold (the config, the ledger's directory, the admin
    /// socket, token and key files). Returns the first problem, naming the workspace and key.
    pub fn validate(&self, protected: &[PathBuf]) -> Result<(), String> {
        let mut roots: Vec<(&str, PathBuf)> = Vec::new();
        for (name, ws) in &self.0 {
            let at = format!("[workspaces.{name}]");
            if !valid_name(name) {
                return Err(format!(
                    "{at}: a workspace name is 1 to {MAX_NAME_LEN} of A-Z a-z 0-9 _ . - and does not start with wrk_"
                ));
            }
            let root = ws.canonical_root().map_err(|e| format!("{at} root: {e}"))?;
            if root == Path::new("/") {
                return Err(format!("{at} root: / cannot be a workspace"));
            }
            for p in protected {
                let p = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
                if nested(&root, &p) {
                    return Err(format!(
                        "{at} root {} overlaps {} (toolwall's own files stay out of every workspace)",
                        root.display(),
                        p.display()
                    ));
                }
            }
            for (other, other_root) in &roots {
                if nested(&root, other_root) {
                    return Err(format!(
                        "{at} root {} overlaps the root of workspace {other}",
                        root.display()
                    ));
                }
            }
            roots.push((name, root));
            if ws.owners.is_empty() {
                return Err(format!("{at} owners: empty (nobody could use it)"));
            }
            for owner in &ws.owners {
                crate::workspace::ownership::owner_glob(owner)
                    .map_err(|e| format!("{at} owners: {e}"))?;
            }
            for path in &ws.read_only_paths {
                if !path.is_absolute() {
                    return Err(format!(
                        "{at} read_only_paths: {} is not absolute",
                        path.display()
                    ));
                }
            }
            for (key, value) in &ws.env {
                if key.is_empty() || key.contains('=') || key.contains('\0') || value.contains('\0')
                {
                    return Err(format!("{at} env: {key:?} is not a valid variable"));
                }
            }
            if let Some(user) = &ws.agent_user
                && (user.is_empty() || user.len() > 32 || user.contains(['\0', ':', '/']))
            {
                return Err(format!("{at} agent_user: {user:?} is not a user name"));
            }
            ws.validate_limits().map_err(|e| format!("{at} {e}"))?;
        }
        Ok(())
    }
}

impl WorkspaceConfig {
    /// The root as an absolute path without links; it must be an existing directory.
    pub fn canonical_root(&self) -> Result<PathBuf, String> {
        if self.root.as_os_str().is_empty() {
            return Err("missing (the directory agents work in)".into());
        }
        let root = std::fs::canonicalize(&self.root)
            .map_err(|e| format!("{}: {e}", self.root.display()))?;
        if !root.is_dir() {
            return Err(format!("{} is not a directory", root.display()));
        }
        Ok(root)
    }

    fn validate_limits(&self) -> Result<(), String> {
        let positive: [(&str, u64); 13] = [
            ("pids_max", self.pids_max),
            ("max_tasks", self.max_tasks as u64),
            ("output_cap_bytes", self.output_cap_bytes as u64),
            ("task_max_runtime_secs", self.task_max_runtime_secs),
            ("task_cpu_secs", self.task_cpu_secs),
            ("task_max_processes", self.task_max_processes),
            ("task_max_file_size_bytes", self.task_max_file_size_bytes),
            ("max_read_bytes", self.max_read_bytes as u64),
            ("max_write_bytes", self.max_write_bytes as u64),
            ("max_list_entries", self.max_list_entries as u64),
            ("max_matches", self.max_matches as u64),
            ("max_scan_entries", self.max_scan_entries as u64),
            ("threads", self.threads as u64),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(format!("{key}: must be at least 1"));
            }
        }
        if self.output_cap_bytes > MAX_OUTPUT_CAP_BYTES {
            return Err(format!("output_cap_bytes: at most {MAX_OUTPUT_CAP_BYTES}"));
        }
        for (key, value) in [
            ("max_read_bytes", self.max_read_bytes),
            ("max_write_bytes", self.max_write_bytes),
        ] {
            if value > MAX_TRANSFER_BYTES {
                return Err(format!("{key}: at most {MAX_TRANSFER_BYTES}"));
            }
        }
        if self.default_timeout_secs > self.max_wait_secs {
            return Err("default_timeout_secs: more than max_wait_secs".into());
        }
        if self.max_tasks > MAX_TASKS {
            return Err(format!(
                "max_tasks: at most {MAX_TASKS} (a running task holds 4 file descriptors of the worker)"
            ));
        }
        if self.threads > MAX_THREADS {
            return Err(format!("threads: at most {MAX_THREADS}"));
        }
        if let Some(w) = self.cpu_weight
            && !(crate::sandbox::cgroup::CPU_WEIGHT_MIN..=crate::sandbox::cgroup::CPU_WEIGHT_MAX)
                .contains(&w)
        {
            return Err("cpu_weight: 1 to 10000".into());
        }
        for (key, value) in [
            ("memory_max_bytes", self.memory_max_bytes),
            ("task_memory_max_bytes", self.task_memory_max_bytes),
        ] {
            if value.is_some_and(|v| v < MIN_MEMORY_MAX_BYTES) {
                return Err(format!(
                    "{key}: at least {MIN_MEMORY_MAX_BYTES} (a shell and the task's leader need that much)"
                ));
            }
        }
        if self.max_search_file_bytes > MAX_TRANSFER_BYTES as u64 {
            return Err(format!(
                "max_search_file_bytes: at most {MAX_TRANSFER_BYTES}"
            ));
        }
        let max = crate::config::MAX_TIMEOUT_SECS;
        for (key, secs) in [
            ("task_max_runtime_secs", self.task_max_runtime_secs),
            ("task_cpu_secs", self.task_cpu_secs),
            ("task_retention_secs", self.task_retention_secs),
            ("max_wait_secs", self.max_wait_secs),
            ("cancel_grace_ms", self.cancel_grace_ms / 1000),
            ("scan_time_limit_ms", self.scan_time_limit_ms / 1000),
        ] {
            if secs > max {
                return Err(format!("{key}: at most {max} seconds"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<WorkspacesConfig, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn keys_defaults_and_network_forms() {
        let cfg = parse(
            "[a]\nroot = \"/tmp\"\nowners = [\"uid:*\"]\n[b]\nroot = \"/tmp\"\nowners = [\"x\"]\nnetwork = [443, 80, 443]\nmax_tasks = 3\n",
        )
        .expect("parse");
        assert_eq!(cfg.0["a"].network, Network::Off);
        assert_eq!(cfg.0["a"].output_cap_bytes, DEFAULT_OUTPUT_CAP_BYTES);
        assert_eq!(cfg.0["b"].network, Network::Ports(vec![80, 443]));
        assert_eq!(cfg.0["b"].max_tasks, 3);
        assert_eq!(
            parse("[a]\nnetwork = false\n").expect("off").0["a"].network,
            Network::Off
        );
        let err = parse("[a]\nnetwork = true\n").expect_err("true refused");
        assert!(err.contains("list the TCP ports"), "{err}");
        assert!(parse("[a]\nnetwork = [0]\n").is_err());
        assert!(parse("[a]\nnetwork = \"all\"\n").is_err());
        let err = parse("[a]\nrooot = \"/tmp\"\n").expect_err("unknown key");
        assert!(err.contains("rooot"), "{err}");
    }

    #[test]
    fn network_round_trips_through_json() {
        for n in [Network::Off, Network::Ports(vec![22, 443])] {
            let text = serde_json::to_string(&n).expect("json");
            assert_eq!(serde_json::from_str::<Network>(&text).expect("back"), n);
        }
    }

    fn ws(root: &Path) -> WorkspaceConfig {
        WorkspaceConfig {
            root: root.to_path_buf(),
            owners: vec!["uid:1000".into()],
            ..WorkspaceConfig::default()
        }
    }

    #[test]
    fn validation_refuses_overlaps_bad_names_and_limits() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a");
        let state = dir.path().join("state");
        std::fs::create_dir_all(a.join("inner")).expect("mkdir");
        std::fs::create_dir_all(&state).expect("mkdir");
        let one = |name: &str, cfg: WorkspaceConfig| {
            WorkspacesConfig(BTreeMap::from([(name.to_string(), cfg)]))
        };
        assert_eq!(
            one("proj", ws(&a)).validate(std::slice::from_ref(&state)),
            Ok(())
        );
        // The ledger's directory inside a root, or a root inside it.
        let err = one("proj", ws(dir.path()))
            .validate(std::slice::from_ref(&state))
            .expect_err("overlap");
        assert!(err.contains("overlaps"), "{err}");
        // Two roots that nest.
        let two = WorkspacesConfig(BTreeMap::from([
            ("a".to_string(), ws(&a)),
            ("b".to_string(), ws(&a.join("inner"))),
        ]));
        assert!(
            two.validate(&[])
                .expect_err("nested")
                .contains("workspace a")
        );
        for bad in ["", "wrk_0123456789ab", "a/b", "a b"] {
            assert!(one(bad, ws(&a)).validate(&[]).is_err(), "{bad:?}");
        }
        let mut nobody = ws(&a);
        nobody.owners.clear();
        assert!(one("p", nobody).validate(&[]).is_err());
        let mut missing = ws(&a);
        missing.root = dir.path().join("missing");
        assert!(one("p", missing).validate(&[]).is_err());
        let mut zero = ws(&a);
        zero.max_tasks = 0;
        assert!(
            one("p", zero)
                .validate(&[])
                .expect_err("zero")
                .contains("max_tasks")
        );
        let mut huge = ws(&a);
        huge.output_cap_bytes = MAX_OUTPUT_CAP_BYTES + 1;
        assert!(one("p", huge).validate(&[]).is_err());
        let mut search = ws(&a);
        search.max_search_file_bytes = u64::MAX;
        let err = one("p", search).validate(&[]).expect_err("search bytes");
        assert!(err.contains("max_search_file_bytes"), "{err}");
        for set in [
            |w: &mut WorkspaceConfig| w.task_max_runtime_secs = u64::MAX,
            |w: &mut WorkspaceConfig| w.task_retention_secs = u64::MAX,
            |w: &mut WorkspaceConfig| w.cancel_grace_ms = u64::MAX,
            |w: &mut WorkspaceConfig| w.scan_time_limit_ms = u64::MAX,
        ] {
            let mut long = ws(&a);
            set(&mut long);
            let err = one("p", long)
                .validate(&[])
                .expect_err("a timeout past a day");
            assert!(err.contains("at most 86400 seconds"), "{err}");
        }
        let mut relative = ws(&a);
        relative.read_only_paths = vec!["opt".into()];
        assert!(one("p", relative).validate(&[]).is_err());
        let mut env = ws(&a);
        env.env.insert("A=B".into(), "x".into());
        assert!(one("p", env).validate(&[]).is_err());
        let mut slash = ws(&a);
        slash.root = "/".into();
        assert!(one("p", slash).validate(&[]).is_err());
    }
}
