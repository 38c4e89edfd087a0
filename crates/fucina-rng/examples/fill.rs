//! Fills a buffer with several fucina-rng mappings, prints summary statistics,
//! and checks determinism (same seed, same bits; any chunking, same bits).
//!
//! Run: `cargo run --release -p fucina-rng --example fill`

use fucina_rng::{
    gaussian_fill, gaussian_fill_at, gaussian_fill_at_fast, gumbel_fill, randint_fill, uniform_fill,
};
use std::time::Instant;

const N: usize = 1 << 20;
const SEED: u64 = 42;

/// Mean, standard deviation, min and max of a slice (in f64).
fn stats(v: &[f32]) -> (f64, f64, f32, f32) {
    let n = v.len() as f64;
    let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
    let var = v
        .iter()
        .map(|&x| (f64::from(x) - mean).powi(2))
        .sum::<f64>()
        / n;
    let min = v.iter().copied().fold(f32::INFINITY, f32::min);
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    (mean, var.sqrt(), min, max)
}

/// FNV-1a over the f32 bit patterns: a fingerprint of the exact bits.
fn fingerprint(v: &[f32]) -> u64 {
    v.iter()
        .flat_map(|x| x.to_bits().to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
}

fn report(name: &str, expect: &str, v: &[f32], ms: f64) {
    let (mean, sd, min, max) = stats(v);
    println!(
        "{name:<34} mean {mean:+.4}  sd {sd:.4}  min {min:+.4}  max {max:+.4}  bits {:016x}  {ms:6.2} ms  ({expect})",
        fingerprint(v)
    );
}

/// Whether two slices hold the same f32 bit patterns.
fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Fills `buf` window by window with `fill(first_index, window)`, the window
/// lengths starting at `chunk` and growing by `next`.
fn fill_chunked(
    buf: &mut [f32],
    mut chunk: usize,
    next: impl Fn(usize) -> usize,
    mut fill: impl FnMut(u64, &mut [f32]),
) {
    let mut start = 0;
    while start < buf.len() {
        let len = chunk.min(buf.len() - start);
        fill(start as u64, &mut buf[start..start + len]);
        start += len;
        chunk = next(chunk);
    }
}

fn timed(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64() * 1e3
}

fn main() {
    let mut buf = vec![0.0f32; N];
    println!("fucina-rng: {N} f32 per mapping, seed {SEED}\n");

    let ms = timed(|| gaussian_fill(SEED, &mut buf, 1.0));
    report(
        "gaussian_fill (exact, f64)",
        "expect mean 0, sd 1",
        &buf,
        ms,
    );
    let exact = buf.clone();

    let ms = timed(|| gaussian_fill_at_fast(SEED, 0, &mut buf, 1.0));
    report(
        "gaussian_fill_at_fast (vector f32)",
        "expect mean 0, sd 1",
        &buf,
        ms,
    );
    let worst = buf
        .iter()
        .zip(&exact)
        .map(|(a, b)| (a - b).abs() / b.abs().max(1.0))
        .fold(0.0f32, f32::max);
    let fast = buf.clone();

    let ms = timed(|| uniform_fill(SEED, &mut buf, -1.0, 1.0));
    report("uniform_fill [-1, 1)", "expect mean 0, sd 0.5774", &buf, ms);

    let ms = timed(|| gumbel_fill(SEED, &mut buf));
    report("gumbel_fill", "expect mean 0.5772, sd 1.2825", &buf, ms);

    let mut ints = vec![0i64; 600_000];
    randint_fill(SEED, &mut ints, 1, 7);
    let mut counts = [0usize; 6];
    for &d in &ints {
        counts[(d - 1) as usize] += 1;
    }
    println!(
        "randint_fill [1, 7) x {}: counts {counts:?} (expect ~100000 each)",
        ints.len()
    );

    println!(
        "\nfast vs exact Gaussian: worst relative difference {worst:.2e} (contract: a few ulps)"
    );

    // Determinism: refill, and refill in odd-sized windows, and compare bits.
    let mut again = vec![0.0f32; N];
    gaussian_fill(SEED, &mut again, 1.0);
    let same_exact = same_bits(&again, &exact);
    fill_chunked(
        &mut again,
        1,
        |c| c * 3 + 1,
        |first, w| {
            gaussian_fill_at(SEED, first, w, 1.0);
        },
    );
    let chunked_exact = same_bits(&again, &exact);
    fill_chunked(
        &mut again,
        5,
        |c| c * 2 + 3,
        |first, w| {
            gaussian_fill_at_fast(SEED, first, w, 1.0);
        },
    );
    let chunked_fast = same_bits(&again, &fast);
    let ok = |b: bool| if b { "identical bits" } else { "MISMATCH" };
    println!(
        "determinism: refill {}, chunked exact {}, chunked fast {}",
        ok(same_exact),
        ok(chunked_exact),
        ok(chunked_fast)
    );
    if !(same_exact && chunked_exact && chunked_fast) {
        std::process::exit(1);
    }
}
