//! `cumsum` and `scatter_add`.

use fucina_exec::{Axis, ExecContext, RawTensor};

use crate::error::Result;
use crate::record::{grads, record};
use crate::tensor::Tensor;

impl Tensor {
    /// The inclusive cumulative sum along `axis` (like `torch.cumsum`), added
    /// left to right line by line; its gradient is the reversed cumulative sum of
    /// the output's gradient.
    ///
    /// ```
    /// use fucina_autograd::Tensor;
    /// use fucina_autograd::exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::variable_from_slice(&ctx, &[3], &[1., 2., 3.])?;
    /// let c = x.cumsum(&ctx, 0)?;
    /// assert_eq!(c.to_vec(), [1., 3., 6.]);
    /// c.sum_all(&ctx)?.backward(&ctx)?;
    /// assert_eq!(x.grad(&ctx)?.unwrap().to_vec(), [3., 2., 1.]);
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`](fucina_exec::ExecError::InvalidAxis); out of memory.
    pub fn cumsum(&self, ctx: &ExecContext, axis: impl Axis) -> Result<Tensor> {
        let axis = axis.resolve("cumsum", self.raw.rank())?;
        let out = ctx.cumsum(&self.raw, axis)?;
        record!(ctx, "cumsum", out, &[self], Scan { axis }, |ctx, g, _| Ok(
            grads![Some(ctx.cumsum_backward(g, *axis)?)]
        ))
    }

    /// `self` with `src` added at the positions `index` names along `axis` (like
    /// `torch.Tensor.scatter_add`, out of place; `index` and `src` have the same
    /// shape). The gradient of `self` is the output's gradient; that of `src` is
    /// the output's gradient gathered at `index`.
    ///
    /// ```
    /// use fucina_autograd::Tensor;
    /// use fucina_autograd::exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::variable_from_slice(&ctx, &[3], &[10., 20., 30.])?;
    /// let src = Tensor::variable_from_slice(&ctx, &[4], &[1., 2., 3., 4.])?;
    /// let index = ctx.from_slice_typed::<i64>(&[4], &[0, 2, 0, 1])?;
    /// let s = x.scatter_add(&ctx, 0, &index, &src)?;
    /// assert_eq!(s.to_vec(), [14., 24., 32.]);
    /// let w = Tensor::from_slice(&ctx, &[3], &[1., 2., 3.])?;
    /// s.mul(&ctx, &w)?.sum_all(&ctx)?.backward(&ctx)?;
    /// assert_eq!(src.grad(&ctx)?.unwrap().to_vec(), [1., 3., 1., 2.]);
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// As [`ExecContext::scatter_add`]: an axis out of range, a shape mismatch,
    /// an index outside `0..self.shape()[axis]`.
    pub fn scatter_add(
        &self,
        ctx: &ExecContext,
        axis: impl Axis,
        index: &RawTensor<i64>,
        src: &Tensor,
    ) -> Result<Tensor> {
        let axis = axis.resolve("scatter_add", self.raw.rank())?;
        let out = ctx.scatter_add(&self.raw, axis, index, &src.raw)?;
        let (shape, index) = (self.raw.dims(), index.clone());
        record!(
            ctx,
            "scatter_add",
            out,
            &[self, src],
            ScatterAdd { shape, axis, index },
            |ctx, g, needs| {
                debug_assert_eq!(g.shape(), shape.as_slice());
                let gsrc = match needs[1] {
                    true => Some(ctx.gather(g, *axis, index)?),
                    false => None,
                };
                Ok(grads![needs[0].then(|| g.clone()), gsrc])
            }
        )
    }
}
