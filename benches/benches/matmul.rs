//! Square and training-shape GEMM: fucina against its peers, every baseline in
//! the same run.
//!
//! `cargo bench -p fucina-benches --bench matmul -- --warm-up-time 1 --measurement-time 3`
//!
//! - `matmul/<id>/<shape>` for `256`, `512`, `1024` (square) and `64x784x256`
//!   (`[64, 784] x [784, 256]`, the MLP training shape), row-major operands:
//!   - `fucina_t1`, `fucina_t2`: `ExecContext::matmul` with a 1- and a 2-thread
//!     context;
//!   - `matrixmultiply_tN`: `matrixmultiply::sgemm` with its `threading` feature;
//!     its thread count is fixed per process by `MATMUL_NUM_THREADS` (default: the
//!     physical cores), so `N` is read from that variable. Run the bench a second
//!     time with `MATMUL_NUM_THREADS=1` for the single-thread figure;
//!   - `gemm_t1`, `gemm_t2`: the `gemm` crate (`Parallelism::None` /
//!     `Parallelism::Rayon(2)`), with its `x86-v4` (AVX-512) kernels unless the
//!     bench is built with `--no-default-features`;
//!   - `candle`: candle-core's CPU `matmul` (it uses `gemm` on rayon's global
//!     pool: as many threads as cores);
//!   - `naive_t1` (256 only): an `i-k-j` loop.
//!
//!   Throughput is in elements = flops (`2 m n k`): criterion's `Gelem/s` reads
//!   as GFLOP/s.
//! - After the criterion group, each fucina configuration is timed again (median
//!   of a few calls) and printed as GFLOP/s and as a fraction of the FMA peak of
//!   the same thread count measured in this process
//!   (`fucina_benches::report_fraction_of_peak`).

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use fucina_benches::report_fraction_of_peak;
use fucina_exec::ExecContext;

const SHAPES: [(usize, usize, usize, &str); 4] = [
    (256, 256, 256, "256"),
    (512, 512, 512, "512"),
    (1024, 1024, 1024, "1024"),
    (64, 784, 256, "64x784x256"),
];

use fucina_benches::rand_vec;

#[path = "../peer/gemm.rs"]
mod gemm_peer;
use gemm_peer::gemm_crate;

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

/// `c = a · b` with matrixmultiply.
fn mm_crate(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    assert!(a.len() == m * k && b.len() == k * n && c.len() == m * n);
    // SAFETY: the asserts give the extents; the strides are those of row-major
    // `m x k`, `k x n` and `m x n` buffers, alive for the call.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            k as isize,
            1,
            b.as_ptr(),
            n as isize,
            1,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

/// matrixmultiply's thread count in this process.
fn mm_threads() -> usize {
    std::env::var("MATMUL_NUM_THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        })
        .max(1)
}

fn matmul(c: &mut Criterion) {
    let mut g = c.benchmark_group("matmul");
    let dev = candle_core::Device::Cpu;
    for (m, k, n, name) in SHAPES {
        g.throughput(Throughput::Elements((2 * m * n * k) as u64));
        let av = rand_vec(1, m * k);
        let bv = rand_vec(2, k * n);
        for threads in [1, 2] {
            let ctx = ExecContext::with_threads(threads);
            let a = ctx.from_slice(&[m, k], &av).unwrap();
            let b = ctx.from_slice(&[k, n], &bv).unwrap();
            g.bench_function(
                BenchmarkId::new(format!("fucina_t{threads}"), name),
                |bch| bch.iter(|| black_box(ctx.matmul(black_box(&a), black_box(&b)).unwrap())),
            );
            drop((a, b));
        }
        let mut cv = vec![0.0f32; m * n];
        g.bench_function(
            BenchmarkId::new(format!("matrixmultiply_t{}", mm_threads()), name),
            |bch| bch.iter(|| mm_crate(m, k, n, black_box(&av), black_box(&bv), &mut cv)),
        );
        for (id, par) in [
            ("gemm_t1", gemm::Parallelism::None),
            ("gemm_t2", gemm::Parallelism::Rayon(2)),
        ] {
            g.bench_function(BenchmarkId::new(id, name), |bch| {
                bch.iter(|| gemm_crate(m, k, n, black_box(&av), black_box(&bv), &mut cv, par));
            });
        }
        let ca = candle_core::Tensor::from_vec(av.clone(), (m, k), &dev).unwrap();
        let cb = candle_core::Tensor::from_vec(bv.clone(), (k, n), &dev).unwrap();
        g.bench_function(BenchmarkId::new("candle", name), |bch| {
            bch.iter(|| black_box(black_box(&ca).matmul(black_box(&cb)).unwrap()));
        });
        if m == 256 && k == 256 && n == 256 {
            g.bench_function(BenchmarkId::new("naive_t1", name), |bch| {
                bch.iter(|| naive(m, k, n, black_box(&av), black_box(&bv), &mut cv));
            });
        }
    }
    g.finish();

    // GFLOP/s as a fraction of the FMA peak measured in this process.
    for (m, k, n, name) in SHAPES {
        let av = rand_vec(1, m * k);
        let bv = rand_vec(2, k * n);
        let flops = 2.0 * (m * n * k) as f64;
        let reps = ((4e9 / flops) as usize).clamp(5, 200);
        for threads in [1, 2] {
            let ctx = ExecContext::with_threads(threads);
            let a = ctx.from_slice(&[m, k], &av).unwrap();
            let b = ctx.from_slice(&[k, n], &bv).unwrap();
            report_fraction_of_peak(
                &format!("matmul {name} fucina_t{threads}"),
                threads,
                flops,
                reps,
                || drop(black_box(ctx.matmul(&a, &b).unwrap())),
            );
            drop((a, b));
        }
        let mut cv = vec![0.0f32; m * n];
        report_fraction_of_peak(&format!("matmul {name} gemm_t2"), 2, flops, reps, || {
            gemm_crate(m, k, n, &av, &bv, &mut cv, gemm::Parallelism::Rayon(2))
        });
    }
}

criterion_group!(benches, matmul);
criterion_main!(benches);
