//! The decoder's small kernels on f32 slices: RMSNorm, RoPE, SiLU, the dot
//! product (the attention is [`super::attention`]). Each reduction runs in one fixed order
//! that depends only on its own inputs' lengths (never on threads, batch or the
//! vector level: Rust never fuses or reassociates float operations, so a loop
//! compiled for wider vectors computes every element with the same operations
//! in the same order). The exponential is the crate's own ([`exp`], IEEE
//! operations only); so are the sines, cosines and powers of the RoPE tables
//! (`fmath`: correctly rounded f32 from double-double arithmetic, no C library
//! call).
//!
//! # Vector levels
//! The crate is built for the baseline target (SSE2 on x86_64). The two hot
//! loops of a prefill, the attention and [`swiglu`], are also compiled for
//! AVX-512 and for AVX2 (the `with_simd_level!` macro), and each call takes the level
//! `fucina::exec::simd_level()` names (so `FUCINA_SIMD` lowers it too). Their
//! vectors only hold independent sums side by side, and each operation rounds
//! the same way at every width, so every level gives the same bits (the tests
//! `swiglu_is_the_same_bits_at_every_level` below and the attention's compare
//! every compiled variant). The attention's sums take a fused multiply-add per
//! term at every level, as the GEMM does: a vector instruction at the AVX2 and
//! AVX-512 levels, `f32::mul_add` (exactly rounded, a library call without
//! FMA hardware) at the portable one; every other loop keeps separate
//! multiplies and adds.

use crate::config::RopeScaling;

// Evaluates its body compiled for the process's vector level (fucina-exec's
// dispatch macro).
use fucina::exec::vectorized as with_simd_level;

/// Lanes of the fixed summation order of [`dot`] and [`sum_squares`]: lane `l`
/// takes the terms `i ≡ l (mod 8)` in increasing `i`, then the lanes are folded
/// in halves (`l + 4` into `l`, then `l + 2`, `l + 1`).
const LANES: usize = 8;

// Folds the lanes in halves (see `LANES`).
use fucina::exec::math::fold_lanes as fold;

/// `Σ a[i] · b[i]` in the fixed order of [`LANES`] (no fused multiply-add).
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0.0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    for (l, (x, y)) in ra.iter().zip(rb).enumerate() {
        acc[l] += x * y;
    }
    fold(acc)
}

/// `Σ x[i]` in the fixed order of [`LANES`].
#[inline(always)]
pub(crate) fn sum_lanes(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..LANES {
            acc[l] += c[l];
        }
    }
    for (l, &v) in rest.iter().enumerate() {
        acc[l] += v;
    }
    fold(acc)
}

/// `Σ x[i]²` in the fixed order of [`LANES`].
#[inline]
fn sum_squares(x: &[f32]) -> f32 {
    dot(x, x)
}

pub(crate) use fucina::exec::math::exp;

/// RMSNorm of one row, as transformers computes it in f32:
/// `out = weight · (x · 1/sqrt(mean(x²) + eps))`.
pub(crate) fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let mean = sum_squares(x) / x.len() as f32;
    let r = 1.0 / (mean + eps).sqrt();
    for ((o, &xi), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = w * (xi * r);
    }
}

/// RMSNorm in place of each piece of `weight.len()` elements of `rows` (the
/// heads of q or k rows): the same operations as [`rms_norm`].
pub(crate) fn rms_norm_heads(rows: &mut [f32], weight: &[f32], eps: f32) {
    for x in rows.chunks_exact_mut(weight.len()) {
        let mean = sum_squares(x) / x.len() as f32;
        let r = 1.0 / (mean + eps).sqrt();
        for (o, &w) in x.iter_mut().zip(weight) {
            *o = w * (*o * r);
        }
    }
}

/// `tanh(x)` from the runtime's exponential: `±(1 - e) / (1 + e)` with
/// `e = exp(-2|x|)` (IEEE operations only, the same bits everywhere; within a
/// few units of `1e-7` of the exact value).
#[inline(always)]
pub(crate) fn tanh(x: f32) -> f32 {
    let e = exp(-2.0 * x.abs());
    let t = (1.0 - e) / (1.0 + e);
    if x < 0.0 { -t } else { t }
}

