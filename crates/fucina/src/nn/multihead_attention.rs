//! [`MultiheadAttention`]: PyTorch's `nn.MultiheadAttention` (self- and
//! cross-attention, key-padding and attention masks, the attention weights
//! on request): without an attention mask, weights or dropout on the fused
//! op `attention` (`attention_packed` for self-attention; their `_masked`
//! forms with a key-padding mask), else built from the differentiable ops.

use fucina_autograd::Tensor;
use fucina_exec::{ExecContext, RawTensor};

use super::{Dropout, Forward, Linear, Module, Parameter, check_size, sub_seed};
use crate::error::{Error, Result};

/// An attention mask (PyTorch's `attn_mask`), `[L, S]` for every sample and
/// head or `[N * heads, L, S]` for each: `Bool` marks the query-key pairs
/// that may not attend (`true`: the score becomes `-inf`), `Additive` adds
/// its values to the scores (`-inf` forbids, other values bias).
#[derive(Clone, Copy, Debug)]
pub enum AttnMask<'a> {
    /// `true` where attention is not allowed.
    Bool(&'a RawTensor<bool>),
    /// Added to the scaled scores before the softmax.
    Additive(&'a Tensor),
}

/// The optional arguments of [`MultiheadAttention::forward`] (PyTorch's
/// keyword arguments). `Default` is PyTorch's: no masks, the weights
/// returned, averaged over the heads.
#[derive(Clone, Copy, Debug)]
pub struct AttentionOptions<'a> {
    /// `[N, S]`: `true` for the keys each sample ignores (its padding).
    pub key_padding_mask: Option<&'a RawTensor<bool>>,
    /// See [`AttnMask`].
    pub attn_mask: Option<AttnMask<'a>>,
    /// Whether to return the attention weights.
    pub need_weights: bool,
    /// Whether the returned weights are averaged over the heads (`[N, L,
    /// S]`) or per head (`[N, heads, L, S]`).
    pub average_attn_weights: bool,
}

impl Default for AttentionOptions<'_> {
    fn default() -> Self {
        AttentionOptions {
            key_padding_mask: None,
            attn_mask: None,
            need_weights: true,
            average_attn_weights: true,
        }
    }
}

/// Multi-head attention, PyTorch's `nn.MultiheadAttention(embed_dim,
/// num_heads, bias, batch_first)`: the query, key and value projections in
/// one `in_proj_weight` (`[3 * E, E]`, rows `q`, `k`, `v`; xavier-uniform
/// init) and `in_proj_bias` (`[3 * E]`, zeros), the heads' scaled
/// dot-product attention (`softmax(q kᵀ / sqrt(E / heads) + masks) v`) and
/// `out_proj` (`Linear(E, E)`, its bias zeros), so a PyTorch state dict
/// loads by name (`in_proj_weight`, `in_proj_bias`, `out_proj.weight`,
/// `out_proj.bias`). Inputs are `[L, N, E]` (`[N, L, E]` with
/// `batch_first`). PyTorch's `dropout` on the attention weights is
/// [`with_dropout`](MultiheadAttention::with_dropout) (off by default, as in
/// PyTorch; training mode only). Not supported: `kdim`/`vdim` other than
/// `E`, `add_bias_kv`, `add_zero_attn`, a float key-padding mask.
///
/// ```
/// use fucina::nn::{AttentionOptions, MultiheadAttention};
/// use fucina::{ExecContext, Tensor};
///
/// let ctx = ExecContext::new();
/// let mha = MultiheadAttention::new(&ctx, 8, 2, true, true, 1)?;
/// let x = Tensor::uniform(&ctx, &[3, 5, 8], -1.0, 1.0, 2)?; // [N, L, E]
/// let memory = Tensor::uniform(&ctx, &[3, 7, 8], -1.0, 1.0, 3)?; // [N, S, E]
/// // Cross-attention; sample 0 ignores its last two keys.
/// let mut pad = vec![false; 3 * 7];
/// pad[5] = true;
/// pad[6] = true;
/// let pad = ctx.from_slice_typed::<bool>(&[3, 7], &pad)?;
/// let opts = AttentionOptions { key_padding_mask: Some(&pad), ..Default::default() };
/// let (y, w) = mha.forward(&ctx, &x, &memory, &memory, opts)?;
/// assert_eq!(y.shape(), [3, 5, 8]);
/// let w = w.expect("need_weights");
/// assert_eq!(w.shape(), [3, 5, 7]);
/// assert_eq!(w.to_vec()[5..7], [0.0, 0.0]);
/// # Ok::<(), fucina::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct MultiheadAttention {
    /// `[3 * E, E]`: the query, key and value projections' weights.
    pub in_proj_weight: Parameter,
    /// `[3 * E]` (absent without biases).
    pub in_proj_bias: Option<Parameter>,
    /// The output projection, `E -> E`.
    pub out_proj: Linear,
    /// The dropout of the attention weights (`p = 0` unless set).
    dropout: Dropout,
    seed: u64,
    embed: usize,
    heads: usize,
    batch_first: bool,
}

