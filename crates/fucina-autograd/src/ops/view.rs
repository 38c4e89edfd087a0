//! Views (zero-copy where the layout allows): reshape, permute, transpose, narrow,
//! squeeze/unsqueeze, broadcast_to, and an explicit materializing copy.

use fucina_exec::{Axis, Dims, ExecContext, RawTensor};

use crate::error::Result;
use crate::node::{grads, record};
use crate::ops::sum_to;
use crate::tensor::Tensor;

/// A contiguous gradient of `shape` holding `g` in the narrowed window
/// `[start, start + g.shape()[axis])` along `axis` and zeros elsewhere.
fn unnarrow(
    ctx: &ExecContext,
    g: &RawTensor,
    shape: &[usize],
    axis: usize,
    start: usize,
) -> Result<RawTensor> {
    let mut out = ctx.zeros(shape)?;
    let window = *out.narrow(axis, start, g.shape()[axis])?.layout();
    let gv = ctx.contiguous(g)?;
    let gv = gv.data()?;
    let o = out.data_mut()?;
    let mut k = 0;
    window.for_each_index(|i| {
        o[i] = gv[k];
        k += 1;
    });
    Ok(out)
}

impl Tensor {
    /// The same elements under `shape` (equal element count). A view when `self`
    /// is contiguous, else a contiguous copy first.
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`](fucina_exec::ExecError::InvalidShape) if the
    /// element counts differ or the shape is invalid.
    pub fn reshape(&self, ctx: &ExecContext, shape: &[usize]) -> Result<Tensor> {
        let out = ctx.contiguous(&self.raw)?.reshape(shape)?;
        let shape = self.raw.dims();
        record!(
            ctx,
            "reshape",
            out,
            &[self],
            Shape { shape },
            |ctx, g, _| Ok(grads![Some(ctx.contiguous(g)?.reshape(shape.as_slice())?)])
        )
    }

    /// Axes reordered: axis `i` of the result is axis `order[i]` of `self` (a view).
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`](fucina_exec::ExecError::InvalidShape) if `order`
    /// is not a permutation of the axes.
    pub fn permute(&self, ctx: &ExecContext, order: &[usize]) -> Result<Tensor> {
        let out = self.raw.permute(order)?;
        let mut inverse = Dims::new(order);
        for (i, &o) in order.iter().enumerate() {
            inverse.as_mut_slice()[o] = i;
        }
        record!(
            ctx,
            "permute",
            out,
            &[self],
            Permute { inverse },
            |_, g, _| Ok(grads![Some(g.permute(inverse.as_slice())?)])
        )
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
        let out = self.raw.transpose(a, b)?;
        record!(
            ctx,
            "transpose",
            out,
            &[self],
            Transpose { a, b },
            |_, g, _| Ok(grads![Some(g.transpose(*a, *b)?)])
        )
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
        let out = self.raw.narrow(axis, start, len)?;
        let shape = self.raw.dims();
        record!(
            ctx,
            "narrow",
            out,
            &[self],
            Narrow { shape, axis, start },
            |ctx, g, _| {
                Ok(grads![Some(unnarrow(
                    ctx,
                    g,
                    shape.as_slice(),
                    *axis,
                    *start
                )?)])
            }
        )
    }

    /// Removes the size-1 `axis` (a view).
    ///
    /// # Errors
    /// As [`RawTensor::squeeze`].
    pub fn squeeze(&self, ctx: &ExecContext, axis: impl Axis) -> Result<Tensor> {
        let axis = axis.resolve("squeeze", self.raw.rank())?;
        let out = self.raw.squeeze(axis)?;
        record!(ctx, "squeeze", out, &[self], Axis { axis }, |_, g, _| {
            Ok(grads![Some(g.unsqueeze(*axis)?)])
        })
    }

    /// Inserts a size-1 axis at `axis` (a view).
    ///
    /// # Errors
    /// As [`RawTensor::unsqueeze`].
    pub fn unsqueeze(&self, ctx: &ExecContext, axis: impl Axis) -> Result<Tensor> {
        let axis = axis.resolve("unsqueeze", self.raw.rank() + 1)?;
        let out = self.raw.unsqueeze(axis)?;
        record!(ctx, "unsqueeze", out, &[self], Axis { axis }, |_, g, _| {
            Ok(grads![Some(g.squeeze(*axis)?)])
        })
    }

    /// A zero-copy broadcast to `shape`; the gradient is summed back over the
    /// broadcast axes.
    ///
    /// # Errors
    /// As [`RawTensor::broadcast_to`].
    pub fn broadcast_to(&self, ctx: &ExecContext, shape: &[usize]) -> Result<Tensor> {
        let out = self.raw.broadcast_to(shape)?;
        let shape = self.raw.dims();
        record!(
            ctx,
            "broadcast_to",
            out,
            &[self],
            Shape { shape },
            |ctx, g, _| Ok(grads![Some(sum_to(ctx, g, shape.as_slice())?)])
        )
    }

    /// A contiguous copy (the gradient passes through).
    ///
    /// # Errors
    /// Out of memory.
    pub fn materialize(&self, ctx: &ExecContext) -> Result<Tensor> {
        let out = ctx.materialize(&self.raw)?;
        record!(ctx, "materialize", out, &[self], Nothing {}, |_, g, _| {
            Ok(grads![Some(g.clone())])
        })
    }
}
