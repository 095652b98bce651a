//! Every file and directory the config names that holds a secret or toolwall's own state,
//! wherever it lives: hidden from every worker (carved out of its Landlock read grants)
//! and from every agent program, and each one tried by the attestation (`read_secret:*`
//! probes), so a report proves none of them can be read.
//!
//! The list: the config file and the corp policy; the ledger (which holds the token
//! store) and its directory (the state directory, with the WAL, the lock and the pins);
//! the admin socket and its directory (the runtime directory); the framed unix door; the
//! TLS certificate and key and their directories; each upstream's `bearer_token_file` and
//! its directory; each local server's `secret_env` file and its directory, and the
//! directory of the local servers' private state. A directory shared with the rest of the system (`/etc`, `/etc/ssl/certs`,
//! `/run`, `/tmp`, ...), or one that holds a path a worker is granted, is not hidden as a
//! whole: only the files in it are.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use crate::config::Config;

/// One secret path, and what it is (the probe is `read_secret:<what>`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SecretPath {
    pub what: String,
    pub path: PathBuf,
    /// The directory of a secret file (hidden whole), rather than a file the config names.
    #[serde(default)]
    pub dir: bool,
}

impl SecretPath {
    /// The name of the attestation probe that tries to read it.
    pub fn probe_name(&self) -> String {
        format!("read_secret:{}", self.what)
    }
}

/// Directories never hidden whole: hiding them would take the system away from workers and
/// programs. A secret directly in one of them is hidden as a file only.
const SHARED_DIRS: &[&str] = &[
    "/",
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/etc/pki",
    "/etc/pki/tls",
    "/etc/pki/tls/certs",
    "/etc/ssl",
    "/etc/ssl/certs",
    "/home",
    "/lib",
    "/lib64",
    "/media",
    "/mnt",
    "/opt",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/srv",
    "/sys",
    "/tmp",
    "/usr",
    "/usr/lib",
    "/usr/local",
    "/usr/share",
    "/var",
    "/var/lib",
    "/var/tmp",
];

/// An absolute form of `path` (relative paths are taken from the working directory, as
/// the config reads them), without links when it exists.
fn absolute(path: &Path) -> PathBuf {
    if let Ok(c) = std::fs::canonicalize(path) {
        return c;
    }
    if path.is_absolute() {
        return path.to_path_buf();
    }
    std::env::current_dir()
        .map(|d| d.join(path))
        .unwrap_or_else(|_| path.to_path_buf())
}

/// Whether the directory `dir` may be hidden whole.
fn hideable_dir(dir: &Path) -> bool {
    !SHARED_DIRS.iter().any(|s| Path::new(s) == dir)
}

