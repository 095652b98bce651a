//! `system_info`: what the machine is and what this workspace may do on it. Read from
//! system calls (uname, sysinfo, sched_getaffinity) and /etc/os-release, never /proc
//! (which the workspace cannot read).

use serde_json::{Value, json};

/// Most bytes of /etc/os-release read.
const MAX_OS_RELEASE_BYTES: u64 = 16 * 1024;

fn c_field(field: &[libc::c_char]) -> String {
    // uname fills NUL-terminated fields; the slice bounds the read either way.
    let bytes: Vec<u8> = field
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn uname() -> Option<(String, String, String, String)> {
    // SAFETY: a zeroed utsname is valid; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer.
    if unsafe { libc::uname(&mut u) } != 0 {
        return None;
    }
    Some((
        c_field(&u.sysname),
        c_field(&u.release),
        c_field(&u.nodename),
        c_field(&u.machine),
    ))
}

fn memory() -> Option<(u64, u64)> {
    // SAFETY: a zeroed sysinfo is valid; sysinfo fills it.
    let mut s: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer.
    if unsafe { libc::sysinfo(&mut s) } != 0 {
        return None;
    }
    let unit = u64::from(s.mem_unit.max(1));
    Some((
        s.totalram as u64 * unit,
        (s.freeram as u64 + s.bufferram as u64) * unit,
    ))
}

fn cpus() -> usize {
    // SAFETY: a zeroed cpu_set_t is valid; the call fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer and size.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return 0;
    }
    // SAFETY: a filled set.
    unsafe { libc::CPU_COUNT(&set) as usize }
}

/// `PRETTY_NAME` of /etc/os-release, if readable.
fn os_name() -> Option<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open("/etc/os-release")
        .ok()?
        .take(MAX_OS_RELEASE_BYTES)
        .read_to_string(&mut text)
        .ok()?;
    text.lines().find_map(|line| {
        line.strip_prefix("PRETTY_NAME=")
            .map(|v| v.trim_matches('"').to_string())
    })
}

/// The answer, with the workspace's own facts (`workspace`: id, name, root, tools, limits,
/// network) and its confinement report.
pub fn system_info(workspace: Value, confinement: Value) -> Value {
    let (sysname, kernel, hostname, machine) = uname().unwrap_or_default();
    let (memory_total, memory_available) = memory().unwrap_or_default();
    json!({
        "os": sysname,
        "os_name": os_name(),
        "kernel": kernel,
        "arch": machine,
        "hostname": hostname,
        "cpus": cpus(),
        "memory_total_bytes": memory_total,
        "memory_available_bytes": memory_available,
        "shell": super::launch::SHELL,
        "workspace": workspace,
        "confinement": confinement,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn facts_come_from_the_kernel() {
        let v = super::system_info(serde_json::json!({}), serde_json::json!({}));
        assert_eq!(v["os"], "Linux");
        assert!(v["cpus"].as_u64().unwrap_or(0) >= 1);
        assert!(v["memory_total_bytes"].as_u64().unwrap_or(0) > 0);
        assert!(!v["kernel"].as_str().unwrap_or("").is_empty());
    }
}
