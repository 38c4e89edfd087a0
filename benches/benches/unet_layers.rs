//! The U-Net layers of issue 42 at its shapes, forward + backward (the
//! input's, the weight's and the bias's gradients) on 2 threads: the
//! `ConvTranspose2d` up-step (64 -> 64 channels, kernel 2, stride 2,
//! `[16, 64, 32, 32] -> [16, 64, 64, 64]`), a `ConvTranspose2d` with kernel
//! 3, stride 1, padding 1 at `[16, 64, 64, 64]`, and `GroupNorm(32, 64)` at
//! `[16, 64, 64, 64]`. `benches/torch/unet_layers.py` times PyTorch's layers
//! at the same shapes: run the two alternately in one window for a same-run
//! baseline (docs/BENCHMARKS.md has the commands and the figures).
//!
//! `cargo bench -p fucina-benches --bench unet_layers -- --warm-up-time 2 --measurement-time 8`
//!
//! A step is what a training step does with the layer: forward, `sum` as the
//! loss, backward, the gradients released (`zero_grad`), inside an exec scope
//! so that buffers return to the pool.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use fucina::nn::{ConvTranspose2d, Forward, GroupNorm, Module};
use fucina::prelude::ConvTranspose2dOptions;
use fucina::{ExecContext, Tensor};

const THREADS: usize = 2;

/// One forward + backward of `layer` on `x`, the gradients released after.
fn step(ctx: &ExecContext, layer: &dyn ModuleForward, x: &Tensor) -> f32 {
    let loss = ctx.exec_scope(|ctx| {
        let y = layer.forward(ctx, x).unwrap();
        let loss = y.sum_all(ctx).unwrap();
        loss.backward(ctx).unwrap();
        loss.item().unwrap()
    });
    layer.zero_grad();
    x.zero_grad();
    loss
}

/// A layer with parameters that maps a tensor to a tensor.
trait ModuleForward: Module + Forward {}
impl<T: Module + Forward> ModuleForward for T {}

fn unet_layers(c: &mut Criterion) {
    let ctx = ExecContext::with_threads(THREADS);
    let small = Tensor::randn(&ctx, &[16, 64, 32, 32], 1.0, 1)
        .unwrap()
        .into_variable();
    let big = Tensor::randn(&ctx, &[16, 64, 64, 64], 1.0, 2)
        .unwrap()
        .into_variable();
    let up = ConvTranspose2d::new(
        &ctx,
        64,
        64,
        [2, 2],
        ConvTranspose2dOptions {
            stride: [2, 2],
            ..Default::default()
        },
        3,
    )
    .unwrap();
    let same = ConvTranspose2d::new(
        &ctx,
        64,
        64,
        [3, 3],
        ConvTranspose2dOptions {
            padding: [1, 1],
            ..Default::default()
        },
        4,
    )
    .unwrap();
    let gn = GroupNorm::new(&ctx, 32, 64).unwrap();
    let cases: [(&str, &dyn ModuleForward, &Tensor); 3] = [
        ("conv_transpose2d_2x2_s2_b16_64c_32to64", &up, &small),
        ("conv_transpose2d_3x3_s1_p1_b16_64c_64", &same, &big),
        ("group_norm_32g_b16_64c_64x64", &gn, &big),
    ];
    let mut g = c.benchmark_group("unet_layers_fwd_bwd_t2");
    g.sample_size(20);
    for (name, layer, x) in cases {
        g.bench_function(name, |b| b.iter(|| black_box(step(&ctx, layer, x))));
    }
    g.finish();
}

criterion_group!(benches, unet_layers);
criterion_main!(benches);
