//! Transposed convolutions: `conv_transpose1d` and `conv_transpose2d` with
//! their input, weight and bias gradients (the exec layer's convolution
//! kernels, in the transposed roles).

use fucina_exec::{ConvTranspose1dOptions, ConvTranspose2dOptions, ExecContext};

use super::conv::conv_vjp;
use crate::autocast::product_operands;
use crate::error::Result;
use crate::record::record;
use crate::tensor::Tensor;

/// The output padding of one spatial axis, from the sizes of the input, the
/// kernel and the output: `out = (size - 1) * stride - 2 * padding +
/// dilation * (kernel - 1) + output_padding + 1`, which the forward computed
/// without overflow.
fn output_padding(size: usize, kernel: usize, out: usize, s: usize, p: usize, d: usize) -> usize {
    out + 2 * p - ((size - 1) * s + (kernel - 1) * d + 1)
}

impl Tensor {
    /// The 2-D transposed convolution of `self` (`[N, C_in, H, W]`) with the
    /// weight `w` (`[C_in, C_out / groups, KH, KW]`) plus an optional `bias`
    /// (`[C_out]`): PyTorch's `conv_transpose2d`, with stride, padding, output
    /// padding, dilation and groups. The output is `[N, C_out, OH, OW]`, `OH =
    /// (H - 1) * stride[0] - 2 * padding[0] + dilation[0] * (KH - 1) +
    /// output_padding[0] + 1`. See
    /// [`ExecContext::conv_transpose2d`](fucina_exec::ExecContext::conv_transpose2d)
    /// for the definition and the determinism promise; the gradients of the
    /// input, the weight and the bias are recorded. Inside an
    /// [`autocast_bf16`](crate::autocast_bf16) scope the input and the weight
    /// are rounded to bf16 first, and the backward uses the rounded operands
    /// (the rounding passed straight through, as for `conv2d`).
    ///
    /// ```
    /// use fucina_autograd::{ConvTranspose2dOptions, Tensor};
    /// use fucina_autograd::exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::variable_from_slice(&ctx, &[1, 1, 2, 2], &[1., 2., 3., 4.])?;
    /// let w = Tensor::variable_from_slice(&ctx, &[1, 2, 2, 2], &[1., 1., 1., 1., 0., 0., 0., 1.])?;
    /// let b = Tensor::variable_from_slice(&ctx, &[2], &[0.5, -0.5])?;
    /// let opts = ConvTranspose2dOptions { stride: [2, 2], ..Default::default() };
    /// let y = x.conv_transpose2d(&ctx, &w, Some(&b), opts)?;
    /// assert_eq!(y.shape(), &[1, 2, 4, 4]);
    /// assert_eq!(y.to_vec()[..4], [1.5, 1.5, 2.5, 2.5]);
    /// y.sum_all(&ctx)?.backward(&ctx)?;
    /// assert_eq!(b.grad(&ctx)?.expect("a variable").to_vec(), [16.0, 16.0]);
    /// assert_eq!(x.grad(&ctx)?.expect("a variable").to_vec(), [5.0; 4]);
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// The bad-input errors of the exec layer's `conv_transpose2d` (ranks,
    /// channel and group counts, a bias that is not `[C_out]`, an output
    /// padding not below the stride, a padding that leaves no output, a
    /// stride, dilation or group count of 0, sizes that overflow); out of
    /// memory.
    pub fn conv_transpose2d(
        &self,
        ctx: &ExecContext,
        w: &Tensor,
        bias: Option<&Tensor>,
        opts: ConvTranspose2dOptions,
    ) -> Result<Tensor> {
        let (x, wr) = product_operands(ctx, &self.raw, &w.raw)?;
        let out = ctx.conv_transpose2d(&x, &wr, bias.map(|b| &b.raw), opts)?;
        let inputs: &[&Tensor] = match bias {
            Some(b) => &[self, w, b],
            None => &[self, w],
        };
        record!(
            ctx,
            "conv_transpose2d",
            out,
            inputs,
            ConvTranspose2d {
                x,
                w: wr,
                stride: opts.stride,
                padding: opts.padding,
                dilation: opts.dilation,
            },
            |ctx, g, needs| {
                let (xs, ws, gs) = (x.shape(), w.shape(), g.shape());
                let op = |a: usize| {
                    let i = 2 + a;
                    output_padding(xs[i], ws[i], gs[i], stride[a], padding[a], dilation[a])
                };
                let opts = ConvTranspose2dOptions {
                    stride: *stride,
                    padding: *padding,
                    output_padding: [op(0), op(1)],
                    dilation: *dilation,
                    groups: gs[1] / ws[1],
                };
                conv_vjp(
                    ctx,
                    g,
                    needs,
                    |ctx, g| Ok(ctx.conv_transpose2d_input_grad(x.shape(), w, g, opts)?),
                    |ctx, g| Ok(ctx.conv_transpose2d_weight_grad(x, w.shape(), g, opts)?),
                )
            }
        )
    }

