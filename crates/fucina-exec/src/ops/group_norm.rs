//! Group normalization (PyTorch's `group_norm`) over `[N, C, *]` and its
//! backward kernel.
//!
//! The `C` channels are split into `num_groups` groups of `C / num_groups`
//! consecutive channels; each (sample, group) is normalized with the mean and
//! the biased variance of its `C / num_groups × spatial` elements, then the
//! optional per-channel affine `weight`/`bias` (`[C]`) is applied:
//! `y = (x - mean) * rstd * weight[c] + bias[c]` with `rstd = 1 / sqrt(var +
//! eps)`.
//!
//! **Order of the sums.** A contiguous `[N, C, *]` tensor is `N * num_groups`
//! rows of one (sample, group) each; a row is normalized by one task with the
//! layer-norm row kernels (the fixed-order sums of the reductions), so the
//! bits never depend on the team size or the vector level, and a sample's
//! result never depends on the other samples (batch invariance). The
//! backward's row task writes the row's input gradient and its channels'
//! plane sums in four passes over the row (statistics, sums, output); the
//! parameter gradients add those sums per channel, the samples in order.

use crate::context::ExecContext;
use crate::error::ExecError;
use crate::kernels::batch_norm::plane_grad_sums;
use crate::kernels::rowwise;
use crate::kernels::simd::vectorized;
use crate::ops::common::{channels_first, check_grad_shape, check_param_shapes};
use crate::tensor::RawTensor;

/// Per-element work weight of a group row (two statistics passes and the output).
const ROW_WORK: usize = 4;

/// Options of [`ExecContext::group_norm`] (PyTorch's `group_norm` arguments
/// besides the tensors). [`GroupNormOptions::new`] takes PyTorch's default
/// `eps = 1e-5`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GroupNormOptions {
    /// The number of channel groups (at least 1; must divide the channels).
    pub num_groups: usize,
    /// Added to the variance inside the square root (finite, non-negative).
    pub eps: f32,
}

impl GroupNormOptions {
    /// `num_groups` groups with `eps = 1e-5`.
    pub fn new(num_groups: usize) -> GroupNormOptions {
        GroupNormOptions {
            num_groups,
            eps: 1e-5,
        }
    }
}

/// The sizes of a group norm: `(N, C, C / num_groups, spatial)`.
#[derive(Clone, Copy)]
struct GroupDims {
    n: usize,
    c: usize,
    per_group: usize,
    plane: usize,
}

/// Checks the input's rank, the options and the shapes of the parameters
/// that are present.
fn check(
    op: &'static str,
    x: &RawTensor,
    weight: Option<&RawTensor>,
    bias: Option<&RawTensor>,
    opts: GroupNormOptions,
) -> Result<GroupDims, ExecError> {
    let (n, c, plane) = channels_first(op, x)?;
    let g = opts.num_groups;
    let bad = |value, reason| ExecError::InvalidOption {
        op,
        name: "num_groups",
        value,
        reason,
    };
    if g == 0 {
        return Err(bad(0, "must be at least 1"));
    }
    if !c.is_multiple_of(g) {
        return Err(bad(g, "must divide the channels (axis 1 of the input)"));
    }
    let reason = "weight and bias must have shape [C] (axis 1 of the input)";
    check_param_shapes(op, x, c, weight.as_slice(), opts.eps, reason)?;
    check_param_shapes(op, x, c, bias.as_slice(), opts.eps, reason)?;
    Ok(GroupDims {
        n,
        c,
        per_group: c / g,
        plane,
    })
}

