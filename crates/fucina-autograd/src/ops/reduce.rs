//! Reductions: along one axis (`sum`, `mean`, `max`, `min`, `variance`,
//! `logsumexp`), over everything (`sum_all`, `mean_all`), and the index results
//! (`argmax`, `argmin`), which are typed, carry no gradient and stay caller-owned.

use fucina_exec::{ExecContext, RawTensor};

use crate::error::Result;
use crate::node::{Saved, grads};
use crate::tensor::Tensor;

impl Tensor {
    /// The sum along `axis` (kept as size 1 when `keepdim`).
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`](fucina_exec::ExecError::InvalidAxis); out of memory.
    pub fn sum(&self, ctx: &ExecContext, axis: usize, keepdim: bool) -> Result<Tensor> {
        let out = ctx.sum(&self.raw, axis, keepdim)?;
        let saved = Saved::default()
            .with_dims([self.raw.dims()])
            .with_u([axis])
            .with_b([keepdim]);
        Tensor::finish(ctx, "sum", out, &[self], saved, |ctx, s, g, _| {
            Ok(grads![Some(ctx.sum_backward(
                g,
                s.u[0],
                s.b[0],
                s.shape(0)
            )?)])
        })
    }

    /// The mean along `axis`.
    ///
    /// # Errors
    /// As [`sum`](Tensor::sum).
    pub fn mean(&self, ctx: &ExecContext, axis: usize, keepdim: bool) -> Result<Tensor> {
        let out = ctx.mean(&self.raw, axis, keepdim)?;
        let saved = Saved::default()
            .with_dims([self.raw.dims()])
            .with_u([axis])
            .with_b([keepdim]);
        Tensor::finish(ctx, "mean", out, &[self], saved, |ctx, s, g, _| {
            Ok(grads![Some(ctx.mean_backward(
                g,
                s.u[0],
                s.b[0],
                s.shape(0)
            )?)])
        })
    }

    /// The maximum along `axis` (the gradient goes to the maximal elements as the
    /// exec layer's `max_backward` distributes it).
    ///
    /// # Errors
    /// As [`sum`](Tensor::sum).
    pub fn max(&self, ctx: &ExecContext, axis: usize, keepdim: bool) -> Result<Tensor> {
        let out = ctx.max(&self.raw, axis, keepdim)?;
        let saved = Saved::tensors([self.raw.clone()])
            .with_u([axis])
            .with_b([keepdim]);
        Tensor::finish(ctx, "max", out, &[self], saved, |ctx, s, g, _| {
            Ok(grads![Some(ctx.max_backward(s.t(0), g, s.u[0], s.b[0])?)])
        })
    }

    /// The minimum along `axis`.
    ///
    /// # Errors
    /// As [`sum`](Tensor::sum).
    pub fn min(&self, ctx: &ExecContext, axis: usize, keepdim: bool) -> Result<Tensor> {
        let out = ctx.min(&self.raw, axis, keepdim)?;
        let saved = Saved::tensors([self.raw.clone()])
            .with_u([axis])
            .with_b([keepdim]);
        Tensor::finish(ctx, "min", out, &[self], saved, |ctx, s, g, _| {
            Ok(grads![Some(ctx.min_backward(s.t(0), g, s.u[0], s.b[0])?)])
        })
    }

    /// The variance along `axis` (`unbiased`: divide by `n - 1`).
    ///
    /// # Errors
    /// As [`sum`](Tensor::sum).
    pub fn variance(
        &self,
        ctx: &ExecContext,
        axis: usize,
        keepdim: bool,
        unbiased: bool,
    ) -> Result<Tensor> {
        let out = ctx.variance(&self.raw, axis, keepdim, unbiased)?;
        let saved = Saved::tensors([self.raw.clone()])
            .with_u([axis])
            .with_b([keepdim, unbiased]);
        Tensor::finish(ctx, "variance", out, &[self], saved, |ctx, s, g, _| {
            Ok(grads![Some(ctx.variance_backward(
                s.t(0),
                g,
                s.u[0],
                s.b[0],
                s.b[1]
            )?)])
        })
    }

    /// `log(sum(exp(x)))` along `axis`, computed stably.
    ///
    /// # Errors
    /// As [`sum`](Tensor::sum).
    pub fn logsumexp(&self, ctx: &ExecContext, axis: usize, keepdim: bool) -> Result<Tensor> {
        let out = ctx.logsumexp(&self.raw, axis, keepdim)?;
        let saved = Saved::tensors([self.raw.clone(), out.clone()])
            .with_u([axis])
            .with_b([keepdim]);
        Tensor::finish(ctx, "logsumexp", out, &[self], saved, |ctx, s, g, _| {
            Ok(grads![Some(ctx.logsumexp_backward(
                s.t(0),
                s.t(1),
                g,
                s.u[0],
                s.b[0]
            )?)])
        })
    }

    /// The sum of all elements, shape `[1]`.
    ///
    /// # Errors
    /// Out of memory.
    pub fn sum_all(&self, ctx: &ExecContext) -> Result<Tensor> {
        let out = ctx.sum_all(&self.raw)?;
        let saved = Saved::default().with_dims([self.raw.dims()]);
        Tensor::finish(ctx, "sum_all", out, &[self], saved, |ctx, s, g, _| {
            Ok(grads![Some(ctx.broadcast_to(&flat1(g)?, s.shape(0))?)])
        })
    }

    /// The mean of all elements, shape `[1]`.
    ///
    /// # Errors
    /// Out of memory.
    pub fn mean_all(&self, ctx: &ExecContext) -> Result<Tensor> {
        let out = ctx.mean_all(&self.raw)?;
        let saved = Saved::default()
            .with_dims([self.raw.dims()])
            .with_f([1.0 / self.numel() as f32]);
        Tensor::finish(ctx, "mean_all", out, &[self], saved, |ctx, s, g, _| {
            let g = ctx.scale(g, s.f[0])?;
            Ok(grads![Some(ctx.broadcast_to(&flat1(&g)?, s.shape(0))?)])
        })
    }

    /// The index of the maximum along `axis` (a typed, caller-owned result: never
    /// scope-adopted, no gradient).
    ///
    /// # Errors
    /// As [`sum`](Tensor::sum).
    pub fn argmax(&self, ctx: &ExecContext, axis: usize, keepdim: bool) -> Result<RawTensor<i64>> {
        Ok(ctx.argmax(&self.raw, axis, keepdim)?)
    }

    /// The index of the minimum along `axis` (typed, caller-owned).
    ///
    /// # Errors
    /// As [`sum`](Tensor::sum).
    pub fn argmin(&self, ctx: &ExecContext, axis: usize, keepdim: bool) -> Result<RawTensor<i64>> {
        Ok(ctx.argmin(&self.raw, axis, keepdim)?)
    }
}

/// A one-element gradient as shape `[1]` (any layout).
fn flat1(g: &RawTensor) -> Result<RawTensor> {
    if g.shape() == [1] {
        Ok(g.clone())
    } else {
        Ok(g.broadcast_to(&[1]).or_else(|_| g.reshape(&[1]))?)
    }
}
