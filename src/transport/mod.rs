//! The doors' wire formats, sans-IO: framed (unix, vsock) and lines (stdio); and the one
//! rule every socket follows for write interest.

pub mod framed;
pub mod http;
pub mod lines;
pub mod write_interest;
