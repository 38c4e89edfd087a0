//! The fast Gaussian mapping (`gaussian_fill_at_fast`): the same Box–Muller
//! pairs with f32 polynomial transcendentals, computed 16 (AVX-512) or 8
//! (AVX2) pairs per vector step.
//!
//! Every lane runs exactly the scalar op sequence of [`pair`] (IEEE add, sub,
//! mul, sqrt, floor, compares and selects; no fused multiply-add anywhere), so
//! the vector body and the scalar head/tail give identical bits. The unit tests
//! check every path available on the running CPU against the scalar path.

// The constants below are the contract's decimal literals verbatim; each
// denotes the f32 nearest to it.
#![allow(clippy::excessive_precision)]

use crate::dispatch::Path;
use crate::float;
use crate::gaussian::{TWO_POW_M53, fill_pairs, split_odd_head};
use crate::stream::at;
#[cfg(target_arch = "x86_64")]
use crate::x86;

/// `0.70710678118654757` rounded to f32.
#[allow(clippy::approx_constant)]
pub(crate) const SQRTHF: f32 = 0.707_106_781_186_547_57;
/// Cephes `logf` polynomial coefficients, highest degree first.
pub(crate) const LOG_P: [f32; 9] = [
    7.037_683_629_2e-2,
    -1.151_461_031_0e-1,
    1.167_699_874_0e-1,
    -1.242_014_084_6e-1,
    1.424_932_278_7e-1,
    -1.666_805_766_5e-1,
    2.000_071_476_5e-1,
    -2.499_999_399_3e-1,
    3.333_333_117_4e-1,
];
pub(crate) const LOG_Q1: f32 = -2.121_944_40e-4;
pub(crate) const LOG_Q2: f32 = 0.693_359_375;
/// `pi / 2` rounded to f32 (the contract's literal `1.5707963267948966`).
#[allow(clippy::approx_constant)]
pub(crate) const PIO2F: f32 = 1.570_796_326_794_896_6;
/// Sine polynomial in `z = arg^2`, highest degree first.
pub(crate) const SIN_P: [f32; 3] = [-1.951_529_589_1e-4, 8.332_160_873_6e-3, -1.666_665_461_1e-1];
/// Cosine polynomial in `z = arg^2`, highest degree first.
pub(crate) const COS_P: [f32; 3] = [
    2.443_315_711_809_948e-5,
    -1.388_731_625_493_765e-3,
    4.166_664_568_298_827e-2,
];

/// The f32 uniforms of a pair: `ua` in (0, 1], `ub` in [0, 1], each rounded once
/// from the exact f64 uniforms.
#[inline(always)]
fn uniforms(a: u64, b: u64) -> (f32, f32) {
    let ua = ((a >> 11) as f64 + 1.0) * TWO_POW_M53;
    let ub = (b >> 11) as f64 * TWO_POW_M53;
    (ua as f32, ub as f32)
}

/// Natural log of a positive normal f32 by the Cephes `logf` scheme, in the
/// contract's exact op order.
#[inline(always)]
fn logf(x: f32) -> f32 {
    let bits = x.to_bits();
    let mut e = ((bits >> 23) as i32 - 126) as f32;
    let mut m = f32::from_bits((bits & 0x007f_ffff) | 0x3f00_0000);
    if m < SQRTHF {
        e -= 1.0;
        m = m + m;
    }
    let f = m - 1.0;
    let z = f * f;
    let mut p = LOG_P[0];
    for c in &LOG_P[1..] {
        p = p * f + c;
    }
    let mut y = f * z * p;
    y += e * LOG_Q1;
    y -= 0.5 * z;
    #[allow(clippy::assign_op_pattern)] // keep the contract's operand order
    {
        y = f + y;
    }
    y + e * LOG_Q2
}

