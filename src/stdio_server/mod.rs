//! Local MCP servers: the programs people already run over stdio (`npx -y PACKAGE`,
//! `uvx PACKAGE`, a binary), started by toolwall as confined children and spoken to over
//! their stdin and stdout, behind the same catalog, pins, policy and ledger as any other
//! server. See README.md in this directory.
//!
//! - [`config`]: the `[servers.NAME] command = [...]` keys, their checks, the secrets and
//!   the child's environment.

pub mod config;
