//! Forward + backward of the sequence layers of issue 42 at its shapes, on 2
//! threads (`FUCINA_BENCH_THREADS` overrides): an `Lstm` (2 layers, input and
//! hidden 256, sequence 128, batch 32; the input's gradient too) and a
//! self-attention `MultiheadAttention` (embed 256, 8 heads, sequence 128,
//! batch 16, batch-first, with biases, `need_weights = false`; the input's
//! gradient too). The same-run baseline is PyTorch at the same shapes and
//! thread count, `benches/torch/sequence_layers.py`; run the two alternately
//! in one window (see docs/BENCHMARKS.md).
//!
//! ```sh
//! cargo bench -p fucina-benches --bench sequence_layers -- --warm-up-time 1 --measurement-time 3
//! /work/venv-arch/bin/python benches/torch/sequence_layers.py --threads 2 --runs 10
//! ```
//!
//! Each iteration is one training step's compute without the optimizer:
//! forward, `sum_all`, backward, then the gradients cleared.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use fucina::nn::{AttentionOptions, Lstm, Module, MultiheadAttention, RnnOptions};
use fucina::{ExecContext, Tensor};

fn threads() -> usize {
    std::env::var("FUCINA_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
}

fn sequence_layers(c: &mut Criterion) {
    let t = threads();
    let ctx = ExecContext::with_threads(t);
    let mut g = c.benchmark_group("sequence_layers");
    g.sample_size(10);

    let opts = RnnOptions {
        num_layers: 2,
        ..Default::default()
    };
    let lstm = Lstm::new(&ctx, 256, 256, opts, 3).unwrap();
    let x = Tensor::randn(&ctx, &[128, 32, 256], 1.0, 4)
        .unwrap()
        .into_variable();
    g.bench_function(format!("lstm_2x256_seq128_b32_fwd_bwd_t{t}"), |b| {
        b.iter(|| {
            let (y, _) = lstm.forward(&ctx, &x, None).unwrap();
            y.sum_all(&ctx).unwrap().backward(&ctx).unwrap();
            black_box(x.grad_view());
            x.zero_grad();
            for (_, p) in lstm.named_parameters() {
                p.zero_grad();
            }
        })
    });

    let mha = MultiheadAttention::new(&ctx, 256, 8, true, true, 5).unwrap();
    let q = Tensor::randn(&ctx, &[16, 128, 256], 1.0, 6)
        .unwrap()
        .into_variable();
    let no_weights = AttentionOptions {
        need_weights: false,
        ..Default::default()
    };
    g.bench_function(format!("mha_e256_h8_seq128_b16_fwd_bwd_t{t}"), |b| {
        b.iter(|| {
            let (y, _) = mha.forward(&ctx, &q, &q, &q, no_weights).unwrap();
            y.sum_all(&ctx).unwrap().backward(&ctx).unwrap();
            black_box(q.grad_view());
            q.zero_grad();
            for (_, p) in mha.named_parameters() {
                p.zero_grad();
            }
        })
    });
    g.finish();
}

criterion_group!(benches, sequence_layers);
criterion_main!(benches);
