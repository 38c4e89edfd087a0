//! A panicking task never stops the other tasks of its call, in any mode: the
//! serial fallbacks (no workers, nested call, busy team), a single task run
//! inline, and a real parallel dispatch. Every task runs, then the first panic
//! is resumed on the caller.

#[path = "support/busy.rs"]
mod busy;

use fucina_thread::{Team, TeamOptions};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;

fn team(workers: usize) -> Team {
    Team::new(TeamOptions {
        max_workers: workers,
    })
    .expect("a valid team")
}

/// Calls `call(&ran)`, in which every task increments `ran` once and task 0
/// panics with "task 0 failed", and checks that all `tasks` tasks ran and the
/// panic reached the caller.
fn check_every_task_runs(mode: &str, tasks: usize, call: impl FnOnce(&AtomicUsize)) {
    let ran = AtomicUsize::new(0);
    let r = catch_unwind(AssertUnwindSafe(|| call(&ran)));
    let payload = r.expect_err("the panic of task 0 must reach the caller");
    let msg = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("<non-string payload>");
    assert_eq!(msg, "task 0 failed", "{mode}: the first panic is resumed");
    assert_eq!(
        ran.load(Ordering::Relaxed),
        tasks,
        "{mode}: every task runs despite the panic of task 0"
    );
}

/// Every entry point, with `n` tasks (chunks) each counting itself in `ran`
/// and task 0 panicking.
fn every_entry_point(team: &Team, mode: &str, n: usize) {
    let tasks: Vec<usize> = (0..n).collect();
    check_every_task_runs(&format!("{mode}, parallel_chunks"), n, |ran| {
        team.parallel_chunks(&tasks, |&i| {
            ran.fetch_add(1, Ordering::Relaxed);
            if i == 0 {
                panic!("task 0 failed");
            }
        })
    });
    let mut items: Vec<usize> = (0..n).collect();
    check_every_task_runs(&format!("{mode}, parallel_chunks_mut"), n, |ran| {
        team.parallel_chunks_mut(&mut items, |i| {
            ran.fetch_add(1, Ordering::Relaxed);
            if *i == 0 {
                panic!("task 0 failed");
            }
        })
    });
    // `parallel_for` with a grain of 1 over `n` elements: `n` chunks on 2
    // participants as long as `n <= 8`, and a single chunk inside a region.
    let chunks = if fucina_thread::in_parallel_region() {
        1
    } else {
        fucina_thread::chunk_ranges(0, n, 1, team.participants()).len()
    };
    check_every_task_runs(&format!("{mode}, parallel_for"), chunks, |ran| {
        team.parallel_for(0, n, 1, |r| {
            ran.fetch_add(1, Ordering::Relaxed);
            if r.start == 0 {
                panic!("task 0 failed");
            }
        })
    });
    let mut out = vec![0u8; n];
    check_every_task_runs(&format!("{mode}, parallel_for_slices"), chunks, |ran| {
        team.parallel_for_slices(&mut out, 1, |r, _| {
            ran.fetch_add(1, Ordering::Relaxed);
            if r.start == 0 {
                panic!("task 0 failed");
            }
        })
    });
}

#[test]
fn no_workers_every_task_runs_then_the_panic_is_resumed() {
    let team = team(0);
    every_entry_point(&team, "no workers", 8);
    assert!(!team.is_started());
}

#[test]
fn one_task_inline_runs_then_the_panic_is_resumed() {
    let team = team(1);
    every_entry_point(&team, "one task", 1);
    assert!(!team.is_started(), "one task never starts the team");
}

#[test]
fn parallel_every_task_runs_then_the_panic_is_resumed() {
    let team = team(1);
    team.warm_up().unwrap();
    for n in [2, 3, 8, 40] {
        every_entry_point(&team, "parallel", n);
    }
}

#[test]
fn nested_every_task_runs_then_the_panic_is_resumed() {
    let outer = team(1);
    let inner = team(1);
    outer.warm_up().unwrap();
    let checked = AtomicUsize::new(0);
    outer.parallel_chunks(&[0, 1], |_| {
        assert!(fucina_thread::in_parallel_region());
        // A nested call on the dispatching team and on another team: both
        // run serially on this participant.
        every_entry_point(&outer, "nested, same team", 8);
        every_entry_point(&inner, "nested, other team", 8);
        checked.fetch_add(1, Ordering::Relaxed);
    });
    assert_eq!(checked.load(Ordering::Relaxed), 2);
}

#[test]
fn busy_team_every_task_runs_then_the_panic_is_resumed() {
    let team = team(1);
    busy::while_team_busy(&team, || {
        assert!(!fucina_thread::in_parallel_region());
        let me = thread::current().id();
        // Prove the calls below take the busy fallback: on the caller.
        team.parallel_chunks(&[0, 1, 2], |_| assert_eq!(thread::current().id(), me));
        every_entry_point(&team, "busy team", 8);
    });
}
