//! The config loader: any text as `toolwall.toml`, validated as `serve` would (every
//! section's limits), then the policy it names loaded and the doors' limits derived.
//! Invariants: no panic; a config that loads has every limit within its documented bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "alloc_cap.rs"]
mod alloc_cap;
#[global_allocator]
static ALLOC: alloc_cap::Capped = alloc_cap::Capped;
use toolwall::config::{Config, MAX_TIMEOUT_SECS};
use toolwall::gateway::door_limits::DoorLimits;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = Config::from_toml(text, "fuzz.toml") else {
        return;
    };
    assert!(config.gateway.max_connections > 0);
    assert!(config.gateway.frame_timeout_secs <= MAX_TIMEOUT_SECS);
    assert!(config.http.max_body_bytes > 0);
    let limits = DoorLimits::from_config(&config);
    assert!(limits.framed_per_peer >= 1 && limits.http_per_principal >= 1);
    // Policies may name files (corp layers); only inline rules are loaded here.
    if config.policy.corp.is_none() {
        let _ = toolwall::policy::Policy::load(&config.policy, "fuzz.toml");
    }
});
