//! `ExecContext::weight_matmul` at the shapes of LLM decoding (SmolLM2-135M and
//! TinyLlama-1.1B projections), against the memory bandwidth measured in the
//! same run.
//!
//! For each shape, format (bf16, f32), batch `m` (1, 8, 64) and thread count (1, 2)
//! it times single calls, each on a different copy of the matrix taken in turn
//! from a buffer larger than the last-level cache (at least 1 GiB of copies), so
//! every call reads its weights from memory. It prints the median time per call,
//! the 10th–90th percentile spread, the weight bytes read per second at the
//! median, and that rate over a streaming read: the sum of a 1 GiB f32 buffer
//! split over the same number of threads, measured in the same run (median of
//! its repetitions).
//!
//! `cargo bench -p fucina-exec --bench weight_matmul` (a plain `main`, not
//! criterion: the table needs the same-run bandwidth beside each row). An
//! argument that is neither a flag nor a number filters the shapes by name
//! (`smol`, `tiny`); `WEIGHT_MATMUL_FORMATS=bf16` runs bf16 alone,
//! `WEIGHT_MATMUL_MS=64` the batch sizes listed (default `1,8,64`). `cargo xtask bench`
//! runs it too (its criterion flags are ignored).

use std::hint::black_box;
use std::time::{Duration, Instant};

use fucina_exec::{ExecContext, WeightFormat, WeightMatrix, simd_level};
use fucina_storage::half::bf16;

/// The streaming buffer and the minimum span of matrix copies (bytes).
const SPAN: usize = 1 << 30;

/// `(name, rows, cols)`: q/o, gate/up, down and the (tied) head of each model.
const SHAPES: [(&str, usize, usize); 8] = [
    ("smol q/o 576x576", 576, 576),
    ("smol gate/up 1536x576", 1536, 576),
    ("smol down 576x1536", 576, 1536),
    ("smol head 49152x576", 49152, 576),
    ("tiny q/o 2048x2048", 2048, 2048),
    ("tiny gate/up 5632x2048", 5632, 2048),
    ("tiny down 2048x5632", 2048, 5632),
    ("tiny head 32000x2048", 32000, 2048),
];

/// Sums `buf` split into `threads` contiguous parts, one per thread, each
/// read as `streams` interleaved sequential streams (one stream per part, or
/// eight: as many as the matrix kernel reads at once, for the prefetchers).
fn stream_sum(buf: &[f32], threads: usize, streams: usize) -> f32 {
    let part = buf.len().div_ceil(threads);
    if streams > 1 {
        return std::thread::scope(|s| {
            let hs: Vec<_> = buf
                .chunks(part)
                .map(|c| s.spawn(move || sum_streams(c)))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
    }
    std::thread::scope(|s| {
        let hs: Vec<_> = buf
            .chunks(part)
            .map(|c| s.spawn(move || sum_part(c)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    })
}

/// The sum of `c`, read at the widest vector level the CPU has (eight
/// independent vector accumulators, so the loads, not the adds, set the pace).
fn sum_part(c: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the feature was just detected.
            return unsafe { sum_avx512(c) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the feature was just detected.
            return unsafe { sum_avx2(c) };
        }
    }
    sum_lanes::<128>(c)
}

/// The sum of `c` read as eight interleaved streams (its eighths, 64 bytes
/// from each in turn).
fn sum_streams(c: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the feature was just detected.
            return unsafe { sum_streams_avx512(c) };
        }
    }
    let eighth = c.len() / 8;
    let (head, rest) = c.split_at(eighth * 8);
    let mut acc = [[0.0f32; 16]; 8];
    for j in (0..eighth / 16 * 16).step_by(16) {
        for (s, a) in acc.iter_mut().enumerate() {
            for (l, v) in a.iter_mut().enumerate() {
                *v += head[s * eighth + j + l];
            }
        }
    }
    let tail: f32 = (0..8)
        .map(|s| {
            head[s * eighth + eighth / 16 * 16..(s + 1) * eighth]
                .iter()
                .sum::<f32>()
        })
        .sum();
    acc.iter().flatten().sum::<f32>() + tail + rest.iter().sum::<f32>()
}

/// [`sum_streams`] with AVX-512 loads.
///
/// # Safety
/// The CPU has avx512f.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_streams_avx512(c: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let eighth = c.len() / 8 / 16 * 16;
    let mut acc = [_mm512_setzero_ps(); 8];
    let p = c.as_ptr();
    for j in (0..eighth).step_by(16) {
        for (s, a) in acc.iter_mut().enumerate() {
            // SAFETY: `s * eighth + j + 16 <= 8 * eighth <= c.len()`.
            *a = _mm512_add_ps(*a, unsafe { _mm512_loadu_ps(p.add(s * eighth + j)) });
        }
    }
    let mut total = 0.0;
    for a in acc {
        total += _mm512_reduce_add_ps(a);
    }
    total + c[8 * eighth..].iter().sum::<f32>()
}

