//! The basic layers.

use std::sync::atomic::{AtomicU64, Ordering};

use fucina_autograd::Tensor;
use fucina_exec::{ExecContext, GroupNormOptions, RawTensor};

use super::{Forward, Module, Parameter, check_last_dim, check_size, sub_seed, weight_and_bias};
use crate::error::{Error, Result};

/// A fully connected layer `y = x · Wᵀ + b`, PyTorch's `nn.Linear`: weight
/// `[out, in]`, bias `[out]`, both initialized U(-b, b) with `b = 1/sqrt(in)`
/// (what PyTorch's default Kaiming-uniform with `a = sqrt(5)` gives for both),
/// drawn from `seed` (the weight) and `sub_seed(seed, 1)` (the bias).
#[derive(Debug, Clone)]
pub struct Linear {
    /// The weight, `[out, in]`.
    pub weight: Parameter,
    /// The bias, `[out]` (absent for [`Linear::no_bias`]).
    pub bias: Option<Parameter>,
    in_features: usize,
    out_features: usize,
}

impl Linear {
    /// A layer from `in_features` to `out_features` with a bias.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero size; out of memory.
    pub fn new(
        ctx: &ExecContext,
        in_features: usize,
        out_features: usize,
        seed: u64,
    ) -> Result<Linear> {
        let mut l = Linear::no_bias(ctx, in_features, out_features, seed)?;
        let bound = (1.0 / in_features as f64).sqrt() as f32;
        let b = Tensor::uniform(ctx, &[out_features], -bound, bound, sub_seed(seed, 1))?;
        l.bias = Some(Parameter::new(b));
        Ok(l)
    }

    /// A layer without a bias.
    ///
    /// # Errors
    /// As [`new`](Linear::new).
    pub fn no_bias(
        ctx: &ExecContext,
        in_features: usize,
        out_features: usize,
        seed: u64,
    ) -> Result<Linear> {
        check_size("Linear::new", "in_features", in_features)?;
        check_size("Linear::new", "out_features", out_features)?;
        let w = Tensor::kaiming_uniform(ctx, &[out_features, in_features], seed)?;
        Ok(Linear {
            weight: Parameter::new(w),
            bias: None,
            in_features,
            out_features,
        })
    }

    /// The input width.
    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// The output width.
    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// Applies the layer to `x` (`[..., in]` -> `[..., out]`).
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] if the last dimension of `x` is not `in`.
    pub fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        check_last_dim(|| self.describe(), x, self.in_features)?;
        let w = self.weight.tensor();
        let b = self.bias.as_ref().map(Parameter::tensor);
        Ok(x.linear(ctx, &w, b.as_ref())?)
    }

    fn describe(&self) -> String {
        format!(
            "Linear(in = {}, out = {})",
            self.in_features, self.out_features
        )
    }
}

impl Module for Linear {
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        weight_and_bias(&self.weight, self.bias.as_ref())
    }
}

impl Forward for Linear {
    fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        Linear::forward(self, ctx, x)
    }
}

/// A lookup table of `vocab` rows of `dim` values, initialized N(0, 1) from the
/// seed (PyTorch's `nn.Embedding` default).
#[derive(Debug, Clone)]
pub struct Embedding {
    /// The table, `[vocab, dim]`.
    pub weight: Parameter,
}

impl Embedding {
    /// A table of `vocab` rows of width `dim`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero size; out of memory.
    pub fn new(ctx: &ExecContext, vocab: usize, dim: usize, seed: u64) -> Result<Embedding> {
        check_size("Embedding::new", "vocab", vocab)?;
        check_size("Embedding::new", "dim", dim)?;
        Ok(Embedding {
            weight: Parameter::new(Tensor::randn(ctx, &[vocab, dim], 1.0, seed)?),
        })
    }

    /// The rows at `ids` (`ids.shape() + [dim]`).
    ///
    /// # Errors
    /// An index error naming the id if one is outside `0..vocab`.
    pub fn forward(&self, ctx: &ExecContext, ids: &RawTensor<i64>) -> Result<Tensor> {
        Ok(self.weight.tensor().embedding(ctx, ids)?)
    }
}

impl Module for Embedding {
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        vec![("weight".to_string(), self.weight.clone())]
    }
}

