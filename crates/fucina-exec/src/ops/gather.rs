//! Gathers: `index_select`, `gather` and `embedding` (descriptor [`IndexOp`]),
//! and the backward kernels autograd calls for them (`index_select_backward`,
//! `embedding_backward`, `gather_backward`).
//!
//! Every index is checked (`0 <= i < bound`) before anything is allocated. The
//! scatter-add backward kernels are deterministic: each destination row (or
//! destination line) is written by exactly one task, which adds its contributions
//! in increasing index position, so the bits never depend on the team size.

use crate::axis::Axis;
use crate::context::ExecContext;
use crate::error::ExecError;
use crate::kernels::gather::{gather_rows, invert_indices, positions_of, sum_rows_into};
use crate::kernels::simd::vectorized;
use crate::kernels::transpose::transpose_rows;
use crate::ops::common::{
    check_gather_index, check_index_values, copy_logical, for_each_sub_offset, remap_position,
};
use crate::parallel::for_each_run;
use crate::tensor::layout::{Dims, MAX_RANK, check_axis, check_shape};
use crate::tensor::{Element, RawTensor};

impl ExecContext {
    /// The slices of `x` at positions `indices` along `axis` (PyTorch
    /// `index_select`): `indices` is 1-D of length `m`, and the result has `x`'s
    /// shape with size `m` along `axis`. Repeated indices repeat slices. Generic
    /// over the element type.
    ///
    /// ```
    /// use fucina_exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = ctx.from_slice(&[3, 2], &[1., 2., 3., 4., 5., 6.])?;
    /// let i = ctx.from_slice_typed::<i64>(&[3], &[2, 0, 2])?;
    /// assert_eq!(ctx.index_select(&x, 0, &i)?.to_vec(), [5., 6., 1., 2., 5., 6.]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`]; [`ExecError::InvalidShape`] if `indices` is not
    /// 1-D; [`ExecError::IndexOutOfBounds`] (the first offending index and the axis
    /// length) for a negative or too large index; [`ExecError::OutOfMemory`].
    pub fn index_select<T: Element>(
        &self,
        x: &RawTensor<T>,
        axis: impl Axis,
        indices: &RawTensor<i64>,
    ) -> Result<RawTensor<T>, ExecError> {
        const OP: &str = "index_select";
        let out_shape = IndexOp::IndexSelect.out_shape(x.shape(), axis, indices.shape())?;
        let axis = check_axis(OP, axis, x.rank())?;
        let d = x.shape()[axis];
        check_index_values(OP, indices, d)?;
        let inner: usize = x.shape()[axis + 1..].iter().product();
        self.select_rows(OP, x, indices, d, inner, &out_shape)
    }

    /// Embedding lookup: row `ids[..]` of `weight` (`[V, D]`) for every id; `ids`
    /// has any shape (rank up to 7) and the result has shape `ids.shape ++ [D]`.
    /// Generic over the element type.
    ///
    /// ```
    /// use fucina_exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let w = ctx.from_slice(&[3, 2], &[0., 1., 10., 11., 20., 21.])?;
    /// let ids = ctx.from_slice_typed::<i64>(&[2, 2], &[2, 0, 1, 2])?;
    /// let e = ctx.embedding(&w, &ids)?;
    /// assert_eq!(e.shape(), [2, 2, 2]);
    /// assert_eq!(e.to_vec(), [20., 21., 0., 1., 10., 11., 20., 21.]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`] if `weight` is not 2-D or `ids` has rank 8;
    /// [`ExecError::IndexOutOfBounds`] (the first offending id and `V`) for a
    /// negative id or one `>= V`; [`ExecError::OutOfMemory`].
    pub fn embedding<T: Element>(
        &self,
        weight: &RawTensor<T>,
        ids: &RawTensor<i64>,
    ) -> Result<RawTensor<T>, ExecError> {
        const OP: &str = "embedding";
        let out_shape = IndexOp::Embedding.out_shape(weight.shape(), 0, ids.shape())?;
        let (v, dim) = (weight.shape()[0], weight.shape()[1]);
        check_index_values(OP, ids, v)?;
        self.select_rows(OP, weight, ids, v, dim, &out_shape)
    }

