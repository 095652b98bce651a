//! The reviewed profiles: well-formed, explained, and free of what must never be allowed.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use super::super::profile::{landlock_profile, parse_landlock_profile, seccomp_json};
use super::super::seccomp_filter::{
    ALLOW_LIST, DENY_LIST, ENOSYS_LIST, OFFLINE_LIST, PROGRAMS_ENOSYS_LIST, compile, filter_names,
};
use super::super::{Role, SandboxConfig, SandboxMode, role_grant_defaults};

/// Never in any allow-list of these roles: process creation, exec, listening, unix and
/// raw sockets, debugging, namespaces, mounts, module and key management, more filters.
const NEVER_ALLOWED: &[&str] = &[
    "fork",
    "vfork",
    "execve",
    "execveat",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kill",
    "bind",
    "listen",
    "accept",
    "accept4",
    "socketpair",
    "open",
    "openat2",
    "creat",
    "unlink",
    "unlinkat",
    "rename",
    "renameat2",
    "mkdir",
    "mkdirat",
    "symlink",
    "link",
    "chmod",
    "fchmod",
    "chown",
    "truncate",
    "ftruncate",
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "init_module",
    "finit_module",
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "seccomp",
    "prlimit64",
    "setrlimit",
    "capset",
    "setuid",
    "setgid",
    "landlock_create_ruleset",
    "landlock_add_rule",
    "landlock_restrict_self",
    "memfd_create",
    "pkey_mprotect",
    "io_uring_setup",
    "userfaultfd",
];

/// The roles whose seccomp profile is an allow-list (they run no programs).
fn allow_list_roles() -> impl Iterator<Item = Role> {
    Role::ALL.into_iter().filter(|r| !r.runs_programs())
}

fn profile(role: Role) -> Value {
    serde_json::from_str(seccomp_json(role)).expect("profile is JSON")
}

fn rules<'a>(profile: &'a Value, filter: &str) -> &'a Vec<Value> {
    profile[filter]["filter"].as_array().expect("filter list")
}

#[test]
fn seccomp_profiles_compile_for_this_architecture() {
    for role in Role::ALL {
        compile(role).unwrap_or_else(|e| panic!("{role}: {e}"));
    }
}

#[test]
fn seccomp_profiles_compile_for_x86_64_whatever_the_host() {
    for role in Role::ALL {
        seccompiler::compile_from_json(
            seccomp_json(role).as_bytes(),
            seccompiler::TargetArch::x86_64,
        )
        .unwrap_or_else(|e| panic!("{role}: {e}"));
    }
}

#[test]
fn every_seccomp_entry_and_condition_says_who_needs_it() {
    for role in Role::ALL {
        let p = profile(role);
        for &filter in filter_names(role) {
            for rule in rules(&p, filter) {
                let comment = rule["comment"].as_str().unwrap_or_default();
                assert!(
                    !comment.trim().is_empty(),
                    "{role}/{filter}: no comment on {rule}"
                );
                for arg in rule["args"].as_array().into_iter().flatten() {
                    let c = arg["comment"].as_str().unwrap_or_default();
                    assert!(
                        !c.trim().is_empty(),
                        "{role}/{filter}: condition without comment in {rule}"
                    );
                }
            }
        }
    }
}

#[test]
fn seccomp_actions_are_an_allow_list_with_eperm_and_clone3_enosys() {
    for role in allow_list_roles() {
        let p = profile(role);
        assert_eq!(
            p[ALLOW_LIST]["mismatch_action"],
            serde_json::json!({"errno": libc::EPERM})
        );
        assert_eq!(p[ALLOW_LIST]["match_action"], "allow");
        assert_eq!(p[ENOSYS_LIST]["mismatch_action"], "allow");
        assert_eq!(
            p[ENOSYS_LIST]["match_action"],
            serde_json::json!({"errno": libc::ENOSYS})
        );
        let enosys: Vec<&str> = rules(&p, ENOSYS_LIST)
            .iter()
            .filter_map(|r| r["syscall"].as_str())
            .collect();
        assert_eq!(enosys, vec!["clone3"], "{role}");
        assert_eq!(
            p.as_object().map(|o| o.len()),
            Some(2),
            "{role}: exactly two filters"
        );
    }
}

