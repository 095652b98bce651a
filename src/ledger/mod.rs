//! The SQLite ledger. To be written.

use serde::Deserialize;
use std::path::PathBuf;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LedgerConfig {
    pub path: PathBuf,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        LedgerConfig {
            path: PathBuf::from("toolwall-data/ledger.db"),
        }
    }
}
