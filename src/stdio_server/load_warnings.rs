//! Warnings at load about how local servers are laid out: walls toolwall cannot build
//! itself, so the operator hears of them once, at start.
//!
//! - Servers (and workspaces) that share an agent uid can chmod each other's state
//!   directories and workspace roots: Landlock does not cover chmod, and neither can
//!   signal or read the other only because the uid is the same. `agent_user` per server
//!   closes that.
//! - A state directory on the ledger's filesystem lets one server fill that filesystem,
//!   and a ledger that cannot be written refuses every call (fail closed).

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;

use super::config::servers_state_root;
use crate::config::Config;

/// Who runs as each agent user: `server NAME` and `workspace NAME`, for every user more
/// than one local server or workspace runs as.
pub fn shared_agent_users(config: &Config) -> BTreeMap<String, Vec<String>> {
    let default = &config.sandbox.agent_user;
    let mut by_user: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, s) in config.servers.enabled().filter(|(_, s)| s.is_local()) {
        let user = s.local.agent_user.as_ref().unwrap_or(default);
        by_user
            .entry(user.clone())
            .or_default()
            .push(format!("server {name}"));
    }
    for (name, ws) in &config.workspaces.0 {
        let user = ws.agent_user.as_ref().unwrap_or(default);
        // Workspaces among themselves are the workspaces' own warning; here only where a
        // local server is involved.
        if let Some(v) = by_user.get_mut(user) {
            v.push(format!("workspace {name}"));
        }
    }
    by_user.retain(|_, v| v.len() > 1);
    by_user
}

/// Log the warnings of this module for `config` (at start and on a reload that changes
/// the servers).
pub fn warn(config: &Config) {
    for (user, who) in shared_agent_users(config) {
        crate::warn!(
            "{} run as the same agent user {user}: each can chmod the other's state directory (or workspace) open, and a file planted there runs with the other's secrets at its next start; give each local server its own [servers.NAME] agent_user",
            who.join(", ")
        );
    }
    let ledger_dir = config.state_dir();
    if !config.servers.enabled().any(|(_, s)| s.is_local()) {
        return;
    }
    let root = servers_state_root(&config.servers, &ledger_dir);
    // The state directory may not exist yet: its nearest existing ancestor is where it
    // will be made.
    let Some(dev) = root
        .ancestors()
        .find_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.dev())
    else {
        return;
    };
    if std::fs::metadata(&ledger_dir).is_ok_and(|m| m.dev() == dev) {
        crate::warn!(
            "the local servers' state directory {} is on the same filesystem as the ledger ({}): a server that fills the disk stops every call until space is freed; set [servers] state_dir on a filesystem of its own (or one with quotas)",
            root.display(),
            ledger_dir.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_sharing_a_user_are_named_and_their_own_users_are_not() {
        let config = Config::from_toml(
            r#"
[sandbox]
agent_user = "tw-agent"
[servers.a]
command = ["a"]
[servers.b]
command = ["b"]
[servers.c]
command = ["c"]
agent_user = "tw-c"
[servers.d]
command = ["d"]
agent_user = "tw-d"
"#,
            "test",
        )
        .unwrap();
        let shared = shared_agent_users(&config);
        assert_eq!(shared.len(), 1, "{shared:?}");
        assert_eq!(shared["tw-agent"], vec!["server a", "server b"]);
    }
}
