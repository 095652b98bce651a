//! The agent launcher (`toolwall agent-launcher`), driven over its own channel as the
//! gateway drives it: it starts hosts of agent programs as the agent user and nothing else,
//! and a bad request gets an answer, never a crash. Runs as root (as CI does).

mod common;

use std::os::fd::AsFd;
use std::path::Path;
use toolwall::launcher::protocol::SpawnAnswer;
use toolwall::launcher::{AgentIdentity, Launcher};
use toolwall::sandbox::{Role, SandboxConfig};

fn launcher(identities: Vec<AgentIdentity>) -> Launcher {
    Launcher::start_binary(
        Path::new(common::BIN),
        identities,
        &SandboxConfig::default(),
    )
    .expect("start the launcher")
}

fn failed(answer: Result<SpawnAnswer, String>) -> String {
    match answer {
        Ok(SpawnAnswer::Failed { pid: 0, message }) => message,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn it_refuses_what_it_is_not_for_and_keeps_serving() {
    let mut l = launcher(vec![common::agent_user()]);
    let (a, _b) = std::os::unix::net::UnixStream::pair().expect("pair");
    let (r, _w) = nix::unistd::pipe().expect("pipe");
    // Roles that run no agent programs are the gateway's to start.
    let e = l
        .spawn(Role::Builtin, 0, a.as_fd(), r.as_fd(), None)
        .expect_err("builtin");
    assert!(e.message.contains("runs no agent programs"), "{e:?}");
    // Only the users it was started with.
    let e = l
        .spawn(Role::Workspace, 7, a.as_fd(), r.as_fd(), None)
        .expect_err("index");
    assert!(e.message.contains("no agent user number 7"), "{e:?}");
    // Garbage, an empty role, a truncated header, no fds: answered, not fatal.
    for packet in [
        &b"\xff\xff\xff"[..],
        b"S\x00\x00",
        b"S\x00",
        b"S\x00\x00worker",
        b"S\x00\x00workspace",
    ] {
        let message = failed(l.raw_request(packet));
        assert!(!message.is_empty());
    }
    assert!(l.exited().is_none(), "the launcher died");
}

#[test]
fn it_will_not_start_with_root_or_its_own_user_as_an_agent() {
    for bad in [
        AgentIdentity {
            name: "root".into(),
            uid: 0,
            gid: 0,
        },
        AgentIdentity {
            name: "self".into(),
            // SAFETY: getuid/getgid cannot fail.
            uid: unsafe { libc::getuid() },
            gid: 4242,
        },
    ] {
        let mut l = launcher(vec![bad.clone()]);
        let (a, _b) = std::os::unix::net::UnixStream::pair().expect("pair");
        let (r, _w) = nix::unistd::pipe().expect("pipe");
        let e = l
            .spawn(Role::Workspace, 0, a.as_fd(), r.as_fd(), None)
            .expect_err("refused");
        // It exited at start: nobody takes the request, or nobody answers it.
        assert!(
            ["gone", "did not answer", "asking the agent launcher"]
                .iter()
                .any(|m| e.message.contains(m)),
            "{bad:?}: {e:?}"
        );
        assert!(e.pid.is_none());
    }
}
