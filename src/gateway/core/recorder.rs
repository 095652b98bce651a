//! Where the core's ledger records go. The core only stages them; the loop commits (the
//! ledger's SQLite writer) and tells the core how the commit went. Tests stage into memory.

use serde_json::Value;

use crate::ledger::{CallEnd, CallStart, Ledger};

/// The staging half of a ledger: no I/O happens behind these calls.
pub trait Recorder {
    /// A fresh `tool_calls` id.
    fn new_call_id(&mut self) -> i64;
    fn stage_call(&mut self, call: &CallStart);
    fn stage_call_end(&mut self, id: i64, end: &CallEnd);
    fn stage_rule_event(
        &mut self,
        call_id: i64,
        seq: u32,
        rule_id: &str,
        action: &str,
        phase: &str,
        layer: &str,
    );
    fn stage_event(&mut self, kind: &str, detail: &Value);
    /// Rows waiting for the next commit.
    fn staged(&self) -> usize;
}

impl Recorder for Ledger {
    fn new_call_id(&mut self) -> i64 {
        Ledger::new_call_id(self)
    }
    fn stage_call(&mut self, call: &CallStart) {
        Ledger::stage_call(self, call)
    }
    fn stage_call_end(&mut self, id: i64, end: &CallEnd) {
        Ledger::stage_call_end(self, id, end)
    }
    fn stage_rule_event(
        &mut self,
        call_id: i64,
        seq: u32,
        rule_id: &str,
        action: &str,
        phase: &str,
        layer: &str,
    ) {
        Ledger::stage_rule_event(self, call_id, seq, rule_id, action, phase, layer)
    }
    fn stage_event(&mut self, kind: &str, detail: &Value) {
        Ledger::stage_event(self, kind, detail)
    }
    fn staged(&self) -> usize {
        Ledger::staged(self)
    }
}
