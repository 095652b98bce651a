//! The `tokens` table, in the ledger's SQLite file.
//!
//! The ledger owns that file's schema version (`PRAGMA user_version`); this table is created
//! idempotently here so `toolwall token create` works before the gateway ever ran. A fresh
//! file is stamped with the ledger's `application_id`, which the ledger's migrations accept;
//! a file that belongs to something else is refused, never written to.
//!
//! The gateway keeps one connection open for lookups. In WAL mode those reads never wait for
//! the ledger's writer, and a token created or revoked from the command line is seen by the
//! very next request.

use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};
use std::fmt;
use std::fs::{DirBuilder, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::secret::{self, ct_eq};
use super::{AuthFailure, TokenInfo, TokenKind, TokenVerifier, validate_principal};

/// `PRAGMA application_id` of a toolwall ledger file ("TWLG"), the same value the ledger
/// writes.
const LEDGER_APPLICATION_ID: i32 = i32::from_be_bytes(*b"TWLG");
/// Milliseconds a write waits for the gateway's ledger transaction to finish.
pub const BUSY_TIMEOUT_MS: u64 = 2000;
/// Longest lifetime a token can be given (ten years).
pub const MAX_LIFETIME: Duration = Duration::from_secs(3650 * 24 * 3600);
/// Modes of what this module creates when the ledger file does not exist yet.
const DIR_MODE: u32 = 0o700;
const FILE_MODE: u32 = 0o600;

/// The table, created when missing. Idempotent, so it can also live in a ledger migration.
pub const TOKENS_TABLE_SQL: &str = "
CREATE TABLE IF NOT EXISTS tokens (
    id         INTEGER PRIMARY KEY,
    principal  TEXT NOT NULL,
    kind       TEXT NOT NULL CHECK (kind IN ('client', 'admin')),
    hash       TEXT NOT NULL UNIQUE,
    created_ms INTEGER NOT NULL,
    expires_ms INTEGER,
    revoked_ms INTEGER
);
";

/// A token store failure; the message names the file, never a secret.
#[derive(Debug)]
pub struct TokenError(pub String);

impl fmt::Display for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TokenError {}

/// A token just created: the only time its secret exists outside the client.
pub struct NewToken {
    pub info: TokenInfo,
    pub secret: String,
}

impl fmt::Debug for NewToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NewToken")
            .field("info", &self.info)
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// What `revoke` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RevokeOutcome {
    Revoked(TokenInfo),
    AlreadyRevoked(TokenInfo),
    NotFound,
}

pub struct TokenStore {
    conn: Connection,
    path: PathBuf,
}

impl fmt::Debug for TokenStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenStore")
            .field("path", &self.path)
            .finish()
    }
}

const SELECT_COLUMNS: &str =
    "SELECT id, principal, kind, hash, created_ms, expires_ms, revoked_ms FROM tokens";

struct Row {
    info: TokenInfo,
    hash: String,
}

fn read_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<(TokenInfo, String, String)> {
    let kind: String = row.get(2)?;
    Ok((
        TokenInfo {
            id: row.get(0)?,
            principal: row.get(1)?,
            // Replaced below once the text is checked; the CHECK constraint keeps it valid.
            kind: TokenKind::Client,
            created_ms: row.get(4)?,
            expires_ms: row.get(5)?,
            revoked_ms: row.get(6)?,
        },
        kind,
        row.get(3)?,
    ))
}

