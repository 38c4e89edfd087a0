//! Reductions: along one axis (`sum`, `mean`, `max`, `min`, `variance`,
//! `logsumexp`), over everything (`sum_all`, `mean_all`), and the index results
//! (`argmax`, `argmin`), which are typed, carry no gradient and stay caller-owned.

use fucina_exec::{ExecContext, ExecError, RawTensor};

use crate::error::Result;
use crate::node::{grads, record};
use crate::tensor::Tensor;

/// An exec kernel's result.
type ExecResult<T> = std::result::Result<T, ExecError>;

/// The signature of a forward kernel along one axis: `(x, axis, keepdim)`.
type AxisForward = fn(&ExecContext, &RawTensor, usize, bool) -> ExecResult<RawTensor>;

/// The descriptor of a reduction along one axis whose backward needs only the
/// input's shape (`sum`, `mean`): its name and its two kernels.
#[derive(Clone, Copy)]
pub(crate) struct ShapeReduction {
    name: &'static str,
    forward: AxisForward,
    /// `(grad_y, axis, keepdim, input_shape)`.
    backward: fn(&ExecContext, &RawTensor, usize, bool, &[usize]) -> ExecResult<RawTensor>,
}

/// The descriptor of a reduction along one axis that selects elements of its
/// input (`max`, `min`), whose backward reads the input again.
#[derive(Clone, Copy)]
pub(crate) struct SelectReduction {
    name: &'static str,
    forward: AxisForward,
    /// `(x, grad_y, axis, keepdim)`.
    backward: fn(&ExecContext, &RawTensor, &RawTensor, usize, bool) -> ExecResult<RawTensor>,
}

const SUM: ShapeReduction = ShapeReduction {
    name: "sum",
    forward: ExecContext::sum,
    backward: ExecContext::sum_backward,
};
const MEAN: ShapeReduction = ShapeReduction {
    name: "mean",
    forward: ExecContext::mean,
    backward: ExecContext::mean_backward,
};
const MAX: SelectReduction = SelectReduction {
    name: "max",
    forward: ExecContext::max,
    backward: ExecContext::max_backward,
};
const MIN: SelectReduction = SelectReduction {
    name: "min",
    forward: ExecContext::min,
    backward: ExecContext::min_backward,
};

impl Tensor {
    /// Applies a shape-only reduction along `axis`.
    fn reduce_along(
        &self,
        ctx: &ExecContext,
        op: ShapeReduction,
        axis: usize,
        keepdim: bool,
    ) -> Result<Tensor> {
        let out = (op.forward)(ctx, &self.raw, axis, keepdim)?;
        let shape = self.raw.dims();
        record!(
            ctx,
            op.name,
            out,
            &[self],
            AxisReduce {
                op,
                shape,
                axis,
                keepdim
            },
            |ctx, g, _| {
                let gx = (op.backward)(ctx, g, *axis, *keepdim, shape.as_slice())?;
                Ok(grads![Some(gx)])
            }
        )
    }

    /// Applies a selecting reduction along `axis`.
    fn select_along(
        &self,
        ctx: &ExecContext,
        op: SelectReduction,
        axis: usize,
        keepdim: bool,
    ) -> Result<Tensor> {
        let out = (op.forward)(ctx, &self.raw, axis, keepdim)?;
        let x = self.raw.clone();
        record!(
            ctx,
            op.name,
            out,
            &[self],
            AxisSelect {
                op,
                x,
                axis,
                keepdim
            },
            |ctx, g, _| Ok(grads![Some((op.backward)(ctx, x, g, *axis, *keepdim)?)])
        )
    }

    /// The sum along `axis` (kept as size 1 when `keepdim`).
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`](fucina_exec::ExecError::InvalidAxis); out of memory.
    pub fn sum(&self, ctx: &ExecContext, axis: usize, keepdim: bool) -> Result<Tensor> {
        self.reduce_along(ctx, SUM, axis, keepdim)
    }

    /// The mean along `axis`.
    ///
    /// # Errors
    /// As [`sum`](Tensor::sum).
    pub fn mean(&self, ctx: &ExecContext, axis: usize, keepdim: bool) -> Result<Tensor> {
        self.reduce_along(ctx, MEAN, axis, keepdim)
    }

    /// The maximum along `axis` (the gradient goes to the maximal elements as the
    /// exec layer's `max_backward` distributes it).
    ///
    /// # Errors
    /// As [`sum`](Tensor::sum).
    pub fn max(&self, ctx: &ExecContext, axis: usize, keepdim: bool) -> Result<Tensor> {
        self.select_along(ctx, MAX, axis, keepdim)
    }

    /// The minimum along `axis`.
    ///
    /// # Errors
    /// As [`sum`](Tensor::sum).
    pub fn min(&self, ctx: &ExecContext, axis: usize, keepdim: bool) -> Result<Tensor> {
        self.select_along(ctx, MIN, axis, keepdim)
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
    pub fn logsumexp(&self, ctx: &ExecContext, axis: usize, keepdim: bool) -> Result<Tensor> {
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
