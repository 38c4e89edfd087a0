//! Home of the criterion benchmarks that span several fucina crates and of the
//! peer comparisons (see `benches/README.md`), plus the FMA-peak probe the
//! matmul benchmark divides by.
//!
//! # The FMA peak
//! [`fma_peak`] runs independent fused multiply-add chains (16 accumulator
//! registers per thread: more than latency x throughput on every current x86
//! core, so the FMA ports never wait for a result) for a fixed number of
//! iterations on 1 or more threads (`std::thread::scope`), and reports the best
//! GFLOP/s over a few repetitions. It is measured, never assumed: on Intel
//! server cores with two 512-bit FMA units the AVX-512 figure is twice the AVX2
//! one; on cores that split 512-bit instructions into two 256-bit halves (AMD
//! Zen 4) the two are equal. [`Peak::best`] is the larger of the two.

use std::hint::black_box;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The vector width of an FMA-peak probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FmaWidth {
    /// 256-bit `vfmadd` (AVX2 + FMA): 8 f32 lanes.
    Avx2,
    /// 512-bit `vfmadd` (AVX-512F): 16 f32 lanes.
    Avx512,
}

impl FmaWidth {
    /// Whether this CPU can run the probe (detected at run time).
    pub fn supported(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                FmaWidth::Avx2 => {
                    std::arch::is_x86_feature_detected!("avx2")
                        && std::arch::is_x86_feature_detected!("fma")
                }
                FmaWidth::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// f32 lanes per instruction.
    pub fn lanes(self) -> usize {
        match self {
            FmaWidth::Avx2 => 8,
            FmaWidth::Avx512 => 16,
        }
    }
}

/// Accumulator registers per thread (independent FMA chains).
pub const CHAINS: usize = 16;

/// Runs `iters` rounds of [`CHAINS`] independent FMAs of width `w` on the calling
/// thread and returns a value that depends on every result (so nothing is
/// optimized away). `None` if the CPU lacks `w`.
pub fn fma_chains(w: FmaWidth, iters: u64) -> Option<f32> {
    if !w.supported() {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `supported()` just confirmed the CPU features each function's
        // `target_feature` attribute enables.
        Some(unsafe {
            match w {
                FmaWidth::Avx2 => x86::chains_avx2(iters),
                FmaWidth::Avx512 => x86::chains_avx512(iters),
            }
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = iters;
        None
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::CHAINS;

    /// `acc = acc * m + c` keeps every chain bounded near `c / (1 - m)` (no
    /// overflow, no subnormals), so the FMA units run at full speed.
    #[target_feature(enable = "avx512f")]
    pub(super) fn chains_avx512(iters: u64) -> f32 {
        let m = _mm512_set1_ps(0.999_9);
        let c = _mm512_set1_ps(1e-3);
        let mut acc = [_mm512_setzero_ps(); CHAINS];
        for (i, a) in acc.iter_mut().enumerate() {
            *a = _mm512_set1_ps(i as f32);
        }
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm512_fmadd_ps(*a, m, c);
            }
        }
        let mut s = _mm512_setzero_ps();
        for a in acc {
            s = _mm512_add_ps(s, a);
        }
        _mm512_reduce_add_ps(s)
    }

    /// The 256-bit twin of [`chains_avx512`].
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn chains_avx2(iters: u64) -> f32 {
        let m = _mm256_set1_ps(0.999_9);
        let c = _mm256_set1_ps(1e-3);
        let mut acc = [_mm256_setzero_ps(); CHAINS];
        for (i, a) in acc.iter_mut().enumerate() {
            *a = _mm256_set1_ps(i as f32);
        }
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm256_fmadd_ps(*a, m, c);
            }
        }
        let mut s = _mm256_setzero_ps();
        for a in acc {
            s = _mm256_add_ps(s, a);
        }
        let mut out = [0.0f32; 8];
        // SAFETY: `out` holds 8 f32 = 32 bytes, the size of the unaligned store.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), s) };
        out.iter().sum()
    }
}

/// Flops of one [`fma_chains`] call: 2 per lane per FMA.
pub fn chain_flops(w: FmaWidth, iters: u64) -> f64 {
    2.0 * (w.lanes() * CHAINS) as f64 * iters as f64
}

