//! Runs the `train_fashion` CNN's training step (batch 64) in a loop and prints
//! per-step times: a target for `perf record` and a quick A/B timer.
//!
//! `cargo run --release -p fucina --example fashion_step_loop -- [threads] [steps]`

use std::time::Instant;

use fucina::nn::{
    BatchNorm2d, Conv2d, Flatten, Forward, Linear, MaxPool2d, Module, Relu, Sequential,
};
use fucina::optim::{AdamW, AdamWConfig};
use fucina::prelude::Conv2dOptions;
use fucina::{ExecContext, Tensor};

const BATCH: usize = 64;

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

fn main() {
    let mut args = std::env::args().skip(1);
    let threads: usize = args.next().map_or(1, |s| s.parse().expect("threads"));
    let steps: usize = args.next().map_or(200, |s| s.parse().expect("steps"));
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
    let mut times = Vec::with_capacity(steps);
    let mut last = 0.0;
    for _ in 0..steps {
        let t = Instant::now();
        last = ctx.exec_scope(|ctx| {
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
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let warm = times.len() / 10;
    let mut t = times[warm..].to_vec();
    t.sort_by(f64::total_cmp);
    let q = |p: f64| t[((t.len() - 1) as f64 * p).round() as usize];
    println!(
        "threads {threads} steps {steps}: median {:.2} ms (q1 {:.2}, q3 {:.2}, min {:.2}) last loss {last}",
        q(0.5),
        q(0.25),
        q(0.75),
        t[0]
    );
}