impl TokenStore {
    /// Open (creating when missing) the ledger file at `path` and its `tokens` table.
    pub fn open(path: &Path) -> Result<TokenStore, TokenError> {
        let fail = |what: &str, e: &dyn fmt::Display| {
            TokenError(format!("token store {}: {what}: {e}", path.display()))
        };
        prepare(path).map_err(|e| fail("create", &e))?;
        // No SQLITE_OPEN_URI: the configured path is a file name, never a URI.
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut conn = Connection::open_with_flags(path, flags).map_err(|e| fail("open", &e))?;
        conn.busy_timeout(Duration::from_millis(BUSY_TIMEOUT_MS))
            .map_err(|e| fail("busy_timeout", &e))?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| fail("begin", &e))?;
        let application_id: i32 = tx
            .query_row("PRAGMA application_id", [], |r| r.get(0))
            .map_err(|e| fail("application_id", &e))?;
        let foreign_objects: i64 = tx
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE tbl_name != 'tokens'",
                [],
                |r| r.get(0),
            )
            .map_err(|e| fail("schema", &e))?;
        let ours = application_id == LEDGER_APPLICATION_ID
            || (application_id == 0 && foreign_objects == 0);
        if !ours {
            return Err(TokenError(format!(
                "token store {}: not a toolwall ledger (application_id {application_id}, \
                 {foreign_objects} other schema objects); refusing to touch it",
                path.display()
            )));
        }
        tx.execute_batch(TOKENS_TABLE_SQL)
            .map_err(|e| fail("create table", &e))?;
        if application_id == 0 {
            tx.execute_batch(&format!("PRAGMA application_id = {LEDGER_APPLICATION_ID};"))
                .map_err(|e| fail("application_id", &e))?;
        }
        tx.commit().map_err(|e| fail("commit", &e))?;
        // The ledger runs in WAL mode; a file created here starts in it too, so lookups by
        // the gateway never wait for its writer.
        let _mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(|e| fail("journal_mode", &e))?;
        Ok(TokenStore {
            conn,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Make a token for `principal`; `lifetime` None means it never expires.
    pub fn create(
        &self,
        principal: &str,
        kind: TokenKind,
        lifetime: Option<Duration>,
        now_ms: i64,
    ) -> Result<NewToken, TokenError> {
        validate_principal(principal).map_err(TokenError)?;
        let expires_ms = match lifetime {
            None => None,
            Some(d) if d.is_zero() || d > MAX_LIFETIME => {
                return Err(TokenError(format!(
                    "a token lifetime must be between 1 second and {} days",
                    MAX_LIFETIME.as_secs() / 86400
                )));
            }
            // Bounded by MAX_LIFETIME, so the milliseconds fit an i64 with room to spare.
            Some(d) => Some(now_ms.saturating_add(d.as_millis() as i64)),
        };
        let secret =
            secret::generate().map_err(|e| TokenError(format!("cannot read random bytes: {e}")))?;
        let hash = secret::hash_hex(&secret);
        self.conn
            .execute(
                "INSERT INTO tokens (principal, kind, hash, created_ms, expires_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![principal, kind.as_str(), hash, now_ms, expires_ms],
            )
            .map_err(|e| self.error("insert", &e))?;
        let id = self.conn.last_insert_rowid();
        Ok(NewToken {
            info: TokenInfo {
                id,
                principal: principal.to_owned(),
                kind,
                created_ms: now_ms,
                expires_ms,
                revoked_ms: None,
            },
            secret,
        })
    }

    /// Every token, oldest first, without secrets (the store has none).
    pub fn list(&self) -> Result<Vec<TokenInfo>, TokenError> {
        let mut stmt = self
            .conn
            .prepare(&format!("{SELECT_COLUMNS} ORDER BY id"))
            .map_err(|e| self.error("list", &e))?;
        let rows = stmt
            .query_map([], read_row)
            .map_err(|e| self.error("list", &e))?;
        let mut out = Vec::new();
        for row in rows {
            let row = self.finish_row(row.map_err(|e| self.error("list", &e))?)?;
            out.push(row.info);
        }
        Ok(out)
    }

    /// Revoke token `id` at `now_ms`. Revoking twice keeps the first time.
    pub fn revoke(&self, id: i64, now_ms: i64) -> Result<RevokeOutcome, TokenError> {
        let changed = self
            .conn
            .execute(
                "UPDATE tokens SET revoked_ms = ?2 WHERE id = ?1 AND revoked_ms IS NULL",
                params![id, now_ms],
            )
            .map_err(|e| self.error("revoke", &e))?;
        let row = self
            .conn
            .query_row(&format!("{SELECT_COLUMNS} WHERE id = ?1"), [id], read_row)
            .optional()
            .map_err(|e| self.error("revoke", &e))?;
        let Some(row) = row else {
            return Ok(RevokeOutcome::NotFound);
        };
        let info = self.finish_row(row)?.info;
        Ok(if changed == 1 {
            RevokeOutcome::Revoked(info)
        } else {
            RevokeOutcome::AlreadyRevoked(info)
        })
    }

    fn finish_row(
        &self,
        (mut info, kind, hash): (TokenInfo, String, String),
    ) -> Result<Row, TokenError> {
        info.kind = TokenKind::parse(&kind).map_err(|e| {
            TokenError(format!(
                "token store {}: row {}: {e}",
                self.path.display(),
                info.id
            ))
        })?;
        Ok(Row { info, hash })
    }

    fn error(&self, what: &str, e: &rusqlite::Error) -> TokenError {
        TokenError(format!("token store {}: {what}: {e}", self.path.display()))
    }
}

impl TokenVerifier for TokenStore {
    fn verify(&self, presented: &str, now_ms: i64) -> Result<TokenInfo, AuthFailure> {
        if !secret::well_formed(presented) {
            return Err(AuthFailure::Malformed);
        }
        let hash = secret::hash_hex(presented);
        // Looking up by hash leaks, through timing, at most something about the hashes of
        // guesses the client chose; turning that into a stored hash's preimage means
        // inverting SHA-256. The equality below is constant-time all the same.
        let found = self
            .conn
            .prepare_cached(&format!("{SELECT_COLUMNS} WHERE hash = ?1"))
            .and_then(|mut stmt| stmt.query_row([&hash], read_row).optional());
        let row = match found {
            Ok(Some(row)) => row,
            Ok(None) => return Err(AuthFailure::Unknown),
            Err(e) => {
                crate::warn!(
                    "token store {}: lookup failed, refusing the request: {e}",
                    self.path.display()
                );
                return Err(AuthFailure::Unavailable);
            }
        };
        let row = match self.finish_row(row) {
            Ok(row) => row,
            Err(e) => {
                crate::warn!("{e}; refusing the request");
                return Err(AuthFailure::Unavailable);
            }
        };
        if !ct_eq(row.hash.as_bytes(), hash.as_bytes()) {
            return Err(AuthFailure::Unknown);
        }
        match row.info.status(now_ms) {
            super::TokenStatus::Active => Ok(row.info),
            super::TokenStatus::Expired => Err(AuthFailure::Expired),
            super::TokenStatus::Revoked => Err(AuthFailure::Revoked),
        }
    }
}

/// Create the directory (0700) and the file (0600) when missing; existing ones keep their
/// modes, as the ledger does. An existing file is never opened here: closing any descriptor
/// of the database file drops every POSIX lock this process's SQLite connections hold on it
/// (the gateway opens the token store after its ledger), and another process could then
/// delete the live WAL.
fn prepare(path: &Path) -> std::io::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(parent)?;
    }
    match OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn store(dir: &tempfile::TempDir) -> TokenStore {
        TokenStore::open(&dir.path().join("state/ledger.db")).unwrap()
    }

    #[test]
    fn create_verify_list_revoke() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(&dir);
        let new = s.create("alice", TokenKind::Client, None, 1_000).unwrap();
        assert!(secret::well_formed(&new.secret));
        assert!(!format!("{new:?}").contains(&new.secret));
        let info = s.verify(&new.secret, 2_000).unwrap();
        assert_eq!(info.principal, "alice");
        assert_eq!(info.kind, TokenKind::Client);
        assert_eq!(info, new.info);

        let admin = s
            .create(
                "ops",
                TokenKind::Admin,
                Some(Duration::from_secs(60)),
                1_000,
            )
            .unwrap();
        assert_eq!(admin.info.expires_ms, Some(61_000));
        assert_eq!(
            s.verify(&admin.secret, 60_999).unwrap().kind,
            TokenKind::Admin
        );
        assert_eq!(s.verify(&admin.secret, 61_000), Err(AuthFailure::Expired));

        let listed = s.list().unwrap();
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[0].principal, "alice");

        assert!(
            matches!(s.revoke(new.info.id, 5_000).unwrap(), RevokeOutcome::Revoked(i) if i.revoked_ms == Some(5_000))
        );
        assert!(
            matches!(s.revoke(new.info.id, 6_000).unwrap(), RevokeOutcome::AlreadyRevoked(i) if i.revoked_ms == Some(5_000))
        );
        assert_eq!(s.revoke(999, 6_000).unwrap(), RevokeOutcome::NotFound);
        assert_eq!(s.verify(&new.secret, 7_000), Err(AuthFailure::Revoked));
    }

    #[test]
    fn unknown_and_malformed() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(&dir);
        let other = secret::generate().unwrap();
        assert_eq!(s.verify(&other, 0), Err(AuthFailure::Unknown));
        assert_eq!(s.verify("hunter2", 0), Err(AuthFailure::Malformed));
        assert_eq!(s.verify("", 0), Err(AuthFailure::Malformed));
    }

    #[test]
    fn only_the_hash_is_stored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let s = TokenStore::open(&path).unwrap();
        let new = s.create("alice", TokenKind::Client, None, 0).unwrap();
        drop(s);
        let conn = Connection::open(&path).unwrap();
        let dump: Vec<String> = conn
            .prepare("SELECT principal || kind || hash || created_ms FROM tokens")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(dump.len(), 1);
        assert!(!dump[0].contains(&new.secret));
        assert!(!dump[0].contains(&new.secret[secret::TOKEN_PREFIX.len()..]));
        // Nothing else in the files holds it either (the main file and its WAL).
        let needle = new.secret.as_bytes();
        for file in [path.clone(), path.with_extension("db-wal")] {
            let bytes = std::fs::read(&file).unwrap_or_default();
            assert!(!bytes.windows(needle.len()).any(|w| w == needle));
        }
    }

    #[test]
    fn another_process_sees_creates_and_revokes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let gateway = TokenStore::open(&path).unwrap();
        let cli = TokenStore::open(&path).unwrap();
        let new = cli.create("bob", TokenKind::Client, None, 0).unwrap();
        assert!(gateway.verify(&new.secret, 1).is_ok());
        cli.revoke(new.info.id, 2).unwrap();
        assert_eq!(gateway.verify(&new.secret, 3), Err(AuthFailure::Revoked));
    }

    #[test]
    fn fresh_file_is_private_and_stamped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new/ledger.db");
        TokenStore::open(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, FILE_MODE);
        let dmode = std::fs::metadata(path.parent().unwrap())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(dmode, DIR_MODE);
        let conn = Connection::open(&path).unwrap();
        let app: i32 = conn
            .query_row("PRAGMA application_id", [], |r| r.get(0))
            .unwrap();
        assert_eq!(app, LEDGER_APPLICATION_ID);
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, 0, "the ledger owns user_version");
        // Opening again is idempotent.
        drop(conn);
        TokenStore::open(&path).unwrap();
    }

    #[test]
    fn foreign_database_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("other.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("CREATE TABLE notes (x TEXT);").unwrap();
        drop(conn);
        let err = TokenStore::open(&path).unwrap_err();
        assert!(err.0.contains("not a toolwall ledger"), "{err}");
        let conn = Connection::open(&path).unwrap();
        let has_tokens: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE name = 'tokens'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(has_tokens, 0);
    }

    #[test]
    fn bad_inputs_to_create() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(&dir);
        assert!(s.create("bad name", TokenKind::Client, None, 0).is_err());
        assert!(
            s.create("a", TokenKind::Client, Some(Duration::ZERO), 0)
                .is_err()
        );
        assert!(
            s.create(
                "a",
                TokenKind::Client,
                Some(MAX_LIFETIME + Duration::from_secs(1)),
                0
            )
            .is_err()
        );
        assert!(s.list().unwrap().is_empty());
    }
}
