//! Dropping the last `BufferPool` handle closes the pool: its cache is freed at once,
//! objects still out are freed (not cached) when they drop, and nothing leaks: neither
//! aligned blocks (`allocation_stats`) nor headers, free lists or the pool state (a
//! counting `#[global_allocator]` of net heap bytes on this thread).
//!
//! This binary holds a single test so that nothing else in the process allocates
//! aligned blocks meanwhile.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Barrier;

use fucina_storage::{BufferPool, allocation_stats};

struct Counting;

thread_local! {
    /// Bytes allocated minus bytes freed on this thread.
    static NET: Cell<isize> = const { Cell::new(0) };
}

fn add(bytes: isize) {
    // `try_with`: the slot may be gone while the thread is being torn down.
    let _ = NET.try_with(|c| c.set(c.get() + bytes));
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        add(layout.size() as isize);
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        add(layout.size() as isize);
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        add(new_size as isize - layout.size() as isize);
        // SAFETY: forwarded contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        add(-(layout.size() as isize));
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn net() -> isize {
    NET.with(Cell::get)
}

#[test]
fn last_handle_closes_the_pool_without_leaks() {
    // 1. Single thread: the cache goes with the last handle, outstanding objects go
    //    when they drop, and every heap byte (state, headers, lists) comes back.
    let heap0 = net();
    let s0 = allocation_stats();
    let pool = BufferPool::new();
    // Two cached f32 buffers and one cached slab...
    let (c1, c2) = (pool.acquire(100).unwrap(), pool.acquire(5000).unwrap());
    let c3 = pool.acquire_typed::<u16>(10).unwrap();
    drop((c1, c2, c3));
    // ...and three objects out (all misses, larger than anything cached): a buffer
    // (with an alias), a typed buffer, a lease.
    let mut out = pool.acquire(6000).unwrap();
    let view = out.clone();
    let typed = pool.acquire_typed::<i32>(2000).unwrap();
    let lease = pool.acquire_scratch::<u8>(9000).unwrap();
    assert_eq!((pool.cached_buffers(), pool.cached_slabs()), (2, 1));
    assert_eq!(pool.outstanding_buffers(), 3);
    let s1 = allocation_stats();
    assert_eq!(s1.allocations - s0.allocations, 6);
    assert_eq!(s1.frees, s0.frees);

    // A clone going away closes nothing.
    let clone = pool.clone();
    drop(clone);
    assert_eq!((pool.cached_buffers(), pool.cached_slabs()), (2, 1));
    assert_eq!(allocation_stats().frees, s0.frees);

    // The last handle: the three cached blocks are freed now.
    drop(pool);
    assert_eq!(allocation_stats().frees - s0.frees, 3);

    // Objects still out keep working and are freed one by one as they drop.
    drop(view);
    out.get_mut().unwrap()[1] = 2.0;
    assert_eq!(out[1], 2.0);
    drop(out);
    assert_eq!(allocation_stats().frees - s0.frees, 4);
    drop(typed);
    assert_eq!(allocation_stats().frees - s0.frees, 5);
    drop(lease);
    let s2 = allocation_stats();
    assert_eq!(s2.frees - s0.frees, 6);
    assert_eq!(s2.live_bytes, s0.live_bytes);
    assert_eq!(net(), heap0, "headers, free lists or the pool state leaked");

    // A pool dropped with nothing out frees everything at once.
    let pool = BufferPool::new();
    drop(pool.acquire(10).unwrap());
    drop(pool.acquire_scratch::<u64>(1).unwrap());
    assert_eq!(pool.outstanding_buffers(), 0);
    drop(pool);
    assert_eq!(net(), heap0, "a closed pool leaked heap memory");
    assert_eq!(allocation_stats().live_bytes, s0.live_bytes);

    // 2. A release on another thread races the last handle's drop: whichever wins,
    //    the buffer is freed exactly once (a double free would crash or unbalance the
    //    counters; a leak would leave live bytes behind).
    let s3 = allocation_stats();
    let rounds = 2000;
    let barrier = Barrier::new(2);
    for round in 0..rounds {
        let pool = BufferPool::new();
        drop(pool.acquire(32).unwrap()); // one cached buffer
        let b = pool.acquire(64).unwrap(); // one out (a miss)
        let lease = pool.acquire_scratch::<u8>(1).unwrap();
        assert_eq!(pool.outstanding_buffers(), 2);
        std::thread::scope(|s| {
            s.spawn(|| {
                barrier.wait();
                if round % 2 == 0 {
                    drop(b);
                    drop(lease);
                } else {
                    lease.release();
                    drop(b);
                }
            });
            barrier.wait();
            drop(pool);
        });
    }
    let s4 = allocation_stats();
    assert_eq!(s4.allocations - s3.allocations, 3 * rounds);
    assert_eq!(s4.frees - s3.frees, 3 * rounds);
    assert_eq!(s4.live_bytes, s3.live_bytes);
}
