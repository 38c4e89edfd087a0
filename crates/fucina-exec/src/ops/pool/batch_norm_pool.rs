//! Training-mode batch normalization followed by a 2-D pooling op, fused.
//!
//! A convolutional block `conv -> batch_norm -> relu -> max_pool` spends most of
//! its non-GEMM time streaming the full-resolution activation through memory:
//! the normalized tensor is written, read by the pool, read again by the pool's
//! backward, whose full-resolution gradient is written and then read twice by
//! the batch norm's backward. The fused op never materializes either
//! full-resolution intermediate. Each plane `(n, c)` is normalized into a
//! scratch plane that stays in the L1 cache, pooled from there. The backward
//! recomputes the plane the same way and runs the pool's backward straight into
//! the input gradient's memory, taking the plane's two batch-norm sums while it
//! is in cache; a second pass turns it into the input gradient in place. For
//! the 2x2 ReLU-max pool at the AVX-512 level the normalization happens in
//! registers inside the pool's kernels (`kernels::pool_2x2`), with no scratch
//! plane. Over
//! full-resolution tensors that is five reads and two writes (the statistics,
//! the pooled forward, the two backward passes), against eight reads and three
//! writes for the separate ops.
//!
//! **The bits are those of the unfused ops.** Every value is computed by the
//! same plane functions the separate ops use, in the same order: the
//! normalization's `(x - mean) * (gamma * inv_std) + beta`, the pool's plane
//! forward and backward, the per-plane backward sums added sample by sample,
//! and the input gradient's expression. So `batch_norm_pool2d` equals
//! `batch_norm` then `pool2d`, and its backward equals `pool2d_backward` then
//! `batch_norm_backward`, bit for bit, for every team size and vector level
//! (tests check it).
//!
//! The module is a child of the pool op's (`ops/pool.rs`), whose per-plane
//! loops are private to it and its children; the batch norm's per-plane loops
//! are kernels (`kernels/batch_norm.rs`) and its checks and statistics type
//! are shared helpers (`ops/common.rs`).

use super::{
    Geo, Pool2dOp, ReluMax2x2Avx512, backward_plane, forward_plane, plane_work, zero_uncovered_2x2,
};
use crate::context::ExecContext;
use crate::error::ExecError;
use crate::kernels::batch_norm::{
    GradXCoefs, grad_x_plane_in_place, normalize_plane, plane_grad_sums,
};
use crate::kernels::pool_2x2::Affine;
use crate::kernels::simd::vectorized;
use crate::ops::common::{BatchNormStats, check_batch_norm, check_batch_norm_training};
use crate::tensor::RawTensor;

/// Per-element work weight of normalizing a plane into scratch.
const NORM_WORK: usize = 2;

/// Samples per parallel call of a two-output pass (the pairs of row slices
/// live on the stack).
const GROUP: usize = 64;

impl ExecContext {
    /// Training-mode [`batch_norm`](ExecContext::batch_norm) of `x` (`[N, C, H,
    /// W]`) followed by [`pool2d`](ExecContext::pool2d) with `op`, fused: the
    /// pooled output and the batch statistics, without the normalized tensor.
    /// The same bits as the two ops in sequence (see the module docs), with one
    /// pass less over the full-resolution activation and none of its memory.
    ///
    /// ```
    /// use fucina_exec::{ExecContext, Pool2dOp, Pool2dOptions};
    ///
    /// let ctx = ExecContext::new();
    /// let x = ctx.from_slice(&[2, 1, 2, 2], &[1., -2., 3., 0.5, -1., 4., 2., -3.])?;
    /// let (g, b) = (ctx.from_slice(&[1], &[1.5])?, ctx.from_slice(&[1], &[0.25])?);
    /// let op = Pool2dOp::ReluMax(Pool2dOptions::new([2, 2]));
    /// let (fused, stats) = ctx.batch_norm_pool2d(&x, &g, &b, 1e-5, op)?;
    /// let (y, _) = ctx.batch_norm(&x, &g, &b, 1e-5)?;
    /// assert_eq!(fused.to_vec(), ctx.pool2d(op, &y)?.to_vec());
    /// assert_eq!(stats.mean.to_vec(), [0.5625]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// As [`pool2d`](ExecContext::pool2d) for the shape and the options (the
    /// error names the pool op), then as [`batch_norm`](ExecContext::batch_norm)
    /// for the parameters and `eps`; [`ExecError::OutOfMemory`]. Nothing is
    /// allocated before the checks pass.
    pub fn batch_norm_pool2d(
        &self,
        x: &RawTensor,
        gamma: &RawTensor,
        beta: &RawTensor,
        eps: f32,
        op: Pool2dOp,
    ) -> Result<(RawTensor, BatchNormStats), ExecError> {
        const OP: &str = "batch_norm_pool2d";
        let out_dims = op.output_shape(x.shape())?;
        let dims @ (_, ch, _) = check_batch_norm_training(OP, x, &[gamma, beta], eps)?;
        let os = out_dims.as_slice();
        let g = Geo::new(x.shape(), os);
        let (ip, opl) = g.planes();
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
        let packed = self.training_stats(OP, xs, dims, eps)?;
        let ps = packed.contiguous_slice();
        let (mean, istd) = (&ps[..ch], &ps[2 * ch..]);
        let work = plane_work(op, ip, opl).saturating_add(NORM_WORK * ip);
        let fast = ReluMax2x2Avx512::new(op);
        let mut done = Ok(());
        let pooled = self.new_tensor(OP, os, |out| {
            done = self.par_rows_with_scratch(OP, out, opl, work, ip, |planes, o, z| {
                vectorized!(for (p, dst) in planes.zip(o.chunks_exact_mut(opl)) {
                    let c = p % ch;
                    let (mu, a, b) = (mean[c], gs[c] * istd[c], bs[c]);
                    let xp = &xs[p * ip..][..ip];
                    match fast {
                        Some(k) => k.forward(xp, dst, g, Some(Affine { mu, a, b })),
                        None => {
                            normalize_plane(z, xp, mu, a, b);
                            forward_plane(op, z, dst, g);
                        }
                    }
                })
            });
        })?;
        done?;
        Ok((pooled, BatchNormStats::unpack(&packed)?))
    }

