//! Row kernels: softmax, log-softmax, log-sum-exp, variance, layer norm, RMS norm,
//! group norm (a row is one group of one sample) and their backward rows. Each works on one row (a slice) and uses the fixed-order
//! sums of [`super::reduce`], so a row's result depends only on the row. All are
//! `#[inline(always)]`: the ops call them inside [`super::simd::vectorized!`], so
//! they compile at the dispatched vector level.

use super::batch_norm::plane_grad_sums;
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
    // gx is scratch for g = gy * gamma first.
    for ((o, &a), &b) in gx.iter_mut().zip(gy).zip(gamma) {
        *o = a * b;
    }
    layer_norm_backward_scaled(x, eps, gx);
}

/// [`layer_norm_backward`] once `g = gy * scale` is in `gx`: replaces it with
/// `rstd * (g - mean(g) - xhat * mean(g * xhat))`, the row statistics of `x`.
#[inline(always)]
pub(crate) fn layer_norm_backward_scaled(x: &[f32], eps: f32, gx: &mut [f32]) {
    let n = x.len() as f32;
    let (mean, rstd) = layer_norm_stats(x, eps);
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

/// Group norm of one group of one sample: `x` holds `channels` planes of equal
/// size, one per channel of the group (`weight` and `bias` hold the group's
/// `channels` values); `out = (x - mean) * rstd * w[j] + b[j]` on plane `j`,
/// with the layer-norm statistics of the whole row. A missing weight is `1`
/// and a missing bias `0` (the same bits as ones and zeros).
#[inline(always)]
pub(crate) fn group_norm(
    x: &[f32],
    weight: Option<&[f32]>,
    bias: Option<&[f32]>,
    channels: usize,
    eps: f32,
    out: &mut [f32],
) {
    let (mean, rstd) = layer_norm_stats(x, eps);
    let plane = x.len() / channels;
    let planes = out.chunks_exact_mut(plane).zip(x.chunks_exact(plane));
    for (j, (o, xp)) in planes.enumerate() {
        let w = weight.map_or(1.0, |w| w[j]);
        let b = bias.map_or(0.0, |b| b[j]);
        for (o, &v) in o.iter_mut().zip(xp) {
            *o = (v - mean) * rstd * w + b;
        }
    }
}

/// Group-norm input gradient of one group of one sample (planes as in
/// [`group_norm`]) in four passes over the row, with the per-channel sums
/// of the parameter gradients on the way: with the row's `mean` and `rstd`,
/// `a[j] = sum(gy)` and `b[j] = sum(gy * (x - mean))` over plane `j`
/// ([`plane_grad_sums`]) go to `sums[2j]` and `sums[2j + 1]` (the latter
/// times `rstd`); then `mean(g) = sum(w[j] a[j]) / n`, `mean(g xhat) = rstd
/// sum(w[j] b[j]) / n` (`g = gy * w[j]`, the channels in order) and `gx =
/// rstd * (g - mean(g) - xhat * mean(g xhat))`. A missing weight is `1`.
#[inline(always)]
pub(crate) fn group_norm_backward_sums(
    x: &[f32],
    weight: Option<&[f32]>,
    gy: &[f32],
    channels: usize,
    eps: f32,
    gx: &mut [f32],
    sums: &mut [f32],
) {
    let n = x.len() as f32;
    let plane = x.len() / channels;
    let (mean, rstd) = layer_norm_stats(x, eps);
    let (mut sg, mut sgx) = (0.0f32, 0.0f32);
    let planes = x.chunks_exact(plane).zip(gy.chunks_exact(plane));
    for (j, ((xp, gp), s)) in planes.zip(sums.chunks_exact_mut(2)).enumerate() {
        let (a, b) = plane_grad_sums(gp, xp, mean);
        let w = weight.map_or(1.0, |w| w[j]);
        sg += w * a;
        sgx += w * b;
        s[0] = a;
        s[1] = b * rstd;
    }
    let mean_g = sg / n;
    let mean_gx = sgx * rstd / n;
    let planes = gx.chunks_exact_mut(plane).zip(x.chunks_exact(plane));
    for (j, ((o, xp), gp)) in planes.zip(gy.chunks_exact(plane)).enumerate() {
        let w = weight.map_or(1.0, |w| w[j]);
        for ((o, &v), &g) in o.iter_mut().zip(xp).zip(gp) {
            let xhat = (v - mean) * rstd;
            *o = rstd * (g * w - mean_g - xhat * mean_gx);
        }
    }
}
