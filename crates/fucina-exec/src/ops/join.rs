//! Joins: `concat` and `stack` (descriptor [`JoinOp`]) and `split`, the
//! backward of `concat` (zero-copy windows of the gradient).
//!
//! Parts of any layout (transposed, narrowed, broadcast views) are read through
//! their strides; each output element is written by one task, so the bits never
//! depend on the team size.

use crate::axis::Axis;
use crate::context::ExecContext;
use crate::error::ExecError;
use crate::ops::common::copy_logical;
use crate::tensor::layout::{Dims, MAX_RANK, check_axis, check_shape};
use crate::tensor::{Element, RawTensor};

/// One operand of a join: its block length per output row, and its elements when
/// it is contiguous (read through the strides of `t` otherwise).
struct Part<'a, T: Element> {
    t: &'a RawTensor<T>,
    contiguous: Option<&'a [T]>,
    inner: usize,
}

impl<T: Element> Clone for Part<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: Element> Copy for Part<'_, T> {}

impl<'a, T: Element> Part<'a, T> {
    fn new(t: &'a RawTensor<T>, outer: usize) -> Self {
        Part {
            t,
            contiguous: t.is_contiguous().then(|| t.contiguous_slice()),
            inner: t.numel() / outer,
        }
    }

    /// Copies its logical elements `start..start + dst.len()` into `dst`.
    #[inline]
    fn copy(&self, start: usize, dst: &mut [T]) {
        match self.contiguous {
            Some(src) if dst.len() == 1 => dst[0] = src[start],
            Some(src) => dst.copy_from_slice(&src[start..start + dst.len()]),
            None => copy_logical(self.t, start, dst),
        }
    }
}

/// Joins with at most this many operands describe them on the stack.
const INLINE_PARTS: usize = 16;

