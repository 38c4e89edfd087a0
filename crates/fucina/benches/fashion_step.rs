//! One training step of the `train_fashion` CNN at batch 64 (forward, cross
//! entropy, backward, AdamW), on 1 and 2 threads: the figure to compare with
//! PyTorch's step on the same machine (`benches/torch/fashion_step.py`, same
//! model, same optimizer, `torch.set_num_threads` equal to ours).
//!
//! `cargo bench -p fucina --bench fashion_step -- --warm-up-time 2 --measurement-time 10`

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use fucina::nn::{
    BatchNorm2d, Conv2d, Flatten, Forward, Linear, MaxPool2d, Module, Relu, Sequential,
};
use fucina::optim::{AdamW, AdamWConfig};
use fucina::prelude::Conv2dOptions;
use fucina::{ExecContext, Tensor};

const BATCH: usize = 64;

/// The default model of `train_fashion` (conv 32 -> bn -> relu -> pool -> conv
/// 64 -> bn -> relu -> pool -> fc 128 -> relu -> fc 10).
fn model(ctx: &ExecContext) -> Sequential {
    let same = Conv2dOptions {
        padding: [1, 1],
        ..Conv2dOptions::default()
    };
    Sequential::new()
        .push(Conv2d::no_bias(ctx, 1, 32, [3, 3], same, 1).unwrap())
        .push(BatchNorm2d::new(ctx, 32).unwrap())
        .push(Relu)
        .push(MaxPool2d::new([2, 2]).unwrap())
        .push(Conv2d::no_bias(ctx, 32, 64, [3, 3], same, 2).unwrap())
        .push(BatchNorm2d::new(ctx, 64).unwrap())
        .push(Relu)
        .push(MaxPool2d::new([2, 2]).unwrap())
        .push(Flatten::new())
        .push(Linear::new(ctx, 64 * 7 * 7, 128, 3).unwrap())
        .push(Relu)
        .push(Linear::new(ctx, 128, 10, 4).unwrap())
}

fn step(c: &mut Criterion) {
    let mut g = c.benchmark_group("fashion_cnn_step_b64");
    for threads in [1, 2] {
        let ctx = ExecContext::with_threads(threads);
        let x = Tensor::uniform(&ctx, &[BATCH, 1, 28, 28], -1.0, 2.0, 7).unwrap();
        let labels: Vec<i64> = (0..BATCH as i64).map(|i| i * 7 % 10).collect();
        let y = ctx.from_slice_typed::<i64>(&[BATCH], &labels).unwrap();
        let net = model(&ctx);
        let mut opt = AdamW::new(
            net.parameters(),
            AdamWConfig {
                lr: 2e-3,
                weight_decay: 1e-4,
                ..AdamWConfig::default()
            },
        )
        .unwrap();
        g.bench_function(format!("threads_{threads}"), |b| {
            b.iter(|| {
                let loss = ctx.exec_scope(|ctx| {
                    let loss = net
                        .forward(ctx, &x)
                        .unwrap()
                        .cross_entropy(ctx, &y)
                        .unwrap();
                    loss.backward(ctx).unwrap();
                    loss.item().unwrap()
                });
                opt.step(&ctx).unwrap();
                opt.zero_grad();
                black_box(loss)
            })
        });
    }
    g.finish();
}

criterion_group!(benches, step);
criterion_main!(benches);
