//! The FMA peak of this machine, measured: independent FMA chains at 256 and 512
//! bits on 1 and 2 threads (see `fucina_benches::fma_peak`).
//!
//! `cargo bench -p fucina-benches --bench peak -- --warm-up-time 1 --measurement-time 3`
//!
//! Throughput is in elements = flops, so criterion's `Gelem/s` reads as GFLOP/s.
//! The probe's own best-of-5 figures are printed first (stderr).

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use fucina_benches::{FmaWidth, chain_flops, fma_chains, peak};

fn peak_bench(c: &mut Criterion) {
    for threads in [1, 2] {
        let p = peak(threads);
        eprintln!(
            "fma peak, {threads} thread(s): AVX2 {:?} GFLOP/s, AVX-512 {:?} GFLOP/s (best: {})",
            p.avx2,
            p.avx512,
            p.best_label()
        );
    }
    let mut g = c.benchmark_group("peak");
    let iters = 1_000_000u64;
    for w in [FmaWidth::Avx2, FmaWidth::Avx512] {
        if !w.supported() {
            continue;
        }
        for threads in [1usize, 2] {
            g.throughput(Throughput::Elements(
                (chain_flops(w, iters) * threads as f64) as u64,
            ));
            g.bench_function(
                BenchmarkId::new(format!("{w:?}"), format!("t{threads}")),
                |b| {
                    b.iter(|| {
                        if threads == 1 {
                            black_box(fma_chains(w, black_box(iters)));
                        } else {
                            std::thread::scope(|s| {
                                for _ in 0..threads {
                                    s.spawn(move || black_box(fma_chains(w, black_box(iters))));
                                }
                            });
                        }
                    });
                },
            );
        }
    }
    g.finish();
}

criterion_group!(benches, peak_bench);
criterion_main!(benches);
