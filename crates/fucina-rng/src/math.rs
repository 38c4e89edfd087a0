//! Portable f64 `ln`, `sin` and `cos` used by the exact mappings.
//!
//! Rust's `f64::ln`/`sin`/`cos` call the platform libm, and the standard
//! library documents their precision as non-deterministic (it may vary by
//! platform and Rust version). A checkpoint contract cannot depend on that,
//! so the exact mappings use these pure-Rust ports of the FreeBSD/musl
//! (fdlibm) algorithms instead: plain IEEE `+ - * /` on `f64`, no fused
//! multiply-add, hence the same bits on every target.
//!
//! Ported from musl's `log.c` (pre-2018 fdlibm version), `__sin.c`, `__cos.c`,
//! `__rem_pio2.c`, `sin.c` and `cos.c`, which carry this notice:
//!
//! > Copyright (C) 1993 by Sun Microsystems, Inc. All rights reserved.
//! >
//! > Developed at SunPro, a Sun Microsystems, Inc. business.
//! > Permission to use, copy, modify, and distribute this
//! > software is freely granted, provided that this notice
//! > is preserved.

/// Natural logarithm (fdlibm `__ieee754_log`, error < 1 ulp).
pub(crate) fn ln(mut x: f64) -> f64 {
    const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
    const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
    const LG1: f64 = f64::from_bits(0x3fe5_5555_5555_5593);
    const LG2: f64 = f64::from_bits(0x3fd9_9999_9997_fa04);
    const LG3: f64 = f64::from_bits(0x3fd2_4924_9422_9359);
    const LG4: f64 = f64::from_bits(0x3fcc_71c5_1d8e_78af);
    const LG5: f64 = f64::from_bits(0x3fc7_4664_96cb_03de);
    const LG6: f64 = f64::from_bits(0x3fc3_9a09_d078_c69f);
    const LG7: f64 = f64::from_bits(0x3fc2_f112_df3e_5244);
    const TWO54: f64 = f64::from_bits(0x4350_0000_0000_0000);

    let mut u = x.to_bits();
    let mut hx = (u >> 32) as u32;
    let mut k: i32 = 0;
    if hx < 0x0010_0000 || (hx >> 31) != 0 {
        if u << 1 == 0 {
            return -1.0 / (x * x); // ln(+-0) = -inf
        }
        if hx >> 31 != 0 {
            return f64::NAN; // ln(negative) = NaN
        }
        // Subnormal: scale up.
        k -= 54;
        x *= TWO54;
        u = x.to_bits();
        hx = (u >> 32) as u32;
    } else if hx >= 0x7ff0_0000 {
        return x;
    } else if hx == 0x3ff0_0000 && u << 32 == 0 {
        return 0.0;
    }

    // Reduce x into [sqrt(2)/2, sqrt(2)].
    hx = hx.wrapping_add(0x3ff0_0000 - 0x3fe6_a09e);
    k += (hx >> 20) as i32 - 0x3ff;
    hx = (hx & 0x000f_ffff) + 0x3fe6_a09e;
    u = (u64::from(hx) << 32) | (u & 0xffff_ffff);
    x = f64::from_bits(u);

    let f = x - 1.0;
    let hfsq = 0.5 * f * f;
    let s = f / (2.0 + f);
    let z = s * s;
    let w = z * z;
    let t1 = w * (LG2 + w * (LG4 + w * LG6));
    let t2 = z * (LG1 + w * (LG3 + w * (LG5 + w * LG7)));
    let r = t2 + t1;
    let dk = f64::from(k);
    s * (hfsq + r) + dk * LN2_LO - hfsq + f + dk * LN2_HI
}

/// fdlibm `__sin` kernel on [-pi/4, pi/4]; `y` is the tail of `x`, `iy == 0`
/// means `y` is zero.
#[inline]
fn k_sin(x: f64, y: f64, iy: bool) -> f64 {
    const S1: f64 = f64::from_bits(0xbfc5_5555_5555_5549);
    const S2: f64 = f64::from_bits(0x3f81_1111_1110_f8a6);
    const S3: f64 = f64::from_bits(0xbf2a_01a0_19c1_61d5);
    const S4: f64 = f64::from_bits(0x3ec7_1de3_57b1_fe7d);
    const S5: f64 = f64::from_bits(0xbe5a_e5e6_8a2b_9ceb);
    const S6: f64 = f64::from_bits(0x3de5_d93a_5acf_d57c);
    let z = x * x;
    let w = z * z;
    let r = S2 + z * (S3 + z * S4) + z * w * (S5 + z * S6);
    let v = z * x;
    if iy {
        x - ((z * (0.5 * y - v * r) - y) - v * S1)
    } else {
        x + v * (S1 + z * r)
    }
}

