//! The pin store's I/O, which the core never performs: the loop's own connection (an
//! operator's approval, one row; `pins list`; the resource owners read at start) and the
//! listing intake thread, to which the loop hands the jobs the core staged and from which it
//! takes back what was done, as input for the core.

use std::sync::Arc;
use std::time::Instant;

use mio::Waker;
use serde_json::{Value, json};

use super::Gateway;
use crate::aggregator::config::ServersConfig;
use crate::aggregator::gateway_state::intake_capacity;
use crate::pins::intake::Intake;
use crate::pins::store::PinStore;

pub struct PinIo {
    /// The loop's connection; `None` when the file could not be opened (enforced tools
    /// stay hidden, approvals are refused).
    store: Option<PinStore>,
    intake: Intake,
}

impl PinIo {
    /// Open the pin store beside the ledger (after `Ledger::open` migrated it) and start
    /// the intake thread; `waker` wakes the loop when the thread finished a job. Returns
    /// the resource owners the store remembers, for the core.
    pub fn open(
        config: &ServersConfig,
        ledger_path: &std::path::Path,
        waker: Arc<Waker>,
    ) -> (PinIo, Vec<(String, String, i64)>) {
        let store = match PinStore::open(ledger_path) {
            Ok(s) => Some(s),
            Err(e) => {
                crate::error!("{e}; upstream tools under pin = \"enforce\" stay hidden");
                None
            }
        };
        let owners = match store.as_ref().map(PinStore::owners) {
            Some(Ok(rows)) => rows,
            Some(Err(e)) => {
                crate::error!("{e}");
                Vec::new()
            }
            None => Vec::new(),
        };
        let intake = Intake::start(ledger_path, waker, intake_capacity(config));
        (PinIo { store, intake }, owners)
    }
}

impl Gateway {
    /// Hand the intake the jobs the core staged (a refusal goes back to the core), and
    /// give the core what the intake finished.
    pub(super) fn pump_pins(&mut self, now: Instant) {
        let Some(pins) = self.pins.as_mut() else {
            return;
        };
        for job in self.core.take_intake_jobs() {
            if let Err(job) = pins.intake.submit(job) {
                self.core.intake_refused(job, now);
            }
        }
        // One at a time, each timed: a list whose listings cost the loop much is listed
        // less often (`relist_loop_share_percent`).
        for done in pins.intake.poll() {
            let listing = match &done {
                crate::pins::intake::Done::Listing { server, kind, .. } => {
                    Some((server.clone(), *kind))
                }
                crate::pins::intake::Done::Owners { .. } => None,
            };
            let started = Instant::now();
            self.core.on_intake_done(vec![done], now);
            if let Some((server, kind)) = listing {
                self.core
                    .listing_cost(&server, kind, started.elapsed(), now);
            }
        }
    }

    /// `toolwall pins approve TOOL --digest D` (admin socket): approve exactly that
    /// definition in the store, then tell the core (its calls are served again, its
    /// server listed again).
    pub fn approve_pin(
        &mut self,
        tool: &str,
        digest: &str,
        who: &str,
        now: Instant,
    ) -> Result<String, String> {
        if self.core.upstreams().is_none() {
            return Err("no upstream servers are configured".into());
        }
        let store = self
            .pins
            .as_mut()
            .and_then(|p| p.store.as_mut())
            .ok_or_else(|| "the pin store is not open".to_string())?;
        // A key is read as `pins list` shows it (escapes and all): only that reading, so a
        // shown key never falls through to another pin whose raw key is the same text.
        let key = crate::pins::visible::unescape_visible(tool).unwrap_or_else(|| tool.to_owned());
        let (before, after) = store.approve(&key, digest, who, crate::ledger::now_ms())?;
        self.core
            .pin_approved(&key, digest, who, (&before, &after), now)
    }

    /// `toolwall pins list` (admin socket).
    pub fn pins_json(&self) -> Value {
        if self.core.upstreams().is_none() {
            return json!({"ok": true, "pins": []});
        }
        let rows = match self.pins.as_ref().and_then(|p| p.store.as_ref()) {
            Some(store) => store.load_all(),
            None => Err("the pin store is not open".into()),
        };
        self.core.pins_json(rows)
    }
}
