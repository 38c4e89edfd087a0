//! Shared test support: a counting global allocator. Each test binary that
//! uses it installs it itself (`#[global_allocator]`) and is its own process,
//! so no other test's allocations are counted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

/// Forwards to the system allocator and counts allocations and reallocations.
pub(crate) struct Counting;

/// Allocations (and reallocations) made through [`Counting`] so far.
pub(crate) static ALLOCS: AtomicU64 = AtomicU64::new(0);

/// The current allocation count.
pub(crate) fn allocations() -> u64 {
    ALLOCS.load(Ordering::SeqCst)
}

// SAFETY: forwards every call to `System` unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
