//! The uniform family: `uniform_fill`, `kaiming_uniform_fill`, `gumbel_fill`.

use crate::dispatch::Path;
use crate::gaussian::TWO_POW_M53;
use crate::stream::splitmix64;
#[cfg(target_arch = "x86_64")]
use crate::x86;
use crate::{float, math};

/// The value `uniform_fill` clamps a round-up to `hi` onto: the f32 next to
/// `hi` in the direction of `lo` (the largest f32 below `hi` when `lo < hi`).
#[inline]
pub(crate) fn clamp_value(lo: f32, hi: f32) -> f32 {
    if lo < hi {
        hi.next_down()
    } else if lo > hi {
        hi.next_up()
    } else if lo.is_nan() {
        lo
    } else {
        // Equal bounds (every value rounds to `hi`), or `hi` is NaN.
        hi
    }
}

/// One element of `uniform_fill`, exactly as the contract writes it.
#[inline(always)]
pub(crate) fn uniform_one(x: u64, lo: f64, hi64: f64, hi: f32, clamp: f32) -> f32 {
    let u = (x >> 11) as f64 * TWO_POW_M53;
    let v = (lo + (hi64 - lo) * u) as f32;
    if v >= hi { clamp } else { v }
}

/// Fills `out` with uniform values on the half-open interval `[lo, hi)`.
///
/// Element `i` takes `x = at(seed, i)` (the `i`-th [`splitmix64`] output
/// from `state = seed`), `u = (x >> 11) * 2^-53` in `[0, 1)`, and
/// `v = lo + (hi - lo) * u` computed in f64 and rounded once to f32. The rare
/// `v` that rounds up to `hi` is replaced by the largest f32 below `hi`, so
/// `hi` itself never appears. Bounds with `lo >= hi` are not rejected; they
/// give the formula's deterministic output (all `hi` when `lo == hi`).
///
/// Vectorized (AVX-512 or AVX2, chosen at run time) with bits identical to the
/// scalar formula.
///
/// ```
/// let mut w = [0.0f32; 1000];
/// fucina_rng::uniform_fill(42, &mut w, -0.25, 0.75);
/// assert!(w.iter().all(|v| (-0.25..0.75).contains(v)));
/// assert_eq!(w[0].to_bits(), 0x3efb_ae64); // the reference implementation's bits
/// ```
pub fn uniform_fill(seed: u64, out: &mut [f32], lo: f32, hi: f32) {
    fill_with(Path::detect(), seed, out, lo, hi);
}

/// [`uniform_fill`] on an explicit path (a vector `path` carries the proof of
/// its runtime detection, see [`Path`]).
pub(crate) fn fill_with(path: Path, seed: u64, out: &mut [f32], lo: f32, hi: f32) {
    let clamp = clamp_value(lo, hi);
    let body_len = match path {
        Path::Scalar => 0,
        #[cfg(target_arch = "x86_64")]
        Path::Avx2(_) | Path::Avx512(_) => out.len() / 8 * 8,
    };
    let (body, tail) = out.split_at_mut(body_len);
    match path {
        Path::Scalar => debug_assert!(body.is_empty()),
        #[cfg(target_arch = "x86_64")]
        Path::Avx2(_) => {
            // SAFETY: a `Path::Avx2` carries a `Detected` token, which only
            // `dispatch` creates, after the runtime detection of AVX2.
            unsafe { x86::uniform_avx2(seed, body, lo, hi, clamp) }
        }
        #[cfg(target_arch = "x86_64")]
        Path::Avx512(_) => {
            // SAFETY: a `Path::Avx512` carries a `Detected` token, which only
            // `dispatch` creates, after the runtime detection of AVX2 and
            // AVX-512 F, DQ and VL (the features the body enables).
            unsafe { x86::uniform_avx512(seed, body, lo, hi, clamp) }
        }
    }
    let (lo64, hi64) = (f64::from(lo), f64::from(hi));
    // The tail continues the sequential stream where the body stopped.
    let mut state = seed.wrapping_add((body_len as u64).wrapping_mul(crate::stream::GAMMA));
    for v in tail {
        *v = uniform_one(splitmix64(&mut state), lo64, hi64, hi, clamp);
    }
}

/// PyTorch's default `nn.Linear` weight init (Kaiming uniform with `a = sqrt(5)`):
/// [`uniform_fill(seed, out, -bound, bound)`](uniform_fill) with
/// `bound = sqrt(1 / fan_in)` computed in f64 and rounded to f32.
///
/// # Panics
///
/// If `fan_in == 0` (a contract violation: the bound would be infinite).
///
/// ```
/// let mut w = [0.0f32; 64];
/// fucina_rng::kaiming_uniform_fill(1, &mut w, 64);
/// assert!(w.iter().all(|v| v.abs() < 0.125));
/// ```
pub fn kaiming_uniform_fill(seed: u64, out: &mut [f32], fan_in: usize) {
    assert!(
        fan_in != 0,
        "kaiming_uniform_fill: fan_in must be at least 1 (got 0)"
    );
    let bound = float::sqrt(1.0 / fan_in as f64) as f32;
    uniform_fill(seed, out, -bound, bound);
}

