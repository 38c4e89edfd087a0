//! `Team::parallel_chained`: dependency graphs, return values, panics and the
//! contract checks.

use fucina_thread::{Chain, Team, TeamOptions};
use std::sync::atomic::{AtomicUsize, Ordering};

fn team(workers: usize) -> Team {
    Team::new(TeamOptions {
        max_workers: workers,
    })
    .expect("a valid team")
}

#[path = "support/rng.rs"]
mod test_rng;
use test_rng::rng;
#[path = "support/panicky.rs"]
mod panicky;
use panicky::{PanickyPayload, within};

#[test]
fn a_linear_chain_runs_in_order() {
    let team = team(1);
    let step = AtomicUsize::new(0);
    let mut order = vec![usize::MAX; 100];
    let ran = team.parallel_chained(&mut order, 1, |slot, chain| {
        *slot = step.fetch_add(1, Ordering::Relaxed);
        let k = *slot;
        if k + 1 < chain.len() {
            chain.enqueue(k + 1);
        }
    });
    if team.participants() > 1 {
        assert!(ran);
        assert_eq!(order, (0..100).collect::<Vec<_>>());
    } else {
        assert!(!ran);
    }
}

/// A node of a random DAG: its predecessors must all finish before it runs.
struct Node {
    id: usize,
    succs: Vec<usize>,
    done: bool,
}

#[test]
#[allow(clippy::needless_range_loop)] // `j` is both an index and a node id
fn random_dags_respect_dependencies_and_run_each_task_once() {
    let team = team(3);
    let mut next = rng(7);
    for round in 0..300 {
        let n = 1 + (next() % 60) as usize;
        // Edges only go from lower to higher ids; roots are a prefix 0..seeds.
        let seeds = 1 + (next() % (n as u64).min(4)) as usize;
        let mut preds = vec![0usize; n];
        let mut nodes: Vec<Node> = (0..n)
            .map(|id| Node {
                id,
                succs: Vec::new(),
                done: false,
            })
            .collect();
        for j in seeds..n {
            // Every non-seed node gets 1..=3 predecessors among lower ids.
            let k = 1 + (next() % 3) as usize;
            let mut ps: Vec<usize> = (0..k).map(|_| (next() % j as u64) as usize).collect();
            ps.sort_unstable();
            ps.dedup();
            for p in ps {
                nodes[p].succs.push(j);
                preds[j] += 1;
            }
        }
        let remaining: Vec<AtomicUsize> = preds.iter().map(|&p| AtomicUsize::new(p)).collect();
        let finished: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
        let pred_lists: Vec<Vec<usize>> = {
            let mut v = vec![Vec::new(); n];
            for node in &nodes {
                for &s in &node.succs {
                    v[s].push(node.id);
                }
            }
            v
        };
        let ran = team.parallel_chained(&mut nodes, seeds, |node: &mut Node, chain: &Chain| {
            for &p in &pred_lists[node.id] {
                assert_eq!(
                    finished[p].load(Ordering::Acquire),
                    1,
                    "round {round}: {} ran before {p}",
                    node.id
                );
            }
            assert!(!node.done);
            node.done = true;
            finished[node.id].fetch_add(1, Ordering::Release);
            for &s in &node.succs {
                if remaining[s].fetch_sub(1, Ordering::AcqRel) == 1 {
                    chain.enqueue(s);
                }
            }
        });
        assert!(ran, "round {round}");
        assert!(nodes.iter().all(|n| n.done));
        assert!(finished.iter().all(|f| f.load(Ordering::Relaxed) == 1));
    }
}

#[test]
fn return_values_of_the_degenerate_cases() {
    let team = team(1);
    let calls = AtomicUsize::new(0);
    let run = |_: &mut u8, _: &Chain| {
        calls.fetch_add(1, Ordering::Relaxed);
    };
    assert!(
        team.parallel_chained(&mut [] as &mut [u8], 0, run),
        "empty list is done"
    );
    assert!(!team.parallel_chained(&mut [0u8; 3], 0, run), "no seeds");
    assert!(
        !team.parallel_chained(&mut [0u8; 3], 4, run),
        "more seeds than tasks"
    );
    assert!(
        !Team::new(TeamOptions { max_workers: 0 })
            .unwrap()
            .parallel_chained(&mut [0u8; 3], 3, run)
    );
    assert_eq!(calls.load(Ordering::Relaxed), 0);
    // Nested inside a parallel task: unavailable.
    team.parallel_chunks(&[0, 1], |_| {
        assert!(!team.parallel_chained(&mut [0u8; 2], 2, |_, _| {}));
    });
    assert!(team.parallel_chained(&mut [0u8; 3], 3, run));
    assert_eq!(calls.load(Ordering::Relaxed), 3);
}

