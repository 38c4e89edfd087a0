//! `quant_matmul` at LLM shapes against the streaming-read bandwidth of the same
//! run, and its accuracy against the f32 product.
//!
//! `cargo bench -p fucina-exec --bench quant_matmul` (`QUANT_BENCH_QUICK=1`
//! for a short smoke run; `QUANT_BENCH_THREADS=1,2` to pick team sizes;
//! `QUANT_BENCH_MS=1,8,512` to pick activation rows per call;
//! `QUANT_BENCH_FORMATS=q8_0,q4_0,q4_k,q6_k` to pick formats, default q8_0 and
//! q4_0; the formats that are not repacked have no packed column).
//!
//! - **Bandwidth**: a buffer of 640 MiB (larger than the 480 MiB last-level
//!   cache of the machine the figures were taken on) summed as `u64` words by
//!   `t` threads, each its own contiguous part; bytes / second.
//! - **quant_matmul**: the same 640 MiB hold as many copies of the weight
//!   matrix as fit, used in turn, so every call reads its weights from memory,
//!   not from a cache; weight GB/s = matrix bytes / time per call, for decode
//!   (`m = 1`) and a small batch (`m = 8`). The weight bytes are random with
//!   normal f16 scales (the speed does not depend on the values).
//! - **quant_matmul_packed**: the same copies repacked once each by
//!   `repack_quant` (the `StableProcess` path), timed in alternation with the
//!   in-place kernel: sample `s` of the in-place kernel, then sample `s` of the
//!   packed one, and so on, so both see the same state of the machine; the
//!   speedup is the median of the per-sample ratios. Weight GB/s counts the
//!   llama.cpp bytes of the matrix for both (the packed copy holds the same
//!   bytes plus alignment padding).
//! - Each figure is the median of 15 samples (each at least 64 MiB of
//!   weights), with the slowest and fastest sample.
//! - **Accuracy**: `max |quant_matmul - Σ x w|` (the exact sum in f64) on
//!   random weights uniform in `[-0.05, 0.05)` quantized by `ctx.quantize`, and
//!   activations uniform in `[-1, 1)`, with `max |Σ x w|` beside it.

use std::hint::black_box;
use std::time::Instant;

use fucina_exec::{ExecContext, PackedQuantMatrix, QuantFormat, QuantMatrix};

const POOL_BYTES: usize = 640 << 20;
const SAMPLE_BYTES: usize = 64 << 20;

const SHAPES: [(usize, usize); 10] = [
    (576, 576),
    (192, 576),
    (1536, 576),
    (576, 1536),
    (49152, 576),
    (2048, 2048),
    (256, 2048),
    (5632, 2048),
    (2048, 5632),
    (32000, 2048),
];

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// Median, min and max of `v` (sorted in place).
fn stats(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// GB/s of summing `buf` with `threads` threads (median, min, max of `n` runs).
fn stream_read(buf: &[u64], threads: usize, n: usize) -> (f64, f64, f64) {
    let mut gbs = Vec::new();
    for _ in 0..n + 1 {
        let t0 = Instant::now();
        let part = buf.len().div_ceil(threads);
        let total: u64 = std::thread::scope(|s| {
            let hs: Vec<_> = buf
                .chunks(part)
                .map(|c| s.spawn(move || c.iter().fold(0u64, |a, &x| a.wrapping_add(x))))
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap())
                .fold(0, u64::wrapping_add)
        });
        black_box(total);
        gbs.push((buf.len() * 8) as f64 / t0.elapsed().as_secs_f64() / 1e9);
    }
    gbs.remove(0); // warm-up
    stats(&mut gbs)
}

