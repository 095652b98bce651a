//! A cgroup per task (where cgroups are in force and the agent user may make them): the
//! worker makes `tasks/<task id>/`, writes its limits, and hands the task's leader an fd
//! on its `cgroup.procs`; the leader writes `0` into it (moving itself) before it starts
//! the command, so every process of the task is born inside. The directory goes when the
//! leader has been reaped. The workspace's own cgroup, written by toolwall's user, is the
//! wall; a task's limits keep one task from taking all of it.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use super::settings::TaskCgroups;
use crate::sandbox::cgroup::{self, WANTED_CONTROLLERS};

/// A task's cgroup, made and ready for its leader.
pub struct TaskCgroup {
    pub dir: PathBuf,
    /// `cgroup.procs`, opened for writing (close-on-exec; the leader writes before exec).
    pub procs: OwnedFd,
}

/// Makes the cgroup of task `id` under `cfg.dir` with `cfg.limits`.
pub fn make(cfg: &TaskCgroups, id: &str) -> Result<TaskCgroup, String> {
    if !cgroup::valid_leaf_name(id) {
        return Err(format!("task id {id:?} is no cgroup name"));
    }
    let dir = cfg.dir.join(id);
    std::fs::create_dir(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let made = (|| {
        for (file, value) in cfg.limits.writes(WANTED_CONTROLLERS) {
            let path = dir.join(file);
            if !path.exists() {
                // A controller the parent does not hand down, or no swap accounting.
                continue;
            }
            std::fs::write(&path, &value)
                .map_err(|e| format!("writing {value} to {}: {e}", path.display()))?;
        }
        let procs = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("cgroup.procs"))
            .map_err(|e| format!("{}/cgroup.procs: {e}", dir.display()))?;
        Ok(TaskCgroup {
            dir: dir.clone(),
            procs: OwnedFd::from(procs),
        })
    })();
    if made.is_err() {
        remove(&dir);
    }
    made
}

/// Removes a task's cgroup once its processes are gone (it fails, harmlessly, while any
/// is left).
pub fn remove(dir: &Path) {
    let _ = std::fs::remove_dir(dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a cgroup file system the directory is made like any other: the limits
    /// whose files do not exist are skipped, and a missing cgroup.procs is an error that
    /// leaves nothing behind.
    #[test]
    fn a_task_cgroup_without_its_interface_files_is_refused_and_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = TaskCgroups {
            dir: dir.path().to_path_buf(),
            limits: Default::default(),
        };
        let err = make(&cfg, "tsk_0123456789ab")
            .err()
            .expect("no cgroup.procs");
        assert!(err.contains("cgroup.procs"), "{err}");
        assert!(!dir.path().join("tsk_0123456789ab").exists());
        assert!(make(&cfg, "../escape").is_err());
    }
}
