//! toolwall-relay's library: the agent frame codec shared with the gateway.

pub mod frame;
