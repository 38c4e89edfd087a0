//! Times the layers of issue 42 at the issue's shapes, forward + backward:
//! `conv_transpose2d` at U-Net shapes (batch 16, 64 channels, 64x64
//! output; the 2x2 stride-2 upsampler and a 3x3 stride-1 layer) and an
//! `Lstm` (2 layers, hidden 256, sequence 128, batch 32). Prints one line per
//! case with the median and the range of `--runs` timed runs after one
//! warm-up; `benches/torch/layers_step.py` times PyTorch at the same shapes
//! (run both in the same session, alternating, for a same-run baseline).
//!
//! ```sh
//! cargo run --release -p fucina-benches --example layers_step -- --threads 2 --runs 7
//! ```

use std::time::Instant;

use fucina::nn::{Lstm, RnnOptions};
use fucina::prelude::ConvTranspose2dOptions;
use fucina::{ExecContext, Tensor};

fn median_ms(mut t: Vec<f64>) -> (f64, f64, f64) {
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (t[t.len() / 2], t[0], t[t.len() - 1])
}

fn time(runs: usize, mut f: impl FnMut()) -> (f64, f64, f64) {
    f(); // warm-up (pool, packing buffers)
    let mut t = Vec::with_capacity(runs);
    for _ in 0..runs {
        let s = Instant::now();
        f();
        t.push(s.elapsed().as_secs_f64() * 1e3);
    }
    median_ms(t)
}

fn conv_case(
    ctx: &ExecContext,
    x: [usize; 4],
    w: [usize; 4],
    o: ConvTranspose2dOptions,
) -> impl FnMut() {
    let x = Tensor::randn(ctx, &x, 1.0, 1).unwrap().into_variable();
    let w = Tensor::randn(ctx, &w, 0.05, 2).unwrap().into_variable();
    let b = Tensor::zeros(ctx, &[w.shape()[1]]).unwrap().into_variable();
    move || {
        let y = x.conv_transpose2d(ctx, &w, Some(&b), o).unwrap();
        y.sum_all(ctx).unwrap().backward(ctx).unwrap();
        for t in [&x, &w, &b] {
            t.zero_grad();
        }
    }
}

fn main() {
    let mut threads = 2;
    let mut runs = 7;
    let args: Vec<String> = std::env::args().collect();
    for i in 1..args.len() {
        match args[i].as_str() {
            "--threads" => threads = args[i + 1].parse().unwrap(),
            "--runs" => runs = args[i + 1].parse().unwrap(),
            _ => {}
        }
    }
    let ctx = ExecContext::with_threads(threads);
    let up = ConvTranspose2dOptions {
        stride: [2, 2],
        ..Default::default()
    };
    let (m, lo, hi) = time(runs, conv_case(&ctx, [16, 64, 32, 32], [64, 64, 2, 2], up));
    println!(
        "fucina conv_transpose2d 2x2 s2 [16,64,32,32]->[16,64,64,64] fwd+bwd threads={threads}: median {m:.2} ms [{lo:.2}-{hi:.2}]"
    );
    let same = ConvTranspose2dOptions {
        padding: [1, 1],
        ..Default::default()
    };
    let (m, lo, hi) = time(
        runs,
        conv_case(&ctx, [16, 64, 64, 64], [64, 64, 3, 3], same),
    );
    println!(
        "fucina conv_transpose2d 3x3 s1 p1 [16,64,64,64]->[16,64,64,64] fwd+bwd threads={threads}: median {m:.2} ms [{lo:.2}-{hi:.2}]"
    );
    let opts = RnnOptions {
        num_layers: 2,
        ..Default::default()
    };
    let lstm = Lstm::new(&ctx, 256, 256, opts, 3).unwrap();
    let x = Tensor::randn(&ctx, &[128, 32, 256], 1.0, 4)
        .unwrap()
        .into_variable();
    let (m, lo, hi) = time(runs, || {
        let (y, _) = lstm.forward(&ctx, &x, None).unwrap();
        y.sum_all(&ctx).unwrap().backward(&ctx).unwrap();
        x.zero_grad();
        for (_, p) in fucina::nn::Module::named_parameters(&lstm) {
            p.zero_grad();
        }
    });
    println!(
        "fucina LSTM 2x256 seq 128 batch 32 fwd+bwd threads={threads}: median {m:.2} ms [{lo:.2}-{hi:.2}]"
    );
}