    /// The 1-D transposed convolution of `self` (`[N, C_in, L]`) with the
    /// weight `w` (`[C_in, C_out / groups, K]`) plus an optional `bias`
    /// (`[C_out]`): PyTorch's `conv_transpose1d` (the 2-D one with height 1),
    /// recording the gradients of the input, the weight and the bias; inside
    /// an [`autocast_bf16`](crate::autocast_bf16) scope on bf16-rounded
    /// operands, as the 2-D one.
    ///
    /// ```
    /// use fucina_autograd::{ConvTranspose1dOptions, Tensor};
    /// use fucina_autograd::exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::variable_from_slice(&ctx, &[1, 1, 2], &[1., 2.])?;
    /// let w = Tensor::variable_from_slice(&ctx, &[1, 1, 3], &[1., 10., 100.])?;
    /// let y = x.conv_transpose1d(&ctx, &w, None, ConvTranspose1dOptions::default())?;
    /// assert_eq!(y.to_vec(), [1., 12., 120., 200.]);
    /// y.sum_all(&ctx)?.backward(&ctx)?;
    /// assert_eq!(x.grad(&ctx)?.expect("a variable").to_vec(), [111., 111.]);
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// As [`conv_transpose2d`](Tensor::conv_transpose2d), for 3-D shapes.
    pub fn conv_transpose1d(
        &self,
        ctx: &ExecContext,
        w: &Tensor,
        bias: Option<&Tensor>,
        opts: ConvTranspose1dOptions,
    ) -> Result<Tensor> {
        let (x, wr) = product_operands(ctx, &self.raw, &w.raw)?;
        let out = ctx.conv_transpose1d(&x, &wr, bias.map(|b| &b.raw), opts)?;
        let inputs: &[&Tensor] = match bias {
            Some(b) => &[self, w, b],
            None => &[self, w],
        };
        record!(
            ctx,
            "conv_transpose1d",
            out,
            inputs,
            ConvTranspose1d {
                x,
                w: wr,
                stride: opts.stride,
                padding: opts.padding,
                dilation: opts.dilation,
            },
            |ctx, g, needs| {
                let (xs, ws, gs) = (x.shape(), w.shape(), g.shape());
                let opts = ConvTranspose1dOptions {
                    stride: *stride,
                    padding: *padding,
                    output_padding: output_padding(
                        xs[2], ws[2], gs[2], *stride, *padding, *dilation,
                    ),
                    dilation: *dilation,
                    groups: gs[1] / ws[1],
                };
                conv_vjp(
                    ctx,
                    g,
                    needs,
                    |ctx, g| Ok(ctx.conv_transpose1d_input_grad(x.shape(), w, g, opts)?),
                    |ctx, g| Ok(ctx.conv_transpose1d_weight_grad(x, w.shape(), g, opts)?),
                )
            }
        )
    }
}
