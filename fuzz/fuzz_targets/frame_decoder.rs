//! Decode arbitrary bytes the way a connection does: meta line first, then frames, each
//! item consuming a bounded, non-zero prefix, until the decoder wants more or gives up.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "alloc_cap.rs"]
mod alloc_cap;
#[global_allocator]
static ALLOC: alloc_cap::Capped = alloc_cap::Capped;
use toolwall_relay::frame::{
    Decoded, Decoder, HEADER_LEN, MAX_META_LINE, MAX_NAME, MAX_TOTAL, PREFIX_LEN,
};

fuzz_target!(|bytes: &[u8]| {
    let mut decoder = Decoder::new();
    let mut rest = bytes;
    loop {
        let consumed = match decoder.decode(rest) {
            Ok(Decoded::NeedMore) | Err(_) => break,
            Ok(Decoded::Meta { name, consumed }) => {
                assert!(consumed <= MAX_META_LINE);
                assert!(!name.contains('\n'));
                consumed
            }
            Ok(Decoded::Frame {
                header,
                name,
                payload,
                consumed,
            }) => {
                assert_eq!(
                    consumed,
                    PREFIX_LEN + HEADER_LEN + name.len() + payload.len()
                );
                assert!(consumed <= PREFIX_LEN + MAX_TOTAL);
                assert!(name.len() <= MAX_NAME);
                assert_eq!(header.payload_len as usize, payload.len());
                consumed
            }
            Ok(Decoded::Invalid { consumed, .. }) => {
                assert!(consumed <= PREFIX_LEN + MAX_TOTAL);
                consumed
            }
        };
        assert!(consumed > 0 && consumed <= rest.len());
        rest = &rest[consumed..];
    }
});
