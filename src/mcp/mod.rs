//! The MCP surface: envelope, protocol eras, the merged catalog and tool errors.

pub mod catalog;
pub mod jsonrpc;
pub mod protocol;
pub mod tool_error;
