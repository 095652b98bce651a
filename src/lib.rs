//! toolwall: an MCP firewall. The gateway (one thread, one mio loop) owns the doors,
//! policy, ledger and worker supervision; tool code runs only in confined workers.

pub mod log;

pub mod config;
pub mod ledger;
pub mod policy;
pub mod sandbox;
pub mod systemd;
pub mod tools;
