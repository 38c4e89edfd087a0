//! Scalar math written so that loops calling it vectorize (no libm calls, no
//! branches, no fused multiply-add): `exp`, `log`, `log1p` of a non-negative
//! argument, `tanh` and `sigmoid`, used by the softmax family and the unary ops.
//!
//! Each is a fixed sequence of IEEE add, sub, mul, div, compares, selects and
//! integer bit operations, so a loop over it gives the same bits at every vector
//! level. Errors are stated as relative errors in units of `2^-23` (the f32
//! machine epsilon) times the true value, measured against f64 by the tests below
//! over dense sweeps of the argument range.

/// `exp(x)` in f32 without a libm call, so loops over it vectorize.
///
/// Range reduction `x = n * ln2 + r` with `|r| <= ln2 / 2` (`n` rounded to nearest
/// even through the `1.5 * 2^23` trick, `ln2` split in two parts so `r` is exact to
/// f32), `exp(r) = 1 + r + r^2 P(r)` with `P` of degree 4 (a Chebyshev fit of
/// `(exp(r) - 1 - r) / r^2` on `[-ln2/2, ln2/2]`, truncation error under
/// `1e-8` relative, one multiply-add fewer than the degree-5 Cephes `expf`
/// polynomial), and the scale `2^n` applied as two normal powers of two so that
/// results in the subnormal range round gradually instead of flushing. Relative
/// error within 2 ulp over the normal range (0.69 measured against f64 on a sweep
/// of 475 000 points). `x > 88.73` gives `+inf`,
/// `x < -104` gives `0`, `-inf` gives `0`, `+inf` gives `+inf`, NaN gives NaN.
///
/// A result below the normal range (`x` below about `-87.3`) is the same
/// correctly rounded product `y · 2^n1 · 2^n2`, but formed without an
/// underflowing multiply: x86 CPUs take a microcode assist (about a hundred
/// cycles) for every vector multiply whose result underflows, which made such
/// inputs about six times slower than normal ones (3.9 against 0.6 ns per
/// element, AVX-512, Sapphire Rapids; normal inputs now cost about 10 % more).
/// The tests check every input of that range against the plain product.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23
    let x = x.clamp(-104.0, 89.0);
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.392_617_6e-3f32;
    p = p * r + 8.363_173e-3;
    p = p * r + 4.166_655_6e-2;
    p = p * r + 1.666_657_8e-1;
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
    // `a = y · 2^n1` is exact and normal (y is in [0.7, 1.5), n1 >= -75).
    // The result `a · 2^n2` is below the normal range when the biased
    // exponent `ea + n2` of the product would be < 1 (and x is not NaN).
    let a = y * s1;
    let ea = ((a.to_bits() >> 23) & 0xff) as i32;
    let tiny = ea + n2 < 1 && !x.is_nan();
    // Normal results: one multiply, which never underflows (a tiny lane, whose
    // product is not used, takes the smallest power of two that keeps it
    // normal; a select of 1.0 here would be folded back into the underflowing
    // product by the compiler).
    let normal = a * f32::from_bits((n2.max(1 - ea).wrapping_add(127) as u32) << 23);
    // Tiny results: the same product scaled by 2^64 (normal), plus
    // C = 2^(64 - 126): the sum lies in [C, 2C), where floats are spaced by
    // exactly the smallest subnormal scaled by 2^64, so the addition rounds
    // the product to nearest even as the underflowing multiply would; the
    // bits above C's are the subnormal's bits.
    const C: f32 = f32::from_bits((127 - 62) << 23);
    let w = a * f32::from_bits((n2.wrapping_add(64 + 127) as u32) << 23) + C;
    let rounded = f32::from_bits(w.to_bits().wrapping_sub(C.to_bits()));
    if tiny { rounded } else { normal }
}

