//! Matrix products.

use fucina_exec::{ExecContext, RawTensor};

use crate::error::Result;
use crate::node::{GradList, grads, record};
use crate::ops::sum_to;
use crate::tensor::Tensor;

impl Tensor {
    /// The (batched, broadcasting) matrix product `self · w`.
    ///
    /// # Errors
    /// Shape errors of the exec layer's `matmul`; out of memory.
    pub fn matmul(&self, ctx: &ExecContext, w: &Tensor) -> Result<Tensor> {
        let out = ctx.matmul(&self.raw, &w.raw)?;
        let (a, b) = (self.raw.clone(), w.raw.clone());
        record!(
            ctx,
            "matmul",
            out,
            &[self, w],
            Operands { a, b },
            |ctx, g, needs| {
                let (ga, gb) = ctx.matmul_backward(a, b, g)?;
                Ok(grads![
                    if needs[0] {
                        Some(sum_to(ctx, &ga, a.shape())?)
                    } else {
                        None
                    },
                    if needs[1] {
                        Some(sum_to(ctx, &gb, b.shape())?)
                    } else {
                        None
                    },
                ])
            }
        )
    }

    /// `self · wᵀ + bias` (PyTorch's `linear`: `w` is `[out, in]`, `bias` `[out]`).
    ///
    /// # Errors
    /// Shape errors of the exec layer's `linear`; out of memory.
    pub fn linear(&self, ctx: &ExecContext, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let out = ctx.linear(&self.raw, &w.raw, bias.map(|b| &b.raw))?;
        let (a, b) = (self.raw.clone(), w.raw.clone());
        let inputs: &[&Tensor] = match bias {
            Some(bias) => &[self, w, bias],
            None => &[self, w],
        };
        record!(
            ctx,
            "linear",
            out,
            inputs,
            Operands { a, b },
            |ctx, g, needs| linear_vjp(ctx, a, b, g, needs)
        )
    }
}

/// The VJP of `linear` (inputs `x`, `w` and optionally `bias`; saved `x`, `w`).
/// The backward of `linear` over its input `x` and weight `wr` (a bias is an
/// input when `needs` has three entries).
fn linear_vjp(
    ctx: &ExecContext,
    x: &RawTensor,
    wr: &RawTensor,
    g: &RawTensor,
    needs: &[bool],
) -> Result<GradList> {
    let with_bias = needs.len() == 3;
    if !needs[0] {
        // The input needs no gradient (a first layer over data): skip
        // `grad · w`, the largest product of the three.
        let (gw, gb) = weight_grads(ctx, x, g, needs[1], with_bias && needs[2])?;
        return Ok(if with_bias {
            grads![None, gw, gb]
        } else {
            grads![None, gw]
        });
    }
    let (gx, gw, gb) = ctx.linear_backward(x, wr, g)?;
    let gb = (with_bias && needs[2]).then_some(gb);
    Ok(if needs.len() == 3 {
        grads![needs[0].then_some(gx), needs[1].then_some(gw), gb]
    } else {
        grads![needs[0].then_some(gx), needs[1].then_some(gw)]
    })
}

/// `gradᵀ · x` over all leading rows, and `grad` summed over the rows (each only
/// when wanted).
fn weight_grads(
    ctx: &ExecContext,
    x: &RawTensor,
    g: &RawTensor,
    want_w: bool,
    want_b: bool,
) -> Result<(Option<RawTensor>, Option<RawTensor>)> {
    let out = *g.shape().last().expect("rank >= 1");
    let inn = *x.shape().last().expect("rank >= 1");
    let rows = g.numel() / out;
    let g2 = ctx.contiguous(g)?.reshape(&[rows, out])?;
    let gw = if want_w {
        let x2 = ctx.contiguous(x)?.reshape(&[rows, inn])?;
        Some(ctx.matmul(&g2.transpose(0, 1)?, &x2)?)
    } else {
        None
    };
    let gb = if want_b {
        Some(ctx.sum(&g2, 0, false)?)
    } else {
        None
    };
    Ok((gw, gb))
}
