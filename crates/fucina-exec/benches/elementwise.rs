//! Elementwise op cost against a plain loop over the same slices (same run).
//!
//! `cargo bench -p fucina-exec --bench elementwise -- --warm-up-time 1 --measurement-time 3`

use criterion::{Criterion, criterion_group, criterion_main};
use fucina_exec::ExecContext;
use std::hint::black_box;

fn add(c: &mut Criterion) {
    let n = 1 << 20;
    let mut g = c.benchmark_group("add_1M");
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    let mut out = vec![0f32; n];
    g.bench_function("plain_loop_1_thread", |bn| {
        bn.iter(|| {
            for ((o, x), y) in out.iter_mut().zip(&a).zip(&b) {
                *o = x + y;
            }
            black_box(&mut out);
        })
    });
    // The physical limit of two threads: the same plain loop, the slices halved
    // between the caller and one scoped thread (spawned per call: a few µs of the
    // figure are the spawn). The add is memory-bound (12 MB per call), so this,
    // not a quarter-width of one thread, is what two threads can reach.
    g.bench_function("plain_loop_2_threads_scoped", |bn| {
        bn.iter(|| {
            let (o1, o2) = out.split_at_mut(n / 2);
            let (a1, a2) = a.split_at(n / 2);
            let (b1, b2) = b.split_at(n / 2);
            std::thread::scope(|s| {
                s.spawn(|| {
                    for ((o, x), y) in o2.iter_mut().zip(a2).zip(b2) {
                        *o = x + y;
                    }
                });
                for ((o, x), y) in o1.iter_mut().zip(a1).zip(b1) {
                    *o = x + y;
                }
            });
            black_box(&mut out);
        })
    });
    for threads in [1, 2] {
        let ctx = ExecContext::with_threads(threads);
        let x = ctx.from_slice(&[n], &a).unwrap();
        let y = ctx.from_slice(&[n], &b).unwrap();
        g.bench_function(format!("ctx_add_{threads}_threads"), |bn| {
            bn.iter(|| black_box(ctx.add(&x, &y).unwrap()))
        });
        let xr = x.reshape(&[1024, 1024]).unwrap();
        let row = ctx.from_slice(&[1024], &b[..1024]).unwrap();
        g.bench_function(format!("ctx_add_row_broadcast_{threads}_threads"), |bn| {
            bn.iter(|| black_box(ctx.add(&xr, &row).unwrap()))
        });
    }
    g.finish();
}

/// A 20-op chain of elementwise ops on [64, 256]: the per-op overhead.
fn chain(c: &mut Criterion) {
    let mut g = c.benchmark_group("chain_20_ops_64x256");
    let ctx = ExecContext::with_threads(1);
    let x = ctx.full(&[64, 256], 0.5).unwrap();
    let y = ctx.full(&[64, 256], 1.5).unwrap();
    g.bench_function("ctx_ops", |bn| {
        bn.iter(|| {
            let mut t = ctx.add(&x, &y).unwrap();
            for _ in 0..19 {
                t = ctx.mul(&t, &y).unwrap();
            }
            black_box(t)
        })
    });
    let xs = vec![0.5f32; 64 * 256];
    let ys = vec![1.5f32; 64 * 256];
    let mut t = vec![0f32; 64 * 256];
    g.bench_function("plain_loops", |bn| {
        bn.iter(|| {
            for ((o, a), b) in t.iter_mut().zip(&xs).zip(&ys) {
                *o = a + b;
            }
            for _ in 0..19 {
                for (o, b) in t.iter_mut().zip(&ys) {
                    *o *= b;
                }
            }
            black_box(&mut t);
        })
    });
    // The same arithmetic out of place, as the ops run it (each op writes a fresh
    // output while reading its input: three streams, not the two of an in-place
    // update): the kernels' own time without dispatch, allocation or checks.
    let mut u = vec![0f32; 64 * 256];
    g.bench_function("plain_loops_out_of_place", |bn| {
        bn.iter(|| {
            for ((o, a), b) in t.iter_mut().zip(&xs).zip(&ys) {
                *o = a + b;
            }
            for i in 0..19 {
                let (src, dst) = if i % 2 == 0 {
                    (&t, &mut u)
                } else {
                    (&u, &mut t)
                };
                for ((o, a), b) in dst.iter_mut().zip(src.iter()).zip(&ys) {
                    *o = a * b;
                }
            }
            black_box((&mut t, &mut u));
        })
    });
    g.finish();
}

criterion_group!(benches, add, chain);
criterion_main!(benches);