/// `ln(x)` in f32 without a libm call (the Cephes `logf` scheme, branch-free).
///
/// `x = m * 2^e` with `m` in `[sqrt(1/2), sqrt(2)]` read from the bits (subnormal
/// inputs are first scaled by `2^23`), then `ln(1 + f)`, `f = m - 1` (exact), by a
/// degree-9 polynomial, plus `e * ln2` in two parts. Relative error within 1 (in
/// units of `2^-23`) over all positive normal and subnormal inputs (tested against
/// f64 on a sweep of bit patterns). `ln(+0) = ln(-0) = -inf`, `ln(+inf) = +inf`,
/// negative inputs and NaN give NaN.
#[inline(always)]
pub(crate) fn log(x: f32) -> f32 {
    const SQRT_2: f32 = std::f32::consts::SQRT_2;
    // Subnormals (and zero or negatives, whose result is replaced below) are
    // scaled into the normal range; the exponent is corrected by 23.
    let sub = x < f32::MIN_POSITIVE;
    let xs = if sub { x * 8_388_608.0 } else { x };
    let bits = xs.to_bits() as i32;
    let e = ((bits >> 23) & 0xff) - 127 - if sub { 23 } else { 0 };
    let m = f32::from_bits(((bits & 0x007f_ffff) | 0x3f80_0000) as u32);
    let big = m > SQRT_2;
    let m = if big { m * 0.5 } else { m };
    let ef = (e + i32::from(big)) as f32;
    let f = m - 1.0;
    let z = f * f;
    let mut p = 7.037_683_6e-2f32;
    p = p * f - 1.151_461e-1;
    p = p * f + 1.167_699_9e-1;
    p = p * f - 1.242_014_1e-1;
    p = p * f + 1.424_932_3e-1;
    p = p * f - 1.666_805_8e-1;
    p = p * f + 2.000_071_5e-1;
    p = p * f - 2.499_999_4e-1;
    p = p * f + 3.333_333e-1;
    let mut y = f * z * p;
    y += -2.121_944_4e-4 * ef;
    y += -0.5 * z;
    let r = (f + y) + 0.693_359_4 * ef;
    let r = if x > 0.0 {
        r
    } else if x == 0.0 {
        f32::NEG_INFINITY
    } else {
        f32::NAN
    };
    if x == f32::INFINITY { x } else { r }
}

/// `ln(1 + u)` for `u >= 0` (or `+inf`), accurate when `u` is tiny: with
/// `w = 1 + u` rounded, `ln(w) * (u / (w - 1))` (the rounding error of `w` cancels
/// in the ratio), and `u` itself when `w == 1`. Relative error within 2 (units of
/// `2^-23`); `+inf` gives `+inf`, NaN gives NaN. Meant for `softplus`, where `u = exp(x)`.
#[inline(always)]
pub(crate) fn log1p_nonneg(u: f32) -> f32 {
    let w = 1.0 + u;
    let l = log(w) * (u / (w - 1.0));
    // `u` itself when `w` rounds to 1, and for `+inf` (where the ratio is NaN).
    if w == 1.0 || u == f32::INFINITY { u } else { l }
}

/// `tanh(x)` without a libm call: for `|x| < 0.625` the Cephes `tanhf` odd
/// polynomial `a + a^3 P(a^2)`, above `1 - 2 / (exp(2|x|) + 1)`; both are computed
/// and one is selected (branch-free), and the sign of `x` is copied onto the result
/// (so `tanh(-0) = -0`). Relative error within 2 (units of `2^-23`) over the whole
/// range, tested against f64; `tanh(±inf) = ±1`, tiny and subnormal `x` give `x`,
/// NaN gives NaN.
#[inline(always)]
pub(crate) fn tanh(x: f32) -> f32 {
    let a = x.abs();
    let z = a * a;
    let mut p = -5.704_988_7e-3f32;
    p = p * z + 2.063_909e-2;
    p = p * z - 5.373_971_6e-2;
    p = p * z + 1.333_144_2e-1;
    p = p * z - 3.333_328e-1;
    let small = p * z * a + a;
    let large = 1.0 - 2.0 / (exp(a + a) + 1.0);
    let t = if a < 0.625 { small } else { large };
    t.copysign(x)
}

