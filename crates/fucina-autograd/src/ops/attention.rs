//! `attention`: the fused multi-head scaled dot-product attention with its
//! gradient (the core of `nn::MultiheadAttention` without masks).

use fucina_exec::{ExecContext, RawTensor};

use crate::error::Result;
use crate::record::{grads, record};
use crate::tensor::Tensor;

impl Tensor {
    /// Multi-head scaled dot-product attention from `self` (the queries,
    /// `[N, L, E]`) to `k` and `v` (`[N, S, E]`), each row holding `heads`
    /// heads of `E / heads` consecutive features (a linear projection's
    /// output): head `h` of each output row is `softmax(scale · q_h k_hᵀ)
    /// v_h`, the output `[N, L, E]` in the same layout. One node records the
    /// gradients of `self`, `k` and `v`; it keeps the attention weights
    /// (`[N, heads, L, S]`) for the backward. See [`ExecContext::attention`].
    ///
    /// ```
    /// use fucina_autograd::Tensor;
    /// use fucina_autograd::exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let q = Tensor::randn(&ctx, &[2, 5, 8], 1.0, 1)?.into_variable();
    /// let kv = Tensor::randn(&ctx, &[2, 7, 8], 1.0, 2)?.into_variable();
    /// let y = q.attention(&ctx, &kv, &kv, 2, 0.5)?; // 2 heads of 4 features
    /// assert_eq!(y.shape(), [2, 5, 8]);
    /// y.sum_all(&ctx)?.backward(&ctx)?;
    /// assert_eq!(kv.grad(&ctx)?.expect("a variable").shape(), [2, 7, 8]);
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// As [`ExecContext::attention`]: operands not 3-D, batches or features
    /// that differ, `heads` not dividing `E`, a scale that is not finite;
    /// out of memory.
    pub fn attention(
        &self,
        ctx: &ExecContext,
        k: &Tensor,
        v: &Tensor,
        heads: usize,
        scale: f32,
    ) -> Result<Tensor> {
        self.attention_with(ctx, k, v, None, heads, scale)
    }

    /// [`attention`](Tensor::attention) with PyTorch's boolean key-padding
    /// mask `key_padding` (`[N, S]`, `true` for the keys a sample ignores):
    /// their weights are zero, and no gradient flows through them. See
    /// [`ExecContext::attention_masked`].
    ///
    /// ```
    /// use fucina_autograd::Tensor;
    /// use fucina_autograd::exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let q = Tensor::randn(&ctx, &[2, 5, 8], 1.0, 1)?.into_variable();
    /// let kv = Tensor::randn(&ctx, &[2, 7, 8], 1.0, 2)?.into_variable();
    /// let mut flags = [false; 14];
    /// flags[6] = true; // sample 0 ignores its last key
    /// let pad = ctx.from_slice_typed::<bool>(&[2, 7], &flags)?;
    /// let y = q.attention_masked(&ctx, &kv, &kv, &pad, 2, 0.5)?;
    /// y.sum_all(&ctx)?.backward(&ctx)?;
    /// let g = kv.grad(&ctx)?.expect("a variable").to_vec();
    /// assert!(g[6 * 8..7 * 8].iter().all(|&v| v == 0.0));
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// As [`ExecContext::attention_masked`]: those of
    /// [`attention`](Tensor::attention) and a mask that is not `[N, S]`; out
    /// of memory.
    pub fn attention_masked(
        &self,
        ctx: &ExecContext,
        k: &Tensor,
        v: &Tensor,
        key_padding: &RawTensor<bool>,
        heads: usize,
        scale: f32,
    ) -> Result<Tensor> {
        self.attention_with(ctx, k, v, Some(key_padding), heads, scale)
    }

