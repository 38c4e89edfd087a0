//! Every thread this crate starts runs its tasks in the default float
//! environment, whatever the thread that started it had set (on Linux a new
//! thread inherits its creator's MXCSR/FPCR: see fucina-fpenv's
//! `tests/threads.rs`).
//!
//! Each test starts the threads while the calling thread is in a non-default
//! environment (round toward zero + flush-to-zero), then puts the caller back
//! to the default and checks what the tasks observe. Between `set` and the
//! guard's restore the caller runs only thread-spawning code, no float code
//! that relies on the default environment (the contract of
//! `fucina_fpenv::set`).

use fucina_fpenv::{Environment, Guard, RoundingMode, UnderflowMode};
use fucina_thread::{OneShotWorker, TaskPool, Team, TeamOptions};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const ODD: Environment = Environment {
    rounding: RoundingMode::TowardZero,
    underflow: UnderflowMode::FlushToZero,
};

/// Runs `start` with the caller in [`ODD`], then restores the default.
fn started_under_odd_environment(start: impl FnOnce()) {
    let mut guard = Guard::begin();
    // SAFETY: restored by `guard.restore()` below, before any float code that
    // relies on the default environment runs on this thread.
    unsafe { fucina_fpenv::set(ODD) };
    assert_eq!(fucina_fpenv::get().is_some(), fucina_fpenv::SUPPORTED);
    start();
    guard.restore();
    fucina_fpenv::assert_default().expect("the guard restored the caller");
}

#[test]
fn team_workers_start_in_the_default_environment() {
    let team = Team::new(TeamOptions { max_workers: 1 }).unwrap();
    // Every dispatch below is published (the adaptive mode could otherwise
    // run a small job alone on a loaded machine).
    team.set_adaptive(false);
    started_under_odd_environment(|| team.warm_up().unwrap());
    let seen = Mutex::new(Vec::new());
    let worker_ran = AtomicBool::new(false);
    let on_worker = || {
        std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with("fucina-team"))
    };
    let tasks: Vec<usize> = (0..64).collect();
    for round in 0..20 {
        if round == 0 && team.participants() > 1 {
            // A rendezvous, not a timing assumption: the caller's static task
            // (0) waits until the worker has entered and run its own (1). A
            // worker that is late only delays it; the caller cannot finish
            // its share, close the job and run task 1 itself first.
            let t0 = Instant::now();
            team.parallel_chunks(&[0usize, 1], |&i| {
                if on_worker() {
                    seen.lock().unwrap().push((true, fucina_fpenv::get()));
                    worker_ran.store(true, Ordering::Release);
                } else if i == 0 {
                    while !worker_ran.load(Ordering::Acquire) {
                        assert!(
                            t0.elapsed() < Duration::from_secs(60),
                            "the worker never entered"
                        );
                        std::thread::yield_now();
                    }
                }
            });
        }
        team.parallel_chunks(&tasks, |_| {
            seen.lock()
                .unwrap()
                .push((on_worker(), fucina_fpenv::get()));
        });
    }
    let seen = seen.into_inner().unwrap();
    if team.participants() > 1 && fucina_fpenv::SUPPORTED {
        assert!(seen.iter().any(|(w, _)| *w), "no task ran on a worker");
    }
    for (_, env) in seen {
        assert!(env.is_none_or(|e| e.is_default()), "a task saw {env:?}");
    }
}

#[test]
fn one_shot_helper_starts_in_the_default_environment() {
    let worker = OneShotWorker::new();
    started_under_odd_environment(|| worker.start().unwrap());
    let (a, _) = worker.join(fucina_fpenv::get, || ()).unwrap();
    assert!(a.is_none_or(|e| e.is_default()), "the helper saw {a:?}");
}

#[test]
fn task_pool_threads_start_in_the_default_environment() {
    let pool = TaskPool::with_threads(2);
    started_under_odd_environment(|| pool.start().unwrap());
    let seen = Mutex::new(Vec::new());
    pool.scope(|s| {
        for _ in 0..32 {
            s.spawn(|_| seen.lock().unwrap().push(fucina_fpenv::get()));
        }
    })
    .unwrap();
    for env in seen.into_inner().unwrap() {
        assert!(env.is_none_or(|e| e.is_default()), "a task saw {env:?}");
    }
}
