//! GEMM throughput and the right-hand-side cache.
//!
//! `cargo bench -p fucina-exec --bench matmul -- --warm-up-time 1 --measurement-time 3`
//!
//! Same run:
//! - `matmul/<shape>`: `ctx.matmul` on row-major `[m, k] x [k, n]` with a 1- and a
//!   2-thread context, against `matrixmultiply::sgemm` (single-threaded, its own
//!   runtime-detected kernels) and, for the small shapes, a naive `i-k-j` loop.
//!   Throughput is in elements = flops (`2 m n k`), so criterion's `Gelem/s` reads
//!   as GFLOP/s.
//! - `linear_cache/batch<B>`: `ctx.linear` of `[B, 784]` by a `[256, 784]` weight
//!   (zero-copy storage, `wᵀ` read through strides) with `RhsLifetime::Transient`
//!   (packs the weight every call) against `RhsLifetime::StableProcess` (cache hit).

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use fucina_exec::{ExecContext, MatmulOptions, RhsLifetime};

/// `n` benchmark inputs uniform in `[-1, 1)` from the seed.
fn rand_vec(seed: u64, n: usize) -> Vec<f32> {
    let mut v = vec![0.0; n];
    fucina_exec::rng::uniform_fill(seed, &mut v, -1.0, 1.0);
    v
}

fn naive(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    c.fill(0.0);
    for i in 0..m {
        let crow = &mut c[i * n..][..n];
        for (kk, &aik) in a[i * k..][..k].iter().enumerate() {
            for (cv, &bv) in crow.iter_mut().zip(&b[kk * n..][..n]) {
                *cv += aik * bv;
            }
        }
    }
}

fn matmul(c: &mut Criterion) {
    let mut g = c.benchmark_group("matmul");
    let shapes: [(usize, usize, usize, &str); 4] = [
        (256, 256, 256, "256"),
        (512, 512, 512, "512"),
        (1024, 1024, 1024, "1024"),
        (64, 784, 256, "64x784x256"),
    ];
    for (m, k, n, name) in shapes {
        g.throughput(Throughput::Elements((2 * m * n * k) as u64));
        let av = rand_vec(1, m * k);
        let bv = rand_vec(2, k * n);
        for threads in [1, 2] {
            let ctx = ExecContext::with_threads(threads);
            let a = ctx.from_slice(&[m, k], &av).unwrap();
            let b = ctx.from_slice(&[k, n], &bv).unwrap();
            g.bench_function(
                BenchmarkId::new(format!("fucina_t{threads}"), name),
                |bch| {
                    bch.iter(|| black_box(ctx.matmul(black_box(&a), black_box(&b)).unwrap()));
                },
            );
            drop((a, b));
        }
        let mut cv = vec![0.0f32; m * n];
        g.bench_function(BenchmarkId::new("matrixmultiply_t1", name), |bch| {
            bch.iter(|| {
                // SAFETY: `av` is m*k, `bv` is k*n and `cv` is m*n row-major f32
                // buffers, alive for the call; the strides describe exactly those.
                unsafe {
                    matrixmultiply::sgemm(
                        m,
                        k,
                        n,
                        1.0,
                        av.as_ptr(),
                        k as isize,
                        1,
                        bv.as_ptr(),
                        n as isize,
                        1,
                        0.0,
                        cv.as_mut_ptr(),
                        n as isize,
                        1,
                    );
                }
                black_box(&mut cv);
            });
        });
        if m * n * k <= 1 << 24 {
            g.bench_function(BenchmarkId::new("naive_t1", name), |bch| {
                bch.iter(|| naive(m, k, n, black_box(&av), black_box(&bv), &mut cv));
            });
        }
    }
    g.finish();
}

fn linear_cache(c: &mut Criterion) {
    let mut g = c.benchmark_group("linear_cache");
    let (inf, outf) = (784, 256);
    let wv = rand_vec(3, outf * inf);
    let ctx = ExecContext::with_threads(1);
    let w = ctx.from_vec(&[outf, inf], wv).unwrap();
    for batch in [1usize, 8, 64] {
        g.throughput(Throughput::Elements((2 * batch * inf * outf) as u64));
        let x = ctx
            .from_slice(&[batch, inf], &rand_vec(4, batch * inf))
            .unwrap();
        for (name, lifetime) in [
            ("transient", RhsLifetime::Transient),
            ("stable_cached", RhsLifetime::StableProcess),
        ] {
            let opts = MatmulOptions {
                rhs_lifetime: lifetime,
            };
            g.bench_function(BenchmarkId::new(name, format!("batch{batch}")), |bch| {
                bch.iter(|| {
                    black_box(
                        ctx.linear_with(black_box(&x), black_box(&w), None, opts)
                            .unwrap(),
                    )
                });
            });
        }
    }
    g.finish();
}

criterion_group!(benches, matmul, linear_cache);
criterion_main!(benches);
