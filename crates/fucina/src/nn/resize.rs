//! Layers without parameters that resize the trailing axes: [`Upsample`]
//! (PyTorch's `nn.Upsample`, nearest or bilinear) and the padding layers
//! [`ConstantPad1d`], [`ConstantPad2d`], [`ConstantPad3d`], [`ZeroPad2d`],
//! [`ZeroPad3d`], [`ReflectionPad1d`], [`ReflectionPad2d`],
//! [`ReflectionPad3d`], [`ReplicationPad1d`], [`ReplicationPad2d`],
//! [`ReplicationPad3d`].

use fucina_autograd::Tensor;
use fucina_exec::{ExecContext, InterpolateMode, InterpolateOptions, PadMode, PadOptions};

use crate::error::{Error, Result};

/// PyTorch's `nn.Upsample` over `[N, C, H, W]`: resize to a fixed size or by
/// scale factors, `nearest` (PyTorch's default) or `bilinear` (with
/// `align_corners`, default `false`). No parameters.
///
/// ```
/// use fucina::nn::{Forward, Upsample};
/// use fucina::exec::InterpolateMode;
/// use fucina::{ExecContext, Tensor};
///
/// let ctx = ExecContext::new();
/// let up = Upsample::scale(2.0, InterpolateMode::Nearest)?;
/// let x = Tensor::from_slice(&ctx, &[1, 1, 1, 2], &[1., 2.])?;
/// assert_eq!(up.forward(&ctx, &x)?.to_vec(), [1., 1., 2., 2., 1., 1., 2., 2.]);
/// assert!(up.forward(&ctx, &Tensor::zeros(&ctx, &[2, 3])?).is_err()); // not [N, C, H, W]
/// assert!(Upsample::scale(0.0, InterpolateMode::Nearest).is_err());
/// # Ok::<(), fucina::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Upsample {
    opts: InterpolateOptions,
}

impl Upsample {
    /// Resize to `size = [H, W]` (PyTorch's `nn.Upsample(size=..., mode=...)`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if a size is 0.
    pub fn size(size: [usize; 2], mode: InterpolateMode) -> Result<Upsample> {
        if size.contains(&0) {
            return Err(Error::invalid(
                "Upsample::size",
                format!("the output size must be at least 1 on each axis (got {size:?})"),
            ));
        }
        Ok(Upsample {
            opts: InterpolateOptions::size(size, mode),
        })
    }

    /// Resize by `factor` on both axes (PyTorch's
    /// `nn.Upsample(scale_factor=factor, mode=...)`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `factor` is not finite and positive.
    pub fn scale(factor: f64, mode: InterpolateMode) -> Result<Upsample> {
        Upsample::scale2([factor, factor], mode)
    }

    /// Resize by `[sh, sw]`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if a factor is not finite and positive.
    pub fn scale2(factor: [f64; 2], mode: InterpolateMode) -> Result<Upsample> {
        if !factor.iter().all(|f| f.is_finite() && *f > 0.0) {
            return Err(Error::invalid(
                "Upsample::scale",
                format!("the scale factors must be finite and positive (got {factor:?})"),
            ));
        }
        Ok(Upsample {
            opts: InterpolateOptions::scale(factor, mode),
        })
    }

    /// The op's options.
    pub fn options(&self) -> InterpolateOptions {
        self.opts
    }

    /// Resizes `x` (`[N, C, H, W]`).
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] naming the layer if `x` is not of rank 4; the
    /// op's errors (a scale factor that gives an output size of 0).
    pub fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        if x.shape().len() != 4 {
            return Err(Error::ShapeMismatch {
                layer: format!("Upsample({:?})", self.opts),
                got: x.shape().to_vec(),
                reason: "the input must be [N, C, H, W] (rank 4)".into(),
            });
        }
        Ok(x.interpolate(ctx, self.opts)?)
    }
}

parameterless_layer!(Upsample);