/// The measured FMA peak of `threads` threads at width `w`, in GFLOP/s: each
/// thread runs [`fma_chains`] for `iters` rounds, all started together; the rate
/// is total flops over the wall time of the slowest thread, best of `reps`
/// repetitions (the best filters out time slices lost to other processes).
/// `None` if the CPU lacks `w`.
pub fn fma_peak(w: FmaWidth, threads: usize, iters: u64, reps: usize) -> Option<f64> {
    if !w.supported() {
        return None;
    }
    let threads = threads.max(1);
    let mut best = 0.0f64;
    for _ in 0..reps.max(1) {
        let start = Instant::now();
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|_| s.spawn(move || black_box(fma_chains(w, black_box(iters)))))
                .collect();
            for h in handles {
                let _ = h.join();
            }
        });
        let secs = start.elapsed().as_secs_f64();
        best = best.max(chain_flops(w, iters) * threads as f64 / secs / 1e9);
    }
    Some(best)
}

/// Measured peaks of one thread count.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Peak {
    /// Threads that ran the probe together.
    pub threads: usize,
    /// 256-bit FMA peak, GFLOP/s (`None` without AVX2 + FMA).
    pub avx2: Option<f64>,
    /// 512-bit FMA peak, GFLOP/s (`None` without AVX-512F).
    pub avx512: Option<f64>,
}

impl Peak {
    /// The larger of the two widths (0 if neither runs here).
    pub fn best(&self) -> f64 {
        self.avx2.unwrap_or(0.0).max(self.avx512.unwrap_or(0.0))
    }

    /// The label of the width [`best`](Peak::best) came from.
    pub fn best_label(&self) -> &'static str {
        match (self.avx2, self.avx512) {
            (_, Some(w)) if w >= self.avx2.unwrap_or(0.0) => "AVX-512",
            (Some(_), _) => "AVX2",
            _ => "none",
        }
    }
}

/// Rounds per thread of one probe repetition (about 30-60 ms on a 3 GHz core).
const PROBE_ITERS: u64 = 6_000_000;

/// The measured peaks for `threads` threads, probed once per process and cached
/// (both widths, best of 5 repetitions each).
pub fn peak(threads: usize) -> Peak {
    static CACHE: OnceLock<std::sync::Mutex<Vec<Peak>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = cache.iter().find(|p| p.threads == threads) {
        return *p;
    }
    let p = Peak {
        threads,
        avx2: fma_peak(FmaWidth::Avx2, threads, PROBE_ITERS, 5),
        avx512: fma_peak(FmaWidth::Avx512, threads, PROBE_ITERS / 2, 5),
    };
    cache.push(p);
    p
}

/// Median wall time of `reps` calls of `f` (after one warm-up call).
pub fn median_time(reps: usize, mut f: impl FnMut()) -> Duration {
    f();
    let mut t: Vec<Duration> = (0..reps.max(1))
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed()
        })
        .collect();
    t.sort();
    t[t.len() / 2]
}

/// Times `f` (median of `reps` calls, `flops` each), prints its GFLOP/s and the
/// fraction of the measured `threads`-thread peak to stderr, and returns
/// `(gflops, fraction)`.
pub fn report_fraction_of_peak(
    label: &str,
    threads: usize,
    flops: f64,
    reps: usize,
    f: impl FnMut(),
) -> (f64, f64) {
    let secs = median_time(reps, f).as_secs_f64();
    let gflops = flops / secs / 1e9;
    let p = peak(threads);
    let frac = gflops / p.best();
    eprintln!(
        "{label}: {gflops:.1} GFLOP/s = {frac:.3} of the {threads}-thread {} peak \
         ({:.1} GFLOP/s; AVX2 {:.1})",
        p.best_label(),
        p.best(),
        p.avx2.unwrap_or(0.0)
    );
    (gflops, frac)
}

/// The CPU's model name as `/proc/cpuinfo` gives it (`"unknown"` where that
/// file or line is missing): what every figure is printed beside.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// `n` benchmark inputs uniform in `[-1, 1)` from the seed (the workspace's own
/// counter-based generator; shared by the peer benchmarks).
pub fn rand_vec(seed: u64, n: usize) -> Vec<f32> {
    let mut v = vec![0.0; n];
    fucina::rng::uniform_fill(seed, &mut v, -1.0, 1.0);
    v
}
