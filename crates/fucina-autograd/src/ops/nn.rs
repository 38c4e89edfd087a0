//! Softmax, normalizations and losses, and the ops composed from them.

use fucina_exec::{Axis, ClassLoss, ExecContext, NormOp, RawTensor, RegressionLoss, SoftmaxOp};

use crate::error::Result;
use crate::record::{grads, record};
use crate::tensor::Tensor;

/// The value of a one-element loss gradient.
fn scalar_grad(g: &RawTensor) -> Result<f32> {
    Ok(g.item()?)
}

impl Tensor {
    /// Applies the softmax-family op `op` along `axis` (the descriptor names
    /// the forward kernel, run now, and the backward kernel, run by backward,
    /// which reads the output). `softmax` and `log_softmax` are this with their
    /// variant.
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`](fucina_exec::ExecError::InvalidAxis); out of memory.
    pub fn softmax_op(&self, ctx: &ExecContext, op: SoftmaxOp, axis: impl Axis) -> Result<Tensor> {
        let axis = axis.resolve(op.name(), self.raw.rank())?;
        let out = ctx.softmax_op(op, &self.raw, axis)?;
        let y = out.clone();
        record!(
            ctx,
            op.name(),
            out,
            &[self],
            OutputAlong { op, y, axis },
            |ctx, g, _| Ok(grads![Some(ctx.softmax_op_backward(*op, y, g, *axis)?)])
        )
    }

    /// Softmax along `axis`.
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`](fucina_exec::ExecError::InvalidAxis); out of memory.
    pub fn softmax(&self, ctx: &ExecContext, axis: impl Axis) -> Result<Tensor> {
        self.softmax_op(ctx, SoftmaxOp::Softmax, axis)
    }

    /// Log-softmax along `axis`.
    ///
    /// # Errors
    /// As [`softmax`](Tensor::softmax).
    pub fn log_softmax(&self, ctx: &ExecContext, axis: impl Axis) -> Result<Tensor> {
        self.softmax_op(ctx, SoftmaxOp::LogSoftmax, axis)
    }

    /// Applies the normalization `op` over the last axis with scale `gamma`
    /// and, for ops with a shift ([`NormOp::has_shift`]), shift `beta` (the
    /// descriptor holds `eps` and names the forward kernel, run now, and the
    /// backward kernel, run by backward). `layer_norm` and `rms_norm` are this
    /// with their variant.
    ///
    /// ```
    /// use fucina_autograd::Tensor;
    /// use fucina_autograd::exec::{ExecContext, NormOp};
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::variable_from_slice(&ctx, &[1, 2], &[1., 3.])?;
    /// let gamma = Tensor::variable_from_slice(&ctx, &[2], &[1., 1.])?;
    /// let y = x.norm_op(&ctx, NormOp::RmsNorm { eps: 0.0 }, &gamma, None)?;
    /// assert_eq!(y.to_vec(), x.rms_norm(&ctx, &gamma, 0.0)?.to_vec());
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::ShapeMismatch`](fucina_exec::ExecError::ShapeMismatch) for
    /// mismatched parameters;
    /// [`ExecError::InvalidArgument`](fucina_exec::ExecError::InvalidArgument)
    /// for a bad `eps`, or a `beta` missing or given to an op without a shift;
    /// out of memory.
    pub fn norm_op(
        &self,
        ctx: &ExecContext,
        op: NormOp,
        gamma: &Tensor,
        beta: Option<&Tensor>,
    ) -> Result<Tensor> {
        let out = ctx.norm_op(op, &self.raw, &gamma.raw, beta.map(|b| &b.raw))?;
        let (x, gamma_saved) = (self.raw.clone(), gamma.raw.clone());
        let (three, two);
        let inputs: &[&Tensor] = match beta {
            Some(beta) => {
                three = [self, gamma, beta];
                &three
            }
            None => {
                two = [self, gamma];
                &two
            }
        };
        record!(
            ctx,
            op.name(),
            out,
            inputs,
            Norm {
                op,
                x,
                gamma: gamma_saved
            },
            |ctx, g, needs| {
                let (gx, gg, gb) = ctx.norm_op_backward(*op, x, gamma, g)?;
                Ok(match gb {
                    Some(gb) => grads![
                        needs[0].then_some(gx),
                        needs[1].then_some(gg),
                        needs[2].then_some(gb),
                    ],
                    None => grads![needs[0].then_some(gx), needs[1].then_some(gg)],
                })
            },
        )
    }

    /// Layer normalization over the last axis with scale `gamma` and shift `beta`
    /// (both of the last axis' size).
    ///
    /// # Errors
    /// [`ExecError::ShapeMismatch`](fucina_exec::ExecError::ShapeMismatch) for
    /// mismatched parameters; out of memory.
    pub fn layer_norm(
        &self,
        ctx: &ExecContext,
        gamma: &Tensor,
        beta: &Tensor,
        eps: f32,
    ) -> Result<Tensor> {
        self.norm_op(ctx, NormOp::LayerNorm { eps }, gamma, Some(beta))
    }

    /// RMS normalization over the last axis with scale `gamma`.
    ///
    /// # Errors
    /// As [`layer_norm`](Tensor::layer_norm).
    pub fn rms_norm(&self, ctx: &ExecContext, gamma: &Tensor, eps: f32) -> Result<Tensor> {
        self.norm_op(ctx, NormOp::RmsNorm { eps }, gamma, None)
    }

    /// Applies the classification loss `op` to `self` (scores `[N, C]`)
    /// against integer `labels` `[N]`, shape `[1]` (the descriptor names the
    /// forward kernel, run now, and the backward kernel, run by backward).
    /// `cross_entropy` and `nll_loss` are this with their variant.
    ///
    /// # Errors
    /// As [`cross_entropy`](Tensor::cross_entropy).
    pub fn class_loss(
        &self,
        ctx: &ExecContext,
        op: ClassLoss,
        labels: &RawTensor<i64>,
    ) -> Result<Tensor> {
        let out = ctx.class_loss(op, &self.raw, labels)?;
        let (scores, labels) = (self.raw.clone(), labels.clone());
        record!(
            ctx,
            op.name(),
            out,
            &[self],
            ClassLoss { op, scores, labels },
            |ctx, g, _| {
                let gs = ctx.class_loss_backward(*op, scores, labels, scalar_grad(g)?)?;
                Ok(grads![Some(gs)])
            }
        )
    }

    /// Mean cross-entropy of `self` (logits `[N, C]`) against integer `labels`
    /// `[N]`, shape `[1]`.
    ///
    /// # Errors
    /// [`ExecError::IndexOutOfBounds`](fucina_exec::ExecError::IndexOutOfBounds) for
    /// a label outside `0..C`; shape errors; out of memory.
    pub fn cross_entropy(&self, ctx: &ExecContext, labels: &RawTensor<i64>) -> Result<Tensor> {
        self.class_loss(ctx, ClassLoss::CrossEntropy, labels)
    }

    /// Mean negative log-likelihood of `self` (log-probabilities `[N, C]`) at
    /// `labels` `[N]`, shape `[1]`.
    ///
    /// # Errors
    /// As [`cross_entropy`](Tensor::cross_entropy).
    pub fn nll_loss(&self, ctx: &ExecContext, labels: &RawTensor<i64>) -> Result<Tensor> {
        self.class_loss(ctx, ClassLoss::NllLoss, labels)
    }

    /// Applies the regression loss `op` between `self` and `target` (equal
    /// shapes), shape `[1]` (the descriptor names the forward kernel, run now,
    /// and the backward kernel, run by backward). `mse_loss` is this with its
    /// variant.
    ///
    /// # Errors
    /// As [`mse_loss`](Tensor::mse_loss).
    pub fn regression_loss(
        &self,
        ctx: &ExecContext,
        op: RegressionLoss,
        target: &Tensor,
    ) -> Result<Tensor> {
        let out = ctx.regression_loss(op, &self.raw, &target.raw)?;
        let (a, b) = (self.raw.clone(), target.raw.clone());
        record!(
            ctx,
            op.name(),
            out,
            &[self, target],
            RegressionLoss { op, a, b },
            |ctx, g, needs| {
                let (ga, gb) = ctx.regression_loss_backward(*op, a, b, scalar_grad(g)?)?;
                Ok(grads![needs[0].then_some(ga), needs[1].then_some(gb)])
            },
        )
    }

    /// Mean squared error between `self` and `target` (equal shapes), shape `[1]`.
    ///
    /// # Errors
    /// [`ExecError::ShapeMismatch`](fucina_exec::ExecError::ShapeMismatch) if the
    /// shapes differ; out of memory.
    pub fn mse_loss(&self, ctx: &ExecContext, target: &Tensor) -> Result<Tensor> {
        self.regression_loss(ctx, RegressionLoss::Mse, target)
    }

    /// `self / max(||self||_2, eps)` along `axis` (composed from differentiable
    /// ops; the intermediates live in the graph, or in the open scope).
    ///
    /// # Errors
    /// As [`sum`](Tensor::sum).
    pub fn l2_normalize(&self, ctx: &ExecContext, axis: impl Axis, eps: f32) -> Result<Tensor> {
        let axis = axis.resolve("l2_normalize", self.raw.rank())?;
        let norm = self.mul(ctx, self)?.sum(ctx, axis, true)?.sqrt(ctx)?;
        let floor = Tensor::scalar(ctx, eps)?;
        self.div(ctx, &norm.maximum(ctx, &floor)?)
    }

    /// Cosine similarity of `self` and `other` along `axis`:
    /// `sum(a * b) / (max(||a||, eps) * max(||b||, eps))` (composed).
    ///
    /// # Errors
    /// As [`mul`](Tensor::mul) and [`sum`](Tensor::sum).
    pub fn cosine_similarity(
        &self,
        ctx: &ExecContext,
        other: &Tensor,
        axis: impl Axis,
        eps: f32,
    ) -> Result<Tensor> {
        let axis = axis.resolve("cosine_similarity", self.raw.rank())?;
        let a = self.l2_normalize(ctx, axis, eps)?;
        let b = other.l2_normalize(ctx, axis, eps)?;
        a.mul(ctx, &b)?.sum(ctx, axis, false)
    }
}
