//! A pool hit performs no heap allocation at all: counted by a `#[global_allocator]`
//! that tallies allocations made on the current thread (so the test harness's own
//! threads cannot disturb the count).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use fucina_storage::BufferPool;

struct Counting;

thread_local! {
    static ALLOCS: Cell<usize> = const { Cell::new(0) };
}

fn bump() {
    // `try_with`: the slot may be gone while the thread is being torn down.
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        bump();
        // SAFETY: forwarded contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocs() -> usize {
    ALLOCS.with(Cell::get)
}

#[test]
fn counter_sees_allocations() {
    let before = allocs();
    let v = std::hint::black_box(vec![1u8; 10]);
    assert_eq!(allocs(), before + 1, "the counting allocator must be live");
    drop(v);
    let pool = BufferPool::new();
    let before = allocs();
    drop(pool.acquire(10).unwrap()); // a miss: header + block (+ free-list growth)
    assert!(allocs() >= before + 2);
}

/// The same rounds through a `LocalPool`: local hits, and releases into the local
/// tier, allocate nothing either.
#[test]
fn local_tier_hits_allocate_nothing() {
    let pool = BufferPool::new();
    let local = pool.local();
    let sizes = [1usize, 100, 1024, 5000, 65536, 1 << 20];
    let round = |round: usize| {
        let n = sizes[round % sizes.len()];
        let mut a = local.acquire(n).unwrap();
        a.get_mut().unwrap()[0] = round as f32;
        let view = a.clone();
        drop(a);
        assert_eq!(view[0], round as f32);
        drop(view);
        drop(local.acquire_typed::<f32>(n).unwrap());
        let h = local.acquire_typed::<half::f16>(n).unwrap();
        let i = local.acquire_typed::<i64>(n.div_ceil(4)).unwrap();
        drop((h, i));
        drop(local.acquire_typed::<bool>(n).unwrap());
        let mut lease = local.acquire_scratch::<[u8; 2]>(n).unwrap();
        lease[0] = [1, 2];
        lease.release();
    };
    (0..sizes.len()).for_each(round);
    let cached = (local.cached_buffers(), local.cached_slabs());
    let shared_misses = pool.stats().misses;
    let before = allocs();
    (0..1000).for_each(round);
    assert_eq!(allocs() - before, 0, "local hits allocated on the heap");
    assert_eq!((local.cached_buffers(), local.cached_slabs()), cached);
    assert_eq!(
        pool.stats().misses,
        shared_misses,
        "every round hit locally"
    );
    assert_eq!(local.stats().misses, pool.stats().misses);
    assert_eq!(pool.outstanding_buffers(), 0);
}

#[test]
fn pool_hits_allocate_nothing() {
    let pool = BufferPool::new();
    let sizes = [1usize, 100, 1024, 5000, 65536, 1 << 20];
    let round = |round: usize| {
        let n = sizes[round % sizes.len()];
        // f32 arm: acquire, alias, write, release.
        let mut a = pool.acquire(n).unwrap();
        a.get_mut().unwrap()[0] = round as f32;
        let view = a.clone();
        drop(a);
        assert_eq!(view[0], round as f32);
        drop(view);
        // f32 through the typed entry.
        drop(pool.acquire_typed::<f32>(n).unwrap());
        // Slab arm: typed buffers of several dtypes (headers are recycled too), bools,
        // and scratch leases.
        let h = pool.acquire_typed::<half::f16>(n).unwrap();
        let i = pool.acquire_typed::<i64>(n.div_ceil(4)).unwrap();
        drop((h, i));
        drop(pool.acquire_typed::<bool>(n).unwrap());
        let mut lease = pool.acquire_scratch::<[u8; 2]>(n).unwrap();
        lease[0] = [1, 2];
        lease.release();
    };
    // Warm up: one pass over the sizes misses once per size class and sizes the lists.
    (0..sizes.len()).for_each(round);
    let cached = (pool.cached_buffers(), pool.cached_slabs());

    let before = allocs();
    (0..1000).for_each(round);
    assert_eq!(allocs() - before, 0, "pool hits allocated on the heap");
    assert_eq!((pool.cached_buffers(), pool.cached_slabs()), cached);
    assert_eq!(pool.outstanding_buffers(), 0);
}

/// `trim()` frees the cached buffers, not the free lists' own storage: a release after a
/// trim caches its buffer without allocating.
#[test]
fn release_after_trim_allocates_nothing() {
    let pool = BufferPool::new();
    let sizes = [10usize, 2000, 70_000];
    // Warm both arms with several entries per list.
    let held: Vec<_> = sizes.iter().map(|&n| pool.acquire(n).unwrap()).collect();
    let slabs: Vec<_> = sizes
        .iter()
        .map(|&n| pool.acquire_typed::<u16>(n).unwrap())
        .collect();
    drop((held, slabs));
    assert_eq!((pool.cached_buffers(), pool.cached_slabs()), (3, 3));
    assert!(pool.trim() > 0);

    for _ in 0..2 {
        // Misses after the trim: they allocate; the releases must not.
        let held: Vec<_> = sizes.iter().map(|&n| pool.acquire(n).unwrap()).collect();
        let slabs: Vec<_> = sizes
            .iter()
            .map(|&n| pool.acquire_typed::<u16>(n).unwrap())
            .collect();
        let before = allocs();
        drop((held, slabs));
        assert_eq!(allocs() - before, 0, "a release after trim() allocated");
        assert_eq!((pool.cached_buffers(), pool.cached_slabs()), (3, 3));
        pool.trim();
    }
}

/// The free lists are linked through the cached headers, so caching never grows a
/// vector: releasing more buffers of a class than were ever cached before allocates
/// nothing (only a group of 64 size classes never seen before costs one small chunk).
#[test]
fn releases_past_the_previous_list_length_allocate_nothing() {
    let pool = BufferPool::new();
    drop(pool.acquire(512).unwrap()); // the f32 class group is known now
    drop(pool.acquire_typed::<u8>(1).unwrap()); // and the first slab group
    for n in [4usize, 64, 300] {
        let held: Vec<_> = (0..n).map(|_| pool.acquire(500).unwrap()).collect();
        let slabs: Vec<_> = (0..n)
            .map(|_| pool.acquire_typed::<u8>(3).unwrap())
            .collect();
        let before = allocs();
        drop(held);
        drop(slabs);
        // The two `Vec`s of handles above are freed, not allocated.
        assert_eq!(
            allocs() - before,
            0,
            "caching {n} buffers per class allocated"
        );
        assert_eq!((pool.cached_buffers(), pool.cached_slabs()), (n, n));
    }
}
