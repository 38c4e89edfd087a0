//! Sorting ops: `topk` (the `k` first of each sorted line) and `argsort`.
//!
//! Both order the elements of every line along an axis by a total order: the
//! numeric order of `f32`, with `-0.0` equal to `+0.0` and every NaN greater than
//! every number (`+inf` included), equal elements ordered by increasing position.
//! Descending orders reverse the values but keep ties by increasing position
//! (PyTorch's stable sort). The result is therefore unique: the same for every
//! team size and batch size.
//!
//! Lines are ordered in parallel, one line per task; each parallel chunk keeps one
//! key buffer of the line's length, a scratch lease from the context's pool (no
//! heap allocation at steady state).

use crate::axis::Axis;
use crate::context::ExecContext;
use crate::error::ExecError;
use crate::kernels::sort::{key_position, line_keys, smallest_k};
use crate::kernels::transpose::transpose_rows;
use crate::parallel::for_each_run;
use crate::tensor::RawTensor;
use crate::tensor::layout::{Dims, check_axis};

/// Lines longer than this cannot be ordered (positions are packed in 32 bits).
const MAX_LINE: u64 = 1 << 32;

impl ExecContext {
    /// The `k` largest (`largest == true`) or smallest elements of every line of
    /// `x` along `axis`, sorted (largest first, or smallest first), with their
    /// positions along `axis`. Both results have `x`'s shape with size `k` on
    /// `axis`. Equal values are ordered by lower position first.
    ///
    /// NaN is treated as greater than every number (as PyTorch does): with
    /// `largest` the NaNs of a line come first, otherwise they are selected only
    /// when `k` exceeds the line's count of numbers, and come last. `-0.0` and
    /// `+0.0` are equal (ordered by position).
    ///
    /// ```
    /// use fucina_exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = ctx.from_slice(&[2, 4], &[1., 5., 3., 5., 0., -1., 2., f32::NAN])?;
    /// let (v, i) = ctx.topk(&x, 2, 1, true)?;
    /// assert_eq!(i.to_vec(), [1, 3, 3, 2]);
    /// let v = v.to_vec();
    /// assert_eq!(v[..2], [5., 5.]);
    /// assert!(v[2].is_nan()); // NaN is the largest
    /// assert_eq!(v[3], 2.);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`]; [`ExecError::InvalidArgument`] if `k` is 0 or
    /// above the axis length; [`ExecError::InvalidShape`] if the axis is longer
    /// than 2^32 elements; [`ExecError::OutOfMemory`].
    pub fn topk(
        &self,
        x: &RawTensor,
        k: usize,
        axis: impl Axis,
        largest: bool,
    ) -> Result<(RawTensor, RawTensor<i64>), ExecError> {
        const OP: &str = "topk";
        let axis = check_axis(OP, axis, x.rank())?;
        let n = x.shape()[axis];
        if k == 0 || k > n {
            return Err(ExecError::InvalidArgument {
                op: OP,
                reason: "k must be at least 1 and at most the length of the axis",
            });
        }
        check_line(OP, x, axis)?;
        let xs = self.contiguous(x)?;
        let xs = xs.contiguous_slice();
        let indices = self.order_lines(OP, xs, x.shape(), axis, k, largest)?;
        let inner: usize = x.shape()[axis + 1..].iter().product();
        let ix = indices.contiguous_slice();
        let values = self.new_tensor(OP, indices.shape(), |out: &mut [f32]| {
            // Rows (o, j) of `inner` values: values[o, j, i] = x[o, idx[o, j, i], i].
            self.par_rows(out, inner, inner, |rows, dst| {
                for (r, drow) in rows.zip(dst.chunks_exact_mut(inner)) {
                    let o = r / k;
                    let block = &xs[o * n * inner..(o + 1) * n * inner];
                    let irow = &ix[r * inner..(r + 1) * inner];
                    for (i, (d, &t)) in drow.iter_mut().zip(irow).enumerate() {
                        *d = block[t as usize * inner + i];
                    }
                }
            });
        })?;
        Ok((values, indices))
    }

