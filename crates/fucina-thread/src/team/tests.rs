//! Unit tests of the team: the claim-chunk rule and the range jobs, the
//! `done` counter across its wrap, a late worker, the adaptive mode, every
//! mode giving the same bits, and a spawn failure (through the `cfg(test)`
//! hooks of `dispatch.rs`).

use super::*;

#[test]
fn claim_chunk_follows_the_reference_rule() {
    // p = 2: <= 8 -> 1, <= 32 -> 2, else 4.
    assert_eq!(claim_chunk(2, 2), 1);
    assert_eq!(claim_chunk(8, 2), 1);
    assert_eq!(claim_chunk(9, 2), 2);
    assert_eq!(claim_chunk(32, 2), 2);
    assert_eq!(claim_chunk(33, 2), 4);
    assert_eq!(claim_chunk(usize::MAX, usize::MAX), 1);
}

#[test]
fn range_jobs_match_the_deterministic_chunks() {
    let f = |_: Range<usize>| {};
    for (begin, end, grain, threads) in [
        (0usize, 1000usize, 10usize, 4usize),
        (0, 100, 1, 4),
        (3, 4, 1, 2),
        (10, 100_000, 64, 3),
        (7, 4103, 2048, 2),
        (usize::MAX - 100, usize::MAX, 1, 8),
    ] {
        let chunks = chunk_ranges(begin, end, grain, threads);
        let job = RangeJob::new(&chunks, ByRef(&f));
        for (i, r) in chunks.clone().enumerate() {
            assert_eq!(
                job.range(i),
                r,
                "chunk {i} of ({begin}, {end}, {grain}, {threads})"
            );
        }
    }
}

#[test]
fn the_done_counter_crosses_its_wrap() {
    // Start `done` just below its wrap, so the joins of the next
    // dispatches cross it.
    dispatch::COUNTER_START.with(|c| c.set(u32::MAX - 2));
    let team = Team::new(TeamOptions { max_workers: 3 }).unwrap();
    team.warm_up().unwrap();
    dispatch::COUNTER_START.with(|c| c.set(0));
    let p = team.participants();
    for count in [2usize, 3, 5, 9, 17, 40, 100, 2, 7] {
        for _ in 0..4 {
            let hits: Vec<AtomicUsize> = (0..count).map(|_| AtomicUsize::new(0)).collect();
            team.parallel_chunks(&hits, |h| {
                h.fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "{count} tasks on {p} participants"
            );
        }
    }
}

/// The started engine's shared state (test hooks), through the core.
fn shared_of(team: &Team) -> std::sync::Arc<dispatch::Shared> {
    team.with_core(|c| std::sync::Arc::clone(&c.expect("started").engine.shared))
        .expect("not busy")
}

/// Whether the adaptive mode is engaged now.
fn engaged(team: &Team) -> bool {
    team.with_core(|c| c.expect("started").engine.adapt.engaged_now())
        .expect("not busy")
}

/// Waits (event-driven, bounded only by a generous safety timeout) until
/// `cond` holds.
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = std::time::Instant::now();
    while !cond() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(60),
            "timed out waiting: {what}"
        );
        std::thread::yield_now();
    }
}

/// A late worker: it reads the new generation, is held (as if
/// descheduled) until the dispatch returned and the job's closure and
/// tasks were dropped, then finds the seat closed and touches nothing.
#[test]
fn a_late_worker_touches_nothing_of_a_finished_job() {
    let team = Team::new(TeamOptions { max_workers: 1 }).unwrap();
    team.set_adaptive(false);
    team.warm_up().unwrap();
    let sh = shared_of(&team);
    sh.hold.store(true, Ordering::Relaxed);
    let me = std::thread::current().id();
    for round in 0..3u32 {
        let held = sh.held.load(Ordering::Acquire);
        let sh2 = std::sync::Arc::clone(&sh);
        // The closure owns its state (moved into the job descriptor) and
        // is dropped when the dispatch returns.
        let hits: Box<[AtomicUsize; 2]> = Box::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
        let threads = std::sync::Mutex::new(Vec::new());
        let threads_ref = &threads;
        team.parallel_chunks(&[0usize, 1], move |&i| {
            if i == 0 && round == 0 {
                // Hold task 0 until the worker has read this generation
                // (it is then held before entering, for every later
                // round too): it is late for sure.
                wait_until("the worker saw the generation", || {
                    sh2.held.load(Ordering::Acquire) != held
                });
            }
            hits[i].fetch_add(1, Ordering::Relaxed);
            threads_ref
                .lock()
                .unwrap()
                .push(std::thread::current().id());
        });
        // The caller ran both tasks (it stole the worker's static task).
        assert_eq!(*threads.lock().unwrap(), [me, me], "round {round}");
    }
    assert_eq!(sh.held.load(Ordering::Relaxed), 1);
    // Release the worker: it tries to enter a closed seat and skips.
    sh.hold.store(false, Ordering::Relaxed);
    // It still takes part afterwards (a rendezvous: task 0 waits for it).
    let on_worker = AtomicUsize::new(0);
    team.parallel_chunks(&[0usize, 1], |&i| {
        if std::thread::current().id() != me {
            on_worker.fetch_add(1, Ordering::Release);
        } else if i == 0 {
            wait_until("the worker entered", || {
                on_worker.load(Ordering::Acquire) == 1
            });
        }
    });
    assert_eq!(on_worker.load(Ordering::Relaxed), 1);
}

