//! Scalar math of the unary ops and their derivatives (PyTorch definitions).
//!
//! Built on the libm-free functions of [`super::math`] (`exp`, `log1p`, `tanh`,
//! `sigmoid`), so the loops over them vectorize and give the same bits at every
//! vector level. The exact GELU's `erf` still evaluates one f64 `exp` per element.

use super::math;

/// `sqrt(2 / pi)`, the constant of the tanh approximation of GELU.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The cubic coefficient of the tanh approximation of GELU.
const GELU_C: f32 = 0.044_715;

/// The logistic function `1 / (1 + e^-x)` (see [`math::sigmoid`]).
#[inline(always)]
pub(crate) fn sigmoid(x: f32) -> f32 {
    math::sigmoid(x)
}

/// GELU, tanh approximation: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
#[inline(always)]
pub(crate) fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + math::tanh(SQRT_2_OVER_PI * (x + GELU_C * x * x * x)))
}

#[inline(always)]
pub(crate) fn gelu_grad(x: f32) -> f32 {
    let u = SQRT_2_OVER_PI * (x + GELU_C * x * x * x);
    let t = math::tanh(u);
    let du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_C * x * x);
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du
}

/// The error function (Abramowitz–Stegun 7.1.26 is too coarse; this is the
/// float version of the Numerical Recipes `erfc` Chebyshev fit, |error| < 1.2e-7).
#[inline(always)]
pub(crate) fn erf(x: f32) -> f32 {
    let z = f64::from(x.abs());
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    let v = (1.0 - r) as f32;
    if x >= 0.0 { v } else { -v }
}

/// Exact GELU: `0.5 x (1 + erf(x / sqrt 2))`.
#[inline(always)]
pub(crate) fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

#[inline(always)]
pub(crate) fn gelu_erf_grad(x: f32) -> f32 {
    let cdf = 0.5 * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2));
    let pdf = math::exp(-0.5 * x * x)
        * (0.5 * std::f32::consts::FRAC_2_SQRT_PI * std::f32::consts::FRAC_1_SQRT_2);
    cdf + x * pdf
}

/// `x * sigmoid(x)`.
#[inline(always)]
pub(crate) fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

#[inline(always)]
pub(crate) fn silu_grad(x: f32) -> f32 {
    let s = sigmoid(x);
    s * (1.0 + x * (1.0 - s))
}

/// `ln(1 + e^x)`, PyTorch's threshold: linear above 20 (both sides computed, one
/// selected, so the loop stays branch-free).
#[inline(always)]
pub(crate) fn softplus(x: f32) -> f32 {
    let l = math::log1p_nonneg(math::exp(x));
    if x > 20.0 { x } else { l }
}

#[inline(always)]
pub(crate) fn softplus_grad(x: f32) -> f32 {
    if x > 20.0 { 1.0 } else { sigmoid(x) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_is_accurate() {
        // reference values of erf
        for (x, e) in [
            (0.0f32, 0.0f64),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (-1.5, -0.966_105_146_475_310_7),
            (3.0, 0.999_977_909_503_001_4),
        ] {
            assert!((f64::from(erf(x)) - e).abs() < 2e-7, "erf({x})");
        }
    }

    #[test]
    fn derivatives_match_finite_differences() {
        type F = fn(f32) -> f32;
        let fs: [(F, F); 4] = [
            (gelu, gelu_grad),
            (gelu_erf, gelu_erf_grad),
            (silu, silu_grad),
            (softplus, softplus_grad),
        ];
        for (f, g) in fs {
            for x in [-3.0f32, -0.7, 0.0, 0.3, 1.9, 4.0] {
                let h = 1e-2f32;
                let fd = (f(x + h) - f(x - h)) / (2.0 * h);
                assert!((fd - g(x)).abs() < 2e-3, "x = {x}: fd {fd} vs {}", g(x));
            }
        }
    }
}