    /// `out[o, j, :] = x[o, idx[j], :]` with `x` viewed as `[outer, d, inner]` and
    /// the flattened `idx` (validated) as `[m]`.
    fn select_rows<T: Element>(
        &self,
        op: &'static str,
        x: &RawTensor<T>,
        idx: &RawTensor<i64>,
        d: usize,
        inner: usize,
        out_shape: &[usize],
    ) -> Result<RawTensor<T>, ExecError> {
        check_shape(op, out_shape)?;
        let is = self.contiguous(idx)?;
        let is = is.contiguous_slice();
        let m = is.len();
        if !x.is_contiguous() {
            // Read the selected slices through the strides (a slice `x[o, t, :]` is
            // a run of `x`'s logical order) instead of copying all of `x`.
            return self.new_tensor(op, out_shape, |out| {
                self.par_rows(out, inner, inner, |rows, dst| {
                    for (r, drow) in rows.zip(dst.chunks_exact_mut(inner)) {
                        let (o, j) = (r / m, r % m);
                        copy_logical(x, (o * d + is[j] as usize) * inner, drow);
                    }
                });
            });
        }
        let xs = x.contiguous_slice();
        self.new_tensor(op, out_shape, |out| {
            self.par_rows(out, inner, inner, |rows, dst| {
                // Rows of `out` are (o, j) pairs; handle them in runs of equal `o`.
                let mut r = rows.start;
                let mut rest = dst;
                while r < rows.end {
                    let (o, j0) = (r / m, r % m);
                    let j1 = m.min(j0 + (rows.end - r));
                    let (head, tail) = rest.split_at_mut((j1 - j0) * inner);
                    let src = &xs[o * d * inner..(o + 1) * d * inner];
                    gather_rows(head, src, inner, &is[j0..j1]);
                    rest = tail;
                    r += j1 - j0;
                }
            });
        })
    }

    /// PyTorch `torch.gather`: `out[i_0, .., i_{r-1}] = x[i_0, .., index[i_0, ..,
    /// i_{r-1}], .., i_{r-1}]` (the index replaces the coordinate on `axis`).
    /// `index` has `x`'s rank and, off `axis`, sizes no larger than `x`'s; the
    /// result has `index`'s shape. Generic over the element type.
    ///
    /// ```
    /// use fucina_exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = ctx.from_slice(&[2, 3], &[1., 2., 3., 4., 5., 6.])?;
    /// let i = ctx.from_slice_typed::<i64>(&[2, 1], &[2, 0])?;
    /// assert_eq!(ctx.gather(&x, 1, &i)?.to_vec(), [3., 4.]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`]; [`ExecError::ShapeMismatch`] if `index`'s rank
    /// differs from `x`'s or a size off `axis` exceeds `x`'s;
    /// [`ExecError::IndexOutOfBounds`] (the first offending index and
    /// `x.shape()[axis]`); [`ExecError::OutOfMemory`].
    pub fn gather<T: Element>(
        &self,
        x: &RawTensor<T>,
        axis: impl Axis,
        index: &RawTensor<i64>,
    ) -> Result<RawTensor<T>, ExecError> {
        const OP: &str = "gather";
        IndexOp::Gather.out_shape(x.shape(), axis, index.shape())?;
        let axis = check_axis(OP, axis, x.rank())?;
        let dx = x.shape()[axis];
        check_index_values(OP, index, dx)?;
        let xs = self.contiguous(x)?;
        let ix = self.contiguous(index)?;
        let (xs, ix) = (xs.contiguous_slice(), ix.contiguous_slice());
        let (xshape, ishape) = (x.shape(), index.shape());
        let xin: usize = xshape[axis + 1..].iter().product();
        let m = ishape[axis];
        let iin: usize = ishape[axis + 1..].iter().product();
        let (isub, xsub) = (&ishape[axis + 1..], &xshape[axis + 1..]);
        let same_inner = isub == xsub;
        self.new_tensor(OP, ishape, |out| {
            // Rows of `out` are (o, j): index outer position o, position j on `axis`;
            // a chunk handles them in runs of equal `o`.
            self.par_rows(out, iin, iin, |rows, dst| {
                for_each_run(rows, m, iin, dst, |oi, run, head| {
                    let xo = remap_position(oi, &ishape[..axis], &xshape[..axis])
                        .expect("index sizes never exceed the source's");
                    let xblock = &xs[xo * dx * xin..(xo + 1) * dx * xin];
                    let iblock = &ix[run.start * iin..run.end * iin];
                    let pairs = head.chunks_exact_mut(iin).zip(iblock.chunks_exact(iin));
                    if iin == 1 && xin == 1 {
                        // Gathering along the last axis: one element per row.
                        for (d, &t) in head.iter_mut().zip(iblock) {
                            *d = xblock[t as usize];
                        }
                    } else if same_inner {
                        for (drow, irow) in pairs {
                            for (q, (d, &t)) in drow.iter_mut().zip(irow).enumerate() {
                                *d = xblock[t as usize * xin + q];
                            }
                        }
                    } else {
                        for (drow, irow) in pairs {
                            for_each_sub_offset(isub, xsub, |q, s| {
                                drow[q] = xblock[irow[q] as usize * xin + s];
                            });
                        }
                    }
                });
            });
        })
    }

