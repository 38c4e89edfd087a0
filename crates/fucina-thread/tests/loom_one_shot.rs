//! loom models of the `OneShotWorker` state machine (idle/reserved/job/done/
//! stop): lazy start, publication of the job and its result, no lost wake-up
//! on either side, reuse, the busy path, and shutdown.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p fucina-thread
//! --release --test loom_one_shot`.

#![cfg(loom)]

use fucina_thread::OneShotWorker;
use loom::sync::Arc;

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(2);
    }
    builder.check(f);
}

#[test]
fn one_job_then_shutdown() {
    model(|| {
        let worker = OneShotWorker::new();
        let mut left = 1u32;
        let (a, b) = worker
            .join(
                || {
                    left += 10;
                    left
                },
                || 2u32,
            )
            .unwrap();
        assert_eq!((a, b), (11, 2));
        assert_eq!(left, 11);
        drop(worker);
    });
}

#[test]
fn two_jobs_reuse_the_helper() {
    model(|| {
        let worker = OneShotWorker::new();
        let mut counter = 0u32;
        worker.join(|| counter += 1, || ()).unwrap();
        assert_eq!(counter, 1);
        worker.join(|| counter += 1, || ()).unwrap();
        assert_eq!(counter, 2);
    });
}

#[test]
fn two_callers_one_is_served_or_both_run() {
    model(|| {
        let worker = Arc::new(OneShotWorker::new());
        worker.start().unwrap();
        let other = {
            let worker = Arc::clone(&worker);
            loom::thread::spawn(move || worker.join(|| 1u32, || 2u32).unwrap())
        };
        let mine = worker.join(|| 3u32, || 4u32).unwrap();
        assert_eq!(mine, (3, 4));
        assert_eq!(other.join().unwrap(), (1, 2));
    });
}
