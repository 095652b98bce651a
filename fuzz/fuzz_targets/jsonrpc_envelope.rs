//! The JSON-RPC envelope every agent message goes through first. Invariants: no panic; a
//! parsed request's id is valid JSON and its params well-formed JSON (an object or an
//! array); an error answer built for any fault (with the id the fault could read) is
//! itself one valid JSON-RPC error object.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "alloc_cap.rs"]
mod alloc_cap;
#[global_allocator]
static ALLOC: alloc_cap::Capped = alloc_cap::Capped;
use toolwall::mcp::jsonrpc::{self, Message};

fuzz_target!(|data: &[u8]| {
    match jsonrpc::parse(data) {
        Ok(Message::Request { id, method, params }) => {
            assert!(serde_json::from_str::<serde_json::Value>(id.get()).is_ok());
            if let Some(p) = params {
                // Well-formed JSON, an object or array. A number beyond f64 (`1e400`) is
                // well-formed but no `Value` holds it: the pipeline answers -32602 naming
                // it, so only the syntax is the envelope's promise.
                assert!(serde_json::from_str::<serde::de::IgnoredAny>(p.get()).is_ok());
                assert!(matches!(p.get().as_bytes().first(), Some(b'{' | b'[')));
            }
            let answer = jsonrpc::error_response(Some(id.get()), -32601, &method, None);
            let v: serde_json::Value = serde_json::from_slice(&answer).unwrap();
            assert_eq!(v["jsonrpc"], "2.0");
        }
        Ok(_) => {}
        Err(fault) => {
            let answer =
                jsonrpc::error_response(fault.id.map(|i| i.get()), fault.code, fault.message, None);
            let v: serde_json::Value = serde_json::from_slice(&answer).unwrap();
            assert_eq!(v["error"]["code"], fault.code);
        }
    }
});
