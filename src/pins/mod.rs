//! Tool pinning against "rug pulls": the first time an upstream tool is seen, a digest of
//! its name, description, input schema and annotations is stored in the ledger database
//! (`tool_pins`). When the upstream later offers a different definition, the tool is hidden
//! and its calls are refused with `pin_changed` until the operator approves the change
//! (`toolwall pins approve SERVER__TOOL`; `toolwall pins list` shows old and new).
//!
//! - [`digest`]: the pinned fields, canonical JSON, SHA-256 (pure).
//! - [`store`]: the `tool_pins` table (the gateway's own connection to the ledger file).
//! - [`gate`]: what the gateway calls on every tools listing of an upstream, on every
//!   call, and on approval.
//! - [`cli_output`]: the text of `toolwall pins list`.

pub mod cli_output;
pub mod digest;
pub mod gate;
pub mod store;

pub use gate::{PinGate, PinNote, PinReview};
pub use store::{PinRecord, PinStore};

use serde::{Deserialize, Serialize};

/// `[servers.NAME] pin`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PinMode {
    /// A changed tool is hidden and refused until approved (default).
    #[default]
    Enforce,
    /// A changed tool stays usable; the change is logged, recorded and listed.
    Warn,
    /// No pinning for this server.
    Off,
}

impl PinMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PinMode::Enforce => "enforce",
            PinMode::Warn => "warn",
            PinMode::Off => "off",
        }
    }
}
