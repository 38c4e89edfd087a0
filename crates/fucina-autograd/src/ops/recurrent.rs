//! The fused recurrent cells `lstm_cell` and `gru_cell` (PyTorch's LSTM and
//! GRU cells from their gate pre-activations) with their gradients.

use fucina_exec::ExecContext;

use crate::error::Result;
use crate::record::{grads, record};
use crate::tensor::Tensor;

impl Tensor {
    /// PyTorch's LSTM cell (`torch._VF.lstm_cell`, `nn.LSTMCell`) from its
    /// gate pre-activations: `self` is `x W_ihᵀ + b_ih` and `gh` is `h W_hhᵀ +
    /// b_hh` (`[B, 4H]` each, the blocks in PyTorch's order `i, f, g, o`), `c`
    /// the cell state (`[B, H]`). Returns `(h', c')` with `c' = σ(f) * c +
    /// σ(i) * tanh(g)` and `h' = σ(o) * tanh(c')` (each gate from the sum of
    /// its blocks). One fused node (output `[2, B, H]`, of which `h'` and
    /// `c'` are views) records the gradients of `self`, `gh` and `c`; its
    /// backward is one pass over what the forward kept. See
    /// [`ExecContext::lstm_cell`].
    ///
    /// ```
    /// use fucina_autograd::Tensor;
    /// use fucina_autograd::exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let gi = Tensor::zeros(&ctx, &[2, 12])?.into_variable(); // batch 2, hidden 3
    /// let gh = Tensor::zeros(&ctx, &[2, 12])?;
    /// let c = Tensor::ones(&ctx, &[2, 3])?;
    /// let (h1, c1) = gi.lstm_cell(&ctx, &gh, &c)?;
    /// assert_eq!(c1.to_vec(), [0.5; 6]); // σ(0) * 1 + σ(0) * tanh(0)
    /// h1.sum_all(&ctx)?.backward(&ctx)?;
    /// assert_eq!(gi.grad(&ctx)?.expect("a variable").shape(), [2, 12]);
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// As [`ExecContext::lstm_cell`]: gates not `[B, 4H]`, `gh` not of the
    /// same shape, `c` not `[B, H]`; out of memory.
    pub fn lstm_cell(
        &self,
        ctx: &ExecContext,
        gh: &Tensor,
        c: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let (out, saved) = ctx.lstm_cell(&self.raw, &gh.raw, &c.raw)?;
        let c_raw = c.raw.clone();
        let hc = record!(
            ctx,
            "lstm_cell",
            out,
            &[self, gh, c],
            LstmCell { saved, c: c_raw },
            |ctx, g, needs| {
                let (dg, dc) = ctx.lstm_cell_backward(saved, c, g)?;
                let (gi, gh) = (needs[0].then(|| dg.clone()), needs[1].then_some(dg));
                Ok(grads![gi, gh, needs[2].then_some(dc)])
            }
        )?;
        let h1 = hc.narrow(ctx, 0, 0, 1)?.squeeze(ctx, 0)?;
        let c1 = hc.narrow(ctx, 0, 1, 1)?.squeeze(ctx, 0)?;
        Ok((h1, c1))
    }

    /// PyTorch's GRU cell (`nn.GRUCell`) from its gate pre-activations:
    /// `self` is `x W_ihᵀ + b_ih` and `gh` is `h W_hhᵀ + b_hh` (`[B, 3H]`
    /// each, the blocks in PyTorch's order `r, z, n`), `h` the state (`[B,
    /// H]`). Returns `h' = (1 - z) * n + z * h` with `r = σ(·)`, `z = σ(·)`
    /// (each from the sum of its blocks) and `n = tanh(gi_n + r * gh_n)`.
    /// One fused node records the gradients of `self`, `gh` and `h`. See
    /// [`ExecContext::gru_cell`].
    ///
    /// ```
    /// use fucina_autograd::Tensor;
    /// use fucina_autograd::exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let gi = Tensor::zeros(&ctx, &[1, 6])?; // batch 1, hidden 2
    /// let gh = Tensor::zeros(&ctx, &[1, 6])?;
    /// let h = Tensor::from_slice(&ctx, &[1, 2], &[2., 4.])?.into_variable();
    /// let h1 = gi.gru_cell(&ctx, &gh, &h)?;
    /// assert_eq!(h1.to_vec(), [1., 2.]); // z = 0.5, n = 0
    /// h1.sum_all(&ctx)?.backward(&ctx)?;
    /// assert_eq!(h.grad(&ctx)?.expect("a variable").to_vec(), [0.5, 0.5]);
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// As [`ExecContext::gru_cell`]: gates not `[B, 3H]`, `gh` not of the
    /// same shape, `h` not `[B, H]`; out of memory.
    pub fn gru_cell(&self, ctx: &ExecContext, gh: &Tensor, h: &Tensor) -> Result<Tensor> {
        let (out, saved) = ctx.gru_cell(&self.raw, &gh.raw, &h.raw)?;
        let h_raw = h.raw.clone();
        record!(
            ctx,
            "gru_cell",
            out,
            &[self, gh, h],
            GruCell { saved, h: h_raw },
            |ctx, g, needs| {
                let (dgi, dgh, dh) = ctx.gru_cell_backward(saved, h, g)?;
                Ok(grads![
                    needs[0].then_some(dgi),
                    needs[1].then_some(dgh),
                    needs[2].then_some(dh)
                ])
            }
        )
    }
}
