//! [`TransformerEncoderLayer`] and [`TransformerDecoderLayer`]: PyTorch's
//! `nn.TransformerEncoderLayer` and `nn.TransformerDecoderLayer` (post-norm
//! by default, pre-norm with `norm_first`), built on [`MultiheadAttention`],
//! [`Linear`], [`LayerNorm`] and [`Dropout`] with PyTorch's parameter names.

use fucina_autograd::Tensor;
use fucina_exec::ExecContext;

use super::{
    AttentionOptions, Dropout, Forward, LayerNorm, Linear, Module, MultiheadAttention, Parameter,
    check_size, prefixed, sub_seed,
};
use crate::error::{Error, Result};

/// The feed-forward activation of the transformer layers (PyTorch's
/// `activation="relu"` or `"gelu"`, the exact erf form).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TransformerActivation {
    /// `max(x, 0)` (PyTorch's default).
    #[default]
    Relu,
    /// The exact GELU `0.5 x (1 + erf(x / sqrt 2))` (PyTorch's `F.gelu`).
    Gelu,
}

/// The options of the transformer layers: PyTorch's keyword arguments and
/// their defaults (`dim_feedforward = 2048`, `dropout = 0.1`, ReLU,
/// `layer_norm_eps = 1e-5`, `batch_first = false`, `norm_first = false`,
/// `bias = true`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TransformerOptions {
    /// The hidden width of the feed-forward block.
    pub dim_feedforward: usize,
    /// The dropout probability of the attention weights (inside each
    /// [`MultiheadAttention`]), after the attention blocks, inside and after
    /// the feed-forward block, as in PyTorch (training mode only).
    pub dropout: f32,
    /// The feed-forward activation.
    pub activation: TransformerActivation,
    /// The layer norms' `eps`.
    pub layer_norm_eps: f32,
    /// Inputs `[N, L, E]` (`true`) or `[L, N, E]` (`false`, PyTorch's default).
    pub batch_first: bool,
    /// Pre-norm (`x + block(norm(x))`) instead of post-norm
    /// (`norm(x + block(x))`, PyTorch's default).
    pub norm_first: bool,
    /// Biases in the attention projections, the feed-forward linears and the
    /// layer norms (`false`: none anywhere, PyTorch's `bias=False`).
    pub bias: bool,
}

impl Default for TransformerOptions {
    fn default() -> TransformerOptions {
        TransformerOptions {
            dim_feedforward: 2048,
            dropout: 0.1,
            activation: TransformerActivation::Relu,
            layer_norm_eps: 1e-5,
            batch_first: false,
            norm_first: false,
            bias: true,
        }
    }
}

/// The parts every transformer layer has: the self-attention, the
/// feed-forward block, their norms and dropouts.
#[derive(Debug, Clone)]
struct Core {
    self_attn: MultiheadAttention,
    linear1: Linear,
    linear2: Linear,
    /// The norms in PyTorch's order (`norm1`, `norm2`, and `norm3` for the
    /// decoder).
    norms: Vec<LayerNorm>,
    /// `dropout` (inside the feed-forward block), then `dropout1`,
    /// `dropout2` (and `dropout3`).
    dropouts: Vec<Dropout>,
    opts: TransformerOptions,
}

impl Core {
    fn new(
        ctx: &ExecContext,
        what: &'static str,
        d_model: usize,
        nhead: usize,
        opts: TransformerOptions,
        seed: u64,
        blocks: usize,
    ) -> Result<Core> {
        check_size(what, "d_model", d_model)?;
        check_size(what, "nhead", nhead)?;
        check_size(what, "dim_feedforward", opts.dim_feedforward)?;
        if !(0.0..1.0).contains(&opts.dropout) {
            return Err(Error::invalid(
                what,
                format!("dropout must be in [0, 1) (got {})", opts.dropout),
            ));
        }
        let linear = |i, o, s| {
            if opts.bias {
                Linear::new(ctx, i, o, sub_seed(seed, s))
            } else {
                Linear::no_bias(ctx, i, o, sub_seed(seed, s))
            }
        };
        let mut norms = Vec::with_capacity(blocks);
        let mut dropouts = Vec::with_capacity(blocks + 1);
        for k in 0..blocks {
            norms.push(if opts.bias {
                LayerNorm::new(ctx, d_model, opts.layer_norm_eps)?
            } else {
                LayerNorm::no_bias(ctx, d_model, opts.layer_norm_eps)?
            });
            dropouts.push(Dropout::new(opts.dropout, sub_seed(seed, 10 + k as u64))?);
        }
        dropouts.push(Dropout::new(opts.dropout, sub_seed(seed, 9))?);
        Ok(Core {
            self_attn: attention(ctx, d_model, nhead, opts, sub_seed(seed, 0))?,
            linear1: linear(d_model, opts.dim_feedforward, 2)?,
            linear2: linear(opts.dim_feedforward, d_model, 3)?,
            norms,
            dropouts,
            opts,
        })
    }