#[test]
fn no_forbidden_syscall_is_allowed() {
    for role in allow_list_roles() {
        let p = profile(role);
        for rule in rules(&p, ALLOW_LIST) {
            let name = rule["syscall"].as_str().unwrap_or_default();
            assert!(!NEVER_ALLOWED.contains(&name), "{role} allows {name}");
        }
    }
}

#[test]
fn a_syscall_is_either_unconditional_or_conditional_never_both() {
    // seccompiler drops the unconditional entry when conditional ones exist for the same
    // syscall, which would silently change what a reviewer reads.
    for role in Role::ALL {
        let p = profile(role);
        for &filter in filter_names(role) {
            let mut kinds: BTreeMap<&str, BTreeSet<bool>> = BTreeMap::new();
            for rule in rules(&p, filter) {
                let name = rule["syscall"].as_str().unwrap_or_default();
                kinds
                    .entry(name)
                    .or_default()
                    .insert(rule.get("args").is_some());
            }
            for (name, k) in kinds {
                assert_eq!(
                    k.len(),
                    1,
                    "{role}/{filter}: {name} is listed both with and without conditions"
                );
            }
        }
    }
}

#[test]
fn threads_only_clone_sockets_by_family_and_no_exec_or_write_mappings() {
    const CLONE_THREAD: u64 = libc::CLONE_THREAD as u64;
    for role in allow_list_roles() {
        let p = profile(role);
        for rule in rules(&p, ALLOW_LIST) {
            let args = rule["args"].as_array();
            match rule["syscall"].as_str().unwrap_or_default() {
                "clone" => {
                    let a = &args.expect("clone has conditions")[0];
                    assert_eq!(a["index"], 0);
                    let mask = a["op"]["masked_eq"].as_u64().expect("masked_eq");
                    assert!(mask & CLONE_THREAD != 0);
                    assert_eq!(a["val"].as_u64(), Some(CLONE_THREAD));
                    for ns in [
                        libc::CLONE_NEWUSER,
                        libc::CLONE_NEWNS,
                        libc::CLONE_NEWNET,
                        libc::CLONE_NEWPID,
                    ] {
                        assert!(
                            mask & ns as u64 != 0,
                            "{role}: clone may create a namespace"
                        );
                    }
                }
                "socket" => {
                    let family = &args.expect("socket has conditions")[0];
                    assert_eq!(family["index"], 0);
                    assert_eq!(family["op"], "eq");
                    let f = family["val"].as_i64().unwrap_or(-1);
                    assert!(
                        f == i64::from(libc::AF_INET) || f == i64::from(libc::AF_INET6),
                        "{role}: socket family {f} allowed"
                    );
                }
                "mmap" | "mprotect" => {
                    let a = &args.expect("mapping calls have conditions")[0];
                    assert_eq!(a["index"], 2);
                    assert_eq!(a["op"]["masked_eq"].as_u64(), Some(libc::PROT_EXEC as u64));
                    assert_eq!(a["val"], 0);
                }
                "openat" => {
                    let a = &args.expect("openat has conditions")[0];
                    assert_eq!(a["index"], 2);
                    let mask = a["op"]["masked_eq"].as_u64().unwrap_or(0);
                    for flag in [libc::O_WRONLY, libc::O_RDWR, libc::O_CREAT, libc::O_TRUNC] {
                        assert!(mask & flag as u64 != 0, "{role}: openat may write");
                    }
                    assert_eq!(a["val"], 0);
                }
                _ => {}
            }
        }
    }
}

#[test]
fn aggregator_opens_no_file() {
    let p = profile(Role::Aggregator);
    let names: BTreeSet<&str> = rules(&p, ALLOW_LIST)
        .iter()
        .filter_map(|r| r["syscall"].as_str())
        .collect();
    for call in ["openat", "open", "newfstatat", "statx"] {
        assert!(!names.contains(call), "aggregator allows {call}");
    }
    let grant = role_grant_defaults(Role::Aggregator);
    assert!(grant.read_paths.is_empty() && grant.tcp_connect_ports.is_empty());
}

