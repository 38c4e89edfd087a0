//! `layer_norm` and `rms_norm` over the last axis, and their backward kernels.
//!
//! Both follow PyTorch: `layer_norm` normalizes with the biased variance and `eps`
//! inside the square root, `y = (x - mean) / sqrt(var + eps) * gamma + beta`;
//! `rms_norm` is `y = x / sqrt(mean(x^2) + eps) * gamma`. The row statistics use
//! the fixed-order sums of the reductions, so a row's result depends only on the
//! row (batch invariance) and never on the team size.

use crate::context::ExecContext;
use crate::error::ExecError;
use crate::kernels::reduce::{col_sum, col_sum_with, for_each_col_tile};
use crate::kernels::simd::vectorized;
use crate::kernels::{prefetch, rowwise};
use crate::ops::common::{check_grad_shape, check_param_shapes};
use crate::tensor::RawTensor;
use crate::tensor::layout::Dims;

/// Per-element work weight of a norm row (two statistics passes and the output).
const NORM_WORK: usize = 4;

/// Checks `eps` and that each parameter has shape `[last axis of x]`.
fn check_params(
    op: &'static str,
    x: &RawTensor,
    params: &[&RawTensor],
    eps: f32,
) -> Result<(), ExecError> {
    let c = x.shape()[x.rank() - 1];
    let reason = "gamma and beta must have shape [size of the last axis]";
    check_param_shapes(op, x, c, params, eps, reason)
}

impl ExecContext {
    /// Layer normalization over the last axis (PyTorch's `layer_norm` with
    /// `normalized_shape = [last]`): per row, `(x - mean) / sqrt(var + eps) * gamma +
    /// beta` with the biased variance; `gamma` and `beta` have shape `[last]`.
    ///
    /// ```
    /// use fucina_exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = ctx.from_slice(&[1, 4], &[1., 2., 3., 4.])?;
    /// let (g, b) = (ctx.ones(&[4])?, ctx.zeros(&[4])?);
    /// let y = ctx.layer_norm(&x, &g, &b, 0.0)?.to_vec();
    /// let s = (1.25f32).sqrt(); // the biased standard deviation
    /// assert!((y[0] + 1.5 / s).abs() < 1e-6 && (y[3] - 1.5 / s).abs() < 1e-6);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::ShapeMismatch`] if `gamma` or `beta` is not of shape `[last]`;
    /// [`ExecError::InvalidArgument`] if `eps` is negative, infinite or NaN;
    /// [`ExecError::OutOfMemory`].
    pub fn layer_norm(
        &self,
        x: &RawTensor,
        gamma: &RawTensor,
        beta: &RawTensor,
        eps: f32,
    ) -> Result<RawTensor, ExecError> {
        const OP: &str = "layer_norm";
        check_params(OP, x, &[gamma, beta], eps)?;
        let c = x.shape()[x.rank() - 1];
        let (xc, gc, bc) = (
            self.contiguous(x)?,
            self.contiguous(gamma)?,
            self.contiguous(beta)?,
        );
        let (xs, gs, bs) = (
            xc.contiguous_slice(),
            gc.contiguous_slice(),
            bc.contiguous_slice(),
        );
        self.new_tensor(OP, x.shape(), |out| {
            self.par_rows(out, c, c * NORM_WORK, |rows, o| {
                let end = rows.end;
                vectorized!(for (r, orow) in rows.zip(o.chunks_exact_mut(c)) {
                    prefetch::next_row(xs, r + 1, end, c);
                    rowwise::layer_norm(&xs[r * c..][..c], gs, bs, eps, orow);
                })
            });
        })
    }

    /// RMS normalization over the last axis: per row, `x / sqrt(mean(x^2) + eps) *
    /// gamma`; `gamma` has shape `[last]`.
    ///
    /// # Errors
    /// [`ExecError::ShapeMismatch`] if `gamma` is not of shape `[last]`;
    /// [`ExecError::InvalidArgument`] if `eps` is negative, infinite or NaN;
    /// [`ExecError::OutOfMemory`].
    pub fn rms_norm(
        &self,
        x: &RawTensor,
        gamma: &RawTensor,
        eps: f32,
    ) -> Result<RawTensor, ExecError> {
        const OP: &str = "rms_norm";
        check_params(OP, x, &[gamma], eps)?;
        let c = x.shape()[x.rank() - 1];
        let (xc, gc) = (self.contiguous(x)?, self.contiguous(gamma)?);
        let (xs, gs) = (xc.contiguous_slice(), gc.contiguous_slice());
        self.new_tensor(OP, x.shape(), |out| {
            self.par_rows(out, c, c * NORM_WORK, |rows, o| {
                let end = rows.end;
                vectorized!(for (r, orow) in rows.zip(o.chunks_exact_mut(c)) {
                    prefetch::next_row(xs, r + 1, end, c);
                    rowwise::rms_norm(&xs[r * c..][..c], gs, eps, orow);
                })
            });
        })
    }

