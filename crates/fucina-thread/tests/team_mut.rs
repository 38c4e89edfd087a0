//! `parallel_chunks_mut`, `parallel_for_slices` and `current_participant`: each
//! item / chunk handed to exactly one task, the deterministic chunks, and the
//! participant index in every mode.

#[path = "support/busy.rs"]
mod busy;

use fucina_thread::{Team, TeamOptions, chunk_ranges, current_participant, in_parallel_region};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::thread;

fn team(workers: usize) -> Team {
    Team::new(TeamOptions {
        max_workers: workers,
    })
    .expect("a valid team")
}

#[test]
fn parallel_chunks_mut_hands_each_item_to_exactly_one_task() {
    for workers in [0, 1, 3] {
        let team = team(workers);
        for n in [0usize, 1, 2, 3, 5, 8, 9, 17, 64, 100, 1000] {
            for _ in 0..3 {
                // Each item counts how often it was handed out.
                let mut items: Vec<(usize, u32)> = (0..n).map(|i| (i, 0)).collect();
                team.parallel_chunks_mut(&mut items, |(i, hits)| {
                    *hits += 1;
                    *i *= 2;
                });
                for (k, &(i, hits)) in items.iter().enumerate() {
                    assert_eq!(hits, 1, "item {k} of {n}, {workers} workers");
                    assert_eq!(i, 2 * k);
                }
            }
        }
    }
}

#[test]
fn parallel_for_slices_hands_out_the_deterministic_chunks() {
    for workers in [0, 1, 3] {
        let team = team(workers);
        for (len, grain) in [
            (0usize, 1usize),
            (1, 1),
            (2, 1),
            (100, 1),
            (1000, 10),
            (4103, 2048),
            (10_000, 64),
            (7, 0),
        ] {
            let mut out = vec![0u32; len];
            let seen = Mutex::new(Vec::new());
            team.parallel_for_slices(&mut out, grain, |r: Range<usize>, s: &mut [u32]| {
                assert_eq!(r.len(), s.len(), "the slice is the chunk");
                for (k, x) in s.iter_mut().enumerate() {
                    *x += (r.start + k) as u32 + 1;
                }
                seen.lock().unwrap().push(r);
            });
            // Every element written exactly once, by the chunk that covers it.
            for (i, &x) in out.iter().enumerate() {
                assert_eq!(x, i as u32 + 1, "element {i} of {len}");
            }
            let mut seen = seen.into_inner().unwrap();
            seen.sort_by_key(|r| r.start);
            let expected: Vec<_> = chunk_ranges(0, len, grain, team.participants()).collect();
            assert_eq!(
                seen, expected,
                "len {len}, grain {grain}, {workers} workers"
            );
            // The same chunks as parallel_for over 0..len.
            let pf = Mutex::new(Vec::new());
            team.parallel_for(0, len, grain, |r| pf.lock().unwrap().push(r));
            let mut pf = pf.into_inner().unwrap();
            pf.sort_by_key(|r| r.start);
            assert_eq!(pf, expected);
        }
    }
}

#[test]
fn a_nested_parallel_for_slices_gets_one_chunk() {
    let team = team(1);
    let mut outer = vec![vec![0u8; 100]; 4];
    team.parallel_chunks_mut(&mut outer, |v| {
        let calls = Mutex::new(Vec::new());
        team.parallel_for_slices(v, 1, |r, s| {
            s.fill(1);
            calls.lock().unwrap().push(r);
        });
        let calls = calls.into_inner().unwrap();
        assert_eq!(calls.len(), 1, "one chunk inside a region");
        assert_eq!(calls[0], 0..100);
    });
    assert!(outer.iter().flatten().all(|&x| x == 1));
}

#[test]
fn participants_report_their_index_in_a_parallel_dispatch() {
    let team = team(3);
    team.warm_up().unwrap();
    let p = team.participants();
    assert_eq!(current_participant(), None, "outside any dispatch");
    let me = thread::current().id();
    for n in [2usize, 4, 64] {
        for _ in 0..20 {
            let seen = Mutex::new(HashMap::new());
            let tasks: Vec<usize> = (0..n).collect();
            team.parallel_chunks(&tasks, |_| {
                let idx = current_participant().expect("inside a parallel dispatch");
                assert!(idx < p, "index {idx} of {p} participants");
                if thread::current().id() == me {
                    assert_eq!(idx, 0, "the caller is participant 0");
                }
                let prev = seen.lock().unwrap().insert(idx, thread::current().id());
                if let Some(prev) = prev {
                    assert_eq!(prev, thread::current().id(), "one thread per index");
                }
            });
            // The inverse: one index per thread.
            let seen = seen.into_inner().unwrap();
            let mut threads: Vec<_> = seen.values().collect();
            threads.sort_by_key(|t| format!("{t:?}"));
            threads.dedup();
            assert_eq!(threads.len(), seen.len(), "one index per thread");
        }
    }
    // The other entry points report it too.
    team.parallel_for(0, 100, 1, |_| assert!(current_participant().unwrap() < p));
    team.parallel_chunks_mut(&mut [0u8; 9], |_| {
        assert!(current_participant().unwrap() < p)
    });
    team.parallel_for_slices(&mut [0u8; 9], 1, |_, _| {
        assert!(current_participant().unwrap() < p)
    });
    let ran = team.parallel_chained(&mut [0u8; 4], 4, |_, _| {
        assert!(current_participant().unwrap() < p)
    });
    assert!(ran);
    assert_eq!(current_participant(), None, "restored after the dispatch");
}

