//! TEMPORARY interface shim until the ledger branch lands (replaced wholesale on merge).

use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LedgerConfig {
    pub path: PathBuf,
    pub preview_bytes: usize,
    pub body_cap_bytes: usize,
    pub max_staged_rows: usize,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        LedgerConfig {
            path: PathBuf::from("toolwall-data/ledger.db"),
            preview_bytes: 2048,
            body_cap_bytes: 1024 * 1024 + 4096,
            max_staged_rows: 100_000,
        }
    }
}

#[derive(Debug)]
pub struct LedgerError(pub String);
impl std::fmt::Display for LedgerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

pub struct Ledger {
    path: PathBuf,
    next: i64,
    staged: usize,
}

pub struct CallStart<'a> {
    pub id: i64,
    pub ts_ms: i64,
    pub transport: &'a str,
    pub principal: &'a str,
    pub process_name: &'a str,
    pub server_name: &'a str,
    pub tool_name: &'a str,
    pub method: &'a str,
    pub request_id: &'a str,
    pub decision: &'a str,
    pub policy_rule: Option<&'a str>,
    pub policy_reason: Option<&'a str>,
    pub bytes_received: usize,
    pub arguments: &'a [u8],
}

pub struct CallEnd<'a> {
    pub decision: &'a str,
    pub policy_rule: Option<&'a str>,
    pub policy_reason: Option<&'a str>,
    pub duration_us: u64,
    pub error_message: Option<&'a str>,
    pub bytes_sent: usize,
    pub response: &'a [u8],
    pub rewritten_arguments: Option<&'a [u8]>,
    pub original_response: Option<&'a [u8]>,
    pub approved_by: Option<&'a str>,
    pub decided_at_ms: Option<i64>,
}

impl Ledger {
    pub fn open(cfg: &LedgerConfig) -> Result<Ledger, LedgerError> {
        Ok(Ledger {
            path: cfg.path.clone(),
            next: 1,
            staged: 0,
        })
    }
    pub fn new_call_id(&mut self) -> i64 {
        self.next += 1;
        self.next - 1
    }
    pub fn stage_call(&mut self, _call: &CallStart) {
        self.staged += 1;
    }
    pub fn stage_call_end(&mut self, _id: i64, _end: &CallEnd) {
        self.staged += 1;
    }
    pub fn stage_rule_event(
        &mut self,
        _call_id: i64,
        _rule_id: &str,
        _action: &str,
        _phase: &str,
        _layer: &str,
    ) {
        self.staged += 1;
    }
    pub fn stage_event(&mut self, _kind: &str, _detail: &serde_json::Value) {
        self.staged += 1;
    }
    pub fn staged(&self) -> usize {
        self.staged
    }
    pub fn commit(&mut self) -> Result<usize, LedgerError> {
        let n = self.staged;
        self.staged = 0;
        Ok(n)
    }
    pub fn checkpoint(&mut self) -> Result<(), LedgerError> {
        Ok(())
    }
    pub fn path(&self) -> &Path {
        &self.path
    }
}

pub fn tail(_path: &Path, _n: usize, _json: bool) -> Result<String, LedgerError> {
    Ok(String::new())
}
