//! Steady-state dispatch allocates nothing (its own test binary, so no other
//! test's allocations are counted).

use fucina_thread::{Chain, Team, TeamOptions};
use std::sync::atomic::{AtomicUsize, Ordering};

#[path = "support/counting.rs"]
mod counting;

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

#[test]
fn steady_state_dispatch_allocates_nothing() {
    counting::in_own_process("steady_state_dispatch_allocates_nothing", body);
}

fn body() {
    let team = Team::new(TeamOptions { max_workers: 1 }).unwrap();
    let tasks: Vec<usize> = (0..64).collect();
    let mut chained = vec![0u32; 64];
    let sum = AtomicUsize::new(0);
    let mut rows = vec![[0u32; 4]; 64];
    let mut out = vec![0f32; 4096];
    let mut work = |team: &Team, chained: &mut [u32]| {
        team.parallel_chunks(&tasks, |&i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        team.parallel_chunks(&tasks[..2], |&i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        team.parallel_for(0, 4096, 64, |r| {
            sum.fetch_add(r.len(), Ordering::Relaxed);
        });
        team.parallel_chunks_mut(&mut rows[..], |row| {
            row[0] += 1;
        });
        team.parallel_chunks_mut(&mut rows[..2], |row| {
            row[1] += 1;
        });
        team.parallel_for_slices(&mut out[..], 64, |r, s| {
            s[0] = r.start as f32;
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
    let before = counting::allocations();
    for _ in 0..2000 {
        work(&team, &mut chained);
    }
    let after = counting::allocations();
    assert_eq!(
        after - before,
        0,
        "steady-state dispatches allocated {} times",
        after - before
    );
    assert!(team.is_started() || team.participants() == 1);
    assert!(sum.load(Ordering::Relaxed) > 0);
    counting::check_the_counter();
}
