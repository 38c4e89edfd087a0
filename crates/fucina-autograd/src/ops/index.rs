//! Joining and indexing: concat, stack, index_select, embedding, gather.

use fucina_exec::{ExecContext, RawTensor};

use crate::error::Result;
use crate::node::{GradList, Saved, grads};
use crate::tensor::Tensor;

impl Tensor {
    /// `parts` joined along `axis`; each part's gradient is its window of the
    /// output gradient (a view).
    ///
    /// # Errors
    /// Shape or axis errors of the exec layer's `concat`; out of memory.
    pub fn concat(ctx: &ExecContext, parts: &[&Tensor], axis: usize) -> Result<Tensor> {
        let raws: Vec<&RawTensor> = parts.iter().map(|t| &t.raw).collect();
        let out = ctx.concat(&raws, axis)?;
        let sizes: Vec<usize> = parts.iter().map(|t| t.shape()[axis]).collect();
        Tensor::finish_boxed(ctx, "concat", out, parts, move |_, g, needs| {
            let mut start = 0;
            sizes
                .iter()
                .zip(needs)
                .map(|(&n, &need)| {
                    let window = if need {
                        Some(g.narrow(axis, start, n)?)
                    } else {
                        None
                    };
                    start += n;
                    Ok(window)
                })
                .collect::<Result<GradList>>()
        })
    }

    /// `parts` (equal shapes) stacked along a new `axis`.
    ///
    /// # Errors
    /// Shape or axis errors of the exec layer's `stack`; out of memory.
    pub fn stack(ctx: &ExecContext, parts: &[&Tensor], axis: usize) -> Result<Tensor> {
        let raws: Vec<&RawTensor> = parts.iter().map(|t| &t.raw).collect();
        let out = ctx.stack(&raws, axis)?;
        let saved = Saved::default().with_u([axis]);
        Tensor::finish(ctx, "stack", out, parts, saved, |_, s, g, needs| {
            let axis = s.u[0];
            needs
                .iter()
                .enumerate()
                .map(|(i, &need)| {
                    Ok(if need {
                        Some(g.narrow(axis, i, 1)?.squeeze(axis)?)
                    } else {
                        None
                    })
                })
                .collect::<Result<GradList>>()
        })
    }

    /// The slices of `self` at `indices` along `axis`.
    ///
    /// # Errors
    /// [`ExecError::IndexOutOfBounds`](fucina_exec::ExecError::IndexOutOfBounds);
    /// axis errors; out of memory.
    pub fn index_select(
        &self,
        ctx: &ExecContext,
        axis: usize,
        indices: &RawTensor<i64>,
    ) -> Result<Tensor> {
        let out = ctx.index_select(&self.raw, axis, indices)?;
        let mut saved = Saved::default().with_dims([self.raw.dims()]).with_u([axis]);
        saved.idx = Some(indices.clone());
        Tensor::finish(ctx, "index_select", out, &[self], saved, |ctx, s, g, _| {
            Ok(grads![Some(ctx.index_select_backward(
                g,
                s.u[0],
                s.idx(),
                s.shape(0)
            )?)])
        })
    }

    /// Rows of the embedding table `self` (`[vocab, dim]`) at `ids`.
    ///
    /// # Errors
    /// As [`index_select`](Tensor::index_select).
    pub fn embedding(&self, ctx: &ExecContext, ids: &RawTensor<i64>) -> Result<Tensor> {
        let out = ctx.embedding(&self.raw, ids)?;
        let mut saved = Saved::default().with_u([self.shape()[0]]);
        saved.idx = Some(ids.clone());
        Tensor::finish(ctx, "embedding", out, &[self], saved, |ctx, s, g, _| {
            Ok(grads![Some(ctx.embedding_backward(g, s.idx(), s.u[0])?)])
        })
    }

    /// Elements of `self` at `index` along `axis` (`torch.gather`).
    ///
    /// # Errors
    /// As [`index_select`](Tensor::index_select).
    pub fn gather(&self, ctx: &ExecContext, axis: usize, index: &RawTensor<i64>) -> Result<Tensor> {
        let out = ctx.gather(&self.raw, axis, index)?;
        let mut saved = Saved::default().with_dims([self.raw.dims()]).with_u([axis]);
        saved.idx = Some(index.clone());
        Tensor::finish(ctx, "gather", out, &[self], saved, gather_vjp)
    }
}

impl Tensor {
    /// The `k` largest (or smallest) values along `axis` and their indices. The
    /// values are differentiable (the gradient goes back to the selected
    /// positions) and follow the adoption rule of every op; the indices are a
    /// typed, caller-owned result.
    ///
    /// # Errors
    /// [`ExecError::InvalidArgument`](fucina_exec::ExecError::InvalidArgument) for
    /// `k` of 0 or above the axis length; axis errors; out of memory.
    pub fn topk(
        &self,
        ctx: &ExecContext,
        k: usize,
        axis: usize,
        largest: bool,
    ) -> Result<(Tensor, RawTensor<i64>)> {
        let (values, idx) = ctx.topk(&self.raw, k, axis, largest)?;
        let mut saved = Saved::default().with_dims([self.raw.dims()]).with_u([axis]);
        saved.idx = Some(idx.clone());
        let values = Tensor::finish(ctx, "topk", values, &[self], saved, gather_vjp)?;
        Ok((values, idx))
    }
}

/// The VJP of `gather` and `topk`: the gradient scattered back to the saved
/// indices along the saved axis.
fn gather_vjp(ctx: &ExecContext, s: &Saved, g: &RawTensor, _: &[bool]) -> Result<GradList> {
    Ok(grads![Some(ctx.gather_backward(
        g,
        s.u[0],
        s.idx(),
        s.shape(0)
    )?)])
}
