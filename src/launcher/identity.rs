//! The agent user: who agent programs run as. Never root, never toolwall's own user or
//! group: plain Unix permissions then keep agent programs away from toolwall's files
//! (ledger, state and runtime directories, admin socket, keys), other users' files, and
//! root-only files, whatever Landlock does not cover (metadata changes, SysV IPC,
//! inotify).

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The default agent user, created by `systemd/toolwall.sysusers` (or by `serve` itself
/// when it runs as root without it).
pub const DEFAULT_AGENT_USER: &str = "toolwall-agent";

/// What `useradd` is given when `serve` creates the default agent user.
const AGENT_USER_COMMENT: &str = "toolwall agent programs";
/// Attempts at creating the user (another process may hold the passwd lock).
const CREATE_ATTEMPTS: u32 = 5;
const CREATE_RETRY: Duration = Duration::from_millis(200);

/// A resolved agent user. Programs run with exactly this uid and gid and no supplementary
/// group.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
#[serde(deny_unknown_fields)]
pub struct AgentIdentity {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

impl std::fmt::Display for AgentIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (uid {}, gid {})", self.name, self.uid, self.gid)
    }
}

/// Looks the user up in the system's user database. `Ok(None)`: no such user.
pub fn lookup(name: &str) -> Result<Option<AgentIdentity>, String> {
    match nix::unistd::User::from_name(name) {
        Ok(Some(user)) => Ok(Some(AgentIdentity {
            name: name.to_string(),
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
        })),
        Ok(None) => Ok(None),
        Err(e) => Err(format!("looking up user {name:?}: {e}")),
    }
}

/// Refuses an identity that would give agent programs what the walls are there to deny:
/// root's uid or gid, or toolwall's own uid or gid.
pub fn check(identity: &AgentIdentity, gateway_uid: u32, gateway_gid: u32) -> Result<(), String> {
    if identity.uid == 0 {
        return Err(format!(
            "agent user {identity} is root: agent programs never run as root"
        ));
    }
    if identity.gid == 0 {
        return Err(format!(
            "agent user {identity} has group 0 (root) as its primary group"
        ));
    }
    if identity.uid == gateway_uid {
        return Err(format!(
            "agent user {identity} is the user toolwall runs as: agent programs would reach toolwall's own files"
        ));
    }
    if identity.gid == gateway_gid {
        return Err(format!(
            "agent user {identity} has toolwall's own group (gid {gateway_gid}) as its primary group"
        ));
    }
    Ok(())
}

/// Whether `serve` may create the user `name` when it is missing: only the default name
/// (never a name an operator typed, where a typo would create a user), and only as root.
pub fn may_create(name: &str, gateway_uid: u32) -> bool {
    name == DEFAULT_AGENT_USER && gateway_uid == 0
}

/// Creates the default agent user as a system user with its own group, no home and no
/// login shell. Returns the identity. Another process creating it at the same moment is
/// fine: the user is looked up again after each attempt.
pub fn create_default_user() -> Result<AgentIdentity, String> {
    let name = DEFAULT_AGENT_USER;
    let mut last_error = String::new();
    for attempt in 0..CREATE_ATTEMPTS {
        if let Some(identity) = lookup(name)? {
            return Ok(identity);
        }
        if attempt > 0 {
            std::thread::sleep(CREATE_RETRY);
        }
        let output = std::process::Command::new("useradd")
            .args([
                "--system",
                "--user-group",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                "--comment",
                AGENT_USER_COMMENT,
                name,
            ])
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .stdin(std::process::Stdio::null())
            .output();
        match output {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                last_error = format!(
                    "useradd {}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            Err(e) => {
                return Err(format!(
                    "cannot run useradd to create the agent user {name}: {e}; create it (systemd-sysusers with systemd/toolwall.sysusers, or useradd --system --user-group {name})"
                ));
            }
        }
    }
    lookup(name)?.ok_or_else(|| format!("creating the agent user {name} failed: {last_error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(uid: u32, gid: u32) -> AgentIdentity {
        AgentIdentity {
            name: "a".into(),
            uid,
            gid,
        }
    }

    #[test]
    fn root_and_toolwalls_own_ids_are_refused() {
        assert!(check(&id(0, 5), 990, 990).unwrap_err().contains("root"));
        assert!(check(&id(5, 0), 990, 990).unwrap_err().contains("group 0"));
        assert!(
            check(&id(990, 5), 990, 991)
                .unwrap_err()
                .contains("toolwall runs as")
        );
        assert!(
            check(&id(5, 991), 990, 991)
                .unwrap_err()
                .contains("toolwall's own group")
        );
        assert!(check(&id(5, 6), 0, 0).is_ok());
    }

    #[test]
    fn only_root_creates_only_the_default_user() {
        assert!(may_create(DEFAULT_AGENT_USER, 0));
        assert!(!may_create(DEFAULT_AGENT_USER, 1000));
        assert!(!may_create("toolwall-agnet", 0));
    }

    #[test]
    fn root_resolves_and_a_missing_user_is_none() {
        assert_eq!(lookup("root").expect("lookup").map(|i| i.uid), Some(0));
        assert_eq!(lookup("no-such-user-toolwall-test").expect("lookup"), None);
    }
}