impl MultiheadAttention {
    /// Attention of width `embed_dim` with `num_heads` heads (dividing
    /// `embed_dim`), with biases or not, batch-first or sequence-first
    /// inputs, parameters drawn from `seed`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero size or a width the heads do
    /// not divide; out of memory.
    pub fn new(
        ctx: &ExecContext,
        embed_dim: usize,
        num_heads: usize,
        bias: bool,
        batch_first: bool,
        seed: u64,
    ) -> Result<MultiheadAttention> {
        let what = "MultiheadAttention::new";
        check_size(what, "embed_dim", embed_dim)?;
        check_size(what, "num_heads", num_heads)?;
        if !embed_dim.is_multiple_of(num_heads) {
            return Err(Error::invalid(
                what,
                format!("embed_dim = {embed_dim} is not divisible by num_heads = {num_heads}"),
            ));
        }
        // xavier_uniform_: U(±sqrt(6 / (fan_in + fan_out))), fan_in = E,
        // fan_out = 3E.
        let b = (6.0 / (4 * embed_dim) as f64).sqrt() as f32;
        let w = Tensor::uniform(ctx, &[3 * embed_dim, embed_dim], -b, b, sub_seed(seed, 0))?;
        let out_proj = if bias {
            let mut l = Linear::new(ctx, embed_dim, embed_dim, sub_seed(seed, 1))?;
            l.bias = Some(Parameter::new(Tensor::zeros(ctx, &[embed_dim])?));
            l
        } else {
            Linear::no_bias(ctx, embed_dim, embed_dim, sub_seed(seed, 1))?
        };
        let in_proj_bias = if bias {
            Some(Parameter::new(Tensor::zeros(ctx, &[3 * embed_dim])?))
        } else {
            None
        };
        Ok(MultiheadAttention {
            in_proj_weight: Parameter::new(w),
            in_proj_bias,
            out_proj,
            dropout: Dropout::new(0.0, sub_seed(seed, 2))?,
            seed,
            embed: embed_dim,
            heads: num_heads,
            batch_first,
        })
    }

