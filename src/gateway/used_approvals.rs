//! Approvals answered at a client are good once, across a restart too: the nonces used
//! are `client_approval_used` events of the ledger; at start the gateway reads back those
//! that have not expired (read-only, bounded) and hands them to the core.

use std::path::Path;

use crate::gateway::core::Core;

/// Read the unexpired used-approval nonces from the ledger at `path`.
pub fn load(path: &Path, now_ms: i64, limit: usize) -> Result<Vec<(String, i64)>, String> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let db = rusqlite::Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| e.to_string())?;
    // An approval expires at most the longest ask timeout after it was issued.
    let since = now_ms.saturating_sub(
        i64::try_from(crate::policy::MAX_ASK_TIMEOUT_SECS).unwrap_or(i64::MAX) * 1000,
    );
    let mut stmt = db
        .prepare(
            "SELECT json_extract(detail, '$.nonce'), json_extract(detail, '$.expires_ms') \
             FROM events WHERE kind = 'client_approval_used' AND ts_ms >= ?1 \
             ORDER BY id DESC LIMIT ?2",
        )
        .map_err(|e| e.to_string())?;
    let rows = stmt
        .query_map(
            rusqlite::params![since, i64::try_from(limit).unwrap_or(i64::MAX)],
            |r| Ok((r.get::<_, Option<String>>(0)?, r.get::<_, Option<i64>>(1)?)),
        )
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for row in rows {
        if let (Some(nonce), Some(expires)) = row.map_err(|e| e.to_string())?
            && expires > now_ms
        {
            out.push((nonce, expires));
        }
    }
    Ok(out)
}

/// Load them into `core`; a ledger that cannot be read is logged, and asks at clients
/// still work (a replay across this restart is then not recognised: said in the log).
pub fn restore(core: &mut Core, path: &Path) {
    match load(
        path,
        crate::ledger::now_ms(),
        crate::gateway::core::MAX_USED_APPROVALS,
    ) {
        Ok(used) => core.remember_used_approvals(used),
        Err(e) => crate::warn!(
            "ledger {}: cannot read the approvals used before this start ({e}); an approval \
             answered at a client before the restart could be replayed once until it expires",
            path.display()
        ),
    }
}
