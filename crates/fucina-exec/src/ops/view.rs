//! The view family's descriptor: the layout ops of [`RawTensor`] (`reshape`,
//! `permute`, `transpose`, `narrow`, `squeeze`, `unsqueeze`, `broadcast_to`,
//! all zero-copy aliases, see `tensor/view.rs`) and the materializing copy, with
//! the backward kernel of each.

use crate::context::ExecContext;
use crate::error::ExecError;
use crate::tensor::RawTensor;
use crate::tensor::layout::{Dims, Layout};

/// The descriptor of the view family: one variant per op, holding the op's
/// parameters (axes already resolved to `0..rank`) and naming its forward
/// kernel (run by [`ExecContext::view_op`]) and its backward kernel (run by
/// [`ExecContext::view_op_backward`], which needs the input's shape). The
/// autograd layer records one variant per node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ViewOp {
    /// The same elements under this shape ([`RawTensor::reshape`]; a
    /// non-contiguous input is made contiguous first).
    Reshape(Dims),
    /// Axes reordered: axis `i` of the result is axis `order[i]` of the input
    /// ([`RawTensor::permute`]).
    Permute(Dims),
    /// Two axes swapped ([`RawTensor::transpose`]).
    Transpose(usize, usize),
    /// Elements `start..start + len` along `axis` ([`RawTensor::narrow`]).
    Narrow {
        /// The axis.
        axis: usize,
        /// The window's first position.
        start: usize,
        /// The window's length.
        len: usize,
    },
    /// The size-1 axis removed ([`RawTensor::squeeze`]).
    Squeeze(usize),
    /// A size-1 axis inserted at this position of the result
    /// ([`RawTensor::unsqueeze`]).
    Unsqueeze(usize),
    /// A zero-copy broadcast to this shape ([`RawTensor::broadcast_to`]).
    BroadcastTo(Dims),
    /// A contiguous copy ([`ExecContext::materialize`]).
    Materialize,
}

impl ViewOp {
    /// The op's name (the name of its method).
    pub fn name(self) -> &'static str {
        match self {
            ViewOp::Reshape(_) => "reshape",
            ViewOp::Permute(_) => "permute",
            ViewOp::Transpose(..) => "transpose",
            ViewOp::Narrow { .. } => "narrow",
            ViewOp::Squeeze(_) => "squeeze",
            ViewOp::Unsqueeze(_) => "unsqueeze",
            ViewOp::BroadcastTo(_) => "broadcast_to",
            ViewOp::Materialize => "materialize",
        }
    }

    /// The shape of the op's result for an input of shape `x`: the view's layout
    /// rule (the one the op's method applies, with the same checks) applied to
    /// the contiguous layout of `x`.
    ///
    /// ```
    /// use fucina_exec::ViewOp;
    ///
    /// assert_eq!(ViewOp::Transpose(0, 2).out_shape(&[2, 3, 4])?.as_slice(), [4, 3, 2]);
    /// let window = ViewOp::Narrow { axis: 1, start: 1, len: 2 };
    /// assert_eq!(window.out_shape(&[2, 3, 4])?.as_slice(), [2, 2, 4]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// The op's own errors, as [`ExecContext::view_op`] gives them (and
    /// [`ExecError::InvalidShape`] for a shape no tensor can have).
    pub fn out_shape(self, x: &[usize]) -> Result<Dims, ExecError> {
        let l = Layout::contiguous(self.name(), x)?;
        let out = match self {
            ViewOp::Reshape(shape) => l.reshape(all_of("reshape", &shape, "rank above 8")?)?,
            ViewOp::Permute(order) => {
                let reason = "the order is not a permutation of the tensor's axes";
                l.permute(all_of("permute", &order, reason)?)?
            }
            ViewOp::Transpose(a, b) => l.transpose(a, b)?,
            ViewOp::Narrow { axis, start, len } => l.narrow(axis, start, len)?,
            ViewOp::Squeeze(axis) => l.squeeze(axis)?,
            ViewOp::Unsqueeze(axis) => l.unsqueeze(axis)?,
            ViewOp::BroadcastTo(shape) => {
                l.broadcast_to(all_of("broadcast_to", &shape, "rank above 8")?)?
            }
            ViewOp::Materialize => l,
        };
        Ok(out.dims())
    }
}

/// The values of `d`, or the error `op` gives for a list longer than
/// [`MAX_RANK`](crate::MAX_RANK) (`d` kept only its first values).
fn all_of<'a>(
    op: &'static str,
    d: &'a Dims,
    reason: &'static str,
) -> Result<&'a [usize], ExecError> {
    if d.given_len() > d.len() {
        return Err(ExecError::InvalidShape {
            op,
            shape: *d,
            reason,
        });
    }
    Ok(d.as_slice())
}

