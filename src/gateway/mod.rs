//! The gateway: one thread, one mio loop, the doors, and the core that decides.

pub mod admin;
pub mod core;
pub mod door_limits;
pub mod event_loop;
pub mod http_door;
pub mod listeners;
pub mod relay_config;
pub mod state_key;
pub mod stdio;
pub mod used_approvals;
