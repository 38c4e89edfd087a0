//! Fill throughput over 1<<20 f32 (4 MiB), with same-run baselines:
//! `rand_distr::StandardNormal` driven by `rand::rngs::SmallRng` (the Gaussian
//! baseline), the exact Gaussian's Box–Muller written plainly with the
//! platform's `f64::ln`/`sin`/`cos` (the speed of a plain compiled f64
//! implementation with a libm, not bit-exact: the stand-in for the reference
//! implementation's figure) and writing the same 4 MiB with `slice::fill`
//! (the uniform baseline).
//!
//! Run: `cargo bench -p fucina-rng --bench fill -- --warm-up-time 1 --measurement-time 3`

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rand::{SeedableRng, rngs::SmallRng};
use rand_distr::{Distribution, StandardNormal};
use std::hint::black_box;

const N: usize = 1 << 20;

/// `gaussian_fill`'s mapping with the platform libm: same stream, same f64
/// Box–Muller, same roundings, but `f64::ln`/`sin`/`cos` instead of the
/// crate's portable ports (so not bit-exact).
fn gaussian_fill_platform_libm(seed: u64, out: &mut [f32], scale: f32) {
    const TWO_POW_M53: f64 = 1.0 / (1u64 << 53) as f64;
    let scale = f64::from(scale);
    let mut state = seed;
    for two in out.chunks_exact_mut(2) {
        let a = fucina_rng::splitmix64(&mut state);
        let b = fucina_rng::splitmix64(&mut state);
        let ua = ((a >> 11) as f64 + 1.0) * TWO_POW_M53;
        let ub = (b >> 11) as f64 * TWO_POW_M53;
        let radius = (-2.0 * ua.ln()).sqrt();
        let angle = 2.0 * std::f64::consts::PI * ub;
        two[0] = (radius * angle.cos() * scale) as f32;
        two[1] = (radius * angle.sin() * scale) as f32;
    }
}

fn fills(c: &mut Criterion) {
    let mut out = vec![0.0f32; N];
    let mut g = c.benchmark_group("fill_1M_f32");
    g.throughput(Throughput::Elements(N as u64));

    g.bench_function("gaussian_fill", |b| {
        b.iter(|| fucina_rng::gaussian_fill(black_box(42), &mut out, black_box(1.0)));
    });
    g.bench_function("baseline_gaussian_fill_platform_libm", |b| {
        b.iter(|| gaussian_fill_platform_libm(black_box(42), &mut out, black_box(1.0)));
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