/// Runs `f` with the [`Part`]s of `parts` (on the stack for up to
/// [`INLINE_PARTS`] operands, in one `Vec` beyond).
fn with_parts<T: Element, R>(
    parts: &[&RawTensor<T>],
    outer: usize,
    f: impl FnOnce(&[Part<'_, T>]) -> R,
) -> R {
    if parts.len() <= INLINE_PARTS {
        let mut arr = [Part::new(parts[0], outer); INLINE_PARTS];
        for (a, p) in arr.iter_mut().zip(parts) {
            *a = Part::new(p, outer);
        }
        f(&arr[..parts.len()])
    } else {
        let v: Vec<Part<'_, T>> = parts.iter().map(|p| Part::new(p, outer)).collect();
        f(&v)
    }
}

/// The join of `parts` (validated; `outer` rows, see [`fill_joined`]) as a new
/// tensor of `out_shape`.
fn joined<T: Element>(
    ctx: &ExecContext,
    op: &'static str,
    parts: &[&RawTensor<T>],
    outer: usize,
    out_shape: &[usize],
) -> Result<RawTensor<T>, ExecError> {
    with_parts(parts, outer, |parts| {
        ctx.new_tensor(op, out_shape, |out| {
            ctx.par_rows(out, 1, 1, |range, dst| {
                fill_joined(parts, range.start, dst);
            });
        })
    })
}

/// Writes the elements `pos0..pos0 + dst.len()` of the join of `parts`: the output
/// is `outer` rows, each the concatenation of one block of every part (part `i`'s
/// block `o` is its logical elements `o * inner_i..(o + 1) * inner_i`).
fn fill_joined<T: Element>(parts: &[Part<'_, T>], pos0: usize, dst: &mut [T]) {
    let row_total: usize = parts.iter().map(|p| p.inner).sum();
    let mut o = pos0 / row_total;
    let mut within = pos0 % row_total;
    let mut i = 0;
    while within >= parts[i].inner {
        within -= parts[i].inner;
        i += 1;
    }
    let mut written = 0;
    while written < dst.len() {
        let w = parts[i].inner;
        let take = (w - within).min(dst.len() - written);
        parts[i].copy(o * w + within, &mut dst[written..written + take]);
        written += take;
        within = 0;
        i += 1;
        if i == parts.len() {
            i = 0;
            o += 1;
        }
    }
}

impl ExecContext {
    /// Joins `parts` along the existing axis `axis`: every part has the same rank
    /// and the same sizes off `axis`; the result's size along `axis` is the sum of
    /// theirs. Parts of any layout (transposed, narrowed, broadcast views) are read
    /// through their strides; nothing is allocated besides the output (and, for
    /// more than 16 parts, one small list describing them).
    ///
    /// The backward of `concat` is [`split`](ExecContext::split) of the gradient
    /// with the parts' sizes along `axis` (zero-copy [`RawTensor::narrow`] views).
    ///
    /// ```
    /// use fucina_exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let a = ctx.from_slice(&[2, 1], &[1., 2.])?;
    /// let b = ctx.from_slice(&[2, 2], &[3., 4., 5., 6.])?;
    /// let c = ctx.concat(&[&a, &b], 1)?;
    /// assert_eq!(c.shape(), [2, 3]);
    /// assert_eq!(c.to_vec(), [1., 3., 4., 2., 5., 6.]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidArgument`] if `parts` is empty;
    /// [`ExecError::InvalidAxis`] if `axis` is outside `-rank..rank`;
    /// [`ExecError::ShapeMismatch`] if a part's rank or a size off `axis` differs
    /// from the first part's; [`ExecError::Overflow`] if the joined size overflows;
    /// [`ExecError::OutOfMemory`].
    pub fn concat<T: Element>(
        &self,
        parts: &[&RawTensor<T>],
        axis: impl Axis,
    ) -> Result<RawTensor<T>, ExecError> {
        let out_shape = JoinOp::Concat.out_shape(parts.iter().map(|p| p.shape()), axis)?;
        let axis = check_axis("concat", axis, out_shape.len())?;
        let outer: usize = out_shape[..axis].iter().product();
        joined(self, "concat", parts, outer, &out_shape)
    }

    /// Stacks `parts`, which all have the same shape, along a new axis inserted at
    /// position `axis` (`0..=rank`, or `-rank - 1..0` counted from the end of the
    /// result, so `-1` appends it): the result has shape `shape[..axis] ++
    /// [parts.len()] ++ shape[axis..]`. Parts of any layout are read through their
    /// strides.
    ///
    /// The backward of `stack` is `grad.narrow(axis, i, 1)?.squeeze(axis)` for
    /// part `i` (zero-copy views; [`split`](ExecContext::split) with sizes of 1).
    ///
    /// ```
    /// use fucina_exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let a = ctx.from_slice(&[2], &[1., 2.])?;
    /// let b = ctx.from_slice(&[2], &[3., 4.])?;
    /// assert_eq!(ctx.stack(&[&a, &b], 0)?.to_vec(), [1., 2., 3., 4.]);
    /// let s = ctx.stack(&[&a, &b], 1)?;
    /// assert_eq!(s.shape(), [2, 2]);
    /// assert_eq!(s.to_vec(), [1., 3., 2., 4.]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidArgument`] if `parts` is empty;
    /// [`ExecError::InvalidAxis`] if `axis` is outside `-rank - 1..=rank`;
    /// [`ExecError::InvalidShape`] if
    /// the result would have rank above 8; [`ExecError::ShapeMismatch`] if a part's
    /// shape differs from the first part's; [`ExecError::Overflow`];
    /// [`ExecError::OutOfMemory`].
    pub fn stack<T: Element>(
        &self,
        parts: &[&RawTensor<T>],
        axis: impl Axis,
    ) -> Result<RawTensor<T>, ExecError> {
        let out_shape = JoinOp::Stack.out_shape(parts.iter().map(|p| p.shape()), axis)?;
        let axis = check_axis("stack", axis, out_shape.len())?;
        let outer: usize = out_shape[..axis].iter().product();
        joined(self, "stack", parts, outer, &out_shape)
    }

    /// Splits `x` along `axis` into consecutive zero-copy [`RawTensor::narrow`]
    /// views of the given `sizes` (which must sum to the axis length). This is the
    /// backward of [`concat`](ExecContext::concat): split the gradient with the
    /// parts' sizes.
    ///
    /// ```
    /// use fucina_exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = ctx.from_slice(&[2, 3], &[1., 2., 3., 4., 5., 6.])?;
    /// let parts = ctx.split(&x, 1, &[1, 2])?;
    /// assert_eq!(parts[0].to_vec(), [1., 4.]);
    /// assert_eq!(parts[1].to_vec(), [2., 3., 5., 6.]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`]; [`ExecError::InvalidArgument`] if `sizes` is
    /// empty, holds a zero, or does not sum to the axis length.
    pub fn split<T: Element>(
        &self,
        x: &RawTensor<T>,
        axis: impl Axis,
        sizes: &[usize],
    ) -> Result<Vec<RawTensor<T>>, ExecError> {
        const OP: &str = "split";
        let axis = check_axis(OP, axis, x.rank())?;
        if sizes.is_empty() || sizes.contains(&0) {
            return Err(ExecError::InvalidArgument {
                op: OP,
                reason: "the sizes must be a non-empty list of non-zero lengths",
            });
        }
        let sum = sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s));
        if sum != Some(x.shape()[axis]) {
            return Err(ExecError::InvalidArgument {
                op: OP,
                reason: "the sizes do not sum to the length of the axis",
            });
        }
        let mut start = 0;
        let mut out = Vec::with_capacity(sizes.len());
        for &len in sizes {
            out.push(x.narrow(axis, start, len)?);
            start += len;
        }
        Ok(out)
    }
}

/// The descriptor of the joining family (ops that lay several same-shaped
/// tensors side by side): one variant per op, naming its forward kernel (run by
/// [`ExecContext::join`]) and its backward kernel (run by
/// [`ExecContext::join_backward`]: each part's gradient is a zero-copy window of
/// the output's gradient). The named methods run the same kernels; the
/// autograd layer records one variant per node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum JoinOp {
    /// [`ExecContext::concat`]: joined along an existing axis.
    Concat,
    /// [`ExecContext::stack`]: stacked along a new axis.
    Stack,
}