    /// `x` must be 3-D with `E` features (the attention checks the rest).
    fn check(&self, layer: &str, x: &Tensor) -> Result<()> {
        let e = self.self_attn.embed_dim();
        if x.shape().len() != 3 || x.shape()[2] != e {
            return Err(Error::ShapeMismatch {
                layer: format!("{layer}(d_model = {e})"),
                got: x.shape().to_vec(),
                reason: if self.opts.batch_first {
                    format!("the input must be [N, L, {e}]")
                } else {
                    format!("the input must be [L, N, {e}]")
                },
            });
        }
        Ok(())
    }

    /// `dropout_k(x)` (`k` from 1; `k = 0` is the feed-forward's inner one).
    fn drop(&self, ctx: &ExecContext, k: usize, x: &Tensor) -> Result<Tensor> {
        let d = if k == 0 {
            self.dropouts.last()
        } else {
            self.dropouts.get(k - 1)
        };
        d.expect("a dropout per block").forward(ctx, x)
    }

    /// The feed-forward block: `dropout2(linear2(dropout(act(linear1(x)))))`
    /// (`dropout3` in the decoder: `k`).
    fn feed_forward(&self, ctx: &ExecContext, x: &Tensor, k: usize) -> Result<Tensor> {
        let h = self.linear1.forward(ctx, x)?;
        let h = match self.opts.activation {
            TransformerActivation::Relu => h.relu(ctx)?,
            TransformerActivation::Gelu => h.gelu_erf(ctx)?,
        };
        let h = self.linear2.forward(ctx, &self.drop(ctx, 0, &h)?)?;
        self.drop(ctx, k, &h)
    }

    /// One residual block `k` (from 1): pre-norm `x + f(norm_k(x))` or
    /// post-norm `norm_k(x + f(x))`.
    fn residual(
        &self,
        ctx: &ExecContext,
        x: &Tensor,
        k: usize,
        f: impl FnOnce(&Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let norm = &self.norms[k - 1];
        if self.opts.norm_first {
            Ok(x.add(ctx, &f(&norm.forward(ctx, x)?)?)?)
        } else {
            norm.forward(ctx, &x.add(ctx, &f(x)?)?)
        }
    }

    /// The self-attention block `k`: `dropout_k(self_attn(x, x, x))`.
    fn self_attention(
        &self,
        ctx: &ExecContext,
        x: &Tensor,
        opts: AttentionOptions<'_>,
        k: usize,
    ) -> Result<Tensor> {
        let opts = AttentionOptions {
            need_weights: false,
            ..opts
        };
        let y = self.self_attn.forward(ctx, x, x, x, opts)?.0;
        self.drop(ctx, k, &y)
    }

    fn named_parameters(
        &self,
        extra: Option<(&str, &MultiheadAttention)>,
    ) -> Vec<(String, Parameter)> {
        let mut v = prefixed("self_attn", self.self_attn.named_parameters());
        if let Some((name, m)) = extra {
            v.extend(prefixed(name, m.named_parameters()));
        }
        v.extend(prefixed("linear1", self.linear1.named_parameters()));
        v.extend(prefixed("linear2", self.linear2.named_parameters()));
        for (k, n) in self.norms.iter().enumerate() {
            v.extend(prefixed(&format!("norm{}", k + 1), n.named_parameters()));
        }
        v
    }

    fn train(&mut self, training: bool) {
        self.self_attn.train(training);
        for d in &mut self.dropouts {
            d.train(training);
        }
    }
}

/// The attention of a transformer layer: biases and the weights' dropout
/// from `opts`.
fn attention(
    ctx: &ExecContext,
    d_model: usize,
    nhead: usize,
    opts: TransformerOptions,
    seed: u64,
) -> Result<MultiheadAttention> {
    MultiheadAttention::new(ctx, d_model, nhead, opts.bias, opts.batch_first, seed)?
        .with_dropout(opts.dropout)
}

/// PyTorch's `nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward,
/// dropout, activation, layer_norm_eps, batch_first, norm_first, bias)`:
/// self-attention and a feed-forward block, each with a residual connection
/// and a layer norm, after (post-norm, the default) or before (`norm_first`)
/// the block:
///
/// ```text
/// post-norm: x = norm1(x + sa(x));        x = norm2(x + ff(x))
/// pre-norm:  x = x + sa(norm1(x));        x = x + ff(norm2(x))
/// sa(x) = dropout1(self_attn(x, x, x)),   ff(x) = dropout2(linear2(dropout(act(linear1(x)))))
/// ```
///
/// Parameters under PyTorch's names (`self_attn.in_proj_weight`, ...,
/// `linear1.weight`, `linear2.bias`, `norm1.weight`, `norm2.bias`), so a
/// PyTorch state dict loads by name. The dropouts act in training mode only
/// ([`Module::train`]), the attention weights' dropout among them, as in
/// PyTorch; with `bias: false` no projection, linear or norm has a bias (nor
/// its parameter name).
///
/// ```
/// use fucina::nn::{Forward, TransformerEncoderLayer, TransformerOptions};
/// use fucina::{ExecContext, Tensor};
///
/// let ctx = ExecContext::new();
/// let opts = TransformerOptions { dim_feedforward: 32, batch_first: true, ..Default::default() };
/// let layer = TransformerEncoderLayer::new(&ctx, 16, 4, opts, 1)?;
/// let x = Tensor::uniform(&ctx, &[2, 5, 16], -1.0, 1.0, 2)?; // [N, L, E]
/// assert_eq!(layer.forward(&ctx, &x)?.shape(), [2, 5, 16]);
/// # Ok::<(), fucina::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct TransformerEncoderLayer {
    core: Core,
}

