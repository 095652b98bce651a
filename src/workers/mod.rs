//! Workers: the processes that run tool code, and the gateway's side of them.

pub mod agent_host_start;
pub mod pool_calls;
pub mod relay_wire;
pub mod rpc;
pub mod settings;
pub mod supervisor;
pub mod worker_main;
