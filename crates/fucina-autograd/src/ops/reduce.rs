//! Reductions: along one axis (`sum`, `mean`, `max`, `min`, `variance`,
//! `logsumexp`), over everything (`sum_all`, `mean_all`), and the index results
//! (`argmax`, `argmin`), which are typed, carry no gradient and stay caller-owned.

use fucina_exec::{Axis, AxisReduction, ExecContext, RawTensor};

use crate::error::Result;
use crate::node::{grads, record};
use crate::tensor::Tensor;

impl Tensor {
    /// Applies the axis reduction `op` along `axis` (kept as size 1 when
    /// `keepdim`; the descriptor names the forward kernel, run now, and the
    /// backward kernel, run by backward). `sum`, `mean`, `max` and `min` are
    /// this with their variant; the input is kept only for `max` and `min`, whose
    /// backward reads it again.
    ///
    /// ```
    /// use fucina_autograd::Tensor;
    /// use fucina_autograd::exec::{AxisReduction, ExecContext};
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::variable_from_slice(&ctx, &[2, 2], &[1., 5., 3., 2.])?;
    /// let y = x.reduce(&ctx, AxisReduction::Max, 1, false)?;
    /// assert_eq!(y.to_vec(), vec![5., 3.]);
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`](fucina_exec::ExecError::InvalidAxis); out of memory.
    pub fn reduce(
        &self,
        ctx: &ExecContext,
        op: AxisReduction,
        axis: impl Axis,
        keepdim: bool,
    ) -> Result<Tensor> {
        let axis = axis.resolve(op.name(), self.raw.rank())?;
        let out = ctx.reduce(op, &self.raw, axis, keepdim)?;
        if op.keeps_input() {
            let x = self.raw.clone();
            return record!(
                ctx,
                op.name(),
                out,
                &[self],
                AxisSelect {
                    op,
                    x,
                    axis,
                    keepdim
                },
                |ctx, g, _| {
                    let gx = ctx.reduce_backward(*op, Some(x), x.shape(), g, *axis, *keepdim)?;
                    Ok(grads![Some(gx)])
                }
            );
        }
        let shape = self.raw.dims();
        record!(
            ctx,
            op.name(),
            out,
            &[self],
            AxisReduce {
                op,
                shape,
                axis,
                keepdim
            },
            |ctx, g, _| {
                let gx = ctx.reduce_backward(*op, None, shape.as_slice(), g, *axis, *keepdim)?;
                Ok(grads![Some(gx)])
            }
        )
    }

    /// The sum along `axis` (kept as size 1 when `keepdim`).
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`](fucina_exec::ExecError::InvalidAxis); out of memory.
    pub fn sum(&self, ctx: &ExecContext, axis: impl Axis, keepdim: bool) -> Result<Tensor> {
        self.reduce(ctx, AxisReduction::Sum, axis, keepdim)
    }

    /// The mean along `axis`.
    ///
    /// # Errors
    /// As [`sum`](Tensor::sum).
    pub fn mean(&self, ctx: &ExecContext, axis: impl Axis, keepdim: bool) -> Result<Tensor> {
        self.reduce(ctx, AxisReduction::Mean, axis, keepdim)
    }

    /// The maximum along `axis` (the gradient goes to the maximal elements as the
    /// exec layer's `max_backward` distributes it).
    ///
    /// # Errors
    /// As [`sum`](Tensor::sum).
    pub fn max(&self, ctx: &ExecContext, axis: impl Axis, keepdim: bool) -> Result<Tensor> {
        self.reduce(ctx, AxisReduction::Max, axis, keepdim)
    }

    /// The minimum along `axis`.
    ///
    /// # Errors
    /// As [`sum`](Tensor::sum).
    pub fn min(&self, ctx: &ExecContext, axis: impl Axis, keepdim: bool) -> Result<Tensor> {
        self.reduce(ctx, AxisReduction::Min, axis, keepdim)
    }

    /// The variance along `axis` (`unbiased`: divide by `n - 1`).
    ///
    /// # Errors
    /// As [`sum`](Tensor::sum).
    pub fn variance(
        &self,
        ctx: &ExecContext,
        axis: impl Axis,
        keepdim: bool,
        unbiased: bool,
    ) -> Result<Tensor> {
        let axis = axis.resolve("variance", self.raw.rank())?;
        let out = ctx.variance(&self.raw, axis, keepdim, unbiased)?;
        let x = self.raw.clone();
        record!(
            ctx,
            "variance",
            out,
            &[self],
            Variance {
                x,
                axis,
                keepdim,
                unbiased
            },
            |ctx, g, _| {
                Ok(grads![Some(
                    ctx.variance_backward(x, g, *axis, *keepdim, *unbiased)?
                )])
            }
        )
    }

    /// `log(sum(exp(x)))` along `axis`, computed stably.
    ///
    /// # Errors
    /// As [`sum`](Tensor::sum).
    pub fn logsumexp(&self, ctx: &ExecContext, axis: impl Axis, keepdim: bool) -> Result<Tensor> {
        let axis = axis.resolve("logsumexp", self.raw.rank())?;
        let out = ctx.logsumexp(&self.raw, axis, keepdim)?;
        let (x, y) = (self.raw.clone(), out.clone());
        record!(
            ctx,
            "logsumexp",
            out,
            &[self],
            LogSumExp {
                x,
                y,
                axis,
                keepdim
            },
            |ctx, g, _| {
                Ok(grads![Some(
                    ctx.logsumexp_backward(x, y, g, *axis, *keepdim)?
                )])
            }
        )
    }

    /// The sum of all elements, shape `[1]`.
    ///
    /// # Errors
    /// Out of memory.
    pub fn sum_all(&self, ctx: &ExecContext) -> Result<Tensor> {
        let out = ctx.sum_all(&self.raw)?;
        let shape = self.raw.dims();
        record!(
            ctx,
            "sum_all",
            out,
            &[self],
            Shape { shape },
            |ctx, g, _| {
                Ok(grads![Some(
                    ctx.broadcast_to(&flat1(g)?, shape.as_slice())?
                )])
            }
        )
    }

    /// The mean of all elements, shape `[1]`.
    ///
    /// # Errors
    /// Out of memory.
    pub fn mean_all(&self, ctx: &ExecContext) -> Result<Tensor> {
        let out = ctx.mean_all(&self.raw)?;
        let (shape, inv_n) = (self.raw.dims(), 1.0 / self.numel() as f32);
        record!(
            ctx,
            "mean_all",
            out,
            &[self],
            MeanAll { shape, inv_n },
            |ctx, g, _| {
                let g = ctx.scale(g, *inv_n)?;
                Ok(grads![Some(
                    ctx.broadcast_to(&flat1(&g)?, shape.as_slice())?
                )])
            }
        )
    }

    /// The index of the maximum along `axis` (a typed, caller-owned result: never
    /// scope-adopted, no gradient).
    ///
    /// # Errors
    /// As [`sum`](Tensor::sum).
    pub fn argmax(
        &self,
        ctx: &ExecContext,
        axis: impl Axis,
        keepdim: bool,
    ) -> Result<RawTensor<i64>> {
        Ok(ctx.argmax(&self.raw, axis, keepdim)?)
    }

    /// The index of the minimum along `axis` (typed, caller-owned).
    ///
    /// # Errors
    /// As [`sum`](Tensor::sum).
    pub fn argmin(
        &self,
        ctx: &ExecContext,
        axis: impl Axis,
        keepdim: bool,
    ) -> Result<RawTensor<i64>> {
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
