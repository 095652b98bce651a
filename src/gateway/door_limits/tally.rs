//! Closes by deadline and refusals by limit, per door, for `/metrics`. Bounded: the keys are
//! fixed sets of doors and reasons.

use std::collections::BTreeMap;

use super::budget::Full;
use super::deadline::Expiry;
use super::settings::Door;

#[derive(Debug, Default, Clone)]
pub struct Tally {
    /// Connections closed at a deadline, by (door, reason).
    pub closed: BTreeMap<(&'static str, &'static str), u64>,
    /// Connections refused or displaced, by (door, reason).
    pub refused: BTreeMap<(&'static str, &'static str), u64>,
}

impl Tally {
    pub fn closed(&mut self, door: Door, why: Expiry) {
        *self
            .closed
            .entry((door.as_str(), why.as_str()))
            .or_insert(0) += 1;
    }

    pub fn refused(&mut self, door: Door, why: Full) {
        *self
            .refused
            .entry((door.as_str(), why.reason()))
            .or_insert(0) += 1;
    }

    /// A connection closed to make room for a new one (it had not sent a whole request, or
    /// sat idle between requests).
    pub fn displaced(&mut self, door: Door) {
        *self
            .refused
            .entry((door.as_str(), "displaced"))
            .or_insert(0) += 1;
    }
}