    /// The backward of [`index_select`](ExecContext::index_select): the gradient
    /// of the source, of shape `src_shape`, from `grad` (the output's gradient:
    /// `src_shape` with size `indices.len()` on `axis`). A scatter-add:
    /// `out[o, t, :] = sum of grad[o, j, :] over the positions j with
    /// indices[j] == t`, in increasing `j` (zero where no index is `t`).
    ///
    /// Deterministic: the inverse of `indices` is built once (a stable counting
    /// sort), then every destination row is summed by exactly one task in
    /// increasing `j`, so the bits are the same for any team size and equal to a
    /// serial scatter-add in index order.
    ///
    /// # Errors
    /// The shape errors of `src_shape`; [`ExecError::InvalidAxis`];
    /// [`ExecError::InvalidShape`] if `indices` is not 1-D;
    /// [`ExecError::ShapeMismatch`] if `grad`'s shape is not `src_shape` with
    /// `indices.len()` on `axis`; [`ExecError::IndexOutOfBounds`];
    /// [`ExecError::OutOfMemory`].
    pub fn index_select_backward(
        &self,
        grad: &RawTensor,
        axis: impl Axis,
        indices: &RawTensor<i64>,
        src_shape: &[usize],
    ) -> Result<RawTensor, ExecError> {
        const OP: &str = "index_select_backward";
        check_shape(OP, src_shape)?;
        let axis = check_axis(OP, axis, src_shape.len())?;
        if indices.rank() != 1 {
            return Err(ExecError::InvalidShape {
                op: OP,
                shape: indices.dims(),
                reason: "the indices must be 1-D",
            });
        }
        let mut expected = Dims::new(src_shape);
        expected.as_mut_slice()[axis] = indices.numel();
        if grad.shape() != expected.as_slice() {
            return Err(ExecError::ShapeMismatch {
                op: OP,
                lhs: grad.dims(),
                rhs: expected,
                reason: "the gradient must have the source shape with the index count on the axis",
            });
        }
        let d = src_shape[axis];
        check_index_values(OP, indices, d)?;
        let inner: usize = src_shape[axis + 1..].iter().product();
        self.scatter_add_rows(OP, grad, indices, d, inner, src_shape)
    }

