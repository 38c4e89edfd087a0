//! The layers of convolutional networks: [`Conv1d`], [`Conv2d`],
//! [`BatchNorm1d`], [`BatchNorm2d`], [`MaxPool2d`], [`AvgPool2d`],
//! [`AdaptiveAvgPool2d`], [`MaxPool1d`], [`AvgPool1d`] and [`Flatten`].

use fucina_autograd::Tensor;
use fucina_exec::{
    BatchNormStats, Conv1dOptions, Conv2dOptions, ExecContext, Pool1dOptions, Pool2dOp,
    Pool2dOptions,
};

use super::{Buffer, Forward, Module, Parameter, check_size, sub_seed, weight_and_bias};
use crate::error::{Error, Result};

/// `1 / sqrt(fan_in)`, the bound of PyTorch's default convolution init: its
/// `kaiming_uniform_(a = sqrt(5))` weights and `U(±1/sqrt(fan_in))` bias both
/// come to `U(-b, b)` with this `b` (as `fucina::rng::kaiming_uniform_fill`
/// computes it).
pub(super) fn init_bound(fan_in: usize) -> f32 {
    (1.0 / fan_in as f64).sqrt() as f32
}

/// Checks that `x` has rank `rank` (one of `ranks`) and `channels` at axis 1.
pub(super) fn check_channels(
    layer: impl FnOnce() -> String,
    x: &Tensor,
    ranks: &[usize],
    channels: usize,
    layout: &str,
) -> Result<()> {
    let s = x.shape();
    if !ranks.contains(&s.len()) || s[1] != channels {
        return Err(Error::ShapeMismatch {
            layer: layer(),
            got: s.to_vec(),
            reason: format!("the input must be {layout} with {channels} channels"),
        });
    }
    Ok(())
}

/// Checks the channel and group counts of a convolution constructor.
pub(super) fn check_conv(
    what: &'static str,
    in_channels: usize,
    out_channels: usize,
    kernel: &[usize],
    stride: &[usize],
    dilation: &[usize],
    groups: usize,
) -> Result<()> {
    check_size(what, "in_channels", in_channels)?;
    check_size(what, "out_channels", out_channels)?;
    check_size(what, "groups", groups)?;
    for (name, v) in [
        ("kernel", kernel),
        ("stride", stride),
        ("dilation", dilation),
    ] {
        if v.contains(&0) {
            return Err(Error::invalid(
                what,
                format!("every {name} size must be at least 1 (got {v:?})"),
            ));
        }
    }
    if !in_channels.is_multiple_of(groups) || !out_channels.is_multiple_of(groups) {
        return Err(Error::invalid(
            what,
            format!(
                "groups = {groups} must divide in_channels = {in_channels} and out_channels = {out_channels}"
            ),
        ));
    }
    Ok(())
}

/// A 2-D convolution over `[N, C_in, H, W]`, PyTorch's `nn.Conv2d`: weight
/// `[out, in / groups, kh, kw]`, optional bias `[out]`, both initialized
/// `U(-b, b)` with `b = 1/sqrt(in / groups * kh * kw)` (PyTorch's default),
/// drawn from `seed` (the weight) and `sub_seed(seed, 1)` (the bias).
///
/// ```
/// use fucina::nn::{Conv2d, Module};
/// use fucina::prelude::*;
///
/// let ctx = ExecContext::new();
/// let opts = Conv2dOptions { padding: [1, 1], ..Default::default() };
/// let conv = Conv2d::new(&ctx, 3, 8, [3, 3], opts, 1)?;
/// let x = Tensor::zeros(&ctx, &[2, 3, 5, 5])?;
/// assert_eq!(conv.forward(&ctx, &x)?.shape(), [2, 8, 5, 5]);
/// assert_eq!(conv.num_parameters(), 8 * 3 * 9 + 8);
/// assert!(conv.forward(&ctx, &Tensor::zeros(&ctx, &[2, 4, 5, 5])?).is_err());
/// # Ok::<(), fucina::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Conv2d {
    /// The weight, `[out, in / groups, kh, kw]`.
    pub weight: Parameter,
    /// The bias, `[out]` (absent for [`Conv2d::no_bias`]).
    pub bias: Option<Parameter>,
    in_channels: usize,
    out_channels: usize,
    kernel: [usize; 2],
    opts: Conv2dOptions,
}

