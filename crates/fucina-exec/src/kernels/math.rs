//! Scalar math written so that loops calling it vectorize (no libm calls, no
//! branches): the `exp` of the softmax family.

/// `exp(x)` in f32 without a libm call, so loops over it vectorize.
///
/// Range reduction `x = n * ln2 + r` with `|r| <= ln2 / 2` (`n` rounded to nearest
/// even through the `1.5 * 2^23` trick, `ln2` split in two parts so `r` is exact to
/// f32), a degree-7 polynomial for `exp(r)` (the Cephes `expf` coefficients), and
/// the scale `2^n` applied as two normal powers of two so that results in the
/// subnormal range round gradually instead of flushing. Relative error within
/// 2 ulp over the normal range (tested against f64). `x > 88.73` gives `+inf`,
/// `x < -104` gives `0`, `-inf` gives `0`, `+inf` gives `+inf`, NaN gives NaN.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23
    let x = x.clamp(-104.0, 89.0);
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    // The low mantissa bits of `t` hold n (in [-150, 129]) in two's complement
    // (an integer read instead of a float-to-int cast, which would not vectorize).
    // Split it into two halves that are normal exponents. For a NaN input the bits
    // are garbage, but `y` is NaN and so is the result.
    let ni = (t.to_bits() as i32).wrapping_sub(0x4B40_0000);
    let n1 = ni >> 1;
    let n2 = ni.wrapping_sub(n1);
    let s1 = f32::from_bits((n1.wrapping_add(127) as u32) << 23);
    let s2 = f32::from_bits((n2.wrapping_add(127) as u32) << 23);
    y * s1 * s2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_2_ulp_of_f64() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.7 {
            let got = f64::from(exp(x));
            let want = f64::from(x).exp();
            // One f32 ulp relative to the value is 2^-23.
            let ulps = ((got - want) / want).abs() / f64::from(f32::EPSILON);
            worst = worst.max(ulps);
            x += 0.001_37;
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
    }

    #[test]
    fn exp_special_values() {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-200.0), 0.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(100.0), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
        // Gradual underflow: exp(-100) is subnormal, not zero.
        let sub = exp(-100.0);
        assert!(sub > 0.0 && sub < f32::MIN_POSITIVE);
        // Within one subnormal step (2^-149) of the true value.
        let want = (-100.0f64).exp();
        assert!((f64::from(sub) - want).abs() <= f64::from(f32::from_bits(1)));
    }
}