impl JoinOp {
    /// Every op of the family, in declaration order.
    pub const ALL: &'static [JoinOp] = &[JoinOp::Concat, JoinOp::Stack];

    /// The op's name (the name of its `ExecContext` method).
    pub fn name(self) -> &'static str {
        match self {
            JoinOp::Concat => "concat",
            JoinOp::Stack => "stack",
        }
    }

    /// The rank the op's `axis` is resolved against, for parts of rank `rank`:
    /// `rank` for `concat`, `rank + 1` for `stack` (whose axis is one of the
    /// result's).
    pub fn axis_rank(self, rank: usize) -> usize {
        match self {
            JoinOp::Concat => rank,
            JoinOp::Stack => rank + 1,
        }
    }

    /// The shape of the op's result for parts of the shapes `parts` joined along
    /// `axis`: for `Concat`, the parts' common shape with the sum of their sizes
    /// along `axis`; for `Stack`, their common shape with the number of parts
    /// inserted at `axis` (an axis of the result). One pass over `parts`.
    ///
    /// ```
    /// use fucina_exec::JoinOp;
    ///
    /// let parts: [&[usize]; 2] = [&[2, 1], &[2, 3]];
    /// assert_eq!(JoinOp::Concat.out_shape(parts, 1)?.as_slice(), [2, 4]);
    /// assert_eq!(JoinOp::Stack.out_shape([&[2, 3][..]; 4], -1)?.as_slice(), [2, 3, 4]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// As [`concat`](ExecContext::concat) or [`stack`](ExecContext::stack):
    /// [`ExecError::InvalidArgument`] for no parts, [`ExecError::InvalidAxis`],
    /// [`ExecError::ShapeMismatch`] for a part whose shape does not fit the
    /// first's, [`ExecError::InvalidShape`] for a stack of rank-8 parts (or a shape
    /// no tensor can have), [`ExecError::Overflow`].
    pub fn out_shape<'a>(
        self,
        parts: impl IntoIterator<Item = &'a [usize]>,
        axis: impl Axis,
    ) -> Result<Dims, ExecError> {
        let op = self.name();
        let mut parts = parts.into_iter();
        let Some(first) = parts.next() else {
            return Err(ExecError::InvalidArgument {
                op,
                reason: match self {
                    JoinOp::Concat => "the list of tensors to concatenate is empty",
                    JoinOp::Stack => "the list of tensors to stack is empty",
                },
            });
        };
        check_shape(op, first)?;
        let rank = first.len();
        let axis = check_axis(op, axis, self.axis_rank(rank))?;
        match self {
            JoinOp::Concat => {
                let mut out = Dims::new(first);
                for p in parts {
                    let same = p.len() == rank && (0..rank).all(|d| d == axis || p[d] == first[d]);
                    if !same {
                        return Err(ExecError::ShapeMismatch {
                            op,
                            lhs: Dims::new(first),
                            rhs: Dims::new(p),
                            reason: "the ranks or the sizes off the concatenation axis differ",
                        });
                    }
                    let d = &mut out.as_mut_slice()[axis];
                    *d = d.checked_add(p[axis]).ok_or(ExecError::Overflow {
                        op,
                        shape: Dims::new(first),
                    })?;
                }
                check_shape(op, &out)?;
                Ok(out)
            }
            JoinOp::Stack => {
                if rank == MAX_RANK {
                    return Err(ExecError::InvalidShape {
                        op,
                        shape: Dims::new(first),
                        reason: "stacking adds an axis and the result would have rank above 8",
                    });
                }
                let mut count = 1usize;
                for p in parts {
                    if p != first {
                        return Err(ExecError::ShapeMismatch {
                            op,
                            lhs: Dims::new(first),
                            rhs: Dims::new(p),
                            reason: "every stacked tensor must have the same shape",
                        });
                    }
                    count += 1;
                }
                let mut out = Dims::default();
                for (d, &s) in first.iter().enumerate() {
                    if d == axis {
                        out.push(count);
                    }
                    out.push(s);
                }
                if axis == rank {
                    out.push(count);
                }
                check_shape(op, &out)?;
                Ok(out)
            }
        }
    }
}

