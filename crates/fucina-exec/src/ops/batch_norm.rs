//! Batch normalization over axis 1 of `[N, C]`, `[N, C, L]`, `[N, C, H, W]` (any
//! rank from 2): training mode with the batch statistics, eval mode with running
//! statistics, and their backward kernel.
//!
//! **Order of the statistics.** A channel's statistics are computed by one task:
//! for each sample `n` in order, the fixed-order sum of the reductions over the
//! channel's plane (`x[n, c, ..]`, a grouping that depends only on the plane size)
//! is added to the running total. The mean is that total over `M = N * plane`;
//! the biased variance is the same kind of sum of `(x - mean)^2`, over `M`. So the
//! bits never depend on the team size or the vector level. In training mode they
//! do depend on the batch, by definition: every output element is normalized
//! with statistics of the whole batch. Eval mode is batch-invariant.

use crate::context::ExecContext;
use crate::error::ExecError;
use crate::kernels::batch_norm::{GradXCoefs, grad_x_plane, normalize_plane, plane_grad_sums};
use crate::kernels::reduce::sum_map;
use crate::kernels::simd::vectorized;
use crate::ops::common::{
    BatchNormStats, check_batch_norm, check_batch_norm_training, check_grad_shape,
};
use crate::tensor::RawTensor;

/// Per-element work weight of a statistics pass.
const STATS_WORK: usize = 3;

/// `1 / sqrt(var + eps)`, the one formula both modes use.
#[inline(always)]
fn inv_std(var: f32, eps: f32) -> f32 {
    1.0 / (var + eps).sqrt()
}

/// The fixed-order sum over channel `c`'s planes of `f` applied per plane.
#[inline(always)]
fn channel_sum(n: usize, c: usize, ch: usize, plane: usize, f: impl Fn(usize) -> f32) -> f32 {
    let mut s = 0.0f32;
    for k in 0..n {
        s += f((k * ch + c) * plane);
    }
    s
}

impl ExecContext {
    /// `(grad_gamma, grad_beta)` from the `[C, 2]` backward sums (`sum(gy)`,
    /// `sum(gy * (x - mean))`) and `inv_std`.
    pub(crate) fn batch_norm_param_grads(
        &self,
        op: &'static str,
        ss: &[f32],
        is: &[f32],
    ) -> Result<(RawTensor, RawTensor), ExecError> {
        let ch = is.len();
        let grad_beta = self.new_tensor(op, &[ch], |out: &mut [f32]| {
            for (c, d) in out.iter_mut().enumerate() {
                *d = ss[2 * c];
            }
        })?;
        let grad_gamma = self.new_tensor(op, &[ch], |out: &mut [f32]| {
            for (c, d) in out.iter_mut().enumerate() {
                *d = ss[2 * c + 1] * is[c];
            }
        })?;
        Ok((grad_gamma, grad_beta))
    }

    /// Per channel `c`: the mean and the biased variance of `x[:, c, ..]`, into
    /// `[C, 2]` (two passes over each channel, the second from cache).
    fn channel_stats(
        &self,
        op: &'static str,
        xs: &[f32],
        (n, ch, plane): (usize, usize, usize),
    ) -> Result<RawTensor, ExecError> {
        let m = (n * plane) as f32;
        self.new_tensor(op, &[ch, 2], |out| {
            self.par_rows(out, 2, (n * plane).saturating_mul(STATS_WORK), |rows, o| {
                vectorized!(for (c, st) in rows.zip(o.chunks_exact_mut(2)) {
                    let mean = channel_sum(n, c, ch, plane, |off| match plane {
                        1 => xs[off],
                        _ => sum_map(&xs[off..off + plane], |v| v),
                    }) / m;
                    let var = channel_sum(n, c, ch, plane, |off| {
                        let sq = |v: f32| (v - mean) * (v - mean);
                        match plane {
                            1 => sq(xs[off]),
                            _ => sum_map(&xs[off..off + plane], sq),
                        }
                    }) / m;
                    st[0] = mean;
                    st[1] = var;
                })
            });
        })
    }

