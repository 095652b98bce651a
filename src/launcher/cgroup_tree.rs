//! Building the cgroup tree of [`crate::sandbox::cgroup`] at the gateway's start, before it
//! starts any other process or thread, when toolwall's cgroup is delegated to it.
//!
//! Delegated means: a cgroup v2 directory that is not the root of the hierarchy, that
//! this process may write, holding the `pids` and `memory` controllers, and that was handed
//! to toolwall: owned by its user (systemd's `Delegate=` chowns it to a service's `User=`),
//! or, for root, marked delegated by systemd (`trusted.delegate` or `user.delegate`
//! extended attribute). Root's session or service cgroup that systemd did not delegate is
//! left alone. Anything missing: the limits are not in force, and the reason is kept for
//! `toolwall status`.

use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::identity::AgentIdentity;
use crate::config::Config;
use crate::sandbox::CgroupMode;
use crate::sandbox::cgroup::{
    self, CgroupLayout, CgroupLimits, missing_controllers, subtree_control_line, usable_controllers,
};

/// The cgroup of one workspace.
#[derive(Debug, Clone)]
pub struct WorkspaceCgroup {
    pub dir: PathBuf,
    /// Where its worker goes (the launcher places it there).
    pub worker_leaf: PathBuf,
    pub limits: CgroupLimits,
    /// Where the worker makes its tasks' cgroups, when its agent user may: else why not.
    pub tasks: Result<PathBuf, String>,
}

/// What was built, or why nothing was.
#[derive(Debug)]
pub enum CgroupTree {
    InForce {
        layout: CgroupLayout,
        controllers: Vec<&'static str>,
        /// By workspace id.
        workspaces: BTreeMap<String, WorkspaceCgroup>,
        /// `servers/` was made: local servers get a cgroup each ([`CgroupTree::server`]).
        servers: bool,
    },
    Off(String),
}

impl CgroupTree {
    pub fn in_force(&self) -> bool {
        matches!(self, CgroupTree::InForce { .. })
    }

    pub fn workspace(&self, id: &str) -> Option<&WorkspaceCgroup> {
        match self {
            CgroupTree::InForce { workspaces, .. } => workspaces.get(id),
            CgroupTree::Off(_) => None,
        }
    }

    /// Makes (or finds) local server `name`'s cgroup and writes `limits` there; its path.
    /// Called at start and on each reload, so changed limits land before the server
    /// starts again.
    pub fn server(&self, name: &str, limits: CgroupLimits) -> Result<PathBuf, String> {
        let CgroupTree::InForce {
            layout,
            controllers,
            servers: true,
            ..
        } = self
        else {
            return Err(match self {
                CgroupTree::Off(reason) => reason.clone(),
                _ => "no local server was configured at start (restart toolwall)".into(),
            });
        };
        for op in server_ops(layout, controllers, name, limits)? {
            apply(&op)?;
        }
        Ok(layout.server(name))
    }

    pub fn controllers(&self) -> &[&'static str] {
        match self {
            CgroupTree::InForce { controllers, .. } => controllers,
            CgroupTree::Off(_) => &[],
        }
    }

    /// For `toolwall status`.
    pub fn status_json(&self) -> Value {
        match self {
            CgroupTree::Off(reason) => json!({
                "in_force": false,
                "reason": reason,
            }),
            CgroupTree::InForce {
                layout,
                controllers,
                workspaces,
                ..
            } => json!({
                "in_force": true,
                "path": layout.service,
                "controllers": controllers,
                "workspaces": workspaces.iter().map(|(id, w)| json!({
                    "id": id,
                    "path": w.dir,
                    "pids_max": w.limits.pids_max,
                    "memory_max_bytes": w.limits.memory_max_bytes,
                    "cpu_weight": w.limits.cpu_weight,
                    "task_cgroups": w.tasks.is_ok(),
                    "task_cgroups_reason": w.tasks.as_ref().err(),
                })).collect::<Vec<_>>(),
            }),
        }
    }
}

/// One workspace to give a cgroup: its id, its limits, and the agent user its worker runs
/// as (who must be able to make task cgroups).
pub struct WorkspaceRequest {
    pub id: String,
    pub limits: CgroupLimits,
    pub agent: Option<AgentIdentity>,
}