    /// The backward of [`batch_norm_pool2d`](ExecContext::batch_norm_pool2d):
    /// `(grad_x, grad_gamma, grad_beta)` from the pooled output's gradient
    /// `grad`, the forward input `x`, the parameters and the statistics the
    /// forward normalized with (`mean`, `inv_std`). The same bits as
    /// [`pool2d_backward`](ExecContext::pool2d_backward) over the normalized
    /// tensor then the training-mode
    /// [`batch_norm_backward`](ExecContext::batch_norm_backward), without the
    /// normalized tensor or the pool's full-resolution gradient.
    ///
    /// # Errors
    /// As [`pool2d`](ExecContext::pool2d) for `x`'s shape and the options;
    /// [`ExecError::InvalidShape`] / [`ExecError::ShapeMismatch`] if a
    /// per-channel tensor is not of shape `[C]` or `grad` is not of the pooled
    /// shape; [`ExecError::OutOfMemory`].
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm_pool2d_backward(
        &self,
        x: &RawTensor,
        gamma: &RawTensor,
        beta: &RawTensor,
        mean: &RawTensor,
        inv_std: &RawTensor,
        op: Pool2dOp,
        grad: &RawTensor,
    ) -> Result<(RawTensor, RawTensor, RawTensor), ExecError> {
        const OP: &str = "batch_norm_pool2d_backward";
        let out_dims = op.output_shape(x.shape())?;
        let (n, ch, plane) = check_batch_norm(OP, x, &[gamma, beta, mean, inv_std], 0.0)?;
        if grad.shape() != out_dims.as_slice() {
            return Err(ExecError::ShapeMismatch {
                op: OP,
                lhs: out_dims,
                rhs: grad.dims(),
                reason: "the gradient must have the pooled output's shape",
            });
        }
        let g = Geo::new(x.shape(), out_dims.as_slice());
        let (ip, opl) = g.planes();
        let c = |t: &RawTensor| self.contiguous(t);
        let (xc, gc, bc, mc, ic, gpc) =
            (c(x)?, c(gamma)?, c(beta)?, c(mean)?, c(inv_std)?, c(grad)?);
        let (xs, gs, bs, ms, is, gps) = (
            xc.contiguous_slice(),
            gc.contiguous_slice(),
            bc.contiguous_slice(),
            mc.contiguous_slice(),
            ic.contiguous_slice(),
            gpc.contiguous_slice(),
        );
        let work = plane_work(op, ip, opl).saturating_add((NORM_WORK + 2) * ip);
        let row_work = ch.saturating_mul(work);
        let fast = ReluMax2x2Avx512::new(op);
        let row = ch * ip;
        let mut done = Ok(());
        let mut param_grads = None;
        let grad_x = self.new_tensor(OP, x.shape(), |gx: &mut [f32]| {
            // Pass 1, per sample: the pool's gradient of each plane (from the
            // normalized plane, recomputed into scratch, or in registers by
            // the AVX-512 2x2 ReLU-max kernel) straight into `grad_x`'s
            // memory, and the plane's two backward sums.
            let mut partials = Ok(());
            let pt = self.new_tensor(OP, &[n, 2 * ch], |pt: &mut [f32]| {
                partials = self.pool_grad_pass(OP, gx, pt, row, row_work, ip, |r, gxr, ptr, z| {
                    vectorized!(for c in 0..ch {
                        let p = r * ch + c;
                        let (mu, a, b) = (ms[c], gs[c] * is[c], bs[c]);
                        let xp = &xs[p * ip..][..ip];
                        let gz = &mut gxr[c * ip..][..ip];
                        let gp = &gps[p * opl..][..opl];
                        match fast {
                            Some(k) => {
                                k.backward(xp, gp, gz, g, Some(Affine { mu, a, b }));
                                zero_uncovered_2x2(gz, g);
                            }
                            None => {
                                normalize_plane(z, xp, mu, a, b);
                                backward_plane(op, z, gp, gz, g);
                            }
                        }
                        let (s0, s1) = plane_grad_sums(gz, xp, mu);
                        ptr[2 * c] = s0;
                        ptr[2 * c + 1] = s1;
                    })
                });
            });
            let pt = match (pt, partials) {
                (Ok(pt), Ok(())) => pt,
                (Err(e), _) | (_, Err(e)) => {
                    done = Err(e);
                    return;
                }
            };
            // The channel sums, samples in order (the unfused op's order).
            let ps = pt.contiguous_slice();
            let sums = self.new_tensor(OP, &[ch, 2], |ss: &mut [f32]| {
                ss.fill(0.0);
                for prow in ps.chunks_exact(2 * ch) {
                    for (s, &v) in ss.iter_mut().zip(prow) {
                        *s += v;
                    }
                }
            });
            let sums = match sums {
                Ok(t) => t,
                Err(e) => {
                    done = Err(e);
                    return;
                }
            };
            let ss = sums.contiguous_slice();
            param_grads = Some(self.batch_norm_param_grads(OP, ss, is));
            let m = (n * plane) as f32;
            // Pass 2, per sample, in place: the input gradient from the pool's.
            self.par_rows(gx, row, row * 2, |rows, o| {
                vectorized!(for (r, orow) in rows.zip(o.chunks_exact_mut(row)) {
                    for c in 0..ch {
                        let coefs = GradXCoefs::of(c, ms, is, gs, ss, m);
                        let xp = &xs[(r * ch + c) * ip..][..ip];
                        grad_x_plane_in_place(&mut orow[c * ip..][..ip], xp, coefs);
                    }
                })
            });
        })?;
        done?;
        let (grad_gamma, grad_beta) = param_grads.expect("pass 1 ran")?;
        Ok((grad_x, grad_gamma, grad_beta))
    }
}

