//! How an [`super::upstream::Upstream`] reaches its server: Streamable HTTP
//! ([`Transport`]), or the stdin and stdout of a local program ([`LineChannel`],
//! implemented by `crate::stdio_server::link`). The era logic, listings, catalog events
//! and error reporting above it are the same for both.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::error::UpstreamError;
use super::exchange::{Notice, Reply, Transport};

/// A newline-delimited JSON-RPC channel to a program toolwall runs (MCP's stdio
/// transport). Every call is bounded in time; none blocks on a program that stopped
/// reading or answering.
pub trait LineChannel: Send + Sync {
    /// Make sure the program runs (start it when it does not); the error names the server
    /// and says why it could not start.
    fn open(&self) -> Result<(), UpstreamError>;
    /// The session failed (no handshake, a broken stream): stop the program, so the next
    /// [`LineChannel::open`] starts it afresh.
    fn reset(&self, why: &UpstreamError);
    /// Write `body` (one message); when `want` is a request id, wait for its answer.
    fn post(&self, body: &[u8], want: Option<u64>) -> Result<Reply, UpstreamError>;
    /// Like `post`, but a request the server does not answer within the probe's own short
    /// timeout comes back as a reply without an answer (a legacy server may ignore
    /// `server/discover`).
    fn probe(&self, body: &[u8], want: u64) -> Result<Reply, UpstreamError>;
    /// Send `body` when given (a subscription), then hand every notification and server
    /// request to `notice` until the stream breaks (always an error).
    fn listen(
        &self,
        body: Option<&[u8]>,
        notice: &mut dyn FnMut(Notice),
    ) -> Result<(), UpstreamError>;
    /// Facts for `toolwall status` (pid, starts), merged into `upstream_state` events.
    fn describe(&self) -> Value;
    /// The server was found to speak the legacy era: its next start skips the probe.
    fn note_legacy(&self);
    fn knows_legacy(&self) -> bool;
}

/// One server's way in.
pub enum Channel {
    Http(Box<Transport>),
    Lines(Arc<dyn LineChannel>),
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Channel::Http(t) => t.fmt(f),
            Channel::Lines(_) => f.write_str("Channel::Lines"),
        }
    }
}

impl Channel {
    pub fn open(&self) -> Result<(), UpstreamError> {
        match self {
            Channel::Http(_) => Ok(()),
            Channel::Lines(l) => l.open(),
        }
    }

    pub fn reset(&self, why: &UpstreamError) {
        if let Channel::Lines(l) = self {
            l.reset(why);
        }
    }

    pub fn post(
        &self,
        protocol_headers: &[(&str, String)],
        body: &[u8],
        want: Option<u64>,
        notice: &mut dyn FnMut(Notice),
    ) -> Result<Reply, UpstreamError> {
        match self {
            Channel::Http(t) => t.post(protocol_headers, body, want, notice),
            // Notices of a line channel arrive on its one stream, through `listen`.
            Channel::Lines(l) => l.post(body, want),
        }
    }

    /// A request of an agent's call: over HTTP on the connection kept for calls, so that
    /// closing it (a cancellation) leaves the gateway's own requests alone.
    pub fn post_for_call(
        &self,
        protocol_headers: &[(&str, String)],
        body: &[u8],
        want: Option<u64>,
        notice: &mut dyn FnMut(Notice),
    ) -> Result<Reply, UpstreamError> {
        match self {
            Channel::Http(t) => t.post_for_call(protocol_headers, body, want, notice),
            Channel::Lines(l) => l.post(body, want),
        }
    }

    /// `server/discover`: a line channel's server may not answer it at all.
    pub fn probe(
        &self,
        protocol_headers: &[(&str, String)],
        body: &[u8],
        want: u64,
        notice: &mut dyn FnMut(Notice),
    ) -> Result<Reply, UpstreamError> {
        match self {
            Channel::Http(t) => t.post(protocol_headers, body, Some(want), notice),
            Channel::Lines(l) => l.probe(body, want),
        }
    }

    pub fn listen(
        &self,
        protocol_headers: &[(&str, String)],
        body: Option<&[u8]>,
        idle: Duration,
        notice: &mut dyn FnMut(Notice),
    ) -> Result<(), UpstreamError> {
        match self {
            Channel::Http(t) => t.listen(protocol_headers, body, idle, notice),
            Channel::Lines(l) => l.listen(body, notice),
        }
    }

    /// A line channel listens whatever the server announces: its one stream is also how
    /// a crash is seen at once.
    pub fn always_listens(&self) -> bool {
        matches!(self, Channel::Lines(_))
    }

    pub fn describe(&self) -> Option<Value> {
        match self {
            Channel::Http(_) => None,
            Channel::Lines(l) => Some(l.describe()),
        }
    }

    pub fn note_legacy(&self) {
        if let Channel::Lines(l) = self {
            l.note_legacy();
        }
    }

    pub fn knows_legacy(&self) -> bool {
        match self {
            Channel::Http(_) => false,
            Channel::Lines(l) => l.knows_legacy(),
        }
    }
}
