//! A steady-state `OneShotWorker::join` allocates nothing (the job is
//! type-erased on the caller's stack). Own binary: the counting allocator
//! sees the whole process.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use fucina_thread::OneShotWorker;

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to `System` unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn steady_state_join_does_not_allocate() {
    let worker = OneShotWorker::new();
    let data = [1u64; 256];
    let mut acc = 0u64;
    // Warm-up: the first join starts the thread (allocates).
    for _ in 0..10 {
        let (a, b) = worker
            .join(|| data.iter().sum::<u64>(), || data.len() as u64)
            .unwrap();
        acc += a + b;
    }
    let before = ALLOCS.load(Ordering::SeqCst);
    for _ in 0..1000 {
        let (a, b) = worker
            .join(|| data.iter().sum::<u64>(), || data.len() as u64)
            .unwrap();
        acc += a + b;
    }
    let after = ALLOCS.load(Ordering::SeqCst);
    assert_eq!(acc, 1010 * 512);
    assert_eq!(after - before, 0, "allocations in 1000 steady-state joins");
    // The counter works: an allocation is seen.
    let v = std::hint::black_box(vec![0u8; 64]);
    assert!(ALLOCS.load(Ordering::SeqCst) > after);
    drop(v);
}
