//! `attention`: the fused multi-head scaled dot-product attention with its
//! gradient (the core of `nn::MultiheadAttention` without masks).

use fucina_exec::ExecContext;

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
        let (out, probs) = ctx.attention(&self.raw, &k.raw, &v.raw, heads, scale)?;
        let (q, k_raw, v_raw) = (self.raw.clone(), k.raw.clone(), v.raw.clone());
        // Four saved tensors do not fit a node's `Saved` (768 bytes): a VJP
        // closure in a recycled slot (no allocation after warm-up).
        Tensor::finish_boxed(
            ctx,
            "attention",
            out,
            &[self, k, v],
            move |ctx, g, needs| {
                let (dq, dk, dv) =
                    ctx.attention_backward(&q, &k_raw, &v_raw, &probs, g, heads, scale)?;
                Ok(grads![
                    needs[0].then_some(dq),
                    needs[1].then_some(dk),
                    needs[2].then_some(dv)
                ])
            },
        )
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
        let (out, probs) = ctx.attention_packed(&self.raw, heads, scale)?;
        let qkv = self.raw.clone();
        record!(
            ctx,
            "attention_packed",
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
