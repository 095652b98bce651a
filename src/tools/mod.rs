//! Built-in tool implementations, run only inside workers.

pub mod http;