impl ExecContext {
    /// Group normalization (PyTorch's `torch.nn.functional.group_norm`): `x`
    /// is `[N, C, *]` (rank at least 2, any number of spatial axes); its `C`
    /// channels form `num_groups` groups of consecutive channels, and each
    /// (sample, group) is normalized with the mean and the **biased** variance
    /// of its `C / num_groups × spatial` elements, then scaled by `weight` and
    /// shifted by `bias` (each `[C]`, optional):
    /// `y = (x - mean) * rstd * weight[c] + bias[c]`, `rstd = 1 / sqrt(var +
    /// eps)`. A missing weight is ones and a missing bias zeros, bit for bit.
    ///
    /// The statistics are fixed-order sums over one (sample, group) each, so
    /// the bits are the same for every team size and vector level, and a
    /// sample's output depends on that sample alone.
    ///
    /// ```
    /// use fucina_exec::{ExecContext, GroupNormOptions};
    ///
    /// let ctx = ExecContext::new();
    /// // One sample, four channels of one value each, two groups.
    /// let x = ctx.from_slice(&[1, 4], &[1., 3., 10., 20.])?;
    /// let opts = GroupNormOptions { num_groups: 2, eps: 0.0 };
    /// let y = ctx.group_norm(&x, None, None, opts)?;
    /// assert_eq!(y.to_vec(), [-1., 1., -1., 1.]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`] if `x` has rank below 2;
    /// [`ExecError::InvalidOption`] if `num_groups` is 0 or does not divide
    /// `C`; [`ExecError::ShapeMismatch`] if `weight` or `bias` is not of shape
    /// `[C]`; [`ExecError::InvalidArgument`] if `eps` is negative, infinite or
    /// NaN; [`ExecError::OutOfMemory`].
    pub fn group_norm(
        &self,
        x: &RawTensor,
        weight: Option<&RawTensor>,
        bias: Option<&RawTensor>,
        opts: GroupNormOptions,
    ) -> Result<RawTensor, ExecError> {
        const OP: &str = "group_norm";
        let d = check(OP, x, weight, bias, opts)?;
        let xc = self.contiguous(x)?;
        let wc = weight.map(|w| self.contiguous(w)).transpose()?;
        let bc = bias.map(|b| self.contiguous(b)).transpose()?;
        let (xs, ws, bs) = (
            xc.contiguous_slice(),
            wc.as_ref().map(RawTensor::contiguous_slice),
            bc.as_ref().map(RawTensor::contiguous_slice),
        );
        let (k, len) = (d.per_group, d.per_group * d.plane);
        let groups = opts.num_groups;
        let eps = opts.eps;
        self.new_tensor(OP, x.shape(), |out| {
            self.par_rows(out, len, len * ROW_WORK, |rows, o| {
                vectorized!(for (r, orow) in rows.zip(o.chunks_exact_mut(len)) {
                    let c0 = (r % groups) * k;
                    let w = ws.map(|w| &w[c0..c0 + k]);
                    let b = bs.map(|b| &b[c0..c0 + k]);
                    rowwise::group_norm(&xs[r * len..][..len], w, b, k, eps, orow);
                })
            });
        })
    }

    /// The gradients of [`group_norm`](ExecContext::group_norm) from the
    /// output's gradient `grad_y`, recomputing each (sample, group)'s mean and
    /// `rstd` from `x`: `[grad_x, grad_weight, grad_bias]`, each computed only
    /// where `needs` asks for it (`None` elsewhere). With `xhat = (x - mean) *
    /// rstd` and `g = grad_y * weight[c]` (`grad_y` without a weight), over
    /// each (sample, group):
    ///
    /// - `grad_x = rstd * (g - mean(g) - xhat * mean(g * xhat))`;
    /// - `grad_weight[c] = sum over samples and space of grad_y * xhat` (`[C]`);
    /// - `grad_bias[c] = sum over samples and space of grad_y` (`[C]`).
    ///
    /// The parameter gradients do not read `weight` and may be asked for
    /// without one. Each channel's sums are taken by one task: per sample in
    /// order, the fixed-order sums of the plane (`grad_weight` adds
    /// `rstd * sum(grad_y * (x - mean))`).
    ///
    /// # Errors
    /// As [`group_norm`](ExecContext::group_norm) for `x`, `weight` and the
    /// options; [`ExecError::ShapeMismatch`] if `grad_y` does not have `x`'s
    /// shape; [`ExecError::OutOfMemory`].
    pub fn group_norm_backward(
        &self,
        x: &RawTensor,
        weight: Option<&RawTensor>,
        grad_y: &RawTensor,
        opts: GroupNormOptions,
        needs: [bool; 3],
    ) -> Result<[Option<RawTensor>; 3], ExecError> {
        const OP: &str = "group_norm_backward";
        let d = check(OP, x, weight, None, opts)?;
        check_grad_shape(OP, x, grad_y)?;
        let (xc, gyc) = (self.contiguous(x)?, self.contiguous(grad_y)?);
        let (xs, gys) = (xc.contiguous_slice(), gyc.contiguous_slice());
        if needs[0] {
            let wc = weight.map(|w| self.contiguous(w)).transpose()?;
            let ws = wc.as_ref().map(RawTensor::contiguous_slice);
            let (gx, gw, gb) = fused_backward(self, OP, xs, ws, gys, x.shape(), d, opts, needs)?;
            return Ok([Some(gx), gw, gb]);
        }
        if !(needs[1] || needs[2]) {
            return Ok([None, None, None]);
        }
        let (grad_weight, grad_bias) = param_grads(self, OP, xs, gys, d, opts)?;
        Ok([
            None,
            needs[1].then_some(grad_weight),
            needs[2].then_some(grad_bias),
        ])
    }
}