/// Builds the tree when `[sandbox] cgroups` allows and toolwall's cgroup is delegated
/// (`servers`: with the parent of the local servers' cgroups). Moves this process into
/// the gateway's leaf. Call before starting any process.
pub fn build(config: &Config, workspaces: &[WorkspaceRequest], servers: bool) -> CgroupTree {
    if config.sandbox.cgroups == CgroupMode::Off {
        return CgroupTree::Off("[sandbox] cgroups = \"off\"".into());
    }
    if workspaces.is_empty() && !servers {
        return CgroupTree::Off("no workspace and no local server".into());
    }
    match try_build(workspaces, servers) {
        Ok(tree) => tree,
        Err(reason) => CgroupTree::Off(reason),
    }
}

fn read(path: &Path) -> Result<String, String> {
    crate::config::read_bounded(path, 1024 * 1024).map_err(|e| format!("{}: {e}", path.display()))
}

fn write(path: &Path, value: &str) -> Result<(), String> {
    std::fs::write(path, value).map_err(|e| format!("writing {value:?} to {}: {e}", path.display()))
}

fn mkdir(path: &Path) -> Result<(), String> {
    match std::fs::create_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!("creating {}: {e}", path.display())),
    }
}

/// Whether systemd marked `dir` delegated (an extended attribute `*.delegate` = `1`).
fn marked_delegated(dir: &Path) -> bool {
    let Some(c) = crate::sandbox::c_path(dir) else {
        return false;
    };
    [c"trusted.delegate", c"user.delegate"].iter().any(|name| {
        let mut buf = [0u8; 8];
        // SAFETY: valid C strings and a buffer of the size given.
        let n = unsafe {
            libc::getxattr(
                c.as_ptr(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        n > 0 && buf[0] == b'1'
    })
}

fn writable(path: &Path) -> bool {
    crate::sandbox::c_path(path)
        // SAFETY: a valid C string.
        .is_some_and(|c| unsafe { libc::access(c.as_ptr(), libc::W_OK) } == 0)
}

fn try_build(workspaces: &[WorkspaceRequest], servers: bool) -> Result<CgroupTree, String> {
    use std::os::unix::fs::MetadataExt;
    let mount = cgroup::cgroup2_mount(&read(Path::new("/proc/self/mountinfo"))?)
        .ok_or("no cgroup v2 hierarchy is mounted")?;
    let own = cgroup::own_cgroup_path(&read(Path::new("/proc/self/cgroup"))?)
        .ok_or("this process is in no cgroup v2 (a cgroup v1 only host)")?;
    if own == Path::new("/") {
        return Err(
            "toolwall runs in the root cgroup, which it does not take over (run it with systemd's Delegate=yes)"
                .into(),
        );
    }
    let service = cgroup::dir_of(&mount, &own);
    let meta = std::fs::metadata(&service).map_err(|e| format!("{}: {e}", service.display()))?;
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    let delegated = if euid == 0 {
        marked_delegated(&service)
    } else {
        meta.uid() == euid
    };
    if !delegated
        || !writable(&service.join("cgroup.procs"))
        || !writable(&service.join("cgroup.subtree_control"))
    {
        return Err(format!(
            "toolwall's cgroup {} is not delegated to it (systemd: Delegate=yes in the unit)",
            service.display()
        ));
    }
    let controllers = usable_controllers(&read(&service.join("cgroup.controllers"))?);
    if let Some(why) = missing_controllers(&controllers) {
        return Err(format!("{why} ({})", service.display()));
    }
    let layout = CgroupLayout { service };
    let ops = tree_ops(
        &layout,
        &controllers,
        workspaces,
        servers,
        std::process::id(),
        euid == 0,
    )?;
    let mut handed: BTreeMap<String, Result<(), String>> = BTreeMap::new();
    for op in &ops {
        let TreeOp::Hand {
            workspace,
            path,
            uid,
            gid,
            mode,
        } = op
        else {
            apply(op)?;
            continue;
        };
        let entry = handed.entry(workspace.clone()).or_insert(Ok(()));
        if entry.is_ok()
            && let Err(e) = hand(path, *uid, *gid, *mode)
        {
            *entry = Err(e);
        }
    }
    let mut out = BTreeMap::new();
    for ws in workspaces {
        let tasks = match handed.get(&ws.id) {
            Some(Err(e)) => Err(e.clone()),
            _ => Ok(layout.tasks(&ws.id)),
        };
        out.insert(
            ws.id.clone(),
            WorkspaceCgroup {
                dir: layout.workspace(&ws.id),
                worker_leaf: layout.worker_leaf(&ws.id),
                limits: ws.limits,
                tasks,
            },
        );
    }
    Ok(CgroupTree::InForce {
        layout,
        controllers,
        workspaces: out,
        servers,
    })
}

/// Makes a directory or writes a file of the tree (a `Hand` is the caller's).
fn apply(op: &TreeOp) -> Result<(), String> {
    match op {
        TreeOp::Mkdir(path) => mkdir(path),
        TreeOp::Write {
            path,
            value,
            optional,
        } => {
            if *optional && !path.exists() {
                return Ok(());
            }
            write(path, value)
        }
        TreeOp::Hand { .. } => Ok(()),
    }
}

/// A local server's cgroup with its limits. Pure.
pub fn server_ops(
    layout: &CgroupLayout,
    controllers: &[&str],
    name: &str,
    limits: CgroupLimits,
) -> Result<Vec<TreeOp>, String> {
    if !cgroup::valid_leaf_name(name) {
        return Err(format!("server name {name:?} is no cgroup name"));
    }
    let dir = layout.server(name);
    let mut ops = vec![TreeOp::Mkdir(dir.clone())];
    for (file, value) in limits.writes(controllers) {
        ops.push(TreeOp::Write {
            path: dir.join(file),
            value,
            optional: file == "memory.swap.max",
        });
    }
    Ok(ops)
}

/// Kills every process in the cgroup `dir` (`cgroup.kill`, Linux 5.14; before it, each
/// pid of `cgroup.procs` gets SIGKILL until none is left). What a program started,
/// however it detached (new session, double fork), is in its cgroup and dies here.
pub fn kill_all(dir: &Path) -> Result<(), String> {
    match std::fs::write(dir.join("cgroup.kill"), "1") {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(format!("{}/cgroup.kill: {e}", dir.display()));
        }
        Err(_) => {}
    }
    // Processes forking as fast as they are killed: pids.max bounds them, and so do the
    // rounds here.
    for _ in 0..100 {
        let procs = read(&dir.join("cgroup.procs"))?;
        let pids: Vec<i32> = procs
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .filter(|p| *p > 0)
            .collect();
        if pids.is_empty() {
            return Ok(());
        }
        for pid in pids {
            // SAFETY: kill(2) with a pid read from the cgroup; a pid reused since is
            // reused inside the same cgroup only while it still holds processes.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Err(format!(
        "{}: processes left after 100 rounds of SIGKILL",
        dir.display()
    ))
}

/// Whether a process is left in the cgroup `dir` (`cgroup.events`: `populated 1`).
pub fn populated(dir: &Path) -> bool {
    read(&dir.join("cgroup.events"))
        .map(|e| e.lines().any(|l| l.trim() == "populated 1"))
        .unwrap_or(false)
}

/// A cgroup's limits and use for `toolwall status` (each file as the kernel says it).
pub fn usage_json(dir: &Path) -> Value {
    let file = |name: &str| {
        crate::config::read_bounded(&dir.join(name), 4096)
            .ok()
            .map(|s| s.trim().to_string())
    };
    json!({
        "path": dir,
        "pids.max": file("pids.max"),
        "pids.current": file("pids.current"),
        "memory.max": file("memory.max"),
        "memory.current": file("memory.current"),
        "memory.events.oom_kill": file("memory.events").and_then(|e| {
            e.lines()
                .find_map(|l| l.strip_prefix("oom_kill ").map(|v| v.trim().to_string()))
        }),
    })
}

/// One step of building the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TreeOp {
    Mkdir(PathBuf),
    /// `optional`: skipped when the file does not exist (`memory.swap.max` without swap
    /// accounting).
    Write {
        path: PathBuf,
        value: String,
        optional: bool,
    },
    /// Give a file or directory to a workspace's agent user (`uid` when toolwall is root,
    /// else only the group) with `mode`.
    Hand {
        workspace: String,
        path: PathBuf,
        uid: Option<u32>,
        gid: u32,
        mode: u32,
    },
}

/// Every step, in order: the gateway's leaf and this process (`pid`) in it before the
/// controllers are handed down (only leaves hold processes), then each workspace's
/// cgroup with its limits, its worker's leaf and its tasks' parent, handed to its agent
/// user. Pure.
pub fn tree_ops(
    layout: &CgroupLayout,
    controllers: &[&str],
    workspaces: &[WorkspaceRequest],
    servers: bool,
    pid: u32,
    root: bool,
) -> Result<Vec<TreeOp>, String> {
    let control = subtree_control_line(controllers);
    let write = |path: PathBuf, value: String| TreeOp::Write {
        path,
        value,
        optional: false,
    };
    let mut ops = vec![
        TreeOp::Mkdir(layout.gateway_leaf()),
        write(layout.gateway_leaf().join("cgroup.procs"), pid.to_string()),
        write(
            layout.service.join("cgroup.subtree_control"),
            control.clone(),
        ),
        TreeOp::Mkdir(layout.workspaces()),
        write(
            layout.workspaces().join("cgroup.subtree_control"),
            control.clone(),
        ),
    ];
    if servers {
        // Each server's cgroup is a leaf below (made by `server_ops`, at start and on
        // reload): the controllers go down to it so its limits bind.
        ops.push(TreeOp::Mkdir(layout.servers()));
        ops.push(write(
            layout.servers().join("cgroup.subtree_control"),
            control.clone(),
        ));
    }
    for ws in workspaces {
        if !cgroup::valid_leaf_name(&ws.id) {
            return Err(format!("workspace id {:?} is no cgroup name", ws.id));
        }
        let dir = layout.workspace(&ws.id);
        ops.push(TreeOp::Mkdir(dir.clone()));
        for (file, value) in ws.limits.writes(controllers) {
            ops.push(TreeOp::Write {
                path: dir.join(file),
                value,
                optional: file == "memory.swap.max",
            });
        }
        ops.push(write(dir.join("cgroup.subtree_control"), control.clone()));
        ops.push(TreeOp::Mkdir(layout.worker_leaf(&ws.id)));
        let tasks = layout.tasks(&ws.id);
        ops.push(TreeOp::Mkdir(tasks.clone()));
        ops.push(write(tasks.join("cgroup.subtree_control"), control.clone()));
        if let Some(agent) = &ws.agent {
            // The agent user makes task cgroups under tasks/ and moves its leaders from
            // the worker's leaf into them: writing cgroup.procs needs write access there
            // and at the common ancestor, the workspace's cgroup. Its limits stay ours.
            for (path, mode) in [
                (tasks.clone(), 0o770),
                (tasks.join("cgroup.procs"), 0o660),
                (tasks.join("cgroup.subtree_control"), 0o660),
                (dir.join("cgroup.procs"), 0o660),
                (layout.worker_leaf(&ws.id).join("cgroup.procs"), 0o660),
            ] {
                ops.push(TreeOp::Hand {
                    workspace: ws.id.clone(),
                    path,
                    uid: root.then_some(agent.uid),
                    gid: agent.gid,
                    mode,
                });
            }
        }
    }
    Ok(ops)
}

/// Root hands a file over; a service user gives it to the agent's group, which works when
/// it belongs to that group.
fn hand(path: &Path, uid: Option<u32>, gid: u32, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::os::unix::fs::chown(path, uid, Some(gid)).map_err(|e| {
        format!(
            "handing {} to the agent user: {e} (task cgroups need toolwall's user in the agent's group, or root)",
            path.display()
        )
    })?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a real cgroup v2 file system (it needs no controller, only a cgroup this test may
    /// make, as root): a process that left its session and ignores SIGTERM, moved into a
    /// cgroup, is gone after `kill_all`, and `populated` says so. Skipped, saying why,
    /// where no cgroup can be made.
    #[test]
    fn kill_all_ends_every_process_of_a_real_cgroup() {
        let made = (|| -> Result<PathBuf, String> {
            let mount = cgroup::cgroup2_mount(&read(Path::new("/proc/self/mountinfo"))?)
                .ok_or("no cgroup v2 mount")?;
            let own = cgroup::own_cgroup_path(&read(Path::new("/proc/self/cgroup"))?)
                .ok_or("in no cgroup v2")?;
            let dir =
                cgroup::dir_of(&mount, &own).join(format!("toolwall-test-{}", std::process::id()));
            std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            Ok(dir)
        })();
        let dir = match made {
            Ok(d) => d,
            Err(e) => {
                eprintln!("SKIPPED kill_all on a real cgroup: {e}");
                return;
            }
        };
        let mut child = std::process::Command::new("setsid")
            .args(["sh", "-c", "trap '' TERM; sleep 600 & wait"])
            .spawn()
            .expect("spawn");
        let moved = std::fs::write(dir.join("cgroup.procs"), child.id().to_string());
        if let Err(e) = moved {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_dir(&dir);
            eprintln!("SKIPPED kill_all on a real cgroup: moving a process: {e}");
            return;
        }
        // Its grandchild (`sleep`) is born inside too.
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(populated(&dir));
        kill_all(&dir).expect("kill_all");
        let status = child.wait().expect("wait");
        assert!(!status.success());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while populated(&dir) {
            assert!(
                std::time::Instant::now() < deadline,
                "processes left in {dir:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        std::fs::remove_dir(&dir).expect("rmdir");
    }

    #[test]
    fn the_gateway_leaves_its_cgroup_before_controllers_go_down_and_limits_land_in_place() {
        let layout = CgroupLayout {
            service: PathBuf::from("/cg/toolwall.service"),
        };
        let agent = AgentIdentity {
            name: "toolwall-agent".into(),
            uid: 990,
            gid: 980,
        };
        let ws = WorkspaceRequest {
            id: "wrk_0123456789ab".into(),
            limits: CgroupLimits {
                pids_max: Some(100),
                memory_max_bytes: Some(64 << 20),
                cpu_weight: Some(50),
            },
            agent: Some(agent),
        };
        let ops = tree_ops(
            &layout,
            &["pids", "memory", "cpu"],
            &[ws],
            true,
            4242,
            false,
        )
        .expect("ops");
        let pos = |want: &TreeOp| {
            ops.iter()
                .position(|o| o == want)
                .unwrap_or_else(|| panic!("{want:?} missing from {ops:#?}"))
        };
        let w = |p: &str, v: &str| TreeOp::Write {
            path: PathBuf::from(p),
            value: v.into(),
            optional: false,
        };
        let moved = pos(&w("/cg/toolwall.service/gateway/cgroup.procs", "4242"));
        let handed_down = pos(&w(
            "/cg/toolwall.service/cgroup.subtree_control",
            "+pids +memory +cpu",
        ));
        assert!(moved < handed_down, "only leaves hold processes");
        let ws = "/cg/toolwall.service/workspaces/wrk_0123456789ab";
        pos(&w(&format!("{ws}/pids.max"), "100"));
        pos(&w(&format!("{ws}/memory.max"), "67108864"));
        pos(&w(&format!("{ws}/cpu.weight"), "50"));
        pos(&TreeOp::Write {
            path: PathBuf::from(format!("{ws}/memory.swap.max")),
            value: "0".into(),
            optional: true,
        });
        pos(&TreeOp::Mkdir(PathBuf::from(format!("{ws}/worker"))));
        // A service user hands the group only; the limits are never handed.
        let hands: Vec<&TreeOp> = ops
            .iter()
            .filter(|o| matches!(o, TreeOp::Hand { .. }))
            .collect();
        assert_eq!(hands.len(), 5);
        for h in hands {
            let TreeOp::Hand { path, uid, gid, .. } = h else {
                unreachable!()
            };
            assert_eq!((*uid, *gid), (None, 980));
            assert!(!path.to_string_lossy().contains(".max"), "{path:?}");
        }
        let bad = WorkspaceRequest {
            id: "../x".into(),
            limits: CgroupLimits::default(),
            agent: None,
        };
        assert!(tree_ops(&layout, &["pids", "memory"], &[bad], false, 1, true).is_err());
        // The servers' parent hands the controllers down; a server's leaf holds its limits.
        pos(&w(
            "/cg/toolwall.service/servers/cgroup.subtree_control",
            "+pids +memory +cpu",
        ));
        let limits = CgroupLimits {
            pids_max: Some(64),
            memory_max_bytes: Some(32 << 20),
            cpu_weight: None,
        };
        let server = server_ops(&layout, &["pids", "memory"], "fs", limits).expect("ops");
        assert_eq!(
            server[0],
            TreeOp::Mkdir(PathBuf::from("/cg/toolwall.service/servers/fs"))
        );
        assert!(server.contains(&w("/cg/toolwall.service/servers/fs/pids.max", "64")));
        assert!(server.contains(&w("/cg/toolwall.service/servers/fs/memory.max", "33554432")));
        assert!(server_ops(&layout, &["pids"], "../gateway", limits).is_err());
    }
}
