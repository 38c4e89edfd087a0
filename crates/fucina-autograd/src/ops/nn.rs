//! Softmax, normalizations and losses, and the ops composed from them.

use fucina_exec::{Axis, ExecContext, RawTensor, SoftmaxOp};

use crate::error::Result;
use crate::node::{grads, record};
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
        let out = ctx.layer_norm(&self.raw, &gamma.raw, &beta.raw, eps)?;
        let (x, gamma_saved) = (self.raw.clone(), gamma.raw.clone());
        record!(
            ctx,
            "layer_norm",
            out,
            &[self, gamma, beta],
            Norm {
                x,
                gamma: gamma_saved,
                eps
            },
            |ctx, g, needs| {
                let (gx, gg, gb) = ctx.layer_norm_backward(x, gamma, g, *eps)?;
                Ok(grads![
                    needs[0].then_some(gx),
                    needs[1].then_some(gg),
                    needs[2].then_some(gb),
                ])
            },
        )
    }

    /// RMS normalization over the last axis with scale `gamma`.
    ///
    /// # Errors
    /// As [`layer_norm`](Tensor::layer_norm).
    pub fn rms_norm(&self, ctx: &ExecContext, gamma: &Tensor, eps: f32) -> Result<Tensor> {
        let out = ctx.rms_norm(&self.raw, &gamma.raw, eps)?;
        let (x, gamma_saved) = (self.raw.clone(), gamma.raw.clone());
        record!(
            ctx,
            "rms_norm",
            out,
            &[self, gamma],
            Norm {
                x,
                gamma: gamma_saved,
                eps
            },
            |ctx, g, needs| {
                let (gx, gg) = ctx.rms_norm_backward(x, gamma, g, *eps)?;
                Ok(grads![needs[0].then_some(gx), needs[1].then_some(gg)])
            },
        )
    }

    /// Mean cross-entropy of `self` (logits `[N, C]`) against integer `labels`
    /// `[N]`, shape `[1]`.
    ///
    /// # Errors
    /// [`ExecError::IndexOutOfBounds`](fucina_exec::ExecError::IndexOutOfBounds) for
    /// a label outside `0..C`; shape errors; out of memory.
    pub fn cross_entropy(&self, ctx: &ExecContext, labels: &RawTensor<i64>) -> Result<Tensor> {
        let out = ctx.cross_entropy(&self.raw, labels)?;
        let (logits, labels) = (self.raw.clone(), labels.clone());
        record!(
            ctx,
            "cross_entropy",
            out,
            &[self],
            Labels { logits, labels },
            |ctx, g, _| {
                Ok(grads![Some(ctx.cross_entropy_backward(
                    logits,
                    labels,
                    scalar_grad(g)?
                )?)])
            }
        )
    }

    /// Mean negative log-likelihood of `self` (log-probabilities `[N, C]`) at
    /// `labels` `[N]`, shape `[1]`.
    ///
    /// # Errors
    /// As [`cross_entropy`](Tensor::cross_entropy).
    pub fn nll_loss(&self, ctx: &ExecContext, labels: &RawTensor<i64>) -> Result<Tensor> {
        let out = ctx.nll_loss(&self.raw, labels)?;
        let (logits, labels) = (self.raw.clone(), labels.clone());
        record!(
            ctx,
            "nll_loss",
            out,
            &[self],
            Labels { logits, labels },
            |ctx, g, _| {
                Ok(grads![Some(ctx.nll_loss_backward(
                    logits,
                    labels,
                    scalar_grad(g)?
                )?)])
            }
        )
    }

    /// Mean squared error between `self` and `target` (equal shapes), shape `[1]`.
    ///
    /// # Errors
    /// [`ExecError::ShapeMismatch`](fucina_exec::ExecError::ShapeMismatch) if the
    /// shapes differ; out of memory.
    pub fn mse_loss(&self, ctx: &ExecContext, target: &Tensor) -> Result<Tensor> {
        let out = ctx.mse_loss(&self.raw, &target.raw)?;
        let (a, b) = (self.raw.clone(), target.raw.clone());
        record!(
            ctx,
            "mse_loss",
            out,
            &[self, target],
            Operands { a, b },
            |ctx, g, needs| {
                let (ga, gb) = ctx.mse_loss_backward(a, b, scalar_grad(g)?)?;
                Ok(grads![needs[0].then_some(ga), needs[1].then_some(gb)])
            },
        )
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
