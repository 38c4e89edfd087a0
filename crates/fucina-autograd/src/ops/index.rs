//! Joining and indexing: one generic apply per family over the [`JoinOp`]
//! (`concat`, `stack`) and [`IndexOp`] (`index_select`, `gather`, `embedding`)
//! descriptors, the named methods forwarding to them, and `topk`, whose values
//! are recorded as a gather.

use fucina_exec::{Axis, Dims, ExecContext, IndexOp, JoinOp, MAX_RANK, RawTensor};

use crate::error::Result;
use crate::record::{GradList, grads, record};
use crate::tensor::Tensor;

/// The gradients of the parts of a join along `axis`: part `i` (of length
/// `len(i)` along the axis) gets its window of `g`, if it needs one.
fn join_grads(
    ctx: &ExecContext,
    op: JoinOp,
    axis: usize,
    g: &RawTensor,
    needs: &[bool],
    len: impl Fn(usize) -> usize,
) -> Result<GradList> {
    let mut start = 0;
    needs
        .iter()
        .enumerate()
        .map(|(i, &need)| {
            let n = len(i);
            let window = match need {
                true => Some(ctx.join_backward(op, g, axis, start, n)?),
                false => None,
            };
            start += n;
            Ok(window)
        })
        .collect()
}

/// Most parts of a join whose raw tensors are passed inline.
const INLINE_PARTS: usize = 8;

impl Tensor {
    /// Joins `parts` along `axis` with the joining op `op` (the descriptor names
    /// the forward kernel, run now, and the backward kernel, run by backward:
    /// each part's gradient is its window of the output's gradient, a view).
    /// [`concat`](Tensor::concat) and [`stack`](Tensor::stack) are this with
    /// their variant. Up to eight `concat` parts (and any number of `stack`
    /// parts) keep their lengths inline in the node; more keep them in a list.
    ///
    /// ```
    /// use fucina_autograd::Tensor;
    /// use fucina_autograd::exec::{ExecContext, JoinOp};
    ///
    /// let ctx = ExecContext::new();
    /// let a = Tensor::variable_from_slice(&ctx, &[2], &[1., 2.])?;
    /// let b = Tensor::variable_from_slice(&ctx, &[2], &[3., 4.])?;
    /// let s = Tensor::join(&ctx, JoinOp::Stack, &[&a, &b], 0)?;
    /// assert_eq!(s.to_vec(), Tensor::stack(&ctx, &[&a, &b], 0)?.to_vec());
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// Shape or axis errors of the exec layer's `concat` / `stack`; out of memory.
    pub fn join(
        ctx: &ExecContext,
        op: JoinOp,
        parts: &[&Tensor],
        axis: impl Axis,
    ) -> Result<Tensor> {
        // Up to eight parts (the layers' joins) pass their raw tensors inline,
        // without a heap list.
        let out = match parts {
            [] => ctx.join(op, &[], axis)?,
            [first, ..] if parts.len() <= INLINE_PARTS => {
                let mut raws = [&first.raw; INLINE_PARTS];
                for (r, t) in raws.iter_mut().zip(parts) {
                    *r = &t.raw;
                }
                ctx.join(op, &raws[..parts.len()], axis)?
            }
            _ => {
                let raws: Vec<&RawTensor> = parts.iter().map(|t| &t.raw).collect();
                ctx.join(op, &raws, axis)?
            }
        };
        // The exec call succeeded, so `parts` is non-empty and the axis valid.
        let axis = axis.resolve(op.name(), op.axis_rank(parts[0].raw.rank()))?;
        if op == JoinOp::Concat && parts.len() > MAX_RANK {
            let sizes: Vec<usize> = parts.iter().map(|t| t.shape()[axis]).collect();
            return Tensor::finish_boxed(ctx, op.name(), out, parts, move |ctx, g, needs| {
                join_grads(ctx, op, axis, g, needs, |i| sizes[i])
            });
        }
        // `stack` parts are one position each: no lengths to keep.
        let mut sizes = Dims::default();
        if op == JoinOp::Concat {
            for t in parts {
                sizes.push(t.shape()[axis]);
            }
        }
        record!(
            ctx,
            op.name(),
            out,
            parts,
            Join { op, axis, sizes },
            |ctx, g, needs| {
                join_grads(ctx, *op, *axis, g, needs, |i| {
                    sizes.as_slice().get(i).copied().unwrap_or(1)
                })
            }
        )
    }

