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
        let (qr, kr, vr) = (self.raw.clone(), k.raw.clone(), v.raw.clone());
        record!(
            ctx,
            "attention",
            out,
            &[self, k, v],
            Attention {
                q: qr,
                k: kr,
                v: vr,
                probs,
                heads,
                scale,
            },
            |ctx, g, needs| {
                let (dq, dk, dv) = ctx.attention_backward(q, k, v, probs, g, *heads, *scale)?;
                Ok(grads![
                    needs[0].then_some(dq),
                    needs[1].then_some(dk),
                    needs[2].then_some(dv)
                ])
            }
        )
    }
}
