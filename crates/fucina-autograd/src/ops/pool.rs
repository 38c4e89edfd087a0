//! 2-D pooling (`max_pool2d`, `avg_pool2d`, `adaptive_avg_pool2d`), 1-D
//! pooling (`max_pool1d`, `avg_pool1d`: the 2-D ops over a height of 1) and
//! `flatten`.

use fucina_exec::{Axis, ExecContext, Pool1dOptions, Pool2dOp, Pool2dOptions};

use crate::error::Result;
use crate::record::{grads, record};
use crate::tensor::Tensor;

impl Tensor {
    /// Applies the 2-D pooling op `op` to `self` (`[N, C, H, W]`); the descriptor
    /// names the forward kernel, run now, and the backward kernel, run by
    /// backward. The node keeps the input only for `Max`, whose backward
    /// recomputes the selected indices; the others keep its shape.
    ///
    /// ```
    /// use fucina_autograd::{Pool2dOp, Pool2dOptions, Tensor};
    /// use fucina_autograd::exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::variable_from_slice(&ctx, &[1, 1, 2, 2], &[1., 4., 3., 2.])?;
    /// let y = x.pool2d(&ctx, Pool2dOp::Max(Pool2dOptions::new([2, 2])))?;
    /// assert_eq!(y.to_vec(), [4.]);
    /// y.sum_all(&ctx)?.backward(&ctx)?;
    /// assert_eq!(x.grad(&ctx)?.unwrap().to_vec(), [0., 1., 0., 0.]);
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// As [`ExecContext::pool2d`]: a wrong rank, a kernel or stride of 0, a
    /// padding above half the kernel, a kernel larger than the padded input.
    pub fn pool2d(&self, ctx: &ExecContext, op: Pool2dOp) -> Result<Tensor> {
        let out = ctx.pool2d(op, &self.raw)?;
        let shape = self.raw.dims();
        let x = op.keeps_input().then(|| self.raw.clone());
        record!(
            ctx,
            op.name(),
            out,
            &[self],
            Pool2d { op, shape, x },
            |ctx, g, _| Ok(grads![Some(ctx.pool2d_backward(
                *op,
                shape.as_slice(),
                x.as_ref(),
                g
            )?)])
        )
    }

    /// 2-D max pooling (`[N, C, H, W]` -> `[N, C, OH, OW]`,
    /// `OH = (H + 2 * padding - kernel) / stride + 1`). Ties go to the first
    /// element in row-major window order, and the backward routes the gradient
    /// to that element; padding counts as `-inf`; a NaN in a window propagates.
    ///
    /// ```
    /// use fucina_autograd::{Pool2dOptions, Tensor};
    /// use fucina_autograd::exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::from_slice(&ctx, &[1, 1, 2, 4], &[1., 5., 2., 0., 3., 4., 8., 1.])?;
    /// let p = x.max_pool2d(&ctx, Pool2dOptions { kernel: [2, 2], stride: [2, 2], padding: [0, 0] })?;
    /// assert_eq!((p.shape(), p.to_vec()), (&[1, 1, 1, 2][..], vec![5., 8.]));
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// As [`pool2d`](Tensor::pool2d).
    pub fn max_pool2d(&self, ctx: &ExecContext, opts: Pool2dOptions) -> Result<Tensor> {
        self.pool2d(ctx, Pool2dOp::Max(opts))
    }

    /// `relu` then [`max_pool2d`](Tensor::max_pool2d), fused into one op (one
    /// pass over the input, no ReLU output kept): the same values and the same
    /// gradient bits as the two ops, with a third of their memory traffic. The
    /// node keeps the input (the ReLU's input).
    ///
    /// ```
    /// use fucina_autograd::{Pool2dOptions, Tensor};
    /// use fucina_autograd::exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::variable_from_slice(&ctx, &[1, 1, 2, 4], &[-1., -5., 2., 0., -3., -4., 8., 1.])?;
    /// let p = x.relu_max_pool2d(&ctx, Pool2dOptions::new([2, 2]))?;
    /// assert_eq!(p.to_vec(), [0., 8.]);
    /// p.sum_all(&ctx)?.backward(&ctx)?;
    /// assert_eq!(x.grad(&ctx)?.unwrap().to_vec(), [0., 0., 0., 0., 0., 0., 1., 0.]);
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// As [`pool2d`](Tensor::pool2d).
    pub fn relu_max_pool2d(&self, ctx: &ExecContext, opts: Pool2dOptions) -> Result<Tensor> {
        self.pool2d(ctx, Pool2dOp::ReluMax(opts))
    }

    /// 2-D average pooling with `count_include_pad = true` (PyTorch's default:
    /// every window sum is divided by `kernel[0] * kernel[1]`, padding counted as
    /// zeros).
    ///
    /// ```
    /// use fucina_autograd::{Pool2dOptions, Tensor};
    /// use fucina_autograd::exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::from_slice(&ctx, &[1, 1, 2, 2], &[1., 2., 3., 6.])?;
    /// let o = Pool2dOptions { kernel: [2, 2], stride: [1, 1], padding: [1, 1] };
    /// let a = x.avg_pool2d(&ctx, o)?;
    /// assert_eq!(a.shape(), [1, 1, 3, 3]);
    /// assert_eq!(a.to_vec()[0], 0.25); // 1 / 4: the padding counts in the divisor
    /// assert_eq!(a.to_vec()[4], 3.); // (1 + 2 + 3 + 6) / 4
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// As [`pool2d`](Tensor::pool2d).
    pub fn avg_pool2d(&self, ctx: &ExecContext, opts: Pool2dOptions) -> Result<Tensor> {
        self.pool2d(ctx, Pool2dOp::Avg(opts))
    }

