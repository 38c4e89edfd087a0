//! Dispatch overhead of the team versus rayon, measured in the same run.
//!
//! `cargo bench -p fucina-thread --bench dispatch -- --warm-up-time 1 --measurement-time 3`
//!
//! Groups:
//! - `dispatch_2p`: two participants, two trivial tasks: `parallel_chunks`
//!   with a zero-size closure and with a closure that captures a slice and
//!   reads its task's element (the shape of every real kernel) vs
//!   `rayon::join` vs `rayon::scope` with two spawns (2-thread rayon pool), and
//!   the floor: a two-thread ping-pong on one atomic (one cache-line round trip);
//! - `parallel_for_4096_f32`: one add per element over 4096 f32: serial,
//!   `parallel_for_slices`, rayon `par_chunks_mut`, with the same 2 chunks;
//! - `park_wake`: wake latency round trip of the two futex backends (a parked
//!   thread is woken and acknowledges through an atomic);
//! - `dispatch_parked`: `parallel_chunks` of 2 tasks when the worker parks at
//!   once (`FUCINA_SPIN_BUDGET=0`): the futex-wake path end to end.

use criterion::{Criterion, criterion_group, criterion_main};
use fucina_thread::{Team, TeamOptions};
use rayon::prelude::*;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

fn team() -> Team {
    let team = Team::new(TeamOptions { max_workers: 1 }).expect("team");
    team.warm_up().expect("spawn");
    team
}

fn rayon_pool() -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .expect("rayon pool")
}

