//! `topk` and `argsort` at steady state allocate nothing on the heap: the per-chunk
//! key buffers are pooled scratch. Its own test binary: the counting global
//! allocator sees every allocation of the process.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use fucina_exec::ExecContext;

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's arguments.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's arguments.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn topk_and_argsort_allocate_nothing_at_steady_state() {
    for threads in [1, 2] {
        let ctx = ExecContext::with_threads(threads);
        let n = 64 * 2048;
        let v: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1009) as f32).collect();
        // Lines along the last axis and along the first (the transposed path),
        // enough work to be split into parallel chunks.
        let x = ctx.from_slice(&[64, 2048], &v).unwrap();
        let run = || {
            drop(ctx.topk(&x, 7, 1, true).unwrap());
            drop(ctx.argsort(&x, 1, false).unwrap());
            drop(ctx.topk(&x, 3, 0, false).unwrap());
        };
        run();
        run();
        let before = ALLOCATIONS.load(Ordering::Relaxed);
        for _ in 0..3 {
            run();
        }
        let after = ALLOCATIONS.load(Ordering::Relaxed);
        assert_eq!(after - before, 0, "heap allocations at {threads} thread(s)");
        drop(x);
        ctx.close().unwrap();
    }
}
