//! Linux capabilities of the calling thread: reading the five sets, and emptying them.
//!
//! Every function here makes plain system calls and never allocates, so the ones that
//! change something can run between fork and exec (the agent launcher's child, a worker's
//! pre-exec).

use std::io;

/// `CAP_SETGID`: change group ids (the agent launcher's switch to the agent user).
pub const CAP_SETGID: u32 = 6;
/// `CAP_SETUID`: change user ids.
pub const CAP_SETUID: u32 = 7;
/// `CAP_SETPCAP`: drop capabilities from the bounding set.
pub const CAP_SETPCAP: u32 = 8;
/// Highest capability number the bounding-set loops look at; the kernel answers EINVAL
/// above its own last one, which ends the loop earlier.
const MAX_CAP: u32 = 63;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// The five capability sets of the calling thread, one bit per capability.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CapabilitySets {
    pub effective: u64,
    pub permitted: u64,
    pub inheritable: u64,
    pub bounding: u64,
    pub ambient: u64,
}

impl CapabilitySets {
    /// The calling thread's sets.
    pub fn current() -> io::Result<CapabilitySets> {
        let header = CapHeader {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        let mut data = [CapData::default(); 2];
        // SAFETY: version 3 takes a header and two data structs, both valid for the call.
        let rc = unsafe { libc::syscall(libc::SYS_capget, &header, data.as_mut_ptr()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        let join = |lo: u32, hi: u32| u64::from(lo) | (u64::from(hi) << 32);
        Ok(CapabilitySets {
            effective: join(data[0].effective, data[1].effective),
            permitted: join(data[0].permitted, data[1].permitted),
            inheritable: join(data[0].inheritable, data[1].inheritable),
            bounding: read_set(libc::PR_CAPBSET_READ, 0)?,
            ambient: read_set(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_IS_SET as u64)?,
        })
    }

    /// Whether `cap` is in the permitted set.
    pub fn permits(&self, cap: u32) -> bool {
        self.permitted & (1u64 << cap) != 0
    }

    /// No capability held now, none inheritable, none ambient.
    pub fn holds_none(&self) -> bool {
        self.effective == 0 && self.permitted == 0 && self.inheritable == 0 && self.ambient == 0
    }

    /// One line for reports: what is held, and how large the bounding set is.
    pub fn describe(&self) -> String {
        format!(
            "effective {:#x}, permitted {:#x}, inheritable {:#x}, ambient {:#x}, bounding {:#x} ({} capabilities)",
            self.effective,
            self.permitted,
            self.inheritable,
            self.ambient,
            self.bounding,
            self.bounding.count_ones()
        )
    }
}

/// Reads a set the kernel answers one capability at a time (bounding, ambient). EINVAL
/// past the kernel's last capability ends the set; any other error (a seccomp filter that
/// refuses the query) is an error, never an empty set.
fn read_set(option: libc::c_int, arg: u64) -> io::Result<u64> {
    let mut set = 0u64;
    for cap in 0..=MAX_CAP {
        // SAFETY: prctl with integer arguments.
        let rc = unsafe {
            if option == libc::PR_CAP_AMBIENT {
                libc::prctl(option, arg as libc::c_ulong, cap as libc::c_ulong, 0, 0)
            } else {
                libc::prctl(option, cap as libc::c_ulong, 0, 0, 0)
            }
        };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINVAL) && cap > 0 {
                break;
            }
            return Err(e);
        }
        if rc == 1 {
            set |= 1u64 << cap;
        }
    }
    Ok(set)
}

/// Drops every capability from the bounding set, so nothing this process executes can
/// ever gain one (file capabilities, set-user-ID root programs). Needs `CAP_SETPCAP` in
/// the effective set; without it the set stays and the error says so.
/// Async-signal-safe.
pub fn drop_bounding_set() -> io::Result<()> {
    for cap in 0..=MAX_CAP {
        // SAFETY: prctl with integer arguments.
        let present = unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap as libc::c_ulong, 0, 0, 0) };
        if present < 0 {
            // Past the kernel's last capability.
            break;
        }
        if present == 0 {
            continue;
        }
        // SAFETY: prctl with integer arguments.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Empties the ambient, effective, permitted and inheritable sets. Async-signal-safe.
pub fn clear_held() -> io::Result<()> {
    // SAFETY: prctl with integer arguments; EINVAL on kernels without ambient sets (< 4.3),
    // which then have none to clear.
    let rc = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINVAL) {
            return Err(e);
        }
    }
    keep_only(0)
}

/// Keeps exactly the capabilities of `mask` in the effective and permitted sets (which
/// must hold them already) and empties the inheritable set. Async-signal-safe.
pub fn keep_only(mask: u64) -> io::Result<()> {
    let header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let lo = mask as u32;
    let hi = (mask >> 32) as u32;
    let data = [
        CapData {
            effective: lo,
            permitted: lo,
            inheritable: 0,
        },
        CapData {
            effective: hi,
            permitted: hi,
            inheritable: 0,
        },
    ];
    // SAFETY: version 3 takes a header and two data structs, both valid for the call.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The bit of capability `cap` in a set.
pub const fn bit(cap: u32) -> u64 {
    1u64 << cap
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sets_of_this_process_read_back_and_describe_themselves() {
        let sets = CapabilitySets::current().expect("capget");
        // Whatever runs the tests, the bounding set is never larger than the kernel knows.
        assert!(sets.bounding.count_ones() <= 64);
        assert!(sets.describe().contains("bounding"));
        assert_eq!(bit(CAP_SETUID), 1 << 7);
    }
}
