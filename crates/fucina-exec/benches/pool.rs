//! Pooling and batch norm at the shapes of a small CNN's activations
//! (`[64, 32, 28, 28]` and `[64, 64, 14, 14]`), as bytes moved per second against
//! the streaming read bandwidth and a copy measured in the same run.
//!
//! `cargo bench -p fucina-exec --bench pool -- --warm-up-time 1 --measurement-time 3`
//!
//! Every function of a group reports the same `Throughput::Bytes`: the bytes the
//! op must read and write at least (input and output; for a backward, the saved
//! input, the output gradient and the input gradient), so the GB/s are
//! comparable with the baselines:
//!
//! - `stream_read`: the input summed in equal parts by the participants of a
//!   started `fucina_thread::Team` of the op's size, 32 independent accumulators
//!   each (the read bandwidth the op's threads can get);
//! - `copy`: `ctx.materialize` of the input (read + write, the floor of a
//!   one-input, one-output op);
//!
//! each on a one-thread context (`t1`) and a two-thread one (`t2`). The
//! `Throughput` of the baselines is the bytes they move themselves; the table
//! in `docs/BENCHMARKS.md` puts the ops' GB/s beside them.

use std::hint::black_box;
use std::sync::atomic::{AtomicU32, Ordering};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use fucina_exec::thread::{Team, TeamOptions};
use fucina_exec::{ExecContext, Pool2dOp, Pool2dOptions};

const SHAPES: [[usize; 4]; 2] = [[64, 32, 28, 28], [64, 64, 14, 14]];

/// Sums `x` with 32 accumulators (vectorizable without reassociation).
fn read_sum(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 32];
    for c in x.chunks_exact(32) {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    acc.iter().sum()
}

/// Sums `x` split in `team.participants()` equal parts, one per participant of
/// a started team (no thread start inside the measurement).
fn stream_read(x: &[f32], team: &Team) -> f32 {
    let parts = team.participants();
    let per = x.len().div_ceil(parts);
    let sums: Vec<AtomicU32> = (0..parts).map(|_| AtomicU32::new(0)).collect();
    let tasks: Vec<usize> = (0..parts).collect();
    team.parallel_chunks(&tasks, |&i| {
        let part = &x[(i * per).min(x.len())..((i + 1) * per).min(x.len())];
        sums[i].store(read_sum(part).to_bits(), Ordering::Relaxed);
    });
    sums.iter()
        .map(|s| f32::from_bits(s.load(Ordering::Relaxed)))
        .sum()
}

fn bench(c: &mut Criterion) {
    for s in SHAPES {
        let n: usize = s.iter().product();
        let mut data = vec![0.0f32; n];
        fucina_exec::rng::uniform_fill(1, &mut data, -2.0, 2.0);
        let tag = format!("{}x{}x{}x{}", s[0], s[1], s[2], s[3]);
        let mut g = c.benchmark_group(format!("pool_bn_{tag}"));
        let bytes = |elems: usize| Throughput::Bytes((elems * 4) as u64);
        for (name, threads) in [("t1", 1), ("t2", 2)] {
            let ctx = ExecContext::with_threads(threads);
            let team = Team::new(TeamOptions {
                max_workers: threads - 1,
            })
            .unwrap();
            team.warm_up().unwrap();
            let x = ctx.from_slice(&s, &data).unwrap();
            g.throughput(bytes(n));
            g.bench_function(format!("stream_read/{name}"), |b| {
                b.iter(|| black_box(stream_read(black_box(&data), &team)))
            });
            g.throughput(bytes(2 * n));
            g.bench_function(format!("copy/{name}"), |b| {
                b.iter(|| drop(black_box(ctx.materialize(black_box(&x)).unwrap())))
            });
            for op in [
                Pool2dOp::Max(Pool2dOptions::new([2, 2])),
                Pool2dOp::Avg(Pool2dOptions::new([2, 2])),
            ] {
                let y = ctx.pool2d(op, &x).unwrap();
                let kind = match op {
                    Pool2dOp::Max(_) => "max_pool2d",
                    _ => "avg_pool2d",
                };
                g.throughput(bytes(n + y.numel()));
                g.bench_function(format!("{kind}/{name}"), |b| {
                    b.iter(|| drop(black_box(ctx.pool2d(op, black_box(&x)).unwrap())))
                });
                let gy = ctx.ones(y.shape()).unwrap();
                let moved = if op.keeps_input() { 2 * n } else { n } + y.numel();
                g.throughput(bytes(moved));
                g.bench_function(format!("{kind}_backward/{name}"), |b| {
                    b.iter(|| {
                        drop(black_box(
                            ctx.pool2d_backward(op, &s, Some(&x), black_box(&gy))
                                .unwrap(),
                        ))
                    })
                });
            }
            let ch = s[1];
            let gamma = ctx.ones(&[ch]).unwrap();
            let beta = ctx.zeros(&[ch]).unwrap();
            g.throughput(bytes(2 * n));
            g.bench_function(format!("batch_norm/{name}"), |b| {
                b.iter(|| {
                    drop(black_box(
                        ctx.batch_norm(black_box(&x), &gamma, &beta, 1e-5).unwrap(),
                    ))
                })
            });
            g.bench_function(format!("batch_norm_eval/{name}"), |b| {
                b.iter(|| {
                    drop(black_box(
                        ctx.batch_norm_eval(black_box(&x), &beta, &gamma, &gamma, &beta, 1e-5)
                            .unwrap(),
                    ))
                })
            });
            let (_, st) = ctx.batch_norm(&x, &gamma, &beta, 1e-5).unwrap();
            let gy = ctx.from_slice(&s, &data).unwrap();
            g.throughput(bytes(3 * n));
            g.bench_function(format!("batch_norm_backward/{name}"), |b| {
                b.iter(|| {
                    drop(black_box(
                        ctx.batch_norm_backward(
                            &x,
                            &gamma,
                            &st.mean,
                            &st.inv_std,
                            black_box(&gy),
                            true,
                        )
                        .unwrap(),
                    ))
                })
            });
        }
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = bench
}
criterion_main!(benches);
