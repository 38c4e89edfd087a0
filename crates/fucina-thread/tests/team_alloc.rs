//! Steady-state dispatch allocates nothing (its own test binary, so no other
//! test's allocations are counted).

use fucina_thread::{Chain, Team, TeamOptions};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts calls.
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

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn steady_state_dispatch_allocates_nothing() {
    let team = Team::new(TeamOptions { max_workers: 1 }).unwrap();
    let tasks: Vec<usize> = (0..64).collect();
    let mut chained = vec![0u32; 64];
    let sum = AtomicUsize::new(0);
    let work = |team: &Team, chained: &mut [u32]| {
        team.parallel_chunks(&tasks, |&i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        team.parallel_chunks(&tasks[..2], |&i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        team.parallel_for(0, 4096, 64, |r| {
            sum.fetch_add(r.len(), Ordering::Relaxed);
        });
        team.parallel_chained(chained, 1, |x: &mut u32, chain: &Chain| {
            let i = *x as usize;
            if i + 1 < chain.len() {
                chain.enqueue(i + 1);
            }
        });
    };
    for (i, x) in chained.iter_mut().enumerate() {
        *x = i as u32;
    }
    // Warm-up: starts the workers, grows the chained arrays, initializes
    // thread-locals.
    for _ in 0..10 {
        work(&team, &mut chained);
    }
    let before = ALLOCS.load(Ordering::Relaxed);
    for _ in 0..2000 {
        work(&team, &mut chained);
    }
    let after = ALLOCS.load(Ordering::Relaxed);
    assert_eq!(
        after - before,
        0,
        "steady-state dispatches allocated {} times",
        after - before
    );
    assert!(team.is_started() || team.participants() == 1);
    assert!(sum.load(Ordering::Relaxed) > 0);
}