/// Soft-capping: `cap · tanh(x / cap)` of every element, in place.
pub(crate) fn softcap(xs: &mut [f32], cap: f32) {
    for x in xs {
        *x = cap * tanh(*x / cap);
    }
}

/// `gelu_tanh(gate) · up` in place in `gate`, with PyTorch's tanh
/// approximation `gelu(g) = 0.5 · g · (1 + tanh(sqrt(2/π) · (g + 0.044715 g³)))`.
pub(crate) fn geglu(gate: &mut [f32], up: &[f32]) {
    const BETA: f32 = 0.797_884_6; // sqrt(2 / π)
    const KAPPA: f32 = 0.044715;
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let inner = BETA * (x + KAPPA * (x * x * x));
        *g = 0.5 * x * (1.0 + tanh(inner)) * u;
    }
}

/// `silu(gate) · up` in place in `gate`, `silu(g) = g / (1 + exp(-g))`, at
/// the process's vector level (the same bits at each).
pub(crate) fn swiglu(gate: &mut [f32], up: &[f32]) {
    with_simd_level!(swiglu_body(gate, up))
}

#[inline(always)]
fn swiglu_body(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + exp(-*g)) * u;
    }
}

/// Adds `bias` to every row of `rows` (rows of `bias.len()` elements).
pub(crate) fn add_bias(rows: &mut [f32], bias: &[f32]) {
    for row in rows.chunks_exact_mut(bias.len()) {
        for (o, &b) in row.iter_mut().zip(bias) {
            *o += b;
        }
    }
}

/// `acc += x`, element-wise.
pub(crate) fn add_into(acc: &mut [f32], x: &[f32]) {
    for (a, &b) in acc.iter_mut().zip(x) {
        *a += b;
    }
}

/// The rotary inverse frequencies (`head_dim / 2` of them) of a RoPE base and
/// scaling, computed in f32 as transformers does: `1 / base^(2i / head_dim)`
/// (the power is `fmath::pow_f32`'s correctly rounded f32), then divided by the factor (`linear`) or rescaled by wavelength band
/// (`llama3`).
pub(crate) fn inv_freq(head_dim: usize, theta: f32, scaling: &RopeScaling) -> Vec<f32> {
    let half = head_dim / 2;
    (0..half)
        .map(|i| {
            let e = (2 * i) as f32 / head_dim as f32;
            let inv = 1.0f32 / super::fmath::pow_f32(theta as f64, e as f64);
            match *scaling {
                RopeScaling::None => inv,
                RopeScaling::Linear { factor } => inv / factor,
                RopeScaling::Llama3 {
                    factor,
                    low_freq_factor,
                    high_freq_factor,
                    original_max_position_embeddings,
                } => {
                    let old = original_max_position_embeddings as f64;
                    let low_wavelen = (old / low_freq_factor as f64) as f32;
                    let high_wavelen = (old / high_freq_factor as f64) as f32;
                    let wavelen = (2.0 * std::f64::consts::PI) as f32 / inv;
                    let scaled = if wavelen > low_wavelen {
                        inv / factor
                    } else {
                        inv
                    };
                    let smooth = (old as f32 / wavelen - low_freq_factor)
                        / (high_freq_factor as f64 - low_freq_factor as f64) as f32;
                    let medium = wavelen >= high_wavelen && wavelen <= low_wavelen;
                    if medium {
                        (1.0 - smooth) * scaled / factor + smooth * scaled
                    } else {
                        scaled
                    }
                }
            }
        })
        .collect()
}

/// LongRoPE's inverse frequencies, computed in f32 as transformers does:
/// `1 / (factors[i] · base^(2i / head_dim))` (`head_dim / 2` of them).
pub(crate) fn inv_freq_with_factors(head_dim: usize, theta: f32, factors: &[f32]) -> Vec<f32> {
    factors
        .iter()
        .enumerate()
        .map(|(i, &f)| {
            let e = (2 * i) as f32 / head_dim as f32;
            1.0f32 / (f * super::fmath::pow_f32(theta as f64, e as f64))
        })
        .collect()
}

