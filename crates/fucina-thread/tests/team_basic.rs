//! Behaviour of `Team::parallel_chunks` / `parallel_for`: exactly-once, the
//! serial fallbacks, nesting, panics, concurrent callers.

use fucina_thread::{Team, TeamOptions, ThreadError, in_parallel_region};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

#[path = "support/busy.rs"]
mod busy;
#[path = "support/panicky.rs"]
mod panicky;
use panicky::{PanickyPayload, within};

static_assertions::assert_impl_all!(Team: Send, Sync);
static_assertions::assert_impl_all!(TeamOptions: Send, Sync, Copy, Default);

fn team(workers: usize) -> Team {
    Team::new(TeamOptions {
        max_workers: workers,
    })
    .expect("a valid team")
}

fn counts(n: usize) -> Vec<AtomicUsize> {
    (0..n).map(|_| AtomicUsize::new(0)).collect()
}

#[test]
fn every_task_runs_exactly_once_for_many_counts() {
    let team = team(3);
    for n in 0..200 {
        let hits = counts(n);
        let tasks: Vec<usize> = (0..n).collect();
        team.parallel_chunks(&tasks, |&i| {
            hits[i].fetch_add(1, Ordering::Relaxed);
        });
        assert!(
            hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
            "n = {n}"
        );
    }
}

#[test]
fn workers_start_lazily_on_the_first_parallel_dispatch() {
    let team = team(1);
    assert!(!team.is_started());
    team.parallel_chunks(&[1u8], |_| {});
    assert!(!team.is_started(), "a single task must not start the team");
    team.parallel_chunks::<u8, _>(&[], |_| {});
    assert!(!team.is_started());
    team.parallel_chunks(&[1u8, 2], |_| {});
    assert!(team.is_started());
    assert_eq!(team.participants(), 2);
}

#[test]
fn participants_follow_the_sizing_rule() {
    let cpus = fucina_thread::cpu_thread_count(usize::MAX);
    for max_workers in [0usize, 1, 2, 5] {
        let t = team(max_workers);
        let expected = max_workers.min(cpus.saturating_sub(1).max(1)) + 1;
        assert_eq!(t.participants(), expected, "max_workers = {max_workers}");
        t.warm_up().unwrap();
        assert_eq!(
            t.participants(),
            expected,
            "after start, max_workers = {max_workers}"
        );
    }
}

#[test]
fn default_options_use_schedulable_cores_minus_one() {
    let expected = fucina_thread::cpu_thread_count(fucina_thread::MAX_THREADS) - 1;
    assert_eq!(TeamOptions::default().max_workers, expected);
}

#[test]
fn too_many_workers_is_an_error() {
    let err = Team::new(TeamOptions {
        max_workers: fucina_thread::MAX_THREADS,
    })
    .unwrap_err();
    assert!(matches!(
        err,
        ThreadError::TooManyWorkers {
            requested: 64,
            max: 63
        }
    ));
    assert!(err.to_string().contains("64"), "{err}");
    assert!(
        Team::new(TeamOptions {
            max_workers: fucina_thread::MAX_THREADS - 1
        })
        .is_ok()
    );
}

#[test]
fn no_workers_runs_serially_on_the_caller_in_index_order() {
    let team = team(0);
    assert_eq!(team.participants(), 1);
    let me = thread::current().id();
    let order = Mutex::new(Vec::new());
    let tasks: Vec<usize> = (0..50).collect();
    team.parallel_chunks(&tasks, |&i| {
        assert_eq!(thread::current().id(), me);
        order.lock().unwrap().push(i);
    });
    assert_eq!(*order.lock().unwrap(), tasks);
    assert!(!team.is_started());
}

#[test]
fn tasks_may_borrow_and_mutate_through_the_callers_stack() {
    let team = team(1);
    let mut out = vec![0u32; 64];
    {
        let cells: Vec<Mutex<&mut u32>> = out.iter_mut().map(Mutex::new).collect();
        let idx: Vec<usize> = (0..64).collect();
        team.parallel_chunks(&idx, |&i| **cells[i].lock().unwrap() = i as u32 * 3);
    }
    assert!(out.iter().enumerate().all(|(i, &v)| v == i as u32 * 3));
}