/// Layer normalization over the last axis with a learned scale (ones) and shift
/// (zeros), PyTorch's `nn.LayerNorm(dim)`; [`LayerNorm::no_bias`] is
/// `nn.LayerNorm(dim, bias=False)` (the scale alone).
#[derive(Debug, Clone)]
pub struct LayerNorm {
    /// The scale, `[dim]`.
    pub weight: Parameter,
    /// The shift, `[dim]` (absent without a bias).
    pub bias: Option<Parameter>,
    /// `[dim]` zeros standing in for the shift when there is none.
    zero_shift: Tensor,
    eps: f32,
}

impl LayerNorm {
    /// Normalization over a last axis of `dim` with `eps` (PyTorch: 1e-5).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero `dim` or a negative, infinite or
    /// NaN `eps`.
    pub fn new(ctx: &ExecContext, dim: usize, eps: f32) -> Result<LayerNorm> {
        let mut ln = LayerNorm::no_bias(ctx, dim, eps)?;
        ln.bias = Some(Parameter::new(Tensor::zeros(ctx, &[dim])?));
        Ok(ln)
    }

    /// Normalization with the scale alone (PyTorch's `bias=False`): the
    /// output is `weight * (x - mean) / sqrt(var + eps)`.
    ///
    /// # Errors
    /// As [`LayerNorm::new`].
    pub fn no_bias(ctx: &ExecContext, dim: usize, eps: f32) -> Result<LayerNorm> {
        check_size("LayerNorm::new", "dim", dim)?;
        check_eps("LayerNorm::new", eps)?;
        Ok(LayerNorm {
            weight: Parameter::new(Tensor::ones(ctx, &[dim])?),
            bias: None,
            zero_shift: Tensor::zeros(ctx, &[dim])?,
            eps,
        })
    }

    /// Normalizes `x` over its last axis.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] if the last dimension is not `dim`.
    pub fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        let dim = self.weight.numel();
        check_last_dim(|| format!("LayerNorm(dim = {dim})"), x, dim)?;
        let shift = match &self.bias {
            Some(b) => b.tensor(),
            None => self.zero_shift.clone(),
        };
        Ok(x.layer_norm(ctx, &self.weight.tensor(), &shift, self.eps)?)
    }
}

impl Module for LayerNorm {
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        let mut v = vec![("weight".to_string(), self.weight.clone())];
        if let Some(b) = &self.bias {
            v.push(("bias".to_string(), b.clone()));
        }
        v
    }
}

impl Forward for LayerNorm {
    fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        LayerNorm::forward(self, ctx, x)
    }
}

/// RMS normalization over the last axis with a learned scale (ones).
#[derive(Debug, Clone)]
pub struct RmsNorm {
    /// The scale, `[dim]`.
    pub weight: Parameter,
    eps: f32,
}

impl RmsNorm {
    /// Normalization over a last axis of `dim` with `eps`.
    ///
    /// # Errors
    /// As [`LayerNorm::new`].
    pub fn new(ctx: &ExecContext, dim: usize, eps: f32) -> Result<RmsNorm> {
        check_size("RmsNorm::new", "dim", dim)?;
        check_eps("RmsNorm::new", eps)?;
        Ok(RmsNorm {
            weight: Parameter::new(Tensor::ones(ctx, &[dim])?),
            eps,
        })
    }

    /// Normalizes `x` over its last axis.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] if the last dimension is not `dim`.
    pub fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        let dim = self.weight.numel();
        check_last_dim(|| format!("RmsNorm(dim = {dim})"), x, dim)?;
        Ok(x.rms_norm(ctx, &self.weight.tensor(), self.eps)?)
    }
}

impl Module for RmsNorm {
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        vec![("weight".to_string(), self.weight.clone())]
    }
}

impl Forward for RmsNorm {
    fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        RmsNorm::forward(self, ctx, x)
    }
}

