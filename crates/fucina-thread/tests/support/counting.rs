//! A counting global allocator for the zero-allocation tests of fucina-thread,
//! fucina-exec and fucina-autograd (included with `#[path]`; each test binary
//! installs it with `#[global_allocator]` and is its own process).
//!
//! It counts the allocations of every thread except the process's first one.
//! That thread is libtest's main thread, which never runs a test but, under
//! load, may reach its first blocking channel receive (which allocates a waker
//! entry) only after a test has started measuring. Team workers and helper
//! threads are other threads, so they are counted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Forwards to the system allocator and counts allocations, zeroed allocations
/// and reallocations.
pub(crate) struct Counting;

/// Allocations counted so far.
pub(crate) static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Whether this thread's allocations count: 0 not known yet, 1 no (the
    /// process's first thread), 2 yes.
    static KIND: Cell<u8> = const { Cell::new(0) };
}

/// Whether the calling thread's allocations are counted (never allocates).
fn counted() -> bool {
    KIND.try_with(|k| {
        if k.get() == 0 {
            #[cfg(target_os = "linux")]
            // SAFETY: `gettid` and `getpid` are plain system calls without
            // preconditions; the first thread's id is the process id.
            let first = unsafe { libc::gettid() == libc::getpid() };
            #[cfg(not(target_os = "linux"))]
            let first = false;
            k.set(if first { 1 } else { 2 });
        }
        k.get() == 2
    })
    // A thread being torn down: count it.
    .unwrap_or(true)
}

fn tally() {
    if counted() {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

/// The current count.
pub(crate) fn allocations() -> usize {
    ALLOCATIONS.load(Ordering::SeqCst)
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        tally();
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        tally();
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        tally();
        // SAFETY: forwarded with the caller's arguments.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's arguments.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// The counter is not vacuous: it sees an allocation on the calling thread and
/// on a spawned one (run by one test of each binary).
pub(crate) fn check_the_counter() {
    let before = allocations();
    drop(std::hint::black_box(vec![0u8; 64]));
    assert!(allocations() > before, "an allocation on the test's thread");
    std::thread::spawn(|| {
        let before = allocations();
        drop(std::hint::black_box(vec![0u8; 64]));
        assert!(allocations() > before, "an allocation on another thread");
    })
    .join()
    .unwrap();
}
