//! `softmax` and `log_softmax` along any axis, and their backward kernels.
//!
//! Along the last axis each row is processed in place of the output (max pass,
//! `exp` pass, normalization pass over a row that stays in cache). Along another
//! axis the operand is first gathered with that axis last, the rows are processed
//! the same way, and the result is scattered back: the bits are those of the
//! last-axis path on the transposed operand.

use crate::axis::Axis;
use crate::context::ExecContext;
use crate::error::ExecError;
use crate::kernels::simd::vectorized;
use crate::kernels::{prefetch, rowwise};
use crate::ops::common::axis_last_order;
use crate::tensor::RawTensor;
use crate::tensor::layout::{Dims, check_axis};

/// Relative cost per element of a row kernel with one `exp` (the parallel threshold
/// weight).
const EXP_WORK: usize = 8;

impl ExecContext {
    /// Runs `f(rows_of_each_input, out_row)` over the rows along `axis` of the
    /// same-shaped `inputs`, returning a tensor of their shape.
    pub(crate) fn rowwise_along<const N: usize>(
        &self,
        op: &'static str,
        inputs: [&RawTensor; N],
        axis: impl Axis,
        work: usize,
        f: impl Fn([&[f32]; N], &mut [f32]) + Sync,
    ) -> Result<RawTensor, ExecError> {
        let shape = inputs[0].dims();
        let axis = check_axis(op, axis, shape.len())?;
        for t in &inputs[1..] {
            if t.shape() != shape.as_slice() {
                return Err(ExecError::ShapeMismatch {
                    op,
                    lhs: shape,
                    rhs: t.dims(),
                    reason: "the operands must have the same shape",
                });
            }
        }
        let n = shape[axis];
        let last = axis + 1 == shape.len();
        let mut srcs: [Option<RawTensor>; N] = [const { None }; N];
        for (s, t) in srcs.iter_mut().zip(inputs) {
            *s = Some(self.contiguous_axis_last(t, axis)?);
        }
        let slices: [&[f32]; N] =
            std::array::from_fn(|i| srcs[i].as_ref().map_or(&[][..], |t| t.contiguous_slice()));
        let (order, inv) = axis_last_order(shape.len(), axis);
        let mut moved = Dims::default();
        for &o in order.iter() {
            moved.push(shape[o]);
        }
        let out_shape = if last { shape } else { moved };
        let out = self.new_tensor(op, &out_shape, |out| {
            self.par_rows(out, n, n * work, |rows, o| {
                let end = rows.end;
                for (r, orow) in rows.zip(o.chunks_exact_mut(n)) {
                    for s in &slices {
                        prefetch::next_row(s, r + 1, end, n);
                    }
                    let ins: [&[f32]; N] = std::array::from_fn(|i| &slices[i][r * n..][..n]);
                    f(ins, orow);
                }
            });
        })?;
        if last {
            Ok(out)
        } else {
            self.materialize(&out.permute(&inv)?)
        }
    }

