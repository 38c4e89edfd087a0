//! `TaskPool`: many tasks run exactly once, borrowing, nesting, panics, sizing.

use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};

use fucina_thread::{MAX_THREADS, TaskPool, cpu_thread_count};

static_assertions::assert_impl_all!(TaskPool: Send, Sync, Default, std::fmt::Debug);

#[test]
fn lazy_and_sized_by_the_knobs() {
    let pool = TaskPool::new();
    assert!(!pool.is_started());
    let expected = cpu_thread_count(MAX_THREADS).saturating_sub(1).max(1);
    assert_eq!(TaskPool::default_threads(), expected);
    assert_eq!(pool.num_threads(), expected);
    pool.scope(|_| ()).unwrap();
    assert!(pool.is_started());
    assert_eq!(pool.num_threads(), expected);

    let three = TaskPool::with_threads(3);
    assert_eq!(three.num_threads(), 3);
    three.start().unwrap();
    assert_eq!(three.num_threads(), 3);
    assert_eq!(
        TaskPool::with_threads(0).num_threads(),
        expected,
        "0 = default"
    );
}

#[test]
fn many_tasks_each_run_exactly_once() {
    let pool = TaskPool::with_threads(2);
    let n = if cfg!(miri) { 100 } else { 20_000 };
    let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
    let r = pool
        .scope(|s| {
            for h in &hits {
                s.spawn(move |_| {
                    h.fetch_add(1, Ordering::Relaxed);
                });
            }
            "op result"
        })
        .unwrap();
    assert_eq!(r, "op result");
    assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
}

#[test]
fn tasks_borrow_and_write_disjoint_slices() {
    let pool = TaskPool::with_threads(3);
    let input: Vec<u32> = (0..10_000).collect();
    let mut out = vec![0u32; input.len()];
    pool.scope(|s| {
        for (src, dst) in input.chunks(97).zip(out.chunks_mut(97)) {
            s.spawn(move |_| {
                for (d, x) in dst.iter_mut().zip(src) {
                    *d = x * 2 + 1;
                }
            });
        }
    })
    .unwrap();
    assert!(out.iter().zip(&input).all(|(o, i)| *o == i * 2 + 1));
}

#[test]
fn tasks_run_on_pool_threads_and_may_spawn_more() {
    let pool = TaskPool::with_threads(2);
    let count = AtomicUsize::new(0);
    let on_pool = AtomicUsize::new(0);
    pool.scope(|s| {
        for _ in 0..10 {
            s.spawn(|s| {
                for _ in 0..10 {
                    s.spawn(|_| {
                        count.fetch_add(1, Ordering::Relaxed);
                        let name = std::thread::current().name().map(str::to_owned);
                        if name.is_some_and(|n| n.starts_with("fucina-task-")) {
                            on_pool.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                }
            });
        }
    })
    .unwrap();
    assert_eq!(
        count.load(Ordering::Relaxed),
        100,
        "scope waited for nested tasks"
    );
    assert_eq!(on_pool.load(Ordering::Relaxed), 100);
}

#[test]
fn a_panicking_task_propagates_after_the_others_finish() {
    let pool = TaskPool::with_threads(2);
    let done = AtomicUsize::new(0);
    let err = panic::catch_unwind(AssertUnwindSafe(|| {
        pool.scope(|s| {
            for i in 0..50 {
                let done = &done;
                s.spawn(move |_| {
                    if i == 17 {
                        panic!("task 17");
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                });
            }
        })
    }))
    .unwrap_err();
    assert_eq!(err.downcast_ref::<&str>(), Some(&"task 17"));
    assert_eq!(done.load(Ordering::Relaxed), 49);
    // The pool keeps working.
    let again = AtomicUsize::new(0);
    pool.scope(|s| {
        for _ in 0..10 {
            s.spawn(|_| {
                again.fetch_add(1, Ordering::Relaxed);
            });
        }
    })
    .unwrap();
    assert_eq!(again.load(Ordering::Relaxed), 10);
}