impl Conv2d {
    /// A convolution from `in_channels` to `out_channels` with a `kernel`
    /// (`[kh, kw]`) window, `opts` (stride, padding, dilation, groups) and a
    /// bias.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero size, stride, dilation or group
    /// count, or a group count that does not divide both channel counts; out of
    /// memory.
    pub fn new(
        ctx: &ExecContext,
        in_channels: usize,
        out_channels: usize,
        kernel: [usize; 2],
        opts: Conv2dOptions,
        seed: u64,
    ) -> Result<Conv2d> {
        let mut c = Conv2d::no_bias(ctx, in_channels, out_channels, kernel, opts, seed)?;
        let b = c.bound();
        let bias = Tensor::uniform(ctx, &[out_channels], -b, b, sub_seed(seed, 1))?;
        c.bias = Some(Parameter::new(bias));
        Ok(c)
    }

    /// A convolution without a bias (as before a batch norm).
    ///
    /// # Errors
    /// As [`new`](Conv2d::new).
    pub fn no_bias(
        ctx: &ExecContext,
        in_channels: usize,
        out_channels: usize,
        kernel: [usize; 2],
        opts: Conv2dOptions,
        seed: u64,
    ) -> Result<Conv2d> {
        check_conv(
            "Conv2d::new",
            in_channels,
            out_channels,
            &kernel,
            &opts.stride,
            &opts.dilation,
            opts.groups,
        )?;
        let shape = [
            out_channels,
            in_channels / opts.groups,
            kernel[0],
            kernel[1],
        ];
        let b = init_bound(shape[1..].iter().product());
        Ok(Conv2d {
            weight: Parameter::new(Tensor::uniform(ctx, &shape, -b, b, seed)?),
            bias: None,
            in_channels,
            out_channels,
            kernel,
            opts,
        })
    }

    fn bound(&self) -> f32 {
        init_bound(self.in_channels / self.opts.groups * self.kernel[0] * self.kernel[1])
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

    /// The stride, padding, dilation and groups.
    pub fn options(&self) -> Conv2dOptions {
        self.opts
    }

    /// Applies the convolution to `x` (`[N, in, H, W]` -> `[N, out, H', W']`).
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] if `x` is not `[N, in, H, W]`; the op's errors
    /// (a kernel larger than the padded input).
    pub fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        check_channels(
            || self.describe(),
            x,
            &[4],
            self.in_channels,
            "[N, C, H, W]",
        )?;
        let b = self.bias.as_ref().map(Parameter::tensor);
        Ok(x.conv2d(ctx, &self.weight.tensor(), b.as_ref(), self.opts)?)
    }

    fn describe(&self) -> String {
        format!(
            "Conv2d(in = {}, out = {}, kernel = {:?}, {:?})",
            self.in_channels, self.out_channels, self.kernel, self.opts
        )
    }
}

impl Module for Conv2d {
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        weight_and_bias(&self.weight, self.bias.as_ref())
    }
}

impl Forward for Conv2d {
    fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        Conv2d::forward(self, ctx, x)
    }
}

/// A 1-D convolution over `[N, C_in, L]`, PyTorch's `nn.Conv1d`: weight
/// `[out, in / groups, k]`, optional bias `[out]`, both initialized
/// `U(-b, b)` with `b = 1/sqrt(in / groups * k)`, drawn from `seed` (the
/// weight) and `sub_seed(seed, 1)` (the bias).
#[derive(Debug, Clone)]
pub struct Conv1d {
    /// The weight, `[out, in / groups, k]`.
    pub weight: Parameter,
    /// The bias, `[out]` (absent for [`Conv1d::no_bias`]).
    pub bias: Option<Parameter>,
    in_channels: usize,
    out_channels: usize,
    kernel: usize,
    opts: Conv1dOptions,
}

