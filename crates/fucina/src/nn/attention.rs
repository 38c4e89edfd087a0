//! A small transformer: multi-head causal self-attention and a pre-norm block.

use fucina_autograd::Tensor;
use fucina_exec::{ExecContext, RawTensor};
use parking_lot::Mutex;

use super::{
    Dropout, Forward, LayerNorm, Linear, Module, Parameter, check_size, prefixed, sub_seed,
};
use crate::error::{Error, Result};

/// Multi-head causal self-attention over `[batch, time, d_model]`: one `qkv`
/// projection to `3 * d_model`, scaled dot-product attention per head with a
/// causal mask (position `i` attends to positions `<= i`), softmax, and an
/// output projection `proj`.
#[derive(Debug)]
pub struct CausalSelfAttention {
    /// The joint query/key/value projection, `d_model -> 3 * d_model`.
    pub qkv: Linear,
    /// The output projection, `d_model -> d_model`.
    pub proj: Linear,
    heads: usize,
    d_model: usize,
    /// The causal mask of the last sequence length (true above the diagonal).
    mask: Mutex<Option<RawTensor<bool>>>,
}

impl CausalSelfAttention {
    /// Attention of width `d_model` with `heads` heads (`d_model` divisible by
    /// `heads`), weights from `seed`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero size or a width the heads do not
    /// divide; out of memory.
    pub fn new(
        ctx: &ExecContext,
        d_model: usize,
        heads: usize,
        seed: u64,
    ) -> Result<CausalSelfAttention> {
        check_size("CausalSelfAttention::new", "d_model", d_model)?;
        check_size("CausalSelfAttention::new", "heads", heads)?;
        if !d_model.is_multiple_of(heads) {
            return Err(Error::invalid(
                "CausalSelfAttention::new",
                format!("d_model = {d_model} is not divisible by heads = {heads}"),
            ));
        }
        Ok(CausalSelfAttention {
            qkv: Linear::new(ctx, d_model, 3 * d_model, sub_seed(seed, 0))?,
            proj: Linear::new(ctx, d_model, d_model, sub_seed(seed, 1))?,
            heads,
            d_model,
            mask: Mutex::new(None),
        })
    }

    /// The causal mask for `t` positions (cached for the last `t`).
    fn causal_mask(&self, ctx: &ExecContext, t: usize) -> Result<RawTensor<bool>> {
        let mut cached = self.mask.lock();
        if let Some(m) = cached.as_ref()
            && m.shape() == [t, t]
        {
            return Ok(m.clone());
        }
        let values: Vec<bool> = (0..t * t).map(|k| k % t > k / t).collect();
        let m = ctx.from_slice_typed::<bool>(&[t, t], &values)?;
        *cached = Some(m.clone());
        Ok(m)
    }

    /// Applies attention to `x` of shape `[batch, time, d_model]`.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] unless `x` is `[batch, time, d_model]`.
    pub fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        let shape = x.shape();
        if shape.len() != 3 || shape[2] != self.d_model {
            return Err(Error::ShapeMismatch {
                layer: format!(
                    "CausalSelfAttention(d_model = {}, heads = {})",
                    self.d_model, self.heads
                ),
                got: shape.to_vec(),
                reason: format!("expected [batch, time, {}]", self.d_model),
            });
        }
        let (b, t, d) = (shape[0], shape[1], shape[2]);
        let (h, hd) = (self.heads, d / self.heads);
        let qkv = self.qkv.forward(ctx, x)?; // [b, t, 3d]
        let head = |i: usize| -> Result<Tensor> {
            Ok(qkv
                .narrow(ctx, 2, i * d, d)?
                .reshape(ctx, &[b, t, h, hd])?
                .permute(ctx, &[0, 2, 1, 3])?) // [b, h, t, hd]
        };
        let (q, k, v) = (head(0)?, head(1)?, head(2)?);
        let scores = q
            .matmul(ctx, &k.transpose(ctx, 2, 3)?)?
            .scale(ctx, 1.0 / (hd as f32).sqrt())?; // [b, h, t, t]
        let mask = self.causal_mask(ctx, t)?;
        let att = scores
            .masked_fill(ctx, &mask, f32::NEG_INFINITY)?
            .softmax(ctx, 3)?;
        let y = att
            .matmul(ctx, &v)? // [b, h, t, hd]
            .permute(ctx, &[0, 2, 1, 3])?
            .reshape(ctx, &[b, t, d])?;
        self.proj.forward(ctx, &y)
    }
}