    /// The backward of [`embedding`](ExecContext::embedding): the weight's
    /// gradient `[vocab, D]` from `grad` (`ids.shape ++ [D]`). Row `t` is the sum of
    /// the gradient rows of every id equal to `t`, in the ids' row-major order (zero
    /// for ids that never occur). Deterministic as
    /// [`index_select_backward`](ExecContext::index_select_backward).
    ///
    /// ```
    /// use fucina_exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let ids = ctx.from_slice_typed::<i64>(&[3], &[1, 0, 1])?;
    /// let g = ctx.from_slice(&[3, 2], &[1., 2., 3., 4., 5., 6.])?;
    /// let gw = ctx.embedding_backward(&g, &ids, 3)?;
    /// assert_eq!(gw.to_vec(), [3., 4., 6., 8., 0., 0.]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`] if `vocab` is 0 or `ids` has rank 8;
    /// [`ExecError::ShapeMismatch`] if `grad`'s shape is not `ids.shape ++ [D]`;
    /// [`ExecError::IndexOutOfBounds`] for an id outside `0..vocab`;
    /// [`ExecError::OutOfMemory`].
    pub fn embedding_backward(
        &self,
        grad: &RawTensor,
        ids: &RawTensor<i64>,
        vocab: usize,
    ) -> Result<RawTensor, ExecError> {
        const OP: &str = "embedding_backward";
        if ids.rank() == MAX_RANK {
            return Err(ExecError::InvalidShape {
                op: OP,
                shape: ids.dims(),
                reason: "the gradient (ids shape plus the embedding axis) would have rank above 8",
            });
        }
        let r = ids.rank();
        if grad.rank() != r + 1 || grad.shape()[..r] != *ids.shape() {
            return Err(ExecError::ShapeMismatch {
                op: OP,
                lhs: grad.dims(),
                rhs: ids.dims(),
                reason: "the gradient must have the ids' shape plus the embedding axis",
            });
        }
        let dim = grad.shape()[r];
        check_shape(OP, &[vocab, dim])?;
        check_index_values(OP, ids, vocab)?;
        self.scatter_add_rows(OP, grad, ids, vocab, dim, &[vocab, dim])
    }

    /// `out[o, t, :] = sum over j with idx[j] == t (increasing j) of g[o, j, :]`,
    /// `out` of shape `out_shape` = `[outer, d, inner]`, `g` = `[outer, m, inner]`
    /// with `m` the number of (validated) indices.
    fn scatter_add_rows(
        &self,
        op: &'static str,
        grad: &RawTensor,
        idx: &RawTensor<i64>,
        d: usize,
        inner: usize,
        out_shape: &[usize],
    ) -> Result<RawTensor, ExecError> {
        let g = self.contiguous(grad)?;
        let is = self.contiguous(idx)?;
        let (g, is) = (g.contiguous_slice(), is.contiguous_slice());
        let m = is.len();
        let mut scratch = self
            .pool()
            .acquire_scratch::<usize>(d + 1 + m)
            .map_err(|e| ExecError::storage(op, e))?;
        let (offs, order) = scratch.split_at_mut(d + 1);
        invert_indices(is, offs, order);
        let (offs, order) = (&*offs, &*order);
        // Every destination row costs its length plus the rows added into it.
        let work_per_row = inner.saturating_mul(1 + m / d);
        self.new_tensor(op, out_shape, |out| {
            self.par_rows(out, inner, work_per_row, |rows, dst| {
                for (r, drow) in rows.zip(dst.chunks_exact_mut(inner)) {
                    let (o, t) = (r / d, r % d);
                    let src = &g[o * m * inner..(o + 1) * m * inner];
                    let at = positions_of(offs, order, t);
                    vectorized!(sum_rows_into(drow, src, at));
                }
            });
        })
    }