impl Conv1d {
    /// A convolution from `in_channels` to `out_channels` with a window of
    /// `kernel`, `opts` and a bias.
    ///
    /// # Errors
    /// As [`Conv2d::new`].
    pub fn new(
        ctx: &ExecContext,
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        opts: Conv1dOptions,
        seed: u64,
    ) -> Result<Conv1d> {
        let mut c = Conv1d::no_bias(ctx, in_channels, out_channels, kernel, opts, seed)?;
        let b = c.bound();
        let bias = Tensor::uniform(ctx, &[out_channels], -b, b, sub_seed(seed, 1))?;
        c.bias = Some(Parameter::new(bias));
        Ok(c)
    }

    /// A convolution without a bias.
    ///
    /// # Errors
    /// As [`Conv2d::new`].
    pub fn no_bias(
        ctx: &ExecContext,
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        opts: Conv1dOptions,
        seed: u64,
    ) -> Result<Conv1d> {
        check_conv(
            "Conv1d::new",
            in_channels,
            out_channels,
            &[kernel],
            &[opts.stride],
            &[opts.dilation],
            opts.groups,
        )?;
        let shape = [out_channels, in_channels / opts.groups, kernel];
        let b = init_bound(shape[1] * kernel);
        Ok(Conv1d {
            weight: Parameter::new(Tensor::uniform(ctx, &shape, -b, b, seed)?),
            bias: None,
            in_channels,
            out_channels,
            kernel,
            opts,
        })
    }

    fn bound(&self) -> f32 {
        init_bound(self.in_channels / self.opts.groups * self.kernel)
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

    /// The stride, padding, dilation and groups.
    pub fn options(&self) -> Conv1dOptions {
        self.opts
    }

    /// Applies the convolution to `x` (`[N, in, L]` -> `[N, out, L']`).
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] if `x` is not `[N, in, L]`; the op's errors.
    pub fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        check_channels(
            || {
                format!(
                    "Conv1d(in = {}, out = {}, kernel = {}, {:?})",
                    self.in_channels, self.out_channels, self.kernel, self.opts
                )
            },
            x,
            &[3],
            self.in_channels,
            "[N, C, L]",
        )?;
        let b = self.bias.as_ref().map(Parameter::tensor);
        Ok(x.conv1d(ctx, &self.weight.tensor(), b.as_ref(), self.opts)?)
    }
}

impl Module for Conv1d {
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        weight_and_bias(&self.weight, self.bias.as_ref())
    }
}

impl Forward for Conv1d {
    fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        Conv1d::forward(self, ctx, x)
    }
}

/// The state and the forward pass shared by [`BatchNorm1d`] and
/// [`BatchNorm2d`].
#[derive(Debug, Clone)]
struct BatchNorm {
    weight: Parameter,
    bias: Parameter,
    running_mean: Buffer,
    running_var: Buffer,
    eps: f32,
    momentum: f32,
    training: bool,
}

impl BatchNorm {
    fn new(ctx: &ExecContext, what: &'static str, features: usize) -> Result<BatchNorm> {
        check_size(what, "num_features", features)?;
        Ok(BatchNorm {
            weight: Parameter::new(Tensor::ones(ctx, &[features])?),
            bias: Parameter::new(Tensor::zeros(ctx, &[features])?),
            running_mean: Buffer::new(Tensor::zeros(ctx, &[features])?),
            running_var: Buffer::new(Tensor::ones(ctx, &[features])?),
            eps: 1e-5,
            momentum: 0.1,
            training: true,
        })
    }

