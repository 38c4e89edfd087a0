//! Shared test support: a counting global allocator. Each test binary that
//! uses it installs it itself (`#[global_allocator]`) and is its own process,
//! so no other test's allocations are counted.
//!
//! Only the allocations of *marked* threads are counted ([`count_this_thread`]):
//! the test's own thread and the workers it marks by running a task on each.
//! The test harness's threads are left out: under load, libtest's main thread
//! can reach its first blocking channel receive (which allocates a waker entry)
//! only after the test has started measuring, and counting that made these
//! tests flaky on a busy machine (4 allocations in 2 of 40 runs).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Forwards to the system allocator and counts the allocations and
/// reallocations of marked threads.
pub(crate) struct Counting;

/// Allocations (and reallocations) of marked threads so far.
pub(crate) static ALLOCS: AtomicU64 = AtomicU64::new(0);

/// Threads marked so far.
static MARKED: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Whether this thread's allocations are counted (const-initialized, so
    /// reading it from inside the allocator never allocates).
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

/// Counts this thread's allocations from now on.
pub(crate) fn count_this_thread() {
    COUNTED.with(|c| {
        if !c.replace(true) {
            MARKED.fetch_add(1, Ordering::SeqCst);
        }
    });
}

/// How many distinct threads have been marked.
pub(crate) fn marked_threads() -> usize {
    MARKED.load(Ordering::SeqCst)
}

/// The current allocation count.
pub(crate) fn allocations() -> u64 {
    ALLOCS.load(Ordering::SeqCst)
}

fn tally() {
    // `try_with`: the slot may be gone while a thread is being torn down.
    if COUNTED.try_with(Cell::get).unwrap_or(false) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: forwards every call to `System` unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        tally();
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        tally();
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