#[test]
fn landlock_profiles_parse_and_builtin_grants_dns_files_and_web_ports() {
    for role in Role::ALL {
        let profile = landlock_profile(role).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(profile.abi, 7, "{role}");
    }
    let grant = role_grant_defaults(Role::Builtin);
    for port in [80, 443] {
        assert!(grant.tcp_connect_ports.contains(&port));
    }
    for path in ["/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf"] {
        assert!(grant.read_paths.contains(&PathBuf::from(path)), "{path}");
    }
}

#[test]
fn landlock_profile_parsing_refuses_unexplained_or_unknown_entries() {
    let ok = "abi = 7\n[[read]]\npath = \"/etc/hosts\"\nwhy = \"names\"\n";
    assert!(parse_landlock_profile(ok).is_ok());
    let cases = [
        ("abi = 7\n[[read]]\npath = \"/etc/hosts\"\n", "missing why"),
        (
            "abi = 7\n[[read]]\npath = \"/etc/hosts\"\nwhy = \"  \"\n",
            "blank why",
        ),
        (
            "abi = 7\n[[read]]\npath = \"etc/hosts\"\nwhy = \"x\"\n",
            "relative path",
        ),
        (
            "abi = 7\n[[write]]\npath = \"/tmp\"\nwhy = \"x\"\n",
            "unknown key",
        ),
        (
            "abi = 7\n[[connect_tcp]]\nport = 0\nwhy = \"x\"\n",
            "port 0",
        ),
        (
            "abi = 7\n[[connect_tcp]]\nport = 70000\nwhy = \"x\"\n",
            "port out of range",
        ),
        ("abi = 99\n", "unknown abi"),
        ("", "no abi"),
    ];
    for (text, case) in cases {
        assert!(parse_landlock_profile(text).is_err(), "{case} accepted");
    }
}

#[test]
fn sandbox_config_defaults_and_keys() {
    let cfg = SandboxConfig::default();
    assert_eq!(cfg.mode, SandboxMode::Enforce);
    assert_eq!(cfg.max_open_files, super::super::DEFAULT_MAX_OPEN_FILES);
    assert_eq!(cfg.max_address_space_bytes, None);
    let cfg: SandboxConfig = toml::from_str(
        "mode = \"warn\"\nmax_open_files = 256\nmax_address_space_bytes = 1073741824\n",
    )
    .expect("config");
    assert_eq!(cfg.mode, SandboxMode::Warn);
    assert_eq!(cfg.max_open_files, 256);
    assert_eq!(cfg.max_address_space_bytes, Some(1 << 30));
    assert!(toml::from_str::<SandboxConfig>("mode = \"off\"\n").is_err());
    assert!(toml::from_str::<SandboxConfig>("max_files = 3\n").is_err());
}

#[test]
fn roles_and_modes_round_trip_as_text() {
    for role in Role::ALL {
        assert_eq!(role.to_string().parse::<Role>(), Ok(role));
    }
    assert!("shell".parse::<Role>().is_err());
    for mode in [SandboxMode::Enforce, SandboxMode::Warn] {
        assert_eq!(mode.to_string().parse::<SandboxMode>(), Ok(mode));
    }
}

/// Refused to every workspace program, whatever its arguments.
const WORKSPACE_MUST_DENY: &[&str] = &[
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "keyctl",
    "add_key",
    "init_module",
    "finit_module",
    "kexec_load",
    "open_by_handle_at",
    "fsopen",
    "open_tree",
    "listen",
    "shmget",
    "shmat",
    "msgget",
    "msgsnd",
    "msgrcv",
    "semget",
    "semop",
    "semtimedop",
    "inotify_init",
    "inotify_init1",
    "inotify_add_watch",
    "fanotify_init",
    "fanotify_mark",
];

