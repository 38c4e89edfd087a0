//! The two IEEE operations the mappings need beyond `+ - * /` that `core`
//! does not provide: square root (f64 and f32).
//!
//! IEEE 754 square root is correctly rounded, so every implementation below
//! gives the same bits. With the `std` feature it is the standard library's
//! `sqrt` (one `sqrtsd`/`sqrtss` or `fsqrt` instruction); without it, x86_64
//! with SSE2 (the x86_64 baseline) uses the same instruction through
//! `core::arch`, and other targets (including soft-float x86_64 kernels) the
//! integer implementation [`sqrt_soft`] / [`sqrtf_soft`], which the tests
//! check bit for bit against the hardware instruction.

/// `sqrt(x)`, correctly rounded.
#[inline(always)]
pub(crate) fn sqrt(x: f64) -> f64 {
    #[cfg(feature = "std")]
    {
        x.sqrt()
    }
    #[cfg(all(not(feature = "std"), target_arch = "x86_64", target_feature = "sse2"))]
    {
        use core::arch::x86_64::{_mm_cvtsd_f64, _mm_set_sd, _mm_sqrt_pd};
        // SAFETY: the intrinsics need SSE2, which this build enables (the
        // cfg above); they touch no memory.
        unsafe { _mm_cvtsd_f64(_mm_sqrt_pd(_mm_set_sd(x))) }
    }
    #[cfg(all(
        not(feature = "std"),
        not(all(target_arch = "x86_64", target_feature = "sse2"))
    ))]
    {
        sqrt_soft(x)
    }
}

/// `sqrt(x)` in f32, correctly rounded.
#[inline(always)]
pub(crate) fn sqrtf(x: f32) -> f32 {
    #[cfg(feature = "std")]
    {
        x.sqrt()
    }
    #[cfg(all(not(feature = "std"), target_arch = "x86_64", target_feature = "sse2"))]
    {
        use core::arch::x86_64::{_mm_cvtss_f32, _mm_set_ss, _mm_sqrt_ss};
        // SAFETY: the intrinsics need SSE, which this build enables (SSE2
        // implies it); they touch no memory.
        unsafe { _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(x))) }
    }
    #[cfg(all(
        not(feature = "std"),
        not(all(target_arch = "x86_64", target_feature = "sse2"))
    ))]
    {
        sqrtf_soft(x)
    }
}

/// Correctly rounded `sqrt` of an f64 by integer square root: for
/// `x = m * 2^e` with `e` even and `m` in `[2^52, 2^54)`, the 53-bit result
/// is `isqrt(m * 2^52)`, rounded up when the remainder exceeds the root (an
/// f64 square root never lies exactly halfway between two f64).
#[cfg_attr(
    all(feature = "std", not(test)),
    expect(dead_code, reason = "the fallback of targets without std and SSE2")
)]
#[cfg_attr(
    all(
        not(feature = "std"),
        target_arch = "x86_64",
        target_feature = "sse2",
        not(test)
    ),
    expect(dead_code, reason = "the fallback of targets without std and SSE2")
)]
pub(crate) fn sqrt_soft(x: f64) -> f64 {
    if x.is_nan() || x.is_infinite() && x > 0.0 || x == 0.0 {
        return x; // NaN, +inf and +-0 are their own roots
    }
    if x < 0.0 {
        return f64::NAN;
    }
    let bits = x.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i32;
    let frac = bits & ((1 << 52) - 1);
    // x = m * 2^e with m's leading bit at 52.
    let (mut m, mut e) = if biased == 0 {
        let shift = frac.leading_zeros() - 11;
        (frac << shift, -1074 - shift as i32)
    } else {
        (frac | (1 << 52), biased - 1075)
    };
    if e & 1 != 0 {
        m <<= 1;
        e -= 1;
    }
    let n = u128::from(m) << 52;
    let mut r = n.isqrt();
    if n - r * r > r {
        r += 1;
    }
    // sqrt(x) = r * 2^(e/2 - 26) with r in [2^52, 2^53]; a carry into bit 53
    // (r = 2^53) moves into the exponent field by itself.
    let exponent = (e / 2 + 26 + 1023 - 1) as u64;
    f64::from_bits((exponent << 52) + r as u64)
}

