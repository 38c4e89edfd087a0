//! Batch normalization in training and eval mode.

use fucina_exec::{BatchNormStats, ExecContext, Pool2dOp, RawTensor};

use crate::error::Result;
use crate::record::{GradList, grads, record};
use crate::tensor::Tensor;

/// The backward of both modes from the packed `[3, C]` parameters (`gamma`, the
/// mean and `inv_std` the forward normalized with).
fn backward(
    ctx: &ExecContext,
    x: &RawTensor,
    params: &RawTensor,
    g: &RawTensor,
    training: bool,
    needs: &[bool],
) -> Result<GradList> {
    let c = params.shape()[1];
    let row = |i: usize| -> Result<RawTensor> { Ok(params.narrow(0, i, 1)?.reshape(&[c])?) };
    let (gamma, mean, inv_std) = (row(0)?, row(1)?, row(2)?);
    let (gx, gg, gb) = ctx.batch_norm_backward(x, &gamma, &mean, &inv_std, g, training)?;
    Ok(grads![
        needs[0].then_some(gx),
        needs[1].then_some(gg),
        needs[2].then_some(gb),
    ])
}

impl Tensor {
    /// Batch normalization in training mode over axis 1 of `self` (`[N, C]`,
    /// `[N, C, L]`, `[N, C, H, W]`, any rank from 2): per channel, `(x - mean) /
    /// sqrt(var + eps) * gamma + beta` with the batch mean and the biased batch
    /// variance over every axis but 1. `gamma` and `beta` have shape `[C]`. The
    /// gradient flows through the batch statistics.
    ///
    /// The statistics are summed in a fixed order (one task per channel, the
    /// samples in order), so the bits are the same for every team size and vector
    /// level; but every output depends on the whole batch, by definition (use
    /// [`batch_norm_eval`](Tensor::batch_norm_eval) at inference).
    ///
    /// ```
    /// use fucina_autograd::Tensor;
    /// use fucina_autograd::exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::from_slice(&ctx, &[2, 1, 2], &[1., 2., 3., 4.])?;
    /// let (g, b) = (Tensor::ones(&ctx, &[1])?, Tensor::zeros(&ctx, &[1])?);
    /// let y = x.batch_norm(&ctx, &g, &b, 0.0)?;
    /// let s = 1.25f32.sqrt(); // the biased standard deviation of 1, 2, 3, 4
    /// assert!((y.to_vec()[3] - 1.5 / s).abs() < 1e-6);
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// As [`ExecContext::batch_norm`]: rank below 2, one value per channel,
    /// `gamma`/`beta` not of shape `[C]`, a bad `eps`.
    pub fn batch_norm(
        &self,
        ctx: &ExecContext,
        gamma: &Tensor,
        beta: &Tensor,
        eps: f32,
    ) -> Result<Tensor> {
        Ok(self.batch_norm_with_stats(ctx, gamma, beta, eps)?.0)
    }

    /// [`batch_norm`](Tensor::batch_norm), also returning the batch statistics
    /// (per channel `[C]`: the mean, the unbiased variance a running estimate is
    /// updated with, and `inv_std`), for a layer's running statistics.
    ///
    /// ```
    /// use fucina_autograd::Tensor;
    /// use fucina_autograd::exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::from_slice(&ctx, &[4, 1], &[1., 2., 3., 4.])?;
    /// let (g, b) = (Tensor::ones(&ctx, &[1])?, Tensor::zeros(&ctx, &[1])?);
    /// let (_, stats) = x.batch_norm_with_stats(&ctx, &g, &b, 1e-5)?;
    /// assert_eq!(stats.mean.to_vec(), [2.5]);
    /// assert!((stats.unbiased_var.to_vec()[0] - 5.0 / 3.0).abs() < 1e-6);
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// As [`batch_norm`](Tensor::batch_norm).
    pub fn batch_norm_with_stats(
        &self,
        ctx: &ExecContext,
        gamma: &Tensor,
        beta: &Tensor,
        eps: f32,
    ) -> Result<(Tensor, BatchNormStats)> {
        let (out, stats) = ctx.batch_norm(&self.raw, &gamma.raw, &beta.raw, eps)?;
        let params = ctx.stack(&[&gamma.raw, &stats.mean, &stats.inv_std], 0)?;
        let x = self.raw.clone();
        let y = record!(
            ctx,
            "batch_norm",
            out,
            &[self, gamma, beta],
            BatchNorm {
                x,
                params,
                training: true
            },
            |ctx, g, needs| backward(ctx, x, params, g, *training, needs)
        )?;
        Ok((y, stats))
    }

