//! Path safety. Every path an agent gives is relative to the workspace root. toolwall
//! refuses, before touching anything: absolute paths, `..` anywhere, NUL bytes, and paths
//! whose existing part resolves (through links) outside the root. Files are then opened
//! with `openat2(RESOLVE_BENEATH)` from the root, so a link swapped in between the check
//! and the open still cannot lead out; and under both, Landlock refuses any write outside
//! the root whatever happens here.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use super::error::{WsError, WsErrorCode};

/// The worker's private temp dir, inside the root (`TMPDIR` of every command).
pub const TMP_DIR_NAME: &str = ".toolwall-tmp";
/// Longest path an agent may give.
pub const MAX_PATH_BYTES: usize = 4096;

/// The workspace root: its canonical path and a handle to it for `openat2`.
#[derive(Debug)]
pub struct WorkspaceRoot {
    path: PathBuf,
    fd: OwnedFd,
}

/// A path that passed the checks: relative to the root (empty for the root itself) and
/// absolute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedPath {
    pub rel: PathBuf,
    pub abs: PathBuf,
}

impl CheckedPath {
    /// The relative path as shown to agents (`.` for the root).
    pub fn display(&self) -> String {
        if self.rel.as_os_str().is_empty() {
            ".".to_string()
        } else {
            self.rel.to_string_lossy().into_owned()
        }
    }
}

/// Lexical checks only: the normalized relative path (`.` parts dropped; empty: the root).
pub fn lexical(path: &str) -> Result<PathBuf, WsError> {
    let outside = |why: &str| {
        WsError::new(
            WsErrorCode::PathOutsideWorkspace,
            format!("{path:?}: {why}; paths are relative to the workspace root"),
        )
    };
    if path.len() > MAX_PATH_BYTES {
        return Err(WsError::new(
            WsErrorCode::TooLarge,
            format!("a path of {} bytes (at most {MAX_PATH_BYTES})", path.len()),
        ));
    }
    if path.contains('\0') {
        return Err(WsError::invalid("a path holds a NUL byte"));
    }
    let mut out = PathBuf::new();
    for component in Path::new(path).components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::ParentDir => return Err(outside("`..` is not allowed")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(outside("absolute paths are not allowed"));
            }
        }
    }
    Ok(out)
}