    /// `parts` joined along `axis`; each part's gradient is its window of the
    /// output gradient (a view).
    ///
    /// # Errors
    /// Shape or axis errors of the exec layer's `concat`; out of memory.
    pub fn concat(ctx: &ExecContext, parts: &[&Tensor], axis: impl Axis) -> Result<Tensor> {
        Tensor::join(ctx, JoinOp::Concat, parts, axis)
    }

    /// `parts` (equal shapes) stacked along a new `axis`.
    ///
    /// # Errors
    /// Shape or axis errors of the exec layer's `stack`; out of memory.
    pub fn stack(ctx: &ExecContext, parts: &[&Tensor], axis: impl Axis) -> Result<Tensor> {
        Tensor::join(ctx, JoinOp::Stack, parts, axis)
    }

    /// Picks the values of `self` at `index` along `axis` with the gathering op
    /// `op` (the descriptor names the forward kernel, run now, and the backward
    /// kernel, run by backward: a deterministic scatter-add). The named methods
    /// are this with their variant (an embedding's axis is 0).
    ///
    /// ```
    /// use fucina_autograd::Tensor;
    /// use fucina_autograd::exec::{ExecContext, IndexOp};
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::variable_from_slice(&ctx, &[3], &[1., 2., 3.])?;
    /// let i = ctx.from_slice_typed::<i64>(&[2], &[2, 2])?;
    /// let y = x.index_op(&ctx, IndexOp::IndexSelect, 0, &i)?;
    /// assert_eq!(y.to_vec(), x.index_select(&ctx, 0, &i)?.to_vec());
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::IndexOutOfBounds`](fucina_exec::ExecError::IndexOutOfBounds);
    /// axis and shape errors of the exec kernel; out of memory.
    pub fn index_op(
        &self,
        ctx: &ExecContext,
        op: IndexOp,
        axis: impl Axis,
        index: &RawTensor<i64>,
    ) -> Result<Tensor> {
        let axis = axis.resolve(op.name(), self.raw.rank())?;
        let out = ctx.index_op(op, &self.raw, axis, index)?;
        self.record_indexed(ctx, op, op.name(), out, axis, index.clone())
    }

    /// Records `out`, values of `self` picked at `index` along `axis` by `op`:
    /// its backward is `op`'s scatter-add.
    fn record_indexed(
        &self,
        ctx: &ExecContext,
        op: IndexOp,
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
            Indexed {
                op,
                shape,
                axis,
                index
            },
            |ctx, g, _| {
                let gx = ctx.index_op_backward(*op, g, *axis, index, shape.as_slice())?;
                Ok(grads![Some(gx)])
            }
        )
    }

    /// Rows of the embedding table `self` (`[vocab, dim]`) at `ids`.
    ///
    /// # Errors
    /// As [`index_select`](Tensor::index_select).
    pub fn embedding(&self, ctx: &ExecContext, ids: &RawTensor<i64>) -> Result<Tensor> {
        self.index_op(ctx, IndexOp::Embedding, 0, ids)
    }
}

/// The named gathering methods along an axis, each [`Tensor::index_op`] with
/// its descriptor.
macro_rules! gathering {
    ($($(#[$doc:meta])* $name:ident => $variant:ident;)*) => {
        impl Tensor {$(
            $(#[$doc])*
            pub fn $name(
                &self,
                ctx: &ExecContext,
                axis: impl Axis,
                index: &RawTensor<i64>,
            ) -> Result<Tensor> {
                self.index_op(ctx, IndexOp::$variant, axis, index)
            }
        )*}
    };
}

gathering! {
    /// The slices of `self` at the 1-D `index` along `axis`.
    ///
    /// # Errors
    /// [`ExecError::IndexOutOfBounds`](fucina_exec::ExecError::IndexOutOfBounds);
    /// axis errors; out of memory.
    index_select => IndexSelect;
    /// Elements of `self` at `index` along `axis` (`torch.gather`).
    ///
    /// # Errors
    /// As [`index_select`](Tensor::index_select).
    gather => Gather;
}

impl Tensor {
    /// The `k` largest (or smallest) values along `axis` and their indices. The
    /// values are differentiable (the gradient goes back to the selected
    /// positions: recorded as [`IndexOp::Gather`] at the returned indices) and
    /// follow the adoption rule of every op; the indices are a typed,
    /// caller-owned result.
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
        let values =
            self.record_indexed(ctx, IndexOp::Gather, "topk", values, axis, idx.clone())?;
        Ok((values, idx))
    }
}
