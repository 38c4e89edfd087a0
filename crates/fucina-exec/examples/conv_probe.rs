//! Times the parts of a convolution step against the matmul of the forward's GEMM
//! shape (a quick probe, not a benchmark: see `benches/benches/conv.rs`).
//!
//! `cargo run --release -p fucina-exec --example conv_probe -- [threads]`
//!
//! Prints each part's GFLOP/s and its fraction of the FMA peak of the same
//! thread count, measured in the same process by the probe of
//! `benches/src/lib.rs` (included here, so this example needs none of the
//! benches crate's peer libraries).

// The probe names the workspace's RNG as `fucina::rng`: the same crate.
extern crate fucina_exec as fucina;

#[path = "../../../benches/src/lib.rs"]
#[allow(dead_code, missing_docs, unreachable_pub)]
mod probe;

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
    let peak = probe::peak(threads);
    println!(
        "FMA peak, {threads} thread(s): {:.1} GFLOP/s ({}; AVX2 {:.1})",
        peak.best(),
        peak.best_label(),
        peak.avx2.unwrap_or(0.0)
    );
    let pk = peak.best();
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
        let all = fwd + dx + dw + db;
        let frac = |gf: f64| gf / pk;
        println!(
            "{x:?}->{cout} k{k} g{g} t{threads}: fwd {:.2} ms ({:.1} GF/s, {:.3} of peak) \
             | dx {:.2} ms ({:.1}) dw {:.2} ms ({:.1}) db {:.3} ms \
             | fwd+bwd {:.2} ms ({:.1} GF/s, {:.3} of peak) \
             | matmul baseline {:.2} ms ({:.1} GF/s, {:.3} of peak)",
            fwd * 1e3,
            flops / fwd,
            frac(flops / fwd),
            dx * 1e3,
            flops / dx,
            dw * 1e3,
            flops / dw,
            db * 1e3,
            all * 1e3,
            3.0 * flops / all,
            frac(3.0 * flops / all),
            mm * 1e3,
            flops / mm,
            frac(flops / mm)
        );
    }
}