impl Module for CausalSelfAttention {
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        let mut v = prefixed("qkv", self.qkv.named_parameters());
        v.extend(prefixed("proj", self.proj.named_parameters()));
        v
    }
}

impl Forward for CausalSelfAttention {
    fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        CausalSelfAttention::forward(self, ctx, x)
    }
}

/// The position-wise MLP of a block: `fc` to `4 * d_model`, GELU, `proj` back.
#[derive(Debug, Clone)]
pub struct Mlp {
    /// `d_model -> 4 * d_model`.
    pub fc: Linear,
    /// `4 * d_model -> d_model`.
    pub proj: Linear,
}

impl Mlp {
    /// An MLP of width `d_model` (hidden `4 * d_model`).
    ///
    /// # Errors
    /// As [`Linear::new`].
    pub fn new(ctx: &ExecContext, d_model: usize, seed: u64) -> Result<Mlp> {
        Ok(Mlp {
            fc: Linear::new(ctx, d_model, 4 * d_model, sub_seed(seed, 0))?,
            proj: Linear::new(ctx, 4 * d_model, d_model, sub_seed(seed, 1))?,
        })
    }
}

impl Module for Mlp {
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        let mut v = prefixed("fc", self.fc.named_parameters());
        v.extend(prefixed("proj", self.proj.named_parameters()));
        v
    }
}

impl Forward for Mlp {
    fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        let h = self.fc.forward(ctx, x)?.gelu(ctx)?;
        self.proj.forward(ctx, &h)
    }
}

/// A pre-norm transformer block:
/// `x + drop(attn(ln1(x)))`, then `x + drop(mlp(ln2(x)))`.
#[derive(Debug)]
pub struct Block {
    /// The norm before attention.
    pub ln1: LayerNorm,
    /// The attention.
    pub attn: CausalSelfAttention,
    /// The norm before the MLP.
    pub ln2: LayerNorm,
    /// The MLP.
    pub mlp: Mlp,
    /// Dropout on both residual branches (`p = 0`: none).
    pub dropout: Dropout,
}

impl Block {
    /// A block of width `d_model` with `heads` heads and residual dropout `p`,
    /// weights and dropout masks from `seed`.
    ///
    /// # Errors
    /// As [`CausalSelfAttention::new`] and [`Dropout::new`].
    pub fn new(
        ctx: &ExecContext,
        d_model: usize,
        heads: usize,
        p: f32,
        seed: u64,
    ) -> Result<Block> {
        Ok(Block {
            ln1: LayerNorm::new(ctx, d_model, 1e-5)?,
            attn: CausalSelfAttention::new(ctx, d_model, heads, sub_seed(seed, 0))?,
            ln2: LayerNorm::new(ctx, d_model, 1e-5)?,
            mlp: Mlp::new(ctx, d_model, sub_seed(seed, 1))?,
            dropout: Dropout::new(p, sub_seed(seed, 2))?,
        })
    }

    /// Applies the block to `[batch, time, d_model]`.
    ///
    /// # Errors
    /// As [`CausalSelfAttention::forward`].
    pub fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        let a = self.attn.forward(ctx, &self.ln1.forward(ctx, x)?)?;
        let x = x.add(ctx, &self.dropout.forward(ctx, &a)?)?;
        let m = self.mlp.forward(ctx, &self.ln2.forward(ctx, &x)?)?;
        Ok(x.add(ctx, &self.dropout.forward(ctx, &m)?)?)
    }
}

impl Module for Block {
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        let mut v = prefixed("ln1", self.ln1.named_parameters());
        v.extend(prefixed("attn", self.attn.named_parameters()));
        v.extend(prefixed("ln2", self.ln2.named_parameters()));
        v.extend(prefixed("mlp", self.mlp.named_parameters()));
        v
    }

    fn train(&mut self, training: bool) {
        self.dropout.train(training);
    }
}

impl Forward for Block {
    fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        Block::forward(self, ctx, x)
    }
}
