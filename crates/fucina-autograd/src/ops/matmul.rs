//! Matrix products.

use fucina_exec::{ExecContext, RawTensor};

use crate::error::Result;
use crate::node::{GradList, Saved, grads};
use crate::ops::sum_to;
use crate::tensor::Tensor;

impl Tensor {
    /// The (batched, broadcasting) matrix product `self · w`.
    ///
    /// # Errors
    /// Shape errors of the exec layer's `matmul`; out of memory.
    pub fn matmul(&self, ctx: &ExecContext, w: &Tensor) -> Result<Tensor> {
        let out = ctx.matmul(&self.raw, &w.raw)?;
        let saved = Saved::tensors([self.raw.clone(), w.raw.clone()]);
        Tensor::finish(ctx, "matmul", out, &[self, w], saved, |ctx, s, g, needs| {
            let (a, b) = (s.t(0), s.t(1));
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
        })
    }

    /// `self · wᵀ + bias` (PyTorch's `linear`: `w` is `[out, in]`, `bias` `[out]`).
    ///
    /// # Errors
    /// Shape errors of the exec layer's `linear`; out of memory.
    pub fn linear(&self, ctx: &ExecContext, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let out = ctx.linear(&self.raw, &w.raw, bias.map(|b| &b.raw))?;
        let saved = Saved::tensors([self.raw.clone(), w.raw.clone()]);
        match bias {
            Some(b) => Tensor::finish(ctx, "linear", out, &[self, w, b], saved, linear_vjp),
            None => Tensor::finish(ctx, "linear", out, &[self, w], saved, linear_vjp),
        }
    }
}

/// The VJP of `linear` (inputs `x`, `w` and optionally `bias`; saved `x`, `w`).
fn linear_vjp(ctx: &ExecContext, s: &Saved, g: &RawTensor, needs: &[bool]) -> Result<GradList> {
    let (x, wr) = (s.t(0), s.t(1));
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
