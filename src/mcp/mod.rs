//! The MCP surface: envelope, protocol eras, the merged catalog and tool errors.

pub mod catalog;
pub mod client_caps;
pub mod compact_text;
pub mod jsonrpc;
pub mod log_level;
pub mod param_headers;
pub mod protocol;
pub mod token_bucket;
pub mod tool_error;