impl TransformerEncoderLayer {
    /// A layer of width `d_model` with `nhead` heads (dividing `d_model`),
    /// parameters drawn from `seed` with PyTorch's initializations.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero size, a width the heads do not
    /// divide, a dropout outside `[0, 1)` or a bad `layer_norm_eps`; out of
    /// memory.
    pub fn new(
        ctx: &ExecContext,
        d_model: usize,
        nhead: usize,
        opts: TransformerOptions,
        seed: u64,
    ) -> Result<TransformerEncoderLayer> {
        let what = "TransformerEncoderLayer::new";
        Ok(TransformerEncoderLayer {
            core: Core::new(ctx, what, d_model, nhead, opts, seed, 2)?,
        })
    }

    /// The options.
    pub fn options(&self) -> TransformerOptions {
        self.core.opts
    }

    /// The self-attention.
    pub fn self_attn(&self) -> &MultiheadAttention {
        &self.core.self_attn
    }

    /// The layer over `src` with the self-attention's masks in `masks`
    /// (`key_padding_mask`: PyTorch's `src_key_padding_mask`, `attn_mask`:
    /// its `src_mask`; the weights are never returned).
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] naming the layer for an input that is not
    /// 3-D with `d_model` features; the attention's errors (a mask of the
    /// wrong shape).
    pub fn forward_with(
        &self,
        ctx: &ExecContext,
        src: &Tensor,
        masks: AttentionOptions<'_>,
    ) -> Result<Tensor> {
        let c = &self.core;
        c.check("TransformerEncoderLayer", src)?;
        let x = c.residual(ctx, src, 1, |h| c.self_attention(ctx, h, masks, 1))?;
        c.residual(ctx, &x, 2, |h| c.feed_forward(ctx, h, 2))
    }
}

impl Module for TransformerEncoderLayer {
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        self.core.named_parameters(None)
    }

    fn train(&mut self, training: bool) {
        self.core.train(training);
    }
}

/// The layer without masks.
impl Forward for TransformerEncoderLayer {
    fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        self.forward_with(ctx, x, AttentionOptions::default())
    }
}