    /// [`attention`](Tensor::attention), masked or not.
    fn attention_with(
        &self,
        ctx: &ExecContext,
        k: &Tensor,
        v: &Tensor,
        key_padding: Option<&RawTensor<bool>>,
        heads: usize,
        scale: f32,
    ) -> Result<Tensor> {
        let (name, (out, probs)) = match key_padding {
            None => (
                "attention",
                ctx.attention(&self.raw, &k.raw, &v.raw, heads, scale)?,
            ),
            Some(m) => (
                "attention_masked",
                ctx.attention_masked(&self.raw, &k.raw, &v.raw, m, heads, scale)?,
            ),
        };
        let (q, k_raw, v_raw) = (self.raw.clone(), k.raw.clone(), v.raw.clone());
        // Four saved tensors do not fit a node's `Saved` (768 bytes): a VJP
        // closure in a recycled slot (no allocation after warm-up). The
        // weights' zeros carry a mask, so the backward is the unmasked one.
        Tensor::finish_boxed(ctx, name, out, &[self, k, v], move |ctx, g, needs| {
            let (dq, dk, dv) =
                ctx.attention_backward(&q, &k_raw, &v_raw, &probs, g, heads, scale)?;
            Ok(grads![
                needs[0].then_some(dq),
                needs[1].then_some(dk),
                needs[2].then_some(dv)
            ])
        })
    }

    /// [`attention`](Tensor::attention) of a sequence to itself from one
    /// packed operand `self` (`[N, L, 3E]`: each row its query, key and
    /// value side by side, the output of one projection by a stacked `[3E,
    /// E]` weight). One node records the packed gradient, so the projection
    /// runs one GEMM forward and one per gradient backward instead of three.
    /// See [`ExecContext::attention_packed`].
    ///
    /// ```
    /// use fucina_autograd::Tensor;
    /// use fucina_autograd::exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let qkv = Tensor::randn(&ctx, &[2, 5, 24], 1.0, 1)?.into_variable();
    /// let y = qkv.attention_packed(&ctx, 2, 0.5)?; // E = 8, 2 heads
    /// assert_eq!(y.shape(), [2, 5, 8]);
    /// y.sum_all(&ctx)?.backward(&ctx)?;
    /// assert_eq!(qkv.grad(&ctx)?.expect("a variable").shape(), [2, 5, 24]);
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// As [`ExecContext::attention_packed`]: `self` not 3-D or its last
    /// dimension not `3E`, `heads` not dividing `E`, a scale that is not
    /// finite; out of memory.
    pub fn attention_packed(&self, ctx: &ExecContext, heads: usize, scale: f32) -> Result<Tensor> {
        self.attention_packed_with(ctx, None, heads, scale)
    }

    /// [`attention_packed`](Tensor::attention_packed) with PyTorch's boolean
    /// key-padding mask `key_padding` (`[N, L]`: the keys are the rows), as
    /// in [`attention_masked`](Tensor::attention_masked). See
    /// [`ExecContext::attention_packed_masked`].
    ///
    /// # Errors
    /// As [`attention_packed`](Tensor::attention_packed), and a mask that is
    /// not `[N, L]`; out of memory.
    pub fn attention_packed_masked(
        &self,
        ctx: &ExecContext,
        key_padding: &RawTensor<bool>,
        heads: usize,
        scale: f32,
    ) -> Result<Tensor> {
        self.attention_packed_with(ctx, Some(key_padding), heads, scale)
    }

    /// [`attention_packed`](Tensor::attention_packed), masked or not.
    fn attention_packed_with(
        &self,
        ctx: &ExecContext,
        key_padding: Option<&RawTensor<bool>>,
        heads: usize,
        scale: f32,
    ) -> Result<Tensor> {
        let (name, (out, probs)) = match key_padding {
            None => (
                "attention_packed",
                ctx.attention_packed(&self.raw, heads, scale)?,
            ),
            Some(m) => (
                "attention_packed_masked",
                ctx.attention_packed_masked(&self.raw, m, heads, scale)?,
            ),
        };
        let qkv = self.raw.clone();
        record!(
            ctx,
            name,
            out,
            &[self],
            AttentionPacked {
                qkv,
                probs,
                heads,
                scale,
            },
            |ctx, g, _| Ok(grads![Some(
                ctx.attention_packed_backward(qkv, probs, g, *heads, *scale)?
            )])
        )
    }
}
