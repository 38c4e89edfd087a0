//! Padding and resizing of the trailing axes: `pad` (constant, reflect,
//! replicate) and `interpolate` (nearest, bilinear), with their input
//! gradients.

use fucina_exec::{ExecContext, InterpolateOptions, PadOptions};

use crate::error::Result;
use crate::record::{grads, record};
use crate::tensor::Tensor;

impl Tensor {
    /// `self` padded (or cropped, by negative widths) on its last one, two
    /// or three axes as `opts` says
    /// (PyTorch's `torch.nn.functional.pad(x, pads, mode, value)`; see
    /// [`ExecContext::pad`]). The gradient adds each output gradient into the
    /// input element it was read from; the node keeps only the input's shape.
    ///
    /// ```
    /// use fucina_autograd::{PadMode, PadOptions, Tensor};
    /// use fucina_autograd::exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::variable_from_slice(&ctx, &[1, 1, 3], &[1., 2., 3.])?;
    /// let y = x.pad(&ctx, PadOptions::new(&[2, 0], PadMode::Reflect)?)?;
    /// assert_eq!(y.to_vec(), [3., 2., 1., 2., 3.]);
    /// y.sum_all(&ctx)?.backward(&ctx)?;
    /// assert_eq!(x.grad(&ctx)?.unwrap().to_vec(), [1., 2., 2.]);
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// As [`ExecContext::pad`]: `axes` not 1, 2 or 3, fewer axes than
    /// `axes`, a reflect pad not smaller than its axis, a crop larger than its
    /// axis or leaving it empty (each naming the pad and its value); out of
    /// memory.
    pub fn pad(&self, ctx: &ExecContext, opts: PadOptions) -> Result<Tensor> {
        let out = ctx.pad(&self.raw, opts)?;
        let shape = self.raw.dims();
        record!(
            ctx,
            "pad",
            out,
            &[self],
            Pad { shape, opts },
            |ctx, g, _| {
                Ok(grads![Some(ctx.pad_backward(
                    g,
                    shape.as_slice(),
                    *opts
                )?)])
            }
        )
    }

    /// `self` (`[N, C, H, W]`) resized as `opts` says (PyTorch's
    /// `torch.nn.functional.interpolate` with `mode="nearest"` or
    /// `"bilinear"`; see [`ExecContext::interpolate`]). The gradient adds each
    /// output gradient, times its weights, into the input elements it was read
    /// from; the node keeps only the input's shape.
    ///
    /// ```
    /// use fucina_autograd::{InterpolateMode, InterpolateOptions, Tensor};
    /// use fucina_autograd::exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::variable_from_slice(&ctx, &[1, 1, 2, 2], &[1., 2., 3., 4.])?;
    /// let y = x.interpolate(&ctx, InterpolateOptions::scale([2.0, 2.0], InterpolateMode::Nearest))?;
    /// assert_eq!(y.shape(), [1, 1, 4, 4]);
    /// y.sum_all(&ctx)?.backward(&ctx)?;
    /// assert_eq!(x.grad(&ctx)?.unwrap().to_vec(), [4., 4., 4., 4.]);
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// As [`ExecContext::interpolate`]: a rank other than 4, both or neither
    /// of size and scale factor, a bad scale factor, an output size of 0; out
    /// of memory.
    pub fn interpolate(&self, ctx: &ExecContext, opts: InterpolateOptions) -> Result<Tensor> {
        let out = ctx.interpolate(&self.raw, opts)?;
        let shape = self.raw.dims();
        record!(
            ctx,
            opts.name(),
            out,
            &[self],
            Interpolate { shape, opts },
            |ctx, g, _| Ok(grads![Some(ctx.interpolate_backward(
                g,
                shape.as_slice(),
                *opts
            )?)])
        )
    }
}