impl ExecContext {
    /// Runs the forward kernel of the view op `op` on `x` (the same kernel, and
    /// the same result, as the op's method: a zero-copy view, except for
    /// [`ViewOp::Materialize`] and for [`ViewOp::Reshape`] of a non-contiguous
    /// input, which copy).
    ///
    /// ```
    /// use fucina_exec::{ExecContext, ViewOp};
    ///
    /// let ctx = ExecContext::new();
    /// let x = ctx.from_slice(&[2, 3], &[1., 2., 3., 4., 5., 6.])?;
    /// let t = ctx.view_op(ViewOp::Transpose(0, 1), &x)?;
    /// assert_eq!(t.to_vec(), x.transpose(0, 1)?.to_vec());
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// As the op's method (for example [`ExecError::InvalidShape`] for a reshape
    /// to another element count or a rank above 8, [`ExecError::InvalidAxis`]).
    pub fn view_op(&self, op: ViewOp, x: &RawTensor) -> Result<RawTensor, ExecError> {
        match op {
            ViewOp::Reshape(shape) => {
                let shape = all_of("reshape", &shape, "rank above 8")?;
                self.contiguous(x)?.reshape(shape)
            }
            ViewOp::Permute(order) => {
                let reason = "the order is not a permutation of the tensor's axes";
                x.permute(all_of("permute", &order, reason)?)
            }
            ViewOp::Transpose(a, b) => x.transpose(a, b),
            ViewOp::Narrow { axis, start, len } => x.narrow(axis, start, len),
            ViewOp::Squeeze(axis) => x.squeeze(axis),
            ViewOp::Unsqueeze(axis) => x.unsqueeze(axis),
            ViewOp::BroadcastTo(shape) => {
                x.broadcast_to(all_of("broadcast_to", &shape, "rank above 8")?)
            }
            ViewOp::Materialize => self.materialize(x),
        }
    }

    /// Runs the backward kernel of the view op `op`: the gradient of its input,
    /// of shape `input_shape`, from the output's gradient `grad`. Reshape,
    /// permute, transpose, squeeze and unsqueeze give `grad` back under the
    /// input's layout (a view; a reshape of a non-contiguous gradient copies);
    /// narrow writes `grad` into a zeroed tensor of the input's shape; broadcast
    /// sums `grad` back over the broadcast axes (the
    /// [`sum_to`](ExecContext::sum_to) order, no copy when nothing was
    /// broadcast); materialize passes `grad` through.
    ///
    /// # Errors
    /// [`ExecError::ShapeMismatch`] if `grad` does not have the shape `op` gives
    /// an input of shape `input_shape`; the errors of the inverse view;
    /// [`ExecError::OutOfMemory`].
    pub fn view_op_backward(
        &self,
        op: ViewOp,
        input_shape: &[usize],
        grad: &RawTensor,
    ) -> Result<RawTensor, ExecError> {
        const OP: &str = "view_backward";
        let mismatch = || ExecError::ShapeMismatch {
            op: OP,
            lhs: grad.dims(),
            rhs: Dims::new(input_shape),
            reason: "the gradient does not have the shape the view gives this input",
        };
        let g = match op {
            ViewOp::Reshape(_) => self.contiguous(grad)?.reshape(input_shape)?,
            ViewOp::Permute(order) => {
                let order = all_of(OP, &order, "the order is not a permutation")?;
                let mut inverse = Dims::new(order);
                for (i, &o) in order.iter().enumerate() {
                    *inverse.as_mut_slice().get_mut(o).ok_or_else(mismatch)? = i;
                }
                grad.permute(inverse.as_slice())?
            }
            ViewOp::Transpose(a, b) => grad.transpose(a, b)?,
            ViewOp::Narrow { axis, start, len } => {
                let mut window = Dims::new(input_shape);
                match window.as_mut_slice().get_mut(axis) {
                    Some(d) => *d = len,
                    None => return Err(mismatch()),
                }
                if grad.shape() != window.as_slice() {
                    return Err(mismatch());
                }
                let mut out = self.zeros(input_shape)?;
                let layout = *out.narrow(axis, start, len)?.layout();
                let gv = self.contiguous(grad)?;
                let gv = gv.data()?;
                let o = out.data_mut()?;
                let mut k = 0;
                layout.for_each_index(|i| {
                    o[i] = gv[k];
                    k += 1;
                });
                out
            }
            ViewOp::Squeeze(axis) => grad.unsqueeze(axis)?,
            ViewOp::Unsqueeze(axis) => grad.squeeze(axis)?,
            ViewOp::BroadcastTo(_) if grad.shape() == input_shape => grad.clone(),
            ViewOp::BroadcastTo(_) => self.sum_to(grad, input_shape)?,
            ViewOp::Materialize => grad.clone(),
        };
        if g.shape() != input_shape {
            return Err(mismatch());
        }
        Ok(g)
    }
}
