//! The transposed convolutions: [`ConvTranspose1d`] and [`ConvTranspose2d`]
//! (PyTorch's `nn.ConvTranspose1d` / `nn.ConvTranspose2d`, the upsampling
//! layers of U-Nets and decoders).

use fucina_autograd::Tensor;
use fucina_exec::{ConvTranspose1dOptions, ConvTranspose2dOptions, ExecContext};

use super::conv::{check_channels, check_conv, init_bound};
use super::{Forward, Module, Parameter, sub_seed, weight_and_bias};
use crate::error::{Error, Result};

/// Refuses an output padding that is not smaller than its stride.
fn check_output_padding(
    what: &'static str,
    output_padding: &[usize],
    stride: &[usize],
) -> Result<()> {
    if output_padding.iter().zip(stride).any(|(p, s)| p >= s) {
        return Err(Error::invalid(
            what,
            format!(
                "every output_padding ({output_padding:?}) must be smaller than its stride ({stride:?})"
            ),
        ));
    }
    Ok(())
}

/// A 2-D transposed convolution over `[N, C_in, H, W]`, PyTorch's
/// `nn.ConvTranspose2d`: weight `[in, out / groups, kh, kw]`, optional bias
/// `[out]`, both initialized `U(-b, b)` with `b = 1/sqrt(out / groups * kh *
/// kw)` (PyTorch's default: its fan-in is the weight's second dimension times
/// the kernel), drawn from `seed` (the weight) and `sub_seed(seed, 1)` (the
/// bias). The output is `[N, out, H', W']` with `H' = (H - 1) * stride[0] - 2 *
/// padding[0] + dilation[0] * (kh - 1) + output_padding[0] + 1`.
///
/// ```
/// use fucina::nn::{ConvTranspose2d, Module};
/// use fucina::prelude::*;
///
/// let ctx = ExecContext::new();
/// // The U-Net upsampler: doubles the height and the width.
/// let opts = ConvTranspose2dOptions { stride: [2, 2], ..Default::default() };
/// let up = ConvTranspose2d::new(&ctx, 8, 4, [2, 2], opts, 1)?;
/// let x = Tensor::zeros(&ctx, &[2, 8, 5, 5])?;
/// assert_eq!(up.forward(&ctx, &x)?.shape(), [2, 4, 10, 10]);
/// assert_eq!(up.num_parameters(), 8 * 4 * 4 + 4);
/// assert!(up.forward(&ctx, &Tensor::zeros(&ctx, &[2, 4, 5, 5])?).is_err());
/// # Ok::<(), fucina::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct ConvTranspose2d {
    /// The weight, `[in, out / groups, kh, kw]`.
    pub weight: Parameter,
    /// The bias, `[out]` (absent for [`ConvTranspose2d::no_bias`]).
    pub bias: Option<Parameter>,
    in_channels: usize,
    out_channels: usize,
    kernel: [usize; 2],
    opts: ConvTranspose2dOptions,
}

impl ConvTranspose2d {
    /// A transposed convolution from `in_channels` to `out_channels` with a
    /// `kernel` (`[kh, kw]`) window, `opts` (stride, padding, output padding,
    /// dilation, groups) and a bias.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero size, stride, dilation or group
    /// count, a group count that does not divide both channel counts, or an
    /// output padding not smaller than its stride; out of memory.
    pub fn new(
        ctx: &ExecContext,
        in_channels: usize,
        out_channels: usize,
        kernel: [usize; 2],
        opts: ConvTranspose2dOptions,
        seed: u64,
    ) -> Result<ConvTranspose2d> {
        let mut c = ConvTranspose2d::no_bias(ctx, in_channels, out_channels, kernel, opts, seed)?;
        let b = c.bound();
        let bias = Tensor::uniform(ctx, &[out_channels], -b, b, sub_seed(seed, 1))?;
        c.bias = Some(Parameter::new(bias));
        Ok(c)
    }

    /// A transposed convolution without a bias.
    ///
    /// # Errors
    /// As [`new`](ConvTranspose2d::new).
    pub fn no_bias(
        ctx: &ExecContext,
        in_channels: usize,
        out_channels: usize,
        kernel: [usize; 2],
        opts: ConvTranspose2dOptions,
        seed: u64,
    ) -> Result<ConvTranspose2d> {
        let what = "ConvTranspose2d::new";
        check_conv(
            what,
            in_channels,
            out_channels,
            &kernel,
            &opts.stride,
            &opts.dilation,
            opts.groups,
        )?;
        check_output_padding(what, &opts.output_padding, &opts.stride)?;
        let shape = [
            in_channels,
            out_channels / opts.groups,
            kernel[0],
            kernel[1],
        ];
        let b = init_bound(shape[1..].iter().product());
        Ok(ConvTranspose2d {
            weight: Parameter::new(Tensor::uniform(ctx, &shape, -b, b, seed)?),
            bias: None,
            in_channels,
            out_channels,
            kernel,
            opts,
        })
    }

    fn bound(&self) -> f32 {
        init_bound(self.out_channels / self.opts.groups * self.kernel[0] * self.kernel[1])
    }

    /// The input channels.
    pub fn in_channels(&self) -> usize {
        self.in_channels
    }

    /// The output channels.
    pub fn out_channels(&self) -> usize {
        self.out_channels
    }

    /// The window size `[kh, kw]`.
    pub fn kernel_size(&self) -> [usize; 2] {
        self.kernel
    }

    /// The stride, padding, output padding, dilation and groups.
    pub fn options(&self) -> ConvTranspose2dOptions {
        self.opts
    }

