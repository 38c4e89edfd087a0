//! Training steps through autograd against the same steps written by hand with
//! the exec layer's raw ops and backward kernels (same run): the difference is
//! what recording and replaying the graph costs.
//!
//! `cargo bench -p fucina-autograd --bench step -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use fucina_autograd::Tensor;
use fucina_autograd::exec::{ExecContext, RawTensor};

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

criterion_group!(benches, elementwise);
criterion_main!(benches);