    fn check(what: &'static str, eps: f32, momentum: f32) -> Result<()> {
        super::layers::check_eps(what, eps)?;
        // A range check: NaN and the infinities are outside it.
        if !(0.0..=1.0).contains(&momentum) {
            return Err(Error::invalid(
                what,
                format!("momentum must be in [0, 1] (got {momentum})"),
            ));
        }
        Ok(())
    }

    fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        let (g, b) = (self.weight.tensor(), self.bias.tensor());
        if !self.training {
            let (rm, rv) = (self.running_mean.tensor(), self.running_var.tensor());
            return Ok(x.batch_norm_eval(ctx, &rm, &rv, &g, &b, self.eps)?);
        }
        let (y, stats) = x.batch_norm_with_stats(ctx, &g, &b, self.eps)?;
        self.update_running(&stats)?;
        Ok(y)
    }

    /// The forward followed by `pool2d(op)`; fused in training mode.
    fn forward_pool2d(&self, ctx: &ExecContext, x: &Tensor, op: Pool2dOp) -> Result<Tensor> {
        if !self.training {
            return Ok(self.forward(ctx, x)?.pool2d(ctx, op)?);
        }
        let (g, b) = (self.weight.tensor(), self.bias.tensor());
        let (y, stats) = x.batch_norm_pool2d_with_stats(ctx, &g, &b, self.eps, op)?;
        self.update_running(&stats)?;
        Ok(y)
    }

    /// Blends the batch statistics into the running ones.
    fn update_running(&self, stats: &BatchNormStats) -> Result<()> {
        let m = self.momentum;
        // PyTorch's update, in its order of operations.
        let blend = |run: &mut [f32], batch: &[f32]| {
            for (r, &v) in run.iter_mut().zip(batch) {
                *r = m * v + (1.0 - m) * *r;
            }
        };
        let mean = stats.mean.data()?;
        let var = stats.unbiased_var.data()?;
        self.running_mean.update_(|r| blend(r, mean))?;
        self.running_var.update_(|r| blend(r, var))?;
        Ok(())
    }

    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        vec![
            ("weight".to_string(), self.weight.clone()),
            ("bias".to_string(), self.bias.clone()),
        ]
    }

    fn named_buffers(&self) -> Vec<(String, Buffer)> {
        vec![
            ("running_mean".to_string(), self.running_mean.clone()),
            ("running_var".to_string(), self.running_var.clone()),
        ]
    }
}

