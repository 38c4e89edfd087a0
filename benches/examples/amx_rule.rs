//! bf16 products with the AMX summation rule at prefill shapes (not a criterion
//! benchmark): `ExecContext::bf16_matmul_amx_rule` on AMX tiles and on its
//! AVX-512 emulation, the f32-activation bf16 `weight_matmul` on the same
//! weights, and the AVX-512 f32 FMA peak, all in one process, on 1 and 2
//! threads. Prints the median GFLOP/s (`2 m k n` per call) with the min-max
//! spread of `PROBE_REPS` calls (default 7) after one warm-up call.
//!
//! `PROBE_THREADS=1` (or `2`) runs one thread count only; `PROBE_AMX_ONLY=1`
//! times only the AMX path (for profiling); `PROBE_SHAPES=0,4` picks shapes by
//! index. Under `FUCINA_SIMD=avx2` (or `portable`) both rule columns time the
//! portable emulation.
//!
//! `cargo run --release -p fucina-benches --example amx_rule`
//!
//! With the argument `decode` it times decode-sized calls instead (`m = 1, 2,
//! 4, 8` rows, `PROBE_MS` to change) on the projections of SmolLM2-135M and
//! TinyLlama-1.1B, each call on another copy of the weights from at least
//! 1 GiB of copies (`PROBE_SPAN_MB`), so that every call reads its weights
//! from memory: the op as dispatched, the op forced onto the AMX tiles, the
//! AVX-512 emulation, and `weight_matmul` (f32 activations) on the same bf16
//! bytes, against a streaming read of a 1 GiB buffer on the same threads.
//! Medians per call with the 10th-90th percentiles; `PROBE_SHAPES=smol` (a
//! substring of the names) filters the shapes.

use std::hint::black_box;
use std::time::{Duration, Instant};

use fucina_benches::{FmaWidth, fma_peak, rand_vec};
use fucina_exec::{
    ExecContext, PackedBf16Matrix, WeightFormat, WeightMatrix, amx_available, amx_rule_path,
    amx_rule_path_for, force_amx, set_amx_rule_min_rows,
};

/// Median, min and max GFLOP/s of `reps` timed calls after a warm-up.
fn time(reps: usize, flops: f64, mut f: impl FnMut()) -> (f64, f64, f64) {
    f();
    let mut v: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            flops / t.elapsed().as_secs_f64() / 1e9
        })
        .collect();
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("decode") {
        decode();
        return;
    }
    let reps: usize = std::env::var("PROBE_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    let cpu = fucina_benches::cpu_model();
    println!(
        "CPU: {cpu}; AMX available: {}; path before any switch: {}",
        amx_available(),
        amx_rule_path()
    );
    let shapes = [
        ("TinyLlama q/o", 128, 2048, 2048),
        ("TinyLlama up/gate", 128, 2048, 5632),
        ("TinyLlama q/o", 512, 2048, 2048),
        ("TinyLlama up/gate", 512, 2048, 5632),
        ("SmolLM2 up/gate", 128, 576, 1536),
        ("SmolLM2 up/gate", 512, 576, 1536),
    ];
    let only: Option<usize> = std::env::var("PROBE_THREADS")
        .ok()
        .and_then(|v| v.parse().ok());
    let amx_only = std::env::var("PROBE_AMX_ONLY").is_ok_and(|v| v == "1");
    for threads in [1usize, 2] {
        if only.is_some_and(|t| t != threads) {
            continue;
        }
        let peak = fma_peak(FmaWidth::Avx512, threads, 3_000_000, 5).unwrap_or(0.0);
        println!("\n{threads} thread(s): AVX-512 f32 FMA peak {peak:.1} GFLOP/s");
        println!(
            "{:20} {:>16} | {:>26} | {:>26} | {:>26} | amx/emu amx/wm amx/peak",
            "shape", "m x k x n", "AMX", "AVX-512 emulation", "weight_matmul bf16"
        );
        let ctx = ExecContext::with_threads(threads);
        let picked: Option<Vec<usize>> = std::env::var("PROBE_SHAPES")
            .ok()
            .map(|v| v.split(',').filter_map(|i| i.trim().parse().ok()).collect());
        for (si, &(name, m, k, n)) in shapes.iter().enumerate() {
            if picked.as_ref().is_some_and(|p| !p.contains(&si)) {
                continue;
            }
            let x = rand_vec(1, m * k);
            let wf = rand_vec(2, n * k);
            let bytes: Vec<u8> = wf
                .iter()
                .flat_map(|v| (((v * 0.05).to_bits() >> 16) as u16).to_le_bytes())
                .collect();
            let w = WeightMatrix::new(WeightFormat::BF16, n, k, &bytes).expect("weights");
            let t0 = Instant::now();
            let packed = PackedBf16Matrix::new(&w).expect("pack");
            let pack_ms = t0.elapsed().as_secs_f64() * 1e3;
            let flops = 2.0 * (m * k * n) as f64;
            let mut out = vec![0.0f32; m * n];
            let mut run_rule = |amx: bool| {
                if !force_amx(amx) {
                    return None;
                }
                let path = amx_rule_path();
                let r = time(reps, flops, || {
                    ctx.bf16_matmul_amx_rule(&x, m, &packed, &mut out)
                        .expect("amx rule");
                });
                Some((r, path))
            };
            let amx = run_rule(true);
            if amx_only {
                println!("{name:20} {m}x{k}x{n}: AMX {:?}", amx.map(|r| r.0));
                continue;
            }
            let emu = run_rule(false);
            force_amx(amx_available());
            let mut out2 = vec![0.0f32; m * n];
            let wm = time(reps, flops, || {
                ctx.weight_matmul(&x, m, &w, &mut out2)
                    .expect("weight_matmul");
            });
            let fmt = |r: Option<((f64, f64, f64), &str)>| match r {
                Some(((med, lo, hi), path)) => format!("{med:7.1} ({lo:.0}-{hi:.0}) [{path}]"),
                None => "n/a".into(),
            };
            let amx_med = amx.map(|r| r.0.0).unwrap_or(f64::NAN);
            let emu_med = emu.map(|r| r.0.0).unwrap_or(f64::NAN);
            println!(
                "{name:20} {:>16} | {:>26} | {:>26} | {:>26} | {:6.1}x {:6.1}x {:6.2}x   (pack {pack_ms:.1} ms)",
                format!("{m}x{k}x{n}"),
                fmt(amx),
                fmt(emu),
                format!("{:7.1} ({:.0}-{:.0})", wm.0, wm.1, wm.2),
                amx_med / emu_med,
                amx_med / wm.0,
                amx_med / peak,
            );
        }
    }
}

