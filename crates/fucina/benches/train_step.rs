//! One training step of the `train_digits` MLP (64-128-10, batch 32, cross
//! entropy) through the facade (`nn::Linear` layers, `optim::Sgd`) against the
//! same step written with autograd tensors and `Tensor::sgd_step_` (same run):
//! the difference is what the facade's parameter handles and optimizer loop
//! cost. A third case measures the step with `optim::AdamW`.
//!
//! `cargo bench -p fucina --bench train_step -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use fucina::nn::{Linear, Module};
use fucina::optim::{AdamW, AdamWConfig, Sgd};
use fucina::{ExecContext, Tensor};

const LR: f32 = 0.01;

fn step(c: &mut Criterion) {
    let mut g = c.benchmark_group("mlp_step_64x128x10_b32");
    let ctx = ExecContext::with_threads(1);
    let x = Tensor::uniform(&ctx, &[32, 64], 0.0, 1.0, 1).unwrap();
    let labels: Vec<i64> = (0..32).map(|i| i % 10).collect();
    let y = ctx.from_slice_typed::<i64>(&[32], &labels).unwrap();

    // Baseline: autograd tensors and the built-in plain SGD step.
    let mut w1 = Tensor::kaiming_uniform(&ctx, &[128, 64], 1)
        .unwrap()
        .into_variable();
    let mut b1 = Tensor::zeros(&ctx, &[128]).unwrap().into_variable();
    let mut w2 = Tensor::kaiming_uniform(&ctx, &[10, 128], 2)
        .unwrap()
        .into_variable();
    let mut b2 = Tensor::zeros(&ctx, &[10]).unwrap().into_variable();
    g.bench_function("autograd_sgd_step_", |bn| {
        bn.iter(|| {
            let loss = ctx.exec_scope(|ctx| {
                let h = x.linear(ctx, &w1, Some(&b1)).unwrap().relu(ctx).unwrap();
                let loss = h
                    .linear(ctx, &w2, Some(&b2))
                    .unwrap()
                    .cross_entropy(ctx, &y)
                    .unwrap();
                loss.backward(ctx).unwrap();
                loss.item().unwrap()
            });
            for p in [&mut w1, &mut b1, &mut w2, &mut b2] {
                p.sgd_step_(LR).unwrap();
                p.zero_grad();
            }
            black_box(loss)
        })
    });

    let net = [
        Linear::new(&ctx, 64, 128, 1).unwrap(),
        Linear::new(&ctx, 128, 10, 2).unwrap(),
    ];
    let params: Vec<_> = net.iter().flat_map(Module::parameters).collect();
    let run = |ctx: &ExecContext| {
        let h = net[0].forward(ctx, &x).unwrap().relu(ctx).unwrap();
        let loss = net[1]
            .forward(ctx, &h)
            .unwrap()
            .cross_entropy(ctx, &y)
            .unwrap();
        loss.backward(ctx).unwrap();
        loss.item().unwrap()
    };
    let mut sgd = Sgd::new(params.clone(), LR).unwrap();
    g.bench_function("facade_sgd", |bn| {
        bn.iter(|| {
            let loss = ctx.exec_scope(run);
            sgd.step(&ctx).unwrap();
            sgd.zero_grad();
            black_box(loss)
        })
    });
    let mut adamw = AdamW::new(
        params,
        AdamWConfig {
            lr: LR,
            ..AdamWConfig::default()
        },
    )
    .unwrap();
    g.bench_function("facade_adamw", |bn| {
        bn.iter(|| {
            let loss = ctx.exec_scope(run);
            adamw.step(&ctx).unwrap();
            adamw.zero_grad();
            black_box(loss)
        })
    });
    g.finish();
}

criterion_group!(benches, step);
criterion_main!(benches);
