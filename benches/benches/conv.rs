//! `conv2d` forward and forward+backward (input, weight and bias gradients) at
//! the shapes of the `train_fashion` example and of ResNet-18 stages, a 1x1 and
//! a depthwise 3x3, on 1 and 2 threads, as GFLOP/s and as a fraction of the FMA
//! peak measured in the same process; the same-run baseline is the plain matmul
//! with the forward's GEMM shape (`[Cout, K] x [K, N*OH*OW]`), i.e. what the
//! convolution would cost if its column matrix were free.
//!
//! `cargo bench -p fucina-benches --bench conv -- --warm-up-time 1 --measurement-time 2`
//!
//! Throughput is in elements = flops (`2 * N * Cout * K * OH * OW` for the
//! forward, three times that for forward+backward): criterion's `Gelem/s` reads
//! as GFLOP/s. After the criterion group, each configuration is timed again
//! (median of a few calls) and printed with its fraction of the peak
//! (`fucina_benches::report_fraction_of_peak`).

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use fucina_benches::{rand_vec, report_fraction_of_peak};
use fucina_exec::{Conv2dOptions, ExecContext, RawTensor};

/// One benchmark shape: input `[n, c, h, w]`, `cout` outputs, square kernel `k`,
/// padding `p`, groups `g`.
#[derive(Clone, Copy)]
struct Shape {
    name: &'static str,
    x: [usize; 4],
    cout: usize,
    k: usize,
    p: usize,
    g: usize,
}

const SHAPES: [Shape; 6] = [
    Shape {
        name: "fashion1 [64,1,28,28]->32 3x3",
        x: [64, 1, 28, 28],
        cout: 32,
        k: 3,
        p: 1,
        g: 1,
    },
    Shape {
        name: "fashion2 [64,32,14,14]->64 3x3",
        x: [64, 32, 14, 14],
        cout: 64,
        k: 3,
        p: 1,
        g: 1,
    },
    Shape {
        name: "resnet2 [32,64,56,56]->64 3x3",
        x: [32, 64, 56, 56],
        cout: 64,
        k: 3,
        p: 1,
        g: 1,
    },
    Shape {
        name: "resnet3 [32,128,28,28]->128 3x3",
        x: [32, 128, 28, 28],
        cout: 128,
        k: 3,
        p: 1,
        g: 1,
    },
    Shape {
        name: "1x1 [32,128,28,28]->256",
        x: [32, 128, 28, 28],
        cout: 256,
        k: 1,
        p: 0,
        g: 1,
    },
    Shape {
        name: "depthwise [32,128,28,28] 3x3",
        x: [32, 128, 28, 28],
        cout: 128,
        k: 3,
        p: 1,
        g: 128,
    },
];

impl Shape {
    fn opts(self) -> Conv2dOptions {
        Conv2dOptions {
            padding: [self.p, self.p],
            groups: self.g,
            ..Default::default()
        }
    }
    fn w(self) -> [usize; 4] {
        [self.cout, self.x[1] / self.g, self.k, self.k]
    }
    /// GEMM depth and columns of the forward.
    fn gemm(self) -> (usize, usize) {
        let [n, _, h, w] = self.x;
        let (oh, ow) = (h + 2 * self.p - self.k + 1, w + 2 * self.p - self.k + 1);
        (self.x[1] / self.g * self.k * self.k, n * oh * ow)
    }
    fn flops(self) -> f64 {
        let (k, cols) = self.gemm();
        2.0 * (self.cout * k * cols) as f64
    }
}

struct Operands {
    x: RawTensor,
    w: RawTensor,
    b: RawTensor,
    dy: RawTensor,
}

fn operands(ctx: &ExecContext, s: Shape) -> Operands {
    let t = |shape: &[usize], seed| {
        let n: usize = shape.iter().product();
        ctx.from_slice(shape, &rand_vec(seed, n)).unwrap()
    };
    let x = t(&s.x, 1);
    let w = t(&s.w(), 2);
    let b = t(&[s.cout], 3);
    let y = ctx.conv2d(&x, &w, Some(&b), s.opts()).unwrap();
    let dy = t(y.shape(), 4);
    Operands { x, w, b, dy }
}

fn forward(ctx: &ExecContext, s: Shape, o: &Operands) {
    drop(black_box(
        ctx.conv2d(&o.x, &o.w, Some(&o.b), s.opts()).unwrap(),
    ));
}

fn forward_backward(ctx: &ExecContext, s: Shape, o: &Operands) {
    let y = ctx.conv2d(&o.x, &o.w, Some(&o.b), s.opts()).unwrap();
    let dx = ctx
        .conv2d_input_grad(o.x.shape(), &o.w, &o.dy, s.opts())
        .unwrap();
    let dw = ctx
        .conv2d_weight_grad(&o.x, o.w.shape(), &o.dy, s.opts())
        .unwrap();
    let db = ctx.conv_bias_grad(&o.dy).unwrap();
    drop(black_box((y, dx, dw, db)));
}

fn conv(c: &mut Criterion) {
    let mut g = c.benchmark_group("conv2d");
    g.sample_size(10);
    for s in SHAPES {
        for threads in [1, 2] {
            let ctx = ExecContext::with_threads(threads);
            let o = operands(&ctx, s);
            g.throughput(Throughput::Elements(s.flops() as u64));
            g.bench_function(
                BenchmarkId::new(format!("fwd {}", s.name), format!("t{threads}")),
                |b| b.iter(|| forward(&ctx, s, &o)),
            );
            g.throughput(Throughput::Elements(3 * s.flops() as u64));
            g.bench_function(
                BenchmarkId::new(format!("fwd+bwd {}", s.name), format!("t{threads}")),
                |b| b.iter(|| forward_backward(&ctx, s, &o)),
            );
        }
    }
    g.finish();
    for s in SHAPES {
        let reps = ((2e9 / s.flops()) as usize).clamp(5, 50);
        for threads in [1, 2] {
            let ctx = ExecContext::with_threads(threads);
            let o = operands(&ctx, s);
            let name = s.name;
            report_fraction_of_peak(
                &format!("conv2d fwd {name} t{threads}"),
                threads,
                s.flops(),
                reps,
                || forward(&ctx, s, &o),
            );
            report_fraction_of_peak(
                &format!("conv2d fwd+bwd {name} t{threads}"),
                threads,
                3.0 * s.flops(),
                reps,
                || forward_backward(&ctx, s, &o),
            );
            if s.g == 1 {
                // Baseline: the forward's GEMM on a materialized column matrix.
                let (k, cols) = s.gemm();
                let a = ctx
                    .from_slice(&[s.cout, k], &rand_vec(5, s.cout * k))
                    .unwrap();
                let bm = ctx.from_slice(&[k, cols], &rand_vec(6, k * cols)).unwrap();
                report_fraction_of_peak(
                    &format!("matmul baseline [{},{k}]x[{k},{cols}] t{threads}", s.cout),
                    threads,
                    s.flops(),
                    reps,
                    || drop(black_box(ctx.matmul(&a, &bm).unwrap())),
                );
            }
        }
    }
}

criterion_group!(benches, conv);
criterion_main!(benches);