/// fdlibm `__cos` kernel on [-pi/4, pi/4]; `y` is the tail of `x`.
#[inline]
fn k_cos(x: f64, y: f64) -> f64 {
    const C1: f64 = f64::from_bits(0x3fa5_5555_5555_554c);
    const C2: f64 = f64::from_bits(0xbf56_c16c_16c1_5177);
    const C3: f64 = f64::from_bits(0x3efa_01a0_19cb_1590);
    const C4: f64 = f64::from_bits(0xbe92_7e4f_809c_52ad);
    const C5: f64 = f64::from_bits(0x3e21_ee9e_bdb4_b1c4);
    const C6: f64 = f64::from_bits(0xbda8_fae9_be88_38d4);
    let z = x * x;
    let w = z * z;
    let r = z * (C1 + z * (C2 + z * C3)) + w * w * (C4 + z * (C5 + z * C6));
    let hz = 0.5 * z;
    let w = 1.0 - hz;
    w + (((1.0 - w) - hz) + (z * r - x * y))
}

/// musl `__rem_pio2` for finite `0 <= x < 2^20 * pi/2`: returns `n` and
/// `y0 + y1 = x - n * pi/2` with `|y0 + y1| <= ~pi/4`.
fn rem_pio2(x: f64) -> (i32, f64, f64) {
    const TOINT: f64 = 1.5 / f64::EPSILON;
    const PIO4: f64 = f64::from_bits(0x3fe9_21fb_6000_0000);
    const INVPIO2: f64 = f64::from_bits(0x3fe4_5f30_6dc9_c883);
    const PIO2_1: f64 = f64::from_bits(0x3ff9_21fb_5440_0000);
    const PIO2_1T: f64 = f64::from_bits(0x3dd0_b461_1a62_6331);
    const PIO2_2: f64 = f64::from_bits(0x3dd0_b461_1a60_0000);
    const PIO2_2T: f64 = f64::from_bits(0x3ba3_198a_2e03_7073);
    const PIO2_3: f64 = f64::from_bits(0x3ba3_198a_2e00_0000);
    const PIO2_3T: f64 = f64::from_bits(0x397b_839a_2520_49c1);

    debug_assert!((0.0..1.0e6).contains(&x));
    let ix = ((x.to_bits() >> 32) as u32) & 0x7fff_ffff;

    // Small multiples of pi/2 away from the cancellation points: one round.
    let small = |n: i32| {
        let nf = f64::from(n);
        let z = x - nf * PIO2_1;
        let y0 = z - nf * PIO2_1T;
        let y1 = (z - y0) - nf * PIO2_1T;
        (n, y0, y1)
    };
    if ix <= 0x400f_6a7a {
        // |x| ~<= 5pi/4
        if (ix & 0xfffff) != 0x921fb {
            return if ix <= 0x4002_d97c {
                small(1)
            } else {
                small(2)
            };
        }
    } else if ix <= 0x401c_463b {
        // |x| ~<= 9pi/4
        if ix <= 0x4015_fdbc {
            if ix != 0x4012_d97c {
                return small(3);
            }
        } else if ix != 0x4019_21fb {
            return small(4);
        }
    }

    // Medium case (cancellation near a multiple of pi/2, or larger x).
    let mut fnum = x * INVPIO2 + TOINT - TOINT;
    let mut n = fnum as i32;
    let mut r = x - fnum * PIO2_1;
    let mut w = fnum * PIO2_1T;
    if r - w < -PIO4 {
        n -= 1;
        fnum -= 1.0;
        r = x - fnum * PIO2_1;
        w = fnum * PIO2_1T;
    } else if r - w > PIO4 {
        n += 1;
        fnum += 1.0;
        r = x - fnum * PIO2_1;
        w = fnum * PIO2_1T;
    }
    let mut y0 = r - w;
    let ex = (ix >> 20) as i32;
    let ey = ((y0.to_bits() >> 52) & 0x7ff) as i32;
    if ex - ey > 16 {
        // Second round, good to 118 bits.
        let t = r;
        w = fnum * PIO2_2;
        r = t - w;
        w = fnum * PIO2_2T - ((t - r) - w);
        y0 = r - w;
        let ey = ((y0.to_bits() >> 52) & 0x7ff) as i32;
        if ex - ey > 49 {
            // Third round, good to 151 bits.
            let t = r;
            w = fnum * PIO2_3;
            r = t - w;
            w = fnum * PIO2_3T - ((t - r) - w);
            y0 = r - w;
        }
    }
    let y1 = (r - y0) - w;
    (n, y0, y1)
}

