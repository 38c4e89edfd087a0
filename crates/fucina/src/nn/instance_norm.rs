//! [`InstanceNorm1d`], [`InstanceNorm2d`] (PyTorch's instance norms: each
//! sample's channel normalized over its own positions, run as a group norm
//! with one channel per group) and [`Identity`].

use fucina_autograd::Tensor;
use fucina_exec::{ExecContext, GroupNormOptions};

use super::layers::check_eps;
use super::{Forward, Module, Parameter, check_size};
use crate::error::{Error, Result};

/// The layer both instance norms are.
#[derive(Debug, Clone)]
struct Instance {
    weight: Option<Parameter>,
    bias: Option<Parameter>,
    channels: usize,
    eps: f32,
}

impl Instance {
    fn new(
        ctx: &ExecContext,
        what: &'static str,
        channels: usize,
        eps: f32,
        affine: bool,
    ) -> Result<Instance> {
        check_size(what, "num_features", channels)?;
        check_eps(what, eps)?;
        let (weight, bias) = if affine {
            (
                Some(Parameter::new(Tensor::ones(ctx, &[channels])?)),
                Some(Parameter::new(Tensor::zeros(ctx, &[channels])?)),
            )
        } else {
            (None, None)
        };
        Ok(Instance {
            weight,
            bias,
            channels,
            eps,
        })
    }

    fn forward(&self, ctx: &ExecContext, x: &Tensor, name: &str, rank: usize) -> Result<Tensor> {
        let s = x.shape();
        if s.len() != rank || s[1] != self.channels {
            let layout = if rank == 3 {
                "[N, C, L]"
            } else {
                "[N, C, H, W]"
            };
            return Err(Error::ShapeMismatch {
                layer: format!("{name}(num_features = {})", self.channels),
                got: s.to_vec(),
                reason: format!("the input must be {layout} with {} channels", self.channels),
            });
        }
        let w = self.weight.as_ref().map(Parameter::tensor);
        let b = self.bias.as_ref().map(Parameter::tensor);
        let opts = GroupNormOptions {
            num_groups: self.channels,
            eps: self.eps,
        };
        Ok(x.group_norm(ctx, w.as_ref(), b.as_ref(), opts)?)
    }

    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        [("weight", &self.weight), ("bias", &self.bias)]
            .into_iter()
            .filter_map(|(n, p)| p.as_ref().map(|p| (n.to_string(), p.clone())))
            .collect()
    }
}

macro_rules! instance_norm {
    ($(#[$doc:meta])* $t:ident, $rank:literal, $what:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $t {
            inner: Instance,
        }

        impl $t {
            /// PyTorch's defaults: `eps = 1e-5`, not affine (no parameters).
            ///
            /// # Errors
            /// [`Error::InvalidArgument`] for zero features; out of memory.
            pub fn new(ctx: &ExecContext, num_features: usize) -> Result<$t> {
                $t::with_options(ctx, num_features, 1e-5, false)
            }

            /// With `eps` and, when `affine`, a weight (ones) and a bias
            /// (zeros) per channel.
            ///
            /// # Errors
            /// As [`new`](Self::new); [`Error::InvalidArgument`] for a
            /// negative, infinite or NaN `eps`.
            pub fn with_options(
                ctx: &ExecContext,
                num_features: usize,
                eps: f32,
                affine: bool,
            ) -> Result<$t> {
                Ok($t {
                    inner: Instance::new(ctx, $what, num_features, eps, affine)?,
                })
            }

            /// The per-channel scale (ones; `None` when not affine).
            pub fn weight(&self) -> Option<&Parameter> {
                self.inner.weight.as_ref()
            }

            /// The per-channel shift (zeros; `None` when not affine).
            pub fn bias(&self) -> Option<&Parameter> {
                self.inner.bias.as_ref()
            }

            /// Normalizes each sample's channels over their own positions.
            ///
            /// # Errors
            /// [`Error::ShapeMismatch`] naming the layer for an input of
            /// another rank or channel count; out of memory.
            pub fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
                self.inner.forward(ctx, x, stringify!($t), $rank)
            }
        }

        impl Module for $t {
            fn named_parameters(&self) -> Vec<(String, Parameter)> {
                self.inner.named_parameters()
            }
        }

        impl Forward for $t {
            fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
                $t::forward(self, ctx, x)
            }
        }
    };
}

instance_norm!(
    /// PyTorch's `nn.InstanceNorm2d(num_features, eps, affine)` over `[N, C,
    /// H, W]`: each `(sample, channel)` plane normalized with its own mean
    /// and biased variance, then the optional per-channel affine (the group
    /// norm with `C` groups, so the same bits as `group_norm` there). Not
    /// supported: `track_running_stats` and unbatched `[C, H, W]` input.
    ///
    /// ```
    /// use fucina::nn::{InstanceNorm2d, Module};
    /// use fucina::{ExecContext, Tensor};
    ///
    /// let ctx = ExecContext::new();
    /// let norm = InstanceNorm2d::new(&ctx, 3)?;
    /// assert_eq!(norm.num_parameters(), 0); // PyTorch's default: affine=False
    /// let y = norm.forward(&ctx, &Tensor::uniform(&ctx, &[2, 3, 4, 4], -1.0, 1.0, 1)?)?;
    /// let plane = &y.to_vec()[..16];
    /// assert!(plane.iter().sum::<f32>().abs() < 1e-5);
    /// # Ok::<(), fucina::Error>(())
    /// ```
    InstanceNorm2d,
    4,
    "InstanceNorm2d::new"
);

instance_norm!(
    /// PyTorch's `nn.InstanceNorm1d(num_features, eps, affine)` over `[N,
    /// C, L]`: [`InstanceNorm2d`] for sequences.
    InstanceNorm1d,
    3,
    "InstanceNorm1d::new"
);

/// PyTorch's `nn.Identity`: returns its input (a placeholder where a model
/// may or may not have a layer).
///
/// ```
/// use fucina::nn::{Forward, Identity};
/// use fucina::{ExecContext, Tensor};
///
/// let ctx = ExecContext::new();
/// let x = Tensor::from_slice(&ctx, &[2], &[1.0, 2.0])?;
/// assert_eq!(Identity.forward(&ctx, &x)?.to_vec(), [1.0, 2.0]);
/// # Ok::<(), fucina::Error>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Identity;

impl Module for Identity {
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        Vec::new()
    }
}

impl Forward for Identity {
    fn forward(&self, _ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        Ok(x.clone())
    }
}