    /// The positions that sort every line of `x` along `axis`, ascending (or
    /// descending). Stable: equal values keep their order (lower position first),
    /// in both directions. NaN is greater than every number (last ascending, first
    /// descending); `-0.0` equals `+0.0`. The result has `x`'s shape.
    ///
    /// ```
    /// use fucina_exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = ctx.from_slice(&[5], &[3., f32::NAN, 1., 3., -2.])?;
    /// assert_eq!(ctx.argsort(&x, 0, false)?.to_vec(), [4, 2, 0, 3, 1]);
    /// assert_eq!(ctx.argsort(&x, 0, true)?.to_vec(), [1, 0, 3, 2, 4]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`]; [`ExecError::InvalidShape`] if the axis is
    /// longer than 2^32 elements; [`ExecError::OutOfMemory`].
    pub fn argsort(
        &self,
        x: &RawTensor,
        axis: impl Axis,
        descending: bool,
    ) -> Result<RawTensor<i64>, ExecError> {
        const OP: &str = "argsort";
        let axis = check_axis(OP, axis, x.rank())?;
        check_line(OP, x, axis)?;
        let xs = self.contiguous(x)?;
        let n = x.shape()[axis];
        self.order_lines(OP, xs.contiguous_slice(), x.shape(), axis, n, descending)
    }

    /// The positions of the first `k` elements of every line along `axis` of the
    /// contiguous `xs` (of `shape`) in the order of the module docs, as an i64
    /// tensor of `shape` with `k` on `axis`.
    fn order_lines(
        &self,
        op: &'static str,
        xs: &[f32],
        shape: &[usize],
        axis: usize,
        k: usize,
        descending: bool,
    ) -> Result<RawTensor<i64>, ExecError> {
        let n = shape[axis];
        let outer: usize = shape[..axis].iter().product();
        let inner: usize = shape[axis + 1..].iter().product();
        let mut out_shape = Dims::new(shape);
        out_shape.as_mut_slice()[axis] = k;
        // A selection plus a sort of k: about n + k log k steps per line.
        let work_per_line = n + k * (k.ilog2() as usize + 1);
        // Lines as rows [outer * inner, k]: each line is ordered by exactly one task.
        // One key buffer per chunk (a pooled scratch lease), reused for its lines.
        let order = |rows: std::ops::Range<usize>, dst: &mut [i64], keys: &mut [u64]| {
            for (line, drow) in rows.zip(dst.chunks_exact_mut(k)) {
                let (o, i) = (line / inner, line % inner);
                let block = &xs[o * n * inner..(o + 1) * n * inner];
                let values = block[i..].iter().step_by(inner).copied();
                line_keys(keys, values, descending);
                smallest_k(keys, k);
                for (d, &key) in drow.iter_mut().zip(&keys[..k]) {
                    *d = key_position(key);
                }
            }
        };
        let mut done = Ok(());
        let by_line = self.new_tensor(op, &[outer * inner, k], |out: &mut [i64]| {
            done = self.par_rows_with_scratch(op, out, k, work_per_line, n, order);
        })?;
        done?;
        if inner == 1 {
            return by_line.reshape(&out_shape);
        }
        // [outer, inner, k] -> [outer, k, inner]: rows (o, j) of `inner` positions,
        // in runs of equal `o`, transposed in tiles.
        let by = by_line.contiguous_slice();
        self.new_tensor(op, &out_shape, |out: &mut [i64]| {
            self.par_rows(out, inner, inner, |rows, dst| {
                for_each_run(rows, k, inner, dst, |o, run, head| {
                    let lines = &by[o * inner * k..(o + 1) * inner * k];
                    transpose_rows(head, lines, inner, k, run.start - o * k);
                });
            });
        })
    }
}

/// Refuses lines too long for the packed keys.
fn check_line(op: &'static str, x: &RawTensor, axis: usize) -> Result<(), ExecError> {
    if x.shape()[axis] as u64 > MAX_LINE {
        return Err(ExecError::InvalidShape {
            op,
            shape: x.dims(),
            reason: "the axis is longer than 2^32 elements",
        });
    }
    Ok(())
}