macro_rules! batch_norm_layer {
    ($(#[$doc:meta])* $name:ident, $what:literal, $ranks:expr, $layout:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $name {
            inner: BatchNorm,
        }

        impl $name {
            /// Normalization of `num_features` channels: scale (`weight`) ones,
            /// shift (`bias`) zeros, running mean zeros and running variance
            /// ones, `eps = 1e-5`, `momentum = 0.1`, in training mode.
            ///
            /// # Errors
            /// [`Error::InvalidArgument`] for zero features; out of memory.
            pub fn new(ctx: &ExecContext, num_features: usize) -> Result<$name> {
                Ok($name {
                    inner: BatchNorm::new(ctx, concat!($what, "::new"), num_features)?,
                })
            }

            /// The same layer with `eps` and `momentum` (PyTorch's convention:
            /// `running = momentum * batch + (1 - momentum) * running`).
            ///
            /// # Errors
            /// [`Error::InvalidArgument`] for a negative, infinite or NaN `eps`
            /// or a `momentum` outside `[0, 1]` (NaN included).
            pub fn with_options(mut self, eps: f32, momentum: f32) -> Result<$name> {
                BatchNorm::check(concat!($what, "::with_options"), eps, momentum)?;
                self.inner.eps = eps;
                self.inner.momentum = momentum;
                Ok(self)
            }

            /// The scale `gamma`, `[C]`.
            pub fn weight(&self) -> &Parameter {
                &self.inner.weight
            }

            /// The shift `beta`, `[C]`.
            pub fn bias(&self) -> &Parameter {
                &self.inner.bias
            }

            /// The running mean, `[C]` (a buffer: saved, not trained).
            pub fn running_mean(&self) -> &Buffer {
                &self.inner.running_mean
            }

            /// The running (unbiased) variance, `[C]` (a buffer).
            pub fn running_var(&self) -> &Buffer {
                &self.inner.running_var
            }

            /// The number of channels.
            pub fn num_features(&self) -> usize {
                self.inner.weight.numel()
            }

            /// `eps`.
            pub fn eps(&self) -> f32 {
                self.inner.eps
            }

            /// `momentum`.
            pub fn momentum(&self) -> f32 {
                self.inner.momentum
            }

            /// Whether the layer is in training mode.
            pub fn is_training(&self) -> bool {
                self.inner.training
            }

            /// Normalizes `x`. In training mode with the batch's statistics
            /// (biased variance over every axis but the channels), updating the
            /// running statistics with the batch mean and unbiased variance;
            /// in evaluation mode with the running statistics (then every
            /// sample's output depends on that sample alone).
            ///
            /// # Errors
            /// [`Error::ShapeMismatch`] if `x` does not fit the layer; the
            /// op's errors (one value per channel in training mode).
            pub fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
                let c = self.num_features();
                check_channels(
                    || format!(concat!($what, "(num_features = {})"), c),
                    x,
                    &$ranks,
                    c,
                    $layout,
                )?;
                self.inner.forward(ctx, x)
            }
        }

        impl Module for $name {
            fn named_parameters(&self) -> Vec<(String, Parameter)> {
                self.inner.named_parameters()
            }

            fn named_buffers(&self) -> Vec<(String, Buffer)> {
                self.inner.named_buffers()
            }

            fn train(&mut self, training: bool) {
                self.inner.training = training;
            }
        }

        impl Forward for $name {
            fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
                $name::forward(self, ctx, x)
            }
        }
    };
}

batch_norm_layer! {
    /// Batch normalization over `[N, C, H, W]`, PyTorch's `nn.BatchNorm2d`:
    /// parameters `weight` and `bias` (`[C]`), buffers `running_mean` and
    /// `running_var` (`[C]`, saved in state dicts and checkpoints).
    /// [`Module::train`] and [`Module::eval`] switch between the batch's
    /// statistics (training, the default) and the running ones. Training mode
    /// depends on the whole batch by definition.
    ///
    /// ```
    /// use fucina::nn::{BatchNorm2d, Module};
    /// use fucina::{ExecContext, Tensor};
    ///
    /// let ctx = ExecContext::new();
    /// let mut bn = BatchNorm2d::new(&ctx, 2)?;
    /// let x = Tensor::from_slice(&ctx, &[2, 2, 1, 1], &[1., 10., 3., 20.])?;
    /// let y = bn.forward(&ctx, &x)?; // normalized with the batch's statistics
    /// assert!((y.to_vec()[0] + 1.0).abs() < 1e-4);
    /// assert_eq!(bn.running_mean().to_vec(), [0.2, 1.5]); // 0.1 * batch mean
    /// bn.eval();
    /// assert!(!bn.is_training());
    /// let names: Vec<String> = bn.state_dict().names().map(String::from).collect();
    /// assert_eq!(names, ["weight", "bias", "running_mean", "running_var"]);
    /// # Ok::<(), fucina::Error>(())
    /// ```
    BatchNorm2d, "BatchNorm2d", [4], "[N, C, H, W]"
}

