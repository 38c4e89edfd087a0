//! Times the memory-bound passes of the CNN step at the `train_fashion` shapes
//! (a quick probe, not a benchmark).
//!
//! `cargo run --release -p fucina-exec --example pool_probe`

use std::time::Instant;

use fucina_exec::{ExecContext, Pool2dOp, Pool2dOptions};

fn median(mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..15)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[7] * 1e3
}

fn main() {
    let ctx = ExecContext::with_threads(1);
    let s = [64, 32, 28, 28];
    let n: usize = s.iter().product();
    let x = ctx
        .from_vec(
            &s,
            (0..n)
                .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                .collect(),
        )
        .unwrap();
    let o = Pool2dOptions::new([2, 2]);
    let p = ctx.relu_max_pool2d(&x, o).unwrap();
    let gy = ctx.full(p.shape(), 0.5).unwrap();
    let mb = (n * 4) as f64 / 1e6;
    let t = median(|| drop(ctx.relu(&x).unwrap()));
    println!("relu: {t:.3} ms ({:.1} GB/s)", 2.0 * mb / t);
    let t = median(|| drop(ctx.relu_max_pool2d(&x, o).unwrap()));
    println!("relu_max_pool2d: {t:.3} ms ({:.1} GB/s)", 1.25 * mb / t);
    let t = median(|| {
        drop(
            ctx.pool2d_backward(Pool2dOp::ReluMax(o), &s, Some(&x), &gy)
                .unwrap(),
        )
    });
    println!(
        "relu_max_pool2d backward: {t:.3} ms ({:.1} GB/s)",
        2.25 * mb / t
    );
    let t = median(|| {
        drop(
            ctx.pool2d_backward(Pool2dOp::Max(o), &s, Some(&x), &gy)
                .unwrap(),
        )
    });
    println!("max_pool2d backward: {t:.3} ms ({:.1} GB/s)", 2.25 * mb / t);
    let g = ctx.full(&[32], 1.0).unwrap();
    let b = ctx.full(&[32], 0.0).unwrap();
    let t = median(|| drop(ctx.batch_norm(&x, &g, &b, 1e-5).unwrap()));
    println!("batch_norm: {t:.3} ms ({:.1} GB/s)", 4.0 * mb / t);
    let (_, st) = ctx.batch_norm(&x, &g, &b, 1e-5).unwrap();
    let t = median(|| {
        drop(
            ctx.batch_norm_backward(&x, &g, &st.mean, &st.inv_std, &x, true)
                .unwrap(),
        )
    });
    println!("batch_norm backward: {t:.3} ms ({:.1} GB/s)", 6.0 * mb / t);
}