// ------------------------------------------------------------------ decode

/// `(name, rows n, cols k)`: the projections of the two models.
const DECODE_SHAPES: [(&str, usize, usize); 10] = [
    ("smol q/o", 576, 576),
    ("smol k/v", 192, 576),
    ("smol gate/up", 1536, 576),
    ("smol down", 576, 1536),
    ("smol head", 49152, 576),
    ("tiny q/o", 2048, 2048),
    ("tiny k/v", 256, 2048),
    ("tiny gate/up", 5632, 2048),
    ("tiny down", 2048, 5632),
    ("tiny head", 32000, 2048),
];

/// The sum of `c` as eight interleaved sequential streams (its eighths),
/// eight AVX-512 accumulators where the CPU has them.
fn sum_streams(c: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the feature was just detected.
            return unsafe { sum_streams_avx512(c) };
        }
    }
    c.iter().sum()
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

/// Median, 10th and 90th percentile of `t` (sorted in place).
fn stats(t: &mut [Duration]) -> (Duration, Duration, Duration) {
    t.sort();
    let at = |q: f64| t[((t.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.1), at(0.9))
}

/// Streaming-read bandwidth (GB/s) of `threads` threads over `buf`: median,
/// p10, p90 of 9 sums after a warm-up.
fn stream_gbs(buf: &[f32], threads: usize) -> (f64, f64, f64) {
    let part = buf.len().div_ceil(threads);
    let run = || {
        std::thread::scope(|s| {
            let hs: Vec<_> = buf
                .chunks(part)
                .map(|c| s.spawn(move || sum_streams(c)))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum::<f32>()
        })
    };
    black_box(run());
    let mut t: Vec<Duration> = (0..9)
        .map(|_| {
            let s = Instant::now();
            black_box(run());
            s.elapsed()
        })
        .collect();
    let (med, lo, hi) = stats(&mut t);
    let gbs = |d: Duration| std::mem::size_of_val(buf) as f64 / d.as_secs_f64() / 1e9;
    (gbs(med), gbs(hi), gbs(lo))
}

/// Times `f(copy)` over the copies in turn (at least 25 calls and 0.3 s, at
/// most 3000) after 3 warm-up calls: median, p10, p90 per call.
fn time_calls(copies: usize, mut f: impl FnMut(usize)) -> (Duration, Duration, Duration) {
    for c in 0..3 {
        f(c % copies);
    }
    let mut times = Vec::new();
    let begin = Instant::now();
    let mut c = 3;
    while times.len() < 3000 && (times.len() < 25 || begin.elapsed() < Duration::from_millis(300)) {
        let s = Instant::now();
        f(c % copies);
        times.push(s.elapsed());
        c += 1;
    }
    stats(&mut times)
}

fn decode() {
    let env = |k: &str| std::env::var(k).ok();
    let span = env("PROBE_SPAN_MB")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1024)
        << 20;
    let ms: Vec<usize> = env("PROBE_MS")
        .map(|v| v.split(',').filter_map(|t| t.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2, 4, 8]);
    let filter = env("PROBE_SHAPES");
    let only: Option<usize> = env("PROBE_THREADS").and_then(|v| v.parse().ok());
    let threads_set: Vec<usize> = [1, 2]
        .into_iter()
        .filter(|t| only.is_none_or(|o| o == *t))
        .collect();
    println!(
        "CPU: {}; AMX available: {}; path for 1 row: {}, for 64 rows: {}",
        fucina_benches::cpu_model(),
        amx_available(),
        amx_rule_path_for(1),
        amx_rule_path_for(64)
    );
    let stream = vec![1.0f32; (1usize << 30) / 4];
    let bw: Vec<(f64, f64, f64)> = threads_set
        .iter()
        .map(|&t| stream_gbs(&stream, t))
        .collect();
    for (t, b) in threads_set.iter().zip(&bw) {
        println!(
            "stream read, {t} thread(s): {:.2} GB/s (p10-p90 {:.2}-{:.2})",
            b.0, b.1, b.2
        );
    }
    drop(stream);
    let ctxs: Vec<ExecContext> = threads_set
        .iter()
        .map(|&t| ExecContext::with_threads(t))
        .collect();
    let default_min = set_amx_rule_min_rows(0);
    set_amx_rule_min_rows(default_min);
    println!(
        "\nGB/s = n·k·2 weight bytes / median time per call (p10-p90 in brackets); \
         'of stream' = the op as dispatched over the same-thread streaming read"
    );
    println!(
        "| shape | n x k | m | threads | op as dispatched | op on AMX tiles | AVX-512 emulation | weight_matmul bf16 | of stream |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for &(name, n, k) in DECODE_SHAPES.iter() {
        if filter.as_ref().is_some_and(|f| !name.contains(f.as_str())) {
            continue;
        }
        let bytes = n * k * 2;
        let copies = span.div_ceil(bytes).max(2);
        let mut raw = vec![0u8; copies * bytes];
        let src = rand_vec(7, n * k);
        for (c, v) in raw[..bytes].chunks_exact_mut(2).zip(&src) {
            c.copy_from_slice(&(((v * 0.05).to_bits() >> 16) as u16).to_le_bytes());
        }
        drop(src);
        let (first, rest) = raw.split_at_mut(bytes);
        for c in rest.chunks_exact_mut(bytes) {
            c.copy_from_slice(first);
        }
        let mats: Vec<WeightMatrix<'_>> = raw
            .chunks_exact(bytes)
            .map(|b| WeightMatrix::new(WeightFormat::BF16, n, k, b).expect("weights"))
            .collect();
        let p0 = PackedBf16Matrix::new(&mats[0]).expect("pack");
        let packed: Vec<PackedBf16Matrix> = (0..copies).map(|_| p0.clone()).collect();
        drop(p0);
        for &m in &ms {
            let x: Vec<f32> = rand_vec(3, m * k);
            let mut out = vec![0.0f32; m * n];
            for (ti, &threads) in threads_set.iter().enumerate() {
                let ctx = &ctxs[ti];
                let mut rule = |amx: bool, min_rows: usize| {
                    if !force_amx(amx) {
                        return None;
                    }
                    set_amx_rule_min_rows(min_rows);
                    let path = amx_rule_path_for(m);
                    let r = time_calls(copies, |c| {
                        ctx.bf16_matmul_amx_rule(black_box(&x), m, &packed[c], &mut out)
                            .expect("amx rule");
                        black_box(&out);
                    });
                    Some((r, path))
                };
                let dispatched = rule(amx_available(), default_min);
                let on_amx = rule(true, 0);
                let emu = rule(false, default_min);
                force_amx(amx_available());
                set_amx_rule_min_rows(default_min);
                let wm = time_calls(copies, |c| {
                    ctx.weight_matmul(black_box(&x), m, &mats[c], &mut out)
                        .expect("weight_matmul");
                    black_box(&out);
                });
                let gbs = |d: Duration| bytes as f64 / d.as_secs_f64() / 1e9;
                let cell = |r: (Duration, Duration, Duration)| {
                    format!(
                        "{:.1} us {:.2} GB/s ({:.2}-{:.2})",
                        r.0.as_secs_f64() * 1e6,
                        gbs(r.0),
                        gbs(r.2),
                        gbs(r.1)
                    )
                };
                let fmt = |r: Option<((Duration, Duration, Duration), &str)>| match r {
                    Some((r, path)) => format!("{} [{path}]", cell(r)),
                    None => "n/a".into(),
                };
                let of = dispatched.map_or(f64::NAN, |r| gbs(r.0.0) / bw[ti].0);
                println!(
                    "| {name} | {n}x{k} | {m} | {threads} | {} | {} | {} | {} | {of:.2} |",
                    fmt(dispatched),
                    fmt(on_amx),
                    fmt(emu),
                    cell(wm),
                );
            }
        }
    }
}