#[test]
fn serial_runs_report_no_participant() {
    // No workers.
    let solo = team(0);
    solo.parallel_chunks(&[0, 1, 2], |_| assert_eq!(current_participant(), None));
    solo.parallel_for_slices(&mut [0u8; 64], 1, |_, _| {
        assert_eq!(current_participant(), None)
    });
    // One task / one chunk inline.
    let team = team(1);
    team.parallel_chunks(&[0], |_| assert_eq!(current_participant(), None));
    team.parallel_for(0, 10, 100, |_| assert_eq!(current_participant(), None));
    // Nested: no index inside the nested call, the outer index after it.
    team.warm_up().unwrap();
    team.parallel_chunks(&[0, 1], |_| {
        let outer = current_participant().expect("outer dispatch");
        team.parallel_chunks(&[0, 1, 2], |_| {
            assert!(in_parallel_region());
            assert_eq!(current_participant(), None, "nested serial run");
        });
        team.parallel_chunks_mut(&mut [0, 1], |_| assert_eq!(current_participant(), None));
        team.parallel_for(0, 100, 1, |_| assert_eq!(current_participant(), None));
        assert_eq!(current_participant(), Some(outer), "restored");
        // Restored after a nested panic too.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            team.parallel_chunks(&[0, 1], |_| panic!("nested"))
        }));
        assert!(r.is_err());
        assert_eq!(current_participant(), Some(outer), "restored after a panic");
        assert!(in_parallel_region());
    });
    assert_eq!(current_participant(), None);
}

#[test]
fn a_busy_team_fallback_reports_no_participant() {
    let team = team(1);
    busy::while_team_busy(&team, || {
        let me = thread::current().id();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            team.parallel_chunks_mut(&mut [0u8, 1, 2], |_| {
                assert_eq!(thread::current().id(), me, "busy: serial on the caller");
                assert_eq!(current_participant(), None);
            });
        }));
        r.unwrap();
    });
}

/// A closure's state seen by its `Drop`: how many tasks ran through it, and
/// how many times it was dropped (statics: this is the only test using them).
static TALLY_HITS_AT_DROP: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static TALLY_DROPS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Closure state with interior mutability, `PAD` bytes of ballast (0: the
/// closure fits the job descriptor and is moved into it; 64: it does not and
/// is borrowed).
struct Tally<const PAD: usize> {
    hits: std::sync::atomic::AtomicUsize,
    _pad: [u8; PAD],
}

impl<const PAD: usize> Tally<PAD> {
    fn new() -> Self {
        Tally {
            hits: std::sync::atomic::AtomicUsize::new(0),
            _pad: [0; PAD],
        }
    }
    fn hit(&self) {
        self.hits.fetch_add(1, Ordering::Relaxed);
    }
}

impl<const PAD: usize> Drop for Tally<PAD> {
    fn drop(&mut self) {
        TALLY_HITS_AT_DROP.store(self.hits.load(Ordering::Relaxed), Ordering::Relaxed);
        TALLY_DROPS.fetch_add(1, Ordering::Relaxed);
    }
}

fn check_tally(what: &str, expected_hits: usize, call: impl FnOnce()) {
    TALLY_DROPS.store(0, Ordering::Relaxed);
    TALLY_HITS_AT_DROP.store(usize::MAX, Ordering::Relaxed);
    call();
    assert_eq!(
        TALLY_DROPS.load(Ordering::Relaxed),
        1,
        "{what}: dropped once"
    );
    assert_eq!(
        TALLY_HITS_AT_DROP.load(Ordering::Relaxed),
        expected_hits,
        "{what}: every task used the one closure (state is not copied)"
    );
}

fn closures_are_used_in_place_and_dropped_once<const PAD: usize>() {
    for workers in [0, 1, 3] {
        let team = team(workers);
        for n in [1usize, 2, 5, 64] {
            let what = |f: &str| format!("{f}, {n} tasks, {workers} workers, pad {PAD}");
            let tasks: Vec<usize> = (0..n).collect();
            let tally = Tally::<PAD>::new();
            check_tally(&what("parallel_chunks"), n, || {
                team.parallel_chunks(&tasks, move |_| tally.hit())
            });
            let tally = Tally::<PAD>::new();
            let mut items = tasks.clone();
            check_tally(&what("parallel_chunks_mut"), n, || {
                team.parallel_chunks_mut(&mut items, move |_| tally.hit())
            });
            let chunks = chunk_ranges(0, n, 1, team.participants()).len();
            let tally = Tally::<PAD>::new();
            check_tally(&what("parallel_for"), chunks, || {
                team.parallel_for(0, n, 1, move |_| tally.hit())
            });
            let tally = Tally::<PAD>::new();
            check_tally(&what("parallel_for_slices"), chunks, || {
                team.parallel_for_slices(&mut items, 1, move |_, _| tally.hit())
            });
        }
    }
}

#[test]
fn small_and_large_closures_are_used_in_place_and_dropped_once() {
    closures_are_used_in_place_and_dropped_once::<0>();
    closures_are_used_in_place_and_dropped_once::<64>();
}