/// Adaptive mode: workers that do not show up for `LATE_STREAK`
/// dispatches make small jobs run alone (nothing published); a large job
/// is still published; when the worker is back, a probe ends the mode.
#[test]
fn absent_workers_engage_the_alone_mode_and_a_probe_ends_it() {
    let team = Team::new(TeamOptions { max_workers: 1 }).unwrap();
    team.warm_up().unwrap();
    let sh = shared_of(&team);
    let generation = || sh.generation.word.word().load(Ordering::Relaxed);
    let me = std::thread::current().id();
    sh.hold.store(true, Ordering::Relaxed);
    let small = [0usize, 1];
    let large: Vec<usize> = (0..adapt::SMALL_TASKS_PER_PARTICIPANT * team.participants()).collect();
    // Runs `tasks`, checks exactly-once; with `rendezvous`, task 0 waits
    // (at most 10 ms) for a task on the worker.
    let run = |tasks: &[usize], rendezvous: bool| {
        let hits: Vec<AtomicUsize> = tasks.iter().map(|_| AtomicUsize::new(0)).collect();
        let on_worker = AtomicBool::new(false);
        team.parallel_chunks(tasks, |&i| {
            if std::thread::current().id() != me {
                on_worker.store(true, Ordering::Release);
            } else if i == 0 && rendezvous {
                let t0 = std::time::Instant::now();
                while !on_worker.load(Ordering::Acquire)
                    && t0.elapsed() < std::time::Duration::from_millis(10)
                {
                    std::thread::yield_now();
                }
            }
            hits[i].fetch_add(1, Ordering::Relaxed);
        });
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
    };
    for _ in 0..adapt::LATE_STREAK {
        assert!(!engaged(&team));
        run(&small, false);
    }
    assert!(engaged(&team));
    let (times, alone0) = team.adaptive_stats().unwrap();
    assert_eq!((times, alone0), (1, 0));
    // Within a window (the first is 1 ms; each failed probe doubles it
    // while the worker is held), a small job runs alone: nothing is
    // published, and its tasks run inside a parallel region.
    wait_until("a small job ran alone", || {
        let g = generation();
        let before = team.adaptive_stats().unwrap().1;
        let region = AtomicUsize::new(0);
        team.parallel_chunks(&small, |_| {
            if in_parallel_region() && current_participant() == Some(0) {
                region.fetch_add(1, Ordering::Relaxed);
            }
        });
        let alone = team.adaptive_stats().unwrap().1 > before;
        if alone {
            assert_eq!(generation(), g, "a job run alone publishes nothing");
            assert_eq!(region.load(Ordering::Relaxed), 2);
        }
        alone
    });
    // A large job is published even in the mode.
    let g = generation();
    run(&large, false);
    assert_ne!(generation(), g, "a large job is published");
    // With the worker held, probes fail and the mode stays engaged.
    std::thread::sleep(2 * adapt::ALONE_WINDOW_MAX);
    run(&small, false);
    assert!(engaged(&team));
    // The worker is back: a probe it enters ends the mode (large jobs are
    // always published, so they probe; the rendezvous gives a parked
    // worker time to wake).
    sh.hold.store(false, Ordering::Relaxed);
    wait_until("a probe ended the mode", || {
        run(&large, true);
        !engaged(&team)
    });
    // Switched off, the mode never engages.
    team.set_adaptive(false);
    sh.hold.store(true, Ordering::Relaxed);
    for _ in 0..3 * adapt::LATE_STREAK {
        run(&small, false);
    }
    assert!(!engaged(&team));
    sh.hold.store(false, Ordering::Relaxed);
}

