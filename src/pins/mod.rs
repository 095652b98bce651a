//! Tool pinning against "rug pulls": a tool's whole definition (every field an agent or
//! model sees) is pinned by its SHA-256 digest in the ledger database. A different
//! definition later is recorded as pending and, under `pin = "enforce"`, the tool is hidden
//! and its calls refused until the operator approves exactly that digest
//! (`toolwall pins approve SERVER__TOOL --digest D`). A tool new to an already pinned
//! server follows `[servers.NAME] new_tools` (held until approved by default).
//!
//! - [`digest`]: what is pinned, canonical JSON, SHA-256 (pure).
//! - [`review`]: what a listed tool means for its pin (pure).
//! - [`store`]: the pin tables and their own migrations (SQLite).
//! - [`kinds`]: which kinds are pinned (tools, prompts, resource templates, resources) and
//!   their keys.
//! - [`origin`]: one key for every spelling of a server's address (renames, respellings).
//! - [`intake`]: the thread where listings are checked and pinned, off the gateway's loop.
//! - [`views`], [`cli_output`], [`visible`]: `toolwall pins list` (every invisible or
//!   look-alike character shown) and `pins approve`.

pub mod cli_output;
pub mod digest;
pub mod intake;
pub mod kinds;
pub mod origin;
pub mod review;
pub mod store;
pub mod views;
pub mod visible;

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

/// `[servers.NAME] new_tools`: what happens to a tool a server did not list before, once
/// that server has been pinned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NewTools {
    /// Pinned on first sight and served at once (logged and recorded).
    Serve,
    /// Held: not listed, calls refused, until `toolwall pins approve` (logged and recorded).
    Hold,
}

impl NewTools {
    pub fn as_str(self) -> &'static str {
        match self {
            NewTools::Serve => "serve",
            NewTools::Hold => "hold",
        }
    }
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