#[test]
fn the_arrays_grow_and_shrink_back_in_use() {
    let team = team(1);
    for n in [5usize, 500, 3, 2000, 1] {
        let mut v = vec![0u32; n];
        assert!(team.parallel_chained(&mut v, n, |x, _| *x += 1));
        assert!(v.iter().all(|&x| x == 1), "n = {n}");
    }
}

#[test]
fn a_panicking_chained_task_is_resumed_and_the_team_keeps_working() {
    let team = team(1);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut v = vec![0usize; 10];
        team.parallel_chained(&mut v, 1, |_, chain| {
            static K: AtomicUsize = AtomicUsize::new(0);
            let k = K.fetch_add(1, Ordering::Relaxed);
            if k == 4 {
                panic!("boom at step {k}");
            }
            chain.enqueue(k + 1);
        });
    }));
    let p = r.expect_err("the panic reaches the caller");
    assert!(
        p.downcast_ref::<String>()
            .unwrap()
            .contains("boom at step 4")
    );
    let mut v = vec![0u8; 8];
    assert!(team.parallel_chained(&mut v, 8, |x, _| *x = 1));
    assert_eq!(v, [1; 8]);
    team.parallel_chunks(&[1, 2, 3], |_| {});
}

#[test]
#[should_panic(expected = "out of range")]
fn enqueue_out_of_range_panics() {
    let team = team(1);
    team.parallel_chained(&mut [0u8; 2], 2, |_, chain| chain.enqueue(2));
    // Without workers the call returns false and nothing runs.
    if team.participants() == 1 {
        panic!("out of range (no workers to run the graph)");
    }
}

/// A double enqueue is caught in every build: "enqueued twice" in debug
/// builds, "handed out twice" (the claimed flag) in release builds.
#[test]
#[should_panic(expected = "twice")]
fn a_double_enqueue_panics() {
    let team = team(1);
    if team.participants() == 1 {
        panic!("twice (no workers to run the graph)");
    }
    let mut v = vec![0u8; 3];
    team.parallel_chained(&mut v, 1, |x, chain| {
        if *x == 0 {
            *x = 1;
            // Task 1 becomes runnable twice.
            chain.enqueue(1);
            chain.enqueue(1);
        }
    });
}

#[cfg(debug_assertions)]
#[test]
#[should_panic(expected = "enqueued twice")]
fn enqueuing_a_seed_panics_in_debug_builds() {
    let team = team(1);
    if team.participants() == 1 {
        panic!("enqueued twice (no workers)");
    }
    team.parallel_chained(&mut [0u8; 2], 2, |_, chain| chain.enqueue(0));
}

#[cfg(debug_assertions)]
#[test]
#[should_panic(expected = "stalled")]
fn an_under_enqueue_panics_instead_of_hanging_in_debug_builds() {
    let team = team(1);
    if team.participants() == 1 {
        panic!("stalled (no workers)");
    }
    // Task 2 is never enqueued.
    team.parallel_chained(&mut [0u8; 3], 1, |_, chain| {
        static ONCE: AtomicUsize = AtomicUsize::new(0);
        if ONCE.fetch_add(1, Ordering::Relaxed) == 0 {
            chain.enqueue(1);
        }
    });
}

/// Concurrent chained tasks that all panic: the losing payloads are dropped by
/// the team, and a panicking `Drop` must not unwind out of a participant's
/// share (the dispatcher would return before the workers left the job).
#[test]
fn a_panic_payload_that_panics_on_drop_does_not_break_the_join() {
    let ok = within(20, || {
        let team = team(2);
        team.warm_up().unwrap();
        for _ in 0..5 {
            let mut v = vec![0u8; 16];
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                team.parallel_chained(&mut v, 16, |_, _| {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                    std::panic::panic_any(PanickyPayload { armed: true });
                })
            }));
            if let Err(mut p) = r {
                let first = p
                    .downcast_mut::<PanickyPayload>()
                    .expect("the first task payload is resumed, not the drop panic");
                first.armed = false;
            }
        }
        let mut v = vec![0u8; 8];
        let ran = team.parallel_chained(&mut v, 8, |x, _| *x = 1);
        !ran || v == [1; 8]
    });
    assert!(ok);
}
