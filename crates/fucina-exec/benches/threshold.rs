//! Where going parallel starts to pay: a plain add loop over `n` elements on the
//! caller alone against the same loop split in two halves on a warm two-participant
//! team (the dispatch an op does above `PARALLEL_THRESHOLD`), for a sweep of `n`.
//! The smallest `n` where `team2` beats `serial` is the crossover the threshold is
//! set from.
//!
//! `cargo bench -p fucina-exec --bench threshold -- --warm-up-time 1 --measurement-time 2`

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use fucina_exec::ExecContext;
use fucina_exec::thread::{Team, TeamOptions};

fn add_body(o: &mut [f32], a: &[f32], b: &[f32]) {
    for ((o, &x), &y) in o.iter_mut().zip(a).zip(b) {
        *o = x + y;
    }
}

/// The add loop at the widest vector level the CPU has (as the op runs it).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn add_avx512(o: &mut [f32], a: &[f32], b: &[f32]) {
    add_body(o, a, b)
}

fn add(o: &mut [f32], a: &[f32], b: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F (checked just above).
        return unsafe { add_avx512(o, a, b) };
    }
    add_body(o, a, b)
}

fn threshold(c: &mut Criterion) {
    let mut g = c.benchmark_group("threshold_add");
    let team = Team::new(TeamOptions { max_workers: 1 }).unwrap();
    team.warm_up().unwrap();
    for shift in 10..=18 {
        let n = 1usize << shift;
        let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
        let mut out = vec![0f32; n];
        g.bench_with_input(BenchmarkId::new("serial", n), &n, |bn, _| {
            bn.iter(|| {
                add(&mut out, &a, &b);
                black_box(&mut out);
            })
        });
        g.bench_with_input(BenchmarkId::new("team2", n), &n, |bn, _| {
            bn.iter(|| {
                team.parallel_for_slices(&mut out, n / 2, |r, o| add(o, &a[r.clone()], &b[r]));
                black_box(&mut out);
            })
        });
        // The op itself on one and two threads (serial below the threshold).
        for threads in [1, 2] {
            let ctx = ExecContext::with_threads(threads);
            let (x, y) = (
                ctx.from_slice(&[n], &a).unwrap(),
                ctx.from_slice(&[n], &b).unwrap(),
            );
            g.bench_with_input(
                BenchmarkId::new(format!("ctx_add_t{threads}"), n),
                &n,
                |bn, _| bn.iter(|| black_box(ctx.add(&x, &y).unwrap())),
            );
            drop((x, y));
            ctx.close().unwrap();
        }
    }
    g.finish();
}

criterion_group!(benches, threshold);
criterion_main!(benches);