impl ExecContext {
    /// Runs the forward kernel of the joining op `op` on `parts` along `axis`
    /// (the same kernel, and the same bits, as the op's named method).
    ///
    /// ```
    /// use fucina_exec::{ExecContext, JoinOp};
    ///
    /// let ctx = ExecContext::new();
    /// let a = ctx.from_slice(&[2], &[1., 2.])?;
    /// let b = ctx.from_slice(&[2], &[3., 4.])?;
    /// let s = ctx.join(JoinOp::Stack, &[&a, &b], 1)?;
    /// assert_eq!(s.to_vec(), ctx.stack(&[&a, &b], 1)?.to_vec());
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// As [`concat`](ExecContext::concat) or [`stack`](ExecContext::stack).
    pub fn join<T: Element>(
        &self,
        op: JoinOp,
        parts: &[&RawTensor<T>],
        axis: impl Axis,
    ) -> Result<RawTensor<T>, ExecError> {
        match op {
            JoinOp::Concat => self.concat(parts, axis),
            JoinOp::Stack => self.stack(parts, axis),
        }
    }

    /// Runs the backward kernel of the joining op `op`: the gradient of the part
    /// that occupies `start..start + len` along `axis` of the output, from the
    /// output's gradient `grad`. For `concat` it is the window
    /// `grad.narrow(axis, start, len)`; for `stack` (`len` is 1, `start` the
    /// part's position) the window with the stacking axis removed. Both are
    /// zero-copy views of `grad`.
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`]; [`ExecError::IndexOutOfBounds`] if the window
    /// does not fit the axis; [`ExecError::InvalidArgument`] for a `stack` window
    /// longer than 1.
    pub fn join_backward(
        &self,
        op: JoinOp,
        grad: &RawTensor,
        axis: impl Axis,
        start: usize,
        len: usize,
    ) -> Result<RawTensor, ExecError> {
        match op {
            JoinOp::Concat => grad.narrow(axis, start, len),
            JoinOp::Stack if len != 1 => Err(ExecError::InvalidArgument {
                op: "stack_backward",
                reason: "a stacked part occupies one position along the stacking axis",
            }),
            JoinOp::Stack => {
                let axis = check_axis("stack_backward", axis, grad.rank())?;
                grad.narrow(axis, start, 1)?.squeeze(axis)
            }
        }
    }
}
