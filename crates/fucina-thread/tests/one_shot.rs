//! `OneShotWorker`: overlap, reuse, borrowing, panics, busy and nested use,
//! shutdown.

use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use fucina_thread::OneShotWorker;

static_assertions::assert_impl_all!(OneShotWorker: Send, Sync, Default, std::fmt::Debug);

#[test]
fn starts_lazily() {
    let worker = OneShotWorker::new();
    assert!(!worker.is_started(), "no thread at construction");
    worker.join(|| (), || ()).unwrap();
    assert!(worker.is_started());
    worker.start().unwrap(); // idempotent
}

#[test]
fn two_jobs_count_to_one_then_two() {
    let worker = OneShotWorker::new();
    let counter = AtomicUsize::new(0);
    let (a, ()) = worker
        .join(|| counter.fetch_add(1, Ordering::SeqCst) + 1, || ())
        .unwrap();
    assert_eq!(a, 1);
    assert_eq!(counter.load(Ordering::SeqCst), 1);
    let (a, ()) = worker
        .join(|| counter.fetch_add(1, Ordering::SeqCst) + 1, || ())
        .unwrap();
    assert_eq!(a, 2);
    assert_eq!(counter.load(Ordering::SeqCst), 2);
}

#[test]
fn job_runs_on_one_persistent_helper_thread() {
    let worker = OneShotWorker::new();
    let caller = thread::current().id();
    let (first, ()) = worker.join(|| thread::current().id(), || ()).unwrap();
    assert_ne!(first, caller);
    for _ in 0..10 {
        let (id, name) = worker
            .join(
                || {
                    (
                        thread::current().id(),
                        thread::current().name().map(str::to_owned),
                    )
                },
                || (),
            )
            .unwrap()
            .0;
        assert_eq!(id, first, "the same helper runs every job");
        assert_eq!(name.as_deref(), Some("fucina-one-shot"));
    }
}

#[test]
fn branches_really_overlap() {
    // Each branch waits for the other at a barrier: only finishes if they run
    // at the same time on two threads.
    let worker = OneShotWorker::new();
    let barrier = Barrier::new(2);
    let (a, b) = worker
        .join(|| barrier.wait().is_leader(), || barrier.wait().is_leader())
        .unwrap();
    assert!(a ^ b, "exactly one leader");
}

#[test]
fn jobs_borrow_and_mutate_caller_data() {
    let worker = OneShotWorker::new();
    let mut left = vec![1u64; 1000];
    let mut right = vec![2u64; 1000];
    let (sa, sb) = worker
        .join(
            || {
                left.iter_mut().for_each(|x| *x *= 3);
                left.iter().sum::<u64>()
            },
            || {
                right.iter_mut().for_each(|x| *x *= 5);
                right.iter().sum::<u64>()
            },
        )
        .unwrap();
    assert_eq!((sa, sb), (3000, 10_000));
    assert!(left.iter().all(|&x| x == 3) && right.iter().all(|&x| x == 10));
}

#[test]
fn thousands_of_jobs() {
    let worker = OneShotWorker::new();
    let n = if cfg!(miri) { 50 } else { 5000 };
    let counter = AtomicUsize::new(0);
    let mut caller_sum = 0usize;
    for i in 0..n {
        let (a, b) = worker
            .join(|| counter.fetch_add(i, Ordering::Relaxed), || i * 2)
            .unwrap();
        assert!(a <= counter.load(Ordering::Relaxed));
        caller_sum += b;
    }
    assert_eq!(counter.load(Ordering::Relaxed), n * (n - 1) / 2);
    assert_eq!(caller_sum, n * (n - 1));
}

#[test]
fn panic_in_job_propagates_after_join_and_worker_survives() {
    let worker = OneShotWorker::new();
    let b_ran = Cell::new(false);
    let err = panic::catch_unwind(AssertUnwindSafe(|| {
        worker
            .join(|| -> u32 { panic!("job boom") }, || b_ran.set(true))
            .unwrap()
    }))
    .unwrap_err();
    assert_eq!(err.downcast_ref::<&str>(), Some(&"job boom"));
    assert!(b_ran.get(), "the caller's branch still ran");
    assert_eq!(worker.join(|| 7, || 8).unwrap(), (7, 8), "still usable");
}

