//! Dispatch cost against its floor, measured in interleaved batches.
//!
//! `cargo run --release -p fucina-thread --example dispatch_interleaved [BATCHES]`
//!
//! Each round times one batch of a two-thread ping-pong on one atomic (one
//! cache-line round trip: the floor), then batches of 2-task dispatches on a
//! 2-participant team: `parallel_chunks` with a zero-size closure, with a
//! closure that captures a slice and reads its task's element, and with a
//! 48-byte closure (three slices moved in: too large for the generation line,
//! it takes the descriptor's second line), and `parallel_for_slices` with a
//! closure capturing two references (each chunk writes its own line). Interleaving
//! puts the three under the same conditions, and the low percentiles of the
//! per-batch means stay meaningful on a machine shared with other work, where
//! a criterion median is dominated by preemptions. Complements the criterion
//! group `dispatch_2p` of `benches/dispatch.rs`.

use fucina_thread::{Team, TeamOptions};
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Operations per timed batch.
const BATCH: usize = 100;

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .map_or(300, |a| a.parse().expect("BATCHES: a positive integer"));
    let team = Team::new(TeamOptions { max_workers: 1 }).expect("team");
    team.warm_up().expect("spawn");
    assert_eq!(
        team.participants(),
        2,
        "the comparison assumes 2 participants"
    );

    // The ponger answers `v` with `v + 1` while `go` is set, and sleeps
    // otherwise (so it does not compete with the team's worker for a core).
    let word = Arc::new(AtomicU32::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let go = Arc::new(AtomicBool::new(false));
    let ponger = {
        let (w, s, g) = (Arc::clone(&word), Arc::clone(&stop), Arc::clone(&go));
        std::thread::spawn(move || {
            let mut expect = 1u32;
            while !s.load(Ordering::Relaxed) {
                if !g.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_micros(50));
                } else if w.load(Ordering::Acquire) == expect {
                    w.store(expect + 1, Ordering::Release);
                    expect += 2;
                } else {
                    std::hint::spin_loop();
                }
            }
        })
    };

    let tasks = [0u32, 1];
    let data: Vec<u64> = (0..64).collect();
    let data = &data[..];
    let zero_size = || {
        team.parallel_chunks(black_box(&tasks), |t| {
            black_box(t);
        })
    };
    let capturing = || {
        team.parallel_chunks(black_box(&tasks), |&t| {
            black_box(data[t as usize]);
        })
    };
    // 2 chunks of 32 f32: each participant writes its own cache lines.
    let out = std::cell::RefCell::new(vec![0f32; 64]);
    let x = vec![1f32; 64];
    let (xr, wr) = (&x, &x);
    let slices16 = || {
        team.parallel_for_slices(black_box(&mut out.borrow_mut()[..]), 32, |r, o| {
            o[0] = xr[r.start] + wr[r.start];
        })
    };
    let chunks48 = || {
        let (d, e, f) = (black_box(data), black_box(data), black_box(data));
        team.parallel_chunks(black_box(&tasks), move |&t| {
            black_box(d[t as usize] + e[t as usize] + f[t as usize]);
        })
    };
    let batch_ns = |op: &dyn Fn()| {
        let t0 = Instant::now();
        for _ in 0..BATCH {
            op();
        }
        t0.elapsed().as_nanos() as f64 / BATCH as f64
    };
    let (mut pp, mut zs, mut cap) = (Vec::new(), Vec::new(), Vec::new());
    let (mut ss, mut sb) = (Vec::new(), Vec::new());
    let mut v = 0u32;
    let mut round_trips = |n: usize| {
        for _ in 0..n {
            v += 1;
            word.store(v, Ordering::Release);
            v += 1;
            while word.load(Ordering::Acquire) != v {
                std::hint::spin_loop();
            }
        }
    };
    for _ in 0..rounds {
        go.store(true, Ordering::Relaxed);
        // Untimed: wait for the ponger to wake up and spin.
        round_trips(BATCH);
        let t0 = Instant::now();
        round_trips(BATCH);
        pp.push(t0.elapsed().as_nanos() as f64 / BATCH as f64);
        go.store(false, Ordering::Relaxed);
        // Untimed: bring the worker back from a park during the ping-pong.
        for _ in 0..BATCH {
            zero_size();
        }
        zs.push(batch_ns(&zero_size));
        cap.push(batch_ns(&capturing));
        ss.push(batch_ns(&slices16));
        sb.push(batch_ns(&chunks48));
    }
    stop.store(true, Ordering::Relaxed);
    ponger.join().expect("ponger");

    let pct = |x: &mut Vec<f64>, f: f64| {
        x.sort_by(f64::total_cmp);
        x[((x.len() - 1) as f64 * f) as usize]
    };
    println!("ns per operation over {rounds} interleaved batches of {BATCH}:");
    println!(
        "{:<29} {:>8} {:>8} {:>8} {:>8}",
        "", "p10", "p50", "p10/pp", "p50/pp"
    );
    let (pp10, pp50) = (pct(&mut pp, 0.1), pct(&mut pp, 0.5));
    for (name, x) in [
        ("ping-pong round trip", &mut pp),
        ("parallel_chunks zero-size", &mut zs),
        ("parallel_chunks capturing", &mut cap),
        ("parallel_chunks 48 B closure", &mut sb),
        ("for_slices 16 B closure", &mut ss),
    ] {
        let (p10, p50) = (pct(x, 0.1), pct(x, 0.5));
        println!(
            "{name:<29} {p10:>8.1} {p50:>8.1} {:>7.2}x {:>7.2}x",
            p10 / pp10,
            p50 / pp50
        );
    }
}
