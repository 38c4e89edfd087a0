//! Joining and indexing: concat, stack, index_select, embedding, gather.

use fucina_exec::{Axis, ExecContext, RawTensor};

use crate::error::Result;
use crate::node::{GradList, grads, record};
use crate::tensor::Tensor;

impl Tensor {
    /// `parts` joined along `axis`; each part's gradient is its window of the
    /// output gradient (a view).
    ///
    /// # Errors
    /// Shape or axis errors of the exec layer's `concat`; out of memory.
    pub fn concat(ctx: &ExecContext, parts: &[&Tensor], axis: impl Axis) -> Result<Tensor> {
        let raws: Vec<&RawTensor> = parts.iter().map(|t| &t.raw).collect();
        let out = ctx.concat(&raws, axis)?;
        // The exec call succeeded, so `parts` is non-empty and the axis valid.
        let axis = axis.resolve("concat", parts[0].raw.rank())?;
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
    pub fn stack(ctx: &ExecContext, parts: &[&Tensor], axis: impl Axis) -> Result<Tensor> {
        let raws: Vec<&RawTensor> = parts.iter().map(|t| &t.raw).collect();
        let out = ctx.stack(&raws, axis)?;
        let axis = axis.resolve("stack", parts[0].raw.rank() + 1)?;
        record!(ctx, "stack", out, parts, Axis { axis }, |_, g, needs| {
            let axis = *axis;
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
        axis: impl Axis,
        indices: &RawTensor<i64>,
    ) -> Result<Tensor> {
        let axis = axis.resolve("index_select", self.raw.rank())?;
        let out = ctx.index_select(&self.raw, axis, indices)?;
        let (shape, index) = (self.raw.dims(), indices.clone());
        record!(
            ctx,
            "index_select",
            out,
            &[self],
            Indexed { shape, axis, index },
            |ctx, g, _| {
                Ok(grads![Some(ctx.index_select_backward(
                    g,
                    *axis,
                    index,
                    shape.as_slice()
                )?)])
            }
        )
    }

    /// Rows of the embedding table `self` (`[vocab, dim]`) at `ids`.
    ///
    /// # Errors
    /// As [`index_select`](Tensor::index_select).
    pub fn embedding(&self, ctx: &ExecContext, ids: &RawTensor<i64>) -> Result<Tensor> {
        let out = ctx.embedding(&self.raw, ids)?;
        let (rows, ids) = (self.shape()[0], ids.clone());
        record!(
            ctx,
            "embedding",
            out,
            &[self],
            Embedding { rows, ids },
            |ctx, g, _| Ok(grads![Some(ctx.embedding_backward(g, ids, *rows)?)])
        )
    }

    /// Elements of `self` at `index` along `axis` (`torch.gather`).
    ///
    /// # Errors
    /// As [`index_select`](Tensor::index_select).
    pub fn gather(
        &self,
        ctx: &ExecContext,
        axis: impl Axis,
        index: &RawTensor<i64>,
    ) -> Result<Tensor> {
        let axis = axis.resolve("gather", self.raw.rank())?;
        let out = ctx.gather(&self.raw, axis, index)?;
        self.record_gathered(ctx, "gather", out, axis, index.clone())
    }

    /// Records `out`, elements of `self` picked at `index` along `axis`: its
    /// backward is the deterministic scatter-add of `gather_backward`.
    fn record_gathered(
        &self,
        ctx: &ExecContext,
        name: &'static str,
        out: RawTensor,
        axis: usize,
        index: RawTensor<i64>,
    ) -> Result<Tensor> {
        let shape = self.raw.dims();
        record!(
            ctx,
            name,
            out,
            &[self],
            Indexed { shape, axis, index },
            |ctx, g, _| {
                let gx = ctx.gather_backward(g, *axis, index, shape.as_slice())?;
                Ok(grads![Some(gx)])
            }
        )
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
        axis: impl Axis,
        largest: bool,
    ) -> Result<(Tensor, RawTensor<i64>)> {
        let axis = axis.resolve("topk", self.raw.rank())?;
        let (values, idx) = ctx.topk(&self.raw, k, axis, largest)?;
        let values = self.record_gathered(ctx, "topk", values, axis, idx.clone())?;
        Ok((values, idx))
    }
}