#[test]
fn panic_in_caller_branch_waits_for_the_job() {
    let worker = OneShotWorker::new();
    let job_finished = AtomicBool::new(false);
    let err = panic::catch_unwind(AssertUnwindSafe(|| {
        worker
            .join(
                || {
                    thread::sleep(Duration::from_millis(50));
                    job_finished.store(true, Ordering::SeqCst);
                },
                || -> () { panic!("caller boom") },
            )
            .unwrap()
    }))
    .unwrap_err();
    assert_eq!(err.downcast_ref::<&str>(), Some(&"caller boom"));
    assert!(
        job_finished.load(Ordering::SeqCst),
        "join waited for the job before unwinding"
    );
    assert_eq!(worker.join(|| 1, || 2).unwrap(), (1, 2));
}

#[test]
fn both_panic_resumes_the_jobs_panic() {
    let worker = OneShotWorker::new();
    let err = panic::catch_unwind(AssertUnwindSafe(|| {
        worker
            .join(|| -> () { panic!("from a") }, || -> () { panic!("from b") })
            .unwrap()
    }))
    .unwrap_err();
    assert_eq!(err.downcast_ref::<&str>(), Some(&"from a"));
    assert_eq!(worker.join(|| 3, || 4).unwrap(), (3, 4));
}

#[test]
fn nested_join_runs_serially() {
    let worker = OneShotWorker::new();
    let helper = worker.join(|| thread::current().id(), || ()).unwrap().0;
    // From inside the job: busy -> both inner branches on the helper thread.
    let (inner, ()) = worker
        .join(
            || {
                worker
                    .join(|| thread::current().id(), || thread::current().id())
                    .unwrap()
            },
            || (),
        )
        .unwrap();
    assert_eq!(inner, (helper, helper));
    // From the caller's branch: busy -> both inner branches on the caller.
    let me = thread::current().id();
    let ((), inner) = worker
        .join(
            || (),
            || {
                worker
                    .join(|| thread::current().id(), || thread::current().id())
                    .unwrap()
            },
        )
        .unwrap();
    assert_eq!(inner, (me, me));
}

#[test]
fn concurrent_callers_all_complete() {
    let worker = Arc::new(OneShotWorker::new());
    let total = Arc::new(AtomicUsize::new(0));
    let rounds = if cfg!(miri) { 20 } else { 2000 };
    let handles: Vec<_> = (0..3)
        .map(|_| {
            let worker = Arc::clone(&worker);
            let total = Arc::clone(&total);
            thread::spawn(move || {
                for _ in 0..rounds {
                    let (a, b) = worker
                        .join(
                            || total.fetch_add(1, Ordering::Relaxed),
                            || total.fetch_add(1, Ordering::Relaxed),
                        )
                        .unwrap();
                    assert_ne!(a, b);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(
        total.load(Ordering::Relaxed),
        3 * rounds * 2,
        "every branch ran exactly once"
    );
}

#[test]
fn drop_stops_and_joins_the_helper() {
    static EXITED: AtomicUsize = AtomicUsize::new(0);
    struct OnExit;
    impl Drop for OnExit {
        fn drop(&mut self) {
            EXITED.fetch_add(1, Ordering::SeqCst);
        }
    }
    thread_local! {
        static GUARD: OnExit = const { OnExit };
    }
    for round in 1..=5 {
        let worker = OneShotWorker::new();
        // Touch the thread-local on the helper so its destructor runs at exit.
        worker.join(|| GUARD.with(|_| ()), || ()).unwrap();
        assert_eq!(EXITED.load(Ordering::SeqCst), round - 1);
        drop(worker);
        assert_eq!(
            EXITED.load(Ordering::SeqCst),
            round,
            "drop joined the helper thread"
        );
    }
    // A never-started worker drops without a thread.
    drop(OneShotWorker::new());
    assert_eq!(EXITED.load(Ordering::SeqCst), 5);
}