#[test]
fn the_caller_is_in_a_region_only_while_participating() {
    let team = team(1);
    assert!(!in_parallel_region());
    let seen = counts(2);
    team.parallel_chunks(&[0usize, 1], |&i| {
        assert!(in_parallel_region());
        seen[i].fetch_add(1, Ordering::Relaxed);
    });
    assert!(!in_parallel_region());
    assert!(seen.iter().all(|s| s.load(Ordering::Relaxed) == 1));
}

#[test]
fn nested_parallel_kernels_run_inline() {
    let team = team(2);
    let outer: Vec<usize> = (0..8).collect();
    let total = AtomicUsize::new(0);
    team.parallel_chunks(&outer, |&o| {
        let me = thread::current().id();
        // An inner parallel kernel from inside a task: one chunk, inline.
        team.parallel_for(0, 1000, 1, |r| {
            assert_eq!(thread::current().id(), me);
            assert_eq!(r, 0..1000, "a nested parallel_for is a single chunk");
            total.fetch_add(r.len(), Ordering::Relaxed);
        });
        let inner: Vec<usize> = (0..16).collect();
        team.parallel_chunks(&inner, |_| {
            assert_eq!(thread::current().id(), me);
            total.fetch_add(o + 1, Ordering::Relaxed);
        });
    });
    let expected = 8 * 1000 + 16 * (1..=8).sum::<usize>();
    assert_eq!(total.load(Ordering::Relaxed), expected);
}

#[test]
fn a_nested_call_on_another_team_also_runs_inline() {
    let a = team(1);
    let b = team(1);
    a.parallel_chunks(&[0, 1, 2, 3], |_| {
        let me = thread::current().id();
        b.parallel_chunks(&[0, 1, 2], |_| assert_eq!(thread::current().id(), me));
    });
    assert!(!b.is_started());
}

#[test]
fn a_panicking_task_is_resumed_on_the_caller_and_the_team_keeps_working() {
    let team = team(2);
    for round in 0..20 {
        let ran = counts(40);
        let tasks: Vec<usize> = (0..40).collect();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            team.parallel_chunks(&tasks, |&i| {
                ran[i].fetch_add(1, Ordering::Relaxed);
                if i % 13 == 5 {
                    panic!("task {i} failed in round {round}");
                }
            });
        }));
        let msg = r.expect_err("the panic must reach the caller");
        let msg = msg
            .downcast_ref::<String>()
            .expect("a formatted panic message");
        assert!(msg.contains("failed in round"), "{msg}");
        // Every task still ran exactly once (the others are not abandoned).
        assert!(ran.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        // The team is usable afterwards.
        let ok = counts(40);
        team.parallel_chunks(&tasks, |&i| {
            ok[i].fetch_add(1, Ordering::Relaxed);
        });
        assert!(ok.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        assert!(!in_parallel_region());
    }
}

#[test]
fn a_second_thread_runs_serially_while_the_team_is_busy() {
    let team = team(1);
    busy::while_team_busy(&team, || {
        let me = thread::current().id();
        let tasks: Vec<usize> = (0..32).collect();
        let order = Mutex::new(Vec::new());
        team.parallel_chunks(&tasks, |&i| {
            assert_eq!(
                thread::current().id(),
                me,
                "busy team: tasks run on the caller"
            );
            order.lock().unwrap().push(i);
        });
        assert_eq!(
            *order.lock().unwrap(),
            tasks,
            "serial fallback runs in index order"
        );
        // parallel_for: same chunk boundaries as on an idle team, run in order.
        let chunks = Mutex::new(Vec::new());
        team.parallel_for(0, 1000, 10, |r| {
            assert_eq!(thread::current().id(), me);
            chunks.lock().unwrap().push(r);
        });
        let expected: Vec<_> =
            fucina_thread::chunk_ranges(0, 1000, 10, team.participants()).collect();
        assert_eq!(*chunks.lock().unwrap(), expected);
        // parallel_chained reports "busy" instead of running.
        assert!(!team.parallel_chained(&mut [0u8, 1], 1, |_, _| {}));
    });
}

#[test]
fn parallel_for_covers_the_range_with_the_deterministic_chunks() {
    let team = team(3);
    let p = team.participants();
    for (begin, end, grain) in [
        (0usize, 1000usize, 10usize),
        (0, 100, 1),
        (5, 5, 1),
        (7, 3, 1),
        (3, 4, 1),
        (0, 77, 0),
        (10, 100_000, 64),
    ] {
        let seen = Mutex::new(Vec::new());
        team.parallel_for(begin, end, grain, |r| seen.lock().unwrap().push(r));
        let mut seen = seen.into_inner().unwrap();
        seen.sort_by_key(|r| r.start);
        let expected: Vec<_> = fucina_thread::chunk_ranges(begin, end, grain, p).collect();
        assert_eq!(seen, expected, "({begin}, {end}, {grain}) on {p}");
    }
}