/// Fills `out` with standard Gumbel(0, 1) values by inverse CDF over a
/// strictly open uniform: `u = ((x >> 11) + 0.5) * 2^-53` with `x` the
/// sequential stream from `seed`, value `-ln(-ln(u))` in f64 rounded once to
/// f32. Always finite.
///
/// The logarithm is this crate's portable f64 implementation, so the bits do
/// not depend on the platform's libm.
///
/// ```
/// let mut g = [0.0f32; 8];
/// fucina_rng::gumbel_fill(5, &mut g);
/// assert!(g.iter().all(|v| v.is_finite()));
/// ```
pub fn gumbel_fill(seed: u64, out: &mut [f32]) {
    let mut state = seed;
    for v in out {
        let x = splitmix64(&mut state);
        let u = ((x >> 11) as f64 + 0.5) * TWO_POW_M53;
        *v = (-math::ln(-math::ln(u))) as f32;
    }
}

/// Element `i` of `uniform_fill(seed, .., lo, hi)` in O(1) (used by tests).
#[cfg(test)]
pub(crate) fn uniform_at(seed: u64, i: u64, lo: f32, hi: f32) -> f32 {
    uniform_one(
        crate::stream::at(seed, i),
        f64::from(lo),
        f64::from(hi),
        hi,
        clamp_value(lo, hi),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::SplitMix64;

    #[test]
    fn every_path_matches_scalar() {
        let mut rng = SplitMix64::new(0x0123);
        let bounds: &[(f32, f32)] = &[
            (-0.25, 0.75),
            (0.0, 1.0),
            (-1.0, 1.0),
            (-3.0e38, 3.0e38),
            (1.0e-45, 2.0e-45),
            (1.0, 1.0000001),
            (-5.0, -4.0),
            (f32::MIN, f32::MAX),
            (0.0, f32::INFINITY),
            (2.0, 1.0),
            (1.0, 1.0),
            (f32::NAN, 1.0),
        ];
        for &(lo, hi) in bounds {
            for seed in [0u64, 42, 0x3162_8AF6_7B21_31AB, u64::MAX] {
                let n = 1000 + (rng.next_u64() % 20) as usize;
                let mut reference = vec![0.0f32; n];
                fill_with(Path::Scalar, seed, &mut reference, lo, hi);
                for (i, r) in reference.iter().enumerate().step_by(97) {
                    assert_eq!(r.to_bits(), uniform_at(seed, i as u64, lo, hi).to_bits());
                }
                for path in Path::available() {
                    let mut v = vec![0.0f32; n];
                    fill_with(path, seed, &mut v, lo, hi);
                    for (i, (a, b)) in v.iter().zip(&reference).enumerate() {
                        assert_eq!(
                            a.to_bits(),
                            b.to_bits(),
                            "{path:?} [{lo}, {hi}) seed {seed:#x} index {i}"
                        );
                    }
                }
            }
        }
    }

    /// Every small length (empty body, one 8-lane step, one 16-element step,
    /// and every remainder), at several seeds including ones whose counters
    /// wrap: each path equals the O(1) formula bit for bit and writes exactly
    /// `out.len()` elements.
    #[test]
    fn every_path_matches_scalar_for_small_lengths() {
        const CANARY: u32 = 0x7fc0_dead;
        let seeds = [
            0u64,
            42,
            u64::MAX,
            0u64.wrapping_sub(crate::stream::GAMMA.wrapping_mul(33)),
        ];
        for &seed in &seeds {
            for &(lo, hi) in &[(-0.25f32, 0.75f32), (0.0, 1.0), (3.0, -2.0)] {
                for len in 0..=70usize {
                    for path in Path::available() {
                        let mut buf = vec![f32::from_bits(CANARY); len + 2];
                        fill_with(path, seed, &mut buf[1..=len], lo, hi);
                        assert_eq!(buf[0].to_bits(), CANARY, "{path:?} wrote before the window");
                        assert_eq!(
                            buf[len + 1].to_bits(),
                            CANARY,
                            "{path:?} wrote after the window"
                        );
                        for (i, v) in buf[1..=len].iter().enumerate() {
                            assert_eq!(
                                v.to_bits(),
                                uniform_at(seed, i as u64, lo, hi).to_bits(),
                                "{path:?} seed {seed:#x} len {len} index {i}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn clamp_seed_hits_the_clamp_on_every_path() {
        for path in Path::available() {
            let mut v = [0.0f32; 9]; // one vector body of 8 plus a scalar tail element
            fill_with(path, 0x3162_8AF6_7B21_31AB, &mut v, 0.0, 1.0);
            assert_eq!(v[0].to_bits(), 0x3f7f_ffff, "{path:?}");
        }
    }
}
