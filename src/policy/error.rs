//! A policy that could not be loaded: every fault found, each naming file, line (where
//! known) and rule id.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError(Vec<String>);

impl PolicyError {
    pub(crate) fn new(faults: Vec<String>) -> Self {
        PolicyError(faults)
    }

    /// One message per fault, in the order found.
    pub fn faults(&self) -> &[String] {
        &self.0
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.as_slice() {
            [] => f.write_str("policy error"),
            [one] => f.write_str(one),
            many => {
                write!(f, "{} policy faults: ", many.len())?;
                f.write_str(&many.join("; "))
            }
        }
    }
}

impl std::error::Error for PolicyError {}
