//! The doors' wire formats, sans-IO: framed (unix, vsock) and lines (stdio).

pub mod framed;
pub mod http;
pub mod lines;
