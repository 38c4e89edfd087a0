//! Reductions: along one axis (`sum`, `mean`, `max`, `min`, `variance`,
//! `logsumexp`), over everything (`sum_all`, `mean_all`), and the index results
//! (`argmax`, `argmin`), which are typed, carry no gradient and stay caller-owned.

use fucina_exec::{Axis, AxisReduction, AxisStatistic, ExecContext, FullReduction, RawTensor};

use crate::error::Result;
use crate::record::{grads, record};
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

    /// Applies the statistic `op` along `axis` (kept as size 1 when `keepdim`;
    /// the descriptor holds the op's parameters and names the forward kernel,
    /// run now, and the backward kernel, run by backward). `variance` and
    /// `logsumexp` are this with their variant; the output is kept only for
    /// `logsumexp`, whose backward reads it.
    ///
    /// ```
    /// use fucina_autograd::Tensor;
    /// use fucina_autograd::exec::{AxisStatistic, ExecContext};
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::variable_from_slice(&ctx, &[2, 2], &[1., 3., 2., 2.])?;
    /// let y = x.statistic(&ctx, AxisStatistic::Variance { unbiased: false }, 1, false)?;
    /// assert_eq!(y.to_vec(), vec![1., 0.]);
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`](fucina_exec::ExecError::InvalidAxis); out of memory.
    pub fn statistic(
        &self,
        ctx: &ExecContext,
        op: AxisStatistic,
        axis: impl Axis,
        keepdim: bool,
    ) -> Result<Tensor> {
        let axis = axis.resolve(op.name(), self.raw.rank())?;
        let out = ctx.statistic(op, &self.raw, axis, keepdim)?;
        let x = self.raw.clone();
        let y = op.keeps_output().then(|| out.clone());
        record!(
            ctx,
            op.name(),
            out,
            &[self],
            AxisStat {
                op,
                x,
                y,
                axis,
                keepdim
            },
            |ctx, g, _| {
                let gx = ctx.statistic_backward(*op, x, y.as_ref(), g, *axis, *keepdim)?;
                Ok(grads![Some(gx)])
            }
        )
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
        self.statistic(ctx, AxisStatistic::Variance { unbiased }, axis, keepdim)
    }

    /// `log(sum(exp(x)))` along `axis`, computed stably.
    ///
    /// # Errors
    /// As [`sum`](Tensor::sum).
    pub fn logsumexp(&self, ctx: &ExecContext, axis: impl Axis, keepdim: bool) -> Result<Tensor> {
        self.statistic(ctx, AxisStatistic::LogSumExp, axis, keepdim)
    }

    /// Applies the full reduction `op` (shape `[1]`; the descriptor names the
    /// forward kernel, run now, and the backward kernel, run by backward, which
    /// broadcasts the gradient back to the input's shape without copying).
    /// `sum_all` and `mean_all` are this with their variant.
    ///
    /// # Errors
    /// Out of memory.
    pub fn reduce_all(&self, ctx: &ExecContext, op: FullReduction) -> Result<Tensor> {
        let out = ctx.reduce_all(op, &self.raw)?;
        let shape = self.raw.dims();
        record!(
            ctx,
            op.name(),
            out,
            &[self],
            ReduceAll { op, shape },
            |ctx, g, _| Ok(grads![Some(ctx.reduce_all_backward(
                *op,
                g,
                shape.as_slice()
            )?)])
        )
    }

    /// The sum of all elements, shape `[1]`.
    ///
    /// # Errors
    /// Out of memory.
    pub fn sum_all(&self, ctx: &ExecContext) -> Result<Tensor> {
        self.reduce_all(ctx, FullReduction::Sum)
    }

    /// The mean of all elements, shape `[1]`.
    ///
    /// # Errors
    /// Out of memory.
    pub fn mean_all(&self, ctx: &ExecContext) -> Result<Tensor> {
        self.reduce_all(ctx, FullReduction::Mean)
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