/// Group normalization over `[N, C, *]`, PyTorch's `nn.GroupNorm(num_groups,
/// num_channels, eps=1e-5, affine=True)`: the `C` channels form `num_groups`
/// groups of consecutive channels, each (sample, group) is normalized with its
/// own mean and biased variance (so a sample's output depends on that sample
/// alone, in training and evaluation alike), then scaled by `weight` (ones)
/// and shifted by `bias` (zeros), both `[C]` and present only when the layer
/// is affine. See [`Tensor::group_norm`] for the op.
///
/// ```
/// use fucina::nn::{Forward, GroupNorm, Module};
/// use fucina::{ExecContext, Tensor};
///
/// let ctx = ExecContext::new();
/// let gn = GroupNorm::new(&ctx, 2, 4)?; // 2 groups of 2 channels
/// let names: Vec<String> = gn.state_dict().names().map(String::from).collect();
/// assert_eq!(names, ["weight", "bias"]);
/// let x = Tensor::uniform(&ctx, &[3, 4, 5, 5], -1.0, 1.0, 7)?;
/// assert_eq!(gn.forward(&ctx, &x)?.shape(), [3, 4, 5, 5]);
/// // Not 4 channels: an error naming the layer.
/// let err = gn.forward(&ctx, &Tensor::zeros(&ctx, &[3, 6, 5])?).unwrap_err();
/// assert!(err.to_string().contains("GroupNorm(num_groups = 2, num_channels = 4)"));
/// # Ok::<(), fucina::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct GroupNorm {
    /// The per-channel scale, `[C]` (ones; absent when not affine).
    pub weight: Option<Parameter>,
    /// The per-channel shift, `[C]` (zeros; absent when not affine).
    pub bias: Option<Parameter>,
    num_groups: usize,
    num_channels: usize,
    eps: f32,
}

impl GroupNorm {
    /// `num_groups` groups over `num_channels` channels with PyTorch's
    /// defaults: `eps = 1e-5`, affine (weight ones, bias zeros).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero count or a `num_groups` that does
    /// not divide `num_channels`; out of memory.
    pub fn new(ctx: &ExecContext, num_groups: usize, num_channels: usize) -> Result<GroupNorm> {
        GroupNorm::with_options(ctx, num_groups, num_channels, 1e-5, true)
    }

    /// The same layer with `eps` and, when `affine` is false, no parameters
    /// (PyTorch's `affine=False`: the normalized values themselves).
    ///
    /// # Errors
    /// As [`new`](GroupNorm::new); [`Error::InvalidArgument`] for a negative,
    /// infinite or NaN `eps`.
    pub fn with_options(
        ctx: &ExecContext,
        num_groups: usize,
        num_channels: usize,
        eps: f32,
        affine: bool,
    ) -> Result<GroupNorm> {
        const WHAT: &str = "GroupNorm::new";
        check_size(WHAT, "num_groups", num_groups)?;
        check_size(WHAT, "num_channels", num_channels)?;
        if !num_channels.is_multiple_of(num_groups) {
            return Err(Error::invalid(
                WHAT,
                format!(
                    "num_channels ({num_channels}) must be divisible by num_groups ({num_groups})"
                ),
            ));
        }
        check_eps(WHAT, eps)?;
        let (weight, bias) = if affine {
            (
                Some(Parameter::new(Tensor::ones(ctx, &[num_channels])?)),
                Some(Parameter::new(Tensor::zeros(ctx, &[num_channels])?)),
            )
        } else {
            (None, None)
        };
        Ok(GroupNorm {
            weight,
            bias,
            num_groups,
            num_channels,
            eps,
        })
    }

    /// The number of groups.
    pub fn num_groups(&self) -> usize {
        self.num_groups
    }

    /// The number of channels `C`.
    pub fn num_channels(&self) -> usize {
        self.num_channels
    }

    /// `eps`.
    pub fn eps(&self) -> f32 {
        self.eps
    }

    /// Whether the layer was built with a weight and a bias.
    pub fn is_affine(&self) -> bool {
        self.weight.is_some()
    }

    /// Normalizes `x` (`[N, C, *]`, rank at least 2).
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] if `x` has rank below 2 or not `C` channels
    /// (axis 1).
    pub fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        let s = x.shape();
        if s.len() < 2 || s[1] != self.num_channels {
            return Err(Error::ShapeMismatch {
                layer: format!(
                    "GroupNorm(num_groups = {}, num_channels = {})",
                    self.num_groups, self.num_channels
                ),
                got: s.to_vec(),
                reason: format!(
                    "the input must be [N, C, ...] with {} channels",
                    self.num_channels
                ),
            });
        }
        let w = self.weight.as_ref().map(Parameter::tensor);
        let b = self.bias.as_ref().map(Parameter::tensor);
        let opts = GroupNormOptions {
            num_groups: self.num_groups,
            eps: self.eps,
        };
        Ok(x.group_norm(ctx, w.as_ref(), b.as_ref(), opts)?)
    }
}

impl Module for GroupNorm {
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        [("weight", &self.weight), ("bias", &self.bias)]
            .into_iter()
            .filter_map(|(n, p)| p.as_ref().map(|p| (n.to_string(), p.clone())))
            .collect()
    }
}

impl Forward for GroupNorm {
    fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        GroupNorm::forward(self, ctx, x)
    }
}