/// `(sin x, cos x)` for finite `0 <= x < 2^20 * pi/2`, bit-identical to musl's
/// separate `sin(x)` and `cos(x)`. Only the rare inputs of the Box–Muller
/// path come here (see [`sin_cos_box_muller`]), hence `cold`.
#[cold]
pub(crate) fn sin_cos(x: f64) -> (f64, f64) {
    let ix = ((x.to_bits() >> 32) as u32) & 0x7fff_ffff;
    if ix <= 0x3fe9_21fb {
        // |x| ~<= pi/4
        let s = if ix < 0x3e50_0000 {
            x
        } else {
            k_sin(x, 0.0, false)
        };
        let c = if ix < 0x3e46_a09e { 1.0 } else { k_cos(x, 0.0) };
        return (s, c);
    }
    let (n, y0, y1) = rem_pio2(x);
    let s = k_sin(y0, y1, true);
    let c = k_cos(y0, y1);
    match n & 3 {
        0 => (s, c),
        1 => (c, -s),
        2 => (-s, -c),
        _ => (-c, s),
    }
}

/// `(sin x, cos x, rare)` for the Box–Muller angles `0 <= x < 2 pi`, without
/// a single data-dependent branch (so that it runs lane by lane in vector
/// registers): bit-identical to [`sin_cos`] whenever `rare` is false.
///
/// The angle is uniformly random, so branching on its quadrant (the octant
/// tests of `rem_pio2` and the final `match`) mispredicts most of the time.
/// For every angle outside the rare cases below, `sin_cos` reduces by one
/// round with `n` chosen from the high word by fixed thresholds (`n = 0`,
/// no reduction, up to pi/4); that `n` is computed here as a sum of
/// comparisons, the reduction runs unconditionally (for `n = 0` it yields
/// `y0 = x`, `y1 = +0` exactly), both sine kernels are evaluated and the
/// right one selected, and the quadrant is applied with sign-bit and swap
/// masks (IEEE negation is exactly a sign-bit flip).
///
/// `rare` flags what `sin_cos` treats differently, for the caller to redo
/// with it: tiny angles (`|x| < 2^-26`), the three high words next to a
/// multiple of pi/2 where `rem_pio2` needs more than one round, and anything
/// from 9pi/4 on.
#[inline(always)]
pub(crate) fn sin_cos_lane(x: f64) -> (f64, f64, bool) {
    const PIO2_1: f64 = f64::from_bits(0x3ff9_21fb_5440_0000);
    const PIO2_1T: f64 = f64::from_bits(0x3dd0_b461_1a62_6331);
    const S1: f64 = f64::from_bits(0xbfc5_5555_5555_5549);
    const S2: f64 = f64::from_bits(0x3f81_1111_1110_f8a6);
    const S3: f64 = f64::from_bits(0xbf2a_01a0_19c1_61d5);
    const S4: f64 = f64::from_bits(0x3ec7_1de3_57b1_fe7d);
    const S5: f64 = f64::from_bits(0xbe5a_e5e6_8a2b_9ceb);
    const S6: f64 = f64::from_bits(0x3de5_d93a_5acf_d57c);

    // The high word as i32 (non-negative after masking the sign), so the
    // comparisons are the signed ones every vector instruction set has.
    let ix = (((x.to_bits() >> 32) as u32) & 0x7fff_ffff) as i32;
    let reduced = ix > 0x3fe9_21fb;
    let rare = (ix < 0x3e50_0000)
        | (reduced & (ix <= 0x400f_6a7a) & ((ix & 0xfffff) == 0x921fb))
        | (ix == 0x4012_d97c)
        | (ix == 0x4019_21fb)
        | (ix > 0x401c_463b);
    let n = i32::from(reduced)
        + i32::from(ix > 0x4002_d97c)
        + i32::from(ix > 0x400f_6a7a)
        + i32::from(ix > 0x4015_fdbc);
    let nf = f64::from(n);
    let z = x - nf * PIO2_1;
    let y0 = z - nf * PIO2_1T;
    let y1 = (z - y0) - nf * PIO2_1T;

    // k_sin, both forms (with and without the tail), sharing the polynomial.
    let z = y0 * y0;
    let w = z * z;
    let r = S2 + z * (S3 + z * S4) + z * w * (S5 + z * S6);
    let v = z * y0;
    let sin_tail = y0 - ((z * (0.5 * y1 - v * r) - y1) - v * S1);
    let sin_plain = y0 + v * (S1 + z * r);
    let reduced_mask = 0u64.wrapping_sub(u64::from(reduced));
    let s = (sin_tail.to_bits() & reduced_mask) | (sin_plain.to_bits() & !reduced_mask);
    let c = k_cos(y0, y1).to_bits();

    // Quadrant: swap on odd n, negate sin when n & 2, cos when (n + 1) & 2.
    let n = n as u64;
    let swap = (s ^ c) & 0u64.wrapping_sub(n & 1);
    let (s, c) = (s ^ swap, c ^ swap);
    let s = s ^ (((n >> 1) & 1) << 63);
    let c = c ^ ((((n + 1) >> 1) & 1) << 63);
    (f64::from_bits(s), f64::from_bits(c), rare)
}

