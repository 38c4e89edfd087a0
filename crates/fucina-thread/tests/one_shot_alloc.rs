//! A steady-state `OneShotWorker::join` allocates nothing (the job is
//! type-erased on the caller's stack). Own binary: the counting allocator
//! sees the whole process.

use fucina_thread::OneShotWorker;

mod support;

#[global_allocator]
static GLOBAL: support::Counting = support::Counting;

#[test]
fn steady_state_join_does_not_allocate() {
    let worker = OneShotWorker::new();
    let data = [1u64; 256];
    let mut acc = 0u64;
    // Count the caller's and the helper's allocations (the helper runs the
    // first closure of a join on an idle worker).
    support::count_this_thread();
    let caller = std::thread::current().id();
    let (helper, ()) = worker
        .join(
            || {
                support::count_this_thread();
                std::thread::current().id()
            },
            || (),
        )
        .unwrap();
    assert_ne!(helper, caller, "the first branch ran on the helper thread");
    assert_eq!(support::marked_threads(), 2);
    // Warm-up: the first join starts the thread (allocates).
    for _ in 0..10 {
        let (a, b) = worker
            .join(|| data.iter().sum::<u64>(), || data.len() as u64)
            .unwrap();
        acc += a + b;
    }
    let before = support::allocations();
    for _ in 0..1000 {
        let (a, b) = worker
            .join(|| data.iter().sum::<u64>(), || data.len() as u64)
            .unwrap();
        acc += a + b;
    }
    let after = support::allocations();
    assert_eq!(acc, 1010 * 512);
    assert_eq!(after - before, 0, "allocations in 1000 steady-state joins");
    // The counter works: an allocation is seen on the caller, and on the helper.
    let v = std::hint::black_box(vec![0u8; 64]);
    assert!(support::allocations() > after);
    drop(v);
    let mid = support::allocations();
    let (on, ()) = worker
        .join(
            || {
                drop(std::hint::black_box(vec![0u8; 64]));
                std::thread::current().id()
            },
            || (),
        )
        .unwrap();
    assert_eq!(on, helper);
    assert!(
        support::allocations() > mid,
        "the helper's allocations count"
    );
}
