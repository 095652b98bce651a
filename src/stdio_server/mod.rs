//! Local MCP servers: the programs people already run over stdio (`npx -y PACKAGE`,
//! `uvx PACKAGE`, a binary), started by toolwall as confined children and spoken to over
//! their stdin and stdout, behind the same catalog, pins, policy and ledger as any other
//! server. See README.md in this directory.
//!
//! - [`config`]: the `[servers.NAME] command = [...]` keys, their checks, the secrets and
//!   the child's environment (gateway side).
//! - [`hosting`]: each server's host worker, its settings and state directory, and its
//!   `configure` setup (gateway side).
//! - [`host`]: `toolwall worker stdio-server`, the confined host of one server;
//!   [`settings`] what it is told; [`link`] the MCP channel over the program's stdin and
//!   stdout, with [`lines`] (bounded line splitting) and [`stderr_log`] (the stderr tail,
//!   rate-limited, secrets redacted).
//! - [`stderr_board`]: each server's last stderr lines in the gateway (status, log).

pub mod config;
pub mod host;
pub mod hosting;
pub mod lines;
pub mod link;
pub mod load_warnings;
mod rpc_output;
pub mod settings;
pub mod state_dir;
pub mod stderr_board;
pub mod stderr_log;
