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

/// GELU, tanh approximation: `0.5 x (1 + tanh(u))`, `u = sqrt(2/pi) (x +
/// 0.044715 x^3)`, evaluated as the identical `x * sigmoid(2u)` (since
/// `(1 + tanh(u)) / 2 = sigmoid(2u)`): one `exp` and one division, and no
/// cancellation in `1 + tanh(u)` for negative `x`.
#[inline(always)]
pub(crate) fn gelu(x: f32) -> f32 {
    let u = SQRT_2_OVER_PI * (x + GELU_C * x * x * x);
    x * math::sigmoid(u + u)
}

/// The derivative of [`gelu`]: with `s = sigmoid(2u)`,
/// `s + 2 x s (1 - s) du/dx` (the same as `0.5 (1 + t) + 0.5 x (1 - t^2) du/dx`
/// with `t = tanh(u)`).
#[inline(always)]
pub(crate) fn gelu_grad(x: f32) -> f32 {
    let u = SQRT_2_OVER_PI * (x + GELU_C * x * x * x);
    let s = math::sigmoid(u + u);
    let du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_C * x * x);
    s + 2.0 * x * s * (1.0 - s) * du
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
    x * math::sigmoid(x)
}

#[inline(always)]
pub(crate) fn silu_grad(x: f32) -> f32 {
    let s = math::sigmoid(x);
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
    if x > 20.0 { 1.0 } else { math::sigmoid(x) }
}

/// `ln(sigmoid(x)) = min(x, 0) - ln(1 + e^-|x|)`: no overflow for any `x`
/// (PyTorch's `logsigmoid`).
#[inline(always)]
pub(crate) fn logsigmoid(x: f32) -> f32 {
    x.min(0.0) - math::log1p_nonneg(math::exp(-x.abs()))
}

/// The derivative of [`logsigmoid`]: `sigmoid(-x)`.
#[inline(always)]
pub(crate) fn logsigmoid_grad(x: f32) -> f32 {
    math::sigmoid(-x)
}

/// Hard swish `x * relu6(x + 3) / 6`: 0 at or below -3, `x` at or above 3,
/// `x (x + 3) / 6` between (PyTorch's `hardswish`).
#[inline(always)]
pub(crate) fn hardswish(x: f32) -> f32 {
    if x <= -3.0 {
        0.0
    } else if x >= 3.0 {
        x
    } else {
        x * (x + 3.0) / 6.0
    }
}

/// The derivative of [`hardswish`] as PyTorch takes it: 0 below -3, `x / 3 +
/// 1/2` on `[-3, 3]`, 1 above 3.
#[inline(always)]
pub(crate) fn hardswish_grad(x: f32) -> f32 {
    if x < -3.0 {
        0.0
    } else if x <= 3.0 {
        x / 3.0 + 0.5
    } else {
        1.0
    }
}

/// Mish `x * tanh(softplus(x))` (softplus with its threshold of 20, where
/// `tanh` is 1 in f32 anyway).
#[inline(always)]
pub(crate) fn mish(x: f32) -> f32 {
    x * math::tanh(softplus(x))
}

/// The derivative of [`mish`]: with `t = tanh(softplus(x))`,
/// `t + x * sigmoid(x) * (1 - t^2)` (PyTorch's formula).
#[inline(always)]
pub(crate) fn mish_grad(x: f32) -> f32 {
    let t = math::tanh(softplus(x));
    t + x * math::sigmoid(x) * (1.0 - t * t)
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

    /// GELU in f64, the tanh form as PyTorch writes it.
    fn gelu64(x: f32) -> f64 {
        let x = f64::from(x);
        let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044_715 * x * x * x);
        0.5 * x * (1.0 + u.tanh())
    }

    #[test]
    fn gelu_is_accurate_against_f64() {
        // Relative error in units of 2^-23 where the result is not tiny, and
        // where it is (x < -3, gelu(x) ~ x exp(-1.6 x^2): ill-conditioned, the
        // rounding of u is amplified by |2u|) the error relative to |x|.
        let (mut rel, mut abs) = (0.0f64, 0.0f64);
        for i in 0..=400_000 {
            let x = -12.0 + 24.0 * (i as f32 / 400_000.0);
            let (got, want) = (f64::from(gelu(x)), gelu64(x));
            let eps = f64::from(f32::EPSILON);
            if x >= -3.0 && want.abs() > 1e-30 {
                rel = rel.max(((got - want) / want).abs() / eps);
            } else {
                abs = abs.max((got - want).abs() / (f64::from(x.abs()) * eps));
            }
        }
        eprintln!("gelu: relative {rel}, relative to |x| below -3: {abs}");
        assert!(rel <= 10.0 && abs <= 0.05, "relative {rel}, to |x| {abs}");
    }

    #[test]
    fn derivatives_match_finite_differences() {
        type F = fn(f32) -> f32;
        let fs: [(F, F); 7] = [
            (gelu, gelu_grad),
            (gelu_erf, gelu_erf_grad),
            (silu, silu_grad),
            (softplus, softplus_grad),
            (logsigmoid, logsigmoid_grad),
            (hardswish, hardswish_grad),
            (mish, mish_grad),
        ];
        for (f, g) in fs {
            // Away from hardswish's kinks at -3 and 3.
            for x in [-3.3f32, -2.5, -0.7, 0.0, 0.3, 1.9, 4.0] {
                let h = 1e-2f32;
                let fd = (f(x + h) - f(x - h)) / (2.0 * h);
                assert!((fd - g(x)).abs() < 2e-3, "x = {x}: fd {fd} vs {}", g(x));
            }
        }
    }
}