impl BatchNorm2d {
    /// [`forward`](BatchNorm2d::forward) followed by `pool2d(op)` (a
    /// [`Pool2dOp`]: `ReluMax` for a ReLU and a max pool, `Max`, `Avg`, ...),
    /// the same values, running statistics and gradients, bit for bit. In
    /// training mode the two run as one fused op
    /// ([`Tensor::batch_norm_pool2d_with_stats`]), which never writes the
    /// normalized tensor: the block `conv -> batch norm -> relu -> max pool`
    /// then streams its full-resolution activation through memory half as
    /// often. [`Sequential`](super::Sequential) calls it for those neighbours.
    ///
    /// ```
    /// use fucina::nn::{BatchNorm2d, Forward};
    /// use fucina::exec::{Pool2dOp, Pool2dOptions};
    /// use fucina::{ExecContext, Tensor};
    ///
    /// let ctx = ExecContext::new();
    /// let (a, b) = (BatchNorm2d::new(&ctx, 3)?, BatchNorm2d::new(&ctx, 3)?);
    /// let x = Tensor::uniform(&ctx, &[2, 3, 4, 4], -1.0, 1.0, 1)?;
    /// let op = Pool2dOp::ReluMax(Pool2dOptions::new([2, 2]));
    /// let fused = a.forward_pool2d(&ctx, &x, op)?;
    /// let apart = b.forward(&ctx, &x)?.pool2d(&ctx, op)?;
    /// assert_eq!(fused.to_vec(), apart.to_vec());
    /// assert_eq!(a.running_var().to_vec(), b.running_var().to_vec());
    /// # Ok::<(), fucina::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`forward`](BatchNorm2d::forward), then the pool's errors.
    pub fn forward_pool2d(&self, ctx: &ExecContext, x: &Tensor, op: Pool2dOp) -> Result<Tensor> {
        let c = self.num_features();
        check_channels(
            || format!("BatchNorm2d(num_features = {c})"),
            x,
            &[4],
            c,
            "[N, C, H, W]",
        )?;
        self.inner.forward_pool2d(ctx, x, op)
    }
}

batch_norm_layer! {
    /// Batch normalization over `[N, C]` or `[N, C, L]`, PyTorch's
    /// `nn.BatchNorm1d`: as [`BatchNorm2d`] (parameters `weight`, `bias`;
    /// buffers `running_mean`, `running_var`; `train()`/`eval()`).
    BatchNorm1d, "BatchNorm1d", [2, 3], "[N, C] or [N, C, L]"
}

/// A pooling window: the 2-D options, or the 1-D ones (a `1 × kernel`
/// window over a height of 1).
trait Window: std::fmt::Debug {
    fn as_2d(&self) -> Pool2dOptions;
}

impl Window for Pool2dOptions {
    fn as_2d(&self) -> Pool2dOptions {
        *self
    }
}

impl Window for Pool1dOptions {
    fn as_2d(&self) -> Pool2dOptions {
        self.to_2d()
    }
}

/// Checks a pooling window (sizes and strides at least 1, padding at most
/// half the window).
fn check_pool(what: &'static str, w: &impl Window) -> Result<()> {
    let o = w.as_2d();
    for i in 0..2 {
        if o.kernel[i] == 0 || o.stride[i] == 0 || o.padding[i] > o.kernel[i] / 2 {
            return Err(Error::invalid(
                what,
                format!(
                    "kernel and stride must be at least 1 and padding at most half the kernel (got {w:?})"
                ),
            ));
        }
    }
    Ok(())
}

macro_rules! pool_layer {
    ($(#[$doc:meta])* $name:ident, $what:literal, $op:ident, $opts:ident, $kernel:ty, $input:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name {
            opts: $opts,
        }

        impl $name {
            /// A `kernel` window with the stride equal to the kernel and no
            /// padding (PyTorch's default).
            ///
            /// # Errors
            /// [`Error::InvalidArgument`] for a zero kernel size.
            pub fn new(kernel: $kernel) -> Result<$name> {
                $name::with_options($opts::new(kernel))
            }

            /// A window of `opts` (kernel, stride, padding).
            ///
            /// # Errors
            /// [`Error::InvalidArgument`] for a zero kernel or stride, or a
            /// padding above half the kernel.
            pub fn with_options(opts: $opts) -> Result<$name> {
                check_pool(concat!($what, "::new"), &opts)?;
                Ok($name { opts })
            }

            /// The window.
            pub fn options(&self) -> $opts {
                self.opts
            }

            #[doc = concat!("Pools `x` (`", $input, "`).")]
            ///
            /// # Errors
            /// The op's errors, naming it (a wrong rank, a window larger than
            /// the padded input).
            pub fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
                Ok(x.$op(ctx, self.opts)?)
            }
        }

        parameterless_layer!($name);
    };
}

