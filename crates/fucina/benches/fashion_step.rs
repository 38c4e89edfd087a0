//! One training step of the `train_fashion` CNN at batch 64 (forward, cross
//! entropy, backward, AdamW), on 1 and 2 threads: the figure to compare with
//! PyTorch's step on the same machine (`benches/torch/fashion_step.py`, same
//! model, same optimizer, `torch.set_num_threads` equal to ours).
//!
//! `cargo bench -p fucina --bench fashion_step -- --warm-up-time 2 --measurement-time 10`

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use fucina::nn::Forward;
use fucina::{ExecContext, Tensor};

#[allow(dead_code)]
#[path = "../examples/train_fashion/job.rs"]
mod job;

const BATCH: usize = 64;

fn step(c: &mut Criterion) {
    let mut g = c.benchmark_group("fashion_cnn_step_b64");
    for threads in [1, 2] {
        let ctx = ExecContext::with_threads(threads);
        let x = Tensor::uniform(&ctx, &[BATCH, 1, 28, 28], -1.0, 2.0, 7).unwrap();
        let labels: Vec<i64> = (0..BATCH as i64).map(|i| i * 7 % 10).collect();
        let y = ctx.from_slice_typed::<i64>(&[BATCH], &labels).unwrap();
        // The example's own model and optimizer, at its default configuration.
        let (net, mut opt) =
            job::model_and_optimizer(&ctx, &job::TrainConfig::default(), 28, 28).unwrap();
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
