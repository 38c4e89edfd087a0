//! Views (zero-copy where the layout allows): one generic apply over the
//! [`ViewOp`] descriptor, and the named `reshape`, `permute`, `transpose`,
//! `narrow`, `squeeze`/`unsqueeze`, `broadcast_to` and the materializing copy
//! forwarding to it.

use fucina_exec::{Axis, Dims, ExecContext, ViewOp};

use crate::error::Result;
use crate::record::{grads, record};
use crate::tensor::Tensor;

impl Tensor {
    /// Applies the view op `op` (its axes already resolved to `0..rank`; the
    /// descriptor names the forward kernel, run now, and the backward kernel,
    /// run by backward with the input's shape, which the node keeps). The named
    /// methods resolve their axes and are this with their variant.
    ///
    /// ```
    /// use fucina_autograd::Tensor;
    /// use fucina_autograd::exec::{ExecContext, ViewOp};
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::variable_from_slice(&ctx, &[2, 3], &[1., 2., 3., 4., 5., 6.])?;
    /// let t = x.view_op(&ctx, ViewOp::Transpose(0, 1))?;
    /// assert_eq!(t.to_vec(), x.transpose(&ctx, 0, 1)?.to_vec());
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// The errors of the exec layer's [`view_op`](ExecContext::view_op).
    pub fn view_op(&self, ctx: &ExecContext, op: ViewOp) -> Result<Tensor> {
        let out = ctx.view_op(op, &self.raw)?;
        let shape = self.raw.dims();
        record!(
            ctx,
            op.name(),
            out,
            &[self],
            View { op, shape },
            |ctx, g, _| Ok(grads![Some(ctx.view_op_backward(
                *op,
                shape.as_slice(),
                g
            )?)])
        )
    }

    /// The same elements under `shape` (equal element count). A view when `self`
    /// is contiguous, else a contiguous copy first.
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`](fucina_exec::ExecError::InvalidShape) if the
    /// element counts differ or the shape is invalid.
    pub fn reshape(&self, ctx: &ExecContext, shape: &[usize]) -> Result<Tensor> {
        self.view_op(ctx, ViewOp::Reshape(Dims::new(shape)))
    }

    /// Axes reordered: axis `i` of the result is axis `order[i]` of `self` (a view).
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`](fucina_exec::ExecError::InvalidShape) if `order`
    /// is not a permutation of the axes.
    pub fn permute(&self, ctx: &ExecContext, order: &[usize]) -> Result<Tensor> {
        self.view_op(ctx, ViewOp::Permute(Dims::new(order)))
    }

    /// Axes `a` and `b` swapped (a view).
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`](fucina_exec::ExecError::InvalidAxis).
    pub fn transpose(&self, ctx: &ExecContext, a: impl Axis, b: impl Axis) -> Result<Tensor> {
        let (a, b) = (
            a.resolve("transpose", self.raw.rank())?,
            b.resolve("transpose", self.raw.rank())?,
        );
        self.view_op(ctx, ViewOp::Transpose(a, b))
    }

    /// Elements `start..start + len` along `axis` (a view).
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`](fucina_exec::ExecError::InvalidAxis), or an
    /// out-of-range window.
    pub fn narrow(
        &self,
        ctx: &ExecContext,
        axis: impl Axis,
        start: usize,
        len: usize,
    ) -> Result<Tensor> {
        let axis = axis.resolve("narrow", self.raw.rank())?;
        self.view_op(ctx, ViewOp::Narrow { axis, start, len })
    }

    /// Removes the size-1 `axis` (a view).
    ///
    /// # Errors
    /// As [`RawTensor::squeeze`](fucina_exec::RawTensor::squeeze).
    pub fn squeeze(&self, ctx: &ExecContext, axis: impl Axis) -> Result<Tensor> {
        let axis = axis.resolve("squeeze", self.raw.rank())?;
        self.view_op(ctx, ViewOp::Squeeze(axis))
    }

    /// Inserts a size-1 axis at `axis` (a view).
    ///
    /// # Errors
    /// As [`RawTensor::unsqueeze`](fucina_exec::RawTensor::unsqueeze).
    pub fn unsqueeze(&self, ctx: &ExecContext, axis: impl Axis) -> Result<Tensor> {
        let axis = axis.resolve("unsqueeze", self.raw.rank() + 1)?;
        self.view_op(ctx, ViewOp::Unsqueeze(axis))
    }

    /// A zero-copy broadcast to `shape`; the gradient is summed back over the
    /// broadcast axes.
    ///
    /// # Errors
    /// As [`RawTensor::broadcast_to`](fucina_exec::RawTensor::broadcast_to).
    pub fn broadcast_to(&self, ctx: &ExecContext, shape: &[usize]) -> Result<Tensor> {
        self.view_op(ctx, ViewOp::BroadcastTo(Dims::new(shape)))
    }

    /// A contiguous copy (the gradient passes through).
    ///
    /// # Errors
    /// Out of memory.
    pub fn materialize(&self, ctx: &ExecContext) -> Result<Tensor> {
        self.view_op(ctx, ViewOp::Materialize)
    }
}