    /// `y[n, c, i] = (x[n, c, i] - mean[c]) * (gamma[c] * inv_std[c]) + beta[c]`,
    /// in parallel over the samples.
    #[allow(clippy::too_many_arguments)]
    fn normalize(
        &self,
        op: &'static str,
        shape: &[usize],
        xs: &[f32],
        mean: &[f32],
        istd: &[f32],
        gamma: &[f32],
        beta: &[f32],
        plane: usize,
    ) -> Result<RawTensor, ExecError> {
        let ch = mean.len();
        let row = ch * plane;
        self.new_tensor(op, shape, |out| {
            self.par_rows(out, row, row, |rows, o| {
                vectorized!(for (r, orow) in rows.zip(o.chunks_exact_mut(row)) {
                    let xrow = &xs[r * row..][..row];
                    for c in 0..ch {
                        let (mu, a, b) = (mean[c], gamma[c] * istd[c], beta[c]);
                        let dst = &mut orow[c * plane..][..plane];
                        normalize_plane(dst, &xrow[c * plane..][..plane], mu, a, b);
                    }
                })
            });
        })
    }

    /// Batch normalization in training mode over axis 1 of `x` (`[N, C, ...]`,
    /// rank at least 2): per channel, `y = (x - mean) / sqrt(var + eps) * gamma +
    /// beta` with the batch mean and the **biased** batch variance over every axis
    /// but 1 (PyTorch's `batch_norm(training=True)`). Returns the output and the
    /// batch statistics (see [`BatchNormStats`]); exactly
    /// `y = (x - mean) * (gamma * inv_std) + beta`.
    ///
    /// The statistics are summed in a fixed order (see the module docs): the
    /// same bits for every team size and vector level. The result depends on the
    /// whole batch by definition (a sample's output changes with the other
    /// samples); use [`batch_norm_eval`](ExecContext::batch_norm_eval) for a
    /// batch-invariant normalization.
    ///
    /// ```
    /// use fucina_exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = ctx.from_slice(&[4, 1], &[1., 2., 3., 4.])?;
    /// let (g, b) = (ctx.ones(&[1])?, ctx.zeros(&[1])?);
    /// let (y, stats) = ctx.batch_norm(&x, &g, &b, 0.0)?;
    /// assert_eq!(stats.mean.to_vec(), [2.5]);
    /// assert!((stats.unbiased_var.to_vec()[0] - 5.0 / 3.0).abs() < 1e-6);
    /// let s = 1.25f32.sqrt(); // the biased standard deviation
    /// assert!((y.to_vec()[0] + 1.5 / s).abs() < 1e-6);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`] if `x` has rank below 2, or only one value per
    /// channel (`N * plane == 1`, no variance to estimate);
    /// [`ExecError::ShapeMismatch`] if `gamma` or `beta` is not of shape `[C]`;
    /// [`ExecError::InvalidArgument`] if `eps` is negative, infinite or NaN;
    /// [`ExecError::OutOfMemory`].
    pub fn batch_norm(
        &self,
        x: &RawTensor,
        gamma: &RawTensor,
        beta: &RawTensor,
        eps: f32,
    ) -> Result<(RawTensor, BatchNormStats), ExecError> {
        const OP: &str = "batch_norm";
        let dims @ (_, ch, plane) = check_batch_norm_training(OP, x, &[gamma, beta], eps)?;
        let (xc, gc, bc) = (
            self.contiguous(x)?,
            self.contiguous(gamma)?,
            self.contiguous(beta)?,
        );
        let xs = xc.contiguous_slice();
        let packed = self.training_stats(OP, xs, dims, eps)?;
        let ps = packed.contiguous_slice();
        let y = self.normalize(
            OP,
            x.shape(),
            xs,
            &ps[..ch],
            &ps[2 * ch..],
            gc.contiguous_slice(),
            bc.contiguous_slice(),
            plane,
        )?;
        Ok((y, BatchNormStats::unpack(&packed)?))
    }

