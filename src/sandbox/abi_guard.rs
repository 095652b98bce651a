//! The ABI guard: a small seccomp filter installed under every role's filters, written by
//! hand because seccompiler does not emit it.
//!
//! seccompiler checks the architecture (`AUDIT_ARCH_X86_64`) and then compares the system
//! call number with its table. On x86_64 the x32 ABI shares that architecture value and
//! marks its calls with bit 30 of the number (`__X32_SYSCALL_BIT`, 0x40000000): such a
//! number matches no rule, so a deny-list (`mismatch_action` allow) lets it through. On a
//! kernel built with x32 that would run `unshare`, `mount`, `bpf`, `io_uring_setup`... by
//! their x32 numbers. An allow-list refuses it only by accident of its default.
//!
//! The guard answers EPERM to any number with that bit, and kills the process for a foreign architecture
//! (a 32-bit `int 0x80` call from a 64-bit program), as seccompiler does. When filters
//! disagree the kernel takes the most restrictive action, so EPERM here beats an ALLOW of
//! any other filter, whatever the order of installation.

use seccompiler::{BpfProgram, sock_filter};

/// BPF_LD | BPF_W | BPF_ABS (0x00 | 0x00 | 0x20).
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JMP_JEQ_K: u16 = 0x05 | 0x10;
const BPF_JMP_JSET_K: u16 = 0x05 | 0x40;
const BPF_RET_K: u16 = 0x06;

/// Offsets in `struct seccomp_data`.
const NR_OFFSET: u32 = 0;
const ARCH_OFFSET: u32 = 4;

const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;

/// `__X32_SYSCALL_BIT`.
pub const X32_BIT: u32 = 0x4000_0000;

/// `AUDIT_ARCH_*` of the running architecture, or None where toolwall has no profile.
fn native_audit_arch() -> Option<u32> {
    const AUDIT_ARCH_64BIT: u32 = 0x8000_0000;
    const AUDIT_ARCH_LE: u32 = 0x4000_0000;
    let machine = match std::env::consts::ARCH {
        "x86_64" => 62,
        "aarch64" => 183,
        "riscv64" => 243,
        _ => return None,
    };
    Some(machine | AUDIT_ARCH_64BIT | AUDIT_ARCH_LE)
}

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// The guard program for the running architecture.
pub fn program() -> Result<BpfProgram, String> {
    let arch = native_audit_arch()
        .ok_or_else(|| format!("no ABI guard for architecture {}", std::env::consts::ARCH))?;
    Ok(program_for(arch, errno_action(libc::EPERM as u32)))
}

fn errno_action(errno: u32) -> u32 {
    SECCOMP_RET_ERRNO | (errno & 0xffff)
}

/// The guard for architecture `arch`; `deny` is the action for a refused number.
fn program_for(arch: u32, deny: u32) -> BpfProgram {
    vec![
        // 0: the architecture must be the native one, else kill (as seccompiler does).
        stmt(BPF_LD_W_ABS, ARCH_OFFSET),
        jump(BPF_JMP_JEQ_K, arch, 0, 4),
        // 2: the number: the x32 bit is refused.
        stmt(BPF_LD_W_ABS, NR_OFFSET),
        jump(BPF_JMP_JSET_K, X32_BIT, 1, 0),
        // 4: native call: the role's own filters decide.
        stmt(BPF_RET_K, SECCOMP_RET_ALLOW),
        // 5: refused number.
        stmt(BPF_RET_K, deny),
        // 6: foreign architecture.
        stmt(BPF_RET_K, SECCOMP_RET_KILL_PROCESS),
    ]
}

/// What the guard answers for a call, computed by interpreting the program: lets the unit
/// tests check it without installing it.
#[cfg(test)]
pub(super) fn evaluate(program: &[sock_filter], arch: u32, nr: u32) -> u32 {
    let mut acc = 0u32;
    let mut pc = 0usize;
    while let Some(ins) = program.get(pc) {
        match ins.code {
            BPF_LD_W_ABS => {
                acc = match ins.k {
                    NR_OFFSET => nr,
                    ARCH_OFFSET => arch,
                    other => panic!("load of offset {other}"),
                };
                pc += 1;
            }
            BPF_JMP_JEQ_K | BPF_JMP_JSET_K => {
                let taken = match ins.code {
                    BPF_JMP_JEQ_K => acc == ins.k,
                    _ => acc & ins.k != 0,
                };
                pc += 1 + usize::from(if taken { ins.jt } else { ins.jf });
            }
            BPF_RET_K => return ins.k,
            other => panic!("unknown instruction {other:#x}"),
        }
    }
    panic!("the program ran off its end");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn x32_and_out_of_table_numbers_are_refused_native_ones_pass_foreign_arches_die() {
        let arch = native_audit_arch().expect("a supported architecture");
        let p = program().expect("program");
        let eperm = errno_action(libc::EPERM as u32);
        // Native calls pass to the role's filters.
        for nr in [0u32, 39, 272, 435, 0x3fff_ffff] {
            assert_eq!(evaluate(&p, arch, nr), SECCOMP_RET_ALLOW, "nr {nr}");
        }
        // x32 numbers of unshare (272), mount (165), bpf (321), io_uring_setup (425).
        for nr in [272u32, 165, 321, 425, 0] {
            assert_eq!(evaluate(&p, arch, X32_BIT | nr), eperm, "x32 nr {nr}");
        }
        assert_eq!(evaluate(&p, arch, u32::MAX), eperm);
        // i386 (int 0x80 from a 64-bit process): killed.
        const AUDIT_ARCH_I386: u32 = 3 | 0x4000_0000;
        assert_eq!(evaluate(&p, AUDIT_ARCH_I386, 20), SECCOMP_RET_KILL_PROCESS);
    }
}