    /// The backward of [`gather`](ExecContext::gather): the gradient of the
    /// source, of shape `src_shape`, from `grad` (of `index`'s shape). A
    /// scatter-add: every `grad` element is added at the source position it was
    /// gathered from; everything else is zero.
    ///
    /// Deterministic: the source is split into rows over the axes before `axis`
    /// (or, when there is only one such row, into its columns after `axis`), each
    /// written by exactly one task, which adds the contributions to an element in
    /// increasing position along `axis` (the order of a serial scatter-add in
    /// row-major order), for any team size.
    ///
    /// # Errors
    /// The shape errors of `src_shape`; [`ExecError::InvalidAxis`];
    /// [`ExecError::ShapeMismatch`] if `index` does not fit `src_shape` (as in
    /// [`gather`](ExecContext::gather)) or `grad`'s shape is not `index`'s;
    /// [`ExecError::IndexOutOfBounds`]; [`ExecError::OutOfMemory`].
    pub fn gather_backward(
        &self,
        grad: &RawTensor,
        axis: impl Axis,
        index: &RawTensor<i64>,
        src_shape: &[usize],
    ) -> Result<RawTensor, ExecError> {
        const OP: &str = "gather_backward";
        check_shape(OP, src_shape)?;
        let axis = check_axis(OP, axis, src_shape.len())?;
        check_gather_index(OP, src_shape, axis, index.shape())?;
        if grad.shape() != index.shape() {
            return Err(ExecError::ShapeMismatch {
                op: OP,
                lhs: grad.dims(),
                rhs: index.dims(),
                reason: "the gradient must have the index's shape",
            });
        }
        let d = src_shape[axis];
        check_index_values(OP, index, d)?;
        let g = self.contiguous(grad)?;
        let ix = self.contiguous(index)?;
        let (g, ix) = (g.contiguous_slice(), ix.contiguous_slice());
        let ishape = index.shape();
        let inner: usize = src_shape[axis + 1..].iter().product();
        let m = ishape[axis];
        let iin: usize = ishape[axis + 1..].iter().product();
        let (isub, ssub) = (&ishape[axis + 1..], &src_shape[axis + 1..]);
        let same_inner = isub == ssub;
        let outer: usize = src_shape[..axis].iter().product();
        if outer == 1 && inner > 1 {
            // One source row: split it over its inner columns instead. Column `s`
            // (the `d` destinations of one inner position) is summed into row `s`
            // of a transposed `[inner, d]` scratch, in increasing `j` as below, then
            // the scratch is transposed into place: the same bits as the row path.
            let cols = self.new_tensor(OP, &[inner, d], |sc: &mut [f32]| {
                self.par_rows(sc, d, d + m, |rows, dst| {
                    for (s, col) in rows.zip(dst.chunks_exact_mut(d)) {
                        col.fill(0.0);
                        let Some(q) = remap_position(s, ssub, isub) else {
                            continue;
                        };
                        for j in 0..m {
                            col[ix[j * iin + q] as usize] += g[j * iin + q];
                        }
                    }
                });
            })?;
            let cols = cols.contiguous_slice();
            return self.new_tensor(OP, src_shape, |out| {
                self.par_rows(out, inner, inner, |rows, dst| {
                    transpose_rows(dst, cols, inner, d, rows.start);
                });
            });
        }
        let row_len = d * inner;
        self.new_tensor(OP, src_shape, |out| {
            self.par_rows(out, row_len, row_len + m * iin, |rows, dst| {
                for (o, drow) in rows.zip(dst.chunks_exact_mut(row_len)) {
                    drow.fill(0.0);
                    // The index covers this source row only if its outer coordinates
                    // are inside the index's sizes.
                    let Some(io) = remap_position(o, &src_shape[..axis], &ishape[..axis]) else {
                        continue;
                    };
                    let gblock = &g[io * m * iin..(io + 1) * m * iin];
                    let iblock = &ix[io * m * iin..(io + 1) * m * iin];
                    let pairs = gblock.chunks_exact(iin).zip(iblock.chunks_exact(iin));
                    if same_inner {
                        for (grow, irow) in pairs {
                            for (q, (&g, &t)) in grow.iter().zip(irow).enumerate() {
                                drow[t as usize * inner + q] += g;
                            }
                        }
                    } else {
                        for (grow, irow) in pairs {
                            for_each_sub_offset(isub, ssub, |q, s| {
                                drow[irow[q] as usize * inner + s] += grow[q];
                            });
                        }
                    }
                }
            });
        })
    }
}