    /// The training-mode statistics of `xs` (`(N, C, plane)`) packed as `[3, C]`:
    /// the mean, the unbiased variance and `inv_std` (see [`BatchNormStats`]).
    pub(crate) fn training_stats(
        &self,
        op: &'static str,
        xs: &[f32],
        dims @ (n, ch, plane): (usize, usize, usize),
        eps: f32,
    ) -> Result<RawTensor, ExecError> {
        let raw = self.channel_stats(op, xs, dims)?;
        let st = raw.contiguous_slice();
        let m = (n * plane) as f32;
        let bessel = m / (m - 1.0);
        self.new_tensor(op, &[3, ch], |out: &mut [f32]| {
            let (mean, rest) = out.split_at_mut(ch);
            let (uvar, istd) = rest.split_at_mut(ch);
            for c in 0..ch {
                mean[c] = st[2 * c];
                uvar[c] = st[2 * c + 1] * bessel;
                istd[c] = inv_std(st[2 * c + 1], eps);
            }
        })
    }

    /// Batch normalization in eval mode: per channel, `y = (x - running_mean) /
    /// sqrt(running_var + eps) * gamma + beta` (computed as `(x - mean) * (gamma *
    /// inv_std) + beta` with `inv_std = 1 / sqrt(running_var + eps)`). Every
    /// element depends only on itself and the per-channel parameters, so the
    /// result is batch-invariant and the same bits for every team size.
    ///
    /// ```
    /// use fucina_exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = ctx.from_slice(&[1, 2, 2], &[1., 3., 5., 7.])?;
    /// let (rm, rv) = (ctx.from_slice(&[2], &[2., 6.])?, ctx.from_slice(&[2], &[4., 1.])?);
    /// let (g, b) = (ctx.ones(&[2])?, ctx.zeros(&[2])?);
    /// let y = ctx.batch_norm_eval(&x, &rm, &rv, &g, &b, 0.0)?;
    /// assert_eq!(y.to_vec(), [-0.5, 0.5, -1., 1.]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`] if `x` has rank below 2;
    /// [`ExecError::ShapeMismatch`] if a running statistic, `gamma` or `beta` is
    /// not of shape `[C]`; [`ExecError::InvalidArgument`] for a bad `eps`;
    /// [`ExecError::OutOfMemory`].
    pub fn batch_norm_eval(
        &self,
        x: &RawTensor,
        running_mean: &RawTensor,
        running_var: &RawTensor,
        gamma: &RawTensor,
        beta: &RawTensor,
        eps: f32,
    ) -> Result<RawTensor, ExecError> {
        const OP: &str = "batch_norm_eval";
        let (_, _, plane) =
            check_batch_norm(OP, x, &[running_mean, running_var, gamma, beta], eps)?;
        let istd = self.batch_norm_inv_std(running_var, eps)?;
        let (xc, mc, gc, bc) = (
            self.contiguous(x)?,
            self.contiguous(running_mean)?,
            self.contiguous(gamma)?,
            self.contiguous(beta)?,
        );
        self.normalize(
            OP,
            x.shape(),
            xc.contiguous_slice(),
            mc.contiguous_slice(),
            istd.contiguous_slice(),
            gc.contiguous_slice(),
            bc.contiguous_slice(),
            plane,
        )
    }

