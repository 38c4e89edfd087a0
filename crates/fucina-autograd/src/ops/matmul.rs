//! Matrix products: one generic apply over the [`ProductOp`] descriptor, and the
//! named `matmul` / `linear` forwarding to it.

use fucina_exec::{ExecContext, MatmulOptions, ProductOp};

use crate::autocast::product_operands;
use crate::error::Result;
use crate::record::{grads, record};
use crate::tensor::Tensor;

impl Tensor {
    /// Applies the matrix product `op` to `self` and `w` (and `bias`, for
    /// [`ProductOp::Linear`]): the descriptor names the forward kernel, run now
    /// with the default [`MatmulOptions`], and the backward kernel, run by
    /// backward for the gradients asked for (`linear` skips `grad · w` when
    /// `self` needs no gradient). [`matmul`](Tensor::matmul) and
    /// [`linear`](Tensor::linear) are this with their variant. Inside an
    /// [`autocast_bf16`](crate::autocast_bf16) scope `self` and `w` (not the
    /// bias) are rounded to bf16 first, and the backward uses the rounded
    /// operands.
    ///
    /// ```
    /// use fucina_autograd::Tensor;
    /// use fucina_autograd::exec::{ExecContext, ProductOp};
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::variable_from_slice(&ctx, &[1, 2], &[1., 2.])?;
    /// let w = Tensor::variable_from_slice(&ctx, &[3, 2], &[1., 0., 0., 1., 1., 1.])?;
    /// let y = x.product(&ctx, ProductOp::Linear, &w, None)?;
    /// assert_eq!(y.to_vec(), x.linear(&ctx, &w, None)?.to_vec());
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// Shape errors of the exec layer's `matmul` / `linear`;
    /// [`ExecError::InvalidArgument`](fucina_exec::ExecError::InvalidArgument) for
    /// a bias given to `matmul`; out of memory.
    pub fn product(
        &self,
        ctx: &ExecContext,
        op: ProductOp,
        w: &Tensor,
        bias: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (a, b) = product_operands(ctx, &self.raw, &w.raw)?;
        let out = ctx.product(op, &a, &b, bias.map(|b| &b.raw), MatmulOptions::default())?;
        let inputs: &[&Tensor] = match bias {
            Some(bias) => &[self, w, bias],
            None => &[self, w],
        };
        record!(
            ctx,
            op.name(),
            out,
            inputs,
            Product { op, a, b },
            |ctx, g, needs| {
                let with_bias = needs.len() == 3;
                let asked = [needs[0], needs[1], with_bias && needs[2]];
                let [ga, gb, gbias] = ctx.product_backward(*op, a, b, g, asked)?;
                Ok(if with_bias {
                    grads![ga, gb, gbias]
                } else {
                    grads![ga, gb]
                })
            }
        )
    }

    /// The (batched, broadcasting) matrix product `self · w`.
    ///
    /// # Errors
    /// Shape errors of the exec layer's `matmul`; out of memory.
    pub fn matmul(&self, ctx: &ExecContext, w: &Tensor) -> Result<Tensor> {
        self.product(ctx, ProductOp::Matmul, w, None)
    }

    /// `self · wᵀ + bias` (PyTorch's `linear`: `w` is `[out, in]`, `bias` `[out]`).
    ///
    /// # Errors
    /// Shape errors of the exec layer's `linear`; out of memory.
    pub fn linear(&self, ctx: &ExecContext, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        self.product(ctx, ProductOp::Linear, w, bias)
    }
}