/// PyTorch's `nn.TransformerDecoderLayer`: self-attention over the target,
/// cross-attention to the encoder's output (`memory`) and a feed-forward
/// block, each with a residual connection and a layer norm (post-norm by
/// default, pre-norm with `norm_first`):
///
/// ```text
/// post-norm: x = norm1(x + sa(x));  x = norm2(x + mha(x, mem));  x = norm3(x + ff(x))
/// pre-norm:  x = x + sa(norm1(x));  x = x + mha(norm2(x), mem);  x = x + ff(norm3(x))
/// mha(x, mem) = dropout2(multihead_attn(x, mem, mem)),  ff ends in dropout3
/// ```
///
/// Parameters under PyTorch's names (`self_attn.*`, `multihead_attn.*`,
/// `linear1.*`, `linear2.*`, `norm1.*` to `norm3.*`).
///
/// ```
/// use fucina::nn::{AttentionOptions, TransformerDecoderLayer, TransformerOptions};
/// use fucina::{ExecContext, Tensor};
///
/// let ctx = ExecContext::new();
/// let opts = TransformerOptions { dim_feedforward: 32, norm_first: true, ..Default::default() };
/// let layer = TransformerDecoderLayer::new(&ctx, 8, 2, opts, 1)?;
/// let tgt = Tensor::uniform(&ctx, &[4, 3, 8], -1.0, 1.0, 2)?; // [T, N, E]
/// let memory = Tensor::uniform(&ctx, &[6, 3, 8], -1.0, 1.0, 3)?; // [S, N, E]
/// // A causal mask on the target's self-attention.
/// let causal: Vec<bool> = (0..16).map(|i| i % 4 > i / 4).collect();
/// let causal = ctx.from_slice_typed::<bool>(&[4, 4], &causal)?;
/// let tgt_masks = AttentionOptions {
///     attn_mask: Some(fucina::nn::AttnMask::Bool(&causal)),
///     ..Default::default()
/// };
/// let y = layer.forward(&ctx, &tgt, &memory, tgt_masks, AttentionOptions::default())?;
/// assert_eq!(y.shape(), [4, 3, 8]);
/// # Ok::<(), fucina::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct TransformerDecoderLayer {
    core: Core,
    multihead_attn: MultiheadAttention,
}

impl TransformerDecoderLayer {
    /// A layer of width `d_model` with `nhead` heads, parameters drawn from
    /// `seed` with PyTorch's initializations.
    ///
    /// # Errors
    /// As [`TransformerEncoderLayer::new`].
    pub fn new(
        ctx: &ExecContext,
        d_model: usize,
        nhead: usize,
        opts: TransformerOptions,
        seed: u64,
    ) -> Result<TransformerDecoderLayer> {
        let what = "TransformerDecoderLayer::new";
        let core = Core::new(ctx, what, d_model, nhead, opts, seed, 3)?;
        let multihead_attn = attention(ctx, d_model, nhead, opts, sub_seed(seed, 1))?;
        Ok(TransformerDecoderLayer {
            core,
            multihead_attn,
        })
    }

    /// The options.
    pub fn options(&self) -> TransformerOptions {
        self.core.opts
    }

    /// The layer over `tgt` attending to `memory`: `tgt_masks` are the
    /// self-attention's (PyTorch's `tgt_mask`, `tgt_key_padding_mask`),
    /// `memory_masks` the cross-attention's (`memory_mask`,
    /// `memory_key_padding_mask`); the weights are never returned.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] naming the layer for a `tgt` or `memory`
    /// that is not 3-D with `d_model` features; the attentions' errors
    /// (batches that differ, a mask of the wrong shape).
    pub fn forward(
        &self,
        ctx: &ExecContext,
        tgt: &Tensor,
        memory: &Tensor,
        tgt_masks: AttentionOptions<'_>,
        memory_masks: AttentionOptions<'_>,
    ) -> Result<Tensor> {
        let c = &self.core;
        c.check("TransformerDecoderLayer", tgt)?;
        c.check("TransformerDecoderLayer", memory)?;
        let x = c.residual(ctx, tgt, 1, |h| c.self_attention(ctx, h, tgt_masks, 1))?;
        let cross = AttentionOptions {
            need_weights: false,
            ..memory_masks
        };
        let x = c.residual(ctx, &x, 2, |h| {
            let y = self
                .multihead_attn
                .forward(ctx, h, memory, memory, cross)?
                .0;
            c.drop(ctx, 2, &y)
        })?;
        c.residual(ctx, &x, 3, |h| c.feed_forward(ctx, h, 3))
    }
}

impl Module for TransformerDecoderLayer {
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        self.core
            .named_parameters(Some(("multihead_attn", &self.multihead_attn)))
    }

    fn train(&mut self, training: bool) {
        self.core.train(training);
        self.multihead_attn.train(training);
    }
}
