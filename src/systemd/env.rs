//! Removing the variables systemd set once they are consumed, so nothing started later takes
//! them for its own. Workers get a cleared environment anyway; this covers everything else.

/// Removes `names` from the environment when the process has exactly one thread, the only
/// time that is sound (another thread could be reading the environment). Returns whether it
/// did; with more threads the variables stay and a warning says so.
pub fn unset_if_single_threaded(names: &[&str]) -> bool {
    match thread_count() {
        Some(1) => {
            for name in names {
                // SAFETY: the process has one thread (checked just above, and no thread can
                // appear in between: only this one could start it), so nothing reads the
                // environment concurrently.
                unsafe { std::env::remove_var(name) };
            }
            true
        }
        other => {
            let threads = other.map_or_else(|| "unknown".to_string(), |n| n.to_string());
            crate::warn!(
                "leaving {} in the environment: {threads} threads are running (call this before starting any)",
                names.join(", ")
            );
            false
        }
    }
}

/// Threads of this process, from /proc (visible under `ProcSubset=pid`).
fn thread_count() -> Option<usize> {
    Some(std::fs::read_dir("/proc/self/task").ok()?.count())
}
