//! Reductions.

use fucina_exec::ExecContext;

use crate::error::Result;
use crate::node::grads;
use crate::ops::contiguous;
use crate::tensor::Tensor;

impl Tensor {
    /// The sum of all elements, shape `[1]` (accumulated in f64 in row-major
    /// order).
    ///
    /// # Errors
    /// Out of memory.
    pub fn sum_all(&self, ctx: &ExecContext) -> Result<Tensor> {
        let x = contiguous(ctx, &self.raw)?;
        let s: f64 = x.data()?.iter().map(|&v| f64::from(v)).sum();
        let out = ctx.scalar(s as f32)?;
        let shape = self.raw.dims();
        Tensor::finish(ctx, "sum_all", out, &[self], move |ctx, g, _| {
            Ok(grads![Some(
                ctx.broadcast_to(&g.reshape(&[1])?, shape.as_slice())?,
            )])
        })
    }

    /// The mean of all elements, shape `[1]`.
    ///
    /// # Errors
    /// Out of memory.
    pub fn mean_all(&self, ctx: &ExecContext) -> Result<Tensor> {
        let n = self.numel() as f32;
        let x = contiguous(ctx, &self.raw)?;
        let s: f64 = x.data()?.iter().map(|&v| f64::from(v)).sum();
        let out = ctx.scalar((s / f64::from(n)) as f32)?;
        let shape = self.raw.dims();
        Tensor::finish(ctx, "mean_all", out, &[self], move |ctx, g, _| {
            let g = ctx.scale(g, 1.0 / n)?;
            Ok(grads![Some(ctx.broadcast_to(&g, shape.as_slice())?)])
        })
    }
}