/// `N` scalar accumulators (vectorised by the compiler at the function's level).
#[inline(always)]
fn sum_lanes<const N: usize>(c: &[f32]) -> f32 {
    let mut acc = [0.0f32; N];
    let mut it = c.chunks_exact(N);
    for v in &mut it {
        for (a, x) in acc.iter_mut().zip(v) {
            *a += x;
        }
    }
    acc.iter().sum::<f32>() + it.remainder().iter().sum::<f32>()
}

/// [`sum_lanes`] compiled for AVX-512 (8 zmm accumulators).
///
/// # Safety
/// The CPU has avx512f.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_avx512(c: &[f32]) -> f32 {
    sum_lanes::<128>(c)
}

/// [`sum_lanes`] compiled for AVX2 (8 ymm accumulators).
///
/// # Safety
/// The CPU has avx2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_avx2(c: &[f32]) -> f32 {
    sum_lanes::<64>(c)
}

/// Median and 10th / 90th percentiles of `t` (sorted in place).
fn stats(t: &mut [Duration]) -> (Duration, Duration, Duration) {
    t.sort();
    let at = |q: f64| t[((t.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.1), at(0.9))
}

/// Streaming-read bandwidth (bytes/s) of `threads` threads: median of 9 sums.
fn stream_bandwidth(buf: &[f32], threads: usize, streams: usize) -> (f64, f64, f64) {
    black_box(stream_sum(buf, threads, streams)); // warm-up
    let mut t: Vec<Duration> = (0..9)
        .map(|_| {
            let s = Instant::now();
            black_box(stream_sum(black_box(buf), threads, streams));
            s.elapsed()
        })
        .collect();
    let (med, lo, hi) = stats(&mut t);
    let bytes = std::mem::size_of_val(buf) as f64;
    let bw = |d: Duration| bytes / d.as_secs_f64();
    (bw(med), bw(hi), bw(lo))
}

/// Fills `buf` with the bytes of pseudo-random values in [-1, 1) in `format`.
fn fill(buf: &mut [u8], format: WeightFormat) {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    match format {
        WeightFormat::F32 => {
            for c in buf.chunks_exact_mut(4) {
                c.copy_from_slice(&next().to_le_bytes());
            }
        }
        _ => {
            for c in buf.chunks_exact_mut(2) {
                c.copy_from_slice(&bf16::from_f32(next()).to_bits().to_le_bytes());
            }
        }
    }
}

fn main() {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        // Criterion-style flags and their numeric values (`cargo xtask bench`
        // passes `--measurement-time 3`) are not filters.
        .filter(|a| !a.starts_with('-') && a.parse::<f64>().is_err())
        .collect();
    let shapes: Vec<_> = SHAPES
        .iter()
        .filter(|(n, _, _)| filter.is_empty() || filter.iter().any(|f| n.contains(f.as_str())))
        .collect();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    println!("cpu: {cpu}; vector level: {:?}", simd_level());

    let stream = vec![1.0f32; SPAN / 4];
    let threads_set = [1usize, 2];
    // The limit: the faster of a one-stream and an eight-stream read.
    let mut bw: Vec<(f64, f64, f64)> = Vec::new();
    for &t in &threads_set {
        let mut best = (0.0, 0.0, 0.0);
        for streams in [1, 8] {
            let (med, lo, hi) = stream_bandwidth(&stream, t, streams);
            println!(
                "stream read, {t} thread(s), {streams} stream(s) each: {:.2} GB/s (p10-p90 {:.2}-{:.2})",
                med / 1e9,
                lo / 1e9,
                hi / 1e9
            );
            if med > best.0 {
                best = (med, lo, hi);
            }
        }
        bw.push(best);
    }
    drop(stream);

    let max_bytes = shapes.iter().map(|s| s.1 * s.2 * 4).max().unwrap_or(0);
    // At least SPAN of copies of any matrix (the largest is well under SPAN / 2).
    let mut buf = vec![0u8; SPAN + 2 * max_bytes];
    let ctxs: Vec<ExecContext> = threads_set
        .iter()
        .map(|&t| ExecContext::with_threads(t))
        .collect();
    println!(
        "| shape | format | m | threads | median | p10-p90 | weight GB/s | of stream | GFLOP/s | same matrix (hot) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    // `WEIGHT_MATMUL_MS=1,8,64`: the batch sizes (64: an LLM prefill chunk).
    let ms: Vec<usize> = std::env::var("WEIGHT_MATMUL_MS")
        .ok()
        .map(|v| v.split(',').filter_map(|t| t.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 8, 64]);
    let formats: &[WeightFormat] = match std::env::var("WEIGHT_MATMUL_FORMATS").as_deref() {
        Ok("bf16") => &[WeightFormat::BF16],
        _ => &[WeightFormat::BF16, WeightFormat::F32],
    };
    for &format in formats {
        fill(&mut buf, format);
        for &&(name, rows, cols) in &shapes {
            let bytes = rows * cols * format.size_bytes();
            let copies = buf.len() / bytes;
            let mats: Vec<WeightMatrix<'_>> = (0..copies)
                .map(|c| {
                    WeightMatrix::new(format, rows, cols, &buf[c * bytes..(c + 1) * bytes]).unwrap()
                })
                .collect();
            for &m in &ms {
                let x: Vec<f32> = (0..m * cols)
                    .map(|i| (i % 7) as f32 * 0.25 - 0.75)
                    .collect();
                let mut out = vec![0.0f32; m * rows];
                for (ti, &t) in threads_set.iter().enumerate() {
                    let ctx = &ctxs[ti];
                    // Warm-up: one pass over a few copies (team start, pool).
                    for w in mats.iter().take(3) {
                        ctx.weight_matmul(&x, m, w, &mut out).unwrap();
                    }
                    // At least 25 calls and 0.4 s, at most 2000 calls.
                    let mut times = Vec::new();
                    let begin = Instant::now();
                    let mut c = 3;
                    while times.len() < 2000
                        && (times.len() < 25 || begin.elapsed() < Duration::from_millis(400))
                    {
                        let w = &mats[c % copies];
                        c += 1;
                        let s = Instant::now();
                        ctx.weight_matmul(black_box(&x), m, w, &mut out).unwrap();
                        times.push(s.elapsed());
                        black_box(&out);
                    }
                    let (med, lo, hi) = stats(&mut times);
                    let gbs = bytes as f64 / med.as_secs_f64() / 1e9;
                    // The same matrix every call (in the caches when it fits).
                    let mut hot = Vec::new();
                    for _ in 0..(times.len() / 2).clamp(10, 400) {
                        let s = Instant::now();
                        ctx.weight_matmul(black_box(&x), m, &mats[0], &mut out)
                            .unwrap();
                        hot.push(s.elapsed());
                        black_box(&out);
                    }
                    let (hot_med, _, _) = stats(&mut hot);
                    println!(
                        "| {name} | {} | {m} | {t} | {:.1} us | {:.1}-{:.1} us | {gbs:.2} | {:.2} | {:.1} | {:.1} us |",
                        format.name(),
                        med.as_secs_f64() * 1e6,
                        lo.as_secs_f64() * 1e6,
                        hi.as_secs_f64() * 1e6,
                        gbs * 1e9 / bw[ti].0,
                        2.0 * (m * rows * cols) as f64 / med.as_secs_f64() / 1e9,
                        hot_med.as_secs_f64() * 1e6,
                    );
                }
            }
        }
    }
}
