//! cgroup v2 for agent programs, the pure part: where toolwall's own cgroup is, which tree
//! it builds under it, and what it writes. No file is touched here (see
//! `crate::launcher::cgroup_tree` for that).
//!
//! When the gateway's cgroup is delegated to it (systemd `Delegate=yes`, or a root gateway
//! told to manage its own), the tree is:
//!
//! ```text
//! <service>/                      controllers enabled for the children below
//!   gateway/                      the gateway, its launcher, builtin and aggregator
//!   workspaces/
//!     <workspace id>/             pids.max, memory.max, cpu.weight of the workspace: the wall
//!       worker/                   the workspace's worker
//!       tasks/
//!         <task id>/              pids.max, memory.max of one task (set by the worker)
//!   servers/
//!     <server name>/              pids.max, memory.max of one local server: its host, the
//!                                 host's leader and every process of its program
//! ```
//!
//! cgroup v2 lets only leaves hold processes once controllers are enabled below a cgroup,
//! hence the `gateway/` and `worker/` leaves. The workspace's limits are written by
//! toolwall's user and bind every process of the workspace, whatever they do. The task
//! cgroups are made by the worker as the agent user; a program could raise its own task's
//! limits, never above its workspace's.

use std::path::{Path, PathBuf};

/// Controllers the tree uses; `pids` and `memory` must be available for it to be in force.
pub const WANTED_CONTROLLERS: &[&str] = &["pids", "memory", "cpu"];
/// Controllers without which no cgroup limit is in force.
pub const REQUIRED_CONTROLLERS: &[&str] = &["pids", "memory"];

/// Leaf of the gateway's own processes.
pub const GATEWAY_LEAF: &str = "gateway";
/// Parent of the workspaces' cgroups.
pub const WORKSPACES_DIR: &str = "workspaces";
/// Leaf of a workspace's worker.
pub const WORKER_LEAF: &str = "worker";
/// Parent of a workspace's task cgroups.
pub const TASKS_DIR: &str = "tasks";
/// Parent of the local servers' cgroups.
pub const SERVERS_DIR: &str = "servers";

/// `cpu.weight` bounds (the kernel's).
pub const CPU_WEIGHT_MIN: u64 = 1;
pub const CPU_WEIGHT_MAX: u64 = 10_000;

/// The v2 path of this process's cgroup from `/proc/self/cgroup` (the `0::PATH` line).
pub fn own_cgroup_path(proc_self_cgroup: &str) -> Option<PathBuf> {
    proc_self_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| PathBuf::from(p.trim()))
        .filter(|p| p.is_absolute())
}

/// Where the cgroup2 file system is mounted, from `/proc/self/mountinfo` (the first
/// `cgroup2` mount: `/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on hybrid hosts).
pub fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let mut fields = left.split_whitespace();
        let root = fields.nth(3)?;
        let mount = fields.next()?;
        // A mount of a sub-tree (a container's) would shift every path: not handled.
        (root == "/").then(|| PathBuf::from(unescape_mount(mount)))
    })
}

/// mountinfo escapes spaces and a few other bytes as `\ooo`.
fn unescape_mount(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The controllers of `cgroup.controllers` among [`WANTED_CONTROLLERS`].
pub fn usable_controllers(cgroup_controllers: &str) -> Vec<&'static str> {
    let have: Vec<&str> = cgroup_controllers.split_whitespace().collect();
    WANTED_CONTROLLERS
        .iter()
        .copied()
        .filter(|c| have.contains(c))
        .collect()
}

/// Why the limits cannot be in force with `controllers`, or None when they can.
pub fn missing_controllers(controllers: &[&str]) -> Option<String> {
    let missing: Vec<&str> = REQUIRED_CONTROLLERS
        .iter()
        .copied()
        .filter(|c| !controllers.contains(c))
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "the {} controller{} {} not available in toolwall's cgroup",
            missing.join(" and "),
            if missing.len() > 1 { "s" } else { "" },
            if missing.len() > 1 { "are" } else { "is" }
        )
    })
}