/// Every secret path of `config`, deduplicated by path (the first name wins).
pub fn config_secrets(config: &Config) -> Vec<SecretPath> {
    fn push_as(out: &mut Vec<SecretPath>, what: &str, path: &Path, dir: bool) {
        if path.as_os_str().is_empty() {
            return;
        }
        let path = absolute(path);
        if out.iter().all(|s| s.path != path) {
            out.push(SecretPath {
                what: what.to_string(),
                path,
                dir,
            });
        }
    }
    fn push(out: &mut Vec<SecretPath>, what: &str, path: &Path) {
        push_as(out, what, path, false);
    }
    fn file_and_dir(out: &mut Vec<SecretPath>, what: &str, dir_what: &str, path: &Path) {
        push(out, what, path);
        let abs = absolute(path);
        if let Some(dir) = abs.parent().filter(|d| hideable_dir(d)) {
            push_as(out, dir_what, dir, true);
        }
    }
    let mut out: Vec<SecretPath> = Vec::new();
    if let Some(source) = &config.source {
        push(&mut out, "config", source);
    }
    if let Some(corp) = &config.policy.corp {
        push(&mut out, "corp_policy", corp);
    }
    if let Some(corp) = std::env::var_os("TOOLWALL_CORP_CONFIG").filter(|v| !v.is_empty()) {
        push(&mut out, "corp_policy_env", Path::new(&corp));
    }
    file_and_dir(&mut out, "ledger", "state_dir", &config.ledger.path);
    file_and_dir(
        &mut out,
        "admin_socket",
        "runtime_dir",
        &config.admin.socket,
    );
    if let Some(unix) = config
        .listen
        .unix
        .as_ref()
        .filter(|p| !p.as_os_str().is_empty())
    {
        file_and_dir(&mut out, "agent_socket", "agent_socket_dir", unix);
    }
    if let Some(key) = &config.listen.tls_key {
        file_and_dir(&mut out, "tls_key", "tls_key_dir", key);
    }
    if let Some(cert) = &config.listen.tls_cert {
        file_and_dir(&mut out, "tls_cert", "tls_cert_dir", cert);
    }
    for (name, server) in &config.servers.servers {
        if let Some(file) = &server.bearer_token_file {
            file_and_dir(
                &mut out,
                &format!("bearer_token_file:{name}"),
                &format!("bearer_token_dir:{name}"),
                file,
            );
        }
        for (var, file) in &server.local.secret_env {
            file_and_dir(
                &mut out,
                &format!("secret_env:{name}:{var}"),
                &format!("secret_env_dir:{name}:{var}"),
                file,
            );
        }
    }
    // Local servers' private state (their caches may hold their credentials): each server
    // is granted its own directory in there, and nothing else is.
    if config.servers.servers.values().any(|s| s.is_local()) {
        let root =
            crate::stdio_server::config::servers_state_root(&config.servers, &config.state_dir());
        push_as(&mut out, "servers_state", &root, true);
    }
    out
}

/// The files the config names (not their directories): no workspace root may hold one.
pub fn secret_files(secrets: &[SecretPath]) -> impl Iterator<Item = &Path> {
    secrets.iter().filter(|s| !s.dir).map(|s| s.path.as_path())
}

/// The secrets to hide from a worker whose read and execute grants are `grants`: a
/// secret directory that holds a granted path stays visible, since hiding it would take
/// the grant away (the files in it are still hidden); a grant that is itself a secret
/// loses to the secret.
pub fn hidden_for(secrets: &[SecretPath], grants: &[PathBuf]) -> Vec<PathBuf> {
    let grants: Vec<PathBuf> = grants.iter().map(|g| absolute(g)).collect();
    secrets
        .iter()
        .filter(|s| {
            !grants
                .iter()
                .any(|g| *g != s.path && g.starts_with(&s.path))
        })
        .map(|s| s.path.clone())
        .collect()
}

/// Tries to open each secret for reading. Each is a probe `read_secret:<what>`, denied when
/// the kernel refused (EACCES or EPERM: Landlock or the file's permissions) or when
/// nothing is there (a hidden path is hidden where it would be created).
pub fn probe_secrets(secrets: &[SecretPath]) -> Vec<super::Probe> {
    secrets.iter().map(probe_one).collect()
}

