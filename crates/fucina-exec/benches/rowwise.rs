//! Row-wise ops over `[512, 1024]` f32 against a same-run memory baseline.
//!
//! `cargo bench -p fucina-exec --bench rowwise -- --warm-up-time 1 --measurement-time 3`
//!
//! - `copy`: `ctx.materialize` of a contiguous tensor (a pooled output written
//!   with the same bytes: the memory floor of a one-input, one-output op);
//! - `softmax` / `log_softmax` along the last axis;
//! - `layer_norm` / `rms_norm` over the last axis;
//! - `sum_rows`: `sum` along the last axis (reads the input, writes 512 values);
//! - `copy_transposed`: `materialize` of the [1024, 512] transposed view (the
//!   tiled copy); `softmax_axis0`: softmax along the first axis (gather, rows,
//!   scatter back);
//!
//! each on a one-thread context (`t1`) and on a context with the default team
//! (`team`).

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use fucina_exec::ExecContext;

const ROWS: usize = 512;
const COLS: usize = 1024;

fn rowwise(c: &mut Criterion) {
    let mut data = vec![0.0f32; ROWS * COLS];
    fucina_exec::rng::uniform_fill(1, &mut data, -4.0, 4.0);
    let mut g = c.benchmark_group("rowwise_512x1024");
    for (name, ctx) in [
        ("t1", ExecContext::with_threads(1)),
        ("team", ExecContext::new()),
    ] {
        let x = ctx.from_slice(&[ROWS, COLS], &data).unwrap();
        let gamma = ctx.ones(&[COLS]).unwrap();
        let beta = ctx.zeros(&[COLS]).unwrap();
        g.bench_function(format!("copy/{name}"), |b| {
            b.iter(|| drop(black_box(ctx.materialize(black_box(&x)).unwrap())))
        });
        let xt = x.transpose(0, 1).unwrap();
        g.bench_function(format!("copy_transposed/{name}"), |b| {
            b.iter(|| drop(black_box(ctx.materialize(black_box(&xt)).unwrap())))
        });
        g.bench_function(format!("softmax_axis0/{name}"), |b| {
            b.iter(|| drop(black_box(ctx.softmax(black_box(&x), 0).unwrap())))
        });
        drop(xt);
        g.bench_function(format!("softmax/{name}"), |b| {
            b.iter(|| drop(black_box(ctx.softmax(black_box(&x), 1).unwrap())))
        });
        g.bench_function(format!("log_softmax/{name}"), |b| {
            b.iter(|| drop(black_box(ctx.log_softmax(black_box(&x), 1).unwrap())))
        });
        g.bench_function(format!("layer_norm/{name}"), |b| {
            b.iter(|| {
                drop(black_box(
                    ctx.layer_norm(black_box(&x), &gamma, &beta, 1e-5).unwrap(),
                ))
            })
        });
        g.bench_function(format!("rms_norm/{name}"), |b| {
            b.iter(|| {
                drop(black_box(
                    ctx.rms_norm(black_box(&x), &gamma, 1e-5).unwrap(),
                ))
            })
        });
        g.bench_function(format!("sum_rows/{name}"), |b| {
            b.iter(|| drop(black_box(ctx.sum(black_box(&x), 1, false).unwrap())))
        });
        drop((x, gamma, beta));
        ctx.close().unwrap();
    }
    g.finish();
}

criterion_group!(benches, rowwise);
criterion_main!(benches);
