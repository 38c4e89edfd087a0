//! The per-plane loops of training-mode batch normalization that the batch-norm
//! op and the fused batch-norm + pool op share: the normalization of a plane,
//! a plane's backward sums and the input gradient of a plane, each one fixed
//! expression so that every path gives the same bits. Group norm's parameter
//! gradients take a plane's backward sums from here too.

use crate::kernels::reduce::sum_and_sum_map2;

/// One plane of the training-mode normalization: `dst[i] = (x[i] - mu) * a +
/// b` with `a = gamma * inv_std` (the one expression every path uses).
#[inline(always)]
pub(crate) fn normalize_plane(dst: &mut [f32], x: &[f32], mu: f32, a: f32, b: f32) {
    for (d, &v) in dst.iter_mut().zip(x) {
        *d = (v - mu) * a + b;
    }
}

/// One plane's share of the backward sums: `(sum(gy), sum(gy * (x - mu)))`,
/// each in its own fixed order (one pass).
#[inline(always)]
pub(crate) fn plane_grad_sums(gy: &[f32], x: &[f32], mu: f32) -> (f32, f32) {
    match gy.len() {
        1 => (gy[0], gy[0] * (x[0] - mu)),
        _ => sum_and_sum_map2(gy, x, |g, v| g * (v - mu)),
    }
}

/// The per-channel constants of the training-mode input gradient.
#[derive(Clone, Copy)]
pub(crate) struct GradXCoefs {
    /// The channel mean.
    pub(crate) mu: f32,
    /// `1 / sqrt(var + eps)`.
    pub(crate) istd: f32,
    /// `sum(gy) / M`.
    pub(crate) mdy: f32,
    /// `sum(gy * (x - mu)) * istd / M`.
    pub(crate) mdyx: f32,
    /// `istd * gamma`.
    pub(crate) k: f32,
}

impl GradXCoefs {
    /// The constants of channel `c` from the `[C, 2]` sums, over `m` values.
    #[inline(always)]
    pub(crate) fn of(c: usize, ms: &[f32], is: &[f32], gs: &[f32], ss: &[f32], m: f32) -> Self {
        let istd = is[c];
        GradXCoefs {
            mu: ms[c],
            istd,
            mdy: ss[2 * c] / m,
            mdyx: ss[2 * c + 1] * istd / m,
            k: istd * gs[c],
        }
    }
}

/// [`grad_x_plane`] in place: `d` holds the output gradient and receives the
/// input gradient (the same expression, so the same bits).
#[inline(always)]
pub(crate) fn grad_x_plane_in_place(d: &mut [f32], x: &[f32], k: GradXCoefs) {
    for (d, &v) in d.iter_mut().zip(x) {
        *d = (*d - k.mdy - (v - k.mu) * k.istd * k.mdyx) * k.k;
    }
}

/// One plane of the training-mode input gradient:
/// `dst = (gy - mdy - (x - mu) * istd * mdyx) * k`.
#[inline(always)]
pub(crate) fn grad_x_plane(dst: &mut [f32], gy: &[f32], x: &[f32], k: GradXCoefs) {
    for ((d, &g), &v) in dst.iter_mut().zip(gy).zip(x) {
        *d = (g - k.mdy - (v - k.mu) * k.istd * k.mdyx) * k.k;
    }
}