    /// `1 / sqrt(var + eps)` elementwise over a per-channel variance `var`
    /// (`[C]`): the factor [`batch_norm_eval`](ExecContext::batch_norm_eval)
    /// normalizes with, bit for bit, and what
    /// [`batch_norm_backward`](ExecContext::batch_norm_backward) takes as
    /// `inv_std` in eval mode.
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`] if `var` is not 1-D;
    /// [`ExecError::InvalidArgument`] for a bad `eps`; [`ExecError::OutOfMemory`].
    pub fn batch_norm_inv_std(&self, var: &RawTensor, eps: f32) -> Result<RawTensor, ExecError> {
        const OP: &str = "batch_norm_inv_std";
        if var.rank() != 1 {
            return Err(ExecError::InvalidShape {
                op: OP,
                shape: var.dims(),
                reason: "the variance must be 1-D ([C])",
            });
        }
        if !(eps >= 0.0 && eps.is_finite()) {
            return Err(ExecError::InvalidArgument {
                op: OP,
                reason: "eps must be finite and non-negative",
            });
        }
        let vc = self.contiguous(var)?;
        let vs = vc.contiguous_slice();
        self.new_tensor(OP, var.shape(), |out: &mut [f32]| {
            for (d, &v) in out.iter_mut().zip(vs) {
                *d = inv_std(v, eps);
            }
        })
    }

    /// The gradients of a batch norm with respect to `x`, `gamma` and `beta`, from
    /// the output's gradient `grad_y`. `mean` and `inv_std` (`[C]`) are what the
    /// forward normalized with: the batch statistics of
    /// [`batch_norm`](ExecContext::batch_norm) when `training` (then the gradient
    /// flows through the statistics too), the running mean and
    /// [`batch_norm_inv_std`](ExecContext::batch_norm_inv_std) of the running
    /// variance in eval mode. With `xhat = (x - mean) * inv_std`, per channel over
    /// its `M` elements:
    ///
    /// - `grad_beta = sum(grad_y)`, `grad_gamma = sum(grad_y * (x - mean)) * inv_std`;
    /// - training: `grad_x = (grad_y - grad_beta / M - xhat * grad_gamma / M) *
    ///   (inv_std * gamma)`;
    /// - eval: `grad_x = grad_y * (gamma * inv_std)`.
    ///
    /// The channel sums are taken in the fixed order of the module docs.
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`] if `x` has rank below 2;
    /// [`ExecError::ShapeMismatch`] if `gamma`, `mean` or `inv_std` is not of shape
    /// `[C]` or `grad_y` is not of `x`'s shape; [`ExecError::OutOfMemory`].
    pub fn batch_norm_backward(
        &self,
        x: &RawTensor,
        gamma: &RawTensor,
        mean: &RawTensor,
        inv_std: &RawTensor,
        grad_y: &RawTensor,
        training: bool,
    ) -> Result<(RawTensor, RawTensor, RawTensor), ExecError> {
        const OP: &str = "batch_norm_backward";
        let (n, ch, plane) = check_batch_norm(OP, x, &[gamma, mean, inv_std], 0.0)?;
        check_grad_shape(OP, x, grad_y)?;
        let (xc, gc, mc, ic, gyc) = (
            self.contiguous(x)?,
            self.contiguous(gamma)?,
            self.contiguous(mean)?,
            self.contiguous(inv_std)?,
            self.contiguous(grad_y)?,
        );
        let (xs, gs, ms, is, gys) = (
            xc.contiguous_slice(),
            gc.contiguous_slice(),
            mc.contiguous_slice(),
            ic.contiguous_slice(),
            gyc.contiguous_slice(),
        );
        // Per channel: sum(grad_y) and sum(grad_y * (x - mean)).
        let sums = self.new_tensor(OP, &[ch, 2], |out| {
            self.par_rows(out, 2, (n * plane).saturating_mul(STATS_WORK), |rows, o| {
                vectorized!(for (c, st) in rows.zip(o.chunks_exact_mut(2)) {
                    let mu = ms[c];
                    // Both sums in one pass over the gradient (the same bits as
                    // two: each keeps its own order), samples in order.
                    let (mut s0, mut s1) = (0.0f32, 0.0f32);
                    for k in 0..n {
                        let off = (k * ch + c) * plane;
                        let (a, b) =
                            plane_grad_sums(&gys[off..off + plane], &xs[off..off + plane], mu);
                        s0 += a;
                        s1 += b;
                    }
                    st[0] = s0;
                    st[1] = s1;
                })
            });
        })?;
        let ss = sums.contiguous_slice();
        let (grad_gamma, grad_beta) = self.batch_norm_param_grads(OP, ss, is)?;
        let m = (n * plane) as f32;
        let row = ch * plane;
        let grad_x = self.new_tensor(OP, x.shape(), |out| {
            self.par_rows(out, row, row * 2, |rows, o| {
                vectorized!(for (r, orow) in rows.zip(o.chunks_exact_mut(row)) {
                    for c in 0..ch {
                        let k = is[c] * gs[c];
                        let dst = &mut orow[c * plane..][..plane];
                        let gy = &gys[r * row + c * plane..][..plane];
                        if training {
                            let xr = &xs[r * row + c * plane..][..plane];
                            grad_x_plane(dst, gy, xr, GradXCoefs::of(c, ms, is, gs, ss, m));
                        } else {
                            for (d, &g) in dst.iter_mut().zip(gy) {
                                *d = g * k;
                            }
                        }
                    }
                })
            });
        })?;
        Ok((grad_x, grad_gamma, grad_beta))
    }
}