fn main() {
    let quick = std::env::var_os("QUANT_BENCH_QUICK").is_some();
    let threads: Vec<usize> = std::env::var("QUANT_BENCH_THREADS")
        .ok()
        .map(|s| s.split(',').filter_map(|t| t.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2]);
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    println!("CPU: {cpu}; simd level {:?}", fucina_exec::simd_level());

    if std::env::var_os("QUANT_BENCH_HOT").is_some() {
        hot();
        return;
    }
    if std::env::var_os("QUANT_BENCH_SHAPES").is_none() {
        accuracy();
    }

    let pool_bytes = if quick { 80 << 20 } else { POOL_BYTES };
    let mut words = vec![0u64; pool_bytes / 8];
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    for w in &mut words {
        // every byte 0x20..=0x2f or 0xa0..=0xaf: as an f16 high byte a normal
        // number of magnitude 2^-7..2^-5, so any two bytes are a sane scale
        *w = (xorshift(&mut s) & 0x8f8f_8f8f_8f8f_8f8f) | 0x2020_2020_2020_2020;
    }
    let pool: &[u8] = bytemuck::cast_slice(&words);
    let samples = if quick { 3 } else { 15 };
    // activation rows per call: decode (1), a batch (8), prefill-sized (e.g. 512)
    let ms: Vec<usize> = std::env::var("QUANT_BENCH_MS")
        .map(|s| {
            s.split(',')
                .map(|v| v.trim().parse().expect("QUANT_BENCH_MS"))
                .collect()
        })
        .unwrap_or_else(|_| vec![1, 8]);
    let formats: Vec<QuantFormat> = std::env::var("QUANT_BENCH_FORMATS")
        .ok()
        .map(|s| {
            s.split(',')
                .filter_map(|n| QuantFormat::ALL.into_iter().find(|f| f.name() == n.trim()))
                .collect()
        })
        .unwrap_or_else(|| vec![QuantFormat::Q8_0, QuantFormat::Q4_0]);

    for &t in &threads {
        let ctx = ExecContext::with_threads(t);
        let (bw, bw_lo, bw_hi) = stream_read(&words, t, samples);
        println!(
            "\n## {t} thread(s): streaming read {bw:.2} GB/s (min {bw_lo:.2}, max {bw_hi:.2})"
        );
        println!(
            "| shape (rows x cols) | format | m | in place µs | GB/s (min–max) | of bw | packed µs | GB/s (min–max) | of bw | speedup (min–max) |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|");
        let only: Option<Vec<usize>> = std::env::var("QUANT_BENCH_SHAPES")
            .ok()
            .map(|s| s.split(',').filter_map(|t| t.trim().parse().ok()).collect());
        for (si, &(rows, cols)) in SHAPES.iter().enumerate() {
            if only.as_ref().is_some_and(|o| !o.contains(&si)) {
                continue;
            }
            for &format in &formats {
                if !cols.is_multiple_of(format.block_elements()) {
                    continue;
                }
                let mbytes = rows * cols / format.block_elements() * format.block_bytes();
                let copies = (pool_bytes / mbytes).max(1);
                let mats: Vec<QuantMatrix<'_>> = (0..copies)
                    .map(|c| {
                        QuantMatrix::new(format, rows, cols, &pool[c * mbytes..(c + 1) * mbytes])
                            .unwrap()
                    })
                    .collect();
                let packed: Vec<PackedQuantMatrix> = if format.repackable() {
                    mats.iter().map(|w| ctx.repack_quant(w).unwrap()).collect()
                } else {
                    Vec::new()
                };
                for &m in &ms {
                    let mut x = vec![0.0f32; m * cols];
                    fucina_exec::rng::uniform_fill(7, &mut x, -1.0, 1.0);
                    let mut out = vec![0.0f32; m * rows];
                    let mut out_p = vec![0.0f32; m * rows];
                    let calls = SAMPLE_BYTES.div_ceil(mbytes).max(1);
                    let (mut next, mut next_p) = (0, copies / 2);
                    let (mut t_in, mut t_pk, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
                    for _ in 0..samples + 1 {
                        let t0 = Instant::now();
                        for _ in 0..calls {
                            ctx.quant_matmul(&x, m, &mats[next], &mut out).unwrap();
                            next = (next + 1) % copies;
                        }
                        black_box(&out);
                        let a = t0.elapsed().as_secs_f64() / calls as f64;
                        let t0 = Instant::now();
                        for _ in 0..calls {
                            if packed.is_empty() {
                                break;
                            }
                            ctx.quant_matmul_packed(&x, m, &packed[next_p], &mut out_p)
                                .unwrap();
                            next_p = (next_p + 1) % copies;
                        }
                        black_box(&out_p);
                        let b = t0.elapsed().as_secs_f64() / calls as f64;
                        t_in.push(a);
                        t_pk.push(b);
                        ratio.push(a / b);
                    }
                    t_in.remove(0);
                    t_pk.remove(0);
                    ratio.remove(0);
                    let (mi, fi, si_) = stats(&mut t_in);
                    let (mp, fp, sp) = stats(&mut t_pk);
                    let (rm, rlo, rhi) = stats(&mut ratio);
                    let g = |s: f64| mbytes as f64 / s / 1e9;
                    let in_place = format!(
                        "{:.1} | {:.2} ({:.2}–{:.2}) | {:.2}",
                        mi * 1e6,
                        g(mi),
                        g(si_),
                        g(fi),
                        g(mi) / bw
                    );
                    // a format without a packed layout has no packed columns
                    let packed_cols = if packed.is_empty() {
                        "— | — | — | —".to_string()
                    } else {
                        format!(
                            "{:.1} | {:.2} ({:.2}–{:.2}) | **{:.2}** | {rm:.2} ({rlo:.2}–{rhi:.2})",
                            mp * 1e6,
                            g(mp),
                            g(sp),
                            g(fp),
                            g(mp) / bw
                        )
                    };
                    println!(
                        "| {rows}x{cols} | {} | {m} | {in_place} | {packed_cols} |",
                        format.name()
                    );
                }
            }
        }
        let (bw2, bw2_lo, bw2_hi) = stream_read(&words, t, samples);
        println!(
            "\nstreaming read again after the tables: {bw2:.2} GB/s (min {bw2_lo:.2}, max {bw2_hi:.2})"
        );
    }
}

/// Max abs difference of `quant_matmul` from the exact product (f64), 4 rows.
fn accuracy() {
    let ctx = ExecContext::with_threads(1);
    println!("\n## Accuracy (m = 4, w uniform in [-0.05, 0.05), x uniform in [-1, 1))");
    println!("| shape | format | max abs diff | max abs of the product | max rel to max |");
    println!("|---|---|---|---|---|");
    for (rows, cols) in [
        (576usize, 576usize),
        (2048, 2048),
        (576, 1536),
        (2048, 5632),
    ] {
        let mut w = vec![0.0f32; rows * cols];
        fucina_exec::rng::uniform_fill(1, &mut w, -0.05, 0.05);
        let m = 4;
        let mut x = vec![0.0f32; m * cols];
        fucina_exec::rng::uniform_fill(2, &mut x, -1.0, 1.0);
        for format in [QuantFormat::Q8_0, QuantFormat::Q4_0] {
            let q = ctx.quantize(format, rows, cols, &w).unwrap();
            let mut out = vec![0.0f32; m * rows];
            ctx.quant_matmul(&x, m, &q.matrix(), &mut out).unwrap();
            let (mut diff, mut mag) = (0.0f64, 0.0f64);
            for i in 0..m {
                for j in 0..rows {
                    let exact: f64 = (0..cols)
                        .map(|k| f64::from(x[i * cols + k]) * f64::from(w[j * cols + k]))
                        .sum();
                    diff = diff.max((f64::from(out[i * rows + j]) - exact).abs());
                    mag = mag.max(exact.abs());
                }
            }
            println!(
                "| {rows}x{cols} | {} | {diff:.3e} | {mag:.3} | {:.2e} |",
                format.name(),
                diff / mag
            );
        }
    }
}

/// Cache-resident weights (one 576x1536 matrix used over and over): the
/// kernels' compute speed, in ns per (block, activation row, weight row).
fn hot() {
    let ctx = ExecContext::with_threads(1);
    let (rows, cols) = (576, 1536);
    let mut w = vec![0.0f32; rows * cols];
    fucina_exec::rng::uniform_fill(1, &mut w, -0.05, 0.05);
    for format in [QuantFormat::Q8_0, QuantFormat::Q4_0] {
        let q = ctx.quantize(format, rows, cols, &w).unwrap();
        for m in [1usize, 4, 8] {
            let mut x = vec![0.0f32; m * cols];
            fucina_exec::rng::uniform_fill(2, &mut x, -1.0, 1.0);
            let mut out = vec![0.0f32; m * rows];
            let packed = ctx.repack_quant(&q.matrix()).unwrap();
            let (mut per, mut per_p) = (Vec::new(), Vec::new());
            for _ in 0..9 {
                let t0 = Instant::now();
                for _ in 0..200 {
                    ctx.quant_matmul(&x, m, &q.matrix(), &mut out).unwrap();
                }
                per.push(t0.elapsed().as_secs_f64() / 200.0);
                let t0 = Instant::now();
                for _ in 0..200 {
                    ctx.quant_matmul_packed(&x, m, &packed, &mut out).unwrap();
                }
                per_p.push(t0.elapsed().as_secs_f64() / 200.0);
            }
            let pairs = (m * rows * cols / 32) as f64;
            for (name, v) in [("in place", &mut per), ("packed", &mut per_p)] {
                let (med, _, _) = stats(v);
                println!(
                    "hot {} m={m} {name}: {:.1} us/call, {:.3} ns per block pair, {:.2} weight GB/s",
                    format.name(),
                    med * 1e6,
                    med * 1e9 / pairs,
                    q.bytes().len() as f64 / med / 1e9
                );
            }
        }
    }
}
