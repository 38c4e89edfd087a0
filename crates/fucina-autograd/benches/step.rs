//! Training steps through autograd against the same steps written by hand with
//! the exec layer's raw ops and backward kernels (same run): the difference is
//! what recording and replaying the graph costs.
//!
//! `cargo bench -p fucina-autograd --bench step -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use fucina_autograd::Tensor;
use fucina_autograd::exec::{ExecContext, RawTensor};

#[path = "../tests/support/mlp.rs"]
mod mlp;
use mlp::{BATCH, mlp_batch, mlp_params, mlp_step};

const LR: f32 = 0.01;

fn sgd(ctx: &ExecContext, w: &mut RawTensor, g: &RawTensor) {
    let g = if g.is_contiguous() {
        g.clone()
    } else {
        ctx.materialize(g).unwrap()
    };
    for (w, g) in w.data_mut().unwrap().iter_mut().zip(g.data().unwrap()) {
        *w -= LR * g;
    }
}

/// `loss = mean((tanh(x * w + b) - t)^2)` over `[64, 256]`, `w` and `b` `[256]`:
/// six small elementwise ops, where per-op overhead dominates.
fn elementwise(c: &mut Criterion) {
    let mut g = c.benchmark_group("elementwise_step_64x256");
    let ctx = ExecContext::with_threads(1);
    let x = Tensor::randn(&ctx, &[64, 256], 1.0, 1).unwrap();
    let t = Tensor::randn(&ctx, &[64, 256], 1.0, 2).unwrap();
    let mut w = Tensor::randn(&ctx, &[256], 0.1, 3).unwrap().into_variable();
    let mut b = Tensor::zeros(&ctx, &[256]).unwrap().into_variable();
    g.bench_function("autograd_scoped", |bn| {
        bn.iter(|| {
            let scope = ctx.open_exec_scope();
            let y = x
                .mul(&ctx, &w)
                .unwrap()
                .add(&ctx, &b)
                .unwrap()
                .tanh(&ctx)
                .unwrap();
            let d = y.sub(&ctx, &t).unwrap();
            let loss = d.mul(&ctx, &d).unwrap().mean_all(&ctx).unwrap();
            loss.backward(&ctx).unwrap();
            let v = loss.item().unwrap();
            drop((y, d, loss));
            ctx.close_exec_scope(scope);
            for p in [&mut w, &mut b] {
                p.sgd_step_(LR).unwrap();
                p.zero_grad();
            }
            black_box(v)
        })
    });
    let (xr, tr) = (x.raw().clone(), t.raw().clone());
    let mut wr = ctx.materialize(w.raw()).unwrap();
    let mut br = ctx.materialize(b.raw()).unwrap();
    let n = xr.numel() as f32;
    g.bench_function("raw_ops_by_hand", |bn| {
        bn.iter(|| {
            let z = ctx.add(&ctx.mul(&xr, &wr).unwrap(), &br).unwrap();
            let y = ctx.tanh(&z).unwrap();
            let d = ctx.sub(&y, &tr).unwrap();
            let loss = ctx.mean_all(&ctx.mul(&d, &d).unwrap()).unwrap();
            let dd = ctx.scale(&d, 2.0 / n).unwrap();
            let dz = ctx.tanh_backward(&z, &dd).unwrap();
            let db = ctx.sum_to(&dz, &[256]).unwrap();
            let dw = ctx.sum_to(&ctx.mul(&dz, &xr).unwrap(), &[256]).unwrap();
            sgd(&ctx, &mut wr, &dw);
            sgd(&ctx, &mut br, &db);
            black_box(loss.item().unwrap())
        })
    });
    g.finish();
}

