//! The common start of a worker that hosts agent programs (a workspace, a local server):
//! confine while still single-threaded, attest with the probes of a program host, and take
//! the RPC socket out of what the programs inherit. One function, so the two hosts cannot
//! drift apart in what they prove before their `ready`.

use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;

use crate::sandbox::{self, ConfinementReport, RPC_FD, Role, RoleGrant, SandboxMode};

/// A confined, attested host, ready to say `ready` on `rpc`.
pub(crate) struct ConfinedHost {
    pub report: ConfinementReport,
    /// What the attestation needs from before confinement, for re-runs (`attest` op).
    pub probe_context: sandbox::WorkspaceProbeContext,
    /// The gateway's RPC socket (fd 3), close-on-exec.
    pub rpc: UnixStream,
}

/// Confine and attest `role`; `Err` is the process exit code, after the error was logged
/// naming `what` (the workspace or server).
pub(crate) fn confine_and_attest(
    role: Role,
    what: &str,
    grant: &RoleGrant,
    mode: SandboxMode,
    gateway_uid: u32,
) -> Result<ConfinedHost, i32> {
    // Gathered before confinement: it reads what the walls then hide.
    let mut probe_context = sandbox::WorkspaceProbeContext::gather(gateway_uid);
    probe_context.udp_refused_with_ports = role == Role::StdioServer;
    let mut report = match sandbox::confine(role, grant, mode) {
        Ok(r) => r,
        Err(e) => {
            crate::error!("worker {role} ({what}): confinement failed: {e}");
            return Err(3);
        }
    };
    report.probes = sandbox::attest_workspace(grant, &probe_context);
    // SAFETY: fd 3 is the RPC socket the gateway placed there; nothing else owns it.
    let rpc = unsafe { UnixStream::from_raw_fd(RPC_FD) };
    // Programs must never inherit the RPC socket (the leaders close it too).
    // SAFETY: fcntl on our own fd.
    if unsafe { libc::fcntl(RPC_FD, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
        crate::error!("worker {role} ({what}): cannot mark the RPC socket close-on-exec");
        return Err(4);
    }
    Ok(ConfinedHost {
        report,
        probe_context,
        rpc,
    })
}
