//! Fill throughput over 1<<20 f32 (4 MiB), with same-run baselines:
//! `rand_distr::StandardNormal` driven by `rand::rngs::SmallRng` (the Gaussian
//! baseline) and writing the same 4 MiB with `slice::fill` (the uniform baseline).
//!
//! Run: `cargo bench -p fucina-rng --bench fill -- --warm-up-time 1 --measurement-time 3`

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rand::{SeedableRng, rngs::SmallRng};
use rand_distr::{Distribution, StandardNormal};
use std::hint::black_box;

const N: usize = 1 << 20;

fn fills(c: &mut Criterion) {
    let mut out = vec![0.0f32; N];
    let mut g = c.benchmark_group("fill_1M_f32");
    g.throughput(Throughput::Elements(N as u64));

    g.bench_function("gaussian_fill", |b| {
        b.iter(|| fucina_rng::gaussian_fill(black_box(42), &mut out, black_box(1.0)));
    });
    g.bench_function("gaussian_fill_at_fast", |b| {
        b.iter(|| {
            fucina_rng::gaussian_fill_at_fast(black_box(42), black_box(0), &mut out, black_box(1.0))
        });
    });
    g.bench_function("baseline_rand_distr_standard_normal_smallrng", |b| {
        let mut rng = SmallRng::seed_from_u64(42);
        b.iter(|| {
            for v in out.iter_mut() {
                *v = StandardNormal.sample(&mut rng);
            }
        });
    });
    g.bench_function("uniform_fill", |b| {
        b.iter(|| {
            fucina_rng::uniform_fill(black_box(42), &mut out, black_box(-1.0), black_box(1.0))
        });
    });
    g.bench_function("baseline_write_same_bytes", |b| {
        b.iter(|| out.fill(black_box(0.5)));
    });
    g.finish();
    black_box(&out);
}

criterion_group!(benches, fills);
criterion_main!(benches);