#[test]
fn workspace_profile_is_a_deny_list_of_what_no_program_may_do() {
    let p = profile(Role::Workspace);
    assert_eq!(p.as_object().map(|o| o.len()), Some(4));
    for filter in [DENY_LIST, OFFLINE_LIST] {
        assert_eq!(p[filter]["mismatch_action"], "allow", "{filter}");
        assert_eq!(
            p[filter]["match_action"],
            serde_json::json!({"errno": libc::EPERM}),
            "{filter}"
        );
    }
    assert_eq!(
        p[ENOSYS_LIST]["match_action"],
        serde_json::json!({"errno": libc::ENOSYS})
    );
    let enosys: Vec<&str> = rules(&p, ENOSYS_LIST)
        .iter()
        .filter_map(|r| r["syscall"].as_str())
        .collect();
    assert_eq!(enosys, vec!["clone3"]);
    let deny = rules(&p, DENY_LIST);
    for name in WORKSPACE_MUST_DENY {
        assert!(
            deny.iter()
                .any(|r| r["syscall"] == *name && r.get("args").is_none()),
            "{name} is not denied unconditionally"
        );
    }
    // Every namespace flag of clone is refused by a rule of its own.
    for ns in [
        libc::CLONE_NEWNS,
        libc::CLONE_NEWCGROUP,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWNET,
    ] {
        assert!(
            deny.iter().any(|r| r["syscall"] == "clone"
                && r["args"][0]["op"]["masked_eq"].as_u64() == Some(ns as u64)
                && r["args"][0]["val"].as_u64() == Some(ns as u64)),
            "clone flag {ns:#x} not refused"
        );
    }
    // Sockets: one rule refuses every family but AF_INET and AF_INET6 (AF_UNIX would reach
    // the admin socket); offline, those two are refused as well.
    assert!(deny.iter().any(|r| r["syscall"] == "socket"
        && r["args"].as_array().map(|a| a.len()) == Some(2)
        && r["args"][0]["op"] == "ne"
        && r["args"][0]["val"] == libc::AF_INET
        && r["args"][1]["op"] == "ne"
        && r["args"][1]["val"] == libc::AF_INET6));
    let offline: Vec<i64> = rules(&p, OFFLINE_LIST)
        .iter()
        .filter(|r| r["syscall"] == "socket" && r["args"][0]["op"] == "eq")
        .filter_map(|r| r["args"][0]["val"].as_i64())
        .collect();
    assert_eq!(
        offline,
        vec![i64::from(libc::AF_INET), i64::from(libc::AF_INET6)]
    );
    // Set-user-ID and set-group-ID bits are refused on every call that sets a mode:
    // one rule per call and bit.
    for (call, index) in [
        ("chmod", 1),
        ("fchmod", 1),
        ("fchmodat", 2),
        ("fchmodat2", 2),
        ("creat", 1),
        ("open", 2),
        ("openat", 3),
        ("mknod", 1),
        ("mknodat", 2),
    ] {
        for bit in [libc::S_ISUID, libc::S_ISGID] {
            assert!(
                deny.iter().any(|r| r["syscall"] == call
                    && r["args"].as_array().is_some_and(|args| args
                        .iter()
                        .any(|a| a["index"] == index
                            && a["op"]["masked_eq"] == bit
                            && a["val"] == bit))),
                "{call} with mode bit {bit:o} is not refused"
            );
        }
    }
    // Programs alone lose openat2 (its mode hides behind a pointer), with ENOSYS.
    assert_eq!(
        p[PROGRAMS_ENOSYS_LIST]["match_action"],
        serde_json::json!({"errno": libc::ENOSYS})
    );
    let programs: Vec<&str> = rules(&p, PROGRAMS_ENOSYS_LIST)
        .iter()
        .filter_map(|r| r["syscall"].as_str())
        .collect();
    assert_eq!(programs, vec!["openat2"]);
    // What a role that runs programs needs is never refused outright (chmod +x, creating
    // files, git and npm inside the root).
    for needed in [
        "execve",
        "fork",
        "kill",
        "landlock_create_ruleset",
        "landlock_restrict_self",
        "socketpair",
        "chmod",
        "fchmod",
        "fchmodat",
        "openat",
        "utimensat",
        "mkdir",
        "rename",
    ] {
        assert!(
            !deny
                .iter()
                .any(|r| r["syscall"] == needed && r.get("args").is_none()),
            "{needed} is refused"
        );
    }
}

