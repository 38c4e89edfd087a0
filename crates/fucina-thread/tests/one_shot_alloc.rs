//! A steady-state `OneShotWorker::join` allocates nothing (the job is
//! type-erased on the caller's stack). Own binary: the counting allocator
//! sees every thread of the process but the test harness's first one.

use fucina_thread::OneShotWorker;

#[path = "support/counting.rs"]
mod counting;

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

#[test]
fn steady_state_join_does_not_allocate() {
    counting::in_own_process("steady_state_join_does_not_allocate", body);
}

fn body() {
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
    let before = counting::allocations();
    for _ in 0..1000 {
        let (a, b) = worker
            .join(|| data.iter().sum::<u64>(), || data.len() as u64)
            .unwrap();
        acc += a + b;
    }
    let after = counting::allocations();
    assert_eq!(acc, 1010 * 512);
    assert_eq!(after - before, 0, "allocations in 1000 steady-state joins");
    counting::check_the_counter();
}
