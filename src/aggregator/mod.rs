//! The aggregator: external MCP servers (Streamable HTTP, both eras) behind one namespaced,
//! pinned, policy-checked catalog. See README.md in this directory.
//!
//! Gateway side: [`config`] (`[servers]`), [`budget`] (what a listing may hold),
//! [`prepare`] (credentials, addresses, ports), [`spec`] (the worker's spec and `configure`
//! request), [`status`] (per-server state from the worker's events), [`relist`] (when to
//! list a server again), [`gateway_state`] (all of it, for the core). Worker side:
//! [`worker`] (requests), [`upstream`] (one server's connection), [`exchange`] (one HTTP
//! exchange), and the sans-IO cores [`sse`], [`era`], [`message`], [`listing_pages`].

pub mod answer_bound;
pub mod budget;
pub mod call_connections;
pub mod call_link;
pub mod call_relay;
pub mod channel;
pub mod config;
pub mod drop_tally;
pub mod era;
pub mod error;
pub mod exchange;
pub mod gateway_state;
pub(crate) mod inline_secret;
pub mod job_queue;
pub mod json_nodes;
pub mod listing_notes;
pub mod listing_pages;
pub mod message;
pub mod missing_capability;
pub mod owner_candidates;
pub mod prepare;
pub mod relist;
pub mod resource_subscriptions;
pub mod scrub;
pub mod setup;
pub mod spec;
pub mod sse;
pub mod status;
pub mod template_claims;
pub mod upstream;
pub mod worker;

pub use config::{ServerConfig, ServersConfig};
pub use setup::AggregatorSetup;