/// The descriptor of the gathering family (ops that pick slices or elements of
/// `x` at integer positions along an axis; their backward is a deterministic
/// scatter-add): one variant per op, naming its forward kernel (run by
/// [`ExecContext::index_op`]) and its backward kernel (run by
/// [`ExecContext::index_op_backward`]). The named methods run the same kernels;
/// the autograd layer records one variant per node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IndexOp {
    /// [`ExecContext::index_select`]: whole slices at 1-D indices.
    IndexSelect,
    /// [`ExecContext::gather`]: elements at an index of the source's rank.
    Gather,
    /// [`ExecContext::embedding`]: rows of a 2-D table at ids of any shape (the
    /// axis is always 0).
    Embedding,
}

impl IndexOp {
    /// Every op of the family, in declaration order.
    pub const ALL: &'static [IndexOp] =
        &[IndexOp::IndexSelect, IndexOp::Gather, IndexOp::Embedding];

    /// The op's name (the name of its `ExecContext` method).
    pub fn name(self) -> &'static str {
        match self {
            IndexOp::IndexSelect => "index_select",
            IndexOp::Gather => "gather",
            IndexOp::Embedding => "embedding",
        }
    }

    /// The name of the op's backward kernel.
    pub fn backward_name(self) -> &'static str {
        match self {
            IndexOp::IndexSelect => "index_select_backward",
            IndexOp::Gather => "gather_backward",
            IndexOp::Embedding => "embedding_backward",
        }
    }

    /// The shape of the op's result for a source of shape `x` (the table, for
    /// `Embedding`, whose `axis` must be 0) and an index of shape `index`:
    /// `x`'s shape with the index's length along `axis` (`IndexSelect`, a 1-D
    /// index), the index's shape (`Gather`), or the index's shape followed by
    /// the table's row length (`Embedding`). The index's values are not needed
    /// (nor checked).
    ///
    /// ```
    /// use fucina_exec::IndexOp;
    ///
    /// assert_eq!(IndexOp::IndexSelect.out_shape(&[4, 5], 1, &[3])?.as_slice(), [4, 3]);
    /// assert_eq!(IndexOp::Embedding.out_shape(&[100, 8], 0, &[2, 7])?.as_slice(), [2, 7, 8]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// The shape errors of the op's forward: [`ExecError::InvalidAxis`];
    /// [`ExecError::InvalidShape`] for an `IndexSelect` index that is not 1-D, an
    /// embedding table that is not 2-D, an `Embedding` index of rank 8 (or a shape
    /// no tensor can have); [`ExecError::ShapeMismatch`] for a `Gather` index
    /// that does not fit the source; [`ExecError::InvalidArgument`] for an
    /// embedding along an axis other than 0; [`ExecError::Overflow`].
    pub fn out_shape(
        self,
        x: &[usize],
        axis: impl Axis,
        index: &[usize],
    ) -> Result<Dims, ExecError> {
        let op = self.name();
        check_shape(op, x)?;
        check_shape(op, index)?;
        let out = match self {
            IndexOp::IndexSelect => {
                let axis = check_axis(op, axis, x.len())?;
                let &[m] = index else {
                    return Err(ExecError::InvalidShape {
                        op,
                        shape: Dims::new(index),
                        reason: "the indices must be 1-D",
                    });
                };
                let mut out = Dims::new(x);
                out.as_mut_slice()[axis] = m;
                out
            }
            IndexOp::Gather => {
                let axis = check_axis(op, axis, x.len())?;
                check_gather_index(op, x, axis, index)?;
                Dims::new(index)
            }
            IndexOp::Embedding => {
                let &[_, dim] = x else {
                    return Err(ExecError::InvalidShape {
                        op,
                        shape: Dims::new(x),
                        reason: "the weight must be 2-D [vocab, dim]",
                    });
                };
                embedding_axis(op, axis)?;
                if index.len() == MAX_RANK {
                    return Err(ExecError::InvalidShape {
                        op,
                        shape: Dims::new(index),
                        reason: "the result (ids shape plus the embedding axis) would have rank above 8",
                    });
                }
                let mut out = Dims::new(index);
                out.push(dim);
                out
            }
        };
        check_shape(op, &out)?;
        Ok(out)
    }
}

