//! toolwall: an MCP firewall. The gateway (one thread, one mio loop) owns the doors,
//! policy, ledger and worker supervision; tool code runs only in confined workers.

pub mod log;

pub mod aggregator;
pub mod cli;
pub mod config;
pub mod gateway;
pub mod import;
pub mod launcher;
pub mod ledger;
pub mod mcp;
pub mod pins;
pub mod policy;
pub mod sandbox;
pub mod stdio_server;
pub mod systemd;
pub mod tokens;
pub mod tools;
pub mod transport;
pub mod workers;
pub mod workspace;