/// One deterministic float computation: chunk `i` of a `parallel_for`
/// sums its range in a fixed order, with a nested `parallel_for` inside
/// (which runs inline, as one chunk, in every mode); task `panic_at`
/// panics. Returns the per-chunk bits (`None` for the panicked one).
fn chunk_sums(team: &Team, n: usize, panic_at: Option<usize>) -> Vec<Option<u32>> {
    let chunks = crate::chunk_ranges(0, n, 1, team.participants());
    let out: Vec<std::sync::Mutex<Option<u32>>> = (0..chunks.len())
        .map(|_| std::sync::Mutex::new(None))
        .collect();
    let size = chunks.chunk_size();
    let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
        team.parallel_for(0, n, 1, |r| {
            let c = r.start / size;
            if Some(c) == panic_at {
                panic!("task {c}");
            }
            let mut acc = 0.1f32;
            for i in r.clone() {
                acc = acc * 1.000_1 + (i as f32).sqrt() / 3.0;
            }
            // Nested: one chunk inline when this task runs inside a
            // region; combined in chunk order either way.
            let nested: Vec<std::sync::Mutex<f32>> =
                (0..100).map(|_| std::sync::Mutex::new(0.0)).collect();
            team.parallel_for(0, 100, 1, |q| {
                let mut s = 0f32;
                let first = q.start;
                for j in q {
                    s = s * 0.999 + j as f32 / 7.0;
                }
                *nested[first].lock().unwrap() = s;
            });
            for m in nested {
                acc += m.into_inner().unwrap();
            }
            *out[c].lock().unwrap() = Some(acc.to_bits());
        });
    }));
    assert_eq!(r.is_err(), panic_at.is_some());
    out.into_iter().map(|m| m.into_inner().unwrap()).collect()
}

/// Bitwise-identical results in every mode: parallel, a late worker (the
/// caller steals its static task), the adaptive alone mode, a busy team
/// (another holder of `active`: the serial fallback), with a nested call
/// in every task, with and without a panicking task.
#[test]
fn every_mode_gives_bitwise_identical_results() {
    let team = Team::new(TeamOptions { max_workers: 1 }).unwrap();
    team.warm_up().unwrap();
    let sh = shared_of(&team);
    for (n, panic_at) in [
        (2usize, None),
        (2, Some(1)),
        (5, None),
        (300, Some(3)),
        (300, None),
    ] {
        team.set_adaptive(false);
        let parallel = chunk_sums(&team, n, panic_at);
        assert!(
            parallel
                .iter()
                .enumerate()
                .all(|(c, v)| v.is_some() != (Some(c) == panic_at))
        );
        // Late worker: held before entering every job.
        sh.hold.store(true, Ordering::Relaxed);
        assert_eq!(chunk_sums(&team, n, panic_at), parallel, "late, n={n}");
        // Adaptive alone mode (engaged by the held worker).
        team.set_adaptive(true);
        for _ in 0..adapt::LATE_STREAK {
            team.parallel_chunks(&[0u8, 1], |_| {});
        }
        assert!(engaged(&team));
        assert_eq!(chunk_sums(&team, n, panic_at), parallel, "alone, n={n}");
        sh.hold.store(false, Ordering::Relaxed);
        // Busy: the serial fallback, the team held by "another thread".
        let token = team.acquire().expect("free");
        assert_eq!(chunk_sums(&team, n, panic_at), parallel, "busy, n={n}");
        drop(token);
        // And parallel again.
        team.set_adaptive(false);
        assert_eq!(chunk_sums(&team, n, panic_at), parallel, "again, n={n}");
    }
}

#[test]
fn a_spawn_failure_falls_back_to_serial_and_is_retried() {
    let team = Team::new(TeamOptions { max_workers: 1 }).unwrap();
    dispatch::FAIL_SPAWN_AT.with(|f| f.set(1));
    let err = team.warm_up().unwrap_err();
    assert!(
        matches!(&err, ThreadError::Spawn { what, .. } if what == "team worker 1"),
        "{err}"
    );
    assert!(!team.is_started());
    // The call still runs every task, serially on the caller.
    let me = std::thread::current().id();
    let order = std::sync::Mutex::new(Vec::new());
    team.parallel_chunks(&[0, 1, 2, 3], |&i| {
        assert_eq!(std::thread::current().id(), me);
        order.lock().unwrap().push(i);
    });
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3]);
    assert!(!team.parallel_chained(&mut [0u8; 3], 1, |_, _| {}));
    // The next call retries and succeeds.
    dispatch::FAIL_SPAWN_AT.with(|f| f.set(0));
    let hits: Vec<AtomicUsize> = (0..4).map(|_| AtomicUsize::new(0)).collect();
    team.parallel_chunks(&[0, 1, 2, 3], |&i| {
        hits[i].fetch_add(1, Ordering::Relaxed);
    });
    assert!(team.is_started());
    assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
}