    /// `softmax(x)` along `axis`: `exp(x - max) / sum(exp(x - max))` per row along
    /// the axis (the row max is subtracted first, so large inputs do not overflow).
    /// A row of all `-inf` gives NaN, as in PyTorch.
    ///
    /// ```
    /// use fucina_exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = ctx.from_slice(&[1, 3], &[1000., 1000., 1000.])?;
    /// let y = ctx.softmax(&x, 1)?;
    /// assert!(y.to_vec().iter().all(|&p| (p - 1.0 / 3.0).abs() < 1e-6));
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`] if `axis` is outside `-rank..rank` (negative axes
    /// count from the end, see [`Axis`]); [`ExecError::OutOfMemory`].
    pub fn softmax(&self, x: &RawTensor, axis: impl Axis) -> Result<RawTensor, ExecError> {
        self.rowwise_along("softmax", [x], axis, EXP_WORK, |[r], o| {
            vectorized!(rowwise::softmax(r, o))
        })
    }

    /// `log_softmax(x)` along `axis`: `x - max - log(sum(exp(x - max)))`.
    ///
    /// # Errors
    /// As [`softmax`](ExecContext::softmax).
    pub fn log_softmax(&self, x: &RawTensor, axis: impl Axis) -> Result<RawTensor, ExecError> {
        self.rowwise_along("log_softmax", [x], axis, EXP_WORK, |[r], o| {
            vectorized!(rowwise::log_softmax(r, o))
        })
    }

    /// The gradient of [`softmax`](ExecContext::softmax) along `axis`, given its
    /// output `y` and the output gradient `grad_y`:
    /// `grad_x = y * (grad_y - sum(grad_y * y))`, the sum taken along the axis.
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`]; [`ExecError::ShapeMismatch`] if `y` and `grad_y`
    /// differ in shape; [`ExecError::OutOfMemory`].
    pub fn softmax_backward(
        &self,
        y: &RawTensor,
        grad_y: &RawTensor,
        axis: impl Axis,
    ) -> Result<RawTensor, ExecError> {
        self.rowwise_along("softmax_backward", [y, grad_y], axis, 2, |[y, g], o| {
            vectorized!(rowwise::softmax_backward(y, g, o))
        })
    }

    /// The gradient of [`log_softmax`](ExecContext::log_softmax) along `axis`, given
    /// its output `y`: `grad_x = grad_y - exp(y) * sum(grad_y)`, the sum taken along
    /// the axis.
    ///
    /// # Errors
    /// As [`softmax_backward`](ExecContext::softmax_backward).
    pub fn log_softmax_backward(
        &self,
        y: &RawTensor,
        grad_y: &RawTensor,
        axis: impl Axis,
    ) -> Result<RawTensor, ExecError> {
        self.rowwise_along(
            "log_softmax_backward",
            [y, grad_y],
            axis,
            EXP_WORK,
            |[y, g], o| vectorized!(rowwise::log_softmax_backward(y, g, o)),
        )
    }
}

/// The descriptor of the softmax family (normalizations along one axis whose
/// backward reads the output): one variant per op, naming its forward kernel
/// ([`ExecContext::softmax_op`]) and its backward kernel
/// ([`ExecContext::softmax_op_backward`]). The named methods run the same
/// kernels; the autograd layer records one variant per node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SoftmaxOp {
    /// [`ExecContext::softmax`].
    Softmax,
    /// [`ExecContext::log_softmax`].
    LogSoftmax,
}

impl SoftmaxOp {
    /// Every op of the family, in declaration order.
    pub const ALL: &'static [SoftmaxOp] = &[SoftmaxOp::Softmax, SoftmaxOp::LogSoftmax];

    /// The op's name (the name of its `ExecContext` method).
    pub fn name(self) -> &'static str {
        match self {
            SoftmaxOp::Softmax => "softmax",
            SoftmaxOp::LogSoftmax => "log_softmax",
        }
    }

    /// The op's output shape for an input of shape `x`: `x` itself (the
    /// softmax family is shape-preserving: it normalizes along an axis, which
    /// the forward checks, and keeps every axis).
    pub fn out_shape(self, x: &[usize]) -> Dims {
        Dims::new(x)
    }
}

impl ExecContext {
    /// Runs the forward kernel of `op` along `axis` (the same kernel, and the
    /// same bits, as the op's named method).
    ///
    /// # Errors
    /// As [`softmax`](ExecContext::softmax).
    pub fn softmax_op(
        &self,
        op: SoftmaxOp,
        x: &RawTensor,
        axis: impl Axis,
    ) -> Result<RawTensor, ExecError> {
        match op {
            SoftmaxOp::Softmax => self.softmax(x, axis),
            SoftmaxOp::LogSoftmax => self.log_softmax(x, axis),
        }
    }

    /// Runs the backward kernel of `op` along `axis`, given the forward output
    /// `y` and the output gradient `grad_y`.
    ///
    /// # Errors
    /// As [`softmax_backward`](ExecContext::softmax_backward).
    pub fn softmax_op_backward(
        &self,
        op: SoftmaxOp,
        y: &RawTensor,
        grad_y: &RawTensor,
        axis: impl Axis,
    ) -> Result<RawTensor, ExecError> {
        match op {
            SoftmaxOp::Softmax => self.softmax_backward(y, grad_y, axis),
            SoftmaxOp::LogSoftmax => self.log_softmax_backward(y, grad_y, axis),
        }
    }
}