/// `(sin, cos)` of `2 pi ub` by turn-fraction reduction to the nearest quarter turn.
#[inline(always)]
fn sin_cos_turns(ub: f32) -> (f32, f32) {
    let t4 = ub * 4.0;
    // floor of a value in [0.5, 4.5]: truncation is exact and needs no
    // `roundss` (SSE4.1) or libm call.
    let jf = ((t4 + 0.5) as u32) as f32;
    let y = t4 - jf;
    let arg = y * PIO2F;
    let z = arg * arg;
    let sp = (SIN_P[0] * z + SIN_P[1]) * z + SIN_P[2];
    let sin_arg = arg + arg * z * sp;
    let cp = (COS_P[0] * z + COS_P[1]) * z + COS_P[2];
    let cos_arg = 1.0 - 0.5 * z + z * z * cp;
    let q = (jf as u32) & 3;
    let (mut s, mut c) = if q & 1 != 0 {
        (cos_arg, sin_arg)
    } else {
        (sin_arg, cos_arg)
    };
    if q & 2 != 0 {
        s = -s;
    }
    if (q + 1) & 2 != 0 {
        c = -c;
    }
    (s, c)
}

/// The two values (cosine half, sine half) of fast pair `p`.
#[inline(always)]
fn pair(seed: u64, p: u64, scale: f32) -> (f32, f32) {
    let i = p.wrapping_mul(2);
    let (ua, ub) = uniforms(at(seed, i), at(seed, i.wrapping_add(1)));
    let radius = float::sqrtf(-2.0 * logf(ua));
    let (s, c) = sin_cos_turns(ub);
    (radius * c * scale, radius * s * scale)
}

/// Fills `out` with elements `first .. first + out.len()` of the **fast**
/// Gaussian mapping for `seed`, times `scale`.
///
/// This is a distinct checkpoint contract from [`gaussian_fill_at`](crate::gaussian_fill_at):
/// the same splitmix64 pairs and Box–Muller construction, but with the
/// uniforms rounded to f32 and f32 polynomial `ln`, `sin` and `cos` (Cephes
/// `logf`, quarter-turn reduction), so values agree with the exact mapping to
/// a few ulps (within about `1e-5` relative) but not bit for bit.
///
/// Every element is a pure function of `(seed, index)`: any chunking gives
/// identical bits, and the vectorized body (AVX-512 with 16 pairs per step or
/// AVX2 with 8, chosen at run time) gives the same bits as the portable scalar
/// code on every CPU.
///
/// ```
/// use fucina_rng::gaussian_fill_at_fast;
///
/// let mut whole = vec![0.0f32; 1000];
/// gaussian_fill_at_fast(9, 0, &mut whole, 1.0);
/// let mut window = vec![0.0f32; 33];
/// gaussian_fill_at_fast(9, 11, &mut window, 1.0);
/// assert!(window.iter().zip(&whole[11..44]).all(|(a, b)| a.to_bits() == b.to_bits()));
/// ```
pub fn gaussian_fill_at_fast(seed: u64, first: u64, out: &mut [f32], scale: f32) {
    fill_with(Path::detect(), seed, first, out, scale);
}

