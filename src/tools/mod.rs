//! Built-in tool implementations, run only inside workers.

pub mod echo;
pub mod http;