/// Refuses an `eps` that the normalization ops would refuse on every call
/// (negative, infinite or NaN), so a layer is never built unusable.
pub(super) fn check_eps(what: &'static str, eps: f32) -> Result<()> {
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(Error::invalid(
            what,
            format!("eps must be finite and >= 0 (got {eps})"),
        ));
    }
    Ok(())
}

/// Inverted dropout with probability `p` in training mode, the identity in
/// evaluation mode.
///
/// The mask of each call is a pure function of `(seed, step)`, where `step`
/// counts the layer's training-mode calls: the `k`-th call uses the mask seed
/// [`fucina::rng::at(seed, k)`](crate::rng::at). Store [`step`](Dropout::step) with a checkpoint and
/// restore it with [`set_step`](Dropout::set_step), and a resumed run draws the
/// same masks, bit for bit, as an uninterrupted one.
#[derive(Debug)]
pub struct Dropout {
    p: f32,
    seed: u64,
    step: AtomicU64,
    training: bool,
}

impl Clone for Dropout {
    fn clone(&self) -> Dropout {
        Dropout {
            p: self.p,
            seed: self.seed,
            step: AtomicU64::new(self.step()),
            training: self.training,
        }
    }
}

impl Dropout {
    /// Dropout with probability `p` and mask seed `seed`, in training mode.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `0 <= p < 1`.
    pub fn new(p: f32, seed: u64) -> Result<Dropout> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::invalid(
                "Dropout::new",
                format!("p must be in [0, 1) (got {p})"),
            ));
        }
        Ok(Dropout {
            p,
            seed,
            step: AtomicU64::new(0),
            training: true,
        })
    }

    /// The number of training-mode calls so far (the next call's mask index).
    pub fn step(&self) -> u64 {
        self.step.load(Ordering::Relaxed)
    }

    /// Sets the mask index of the next call (to resume a run).
    pub fn set_step(&self, step: u64) {
        self.step.store(step, Ordering::Relaxed);
    }

    /// Whether the layer is in training mode.
    pub fn is_training(&self) -> bool {
        self.training
    }

    /// The probability of dropping an element (in training mode).
    pub fn p(&self) -> f32 {
        self.p
    }

    /// Whether [`forward`](Dropout::forward) passes its input through now
    /// (evaluation mode, or `p == 0`).
    pub fn passes_through(&self) -> bool {
        !self.training || self.p == 0.0
    }

    /// Applies dropout (training mode) or passes `x` through (evaluation mode, or
    /// `p == 0`).
    ///
    /// # Errors
    /// Out of memory.
    pub fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        if self.passes_through() {
            return Ok(x.clone());
        }
        let k = self.step.fetch_add(1, Ordering::Relaxed);
        Ok(x.dropout(ctx, self.p, fucina_rng::at(self.seed, k))?)
    }
}

impl Module for Dropout {
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        Vec::new()
    }

    fn train(&mut self, training: bool) {
        self.training = training;
    }
}

impl Forward for Dropout {
    fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        Dropout::forward(self, ctx, x)
    }
}

macro_rules! activation {
    ($($(#[$doc:meta])* $name:ident => $op:ident;)*) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $name;

        impl Module for $name {
            fn named_parameters(&self) -> Vec<(String, Parameter)> {
                Vec::new()
            }
        }

        impl Forward for $name {
            fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
                Ok(x.$op(ctx)?)
            }
        }
    )*};
}

activation! {
    /// `max(x, 0)` as a layer.
    Relu => relu;
    /// GELU (tanh approximation) as a layer.
    Gelu => gelu;
    /// `tanh(x)` as a layer.
    Tanh => tanh;
    /// The logistic function as a layer (PyTorch's `nn.Sigmoid`).
    Sigmoid => sigmoid;
    /// SiLU `x * sigmoid(x)` as a layer (PyTorch's `nn.SiLU`).
    Silu => silu;
    /// Softplus `ln(1 + e^x)`, linear above 20, as a layer (PyTorch's
    /// `nn.Softplus()` with its defaults `beta = 1`, `threshold = 20`).
    Softplus => softplus;
    /// `ln(sigmoid(x))` as a layer (PyTorch's `nn.LogSigmoid`).
    LogSigmoid => logsigmoid;
    /// Mish `x * tanh(softplus(x))` as a layer (PyTorch's `nn.Mish`).
    Mish => mish;
    /// Hard swish `x * relu6(x + 3) / 6` as a layer (PyTorch's `nn.Hardswish`).
    Hardswish => hardswish;
}