/// `Err` unless the embedding `axis` is 0 (an embedding looks rows up).
fn embedding_axis(op: &'static str, axis: impl Axis) -> Result<(), ExecError> {
    match axis.resolve(op, 2)? {
        0 => Ok(()),
        _ => Err(ExecError::InvalidArgument {
            op,
            reason: "an embedding looks up rows of its table: the axis must be 0",
        }),
    }
}

impl ExecContext {
    /// Runs the forward kernel of the gathering op `op`: the values of `x` at
    /// `index` along `axis` (the same kernel, and the same bits, as the op's
    /// named method; for [`IndexOp::Embedding`], `x` is the table and `axis`
    /// must be 0).
    ///
    /// ```
    /// use fucina_exec::{ExecContext, IndexOp};
    ///
    /// let ctx = ExecContext::new();
    /// let x = ctx.from_slice(&[3, 2], &[1., 2., 3., 4., 5., 6.])?;
    /// let i = ctx.from_slice_typed::<i64>(&[2], &[2, 0])?;
    /// let y = ctx.index_op(IndexOp::IndexSelect, &x, 0, &i)?;
    /// assert_eq!(y.to_vec(), ctx.index_select(&x, 0, &i)?.to_vec());
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// As [`index_select`](ExecContext::index_select),
    /// [`gather`](ExecContext::gather) or [`embedding`](ExecContext::embedding);
    /// [`ExecError::InvalidArgument`] for an embedding along an axis other than 0.
    pub fn index_op<T: Element>(
        &self,
        op: IndexOp,
        x: &RawTensor<T>,
        axis: impl Axis,
        index: &RawTensor<i64>,
    ) -> Result<RawTensor<T>, ExecError> {
        match op {
            IndexOp::IndexSelect => self.index_select(x, axis, index),
            IndexOp::Gather => self.gather(x, axis, index),
            IndexOp::Embedding => {
                embedding_axis("embedding", axis)?;
                self.embedding(x, index)
            }
        }
    }

    /// Runs the backward kernel of the gathering op `op`: the gradient of the
    /// source, of shape `src_shape`, from the output's gradient `grad` (the
    /// deterministic scatter-add of the op's named backward kernel).
    ///
    /// # Errors
    /// As [`index_select_backward`](ExecContext::index_select_backward),
    /// [`gather_backward`](ExecContext::gather_backward) or
    /// [`embedding_backward`](ExecContext::embedding_backward); for
    /// [`IndexOp::Embedding`], [`ExecError::InvalidArgument`] unless `axis` is 0,
    /// [`ExecError::InvalidShape`] unless `src_shape` is 2-D and
    /// [`ExecError::ShapeMismatch`] unless `grad`'s last dimension is its second.
    pub fn index_op_backward(
        &self,
        op: IndexOp,
        grad: &RawTensor,
        axis: impl Axis,
        index: &RawTensor<i64>,
        src_shape: &[usize],
    ) -> Result<RawTensor, ExecError> {
        match op {
            IndexOp::IndexSelect => self.index_select_backward(grad, axis, index, src_shape),
            IndexOp::Gather => self.gather_backward(grad, axis, index, src_shape),
            IndexOp::Embedding => {
                const OP: &str = "embedding_backward";
                embedding_axis(OP, axis)?;
                let &[vocab, dim] = src_shape else {
                    return Err(ExecError::InvalidShape {
                        op: OP,
                        shape: Dims::new(src_shape),
                        reason: "the table must be 2-D [vocab, dim]",
                    });
                };
                if grad.shape().last() != Some(&dim) {
                    return Err(ExecError::ShapeMismatch {
                        op: OP,
                        lhs: grad.dims(),
                        rhs: Dims::new(src_shape),
                        reason: "the gradient's last dimension must be the table's second",
                    });
                }
                self.embedding_backward(grad, index, vocab)
            }
        }
    }
}
