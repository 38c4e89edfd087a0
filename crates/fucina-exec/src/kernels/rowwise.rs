//! Row kernels: softmax, log-softmax, log-sum-exp, variance, layer norm, RMS norm
//! and their backward rows. Each works on one row (a slice) and uses the fixed-order
//! sums of [`super::reduce`], so a row's result depends only on the row. All are
//! `#[inline(always)]`: the ops call them inside [`super::simd::vectorized!`], so
//! they compile at the dispatched vector level.

use super::math::{exp, log};
use super::reduce::{map_store_sum, max_skip_nan, sum, sum_map, sum_map2};

/// `log(sum(exp(x)))`, shifted by the row max (`0` when the max is infinite, which
/// gives `+inf` for a row holding `+inf` and `-inf` for an all `-inf` row); NaN if
/// the row holds a NaN.
#[inline(always)]
pub(crate) fn logsumexp(x: &[f32]) -> f32 {
    let m = max_skip_nan(x);
    let shift = if m.is_finite() { m } else { 0.0 };
    shift + log(sum_map(x, |v| exp(v - shift)))
}

/// The variance of the row: `sum((x - mean)^2) / (n - correction)` (two passes).
#[inline(always)]
pub(crate) fn variance(x: &[f32], correction: usize) -> f32 {
    let n = x.len();
    let mean = sum(x) / n as f32;
    let ss = sum_map(x, |v| {
        let d = v - mean;
        d * d
    });
    ss / n.saturating_sub(correction) as f32
}

/// `out = exp(x - max(x)) / sum(exp(x - max(x)))`.
#[inline(always)]
pub(crate) fn softmax(x: &[f32], out: &mut [f32]) {
    softmax_scaled(x, out, 1.0);
}

/// `out = softmax(x) * scale`, the scale folded into the normalization pass
/// (`exp(x - max) * (scale / sum)`; with `scale = 1` exactly [`softmax`]).
#[inline(always)]
pub(crate) fn softmax_scaled(x: &[f32], out: &mut [f32], scale: f32) {
    let m = max_skip_nan(x);
    let inv = scale / map_store_sum(x, out, |v| exp(v - m));
    for o in out.iter_mut() {
        *o *= inv;
    }
}

/// `out = x - max(x) - log(sum(exp(x - max(x))))`.
#[inline(always)]
pub(crate) fn log_softmax(x: &[f32], out: &mut [f32]) {
    let m = max_skip_nan(x);
    let lse = log(sum_map(x, |v| exp(v - m)));
    for (o, &v) in out.iter_mut().zip(x) {
        *o = (v - m) - lse;
    }
}

/// `gx = y * (gy - sum(gy * y))` with `y` the softmax output.
#[inline(always)]
pub(crate) fn softmax_backward(y: &[f32], gy: &[f32], gx: &mut [f32]) {
    let dot = sum_map2(y, gy, |a, b| a * b);
    for ((o, &yv), &g) in gx.iter_mut().zip(y).zip(gy) {
        *o = yv * (g - dot);
    }
}

/// `gx = gy - exp(y) * sum(gy)` with `y` the log-softmax output.
#[inline(always)]
pub(crate) fn log_softmax_backward(y: &[f32], gy: &[f32], gx: &mut [f32]) {
    let s = sum(gy);
    for ((o, &yv), &g) in gx.iter_mut().zip(y).zip(gy) {
        *o = g - exp(yv) * s;
    }
}

/// Mean and `1 / sqrt(biased_variance + eps)` of a row (layer norm statistics).
#[inline(always)]
pub(crate) fn layer_norm_stats(x: &[f32], eps: f32) -> (f32, f32) {
    let n = x.len() as f32;
    let mean = sum(x) / n;
    let var = sum_map(x, |v| {
        let d = v - mean;
        d * d
    }) / n;
    (mean, 1.0 / (var + eps).sqrt())
}

/// `out = (x - mean) * rstd * gamma + beta`.
#[inline(always)]
pub(crate) fn layer_norm(x: &[f32], gamma: &[f32], beta: &[f32], eps: f32, out: &mut [f32]) {
    let (mean, rstd) = layer_norm_stats(x, eps);
    for (((o, &v), &g), &b) in out.iter_mut().zip(x).zip(gamma).zip(beta) {
        *o = (v - mean) * rstd * g + b;
    }
}

/// `1 / sqrt(mean(x^2) + eps)` of a row (RMS norm statistic).
#[inline(always)]
pub(crate) fn rms_norm_rstd(x: &[f32], eps: f32) -> f32 {
    let ms = sum_map(x, |v| v * v) / x.len() as f32;
    1.0 / (ms + eps).sqrt()
}

/// `out = x * rstd * gamma`.
#[inline(always)]
pub(crate) fn rms_norm(x: &[f32], gamma: &[f32], eps: f32, out: &mut [f32]) {
    let r = rms_norm_rstd(x, eps);
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(gamma) {
        *o = v * r * g;
    }
}

/// Layer-norm input gradient of one row, with `xhat = (x - mean) * rstd` and
/// `g = gy * gamma`: `gx = rstd * (g - mean(g) - xhat * mean(g * xhat))`.
#[inline(always)]
pub(crate) fn layer_norm_backward(x: &[f32], gamma: &[f32], gy: &[f32], eps: f32, gx: &mut [f32]) {
    let n = x.len() as f32;
    let (mean, rstd) = layer_norm_stats(x, eps);
    // gx is scratch for g = gy * gamma first.
    for ((o, &a), &b) in gx.iter_mut().zip(gy).zip(gamma) {
        *o = a * b;
    }
    let mean_g = sum(gx) / n;
    let mean_gx = sum_map2(gx, x, |g, v| g * ((v - mean) * rstd)) / n;
    for (o, &v) in gx.iter_mut().zip(x) {
        let xhat = (v - mean) * rstd;
        *o = rstd * (*o - mean_g - xhat * mean_gx);
    }
}

/// RMS-norm input gradient of one row, with `xhat = x * rstd` and `g = gy * gamma`:
/// `gx = rstd * (g - xhat * mean(g * xhat))`.
#[inline(always)]
pub(crate) fn rms_norm_backward(x: &[f32], gamma: &[f32], gy: &[f32], eps: f32, gx: &mut [f32]) {
    let n = x.len() as f32;
    let r = rms_norm_rstd(x, eps);
    for ((o, &a), &b) in gx.iter_mut().zip(gy).zip(gamma) {
        *o = a * b;
    }
    let mean_gx = sum_map2(gx, x, |g, v| g * (v * r)) / n;
    for (o, &v) in gx.iter_mut().zip(x) {
        *o = r * (*o - (v * r) * mean_gx);
    }
}