macro_rules! pad_layer {
    ($(#[$doc:meta])* $name:ident, $what:literal, $n:literal, $mode:expr, ($($value:ident)?)) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq)]
        pub struct $name {
            opts: PadOptions,
        }

        impl $name {
            /// Padding by `pads` (PyTorch's tuple order: `[left, right]`, then
            /// `[top, bottom]` for the 2-D and 3-D layers, then `[front,
            /// back]` for the 3-D ones); a negative width crops.
            pub fn new(pads: [isize; $n] $(, $value: f32)?) -> $name {
                let mut p = [0; 6];
                p[..$n].copy_from_slice(&pads);
                $name {
                    opts: PadOptions {
                        pads: p,
                        axes: $n / 2,
                        mode: $mode,
                    },
                }
            }

            /// The same padding `p` on every side.
            pub fn uniform(p: isize $(, $value: f32)?) -> $name {
                $name::new([p; $n] $(, $value)?)
            }

            /// The op's options.
            pub fn options(&self) -> PadOptions {
                self.opts
            }

            /// Pads `x`.
            ///
            /// # Errors
            /// [`Error::ShapeMismatch`] naming the layer if `x` has fewer than
            /// two axes (1-D), three (2-D) or four (3-D), PyTorch's unbatched
            /// minimum; the op's errors naming the pad (a reflect pad not
            /// smaller than its axis, a crop larger than its axis or leaving
            /// it empty).
            pub fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
                if x.shape().len() < $n / 2 + 1 {
                    return Err(Error::ShapeMismatch {
                        layer: format!(concat!($what, "({:?})"), self.opts.pads),
                        got: x.shape().to_vec(),
                        reason: format!("the input needs at least {} axes", $n / 2 + 1),
                    });
                }
                Ok(x.pad(ctx, self.opts)?)
            }
        }

        parameterless_layer!($name);
    };
}

pad_layer! {
    /// PyTorch's `nn.ConstantPad1d`: the last axis padded with `value`.
    ConstantPad1d, "ConstantPad1d", 2, PadMode::Constant(value), (value)
}
pad_layer! {
    /// PyTorch's `nn.ConstantPad2d`: the last two axes padded with `value`.
    ConstantPad2d, "ConstantPad2d", 4, PadMode::Constant(value), (value)
}
pad_layer! {
    /// PyTorch's `nn.ConstantPad3d`: the last three axes padded with `value`.
    ConstantPad3d, "ConstantPad3d", 6, PadMode::Constant(value), (value)
}
pad_layer! {
    /// PyTorch's `nn.ZeroPad2d`: the last two axes padded with zeros.
    ZeroPad2d, "ZeroPad2d", 4, PadMode::Constant(0.0), ()
}
pad_layer! {
    /// PyTorch's `nn.ZeroPad3d`: the last three axes padded with zeros.
    ZeroPad3d, "ZeroPad3d", 6, PadMode::Constant(0.0), ()
}
pad_layer! {
    /// PyTorch's `nn.ReflectionPad1d`: the last axis mirrored at its edges
    /// (each pad smaller than the axis).
    ReflectionPad1d, "ReflectionPad1d", 2, PadMode::Reflect, ()
}
pad_layer! {
    /// PyTorch's `nn.ReflectionPad2d`: the last two axes mirrored at their
    /// edges (each pad smaller than its axis).
    ReflectionPad2d, "ReflectionPad2d", 4, PadMode::Reflect, ()
}
pad_layer! {
    /// PyTorch's `nn.ReflectionPad3d`: the last three axes mirrored at their
    /// edges (each pad smaller than its axis).
    ReflectionPad3d, "ReflectionPad3d", 6, PadMode::Reflect, ()
}
pad_layer! {
    /// PyTorch's `nn.ReplicationPad1d`: the last axis's edge elements
    /// repeated.
    ReplicationPad1d, "ReplicationPad1d", 2, PadMode::Replicate, ()
}
pad_layer! {
    /// PyTorch's `nn.ReplicationPad2d`: the last two axes' edge elements
    /// repeated.
    ReplicationPad2d, "ReplicationPad2d", 4, PadMode::Replicate, ()
}
pad_layer! {
    /// PyTorch's `nn.ReplicationPad3d`: the last three axes' edge elements
    /// repeated.
    ReplicationPad3d, "ReplicationPad3d", 6, PadMode::Replicate, ()
}