    /// The gradients of [`layer_norm`](ExecContext::layer_norm), recomputing each
    /// row's mean and `rstd = 1 / sqrt(var + eps)` from `x`. With
    /// `xhat = (x - mean) * rstd` and `g = grad_y * gamma`, per row:
    ///
    /// - `grad_x = rstd * (g - mean(g) - xhat * mean(g * xhat))`;
    /// - `grad_gamma = sum over rows of grad_y * xhat` (shape `[last]`);
    /// - `grad_beta = sum over rows of grad_y` (shape `[last]`).
    ///
    /// The sums over rows are column sums in blocks of 256 rows added in order.
    ///
    /// # Errors
    /// As [`layer_norm`](ExecContext::layer_norm) for `gamma` and `eps`;
    /// [`ExecError::ShapeMismatch`] if `grad_y` does not have `x`'s shape.
    pub fn layer_norm_backward(
        &self,
        x: &RawTensor,
        gamma: &RawTensor,
        grad_y: &RawTensor,
        eps: f32,
    ) -> Result<(RawTensor, RawTensor, RawTensor), ExecError> {
        const OP: &str = "layer_norm_backward";
        let (grad_x, grad_gamma, gyc) = self.norm_backward(
            OP,
            x,
            gamma,
            grad_y,
            eps,
            |x, gamma, gy, eps, gx| {
                vectorized!(rowwise::layer_norm_backward(x, gamma, gy, eps, gx))
            },
            |row, eps| vectorized!(rowwise::layer_norm_stats(row, eps)),
        )?;
        let c = x.shape()[x.rank() - 1];
        let rows = x.numel() / c;
        let gys = gyc.contiguous_slice();
        let grad_beta = self.new_tensor(OP, &[c], |out| {
            self.par_rows(out, 1, rows, |range, o| {
                vectorized!(for_each_col_tile(range, c, o, |_, i0, tile| {
                    col_sum(gys, c, i0, tile)
                }))
            });
        })?;
        Ok((grad_x, grad_gamma, grad_beta))
    }

    /// The gradients of [`rms_norm`](ExecContext::rms_norm), recomputing each row's
    /// `rstd = 1 / sqrt(mean(x^2) + eps)` from `x`. With `xhat = x * rstd` and
    /// `g = grad_y * gamma`, per row:
    ///
    /// - `grad_x = rstd * (g - xhat * mean(g * xhat))`;
    /// - `grad_gamma = sum over rows of grad_y * xhat` (shape `[last]`).
    ///
    /// # Errors
    /// As [`rms_norm`](ExecContext::rms_norm) for `gamma` and `eps`;
    /// [`ExecError::ShapeMismatch`] if `grad_y` does not have `x`'s shape.
    pub fn rms_norm_backward(
        &self,
        x: &RawTensor,
        gamma: &RawTensor,
        grad_y: &RawTensor,
        eps: f32,
    ) -> Result<(RawTensor, RawTensor), ExecError> {
        let (grad_x, grad_gamma, _) = self.norm_backward(
            "rms_norm_backward",
            x,
            gamma,
            grad_y,
            eps,
            |x, gamma, gy, eps, gx| vectorized!(rowwise::rms_norm_backward(x, gamma, gy, eps, gx)),
            // xhat = (x - 0) * rstd: subtracting 0 changes no bit.
            |row, eps| (0.0, vectorized!(rowwise::rms_norm_rstd(row, eps))),
        )?;
        Ok((grad_x, grad_gamma))
    }
}

/// The descriptor of the normalizations over the last axis (`layer_norm`,
/// `rms_norm`): one variant per op, holding its `eps` and naming its forward
/// kernel ([`ExecContext::norm_op`]) and its backward kernel
/// ([`ExecContext::norm_op_backward`]). The named methods run the same kernels;
/// the autograd layer records one variant per node.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum NormOp {
    /// [`ExecContext::layer_norm`] (scale `gamma` and shift `beta`).
    LayerNorm {
        /// Added to the variance inside the square root.
        eps: f32,
    },
    /// [`ExecContext::rms_norm`] (scale `gamma`, no shift).
    RmsNorm {
        /// Added to the mean square inside the square root.
        eps: f32,
    },
}

impl NormOp {
    /// The op's name (the name of its `ExecContext` method).
    pub fn name(self) -> &'static str {
        match self {
            NormOp::LayerNorm { .. } => "layer_norm",
            NormOp::RmsNorm { .. } => "rms_norm",
        }
    }

    /// The op's output shape for an input of shape `x`: `x` itself (the
    /// normalization family is shape-preserving; the forward checks the
    /// parameters' shapes against `x`'s last axis).
    pub fn out_shape(self, x: &[usize]) -> Dims {
        Dims::new(x)
    }

    /// The name of the op's backward kernel.
    pub fn backward_name(self) -> &'static str {
        match self {
            NormOp::LayerNorm { .. } => "layer_norm_backward",
            NormOp::RmsNorm { .. } => "rms_norm_backward",
        }
    }

    /// Whether the op takes a shift `beta` after its scale `gamma`
    /// (`layer_norm`).
    pub fn has_shift(self) -> bool {
        matches!(self, NormOp::LayerNorm { .. })
    }
}