#[test]
fn workspace_landlock_grants_system_dirs_to_read_and_run_and_only_devices_to_write() {
    let grant = role_grant_defaults(Role::Workspace);
    for path in ["/usr", "/bin", "/lib", "/lib64"] {
        assert!(grant.execute_paths.contains(&PathBuf::from(path)), "{path}");
    }
    assert!(grant.read_paths.contains(&PathBuf::from("/etc")));
    assert!(grant.device_paths.contains(&PathBuf::from("/dev/null")));
    for path in &grant.device_paths {
        assert_eq!(path.parent(), Some(std::path::Path::new("/dev")));
    }
    // toolwall's own directory and the system's secrets are hidden whatever is granted.
    for path in [
        "/etc/toolwall",
        "/etc/shadow",
        "/etc/ssh",
        "/etc/ssl/private",
    ] {
        assert!(grant.hidden_paths.contains(&PathBuf::from(path)), "{path}");
    }
    // Writes and ports come from the config only.
    assert!(grant.write_paths.is_empty() && grant.tcp_connect_ports.is_empty());
    // The other roles never run or write anything.
    for role in allow_list_roles() {
        let g = role_grant_defaults(role);
        assert!(
            g.execute_paths.is_empty() && g.device_paths.is_empty() && g.write_paths.is_empty()
        );
    }
    let bad = "abi = 7\n[[device]]\npath = \"/etc/passwd\"\nwhy = \"x\"\n";
    assert!(
        parse_landlock_profile(bad).is_err(),
        "a device outside /dev"
    );
}

/// A local server's program is walled in exactly like a workspace's: the same rules in
/// every filter (only the comments say whom they protect).
#[test]
fn stdio_server_profile_denies_what_the_workspace_denies() {
    let strip = |p: &Value| -> BTreeMap<String, Vec<String>> {
        p.as_object()
            .expect("filters")
            .iter()
            .map(|(name, f)| {
                let mut rules: Vec<String> = f["filter"]
                    .as_array()
                    .expect("rules")
                    .iter()
                    .map(|r| {
                        let mut r = r.clone();
                        r.as_object_mut().expect("rule").remove("comment");
                        for a in r["args"].as_array_mut().into_iter().flatten() {
                            a.as_object_mut().expect("arg").remove("comment");
                        }
                        r.to_string()
                    })
                    .collect();
                rules.sort();
                let actions = format!("{} {}", f["mismatch_action"], f["match_action"]);
                rules.push(actions);
                (name.clone(), rules)
            })
            .collect()
    };
    // The workspace's rules, plus no IP datagram sockets even with TCP ports granted
    // (Landlock's port rules cover TCP only), flag bits of the type masked off.
    let mut server = strip(&profile(Role::StdioServer));
    let datagrams: Vec<String> = [2, 10]
        .iter()
        .map(|family| {
            serde_json::json!({
                "args": [
                    {"index": 0, "op": "eq", "type": "dword", "val": family},
                    {"index": 1, "op": {"masked_eq": 15}, "type": "dword", "val": 2},
                ],
                "syscall": "socket",
            })
            .to_string()
        })
        .collect();
    let deny = server.get_mut("deny_list").expect("deny_list");
    for rule in &datagrams {
        let at = deny
            .iter()
            .position(|r| r == rule)
            .unwrap_or_else(|| panic!("the server's deny_list lacks {rule}"));
        deny.remove(at);
    }
    assert_eq!(server, strip(&profile(Role::Workspace)));
    let server = landlock_profile(Role::StdioServer).expect("profile");
    let workspace = landlock_profile(Role::Workspace).expect("profile");
    let paths = |g: &[super::super::profile::ReadGrant]| -> Vec<PathBuf> {
        g.iter().map(|g| g.path.clone()).collect()
    };
    assert_eq!(paths(&server.hidden), paths(&workspace.hidden));
    assert_eq!(paths(&server.execute), paths(&workspace.execute));
    assert!(server.connect_tcp.is_empty());
}