pool_layer! {
    /// Max pooling over `[N, C, H, W]`, PyTorch's `nn.MaxPool2d` (a tie goes to
    /// the first position of the window in row-major order).
    MaxPool2d, "MaxPool2d", max_pool2d, Pool2dOptions, [usize; 2], "[N, C, H, W]"
}

pool_layer! {
    /// Average pooling over `[N, C, H, W]`, PyTorch's `nn.AvgPool2d` (padding
    /// counts in the divisor, PyTorch's default `count_include_pad = true`).
    AvgPool2d, "AvgPool2d", avg_pool2d, Pool2dOptions, [usize; 2], "[N, C, H, W]"
}

pool_layer! {
    /// Max pooling over `[N, C, L]`, PyTorch's `nn.MaxPool1d` (a tie goes to
    /// the first position of the window).
    MaxPool1d, "MaxPool1d", max_pool1d, Pool1dOptions, usize, "[N, C, L]"
}

pool_layer! {
    /// Average pooling over `[N, C, L]`, PyTorch's `nn.AvgPool1d` (padding
    /// counts in the divisor, `count_include_pad = true`).
    AvgPool1d, "AvgPool1d", avg_pool1d, Pool1dOptions, usize, "[N, C, L]"
}

/// Average pooling to a fixed output size `[oh, ow]`, PyTorch's
/// `nn.AdaptiveAvgPool2d` (`[1, 1]`: global average pooling).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdaptiveAvgPool2d {
    size: [usize; 2],
}

impl AdaptiveAvgPool2d {
    /// Pooling to `size` (`[oh, ow]`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero size.
    pub fn new(size: [usize; 2]) -> Result<AdaptiveAvgPool2d> {
        if size.contains(&0) {
            return Err(Error::invalid(
                "AdaptiveAvgPool2d::new",
                format!("the output size must be at least 1 (got {size:?})"),
            ));
        }
        Ok(AdaptiveAvgPool2d { size })
    }

    /// The output size.
    pub fn output_size(&self) -> [usize; 2] {
        self.size
    }

    /// Pools `x` (`[N, C, H, W]` -> `[N, C, oh, ow]`).
    ///
    /// # Errors
    /// The op's errors (a rank other than 4, an output larger than the input).
    pub fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        Ok(x.adaptive_avg_pool2d(ctx, self.size)?)
    }
}

parameterless_layer!(AdaptiveAvgPool2d);

/// Flattens every axis from `start_axis` on into one (PyTorch's `nn.Flatten`,
/// whose default start is axis 1: `[N, C, H, W]` -> `[N, C * H * W]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flatten {
    start_axis: isize,
}

impl Default for Flatten {
    fn default() -> Flatten {
        Flatten { start_axis: 1 }
    }
}

impl Flatten {
    /// Flattening from axis 1 (the default).
    pub fn new() -> Flatten {
        Flatten::default()
    }

    /// Flattening from `start_axis` (negative counts from the end).
    pub fn from_axis(start_axis: isize) -> Flatten {
        Flatten { start_axis }
    }

    /// Flattens `x`.
    ///
    /// # Errors
    /// An axis error if `start_axis` is outside `x`'s rank.
    pub fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        Ok(x.flatten(ctx, self.start_axis)?)
    }
}

parameterless_layer!(Flatten);