/// A ponger thread that answers every `ping` value `v` with `v + 1`.
fn ping_pong(iters: u64) -> Duration {
    let word = Arc::new(AtomicU32::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (w, s) = (Arc::clone(&word), Arc::clone(&stop));
    let ponger = std::thread::spawn(move || {
        let mut expect = 1u32;
        while !s.load(Ordering::Relaxed) {
            if w.load(Ordering::Acquire) == expect {
                w.store(expect + 1, Ordering::Release);
                expect += 2;
            } else {
                std::hint::spin_loop();
            }
        }
    });
    let mut v = 0u32;
    let mut round_trips = |n: u64| {
        for _ in 0..n {
            v += 1;
            word.store(v, Ordering::Release);
            v += 1;
            while word.load(Ordering::Acquire) != v {
                std::hint::spin_loop();
            }
        }
    };
    // Let the ponger start spinning.
    round_trips(1000);
    let t0 = Instant::now();
    round_trips(iters);
    let el = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    ponger.join().unwrap();
    el
}

fn dispatch_2p(c: &mut Criterion) {
    let mut g = c.benchmark_group("dispatch_2p");
    let team = team();
    assert_eq!(
        team.participants(),
        2,
        "the comparison assumes 2 participants"
    );
    let tasks = [0u32, 1];
    g.bench_function("parallel_chunks_2_tasks", |b| {
        b.iter(|| {
            team.parallel_chunks(black_box(&tasks), |t| {
                black_box(t);
            })
        })
    });
    // What every real kernel does: the closure captures a slice (on the heap,
    // as kernel data is) and each task reads its own element.
    let data: Vec<u64> = (0..64).collect();
    let data = &data[..];
    g.bench_function("parallel_chunks_2_tasks_capturing", |b| {
        b.iter(|| {
            team.parallel_chunks(black_box(&tasks), |&t| {
                black_box(data[t as usize]);
            })
        })
    });
    let pool = rayon_pool();
    g.bench_function("rayon_join", |b| {
        pool.install(|| b.iter(|| rayon::join(|| black_box(0u32), || black_box(1u32))))
    });
    g.bench_function("rayon_scope_2_spawns", |b| {
        pool.install(|| {
            b.iter(|| {
                rayon::scope(|s| {
                    s.spawn(|_| {
                        black_box(0u32);
                    });
                    s.spawn(|_| {
                        black_box(1u32);
                    });
                })
            })
        })
    });
    g.bench_function("atomic_ping_pong_round_trip", |b| b.iter_custom(ping_pong));
    g.finish();
}

fn parallel_for_4096(c: &mut Criterion) {
    let mut g = c.benchmark_group("parallel_for_4096_f32");
    const N: usize = 4096;
    const GRAIN: usize = 2048; // 2 chunks on 2 participants
    let team = team();
    let pool = rayon_pool();
    let mut data = vec![1.0f32; N];
    g.bench_function("serial", |b| {
        b.iter(|| {
            for x in black_box(&mut data[..]).iter_mut() {
                *x += 1.0;
            }
        })
    });
    g.bench_function("team_parallel_for_slices", |b| {
        b.iter(|| {
            team.parallel_for_slices(black_box(&mut data[..]), GRAIN, |_, s| {
                for x in s {
                    *x += 1.0;
                }
            })
        })
    });
    g.bench_function("rayon_par_chunks_mut", |b| {
        pool.install(|| {
            b.iter(|| {
                black_box(&mut data[..])
                    .par_chunks_mut(GRAIN)
                    .for_each(|s| {
                        for x in s {
                            *x += 1.0;
                        }
                    })
            })
        })
    });
    g.finish();
    black_box(&data);
}

/// Round trip: bump + wake a parked thread, which acknowledges on `ack`.
fn wake_round_trip(
    iters: u64,
    wait: fn(&AtomicU32, u32, Option<Duration>),
    wake: fn(&AtomicU32),
) -> Duration {
    let word = Arc::new(AtomicU32::new(0));
    let ack = Arc::new(AtomicU32::new(0));
    let (w, a) = (Arc::clone(&word), Arc::clone(&ack));
    let total = iters + 100;
    let sleeper = std::thread::spawn(move || {
        for i in 0..total as u32 {
            // Sleep until the word moves past i (re-check after spurious wakes).
            while w.load(Ordering::Acquire) == i {
                wait(&w, i, None);
            }
            a.store(i + 1, Ordering::Release);
        }
    });
    let mut t0 = Instant::now();
    for i in 0..total as u32 {
        if i == 100 {
            t0 = Instant::now();
        }
        // Give the sleeper time to actually park (it sleeps almost at once).
        let settle = Instant::now();
        while settle.elapsed() < Duration::from_micros(30) {
            std::hint::spin_loop();
        }
        let start = Instant::now();
        word.store(i + 1, Ordering::Release);
        wake(&word);
        while ack.load(Ordering::Acquire) != i + 1 {
            std::hint::spin_loop();
        }
        // Exclude the settle time from the measurement.
        t0 += start.duration_since(settle);
    }
    let el = t0.elapsed();
    sleeper.join().unwrap();
    el
}

fn park_wake(c: &mut Criterion) {
    let mut g = c.benchmark_group("park_wake");
    #[cfg(target_os = "linux")]
    g.bench_function("futex_syscall", |b| {
        use fucina_thread::__bench::futex;
        b.iter_custom(|n| wake_round_trip(n, futex::wait, futex::wake_all))
    });
    g.bench_function("parking_lot_core", |b| {
        use fucina_thread::__bench::keyed;
        b.iter_custom(|n| wake_round_trip(n, keyed::wait, keyed::wake_all))
    });
    g.finish();
}

fn dispatch_parked(c: &mut Criterion) {
    let mut g = c.benchmark_group("dispatch_parked");
    // SAFETY: no other thread reads the environment while we set it (the
    // teams' workers never read it; rayon pools do not).
    unsafe { std::env::set_var("FUCINA_SPIN_BUDGET", "0") };
    let team = team();
    // SAFETY: as above.
    unsafe { std::env::remove_var("FUCINA_SPIN_BUDGET") };
    assert_eq!(team.spin_budgets().map(|b| b.worker_spin), Some(0));
    let tasks = [0u32, 1];
    g.bench_function("parallel_chunks_2_tasks_worker_parked", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                // Let the worker reach its futex wait (not timed).
                let settle = Instant::now();
                while settle.elapsed() < Duration::from_micros(50) {
                    std::hint::spin_loop();
                }
                let t0 = Instant::now();
                team.parallel_chunks(black_box(&tasks), |t| {
                    black_box(t);
                });
                total += t0.elapsed();
            }
            total
        })
    });
    g.finish();
}

criterion_group!(
    benches,
    dispatch_2p,
    parallel_for_4096,
    park_wake,
    dispatch_parked
);
criterion_main!(benches);