impl ExecContext {
    /// Runs the forward kernel of the normalization `op` (the same kernel, and
    /// the same bits, as the op's named method). `beta` is the shift of ops
    /// whose [`has_shift`](NormOp::has_shift) is true, `None` for the others.
    ///
    /// # Errors
    /// [`ExecError::InvalidArgument`] if `beta` is missing, or given to an op
    /// without a shift; otherwise as the named method.
    pub fn norm_op(
        &self,
        op: NormOp,
        x: &RawTensor,
        gamma: &RawTensor,
        beta: Option<&RawTensor>,
    ) -> Result<RawTensor, ExecError> {
        match (op, beta) {
            (NormOp::LayerNorm { eps }, Some(beta)) => self.layer_norm(x, gamma, beta, eps),
            (NormOp::RmsNorm { eps }, None) => self.rms_norm(x, gamma, eps),
            _ => Err(ExecError::InvalidArgument {
                op: op.name(),
                reason: "layer_norm takes a shift beta, rms_norm none",
            }),
        }
    }

    /// Runs the backward kernel of the normalization `op` at the forward input
    /// `x` and scale `gamma`: `(grad_x, grad_gamma, grad_beta)`, `grad_beta`
    /// only for ops with a shift (`None` for `rms_norm`).
    ///
    /// # Errors
    /// As the named backward kernel.
    pub fn norm_op_backward(
        &self,
        op: NormOp,
        x: &RawTensor,
        gamma: &RawTensor,
        grad_y: &RawTensor,
    ) -> Result<(RawTensor, RawTensor, Option<RawTensor>), ExecError> {
        match op {
            NormOp::LayerNorm { eps } => {
                let (gx, gg, gb) = self.layer_norm_backward(x, gamma, grad_y, eps)?;
                Ok((gx, gg, Some(gb)))
            }
            NormOp::RmsNorm { eps } => {
                let (gx, gg) = self.rms_norm_backward(x, gamma, grad_y, eps)?;
                Ok((gx, gg, None))
            }
        }
    }
}

/// A row kernel of a norm's backward: `(x_row, gamma, grad_y_row, eps, grad_x_row)`.
type NormRowBackward = fn(&[f32], &[f32], &[f32], f32, &mut [f32]);

impl ExecContext {
    /// The part the norm backward kernels share: validation, contiguous operands,
    /// `grad_x` from the row kernel, and `grad_gamma`, the fixed-order column sum of
    /// `grad_y * xhat` with `xhat = (x - shift) * rstd` and the per-row
    /// `(shift, rstd)` of `row_stats`. Also returns the contiguous `grad_y`.
    #[allow(clippy::too_many_arguments)]
    fn norm_backward(
        &self,
        op: &'static str,
        x: &RawTensor,
        gamma: &RawTensor,
        grad_y: &RawTensor,
        eps: f32,
        row_backward: NormRowBackward,
        row_stats: fn(&[f32], f32) -> (f32, f32),
    ) -> Result<(RawTensor, RawTensor, RawTensor), ExecError> {
        check_params(op, x, &[gamma], eps)?;
        check_grad_shape(op, x, grad_y)?;
        let c = x.shape()[x.rank() - 1];
        let rows = x.numel() / c;
        let (xc, gc, gyc) = (
            self.contiguous(x)?,
            self.contiguous(gamma)?,
            self.contiguous(grad_y)?,
        );
        let (xs, gs, gys) = (
            xc.contiguous_slice(),
            gc.contiguous_slice(),
            gyc.contiguous_slice(),
        );
        let grad_x = self.new_tensor(op, x.shape(), |out| {
            self.par_rows(out, c, c * NORM_WORK, |r, o| {
                for (r, orow) in r.zip(o.chunks_exact_mut(c)) {
                    row_backward(&xs[r * c..][..c], gs, &gys[r * c..][..c], eps, orow);
                }
            });
        })?;
        let stats = self.new_tensor(op, &[rows, 2], |st| {
            self.par_rows(st, 2, c * 2, |r, o| {
                for (r, s) in r.zip(o.chunks_exact_mut(2)) {
                    let (shift, rstd) = row_stats(&xs[r * c..][..c], eps);
                    s[0] = shift;
                    s[1] = rstd;
                }
            });
        })?;
        let st = stats.contiguous_slice();
        let grad_gamma = self.new_tensor(op, &[c], |out| {
            self.par_rows(out, 1, rows * 2, |range, o| {
                vectorized!(for_each_col_tile(range, c, o, |_, i0, tile| {
                    let w = tile.len();
                    col_sum_with(rows, tile, |k, acc| {
                        let (shift, rstd) = (st[2 * k], st[2 * k + 1]);
                        let gr = &gys[k * c + i0..][..w];
                        let xr = &xs[k * c + i0..][..w];
                        for ((a, &g), &v) in acc.iter_mut().zip(gr).zip(xr) {
                            *a += g * ((v - shift) * rstd);
                        }
                    });
                }))
            });
        })?;
        Ok((grad_x, grad_gamma, gyc))
    }
}