/// What goes into `cgroup.subtree_control` to hand `controllers` to the children.
pub fn subtree_control_line(controllers: &[&str]) -> String {
    controllers
        .iter()
        .map(|c| format!("+{c}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Limits of one cgroup. None: no limit (the file says `max`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CgroupLimits {
    pub pids_max: Option<u64>,
    pub memory_max_bytes: Option<u64>,
    /// 1..=10000; None leaves the kernel's default (100).
    pub cpu_weight: Option<u64>,
}

impl CgroupLimits {
    /// The files to write, in order, for the controllers available. With a memory limit,
    /// swap is closed too (`memory.swap.max` = 0) where the file exists, so a hog cannot
    /// spill into swap; the caller skips a file that does not exist.
    pub fn writes(&self, controllers: &[&str]) -> Vec<(&'static str, String)> {
        let max = |v: Option<u64>| v.map_or_else(|| "max".to_string(), |n| n.to_string());
        let mut out = Vec::new();
        if controllers.contains(&"pids") {
            out.push(("pids.max", max(self.pids_max)));
        }
        if controllers.contains(&"memory") {
            out.push(("memory.max", max(self.memory_max_bytes)));
            if self.memory_max_bytes.is_some() {
                out.push(("memory.swap.max", "0".to_string()));
            }
        }
        if controllers.contains(&"cpu")
            && let Some(w) = self.cpu_weight
        {
            out.push((
                "cpu.weight",
                w.clamp(CPU_WEIGHT_MIN, CPU_WEIGHT_MAX).to_string(),
            ));
        }
        out
    }
}

/// The tree under the gateway's delegated cgroup `service` (an absolute path in the
/// mounted file system).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLayout {
    pub service: PathBuf,
}

impl CgroupLayout {
    pub fn gateway_leaf(&self) -> PathBuf {
        self.service.join(GATEWAY_LEAF)
    }

    pub fn workspaces(&self) -> PathBuf {
        self.service.join(WORKSPACES_DIR)
    }

    /// A workspace's cgroup; `id` is its `wrk_...` id (checked by [`valid_leaf_name`]).
    pub fn workspace(&self, id: &str) -> PathBuf {
        self.workspaces().join(id)
    }

    pub fn worker_leaf(&self, id: &str) -> PathBuf {
        self.workspace(id).join(WORKER_LEAF)
    }

    pub fn tasks(&self, id: &str) -> PathBuf {
        self.workspace(id).join(TASKS_DIR)
    }

    pub fn servers(&self) -> PathBuf {
        self.service.join(SERVERS_DIR)
    }

    /// A local server's cgroup (a leaf: its host and everything below it); `name` is
    /// checked by [`valid_leaf_name`].
    pub fn server(&self, name: &str) -> PathBuf {
        self.servers().join(name)
    }
}

/// A name usable as one cgroup directory: not empty, no `/`, not `.` or `..`, not a
/// kernel interface file's prefix, at most 64 bytes.
pub fn valid_leaf_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name != "."
        && name != ".."
        && !name.contains('/')
        && !name.contains('\0')
        && !name.starts_with("cgroup.")
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

/// The absolute directory of cgroup `path` (as `/proc/self/cgroup` names it) under the
/// mount point.
pub fn dir_of(mount: &Path, path: &Path) -> PathBuf {
    let rel = path.strip_prefix("/").unwrap_or(path);
    mount.join(rel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_v2_path_and_mount_are_found_on_unified_and_hybrid_hosts() {
        let hybrid = "9:name=systemd:/\n4:memory:/x\n0::/system.slice/toolwall.service\n";
        assert_eq!(
            own_cgroup_path(hybrid),
            Some(PathBuf::from("/system.slice/toolwall.service"))
        );
        assert_eq!(own_cgroup_path("4:memory:/x\n"), None);
        let mountinfo = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
41 31 0:38 / /sys/fs/cgroup/unified rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate
";
        assert_eq!(
            cgroup2_mount(mountinfo),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let spaced = "41 31 0:38 / /mnt/cg\\040two rw - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_mount(spaced), Some(PathBuf::from("/mnt/cg two")));
        // A container's view of a sub-tree is not used.
        assert_eq!(
            cgroup2_mount("41 31 0:38 /sub /sys/fs/cgroup rw - cgroup2 x rw\n"),
            None
        );
        assert_eq!(
            cgroup2_mount("32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw\n"),
            None
        );
    }

    #[test]
    fn controllers_decide_whether_limits_are_in_force() {
        assert_eq!(
            usable_controllers("cpuset cpu io memory pids"),
            vec!["pids", "memory", "cpu"]
        );
        assert_eq!(usable_controllers(""), Vec::<&str>::new());
        assert_eq!(missing_controllers(&["pids", "memory"]), None);
        assert_eq!(
            missing_controllers(&[]).as_deref(),
            Some("the pids and memory controllers are not available in toolwall's cgroup")
        );
        assert_eq!(
            missing_controllers(&["pids", "cpu"]).as_deref(),
            Some("the memory controller is not available in toolwall's cgroup")
        );
        assert_eq!(subtree_control_line(&["pids", "memory"]), "+pids +memory");
    }

    #[test]
    fn limits_become_the_files_written_max_when_unset_swap_closed_with_memory() {
        let all = ["pids", "memory", "cpu"];
        let limits = CgroupLimits {
            pids_max: Some(512),
            memory_max_bytes: Some(1 << 30),
            cpu_weight: Some(50_000),
        };
        assert_eq!(
            limits.writes(&all),
            vec![
                ("pids.max", "512".to_string()),
                ("memory.max", "1073741824".to_string()),
                ("memory.swap.max", "0".to_string()),
                ("cpu.weight", "10000".to_string()),
            ]
        );
        assert_eq!(
            CgroupLimits::default().writes(&all),
            vec![
                ("pids.max", "max".to_string()),
                ("memory.max", "max".to_string())
            ]
        );
        assert_eq!(
            limits.writes(&["pids"]),
            vec![("pids.max", "512".to_string())]
        );
    }

    #[test]
    fn the_layout_names_leaves_for_every_process_holder() {
        let l = CgroupLayout {
            service: PathBuf::from("/sys/fs/cgroup/system.slice/toolwall.service"),
        };
        assert_eq!(
            l.worker_leaf("wrk_0123456789ab"),
            PathBuf::from(
                "/sys/fs/cgroup/system.slice/toolwall.service/workspaces/wrk_0123456789ab/worker"
            )
        );
        assert_eq!(
            l.gateway_leaf().file_name().and_then(|n| n.to_str()),
            Some("gateway")
        );
        assert_eq!(
            dir_of(
                Path::new("/sys/fs/cgroup"),
                Path::new("/system.slice/x.service")
            ),
            PathBuf::from("/sys/fs/cgroup/system.slice/x.service")
        );
        for bad in ["", ".", "..", "a/b", "cgroup.procs", "é", &"x".repeat(65)] {
            assert!(!valid_leaf_name(bad), "{bad:?}");
        }
        assert!(valid_leaf_name("tsk_0123456789ab"));
    }
}