/// The logistic function `1 / (1 + e^-x)` without a libm call, written as
/// `e / (1 + e)` with `e = exp(-|x|)` for negative `x` (so results down to the
/// subnormal range keep their precision) and `1 / (1 + e)` otherwise. Relative
/// error within 2 (units of `2^-23`) wherever the result is normal, tested against
/// f64; `sigmoid(+inf) = 1`, `sigmoid(-inf) = 0`, NaN gives NaN.
#[inline(always)]
pub(crate) fn sigmoid(x: f32) -> f32 {
    let e = exp(-x.abs());
    let num = if x < 0.0 { e } else { 1.0 };
    num / (1.0 + e)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `exp` as first written: the last scaling as a plain (underflowing)
    /// product.
    fn exp_by_products(x: f32) -> f32 {
        const LOG2E: f32 = std::f32::consts::LOG2_E;
        const LN2_HI: f32 = 0.693_359_4;
        const LN2_LO: f32 = -2.121_944_4e-4;
        const ROUND: f32 = 12_582_912.0;
        let x = x.clamp(-104.0, 89.0);
        let t = x * LOG2E + ROUND;
        let n = t - ROUND;
        let r = (x - n * LN2_HI) - n * LN2_LO;
        let mut p = 1.392_617_6e-3f32;
        p = p * r + 8.363_173e-3;
        p = p * r + 4.166_655_6e-2;
        p = p * r + 1.666_657_8e-1;
        p = p * r + 0.5;
        let y = p * r * r + r + 1.0;
        let ni = (t.to_bits() as i32).wrapping_sub(0x4B40_0000);
        let n1 = ni >> 1;
        let n2 = ni.wrapping_sub(n1);
        let s1 = f32::from_bits((n1.wrapping_add(127) as u32) << 23);
        let s2 = f32::from_bits((n2.wrapping_add(127) as u32) << 23);
        y * s1 * s2
    }

    /// The integer rounding of results below the normal range gives the bits
    /// of the plain product for every input from -106 to -85 (each f32 of the
    /// range, about 2.6 million), and for a sweep of everything else.
    #[test]
    fn exp_rounds_tiny_results_as_the_plain_product() {
        let (lo, hi) = ((-85.0f32).to_bits(), (-106.0f32).to_bits());
        let mut tiny = 0usize;
        for b in lo..=hi {
            let x = f32::from_bits(b);
            let (got, want) = (exp(x), exp_by_products(x));
            assert_eq!(got.to_bits(), want.to_bits(), "exp({x:e})");
            tiny += usize::from(got < f32::MIN_POSITIVE);
        }
        assert!(tiny > 1_000_000, "{tiny} subnormal results checked");
        for b in (0..=u32::MAX).step_by(4099) {
            let x = f32::from_bits(b);
            let (got, want) = (exp(x), exp_by_products(x));
            if want.is_nan() {
                assert!(got.is_nan(), "exp({x:e})");
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "exp({x:e})");
            }
        }
    }

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
            x += 0.000_37;
        }
        eprintln!("exp: worst error {worst}");
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

    /// The worst relative error of `f` against `want` over `xs`, in units of
    /// `2^-23`, skipping points where the true value is not a normal f32.
    fn worst_rel(xs: impl Iterator<Item = f32>, f: fn(f32) -> f32, want: fn(f64) -> f64) -> f64 {
        let mut worst = 0.0f64;
        for x in xs {
            let w = want(f64::from(x));
            if !(w.abs() >= f64::from(f32::MIN_POSITIVE) && w.abs() <= f64::from(f32::MAX)) {
                continue;
            }
            let got = f64::from(f(x));
            let e = ((got - w) / w).abs() / f64::from(f32::EPSILON);
            assert!(e.is_finite(), "f({x}) = {got}, want {w}");
            worst = worst.max(e);
        }
        worst
    }

    /// Every `step`-th bit pattern of the positive floats (normal and subnormal).
    fn positive_sweep(step: u32) -> impl Iterator<Item = f32> {
        (1..0x7f80_0000u32)
            .step_by(step as usize)
            .map(f32::from_bits)
    }

    /// A dense linear sweep of `[lo, hi]`, plus the tiny and subnormal values.
    fn linear_sweep(lo: f32, hi: f32, n: usize) -> impl Iterator<Item = f32> {
        let tiny = [1e-45f32, 1e-40, 1e-38, 1e-30, 1e-20, 1e-10, 1e-5, 1e-3];
        (0..=n)
            .map(move |i| lo + (hi - lo) * (i as f32 / n as f32))
            .chain(tiny)
            .chain(tiny.map(|t| -t))
    }

    #[test]
    fn log_is_within_1_of_f64() {
        let w = worst_rel(positive_sweep(1021), log, f64::ln);
        eprintln!("log over positive_sweep: worst error {w}");
        assert!(w <= 1.0, "worst error {w}");
        // Dense near 1, where ln is small (relative accuracy matters most there).
        let w = worst_rel(linear_sweep(0.5, 2.0, 400_000), log, f64::ln);
        eprintln!("log over linear_sweep: worst error near 1: {w}");
        assert!(w <= 1.0, "worst error near 1: {w}");
    }

    #[test]
    fn log_special_values() {
        assert_eq!(log(1.0), 0.0);
        assert_eq!(log(0.0), f32::NEG_INFINITY);
        assert_eq!(log(-0.0), f32::NEG_INFINITY);
        assert_eq!(log(f32::INFINITY), f32::INFINITY);
        assert!(log(-1.0).is_nan() && log(f32::NEG_INFINITY).is_nan());
        assert!(log(f32::NAN).is_nan());
        let l = log(f32::from_bits(1)); // the smallest subnormal: -149 ln 2
        assert!((f64::from(l) + 149.0 * std::f64::consts::LN_2).abs() < 1e-4);
        assert!((f64::from(log(f32::MAX)) - f64::from(f32::MAX).ln()).abs() < 1e-4);
    }

    #[test]
    fn log1p_nonneg_is_within_2_of_f64() {
        let w = worst_rel(
            positive_sweep(1021).filter(|&u| u < 1e30),
            log1p_nonneg,
            f64::ln_1p,
        );
        eprintln!("log1p_nonneg over positive_sweep: worst error {w}");
        assert!(w <= 2.0, "worst error {w}");
        let w = worst_rel(linear_sweep(0.0, 4.0, 200_000), log1p_nonneg, f64::ln_1p);
        eprintln!("log1p_nonneg over linear_sweep: worst error {w}");
        assert!(w <= 2.0, "worst error {w}");
        assert_eq!(log1p_nonneg(0.0), 0.0);
        assert_eq!(log1p_nonneg(1e-30), 1e-30);
        assert_eq!(log1p_nonneg(f32::INFINITY), f32::INFINITY);
        assert!(log1p_nonneg(f32::NAN).is_nan());
    }

    #[test]
    fn tanh_is_within_2_of_f64() {
        let w = worst_rel(linear_sweep(-12.0, 12.0, 1_000_000), tanh, f64::tanh);
        eprintln!("tanh over linear_sweep: worst error {w}");
        assert!(w <= 2.0, "worst error {w}");
        let w = worst_rel(positive_sweep(1021), tanh, f64::tanh);
        eprintln!("tanh over positive_sweep: worst error over all magnitudes {w}");
        assert!(w <= 2.0, "worst error over all magnitudes {w}");
    }

    #[test]
    fn tanh_special_values() {
        assert_eq!(tanh(0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(tanh(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(tanh(f32::INFINITY), 1.0);
        assert_eq!(tanh(f32::NEG_INFINITY), -1.0);
        assert_eq!(tanh(100.0), 1.0);
        assert_eq!(tanh(-1e30), -1.0);
        assert!(tanh(f32::NAN).is_nan());
        let sub = f32::from_bits(3);
        assert_eq!(tanh(sub), sub);
        assert_eq!(tanh(-1e-20), -1e-20);
    }

    #[test]
    fn sigmoid_is_within_2_of_f64() {
        let want = |x: f64| 1.0 / (1.0 + (-x).exp());
        let w = worst_rel(linear_sweep(-100.0, 40.0, 1_000_000), sigmoid, want);
        eprintln!("sigmoid over linear_sweep: worst error {w}");
        assert!(w <= 2.0, "worst error {w}");
        assert_eq!(sigmoid(0.0), 0.5);
        assert_eq!(sigmoid(-0.0), 0.5);
        assert_eq!(sigmoid(f32::INFINITY), 1.0);
        assert_eq!(sigmoid(f32::NEG_INFINITY), 0.0);
        assert_eq!(sigmoid(1e30), 1.0);
        assert_eq!(sigmoid(-1e30), 0.0);
        assert!(sigmoid(f32::NAN).is_nan());
        // Gradual underflow: sigmoid(-100) ~ e^-100 is subnormal, not zero.
        let s = sigmoid(-100.0);
        assert!(s > 0.0 && s < f32::MIN_POSITIVE);
        assert!((f64::from(s) - (-100.0f64).exp()).abs() <= f64::from(f32::from_bits(1)));
    }
}
