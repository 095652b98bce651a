//! `ask_via = "client"`: an `ask` answered by the human at the agent's client.

use serde_json::Value;

use super::dispatch::RequestCtx;
use super::exchange::Routed;
use super::request_state::Claims;
use super::{Core, Recorder};

impl<R: Recorder> Core<R> {
    /// A retry carrying an approval's state (see `input_retry.rs`).
    pub(super) fn resume_client_ask(
        &mut self,
        _ctx: &RequestCtx,
        _routed: Routed,
        _params: &Value,
        _claims: &Claims,
    ) -> Result<(), String> {
        Err("asks at the client are not enabled here".into())
    }
}