    /// The layer with dropout of probability `p` on the attention weights
    /// (PyTorch's `dropout` argument): in training mode each call draws a
    /// new mask of the softmax's output from the layer's seed and a call
    /// counter (the same bits for any thread count; see [`Dropout`]), scales
    /// the kept weights by `1 / (1 - p)`, and returns the dropped weights
    /// with `need_weights`, as PyTorch does. Evaluation mode
    /// ([`Module::train`]`(false)`) passes the weights through.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `0 <= p < 1`.
    pub fn with_dropout(mut self, p: f32) -> Result<MultiheadAttention> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::invalid(
                "MultiheadAttention::with_dropout",
                format!("dropout must be in [0, 1) (got {p})"),
            ));
        }
        let training = self.dropout.is_training();
        let mut d = Dropout::new(p, sub_seed(self.seed, 2))?;
        d.train(training);
        d.set_step(self.dropout.step());
        self.dropout = d;
        Ok(self)
    }

    /// The dropout of the attention weights (its probability, mode and call
    /// counter, which a checkpoint stores to resume the same masks).
    pub fn attn_dropout(&self) -> &Dropout {
        &self.dropout
    }

    /// The width `E`.
    pub fn embed_dim(&self) -> usize {
        self.embed
    }

    /// The number of heads.
    pub fn num_heads(&self) -> usize {
        self.heads
    }

    /// Whether inputs and outputs are `[N, L, E]`.
    pub fn batch_first(&self) -> bool {
        self.batch_first
    }

    fn describe(&self) -> String {
        format!(
            "MultiheadAttention(embed_dim = {}, num_heads = {}, batch_first = {})",
            self.embed, self.heads, self.batch_first
        )
    }

    fn mismatch(&self, got: &[usize], reason: String) -> Error {
        Error::ShapeMismatch {
            layer: self.describe(),
            got: got.to_vec(),
            reason,
        }
    }

    /// `(N, L, S)` from the inputs' shapes, or the error naming the misfit.
    fn check_inputs(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<[usize; 3]> {
        let layout = if self.batch_first {
            "[batch, length, embed]"
        } else {
            "[length, batch, embed]"
        };
        for (name, t) in [("query", q), ("key", k), ("value", v)] {
            let s = t.shape();
            if s.len() != 3 || s[2] != self.embed {
                return Err(self.mismatch(
                    s,
                    format!(
                        "the {name} must be 3-D {layout} with {} features",
                        self.embed
                    ),
                ));
            }
        }
        if k.shape() != v.shape() {
            return Err(self.mismatch(
                v.shape(),
                format!("the value must have the key's shape {:?}", k.shape()),
            ));
        }
        let (bq, bk) = if self.batch_first { (0, 0) } else { (1, 1) };
        if q.shape()[bq] != k.shape()[bk] {
            return Err(self.mismatch(
                k.shape(),
                format!("the key's batch must be the query's ({})", q.shape()[bq]),
            ));
        }
        let (l, s) = if self.batch_first {
            (q.shape()[1], k.shape()[1])
        } else {
            (q.shape()[0], k.shape()[0])
        };
        Ok([q.shape()[bq], l, s])
    }

    /// `x` (`[N, T, E]` after the layout) projected by rows `part * E..` of
    /// the in-projection: `[N, T, E]`, the heads `E / heads` consecutive
    /// features each.
    fn in_proj(&self, ctx: &ExecContext, x: &Tensor, part: usize) -> Result<Tensor> {
        let e = self.embed;
        let w = self.in_proj_weight.tensor().narrow(ctx, 0, part * e, e)?;
        let b = match &self.in_proj_bias {
            Some(b) => Some(b.tensor().narrow(ctx, 0, part * e, e)?),
            None => None,
        };
        Ok(x.linear(ctx, &w, b.as_ref())?)
    }

    /// [`in_proj`](Self::in_proj) split into heads: `[N, heads, T, E /
    /// heads]`.
    fn project(&self, ctx: &ExecContext, x: &Tensor, part: usize) -> Result<Tensor> {
        let (n, t) = (x.shape()[0], x.shape()[1]);
        Ok(self
            .in_proj(ctx, x, part)?
            .reshape(ctx, &[n, t, self.heads, self.embed / self.heads])?
            .permute(ctx, &[0, 2, 1, 3])?)
    }

    /// The scores `[N, heads, L, S]` with the masks applied.
    fn masked(
        &self,
        ctx: &ExecContext,
        scores: Tensor,
        [n, l, s]: [usize; 3],
        opts: &AttentionOptions<'_>,
    ) -> Result<Tensor> {
        let h = self.heads;
        let mut scores = scores;
        if let Some(m) = opts.attn_mask {
            let shape = match m {
                AttnMask::Bool(t) => t.shape().to_vec(),
                AttnMask::Additive(t) => t.shape().to_vec(),
            };
            let full = if shape == [l, s] {
                vec![1, 1, l, s]
            } else if shape == [n * h, l, s] {
                vec![n, h, l, s]
            } else {
                return Err(self.mismatch(
                    &shape,
                    format!(
                        "the attention mask must be [L, S] = [{l}, {s}] or [N * heads, L, S] = [{}, {l}, {s}]",
                        n * h
                    ),
                ));
            };
            scores = match m {
                AttnMask::Bool(t) => {
                    let t = ctx.contiguous(t)?.reshape(&full)?;
                    scores.masked_fill(ctx, &t, f32::NEG_INFINITY)?
                }
                AttnMask::Additive(t) => scores.add(ctx, &t.reshape(ctx, &full)?)?,
            };
        }
        if let Some(m) = opts.key_padding_mask {
            if m.shape() != [n, s] {
                return Err(self.mismatch(
                    m.shape(),
                    format!("the key padding mask must be [N, S] = [{n}, {s}]"),
                ));
            }
            let m = ctx.contiguous(m)?.reshape(&[n, 1, 1, s])?;
            scores = scores.masked_fill(ctx, &m, f32::NEG_INFINITY)?;
        }
        Ok(scores)
    }

    /// Attends from `query` (`[L, N, E]`, or `[N, L, E]` batch-first) to
    /// `key` and `value` (`[S, N, E]`, or `[N, S, E]`) with the masks of
    /// `opts`. Returns the output (the query's shape) and, with
    /// `need_weights`, the attention weights (`[N, L, S]` averaged over the
    /// heads, or `[N, heads, L, S]`). A query whose keys are all masked gets
    /// NaN, as in PyTorch.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] naming the layer for inputs that are not 3-D
    /// with `E` features, a value whose shape is not the key's, batches that
    /// differ, or a mask of the wrong shape; the ops' errors.
    pub fn forward(
        &self,
        ctx: &ExecContext,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        opts: AttentionOptions<'_>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let sizes = self.check_inputs(query, key, value)?;
        let [n, l, _] = sizes;
        let first = |t: &Tensor| -> Result<Tensor> {
            if self.batch_first {
                Ok(t.clone())
            } else {
                Ok(t.transpose(ctx, 0, 1)?.materialize(ctx)?)
            }
        };
        let hd = self.embed / self.heads;
        let fused = opts.attn_mask.is_none() && !opts.need_weights && self.dropout.passes_through();
        if fused {
            // No attention mask, no weights to return, no dropout: the fused
            // op on the projections' `[N, T, E]` layout, no head copies; a
            // key-padding mask goes into it.
            let [_, _, s] = sizes;
            if let Some(m) = opts.key_padding_mask
                && m.shape() != [n, s]
            {
                return Err(self.mismatch(
                    m.shape(),
                    format!("the key padding mask must be [N, S] = [{n}, {s}]"),
                ));
            }
            let scale = 1.0 / (hd as f32).sqrt();
            let pad = opts.key_padding_mask;
            let y = if std::ptr::eq(query, key) && std::ptr::eq(key, value) {
                // Self-attention: one projection by the whole `[3E, E]`
                // weight (the same bits as the three narrowed ones).
                let bias = self.in_proj_bias.as_ref().map(|b| b.tensor());
                let qkv =
                    first(query)?.linear(ctx, &self.in_proj_weight.tensor(), bias.as_ref())?;
                match pad {
                    None => qkv.attention_packed(ctx, self.heads, scale)?,
                    Some(m) => qkv.attention_packed_masked(ctx, m, self.heads, scale)?,
                }
            } else {
                let q = self.in_proj(ctx, &first(query)?, 0)?;
                let k = self.in_proj(ctx, &first(key)?, 1)?;
                let v = self.in_proj(ctx, &first(value)?, 2)?;
                match pad {
                    None => q.attention(ctx, &k, &v, self.heads, scale)?,
                    Some(m) => q.attention_masked(ctx, &k, &v, m, self.heads, scale)?,
                }
            };
            let y = self.out_proj.forward(ctx, &y)?;
            let y = if self.batch_first {
                y
            } else {
                y.transpose(ctx, 0, 1)?.materialize(ctx)?
            };
            return Ok((y, None));
        }
        // The scale on `q` (`[N, heads, L, E / heads]`), not on the scores
        // (`[N, heads, L, S]`, `S / (E / heads)` times larger), as PyTorch's
        // math path does; it also leaves `q` contiguous for the product.
        let q = self
            .project(ctx, &first(query)?, 0)?
            .scale(ctx, 1.0 / (hd as f32).sqrt())?;
        let k = self.project(ctx, &first(key)?, 1)?;
        let v = self.project(ctx, &first(value)?, 2)?;
        let scores = q.matmul(ctx, &k.transpose(ctx, 2, 3)?)?;
        let att = self.masked(ctx, scores, sizes, &opts)?.softmax(ctx, 3)?;
        let att = self.dropout.forward(ctx, &att)?;
        let y = att
            .matmul(ctx, &v)?
            .permute(ctx, &[0, 2, 1, 3])?
            .reshape(ctx, &[n, l, self.embed])?;
        let y = self.out_proj.forward(ctx, &y)?;
        let y = if self.batch_first {
            y
        } else {
            y.transpose(ctx, 0, 1)?.materialize(ctx)?
        };
        let w = match (opts.need_weights, opts.average_attn_weights) {
            (false, _) => None,
            (true, true) => Some(att.mean(ctx, 1, false)?),
            (true, false) => Some(att),
        };
        Ok((y, w))
    }
}

impl Module for MultiheadAttention {
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        let mut v = vec![("in_proj_weight".to_string(), self.in_proj_weight.clone())];
        if let Some(b) = &self.in_proj_bias {
            v.push(("in_proj_bias".to_string(), b.clone()));
        }
        v.push(("out_proj.weight".to_string(), self.out_proj.weight.clone()));
        if let Some(b) = &self.out_proj.bias {
            v.push(("out_proj.bias".to_string(), b.clone()));
        }
        v
    }

    fn train(&mut self, training: bool) {
        self.dropout.train(training);
    }
}

/// Self-attention without masks, the output alone.
impl Forward for MultiheadAttention {
    fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        let opts = AttentionOptions {
            need_weights: false,
            ..Default::default()
        };
        Ok(MultiheadAttention::forward(self, ctx, x, x, x, opts)?.0)
    }
}