impl ExecContext {
    /// Runs `f(sample, grad_x_row, partials_row, scratch)` for every sample, in
    /// parallel over samples: the rows of two outputs (`gx`, rows of `row`
    /// items, and `pt`, rows of `pt.len() / samples` items) split alike, and a
    /// scratch plane of `ip` floats per participant. In groups of [`GROUP`]
    /// samples, whose row pairs live on the stack (no allocation). `f` picks
    /// its own vector level (`vectorized!` inside it).
    #[allow(clippy::too_many_arguments)]
    fn pool_grad_pass(
        &self,
        op: &'static str,
        gx: &mut [f32],
        pt: &mut [f32],
        row: usize,
        work: usize,
        ip: usize,
        f: impl Fn(usize, &mut [f32], &mut [f32], &mut [f32]) + Sync,
    ) -> Result<(), ExecError> {
        let samples = gx.len() / row.max(1);
        let prow = pt.len() / samples.max(1);
        let (mut gx, mut pt) = (gx, pt);
        let mut first = 0;
        while first < samples {
            let k = GROUP.min(samples - first);
            let (gh, gt) = gx.split_at_mut(k * row);
            let (ph, ptail) = pt.split_at_mut(k * prow);
            let mut pairs: [(&mut [f32], &mut [f32]); GROUP] =
                std::array::from_fn(|_| (&mut [][..], &mut [][..]));
            for (pair, (g, p)) in pairs
                .iter_mut()
                .zip(gh.chunks_exact_mut(row).zip(ph.chunks_exact_mut(prow)))
            {
                *pair = (g, p);
            }
            self.par_rows_with_scratch(op, &mut pairs[..k], 1, work, ip, |rows, o, z| {
                for (r, (gxr, ptr)) in rows.zip(o.iter_mut()) {
                    f(first + r, gxr, ptr, z);
                }
            })?;
            (gx, pt) = (gt, ptail);
            first += k;
        }
        Ok(())
    }
}