/// The input gradient and, where `needs` asks, the parameter gradients in
/// one sweep of the rows: each (sample, group) row's task writes its input
/// gradient and its channels' plane sums
/// ([`rowwise::group_norm_backward_sums`], four passes over the row, which
/// stays in cache); the parameter gradients then add the samples' sums per
/// channel in order: the same bits as [`param_grads`] (the same sums of the
/// same values in the same order).
#[allow(clippy::too_many_arguments)] // the operands, their shape, the options and needs
fn fused_backward(
    ctx: &ExecContext,
    op: &'static str,
    xs: &[f32],
    ws: Option<&[f32]>,
    gys: &[f32],
    shape: &[usize],
    d: GroupDims,
    opts: GroupNormOptions,
    needs: [bool; 3],
) -> Result<(RawTensor, Option<RawTensor>, Option<RawTensor>), ExecError> {
    let GroupDims {
        n,
        c,
        per_group: k,
        plane,
    } = d;
    let (groups, eps, len) = (opts.num_groups, opts.eps, k * plane);
    let mut grad_x = None;
    let row_sums = ctx.new_tensor(op, &[n * groups, 2 * k], |rs| {
        grad_x = Some(ctx.new_tensor(op, shape, |gx| {
            ctx.par_rows2((gx, len), (rs, 2 * k), len * ROW_WORK, |rows, o, s| {
                let rows = rows.zip(o.chunks_exact_mut(len));
                vectorized!(
                    for ((r, orow), srow) in rows.zip(s.chunks_exact_mut(2 * k)) {
                        let c0 = (r % groups) * k;
                        let w = ws.map(|w| &w[c0..c0 + k]);
                        let (xr, gr) = (&xs[r * len..][..len], &gys[r * len..][..len]);
                        rowwise::group_norm_backward_sums(xr, w, gr, k, eps, orow, srow);
                    }
                )
            });
        }));
    })?;
    let grad_x = grad_x.expect("new_tensor runs its fill")?;
    let rs = row_sums.contiguous_slice();
    // Row `sample * groups + ch / k` holds channel `ch`'s sums at `ch % k`:
    // sample by sample, in order.
    let column = |j: usize| {
        ctx.new_tensor(op, &[c], |out: &mut [f32]| {
            for (ch, o) in out.iter_mut().enumerate() {
                let mut acc = 0.0f32;
                for sample in 0..n {
                    let r = sample * groups + ch / k;
                    acc += rs[r * 2 * k + 2 * (ch % k) + j];
                }
                *o = acc;
            }
        })
    };
    let gw = needs[1].then(|| column(1)).transpose()?;
    let gb = needs[2].then(|| column(0)).transpose()?;
    Ok((grad_x, gw, gb))
}

/// `(grad_weight, grad_bias)` of a group norm (see
/// [`ExecContext::group_norm_backward`]) from the contiguous input and output
/// gradient.
fn param_grads(
    ctx: &ExecContext,
    op: &'static str,
    xs: &[f32],
    gys: &[f32],
    d: GroupDims,
    opts: GroupNormOptions,
) -> Result<(RawTensor, RawTensor), ExecError> {
    let GroupDims {
        n,
        c,
        per_group: k,
        plane,
    } = d;
    let (groups, len) = (opts.num_groups, k * plane);
    // Per (sample, group) row: the mean and rstd the forward normalized with.
    let stats = ctx.new_tensor(op, &[n * groups, 2], |st| {
        ctx.par_rows(st, 2, len * 2, |rows, o| {
            vectorized!(for (r, s) in rows.zip(o.chunks_exact_mut(2)) {
                let (mean, rstd) = rowwise::layer_norm_stats(&xs[r * len..][..len], opts.eps);
                s[0] = mean;
                s[1] = rstd;
            })
        });
    })?;
    let st = stats.contiguous_slice();
    // Per channel: sum(grad_y) and sum(rstd * sum(grad_y * (x - mean))), the
    // samples in order.
    let sums = ctx.new_tensor(op, &[c, 2], |out| {
        ctx.par_rows(out, 2, (n * plane).saturating_mul(3), |rows, o| {
            vectorized!(for (ch, s) in rows.zip(o.chunks_exact_mut(2)) {
                let (mut s0, mut s1) = (0.0f32, 0.0f32);
                for k in 0..n {
                    let r = k * groups + ch / (c / groups);
                    let (mean, rstd) = (st[2 * r], st[2 * r + 1]);
                    let off = (k * c + ch) * plane;
                    let (a, b) = plane_grad_sums(&gys[off..][..plane], &xs[off..][..plane], mean);
                    s0 += a;
                    s1 += b * rstd;
                }
                s[0] = s1;
                s[1] = s0;
            })
        });
    })?;
    let ss = sums.contiguous_slice();
    let column = |j: usize| {
        ctx.new_tensor(op, &[c], |out: &mut [f32]| {
            for (d, s) in out.iter_mut().zip(ss.chunks_exact(2)) {
                *d = s[j];
            }
        })
    };
    Ok((column(0)?, column(1)?))
}