/// [`gaussian_fill_at_fast`] on an explicit path. A vector `path` carries the
/// proof of its runtime detection (only [`Path::detect`] and
/// [`Path::available`] make one), so any `path` is sound here.
pub(crate) fn fill_with(path: Path, seed: u64, first: u64, out: &mut [f32], scale: f32) {
    let pair_at = |p: u64| pair(seed, p, scale);
    let (rest, p) = split_odd_head(first, out, pair_at);
    let body_len = match path {
        Path::Scalar => 0,
        #[cfg(target_arch = "x86_64")]
        Path::Avx2(_) | Path::Avx512(_) => rest.len() / 16 * 16,
    };
    let (body, tail) = rest.split_at_mut(body_len);
    match path {
        Path::Scalar => debug_assert!(body.is_empty()),
        #[cfg(target_arch = "x86_64")]
        Path::Avx2(_) => {
            // SAFETY: a `Path::Avx2` carries a `Detected` token, which only
            // `dispatch` creates, after the runtime detection of AVX2.
            unsafe { x86::gaussian_fast_avx2(seed, p, body, scale) }
        }
        #[cfg(target_arch = "x86_64")]
        Path::Avx512(_) => {
            // SAFETY: a `Path::Avx512` carries a `Detected` token, which only
            // `dispatch` creates, after the runtime detection of AVX2 and
            // AVX-512 F, DQ and VL (the features the body enables).
            unsafe { x86::gaussian_fast_avx512(seed, p, body, scale) }
        }
    }
    fill_pairs(p.wrapping_add((body_len / 2) as u64), tail, pair_at);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::SplitMix64;

    #[test]
    fn every_path_matches_scalar_on_random_windows() {
        const N: usize = 4099;
        let mut rng = SplitMix64::new(0xFA57);
        for seed in [0u64, 1, 42, u64::MAX, 0xDEAD_BEEF_CAFE_F00D] {
            for &scale in &[1.0f32, 2.0, -0.37, 1e-30] {
                let mut reference = vec![0.0f32; N];
                fill_with(Path::Scalar, seed, 0, &mut reference, scale);
                for path in Path::available() {
                    let mut whole = vec![0.0f32; N];
                    fill_with(path, seed, 0, &mut whole, scale);
                    assert!(
                        whole
                            .iter()
                            .zip(&reference)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{path:?} differs from scalar (seed {seed:#x}, scale {scale})"
                    );
                    for _ in 0..40 {
                        let start = (rng.next_u64() % N as u64) as usize;
                        let len = (rng.next_u64() % (N - start) as u64) as usize;
                        let mut w = vec![0.0f32; len];
                        fill_with(path, seed, start as u64, &mut w, scale);
                        assert!(
                            w.iter()
                                .zip(&reference[start..])
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{path:?} window {start}+{len} differs (seed {seed:#x})"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn huge_counters_wrap_identically_on_every_path() {
        // Windows straddling the end of the 2^64 counter space.
        let first = u64::MAX - 40;
        let mut reference = vec![0.0f32; 41];
        fill_with(Path::Scalar, 5, first, &mut reference, 1.0);
        for path in Path::available() {
            let mut v = vec![0.0f32; 41];
            fill_with(path, 5, first, &mut v, 1.0);
            assert_eq!(
                v.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                reference.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "{path:?}"
            );
        }
    }

    /// Every small length and offset (vector body empty, exactly one 8-pair
    /// step, one 16-pair step plus remainders, odd heads), at ordinary and
    /// wrapping counters: each path equals the scalar path bit for bit, and
    /// writes exactly `out.len()` elements (the canaries around the window stay).
    #[test]
    fn every_path_matches_scalar_for_small_lengths_and_offsets() {
        const CANARY: u32 = 0x7fc0_dead;
        let bases = [0u64, u64::MAX - 80, u64::MAX - 33, (1 << 63) - 17];
        for &base in &bases {
            for off in 0..=33u64 {
                let first = base.wrapping_add(off);
                for len in 0..=70usize {
                    let mut reference = vec![0.0f32; len];
                    fill_with(Path::Scalar, 0x5EED, first, &mut reference, 1.5);
                    for path in Path::available() {
                        let mut buf = vec![f32::from_bits(CANARY); len + 2];
                        fill_with(path, 0x5EED, first, &mut buf[1..=len], 1.5);
                        assert_eq!(buf[0].to_bits(), CANARY, "{path:?} wrote before the window");
                        assert_eq!(
                            buf[len + 1].to_bits(),
                            CANARY,
                            "{path:?} wrote after the window"
                        );
                        for (k, (a, b)) in buf[1..=len].iter().zip(&reference).enumerate() {
                            assert_eq!(
                                a.to_bits(),
                                b.to_bits(),
                                "{path:?} first {first:#x} len {len} element {k}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn logf_and_sincos_are_accurate() {
        // Not the contract (the contract is the op sequence), but a wrong
        // coefficient would show up here.
        let mut rng = SplitMix64::new(3);
        for _ in 0..100_000 {
            let (ua, ub) = uniforms(rng.next_u64(), rng.next_u64());
            let l = logf(ua);
            assert!(
                (f64::from(l) - f64::from(ua).ln()).abs() <= 3e-7 * f64::from(l).abs().max(1e-7),
                "logf({ua})"
            );
            let (s, c) = sin_cos_turns(ub);
            let ang = 2.0 * core::f64::consts::PI * f64::from(ub);
            assert!((f64::from(s) - ang.sin()).abs() < 3e-7, "sin(2pi*{ub})");
            assert!((f64::from(c) - ang.cos()).abs() < 3e-7, "cos(2pi*{ub})");
        }
        assert_eq!(logf(1.0), 0.0);
    }
}
