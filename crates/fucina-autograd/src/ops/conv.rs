//! Convolutions: `conv1d` and `conv2d` with their input, weight and bias
//! gradients (the exec layer's GEMM-based backward kernels).

use fucina_exec::{Conv1dOptions, Conv2dOptions, ExecContext, RawTensor};

use crate::autocast::product_operands;
use crate::error::Result;
use crate::record::{GradList, grads, record};
use crate::tensor::Tensor;

impl Tensor {
    /// The 2-D convolution of `self` (`[N, C_in, H, W]`) with the weight `w`
    /// (`[C_out, C_in / groups, KH, KW]`) plus an optional `bias` (`[C_out]`):
    /// PyTorch's `conv2d`, with stride, zero padding, dilation and groups
    /// (depthwise included). See
    /// [`ExecContext::conv2d`](fucina_exec::ExecContext::conv2d) for the
    /// definition, the algorithm and the determinism promise; the gradients of
    /// the input, the weight and the bias are recorded. Inside an
    /// [`autocast_bf16`](crate::autocast_bf16) scope the input and the weight
    /// are rounded to bf16 first, and the backward uses the rounded operands.
    ///
    /// ```
    /// use fucina_autograd::{Conv2dOptions, Tensor};
    /// use fucina_autograd::exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::variable_from_slice(&ctx, &[1, 1, 3, 3], &[1., 2., 3., 4., 5., 6., 7., 8., 9.])?;
    /// let w = Tensor::variable_from_slice(&ctx, &[2, 1, 2, 2], &[1., 0., 0., 1., 0., 1., 1., 0.])?;
    /// let b = Tensor::variable_from_slice(&ctx, &[2], &[0.5, -0.5])?;
    /// let opts = Conv2dOptions { stride: [1, 1], padding: [0, 0], dilation: [1, 1], groups: 1 };
    /// let y = x.conv2d(&ctx, &w, Some(&b), opts)?;
    /// assert_eq!(y.shape(), &[1, 2, 2, 2]);
    /// assert_eq!(y.to_vec()[..4], [6.5, 8.5, 12.5, 14.5]);
    /// y.sum_all(&ctx)?.backward(&ctx)?;
    /// assert_eq!(b.grad(&ctx)?.expect("a variable").to_vec(), [4.0, 4.0]);
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// The bad-input errors of the exec layer's `conv2d` (ranks, channel and
    /// group counts, a bias that is not `[C_out]`, a kernel larger than the
    /// padded input, a stride, dilation or group count of 0); out of memory.
    pub fn conv2d(
        &self,
        ctx: &ExecContext,
        w: &Tensor,
        bias: Option<&Tensor>,
        opts: Conv2dOptions,
    ) -> Result<Tensor> {
        let (x, wr) = product_operands(ctx, &self.raw, &w.raw)?;
        let out = ctx.conv2d(&x, &wr, bias.map(|b| &b.raw), opts)?;
        let inputs: &[&Tensor] = match bias {
            Some(b) => &[self, w, b],
            None => &[self, w],
        };
        record!(
            ctx,
            "conv2d",
            out,
            inputs,
            Conv2d {
                x,
                w: wr,
                stride: opts.stride,
                padding: opts.padding,
                dilation: opts.dilation,
            },
            |ctx, g, needs| {
                let opts = Conv2dOptions {
                    stride: *stride,
                    padding: *padding,
                    dilation: *dilation,
                    groups: x.shape()[1] / w.shape()[1],
                };
                conv_vjp(
                    ctx,
                    g,
                    needs,
                    |ctx, g| Ok(ctx.conv2d_input_grad(x.shape(), w, g, opts)?),
                    |ctx, g| Ok(ctx.conv2d_weight_grad(x, w.shape(), g, opts)?),
                )
            }
        )
    }

    /// The 1-D convolution of `self` (`[N, C_in, L]`) with the weight `w`
    /// (`[C_out, C_in / groups, K]`) plus an optional `bias` (`[C_out]`):
    /// PyTorch's `conv1d` (the 2-D convolution with height 1), recording the
    /// gradients of the input, the weight and the bias (bf16-rounded operands
    /// inside an [`autocast_bf16`](crate::autocast_bf16) scope, as `conv2d`).
    ///
    /// ```
    /// use fucina_autograd::{Conv1dOptions, Tensor};
    /// use fucina_autograd::exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::variable_from_slice(&ctx, &[1, 1, 5], &[1., 2., 3., 4., 5.])?;
    /// let w = Tensor::variable_from_slice(&ctx, &[1, 1, 2], &[1., -1.])?;
    /// let y = x.conv1d(&ctx, &w, None, Conv1dOptions { stride: 2, ..Default::default() })?;
    /// assert_eq!(y.to_vec(), [-1.0, -1.0]);
    /// y.sum_all(&ctx)?.backward(&ctx)?;
    /// assert_eq!(x.grad(&ctx)?.expect("a variable").to_vec(), [1., -1., 1., -1., 0.]);
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// As [`conv2d`](Tensor::conv2d), for 3-D shapes.
    pub fn conv1d(
        &self,
        ctx: &ExecContext,
        w: &Tensor,
        bias: Option<&Tensor>,
        opts: Conv1dOptions,
    ) -> Result<Tensor> {
        let (x, wr) = product_operands(ctx, &self.raw, &w.raw)?;
        let out = ctx.conv1d(&x, &wr, bias.map(|b| &b.raw), opts)?;
        let inputs: &[&Tensor] = match bias {
            Some(b) => &[self, w, b],
            None => &[self, w],
        };
        record!(
            ctx,
            "conv1d",
            out,
            inputs,
            Conv1d {
                x,
                w: wr,
                stride: opts.stride,
                padding: opts.padding,
                dilation: opts.dilation,
            },
            |ctx, g, needs| {
                let opts = Conv1dOptions {
                    stride: *stride,
                    padding: *padding,
                    dilation: *dilation,
                    groups: x.shape()[1] / w.shape()[1],
                };
                conv_vjp(
                    ctx,
                    g,
                    needs,
                    |ctx, g| Ok(ctx.conv1d_input_grad(x.shape(), w, g, opts)?),
                    |ctx, g| Ok(ctx.conv1d_weight_grad(x, w.shape(), g, opts)?),
                )
            }
        )
    }
}

/// The gradients of a convolution (inputs `x`, `w` and, when `needs` has three
/// entries, a bias), each computed only when needed (also the transposed
/// convolutions' in `ops::conv_transpose`).
pub(super) fn conv_vjp(
    ctx: &ExecContext,
    g: &RawTensor,
    needs: &[bool],
    input_grad: impl FnOnce(&ExecContext, &RawTensor) -> Result<RawTensor>,
    weight_grad: impl FnOnce(&ExecContext, &RawTensor) -> Result<RawTensor>,
) -> Result<GradList> {
    let gx = if needs[0] {
        Some(input_grad(ctx, g)?)
    } else {
        None
    };
    let gw = if needs[1] {
        Some(weight_grad(ctx, g)?)
    } else {
        None
    };
    Ok(if needs.len() == 3 {
        let gb = if needs[2] {
            Some(ctx.conv_bias_grad(g)?)
        } else {
            None
        };
        grads![gx, gw, gb]
    } else {
        grads![gx, gw]
    })
}
