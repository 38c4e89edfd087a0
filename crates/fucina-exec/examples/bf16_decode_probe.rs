//! Times the bf16 products of one batch-1 decode step of the
//! `qwen3-0.6b-shape` bench model (28 layers of q, k, v, o, gate, up and down
//! projections, then the tied output head of 151936 × 1024), each through
//! `weight_matmul` with one activation row, against a streaming read of a
//! 512 MiB buffer on the same threads, the three alternated round by round so
//! that they see the same machine load; prints the median of each in GB/s
//! and as a fraction of the streaming read, and the speed of the same kernel
//! on a 512 KiB matrix that stays in the L2 cache (a quick probe, not a
//! benchmark).
//!
//! `cargo run --release -p fucina-exec --example bf16_decode_probe -- THREADS [ROUNDS]`

use std::time::Instant;

use fucina_exec::{ExecContext, WeightFormat, WeightMatrix};

const HIDDEN: usize = 1024;
const LAYERS: usize = 28;
const VOCAB: usize = 151_936;
/// `(rows, cols)` of a layer's projections: q, k, v, o, gate, up, down.
const SHAPES: [(usize, usize); 7] = [
    (2048, HIDDEN),
    (1024, HIDDEN),
    (1024, HIDDEN),
    (HIDDEN, 2048),
    (3072, HIDDEN),
    (3072, HIDDEN),
    (HIDDEN, 3072),
];

mod common;
use common::{bf16_bytes, stream_read};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1);
    let rounds: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(7);
    let ctx = ExecContext::with_threads(threads);
    let layers: Vec<Vec<(usize, usize, Vec<u8>)>> = (0..LAYERS)
        .map(|l| {
            SHAPES
                .iter()
                .enumerate()
                .map(|(i, &(r, c))| (r, c, bf16_bytes(r * c, (l * 7 + i) as u64)))
                .collect()
        })
        .collect();
    let head = bf16_bytes(VOCAB * HIDDEN, 999);
    let buf = vec![1.0f32; 512 << 18];
    let x: Vec<f32> = (0..3072)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let mut out = vec![0.0f32; VOCAB];
    let layer_bytes: usize = layers.iter().flatten().map(|(_, _, b)| b.len()).sum();
    // A matrix that stays in the L2 cache (512 KiB), for the kernel's own speed.
    let hot = bf16_bytes(256 * HIDDEN, 5);
    let (mut ts, mut tl, mut th, mut tc) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    stream_read(&buf, threads);
    for round in 0..rounds + 1 {
        let s = stream_read(&buf, threads);
        let t = Instant::now();
        for (r, c, b) in layers.iter().flatten() {
            let w = WeightMatrix::new(WeightFormat::BF16, *r, *c, b).unwrap();
            ctx.weight_matmul(&x[..*c], 1, &w, &mut out[..*r]).unwrap();
        }
        let l = layer_bytes as f64 / t.elapsed().as_secs_f64();
        let t = Instant::now();
        let w = WeightMatrix::new(WeightFormat::BF16, VOCAB, HIDDEN, &head).unwrap();
        ctx.weight_matmul(&x[..HIDDEN], 1, &w, &mut out).unwrap();
        let h = head.len() as f64 / t.elapsed().as_secs_f64();
        let w = WeightMatrix::new(WeightFormat::BF16, 256, HIDDEN, &hot).unwrap();
        let t = Instant::now();
        for _ in 0..1000 {
            ctx.weight_matmul(&x[..HIDDEN], 1, &w, &mut out[..256])
                .unwrap();
        }
        let c = 1000.0 * hot.len() as f64 / t.elapsed().as_secs_f64();
        if round > 0 {
            ts.push(s);
            tl.push(l);
            th.push(h);
            tc.push(c);
        }
    }
    let (s, l, h, c) = (median(ts), median(tl), median(th), median(tc));
    println!(
        "threads {threads}, {rounds} rounds: stream read {:.2} GB/s; 196 layer products ({:.0} MB) {:.2} GB/s = {:.2}; head ({:.0} MB) {:.2} GB/s = {:.2}; a 512 KiB matrix from L2 {:.2} GB/s",
        s / 1e9,
        layer_bytes as f64 / 1e6,
        l / 1e9,
        l / s,
        head.len() as f64 / 1e6,
        h / 1e9,
        h / s,
        c / 1e9
    );
}