    /// 2-D adaptive average pooling to `[N, C, size[0], size[1]]`: output cell
    /// `i` of an axis of input size `n` and output size `m` averages the inputs
    /// `floor(i * n / m) .. ceil((i + 1) * n / m)` (PyTorch's windows).
    ///
    /// ```
    /// use fucina_autograd::Tensor;
    /// use fucina_autograd::exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::from_slice(&ctx, &[1, 2, 1, 2], &[1., 3., 5., 9.])?;
    /// assert_eq!(x.adaptive_avg_pool2d(&ctx, [1, 1])?.to_vec(), [2., 7.]);
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// As [`pool2d`](Tensor::pool2d); an output size of 0.
    pub fn adaptive_avg_pool2d(&self, ctx: &ExecContext, size: [usize; 2]) -> Result<Tensor> {
        self.pool2d(ctx, Pool2dOp::AdaptiveAvg(size))
    }

    /// 1-D max pooling (`[N, C, L]` -> `[N, C, OL]`, `OL = (L + 2 * padding -
    /// kernel) / stride + 1`; PyTorch's `max_pool1d`): the 2-D op over
    /// `[N, C, 1, L]` with a `1 × kernel` window, so ties, padding and NaNs
    /// behave as in [`max_pool2d`](Tensor::max_pool2d). Three nodes: the
    /// unsqueeze, the pool and the squeeze.
    ///
    /// ```
    /// use fucina_autograd::{Pool1dOptions, Tensor};
    /// use fucina_autograd::exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::variable_from_slice(&ctx, &[1, 1, 5], &[1., 5., 2., 0., 3.])?;
    /// let y = x.max_pool1d(&ctx, Pool1dOptions { kernel: 2, stride: 1, padding: 0 })?;
    /// assert_eq!(y.to_vec(), [5., 5., 2., 3.]);
    /// y.sum_all(&ctx)?.backward(&ctx)?;
    /// assert_eq!(x.grad(&ctx)?.unwrap().to_vec(), [0., 2., 1., 0., 1.]);
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// As [`Pool1dOptions::out_shape`], naming `max_pool1d`: a rank other
    /// than 3, a kernel or stride of 0, a padding above half the kernel, a
    /// kernel larger than the padded input.
    pub fn max_pool1d(&self, ctx: &ExecContext, opts: Pool1dOptions) -> Result<Tensor> {
        self.pool1d(ctx, "max_pool1d", Pool2dOp::Max(opts.to_2d()), opts)
    }

    /// 1-D average pooling with `count_include_pad = true` (every window sum
    /// divided by `kernel`; PyTorch's `avg_pool1d`): the 2-D op over `[N, C,
    /// 1, L]` with a `1 × kernel` window.
    ///
    /// ```
    /// use fucina_autograd::{Pool1dOptions, Tensor};
    /// use fucina_autograd::exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::from_slice(&ctx, &[1, 1, 4], &[1., 3., 5., 7.])?;
    /// assert_eq!(x.avg_pool1d(&ctx, Pool1dOptions::new(2))?.to_vec(), [2., 6.]);
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// As [`max_pool1d`](Tensor::max_pool1d), naming `avg_pool1d`.
    pub fn avg_pool1d(&self, ctx: &ExecContext, opts: Pool1dOptions) -> Result<Tensor> {
        self.pool1d(ctx, "avg_pool1d", Pool2dOp::Avg(opts.to_2d()), opts)
    }

    fn pool1d(
        &self,
        ctx: &ExecContext,
        name: &'static str,
        op: Pool2dOp,
        opts: Pool1dOptions,
    ) -> Result<Tensor> {
        opts.out_shape(name, self.shape())?;
        self.unsqueeze(ctx, 2)?.pool2d(ctx, op)?.squeeze(ctx, 2)
    }

    /// The axes from `start_axis` on merged into one (`[N, C, H, W]` ->
    /// `[N, C * H * W]` for `start_axis = 1`); a view of contiguous data (a copy
    /// otherwise), as [`reshape`](Tensor::reshape).
    ///
    /// ```
    /// use fucina_autograd::Tensor;
    /// use fucina_autograd::exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::zeros(&ctx, &[2, 3, 4, 5])?;
    /// assert_eq!(x.flatten(&ctx, 1)?.shape(), [2, 60]);
    /// assert_eq!(x.flatten(&ctx, -2)?.shape(), [2, 3, 20]);
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`](fucina_exec::ExecError::InvalidAxis) if
    /// `start_axis` is outside `-rank..rank`.
    pub fn flatten(&self, ctx: &ExecContext, start_axis: impl Axis) -> Result<Tensor> {
        let s = self.raw.shape();
        let start = start_axis.resolve("flatten", s.len())?;
        let mut shape = [0usize; fucina_exec::MAX_RANK];
        shape[..start].copy_from_slice(&s[..start]);
        shape[start] = s[start..].iter().product();
        self.reshape(ctx, &shape[..=start])
    }
}
