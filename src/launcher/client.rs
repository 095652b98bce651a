//! The gateway's handle on the agent launcher: start it, ask it for workers.

use nix::sys::socket::{
    AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType, recv, sendmsg, socketpair,
};
use std::io::IoSlice;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::LauncherSettings;
use super::identity::AgentIdentity;
use super::protocol::{self, SpawnAnswer, SpawnRequest};
use crate::sandbox::{Role, SandboxConfig};

/// Longest wait for the launcher's answer; it only clones and waits for an exec, so this
/// is reached only by a launcher that hangs.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// A started worker, or why not.
#[derive(Debug)]
pub struct SpawnError {
    pub message: String,
    /// A process the launcher created before it failed: the gateway is its parent and
    /// must reap it.
    pub pid: Option<u32>,
}

/// The running launcher.
pub struct Launcher {
    channel: OwnedFd,
    child: Child,
    identities: Vec<AgentIdentity>,
}

impl Launcher {
    /// Starts `toolwall agent-launcher` (this binary) with the agent users it may switch
    /// to. It inherits this process's capabilities; call before dropping them.
    pub fn start(
        identities: Vec<AgentIdentity>,
        sandbox: &SandboxConfig,
    ) -> Result<Launcher, String> {
        Self::start_binary(Path::new("/proc/self/exe"), identities, sandbox)
    }

    /// As [`Launcher::start`], from the toolwall binary at `exe` (tests run it from
    /// another executable).
    pub fn start_binary(
        exe: &Path,
        identities: Vec<AgentIdentity>,
        sandbox: &SandboxConfig,
    ) -> Result<Launcher, String> {
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| format!("socketpair: {e}"))?;
        let settings = LauncherSettings {
            gateway_pid: std::process::id(),
            identities: identities.clone(),
            max_open_files: sandbox.max_open_files,
            max_address_space_bytes: sandbox.max_address_space_bytes,
        };
        let text = serde_json::to_vec(&settings).map_err(|e| e.to_string())?;
        let stdin = crate::workers::supervisor::settings_pipe(&text)
            .map_err(|e| format!("settings pipe: {e}"))?;
        let mut prepare = crate::sandbox::child_pre_exec(theirs.as_raw_fd(), sandbox);
        let mut cmd = Command::new(exe);
        cmd.arg("agent-launcher")
            .env_clear()
            .stdin(Stdio::from(stdin))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        // SAFETY: only async-signal-safe calls run between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let mut empty: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut empty);
                libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
                prepare()
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("starting the agent launcher: {e}"))?;
        drop(theirs);
        let timeout = nix::sys::time::TimeVal::new(ANSWER_TIMEOUT.as_secs() as _, 0);
        nix::sys::socket::setsockopt(&ours, nix::sys::socket::sockopt::ReceiveTimeout, &timeout)
            .map_err(|e| format!("launcher channel: {e}"))?;
        nix::sys::socket::setsockopt(&ours, nix::sys::socket::sockopt::SendTimeout, &timeout)
            .map_err(|e| format!("launcher channel: {e}"))?;
        Ok(Launcher {
            channel: ours,
            child,
            identities,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn identities(&self) -> &[AgentIdentity] {
        &self.identities
    }

    /// Asks for `toolwall worker ROLE` running as agent user `identity` (an index into
    /// the users the launcher was started with), with `rpc` as its fd 3 and `stdin` as
    /// its fd 0, in the cgroup whose directory is `cgroup` when given. Returns its pid; the gateway is its parent. Blocks for the launcher's
    /// answer (a clone and an exec), at most [`ANSWER_TIMEOUT`].
    pub fn spawn(
        &mut self,
        role: Role,
        identity: usize,
        rpc: BorrowedFd<'_>,
        stdin: BorrowedFd<'_>,
        cgroup: Option<BorrowedFd<'_>>,
    ) -> Result<u32, SpawnError> {
        let plain = |message: String| SpawnError { message, pid: None };
        let identity = u16::try_from(identity).map_err(|_| plain("identity index".into()))?;
        let request = protocol::encode_request(&SpawnRequest {
            identity,
            role: role.to_string(),
        })
        .map_err(plain)?;
        let mut fds = vec![rpc.as_raw_fd(), stdin.as_raw_fd()];
        fds.extend(cgroup.map(|c| c.as_raw_fd()));
        let cmsg = [ControlMessage::ScmRights(&fds)];
        sendmsg::<()>(
            self.channel.as_raw_fd(),
            &[IoSlice::new(&request)],
            &cmsg,
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(|e| plain(format!("asking the agent launcher: {e}")))?;
        let mut buf = [0u8; protocol::MAX_PACKET];
        let n = loop {
            match recv(self.channel.as_raw_fd(), &mut buf, MsgFlags::empty()) {
                Ok(n) => break n,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(plain(format!("the agent launcher did not answer: {e}"))),
            }
        };
        if n == 0 {
            return Err(plain("the agent launcher is gone".into()));
        }
        match protocol::decode_answer(&buf[..n]).map_err(plain)? {
            SpawnAnswer::Started { pid } if pid > 0 => Ok(pid as u32),
            SpawnAnswer::Started { pid } => Err(plain(format!("the launcher answered pid {pid}"))),
            SpawnAnswer::Failed { pid, message } => Err(SpawnError {
                message,
                pid: (pid > 0).then_some(pid as u32),
            }),
        }
    }

    /// Sends raw bytes as one request packet (tests of the launcher's defences) and
    /// returns the decoded answer.
    pub fn raw_request(&mut self, packet: &[u8]) -> Result<SpawnAnswer, String> {
        nix::sys::socket::send(self.channel.as_raw_fd(), packet, MsgFlags::MSG_NOSIGNAL)
            .map_err(|e| e.to_string())?;
        let mut buf = [0u8; protocol::MAX_PACKET];
        let n = recv(self.channel.as_raw_fd(), &mut buf, MsgFlags::empty())
            .map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("the agent launcher is gone".into());
        }
        protocol::decode_answer(&buf[..n])
    }

    /// Whether the launcher process exited (reaps it if so).
    pub fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            Err(e) => Some(e.to_string()),
        }
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