/// [`sin_cos`] for the Box–Muller angles `0 <= x < 2 pi`, bit for bit:
/// [`sin_cos_lane`], with its rare cases sent to `sin_cos` behind a branch
/// that is almost never taken.
#[inline(always)]
pub(crate) fn sin_cos_box_muller(x: f64) -> (f64, f64) {
    let (s, c, rare) = sin_cos_lane(x);
    if rare { sin_cos(x) } else { (s, c) }
}

/// [`ln`] for `x` in `[2^-53, 1]` (the Box–Muller `ua`), bit for bit, without
/// its special-case branches: none of them applies there (`x` is positive,
/// normal and finite; at `x = 1` the general formula gives `+0` exactly, as
/// the special case does).
#[inline(always)]
pub(crate) fn ln_unit(x: f64) -> f64 {
    const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
    const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
    const LG1: f64 = f64::from_bits(0x3fe5_5555_5555_5593);
    const LG2: f64 = f64::from_bits(0x3fd9_9999_9997_fa04);
    const LG3: f64 = f64::from_bits(0x3fd2_4924_9422_9359);
    const LG4: f64 = f64::from_bits(0x3fcc_71c5_1d8e_78af);
    const LG5: f64 = f64::from_bits(0x3fc7_4664_96cb_03de);
    const LG6: f64 = f64::from_bits(0x3fc3_9a09_d078_c69f);
    const LG7: f64 = f64::from_bits(0x3fc2_f112_df3e_5244);

    let u = x.to_bits();
    let hx = ((u >> 32) as u32).wrapping_add(0x3ff0_0000 - 0x3fe6_a09e);
    let k = (hx >> 20) as i32 - 0x3ff;
    let hx = (hx & 0x000f_ffff) + 0x3fe6_a09e;
    let x = f64::from_bits((u64::from(hx) << 32) | (u & 0xffff_ffff));

    let f = x - 1.0;
    let hfsq = 0.5 * f * f;
    let s = f / (2.0 + f);
    let z = s * s;
    let w = z * z;
    let t1 = w * (LG2 + w * (LG4 + w * LG6));
    let t2 = z * (LG1 + w * (LG3 + w * (LG5 + w * LG7)));
    let r = t2 + t1;
    let dk = f64::from(k);
    s * (hfsq + r) + dk * LN2_LO - hfsq + f + dk * LN2_HI
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::SplitMix64;

    /// Distance in units in the last place between two finite f64 of equal sign.
    fn ulps(a: f64, b: f64) -> u64 {
        if a == b {
            return 0;
        }
        assert_eq!(a.is_sign_negative(), b.is_sign_negative(), "{a} vs {b}");
        a.to_bits().abs_diff(b.to_bits())
    }

    #[test]
    fn ln_matches_platform_within_one_ulp() {
        let mut rng = SplitMix64::new(1);
        for _ in 0..200_000 {
            let k = (rng.next_u64() >> 11) + 1;
            let u = k as f64 * f64::from_bits(0x3ca0_0000_0000_0000); // 2^-53
            assert!(ulps(ln(u), u.ln()) <= 1, "ln({u:e})");
            let big = f64::from_bits(rng.next_u64() >> 2); // positive, any exponent
            if big.is_finite() && big != 0.0 {
                assert!(ulps(ln(big), big.ln()) <= 1, "ln({big:e})");
            }
        }
        assert_eq!(ln(1.0), 0.0);
        assert_eq!(ln(0.0), f64::NEG_INFINITY);
        assert!(ln(-1.0).is_nan());
        assert_eq!(ln(f64::INFINITY), f64::INFINITY);
        assert_eq!(ln(core::f64::consts::E), 1.0);
    }

    #[test]
    fn sin_cos_match_platform_within_one_ulp() {
        let two_pi = 2.0 * core::f64::consts::PI;
        let mut rng = SplitMix64::new(2);
        let check = |x: f64| {
            let (s, c) = sin_cos(x);
            let (es, ec) = (x.sin(), x.cos());
            assert!(
                (s - es).abs() <= 2.0 * f64::EPSILON * es.abs().max(1e-300),
                "sin({x:e}) {s:e} vs {es:e}"
            );
            assert!(
                (c - ec).abs() <= 2.0 * f64::EPSILON * ec.abs().max(1e-300),
                "cos({x:e}) {c:e} vs {ec:e}"
            );
        };
        for _ in 0..200_000 {
            let u = (rng.next_u64() >> 11) as f64 * f64::from_bits(0x3ca0_0000_0000_0000);
            check(two_pi * u);
        }
        // Points next to multiples of pi/2 (the cancellation paths) and tiny angles.
        for n in 1..=4 {
            let m = f64::from(n) * core::f64::consts::FRAC_PI_2;
            let mut y = m;
            for _ in 0..40 {
                check(y);
                y = f64::from_bits(y.to_bits() + 1);
            }
            let mut y = m;
            for _ in 0..40 {
                check(y);
                y = f64::from_bits(y.to_bits() - 1);
            }
        }
        for e in [1e-300, 1e-20, 7e-16, 1e-9, 1e-8, 0.5, 0.78] {
            check(e);
        }
        assert_eq!(sin_cos(0.0), (0.0, 1.0));
    }

    #[test]
    fn branch_free_ln_is_bit_identical_on_box_muller_uniforms() {
        let two_m53 = f64::from_bits(0x3ca0_0000_0000_0000);
        let same = |x: f64| assert_eq!(ln_unit(x).to_bits(), ln(x).to_bits(), "ln({x:e})");
        let mut rng = SplitMix64::new(6);
        for _ in 0..1_000_000 {
            same(((rng.next_u64() >> 11) as f64 + 1.0) * two_m53);
        }
        // The ends of the domain and every power of two in it, with neighbours.
        for e in 0..=53 {
            let p = f64::from_bits((1023 - e) << 52);
            for d in 0..4u64 {
                same(f64::from_bits(p.to_bits() - d).max(two_m53));
                same(f64::from_bits(p.to_bits() + d).min(1.0));
            }
        }
        assert_eq!(ln_unit(1.0).to_bits(), 0.0f64.to_bits());
    }

    #[test]
    fn branch_free_sin_cos_is_bit_identical_on_box_muller_angles() {
        let same = |x: f64| {
            let (s, c) = sin_cos_box_muller(x);
            let (es, ec) = sin_cos(x);
            assert_eq!(
                (s.to_bits(), c.to_bits()),
                (es.to_bits(), ec.to_bits()),
                "sin_cos({x:e} = {:#x})",
                x.to_bits()
            );
        };
        let two_pi = 2.0 * core::f64::consts::PI;
        let mut rng = SplitMix64::new(5);
        for _ in 0..1_000_000 {
            same(two_pi * ((rng.next_u64() >> 11) as f64 * f64::from_bits(0x3ca0_0000_0000_0000)));
        }
        // Every high-word threshold of the octant choice and of the rare
        // cases, with low words at both ends and random ones, and the
        // multiples of pi/2 with their neighbours.
        for hi in [
            0x3e46_a09e_u32,
            0x3e50_0000,
            0x3fe9_21fb,
            0x4002_d97c,
            0x400f_6a7a,
            0x4012_d97c,
            0x4015_fdbc,
            0x4019_21fb,
            0x401c_463b,
            0x3ff9_21fb,
            0x4009_21fb,
        ] {
            for h in hi - 2..=hi + 2 {
                for lo in [0, 1, 0x8000_0000, 0xffff_fffe, 0xffff_ffff] {
                    same(f64::from_bits((u64::from(h) << 32) | lo));
                }
                for _ in 0..200 {
                    same(f64::from_bits(
                        (u64::from(h) << 32) | (rng.next_u64() >> 32),
                    ));
                }
            }
        }
        for k in 0..=4 {
            let m = f64::from(k) * core::f64::consts::FRAC_PI_2;
            for d in 0..64u64 {
                same(f64::from_bits(m.to_bits() + d));
                if m > 0.0 {
                    same(f64::from_bits(m.to_bits() - d));
                }
            }
        }
        same(0.0);
        same(two_pi);
    }
}