    /// Training-mode [`batch_norm_with_stats`](Tensor::batch_norm_with_stats)
    /// followed by [`pool2d`](Tensor::pool2d) with `op`, fused into one node
    /// ([`ExecContext::batch_norm_pool2d`]): the same values, statistics and
    /// gradient bits as the two ops, without keeping or even writing the
    /// normalized tensor (the backward recomputes it plane by plane). The node
    /// keeps the input, the parameters and the statistics.
    /// The facade's `nn::Sequential` uses it for a
    /// `BatchNorm2d` in training mode followed by a ReLU and a max pool.
    ///
    /// ```
    /// use fucina_autograd::{Pool2dOp, Pool2dOptions, Tensor};
    /// use fucina_autograd::exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::uniform(&ctx, &[2, 3, 4, 4], -1.0, 1.0, 7)?.into_variable();
    /// let (g, b) = (Tensor::ones(&ctx, &[3])?, Tensor::zeros(&ctx, &[3])?);
    /// let op = Pool2dOp::ReluMax(Pool2dOptions::new([2, 2]));
    /// let (y, _) = x.batch_norm_pool2d_with_stats(&ctx, &g, &b, 1e-5, op)?;
    /// let (z, _) = x.batch_norm_with_stats(&ctx, &g, &b, 1e-5)?;
    /// assert_eq!(y.to_vec(), z.pool2d(&ctx, op)?.to_vec());
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// As [`ExecContext::batch_norm_pool2d`]: the pool's shape and option errors,
    /// then the batch norm's.
    pub fn batch_norm_pool2d_with_stats(
        &self,
        ctx: &ExecContext,
        gamma: &Tensor,
        beta: &Tensor,
        eps: f32,
        op: Pool2dOp,
    ) -> Result<(Tensor, BatchNormStats)> {
        let (out, stats) = ctx.batch_norm_pool2d(&self.raw, &gamma.raw, &beta.raw, eps, op)?;
        let params = ctx.stack(&[&gamma.raw, &beta.raw, &stats.mean, &stats.inv_std], 0)?;
        let x = self.raw.clone();
        let y = record!(
            ctx,
            "batch_norm_pool2d",
            out,
            &[self, gamma, beta],
            BatchNormPool2d { x, params, op },
            |ctx, g, needs| {
                let c = params.shape()[1];
                let row =
                    |i: usize| -> Result<RawTensor> { Ok(params.narrow(0, i, 1)?.reshape(&[c])?) };
                let (gx, gg, gb) = ctx.batch_norm_pool2d_backward(
                    x,
                    &row(0)?,
                    &row(1)?,
                    &row(2)?,
                    &row(3)?,
                    *op,
                    g,
                )?;
                Ok(grads![
                    needs[0].then_some(gx),
                    needs[1].then_some(gg),
                    needs[2].then_some(gb),
                ])
            }
        )?;
        Ok((y, stats))
    }

    /// Batch normalization in eval mode with running statistics: per channel,
    /// `(x - running_mean) / sqrt(running_var + eps) * gamma + beta`. Every
    /// element depends only on itself and the per-channel tensors, so the result
    /// is batch-invariant. The running statistics are constants here (no
    /// gradient flows to them); `self`, `gamma` and `beta` get gradients.
    ///
    /// ```
    /// use fucina_autograd::Tensor;
    /// use fucina_autograd::exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::from_slice(&ctx, &[1, 2, 2], &[1., 3., 5., 7.])?;
    /// let rm = Tensor::from_slice(&ctx, &[2], &[2., 6.])?;
    /// let rv = Tensor::from_slice(&ctx, &[2], &[4., 1.])?;
    /// let (g, b) = (Tensor::ones(&ctx, &[2])?, Tensor::zeros(&ctx, &[2])?);
    /// let y = x.batch_norm_eval(&ctx, &rm, &rv, &g, &b, 0.0)?;
    /// assert_eq!(y.to_vec(), [-0.5, 0.5, -1., 1.]);
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// As [`ExecContext::batch_norm_eval`]: rank below 2, a per-channel tensor
    /// not of shape `[C]`, a bad `eps`.
    pub fn batch_norm_eval(
        &self,
        ctx: &ExecContext,
        running_mean: &Tensor,
        running_var: &Tensor,
        gamma: &Tensor,
        beta: &Tensor,
        eps: f32,
    ) -> Result<Tensor> {
        let out = ctx.batch_norm_eval(
            &self.raw,
            &running_mean.raw,
            &running_var.raw,
            &gamma.raw,
            &beta.raw,
            eps,
        )?;
        let inv_std = ctx.batch_norm_inv_std(&running_var.raw, eps)?;
        let params = ctx.stack(&[&gamma.raw, &running_mean.raw, &inv_std], 0)?;
        let x = self.raw.clone();
        record!(
            ctx,
            "batch_norm_eval",
            out,
            &[self, gamma, beta],
            BatchNorm {
                x,
                params,
                training: false
            },
            |ctx, g, needs| backward(ctx, x, params, g, *training, needs)
        )
    }
}