fn probe_one(secret: &SecretPath) -> super::Probe {
    use super::attest::{allowed, errno_text, last_errno};
    let name = secret.probe_name();
    let Some(c) = super::attest::c_path(&secret.path) else {
        return allowed(&name, format!("cannot probe {:?}: NUL byte", secret.path));
    };
    // O_RDONLY opens a directory too; O_NONBLOCK keeps a FIFO from blocking the probe.
    // SAFETY: a valid C string; the fd is closed below.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY,
        )
    };
    if fd >= 0 {
        // SAFETY: closing the fd just opened.
        unsafe { libc::close(fd) };
        return allowed(
            &name,
            format!("opened {} for reading", secret.path.display()),
        );
    }
    let errno = last_errno();
    let denied = |detail: String| super::Probe {
        name: name.clone(),
        denied: true,
        detail,
    };
    match errno {
        libc::EACCES | libc::EPERM => denied(format!(
            "denied: {} for {}",
            errno_text(errno),
            secret.path.display()
        )),
        libc::ENOENT => denied(format!(
            "nothing there: {} is missing (hidden where it would be created)",
            secret.path.display()
        )),
        // A socket that let us past every permission check.
        libc::ENXIO => allowed(
            &name,
            format!(
                "not proven: {} is a socket no wall refused (ENXIO)",
                secret.path.display()
            ),
        ),
        e => allowed(
            &name,
            format!(
                "not proven: {} for {}",
                errno_text(e),
                secret.path.display()
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_the_config_names_is_listed_with_its_private_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = std::fs::canonicalize(dir.path()).expect("canonical");
        let text = format!(
            r#"
[listen]
unix = "{d}/run/mcp.sock"
http = "127.0.0.1:0"
tls_cert = "{d}/tls/cert.pem"
tls_key = "{d}/tls/key.pem"

[ledger]
path = "{d}/state/ledger.db"

[admin]
socket = "{d}/run/admin.sock"

[servers.up]
url = "https://example.com/mcp"
bearer_token_file = "/etc/up-token"
"#,
            d = d.display()
        );
        let mut config = Config::from_toml(&text, "t.toml").expect("config");
        config.source = Some(d.join("toolwall.toml"));
        let secrets = config_secrets(&config);
        let find = |what: &str| {
            secrets
                .iter()
                .find(|s| s.what == what)
                .map(|s| s.path.clone())
                .unwrap_or_else(|| panic!("{what} missing: {secrets:?}"))
        };
        assert_eq!(find("config"), d.join("toolwall.toml"));
        assert_eq!(find("ledger"), d.join("state/ledger.db"));
        assert_eq!(find("state_dir"), d.join("state"));
        assert_eq!(find("admin_socket"), d.join("run/admin.sock"));
        assert_eq!(find("runtime_dir"), d.join("run"));
        assert_eq!(find("tls_key"), d.join("tls/key.pem"));
        assert_eq!(find("tls_key_dir"), d.join("tls"));
        assert_eq!(find("tls_cert"), d.join("tls/cert.pem"));
        assert_eq!(find("bearer_token_file:up"), PathBuf::from("/etc/up-token"));
        // /etc is shared: the token file is hidden, not /etc.
        assert!(
            secrets.iter().all(|s| s.path != Path::new("/etc")),
            "{secrets:?}"
        );
        // One entry per path: the unix door shares the runtime directory.
        let mut paths: Vec<&PathBuf> = secrets.iter().map(|s| &s.path).collect();
        paths.sort();
        paths.dedup();
        assert_eq!(paths.len(), secrets.len());
    }

    #[test]
    fn a_secret_directory_holding_a_grant_stays_visible_its_files_do_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = std::fs::canonicalize(dir.path()).expect("canonical");
        std::fs::create_dir_all(d.join("tools/bin")).expect("mkdir");
        let secrets = vec![
            SecretPath {
                what: "tls_key_dir".into(),
                path: d.join("tools"),
                dir: true,
            },
            SecretPath {
                what: "tls_key".into(),
                path: d.join("tools/key.pem"),
                dir: false,
            },
        ];
        assert_eq!(
            hidden_for(&secrets, &[d.join("tools/bin")]),
            vec![d.join("tools/key.pem")]
        );
        assert_eq!(hidden_for(&secrets, &[]).len(), 2);
    }

    #[test]
    fn a_readable_secret_is_not_denied_a_missing_one_is() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("key.pem");
        std::fs::write(&file, "secret").expect("write");
        let probes = probe_secrets(&[
            SecretPath {
                what: "tls_key".into(),
                path: file,
                dir: false,
            },
            SecretPath {
                what: "gone".into(),
                path: dir.path().join("missing"),
                dir: false,
            },
        ]);
        assert!(!probes[0].denied, "{probes:?}");
        assert_eq!(probes[0].name, "read_secret:tls_key");
        assert!(probes[1].denied, "{probes:?}");
    }
}