/// One training step of a 784-256-10 MLP: batch 64, ReLU, cross-entropy,
/// backward, plain SGD. The by-hand baseline computes exactly the gradients the
/// step needs (no input gradient for the first layer), as autograd does.
fn mlp(c: &mut Criterion) {
    let mut g = c.benchmark_group("mlp_784_256_10_step");
    for threads in [1, 2] {
        let ctx = ExecContext::with_threads(threads);
        let (x, labels) = mlp_batch(&ctx);
        let mut p = mlp_params(&ctx);
        g.bench_function(format!("autograd_scoped_{threads}_threads"), |bn| {
            bn.iter(|| black_box(mlp_step(&ctx, &mut p, &x, &labels, true)))
        });
        let mut r: [RawTensor; 4] = mlp_params(&ctx).map(|t| t.raw().clone());
        let xr = x.raw().clone();
        g.bench_function(format!("raw_ops_by_hand_{threads}_threads"), |bn| {
            bn.iter(|| {
                let z1 = ctx.linear(&xr, &r[0], Some(&r[1])).unwrap();
                let h = ctx.relu(&z1).unwrap();
                let logits = ctx.linear(&h, &r[2], Some(&r[3])).unwrap();
                let loss = ctx.cross_entropy(&logits, &labels).unwrap();
                let gl = ctx.cross_entropy_backward(&logits, &labels, 1.0).unwrap();
                let (gh, gw2, gb2) = ctx.linear_backward(&h, &r[2], &gl).unwrap();
                let gz1 = ctx.relu_backward(&z1, &gh).unwrap();
                let gw1 = ctx.matmul(&gz1.transpose(0, 1).unwrap(), &xr).unwrap();
                let gb1 = ctx.sum(&gz1, 0, false).unwrap();
                sgd(&ctx, &mut r[0], &gw1);
                sgd(&ctx, &mut r[1], &gb1);
                sgd(&ctx, &mut r[2], &gw2);
                sgd(&ctx, &mut r[3], &gb2);
                black_box(loss.item().unwrap())
            })
        });
    }
    g.finish();
}

/// The two independent products of a `linear` backward, `gx = g · w` and
/// `gw = gᵀ · x`, computed one after the other on one context (1 or 2 threads)
/// against a prototype of the overlap: `gw` on the context's one-shot worker
/// (through a second 1-thread context moved into the job, since a context is not
/// `Sync`) while the caller computes `gx`. Shapes: batch 64, a hidden layer
/// `in` -> `out`.
fn linear_backward_overlap(c: &mut Criterion) {
    let mut g = c.benchmark_group("linear_backward_products_b64");
    for (inn, out) in [(256, 256), (784, 256), (1024, 1024)] {
        let ctx1 = ExecContext::with_threads(1);
        let ctx2 = ExecContext::with_threads(2);
        let x = Tensor::randn(&ctx1, &[BATCH, inn], 1.0, 1).unwrap();
        let w = Tensor::randn(&ctx1, &[out, inn], 0.05, 2).unwrap();
        let gy = Tensor::randn(&ctx1, &[BATCH, out], 1.0, 3).unwrap();
        let (x, w, gy) = (x.raw().clone(), w.raw().clone(), gy.raw().clone());
        let gyt = gy.transpose(0, 1).unwrap();
        for (name, ctx) in [
            ("sequential_1_thread", &ctx1),
            ("sequential_2_threads", &ctx2),
        ] {
            g.bench_function(format!("{name}_{inn}x{out}"), |bn| {
                bn.iter(|| {
                    let gx = ctx.matmul(&gy, &w).unwrap();
                    let gw = ctx.matmul(&gyt, &x).unwrap();
                    black_box((gx, gw))
                })
            });
        }
        let mut helper = Some(ExecContext::with_threads(1));
        let worker = ctx1.one_shot_worker();
        g.bench_function(format!("overlapped_worker_{inn}x{out}"), |bn| {
            bn.iter(|| {
                let h = helper.take().unwrap();
                let ((h, gw), gx) = worker
                    .join(
                        || {
                            let gw = h.matmul(&gyt, &x).unwrap();
                            (h, gw)
                        },
                        || ctx1.matmul(&gy, &w).unwrap(),
                    )
                    .unwrap();
                helper = Some(h);
                black_box((gx, gw))
            })
        });
    }
    g.finish();
}

criterion_group!(benches, elementwise, mlp, linear_backward_overlap);
criterion_main!(benches);
