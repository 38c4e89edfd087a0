//! The fused recurrent cells `lstm_cell` and `gru_cell` (PyTorch's LSTM and
//! GRU cells from their gate pre-activations) and the sequence ops
//! `lstm_sequence` and `gru_sequence` (one direction of one layer over a whole
//! sequence, the layers' path) with their gradients.

use fucina_exec::{ExecContext, RawTensor};

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

    /// The flat weight of [`lstm_sequence`](Tensor::lstm_sequence) and
    /// [`gru_sequence`](Tensor::gru_sequence) from PyTorch's parameters of one
    /// layer and direction: `[G·H, I + H]` (`w_ih` `[G·H, I]` and `w_hh`
    /// `[G·H, H]` side by side) or, with `biases = Some((b_ih, b_hh))` (`[G·H]`
    /// each), `[G·H, I + H + 2]` with one column each. Differentiable (two
    /// `concat`s and a `stack`): the gradients reach the four parameters.
    ///
    /// # Errors
    /// The shape errors of `concat` and `stack` when the parameters' rows
    /// differ; out of memory.
    pub fn rnn_flat_weight(
        ctx: &ExecContext,
        w_ih: &Tensor,
        w_hh: &Tensor,
        biases: Option<(&Tensor, &Tensor)>,
    ) -> Result<Tensor> {
        match biases {
            Some((b_ih, b_hh)) => {
                let b = Tensor::stack(ctx, &[b_ih, b_hh], 1)?;
                Tensor::concat(ctx, &[w_ih, w_hh, &b], 1)
            }
            None => Tensor::concat(ctx, &[w_ih, w_hh], 1),
        }
    }

    /// PyTorch's LSTM over a whole sequence, one direction of one layer
    /// (what the `LSTM` layer of `fucina::nn` runs):
    /// `self` is `[T, B, I]`, `w` the flat weight of
    /// [`rnn_flat_weight`](Tensor::rnn_flat_weight) (`[4H, I + H (+ 2)]`),
    /// `state` the initial `[h_0; c_0]` (`[2, B, H]`); `reverse` runs the
    /// steps from the last to the first. Returns `[T + 1, B, H]`: rows `0..T`
    /// the state `h` after each time step, row `T` the final cell state. One
    /// node records the gradients of `self`, `w` and `state`; the forward has
    /// the bits of the step-by-step loop of `linear` and
    /// [`lstm_cell`](Tensor::lstm_cell). See [`ExecContext::lstm_sequence`].
    ///
    /// ```
    /// use fucina_autograd::Tensor;
    /// use fucina_autograd::exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = Tensor::randn(&ctx, &[5, 2, 3], 1.0, 1)?; // T 5, batch 2, 3 features
    /// let w_ih = Tensor::randn(&ctx, &[16, 3], 0.3, 2)?.into_variable(); // hidden 4
    /// let w_hh = Tensor::randn(&ctx, &[16, 4], 0.3, 3)?.into_variable();
    /// let w = Tensor::rnn_flat_weight(&ctx, &w_ih, &w_hh, None)?;
    /// let state = Tensor::zeros(&ctx, &[2, 2, 4])?;
    /// let out = x.lstm_sequence(&ctx, &w, &state, false)?;
    /// assert_eq!(out.shape(), [6, 2, 4]);
    /// out.sum_all(&ctx)?.backward(&ctx)?;
    /// assert_eq!(w_hh.grad(&ctx)?.expect("a variable").shape(), [16, 4]);
    /// # Ok::<(), fucina_autograd::AutogradError>(())
    /// ```
    ///
    /// # Errors
    /// As [`ExecContext::lstm_sequence`]: `self` not 3-D, `w` or `state` of
    /// the wrong shape; out of memory.
    pub fn lstm_sequence(
        &self,
        ctx: &ExecContext,
        w: &Tensor,
        state: &Tensor,
        reverse: bool,
    ) -> Result<Tensor> {
        let (out, saved) = ctx.lstm_sequence(&self.raw, &w.raw, &state.raw, reverse)?;
        self.record_sequence(ctx, "lstm_sequence", out, saved, w, state, true, reverse)
    }

    /// PyTorch's GRU over a whole sequence, one direction of one layer: as
    /// [`lstm_sequence`](Tensor::lstm_sequence) with the flat weight `[3H, I +
    /// H (+ 2)]` (gates `r, z, n`) and the initial state `h0` (`[B, H]`).
    /// Returns `[T, B, H]`, the state after each time step. One node records
    /// the gradients of `self`, `w` and `h0`. See
    /// [`ExecContext::gru_sequence`].
    ///
    /// # Errors
    /// As [`ExecContext::gru_sequence`]; out of memory.
    pub fn gru_sequence(
        &self,
        ctx: &ExecContext,
        w: &Tensor,
        h0: &Tensor,
        reverse: bool,
    ) -> Result<Tensor> {
        let (out, saved) = ctx.gru_sequence(&self.raw, &w.raw, &h0.raw, reverse)?;
        self.record_sequence(ctx, "gru_sequence", out, saved, w, h0, false, reverse)
    }

    /// Records a sequence op's node over `self`, `w` and `state`.
    #[allow(clippy::too_many_arguments)]
    fn record_sequence(
        &self,
        ctx: &ExecContext,
        name: &'static str,
        out: RawTensor,
        saved: RawTensor,
        w: &Tensor,
        state: &Tensor,
        lstm: bool,
        reverse: bool,
    ) -> Result<Tensor> {
        let wr = w.raw.clone();
        record!(
            ctx,
            name,
            out,
            &[self, w, state],
            RecurrentSequence {
                w: wr,
                saved,
                lstm,
                reverse,
            },
            |ctx, g, needs| {
                let (dx, dw, ds) = if *lstm {
                    ctx.lstm_sequence_backward(w, saved, g, *reverse)?
                } else {
                    ctx.gru_sequence_backward(w, saved, g, *reverse)?
                };
                Ok(grads![
                    needs[0].then_some(dx),
                    needs[1].then_some(dw),
                    needs[2].then_some(ds)
                ])
            }
        )
    }
}