/// Correctly rounded `sqrt` of an f32, as [`sqrt_soft`]: `m` in
/// `[2^24, 2^26)`, the 24-bit result `isqrt(m * 2^22)`.
#[cfg_attr(
    all(feature = "std", not(test)),
    expect(dead_code, reason = "the fallback of targets without std and SSE2")
)]
#[cfg_attr(
    all(
        not(feature = "std"),
        target_arch = "x86_64",
        target_feature = "sse2",
        not(test)
    ),
    expect(dead_code, reason = "the fallback of targets without std and SSE2")
)]
pub(crate) fn sqrtf_soft(x: f32) -> f32 {
    if x.is_nan() || x.is_infinite() && x > 0.0 || x == 0.0 {
        return x;
    }
    if x < 0.0 {
        return f32::NAN;
    }
    let bits = x.to_bits();
    let biased = ((bits >> 23) & 0xff) as i32;
    let frac = bits & ((1 << 23) - 1);
    let (m, mut e) = if biased == 0 {
        let shift = frac.leading_zeros() - 8;
        (frac << shift, -149 - shift as i32)
    } else {
        (frac | (1 << 23), biased - 150)
    };
    // m in [2^23, 2^24): make e even with m in [2^24, 2^26).
    let mut m = u64::from(m);
    if e & 1 != 0 {
        m <<= 1;
        e -= 1;
    } else {
        m <<= 2;
        e -= 2;
    }
    let n = m << 22;
    let mut r = n.isqrt();
    if n - r * r > r {
        r += 1;
    }
    // sqrt(x) = r * 2^(e/2 - 11) with r in [2^23, 2^24].
    let exponent = (e / 2 + 12 + 127 - 1) as u32;
    f32::from_bits((exponent << 23) + r as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::SplitMix64;

    #[test]
    fn soft_sqrt_is_bit_identical_to_the_instruction() {
        let mut rng = SplitMix64::new(3);
        let check64 = |x: f64| {
            let (got, want) = (sqrt_soft(x), x.sqrt());
            assert!(
                got.to_bits() == want.to_bits() || got.is_nan() && want.is_nan(),
                "sqrt({x:e} = {:#x}): {got:e} vs {want:e}",
                x.to_bits()
            );
            assert_eq!(sqrt(x).to_bits(), want.to_bits(), "sqrt({x:e})");
        };
        for _ in 0..300_000 {
            check64(f64::from_bits(rng.next_u64() >> 1)); // any positive bits
            check64(((rng.next_u64() >> 11) + 1) as f64 * 2f64.powi(-53));
        }
        for x in [
            0.0,
            -0.0,
            1.0,
            2.0,
            4.0,
            f64::MIN_POSITIVE,
            f64::from_bits(1),
            f64::from_bits((1 << 52) - 1),
            f64::MAX,
            f64::INFINITY,
        ] {
            check64(x);
        }
        assert!(sqrt_soft(-1.0).is_nan() && sqrt_soft(f64::NEG_INFINITY).is_nan());
        assert!(sqrt_soft(f64::NAN).is_nan());

        let check32 = |x: f32| {
            let (got, want) = (sqrtf_soft(x), x.sqrt());
            assert!(
                got.to_bits() == want.to_bits() || got.is_nan() && want.is_nan(),
                "sqrtf({x:e} = {:#x}): {got:e} vs {want:e}",
                x.to_bits()
            );
            assert_eq!(sqrtf(x).to_bits(), want.to_bits(), "sqrtf({x:e})");
        };
        // Every 97th positive f32 bit pattern (covers subnormals, every
        // exponent and both parities), plus the edges.
        for bits in (0..0x7f80_0000u32).step_by(97) {
            check32(f32::from_bits(bits));
        }
        for x in [
            0.0,
            -0.0,
            1.0,
            f32::MIN_POSITIVE,
            f32::from_bits(1),
            f32::MAX,
            f32::INFINITY,
        ] {
            check32(x);
        }
        assert!(sqrtf_soft(-1.0).is_nan() && sqrtf_soft(f32::NAN).is_nan());
    }
}
