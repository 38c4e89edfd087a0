//! Times `quant_matmul` of a K-format matrix (Q4_K, Q5_K, Q6_K, Q3_K, Q2_K,
//! IQ4_XS; the TinyLlama-1.1B FFN shape, 5632 × 2048) at several activation
//! row counts `m`, two ways alternated call by call so that both see the same load: one
//! call of `m` rows (at `m ≥ 8` the level's GEMM where it has one) and the
//! same rows as calls of at most 4 (the four-row tile). Prints the median
//! and the minimum microseconds per activation row of each (a quick probe, not a benchmark).
//! The level is `FUCINA_SIMD`'s.
//!
//! `cargo run --release -p fucina-exec --example q8k_probe -- THREADS [REPS] [M,M,...]`

use std::time::Instant;

use fucina_exec::{ExecContext, QuantFormat};

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

/// The median and the minimum.
fn median(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0])
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = args.get(1).map_or(2, |s| s.parse().expect("THREADS"));
    let reps: usize = args.get(2).map_or(7, |s| s.parse().expect("REPS"));
    let ms: Vec<usize> = args.get(3).map_or(vec![4, 8, 12, 16, 32, 64], |s| {
        s.split(',').map(|v| v.parse().expect("M")).collect()
    });
    let (rows, cols) = (5632usize, 2048usize);
    let ctx = ExecContext::with_threads(threads);
    println!(
        "level {} threads {threads}",
        fucina_exec::simd_level().name()
    );
    for format in [
        QuantFormat::Q4_K,
        QuantFormat::Q5_K,
        QuantFormat::Q6_K,
        QuantFormat::Q3_K,
        QuantFormat::Q2_K,
        QuantFormat::IQ4_XS,
    ] {
        let q = ctx
            .quantize(format, rows, cols, &values(rows * cols, 3))
            .expect("quantize");
        let w = q.matrix();
        for &m in &ms {
            let x = values(m * cols, 5 + m as u64);
            let mut out = vec![0.0f32; m * rows];
            let (mut one, mut split) = (Vec::new(), Vec::new());
            for _ in 0..reps {
                let t = Instant::now();
                ctx.quant_matmul(&x, m, &w, &mut out).expect("product");
                one.push(t.elapsed().as_secs_f64() * 1e6 / m as f64);
                let t = Instant::now();
                for (xc, oc) in x.chunks(4 * cols).zip(out.chunks_mut(4 * rows)) {
                    let mc = xc.len() / cols;
                    ctx.quant_matmul(xc, mc, &w, oc).expect("product");
                }
                split.push(t.elapsed().as_secs_f64() * 1e6 / m as f64);
            }
            let ((a, amin), (b, bmin)) = (median(&mut one), median(&mut split));
            println!(
                "{} m={m:3}: one call {a:7.1} (min {amin:7.1}) us/row, calls of 4 {b:7.1} (min {bmin:7.1}) us/row, ratio of medians {:.2}, of minima {:.2}",
                format.name(),
                b / a,
                bmin / amin
            );
        }
    }
}