/// The cosines and sines of position `pos` (`inv_freq.len()` each): angle
/// `pos · inv_freq[i]` rounded to f32 (as transformers forms it), its cosine
/// and sine the correctly rounded f32 (`fmath::cos_sin`, the same bits on
/// every platform).
pub(crate) fn rope_angles(pos: usize, inv_freq: &[f32], cos: &mut [f32], sin: &mut [f32]) {
    for ((&f, c), s) in inv_freq.iter().zip(cos.iter_mut()).zip(sin.iter_mut()) {
        (*c, *s) = super::fmath::cos_sin(pos as f32 * f);
    }
}

/// Rotates every head of `row` (heads of `head_dim` elements) in place in the
/// rotate-half convention of Hugging Face over its first `2 · cos.len()`
/// elements (all of them, or the rotary part of a partial rotary embedding):
/// element `i` pairs with element `i + cos.len()`; the rest pass unchanged.
pub(crate) fn apply_rope(row: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    for head in row.chunks_exact_mut(head_dim) {
        let (lo, hi) = head[..2 * half].split_at_mut(half);
        for i in 0..half {
            let (a, b) = (lo[i], hi[i]);
            lo[i] = a * cos[i] - b * sin[i];
            hi[i] = b * cos[i] + a * sin[i];
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    #[cfg(target_arch = "x86_64")]
    use fucina::exec::with_avx512;

    /// Whether the CPU has every feature `with_avx512` enables.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn has_avx512() -> bool {
        use std::arch::is_x86_feature_detected as has;
        has!("avx512f")
            && has!("avx512bw")
            && has!("avx512dq")
            && has!("avx512vl")
            && has!("avx2")
            && has!("fma")
    }

    /// Deterministic pseudo-random values in about [-1.5, 1.5).
    pub(crate) fn noise(n: usize, seed: u32) -> Vec<f32> {
        let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(12345);
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x >> 8) as f32 / (1u32 << 24) as f32 * 3.0 - 1.5
            })
            .collect()
    }

    /// Every compiled variant of SwiGLU gives the portable body's bits.
    #[test]
    fn swiglu_is_the_same_bits_at_every_level() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        // SwiGLU over values that reach exp's range ends.
        let gate: Vec<f32> = noise(1000, 4).iter().map(|x| x * 70.0).collect();
        let up = noise(1000, 5);
        let mut want = gate.clone();
        swiglu_body(&mut want, &up);
        let mut got = gate.clone();
        swiglu(&mut got, &up);
        assert_eq!(bits(&got), bits(&want));
        #[cfg(target_arch = "x86_64")]
        if has_avx512() {
            let mut wide = gate.clone();
            // SAFETY: the features were detected.
            unsafe { with_avx512(|| swiglu_body(&mut wide, &up)) };
            assert_eq!(bits(&wide), bits(&want));
        }
    }

    #[test]
    fn dot_matches_f64_and_the_lane_order() {
        let a: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..37).map(|i| (i as f32 * 0.11).cos()).collect();
        let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        assert!((dot(&a, &b) as f64 - want).abs() < 1e-5);
        // The fixed order, written out.
        let mut lanes = [0.0f32; 8];
        for i in 0..37 {
            lanes[i % 8] += a[i] * b[i];
        }
        for w in [4, 2, 1] {
            for l in 0..w {
                lanes[l] += lanes[l + w];
            }
        }
        assert_eq!(dot(&a, &b).to_bits(), lanes[0].to_bits());
    }

    #[test]
    fn linear_scaling_divides_the_frequencies() {
        let plain = inv_freq(8, 10_000.0, &RopeScaling::None);
        let lin = inv_freq(8, 10_000.0, &RopeScaling::Linear { factor: 4.0 });
        assert_eq!(plain[0], 1.0);
        for (p, l) in plain.iter().zip(&lin) {
            assert_eq!(*l, p / 4.0);
        }
    }

    #[test]
    fn llama3_keeps_high_frequencies_and_divides_low_ones() {
        let s = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64,
        };
        let plain = inv_freq(32, 10_000.0, &RopeScaling::None);
        let scaled = inv_freq(32, 10_000.0, &s);
        for (p, q) in plain.iter().zip(&scaled) {
            let wavelen = 2.0 * std::f64::consts::PI / *p as f64;
            if wavelen < 16.0 {
                assert_eq!(p, q);
            } else if wavelen > 64.0 {
                assert_eq!(*q, p / 8.0);
            } else {
                assert!(*q < *p && *q > p / 8.0);
            }
        }
    }
}
