//! Row-wise ops over `[512, 1024]` f32 against a same-run memory baseline.
//!
//! `cargo bench -p fucina-exec --bench rowwise -- --warm-up-time 1 --measurement-time 3`
//!
//! - `copy`: `ctx.materialize` of a contiguous tensor (a pooled output written
//!   with the same bytes: the memory floor of a one-input, one-output op);
//! - `softmax` / `log_softmax` along the last axis;
//! - `layer_norm` / `rms_norm` over the last axis;
//! - `sum_rows`: `sum` along the last axis (reads the input, writes 512 values);
//! - `cross_entropy` (against 512 labels: per-row log-sum-exp, then the mean) and
//!   `cross_entropy_backward` (`(softmax - onehot) * grad / N`);
//! - `copy_transposed`: `materialize` of the [1024, 512] transposed view (the
//!   tiled copy); `softmax_axis0`: softmax along the first axis (gather, rows,
//!   scatter back);
//!
//! each on a one-thread context (`t1`) and on a context with the default team
//! (`team`).
//!
//! Group `unary_1m` (one thread, `1 << 20` floats in `[-4, 4]`): the `exp`,
//! `tanh` and `gelu` ops (libm-free, vectorized) against `copy` (the memory floor)
//! and `libm_*`, a plain loop calling the standard library's `f32::exp` /
//! `f32::tanh` per element into a preallocated buffer (what the ops did before
//! they had their own math; the op overhead of allocation is not in it).

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
        let labels: Vec<i64> = (0..ROWS as i64).map(|i| (i * 97) % COLS as i64).collect();
        let labels = ctx.from_slice_typed::<i64>(&[ROWS], &labels).unwrap();
        g.bench_function(format!("cross_entropy/{name}"), |b| {
            b.iter(|| {
                drop(black_box(
                    ctx.cross_entropy(black_box(&x), &labels).unwrap(),
                ))
            })
        });
        g.bench_function(format!("cross_entropy_backward/{name}"), |b| {
            b.iter(|| {
                drop(black_box(
                    ctx.cross_entropy_backward(black_box(&x), &labels, 1.0)
                        .unwrap(),
                ))
            })
        });
        drop(labels);
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

/// A scalar function called per element.
type Scalar = fn(f32) -> f32;

/// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))` with libm's `tanh`.
fn gelu_libm(x: f32) -> f32 {
    0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044_715 * x * x * x)).tanh())
}

fn unary(c: &mut Criterion) {
    const N: usize = 1 << 20;
    let mut data = vec![0.0f32; N];
    fucina_exec::rng::uniform_fill(2, &mut data, -4.0, 4.0);
    let mut g = c.benchmark_group("unary_1m");
    let ctx = ExecContext::with_threads(1);
    let x = ctx.from_slice(&[N], &data).unwrap();
    g.bench_function("copy", |b| {
        b.iter(|| drop(black_box(ctx.materialize(black_box(&x)).unwrap())))
    });
    g.bench_function("exp", |b| {
        b.iter(|| drop(black_box(ctx.exp(black_box(&x)).unwrap())))
    });
    g.bench_function("tanh", |b| {
        b.iter(|| drop(black_box(ctx.tanh(black_box(&x)).unwrap())))
    });
    g.bench_function("gelu", |b| {
        b.iter(|| drop(black_box(ctx.gelu(black_box(&x)).unwrap())))
    });
    let mut out = vec![0.0f32; N];
    let libm: [(&str, Scalar); 3] = [
        ("libm_exp", f32::exp),
        ("libm_tanh", f32::tanh),
        ("libm_gelu", gelu_libm),
    ];
    for (name, f) in libm {
        g.bench_function(name, |b| {
            b.iter(|| {
                for (o, &v) in out.iter_mut().zip(black_box(&data)) {
                    *o = f(v);
                }
                black_box(&mut out);
            })
        });
    }
    g.finish();
    drop(x);
    ctx.close().unwrap();
}

criterion_group!(benches, rowwise, unary);
criterion_main!(benches);