#[test]
fn teams_are_usable_from_many_threads_in_turn() {
    let team = team(1);
    let barrier = Barrier::new(3);
    let total = AtomicUsize::new(0);
    thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                barrier.wait();
                for _ in 0..300 {
                    let tasks = [1usize; 10];
                    team.parallel_chunks(&tasks, |&v| {
                        total.fetch_add(v, Ordering::Relaxed);
                    });
                }
            });
        }
    });
    assert_eq!(total.load(Ordering::Relaxed), 3 * 300 * 10);
}

/// Event-driven, no timing assumption: the worker's task ends only after the
/// caller has taken `1 + WAITS` timed waits in the join (the counter is
/// readable during the dispatch), however long the spin window lasts on a
/// loaded machine. The `WAITS` waits it observed from start to end each slept
/// the full timeout (nothing changes `done` while the task runs), so they took
/// at least `WAITS - 1` timeouts even with coarse timers: a timed wait that
/// returned at once would fail that.
#[test]
fn a_long_worker_task_engages_the_join_fallback() {
    const WAITS: u64 = 3;
    const SAFETY: Duration = Duration::from_secs(120);
    let team = team(1);
    team.warm_up().unwrap();
    let before = team.join_timed_waits();
    let caller = thread::current().id();
    let worker_started = AtomicBool::new(false);
    let observed = Mutex::new(None);
    let t0 = Instant::now();
    let wait_for = |what: &str, cond: &dyn Fn() -> bool| {
        while !cond() {
            assert!(t0.elapsed() < SAFETY, "timed out waiting: {what}");
            thread::yield_now();
        }
    };
    team.parallel_chunks(&[0u8, 1], |_| {
        if thread::current().id() == caller {
            // Hold the caller's task until the worker has the other one, so the
            // worker (not the caller) runs the slow task: the caller cannot
            // close the job and take task 1 itself first.
            wait_for("the worker entered", &|| {
                worker_started.load(Ordering::Acquire)
            });
        } else {
            worker_started.store(true, Ordering::Release);
            wait_for("a first timed wait", &|| team.join_timed_waits() > before);
            let first = (Instant::now(), team.join_timed_waits());
            wait_for("more timed waits", &|| {
                team.join_timed_waits() > first.1 + WAITS
            });
            *observed.lock().unwrap() = Some(first.0.elapsed());
        }
    });
    let waits = team.join_timed_waits() - before;
    assert!(waits > WAITS, "{waits} timed waits");
    let took = observed
        .into_inner()
        .unwrap()
        .expect("the worker ran task 1");
    assert!(
        took >= Duration::from_millis(WAITS - 1),
        "{WAITS} timed waits took {took:?}: a timed wait did not sleep"
    );
}

/// The second and later task panics of a dispatch are dropped by the team; a
/// payload whose `Drop` panics must neither unwind out of a participant's share
/// (the dispatcher would return before the workers left the job: the tasks and
/// the closure on its stack would be freed under them) nor kill a worker (the
/// join would wait forever).
#[test]
fn a_panic_payload_that_panics_on_drop_does_not_break_the_join() {
    within(20, || {
        let team = team(2);
        team.warm_up().unwrap();
        for _ in 0..5 {
            let ran = counts(64);
            let tasks: Vec<usize> = (0..64).collect();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                team.parallel_chunks(&tasks, |&i| {
                    thread::sleep(Duration::from_micros(200));
                    ran[i].fetch_add(1, Ordering::Relaxed);
                    std::panic::panic_any(PanickyPayload { armed: true });
                });
            }));
            let mut p = r.expect_err("the task panic reaches the caller");
            let first = p
                .downcast_mut::<PanickyPayload>()
                .expect("the first task payload is resumed, not the drop panic");
            first.armed = false;
            drop(p);
            assert!(ran.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
        // The team still works.
        let ok = counts(8);
        team.parallel_chunks(&ok, |h| {
            h.fetch_add(1, Ordering::Relaxed);
        });
        assert!(ok.iter().all(|h| h.load(Ordering::Relaxed) == 1));
    });
}