impl WorkspaceRoot {
    /// Opens the root (which must be canonical: absolute, no links).
    pub fn open(canonical: &Path) -> io::Result<WorkspaceRoot> {
        let c = CString::new(canonical.as_os_str().as_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: valid C string; the fd is owned below.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(WorkspaceRoot {
            path: canonical.to_path_buf(),
            // SAFETY: a fresh fd nobody else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The root's handle, for `*at` calls relative to it.
    pub fn dir_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }

    /// Checks `path` lexically, then that its existing part does not resolve outside the
    /// root. What does not exist yet is fine (it will be created under what does).
    pub fn check(&self, path: &str) -> Result<CheckedPath, WsError> {
        let rel = lexical(path)?;
        let abs = self.path.join(&rel);
        // The longest prefix that exists, made canonical, must stay under the root.
        let mut existing = abs.clone();
        loop {
            match std::fs::symlink_metadata(&existing) {
                Ok(meta) => {
                    let real = match std::fs::canonicalize(&existing) {
                        Ok(real) => real,
                        Err(_) if meta.file_type().is_symlink() => {
                            return Err(WsError::new(
                                WsErrorCode::PathOutsideWorkspace,
                                format!("{path:?} goes through a link whose target does not exist"),
                            ));
                        }
                        Err(e) => return Err(WsError::io(path, &e)),
                    };
                    if !real.starts_with(&self.path) {
                        return Err(WsError::new(
                            WsErrorCode::PathOutsideWorkspace,
                            format!("{path:?} leads outside the workspace through a link"),
                        ));
                    }
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    if !existing.pop() || !existing.starts_with(&self.path) {
                        break;
                    }
                }
                // Not a directory on the way, and the like: the operation reports it.
                Err(_) => break,
            }
        }
        Ok(CheckedPath { rel, abs })
    }

    /// Opens a checked path with `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` from the
    /// root: the kernel refuses (EXDEV) any resolution that would leave it.
    pub fn open_beneath(&self, path: &CheckedPath, flags: i32, mode: u32) -> io::Result<OwnedFd> {
        #[repr(C)]
        struct OpenHow {
            flags: u64,
            mode: u64,
            resolve: u64,
        }
        const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
        const RESOLVE_BENEATH: u64 = 0x08;
        let rel: &Path = if path.rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            &path.rel
        };
        let c = CString::new(rel.as_os_str().as_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let how = OpenHow {
            flags: (flags | libc::O_CLOEXEC) as u64,
            mode: if flags & libc::O_CREAT != 0 {
                u64::from(mode)
            } else {
                0
            },
            resolve: RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
        };
        // SAFETY: valid dirfd, C string and open_how of the size given.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                self.fd.as_raw_fd(),
                c.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd nobody else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> (tempfile::TempDir, WorkspaceRoot) {
        let dir = tempfile::tempdir().expect("tempdir");
        let canonical = std::fs::canonicalize(dir.path()).expect("canonical");
        std::fs::create_dir_all(canonical.join("ws/src")).expect("mkdir");
        std::fs::write(canonical.join("ws/src/a.txt"), b"a").expect("write");
        std::fs::write(canonical.join("secret"), b"s").expect("write");
        let ws = canonical.join("ws");
        std::os::unix::fs::symlink(canonical.join("secret"), ws.join("out")).expect("link");
        std::os::unix::fs::symlink("../secret", ws.join("out_rel")).expect("link");
        std::os::unix::fs::symlink("src/a.txt", ws.join("in")).expect("link");
        std::os::unix::fs::symlink(&canonical, ws.join("up")).expect("link");
        std::os::unix::fs::symlink("nowhere", ws.join("dangling")).expect("link");
        let root = WorkspaceRoot::open(&ws).expect("open root");
        (dir, root)
    }

    #[test]
    fn lexical_refuses_absolute_parent_and_nul() {
        assert_eq!(lexical("a/./b/").expect("ok"), PathBuf::from("a/b"));
        assert_eq!(lexical(".").expect("root"), PathBuf::new());
        assert_eq!(lexical("").expect("root"), PathBuf::new());
        for bad in ["/etc/passwd", "../x", "a/../../x", "a/..", "/"] {
            let e = lexical(bad).expect_err(bad);
            assert_eq!(e.code, WsErrorCode::PathOutsideWorkspace, "{bad}");
        }
        // `a/../b` stays inside, but `..` is refused anywhere: no guessing.
        assert!(lexical("a/../b").is_err());
        assert_eq!(
            lexical("a\0b").expect_err("nul").code,
            WsErrorCode::InvalidArguments
        );
        assert_eq!(
            lexical(&"a".repeat(MAX_PATH_BYTES + 1))
                .expect_err("long")
                .code,
            WsErrorCode::TooLarge
        );
    }

    #[test]
    fn links_leading_outside_are_refused_inside_ones_allowed() {
        let (_dir, root) = root();
        for bad in [
            "out",
            "out_rel",
            "up/secret",
            "up",
            "dangling",
            "dangling/x",
        ] {
            let e = root.check(bad).expect_err(bad);
            assert_eq!(e.code, WsErrorCode::PathOutsideWorkspace, "{bad}: {e}");
        }
        assert!(root.check("in").is_ok());
        assert!(root.check("src/a.txt").is_ok());
        // Not there yet: fine, under an existing directory inside the root.
        let new = root.check("src/new/deeper/file").expect("new");
        assert_eq!(new.rel, PathBuf::from("src/new/deeper/file"));
        assert_eq!(new.abs, root.path().join("src/new/deeper/file"));
        assert_eq!(root.check(".").expect("root").display(), ".");
    }

    #[test]
    fn open_beneath_refuses_what_resolves_outside_even_unchecked() {
        let (_dir, root) = root();
        // Bypassing check(), as a race would: the kernel still refuses.
        let sneaky = CheckedPath {
            rel: PathBuf::from("out"),
            abs: root.path().join("out"),
        };
        let e = root
            .open_beneath(&sneaky, libc::O_RDONLY, 0)
            .expect_err("outside");
        assert_eq!(e.raw_os_error(), Some(libc::EXDEV));
        let inside = root.check("in").expect("in");
        assert!(root.open_beneath(&inside, libc::O_RDONLY, 0).is_ok());
        let created = root.check("src/created").expect("new");
        root.open_beneath(
            &created,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            0o644,
        )
        .expect("create beneath");
        assert!(root.path().join("src/created").exists());
    }
}
