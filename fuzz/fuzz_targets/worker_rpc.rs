//! The worker RPC decoder (u32 length + one MessagePack map), as the gateway and every
//! worker read it: whole buffers through `decode`, and the same bytes in pieces through
//! the bounded `RpcReader`. Invariants: no panic; a message consumes a non-empty prefix no
//! longer than the limit; both paths agree; what decodes re-encodes and decodes the same.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "alloc_cap.rs"]
mod alloc_cap;
#[global_allocator]
static ALLOC: alloc_cap::Capped = alloc_cap::Capped;
use toolwall::workers::rpc::{self, MAX_MESSAGE, RpcReader};

fuzz_target!(|data: &[u8]| {
    let mut whole = Vec::new();
    let mut rest = data;
    while let Ok(Some((msg, used))) = rpc::decode(rest) {
        assert!(used > 4 && used <= rest.len() && used <= 4 + MAX_MESSAGE);
        let mut again = Vec::new();
        if rpc::encode(&mut again, &msg).is_ok() {
            let (back, n) = rpc::decode(&again).unwrap().unwrap();
            assert_eq!(n, again.len());
            assert_eq!(format!("{back:?}"), format!("{msg:?}"));
        }
        whole.push(format!("{msg:?}"));
        rest = &rest[used..];
    }
    // The same bytes in 7-byte reads.
    let mut reader = RpcReader::default();
    let mut pieces = Vec::new();
    let mut fed = 0;
    'outer: while fed < data.len() {
        let spare = reader.spare();
        let n = spare.len().min(7).min(data.len() - fed);
        spare[..n].copy_from_slice(&data[fed..fed + n]);
        reader.filled(n);
        fed += n;
        loop {
            match reader.next_message() {
                Ok(Some(msg)) => pieces.push(format!("{msg:?}")),
                Ok(None) => break,
                Err(_) => break 'outer,
            }
        }
    }
    assert_eq!(&pieces[..], &whole[..pieces.len().min(whole.len())]);
});
