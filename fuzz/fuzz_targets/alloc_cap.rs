//! A cap on memory for every fuzz target, that holds with or without a sanitizer.
//! libFuzzer's `-malloc_limit_mb` needs a sanitizer's allocator hooks; runs built with
//! `-s none` (several times faster, `FUZZ_SANITIZER=none fuzz/run.sh`) would have no
//! allocation limit at all. This allocator aborts, which libFuzzer reports as a crash and
//! keeps the input, when one allocation asks for `MAX_ONE` bytes or more, or the bytes live
//! at once would pass `MAX_LIVE`: the decoders' own limits are far below both.
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// One allocation of this size or more is a finding (as `-malloc_limit_mb=256`).
pub const MAX_ONE: usize = 256 << 20;
/// Bytes live at once beyond this are a finding (under `-rss_limit_mb=1024`, so the cap
/// names the input before the RSS check kills the run).
pub const MAX_LIVE: usize = 768 << 20;

static LIVE: AtomicUsize = AtomicUsize::new(0);

pub struct Capped;

fn claim(size: usize) {
    let live = LIVE.fetch_add(size, Ordering::Relaxed) + size;
    if size >= MAX_ONE || live > MAX_LIVE {
        // No printing: it could allocate. The abort is the report.
        std::process::abort();
    }
}

// SAFETY: every call goes to the system allocator with the caller's layout unchanged; the
// counter only watches sizes.
unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        claim(layout.size());
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        claim(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        claim(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
