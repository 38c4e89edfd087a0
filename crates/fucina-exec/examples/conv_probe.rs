//! Times the parts of a convolution step against the matmul of the forward's GEMM
//! shape (a quick probe, not a benchmark: see `benches/benches/conv.rs`).
//!
//! `cargo run --release -p fucina-exec --example conv_probe -- [threads]`

use std::time::Instant;

use fucina_exec::{Conv2dOptions, ExecContext};

fn median(mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..7)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[3]
}

fn main() {
    let threads = std::env::args().nth(1).map_or(1, |a| a.parse().unwrap());
    let ctx = ExecContext::with_threads(threads);
    for (x, cout, k, p, g) in [
        ([64, 1, 28, 28], 32, 3, 1, 1),
        ([64, 32, 14, 14], 64, 3, 1, 1),
        ([8, 64, 56, 56], 64, 3, 1, 1),
        ([8, 128, 28, 28], 128, 3, 1, 1),
        ([8, 128, 28, 28], 256, 1, 0, 1),
        ([8, 128, 28, 28], 128, 3, 1, 128),
    ] {
        let o = Conv2dOptions {
            padding: [p, p],
            groups: g,
            ..Default::default()
        };
        let t = |shape: &[usize]| ctx.full(shape, 0.5).unwrap();
        let xt = t(&x);
        let w = t(&[cout, x[1] / g, k, k]);
        let b = t(&[cout]);
        let y = ctx.conv2d(&xt, &w, Some(&b), o).unwrap();
        let dy = t(y.shape());
        let kk = x[1] / g * k * k;
        let cols = y.numel() / cout;
        let flops = 2.0 * (cout * kk * cols) as f64 / 1e9;
        let fwd = median(|| drop(ctx.conv2d(&xt, &w, Some(&b), o).unwrap()));
        let dx = median(|| drop(ctx.conv2d_input_grad(xt.shape(), &w, &dy, o).unwrap()));
        let dw = median(|| drop(ctx.conv2d_weight_grad(&xt, w.shape(), &dy, o).unwrap()));
        let db = median(|| drop(ctx.conv_bias_grad(&dy).unwrap()));
        let a = t(&[cout, kk]);
        let bm = t(&[kk, cols]);
        let mm = median(|| drop(ctx.matmul(&a, &bm).unwrap()));
        println!(
            "{x:?}->{cout} k{k} g{g} t{threads}: fwd {:.2} ms ({:.1} GF/s) dx {:.2} ms ({:.1}) dw {:.2} ms ({:.1}) db {:.3} ms | matmul {:.2} ms ({:.1})",
            fwd * 1e3,
            flops / fwd,
            dx * 1e3,
            flops / dx,
            dw * 1e3,
            flops / dw,
            db * 1e3,
            mm * 1e3,
            flops / mm
        );
    }
}
