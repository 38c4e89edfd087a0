//! Stress: many dispatches with random task counts and occasional sleeps, and
//! concurrent dispatchers on one team. Constants shrink under Miri.

use fucina_thread::{Team, TeamOptions};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

const DISPATCHES: usize = if cfg!(miri) { 200 } else { 100_000 };

#[path = "support/rng.rs"]
mod test_rng;
use test_rng::rng;

#[test]
fn random_dispatches_run_every_task_exactly_once() {
    let team = Team::new(TeamOptions { max_workers: 3 }).unwrap();
    let counters: Vec<AtomicU32> = (0..64).map(|_| AtomicU32::new(0)).collect();
    let mut next = rng(42);
    let mut expected = [0u32; 64];
    let tasks: Vec<(usize, u64)> = (0..64).map(|i| (i, 0)).collect();
    let mut buf = tasks.clone();
    for d in 0..DISPATCHES {
        let n = (next() % 64) as usize;
        for (i, t) in buf[..n].iter_mut().enumerate() {
            // About one task in 20,000 sleeps 20-200 us.
            let r = next();
            t.0 = i;
            t.1 = if r.is_multiple_of(20_000) {
                20 + r % 180
            } else {
                0
            };
            expected[i] += 1;
        }
        team.parallel_chunks(&buf[..n], |&(i, sleep_us)| {
            if sleep_us > 0 {
                thread::sleep(Duration::from_micros(sleep_us));
            }
            counters[i].fetch_add(1, Ordering::Relaxed);
        });
        if d % 10_000 == 0 {
            for (c, e) in counters.iter().zip(&expected) {
                assert_eq!(c.load(Ordering::Relaxed), *e, "after dispatch {d}");
            }
        }
    }
    for (c, e) in counters.iter().zip(&expected) {
        assert_eq!(c.load(Ordering::Relaxed), *e);
    }
}

#[test]
fn two_threads_dispatching_at_once_on_one_team() {
    let team = Team::new(TeamOptions { max_workers: 1 }).unwrap();
    let rounds = if cfg!(miri) { 20 } else { 5_000 };
    let total = AtomicUsize::new(0);
    let serial_calls = AtomicUsize::new(0);
    thread::scope(|s| {
        for t in 0..2 {
            let team = &team;
            let total = &total;
            let serial_calls = &serial_calls;
            s.spawn(move || {
                let me = thread::current().id();
                let tasks: Vec<usize> = (0..16).map(|i| i + t).collect();
                for _ in 0..rounds {
                    let on_me = AtomicUsize::new(0);
                    team.parallel_chunks(&tasks, |&v| {
                        if thread::current().id() == me {
                            on_me.fetch_add(1, Ordering::Relaxed);
                        }
                        total.fetch_add(v, Ordering::Relaxed);
                    });
                    if on_me.load(Ordering::Relaxed) == tasks.len() {
                        serial_calls.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let per_round: usize = (0..16).sum::<usize>() * 2 + 16;
    assert_eq!(total.load(Ordering::Relaxed), per_round * rounds);
    // Some calls ran serially on their caller (busy team), which is the point.
    let _ = serial_calls.load(Ordering::Relaxed);
}