    /// Applies the transposed convolution to `x` (`[N, in, H, W]` -> `[N,
    /// out, H', W']`).
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] if `x` is not `[N, in, H, W]`; the op's errors
    /// (a padding that leaves no output).
    pub fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        check_channels(
            || self.describe(),
            x,
            &[4],
            self.in_channels,
            "[N, C, H, W]",
        )?;
        let b = self.bias.as_ref().map(Parameter::tensor);
        Ok(x.conv_transpose2d(ctx, &self.weight.tensor(), b.as_ref(), self.opts)?)
    }

    fn describe(&self) -> String {
        format!(
            "ConvTranspose2d(in = {}, out = {}, kernel = {:?}, {:?})",
            self.in_channels, self.out_channels, self.kernel, self.opts
        )
    }
}

impl Module for ConvTranspose2d {
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        weight_and_bias(&self.weight, self.bias.as_ref())
    }
}

impl Forward for ConvTranspose2d {
    fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        ConvTranspose2d::forward(self, ctx, x)
    }
}

/// A 1-D transposed convolution over `[N, C_in, L]`, PyTorch's
/// `nn.ConvTranspose1d`: weight `[in, out / groups, k]`, optional bias
/// `[out]`, both initialized `U(-b, b)` with `b = 1/sqrt(out / groups * k)`,
/// drawn from `seed` (the weight) and `sub_seed(seed, 1)` (the bias).
///
/// ```
/// use fucina::exec::ConvTranspose1dOptions;
/// use fucina::nn::ConvTranspose1d;
/// use fucina::prelude::*;
///
/// let ctx = ExecContext::new();
/// let opts = ConvTranspose1dOptions { stride: 2, padding: 1, output_padding: 1, ..Default::default() };
/// let up = ConvTranspose1d::new(&ctx, 3, 2, 3, opts, 1)?;
/// assert_eq!(up.forward(&ctx, &Tensor::zeros(&ctx, &[1, 3, 8])?)?.shape(), [1, 2, 16]);
/// # Ok::<(), fucina::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct ConvTranspose1d {
    /// The weight, `[in, out / groups, k]`.
    pub weight: Parameter,
    /// The bias, `[out]` (absent for [`ConvTranspose1d::no_bias`]).
    pub bias: Option<Parameter>,
    in_channels: usize,
    out_channels: usize,
    kernel: usize,
    opts: ConvTranspose1dOptions,
}

impl ConvTranspose1d {
    /// A transposed convolution from `in_channels` to `out_channels` with a
    /// window of `kernel`, `opts` and a bias.
    ///
    /// # Errors
    /// As [`ConvTranspose2d::new`].
    pub fn new(
        ctx: &ExecContext,
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        opts: ConvTranspose1dOptions,
        seed: u64,
    ) -> Result<ConvTranspose1d> {
        let mut c = ConvTranspose1d::no_bias(ctx, in_channels, out_channels, kernel, opts, seed)?;
        let b = init_bound(out_channels / opts.groups * kernel);
        let bias = Tensor::uniform(ctx, &[out_channels], -b, b, sub_seed(seed, 1))?;
        c.bias = Some(Parameter::new(bias));
        Ok(c)
    }

    /// A transposed convolution without a bias.
    ///
    /// # Errors
    /// As [`ConvTranspose2d::new`].
    pub fn no_bias(
        ctx: &ExecContext,
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        opts: ConvTranspose1dOptions,
        seed: u64,
    ) -> Result<ConvTranspose1d> {
        let what = "ConvTranspose1d::new";
        check_conv(
            what,
            in_channels,
            out_channels,
            &[kernel],
            &[opts.stride],
            &[opts.dilation],
            opts.groups,
        )?;
        check_output_padding(what, &[opts.output_padding], &[opts.stride])?;
        let shape = [in_channels, out_channels / opts.groups, kernel];
        let b = init_bound(shape[1] * kernel);
        Ok(ConvTranspose1d {
            weight: Parameter::new(Tensor::uniform(ctx, &shape, -b, b, seed)?),
            bias: None,
            in_channels,
            out_channels,
            kernel,
            opts,
        })
    }

    /// The input channels.
    pub fn in_channels(&self) -> usize {
        self.in_channels
    }

    /// The output channels.
    pub fn out_channels(&self) -> usize {
        self.out_channels
    }

    /// The window size.
    pub fn kernel_size(&self) -> usize {
        self.kernel
    }

    /// The stride, padding, output padding, dilation and groups.
    pub fn options(&self) -> ConvTranspose1dOptions {
        self.opts
    }

    /// Applies the transposed convolution to `x` (`[N, in, L]` -> `[N, out,
    /// L']`).
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] if `x` is not `[N, in, L]`; the op's errors.
    pub fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        check_channels(
            || {
                format!(
                    "ConvTranspose1d(in = {}, out = {}, kernel = {}, {:?})",
                    self.in_channels, self.out_channels, self.kernel, self.opts
                )
            },
            x,
            &[3],
            self.in_channels,
            "[N, C, L]",
        )?;
        let b = self.bias.as_ref().map(Parameter::tensor);
        Ok(x.conv_transpose1d(ctx, &self.weight.tensor(), b.as_ref(), self.opts)?)
    }
}

impl Module for ConvTranspose1d {
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        weight_and_bias(&self.weight, self.bias.as_ref())
    }
}

impl Forward for ConvTranspose1d {
    fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        ConvTranspose1d::forward(self, ctx, x)
    }
}
