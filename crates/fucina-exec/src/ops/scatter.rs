//! `scatter_add` along an axis (out of place, like `torch.Tensor.scatter_add`).
//!
//! Every index is checked before anything is allocated. Each output block (one
//! position of the axes before `axis`) is written by one task, which copies the
//! input's block and then adds the contributions of the matching index block in
//! row-major index order: the order a serial scatter-add uses, so the bits never
//! depend on the team size.

use crate::axis::Axis;
use crate::context::ExecContext;
use crate::error::ExecError;
use crate::ops::common::{
    check_gather_index, check_index_values, for_each_sub_offset, remap_position,
};
use crate::tensor::RawTensor;
use crate::tensor::layout::check_axis;

impl ExecContext {
    /// `x` with `src` added at the positions `index` names along `axis` (like
    /// `torch.Tensor.scatter_add`, out of place): for every position `p` of
    /// `index`, `out[p with index[p] on axis] += src[p]`, the contributions added
    /// in row-major order of `p` after a copy of `x`. `index` and `src` have the
    /// same shape, of `x`'s rank, with sizes off `axis` at most `x`'s. Each output
    /// block is written by one task in that order: the same bits for every team
    /// size.
    ///
    /// ```
    /// use fucina_exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = ctx.zeros(&[1, 3])?;
    /// let index = ctx.from_slice_typed::<i64>(&[1, 4], &[0, 2, 0, 1])?;
    /// let src = ctx.from_slice(&[1, 4], &[1., 2., 3., 4.])?;
    /// assert_eq!(ctx.scatter_add(&x, 1, &index, &src)?.to_vec(), [4., 4., 2.]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`] if `axis` is outside `-rank..rank`;
    /// [`ExecError::ShapeMismatch`] if `src`'s shape differs from `index`'s, or
    /// `index` has another rank than `x` or a larger size off `axis`;
    /// [`ExecError::IndexOutOfBounds`] naming the first index outside
    /// `0..x.shape()[axis]`; [`ExecError::OutOfMemory`].
    pub fn scatter_add(
        &self,
        x: &RawTensor,
        axis: impl Axis,
        index: &RawTensor<i64>,
        src: &RawTensor,
    ) -> Result<RawTensor, ExecError> {
        const OP: &str = "scatter_add";
        let axis = check_axis(OP, axis, x.rank())?;
        if src.shape() != index.shape() {
            return Err(ExecError::ShapeMismatch {
                op: OP,
                lhs: index.dims(),
                rhs: src.dims(),
                reason: "src must have the index's shape",
            });
        }
        let (xshape, ishape) = (x.shape(), index.shape());
        check_gather_index(OP, xshape, axis, index.shape())?;
        let dx = xshape[axis];
        check_index_values(OP, index, dx)?;
        let (xc, ic, sc) = (
            self.contiguous(x)?,
            self.contiguous(index)?,
            self.contiguous(src)?,
        );
        let (xs, ix, ss) = (
            xc.contiguous_slice(),
            ic.contiguous_slice(),
            sc.contiguous_slice(),
        );
        let xin: usize = xshape[axis + 1..].iter().product();
        let (m, iin): (usize, usize) = (ishape[axis], ishape[axis + 1..].iter().product());
        let (isub, xsub) = (&ishape[axis + 1..], &xshape[axis + 1..]);
        let row = dx * xin;
        self.new_tensor(OP, xshape, |out| {
            self.par_rows(out, row, row + m * iin, |rows, dst| {
                for (o, drow) in rows.zip(dst.chunks_exact_mut(row)) {
                    drow.copy_from_slice(&xs[o * row..][..row]);
                    let Some(io) = remap_position(o, &xshape[..axis], &ishape[..axis]) else {
                        continue;
                    };
                    let iblock = &ix[io * m * iin..][..m * iin];
                    let sblock = &ss[io * m * iin..][..m * iin];
                    for (irow, srow) in iblock.chunks_exact(iin).zip(sblock.chunks_exact(iin)) {
                        for_each_sub_offset(isub, xsub, |q, s| {
                            drow[irow[q] as usize * xin + s] += srow[q];
                        });
                    }
                }
            });
        })
    }
}
