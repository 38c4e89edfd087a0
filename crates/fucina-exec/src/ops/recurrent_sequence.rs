//! The recurrent layers' sequence ops: `lstm_sequence` and `gru_sequence`
//! (one direction of one layer of PyTorch's `nn.LSTM` / `nn.GRU` over a whole
//! `[T, B, I]` sequence) and their backward kernels.
//!
//! **Weights.** One flat `[G·H, I + H (+ 2)]` matrix per layer and direction
//! (`G` gate blocks, 4 for the LSTM, 3 for the GRU): the columns hold
//! `W_ih` (`[G·H, I]`), `W_hh` (`[G·H, H]`) and, with biases, `b_ih` and
//! `b_hh` as one column each (the layout of cuDNN's flat weights, in
//! PyTorch's gate order).
//!
//! **Work.** The input's projection of every step is one GEMM
//! (`x[T·B, I] · W_ihᵀ + b_ih`); `W_hhᵀ` is packed once for the whole sequence
//! and each step runs its `[B, H] · [H, G·H]` product on the packed panels,
//! then the fused cell of `kernels/recurrent.rs`. The backward runs the steps
//! in the opposite order (cell backward, then `dgates · W_hh` for the previous
//! state on `W_hh` packed once) and ends with one GEMM each for the input's
//! gradient, `dW_ih` and `dW_hh` over all `T·B` rows (in increasing row
//! order), and the bias gradients summed over the rows in increasing order.
//! Scratch comes from the context's pool once per call: no allocation per
//! step.
//!
//! **Bits.** Every product is the GEMM's fused multiply-add chain over `k` in
//! increasing order, started from the bias (or `+0`), so the forward's values
//! are bitwise those of the step-by-step loop of `linear` and `lstm_cell` /
//! `gru_cell`; the gradients add the same terms in another order (within
//! float rounding of the loop's). Rows are split by the deterministic chunks
//! of the team, a row's result depends on that row alone: the same bits for
//! every team size, vector level and batch composition.

use fucina_storage::ScratchLease;

use crate::context::ExecContext;
use crate::error::ExecError;
use crate::kernels::recurrent as kern;
use crate::kernels::simd::vectorized;
use crate::ops::matmul::{PackedRhs, bias_grad};
use crate::ops::recurrent::CELL_WORK;
use crate::tensor::RawTensor;
use crate::tensor::layout::Dims;

/// The sizes of a sequence op: steps, batch, input features, hidden size,
/// gate blocks and whether the flat weight has its two bias columns.
#[derive(Clone, Copy)]
struct Seq {
    t: usize,
    b: usize,
    i: usize,
    h: usize,
    g: usize,
    bias: bool,
}

impl Seq {
    /// Columns of the flat weight.
    fn cols(self) -> usize {
        self.i + self.h + if self.bias { 2 } else { 0 }
    }
    /// The `W_ih` view `[G·H, I]` of the flat weight.
    fn w_ih(self, w: &RawTensor) -> Result<RawTensor, ExecError> {
        w.narrow(1, 0, self.i)
    }
    /// The `W_hh` view `[G·H, H]` of the flat weight.
    fn w_hh(self, w: &RawTensor) -> Result<RawTensor, ExecError> {
        w.narrow(1, self.i, self.h)
    }
    /// Bias column `k` (0: `b_ih`, 1: `b_hh`) as a `[G·H]` view.
    fn bias_col(self, w: &RawTensor, k: usize) -> Result<Option<RawTensor>, ExecError> {
        if !self.bias {
            return Ok(None);
        }
        Ok(Some(w.narrow(1, self.i + self.h + k, 1)?.squeeze(1)?))
    }
}

/// Checks the input `x` (`[T, B, I]`) and the flat weight `w` (`[G·H, I + H
/// (+ 2)]`); returns the sizes.
fn check_seq(op: &'static str, gates: usize, x: &[usize], w: &RawTensor) -> Result<Seq, ExecError> {
    let &[t, b, i] = x else {
        return Err(ExecError::InvalidShape {
            op,
            shape: Dims::new(x),
            reason: "the input must be [steps, batch, features]",
        });
    };
    let bad_w = |reason| ExecError::ShapeMismatch {
        op,
        lhs: w.dims(),
        rhs: Dims::new(x),
        reason,
    };
    let reason = if gates == 4 {
        "the flat weight must be [4 * hidden, features + hidden (+ 2 bias columns)]"
    } else {
        "the flat weight must be [3 * hidden, features + hidden (+ 2 bias columns)]"
    };
    let &[rows, cols] = w.shape() else {
        return Err(bad_w(reason));
    };
    if !rows.is_multiple_of(gates) {
        return Err(bad_w(reason));
    }
    let h = rows / gates;
    let bias = match cols.checked_sub(i + h) {
        Some(0) => false,
        Some(2) => true,
        _ => return Err(bad_w(reason)),
    };
    Ok(Seq {
        t,
        b,
        i,
        h,
        g: rows,
        bias,
    })
}

/// Checks that `got` has the shape `want`.
fn check_shape(
    op: &'static str,
    got: &RawTensor,
    want: &[usize],
    reason: &'static str,
) -> Result<(), ExecError> {
    if got.shape() == want {
        return Ok(());
    }
    Err(ExecError::ShapeMismatch {
        op,
        lhs: got.dims(),
        rhs: Dims::new(want),
        reason,
    })
}

/// The time index of processing step `s` of `t` (backwards when `reverse`).
fn time(s: usize, t: usize, reverse: bool) -> usize {
    if reverse { t - 1 - s } else { s }
}

/// Copies the input's rows (`i` floats each) into the last columns of the
/// saved rows (`at + i` floats each), where the backward's `dW_ih` reads them.
fn keep_input(saved: &mut [f32], at: usize, x: &[f32], i: usize) {
    for (row, xr) in saved.chunks_exact_mut(at + i).zip(x.chunks_exact(i)) {
        row[at..].copy_from_slice(xr);
    }
}

/// Splits a pool lease into consecutive mutable pieces of the given lengths.
fn pieces<const N: usize>(mut rest: &mut [f32], lens: [usize; N]) -> [&mut [f32]; N] {
    lens.map(|len| {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(len);
        rest = tail;
        head
    })
}

impl ExecContext {
    /// `len` floats of pool scratch for the steps of `op`.
    fn seq_scratch(&self, op: &'static str, len: usize) -> Result<ScratchLease<f32>, ExecError> {
        self.pool()
            .acquire_scratch::<f32>(len)
            .map_err(|e| ExecError::storage(op, e))
    }

    /// One state product of a step: `gh = h · W_hhᵀ + b_hh` on the packed
    /// `W_hhᵀ` (the chain started from the bias, as `linear`'s).
    fn state_gates(
        &self,
        op: &'static str,
        h: &[f32],
        packed: &PackedRhs,
        b_hh: Option<&[f32]>,
        gh: &mut [f32],
    ) -> Result<(), ExecError> {
        if let Some(bias) = b_hh {
            for row in gh.chunks_exact_mut(bias.len()) {
                row.copy_from_slice(bias);
            }
        }
        self.gemm_packed(op, h, packed, gh, b_hh.is_some())
    }

    /// The input projection of every step (`[T·B, G·H]`, one GEMM), the packed
    /// `W_hhᵀ` and the contiguous `b_hh` of a forward.
    fn seq_prologue(
        &self,
        op: &'static str,
        sz: Seq,
        x: &RawTensor,
        w: &RawTensor,
    ) -> Result<(RawTensor, RawTensor, PackedRhs, Option<RawTensor>), ExecError> {
        let x2 = self.contiguous(x)?.reshape(&[sz.t * sz.b, sz.i])?;
        let gi = self.linear(&x2, &sz.w_ih(w)?, sz.bias_col(w, 0)?.as_ref())?;
        let packed = self.pack_rhs_once(op, &sz.w_hh(w)?.transpose(0, 1)?)?;
        let b_hh = sz
            .bias_col(w, 1)?
            .map(|b| self.contiguous(&b))
            .transpose()?;
        Ok((x2, gi, packed, b_hh))
    }

    /// The checks and the common start of a backward: the sizes, the
    /// contiguous `saved` (`[T, B, keep·H]`) and `grad` (`[T + extra, B,
    /// H]`), and `W_hh` packed once as the right-hand side of `dgates · W_hh`.
    fn backward_prologue(
        &self,
        op: &'static str,
        gates: usize,
        [keep, extra]: [usize; 2],
        [w, saved, grad]: [&RawTensor; 3],
    ) -> Result<(Seq, RawTensor, RawTensor, PackedRhs), ExecError> {
        let why = "the saved tensor must be the forward's [steps, batch, k * hidden + features]";
        let bad = |reason| ExecError::ShapeMismatch {
            op,
            lhs: saved.dims(),
            rhs: w.dims(),
            reason,
        };
        let (&[t, b, width], &[rows, _]) = (saved.shape(), w.shape()) else {
            return Err(bad(why));
        };
        let i = width
            .checked_sub(keep * (rows / gates))
            .filter(|&i| i > 0)
            .ok_or_else(|| bad(why))?;
        let sz = check_seq(op, gates, &[t, b, i], w)?;
        let h = sz.h;
        check_shape(op, saved, &[t, b, keep * h + sz.i], why)?;
        let why = "the output gradient must have the shape of the forward's output";
        check_shape(op, grad, &[t + extra, b, h], why)?;
        let (sc, gc) = (self.contiguous(saved)?, self.contiguous(grad)?);
        let packed = self.pack_rhs_once(op, &sz.w_hh(w)?)?;
        Ok((sz, sc, gc, packed))
    }

    /// PyTorch's LSTM over a whole sequence, one direction of one layer:
    /// `x` is `[T, B, I]`, `w` the flat weight `[4H, I + H (+ 2)]` (`W_ih`,
    /// `W_hh`, then optionally the `b_ih` and `b_hh` columns; gates `i, f, g,
    /// o`), `state` the initial `[h_0; c_0]` (`[2, B, H]`). With `reverse` the
    /// steps run from `T - 1` down to 0. Every step is
    /// [`lstm_cell`](Self::lstm_cell) of `x_t W_ihᵀ + b_ih` and `h W_hhᵀ +
    /// b_hh`, with the same bits. Returns `(out, saved)`: `out` is `[T + 1, B,
    /// H]` (rows `0..T` the state `h` after each time step, row `T` the final
    /// cell state `c_n`; the final `h_n` is row `T - 1`, or row 0 with
    /// `reverse`), `saved` (`[T, B, 7H + I]`: the cell's five saved gates, the
    /// `c` and `h` it read, the input row) is what
    /// [`lstm_sequence_backward`](Self::lstm_sequence_backward) reads.
    ///
    /// ```
    /// use fucina_exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// // Two steps, batch 1, one feature, hidden 1, zero weights but the
    /// // input's g column: g = tanh(x), i = f = o = 0.5.
    /// let x = ctx.from_slice(&[2, 1, 1], &[1., 1.])?;
    /// let w = ctx.from_slice(&[4, 2], &[0., 0., 0., 0., 1., 0., 0., 0.])?;
    /// let state = ctx.zeros(&[2, 1, 1])?;
    /// let (out, _saved) = ctx.lstm_sequence(&x, &w, &state, false)?;
    /// assert_eq!(out.shape(), [3, 1, 1]);
    /// let c1 = 0.5 * 1f32.tanh();
    /// assert!((out.to_vec()[2] - (0.5 * c1 + c1)).abs() < 1e-6); // c_n
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`] if `x` is not 3-D;
    /// [`ExecError::ShapeMismatch`] if `w` is not `[4H, I + H]` or
    /// `[4H, I + H + 2]`, or `state` not `[2, B, H]`; [`ExecError::OutOfMemory`].
    pub fn lstm_sequence(
        &self,
        x: &RawTensor,
        w: &RawTensor,
        state: &RawTensor,
        reverse: bool,
    ) -> Result<(RawTensor, RawTensor), ExecError> {
        const OP: &str = "lstm_sequence";
        let sz = check_seq(OP, 4, x.shape(), w)?;
        let reason = "the state must be [2, batch, hidden] (h_0, then c_0)";
        check_shape(OP, state, &[2, sz.b, sz.h], reason)?;
        let (x2, gi, packed, b_hh) = self.seq_prologue(OP, sz, x, w)?;
        let st = self.contiguous(state)?;
        let (b, h) = (sz.b, sz.h);
        let mut lease = self.seq_scratch(OP, b * (sz.g + 3 * h))?;
        let [gh, hc, cc, cn] = pieces(&mut lease, [b * sz.g, b * h, b * h, b * h]);
        let (h0, c0) = st.contiguous_slice().split_at(b * h);
        hc.copy_from_slice(h0);
        cc.copy_from_slice(c0);
        let (mut saved, mut done) = (None, Ok(()));
        let out = self.new_tensor(OP, &[sz.t + 1, b, h], |out| {
            saved = Some(self.new_tensor(OP, &[sz.t, b, 7 * h + sz.i], |sv| {
                let bias = b_hh.as_ref().map(|t| t.contiguous_slice());
                let gis = gi.contiguous_slice();
                keep_input(sv, 7 * h, x2.contiguous_slice(), sz.i);
                let scratch = [gh, hc, cc, cn];
                done = self.lstm_steps(sz, reverse, gis, &packed, bias, scratch, out, sv);
            }));
        })?;
        done?;
        Ok((out, saved.expect("the output's fill ran")?))
    }

    /// The steps of [`lstm_sequence`](Self::lstm_sequence) after its
    /// prologue: `scratch` is `(gh, h, c, c_next)`, `h` and `c` holding the
    /// initial state; the final `c` lands in `out`'s last row.
    #[allow(clippy::too_many_arguments)]
    fn lstm_steps(
        &self,
        sz: Seq,
        reverse: bool,
        gis: &[f32],
        packed: &PackedRhs,
        b_hh: Option<&[f32]>,
        scratch: [&mut [f32]; 4],
        out: &mut [f32],
        sv: &mut [f32],
    ) -> Result<(), ExecError> {
        let [gh, hc, mut cc, mut cn] = scratch;
        const OP: &str = "lstm_sequence";
        let (b, h, g) = (sz.b, sz.h, sz.g);
        let (bh, s7) = (b * h, 7 * h + sz.i);
        for s in 0..sz.t {
            let tt = time(s, sz.t, reverse);
            self.state_gates(OP, hc, packed, b_hh, gh)?;
            let (gi_t, gh_t) = (&gis[tt * b * g..][..b * g], &*gh);
            let (h_prev, c_prev) = (&*hc, &*cc);
            let out_t = &mut out[tt * bh..][..bh];
            let sv_t = &mut sv[tt * b * s7..][..b * s7];
            self.par_rows3(
                (out_t, h),
                (&mut *cn, h),
                (sv_t, s7),
                h * CELL_WORK,
                |rows, ho, co, so| {
                    vectorized!({
                        let rows = rows.zip(ho.chunks_exact_mut(h));
                        for ((r, hr), (cr, sr)) in
                            rows.zip(co.chunks_exact_mut(h).zip(so.chunks_exact_mut(s7)))
                        {
                            let (act, keep) = sr.split_at_mut(5 * h);
                            let (cp, hp) = (&c_prev[r * h..][..h], &h_prev[r * h..][..h]);
                            keep[..h].copy_from_slice(cp);
                            keep[h..2 * h].copy_from_slice(hp);
                            let (gi, gh) = (&gi_t[r * g..][..g], &gh_t[r * g..][..g]);
                            kern::lstm_cell(gi, gh, cp, hr, cr, act);
                        }
                    })
                },
            );
            hc.copy_from_slice(&out[tt * bh..][..bh]);
            std::mem::swap(&mut cc, &mut cn);
        }
        out[sz.t * bh..].copy_from_slice(cc);
        Ok(())
    }

    /// The backward of [`lstm_sequence`](Self::lstm_sequence): from its flat
    /// weight `w`, its `saved` tensor (`[T, B, 7H + I]`) and the gradient of
    /// its output `grad` (`[T + 1, B, H]`: of every step's `h`, then of
    /// `c_n`), returns `(grad_x, grad_w, grad_state)` (`[T, B, I]`, `w`'s
    /// shape, `[2, B, H]`). The steps run in the opposite order of the
    /// forward's; `grad_x`, `dW_ih` and `dW_hh` are one GEMM each over the
    /// `T·B` rows of the gates' gradient, the bias columns its sums over the
    /// rows (the same for `b_ih` and `b_hh`).
    ///
    /// # Errors
    /// As [`lstm_sequence`](Self::lstm_sequence) for `w`;
    /// [`ExecError::ShapeMismatch`] if `saved` is not `[T, B, 7H + I]` or `grad`
    /// not `[T + 1, B, H]`; [`ExecError::OutOfMemory`].
    pub fn lstm_sequence_backward(
        &self,
        w: &RawTensor,
        saved: &RawTensor,
        grad: &RawTensor,
        reverse: bool,
    ) -> Result<(RawTensor, RawTensor, RawTensor), ExecError> {
        const OP: &str = "lstm_sequence_backward";
        let (sz, sc, gc, packed) = self.backward_prologue(OP, 4, [7, 1], [w, saved, grad])?;
        let (t, b, h, g) = (sz.t, sz.b, sz.h, sz.g);
        let (ss, dy) = (sc.contiguous_slice(), gc.contiguous_slice());
        let mut lease = self.seq_scratch(OP, 3 * b * h)?;
        let [dh, mut dc, mut dcn] = pieces(&mut lease, [b * h, b * h, b * h]);
        dh.fill(0.0);
        dc.copy_from_slice(&dy[t * b * h..]);
        let (mut done, bh, s7) = (Ok(()), b * h, 7 * h + sz.i);
        let dgates = self.new_tensor(OP, &[t * b, g], |dg| {
            done = (|| {
                for s in 0..t {
                    let tt = time(s, t, !reverse);
                    let (dy_t, sv_t) = (&dy[tt * bh..][..bh], &ss[tt * b * s7..][..b * s7]);
                    let dc_in = &*dc;
                    self.par_rows3(
                        (&mut dg[tt * b * g..][..b * g], g),
                        (&mut *dcn, h),
                        (&mut *dh, h),
                        h * CELL_WORK,
                        |rows, dgo, dco, dho| {
                            vectorized!({
                                let rows = rows.zip(dgo.chunks_exact_mut(g));
                                for ((r, dgr), (dcr, dhr)) in
                                    rows.zip(dco.chunks_exact_mut(h).zip(dho.chunks_exact_mut(h)))
                                {
                                    for (d, &y) in dhr.iter_mut().zip(&dy_t[r * h..][..h]) {
                                        *d += y;
                                    }
                                    let sr = &sv_t[r * s7..][..s7];
                                    let (act, cp) = (&sr[..5 * h], &sr[5 * h..6 * h]);
                                    let dci = &dc_in[r * h..][..h];
                                    kern::lstm_cell_backward(act, cp, dhr, dci, dgr, dcr);
                                }
                            })
                        },
                    );
                    self.gemm_packed(OP, &dg[tt * b * g..][..b * g], &packed, dh, false)?;
                    std::mem::swap(&mut dc, &mut dcn);
                }
                Ok(())
            })();
        })?;
        done?;
        let grad_state = self.new_tensor(OP, &[2, b, h], |st| {
            st[..bh].copy_from_slice(dh);
            st[bh..].copy_from_slice(dc);
        })?;
        let rows = sc.reshape(&[t * b, s7])?;
        let (hprev, x2) = (rows.narrow(1, 6 * h, h)?, rows.narrow(1, 7 * h, sz.i)?);
        let (gx, gw) = self.seq_weight_grads(OP, sz, &x2, w, [&dgates, &dgates], &hprev)?;
        Ok((gx, gw, grad_state))
    }

    /// The closing GEMMs of a backward: `grad_x = dgi · W_ih` (`[T, B, I]`)
    /// and the flat weight's gradient: `dW_ih = dgiᵀ · x`, `dW_hh = dghᵀ ·
    /// h_prev`, the bias columns the sums of `dgi` and `dgh` over the rows.
    fn seq_weight_grads(
        &self,
        op: &'static str,
        sz: Seq,
        x2: &RawTensor,
        w: &RawTensor,
        [dgi, dgh]: [&RawTensor; 2],
        hprev: &RawTensor,
    ) -> Result<(RawTensor, RawTensor), ExecError> {
        let (i, h, g) = (sz.i, sz.h, sz.g);
        let gx = self.matmul(dgi, &sz.w_ih(w)?)?.reshape(&[sz.t, sz.b, i])?;
        let dw_ih = self.matmul(&dgi.transpose(0, 1)?, x2)?;
        let dw_hh = self.matmul(&dgh.transpose(0, 1)?, hprev)?;
        let biases = if sz.bias {
            let bi = bias_grad(self, op, dgi)?;
            let bh = if std::ptr::eq(dgi, dgh) {
                bi.clone()
            } else {
                bias_grad(self, op, dgh)?
            };
            Some((bi, bh))
        } else {
            None
        };
        let cols = sz.cols();
        let (wi, wh) = (dw_ih.contiguous_slice(), dw_hh.contiguous_slice());
        let gw = self.new_tensor(op, &[g, cols], |gw| {
            for (r, row) in gw.chunks_exact_mut(cols).enumerate() {
                row[..i].copy_from_slice(&wi[r * i..][..i]);
                row[i..i + h].copy_from_slice(&wh[r * h..][..h]);
                if let Some((bi, bh)) = &biases {
                    row[i + h] = bi.contiguous_slice()[r];
                    row[i + h + 1] = bh.contiguous_slice()[r];
                }
            }
        })?;
        Ok((gx, gw))
    }

    /// PyTorch's GRU over a whole sequence, one direction of one layer: as
    /// [`lstm_sequence`](Self::lstm_sequence) with the flat weight `[3H, I + H
    /// (+ 2)]` (gates `r, z, n`) and the initial state `h_0` (`[B, H]`). Every
    /// step is [`gru_cell`](Self::gru_cell) of `x_t W_ihᵀ + b_ih` and
    /// `h W_hhᵀ + b_hh`, with the same bits. Returns `(out, saved)`: `out` is `[T, B,
    /// H]` (the state after each time step; `h_n` is row `T - 1`, or row 0 with
    /// `reverse`), `saved` (`[T, B, 5H + I]`: the cell's four saved blocks, the
    /// `h` it read, the input row) is what
    /// [`gru_sequence_backward`](Self::gru_sequence_backward) reads.
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`] if `x` is not 3-D;
    /// [`ExecError::ShapeMismatch`] if `w` is not `[3H, I + H]` or
    /// `[3H, I + H + 2]`, or `h0` not `[B, H]`; [`ExecError::OutOfMemory`].
    pub fn gru_sequence(
        &self,
        x: &RawTensor,
        w: &RawTensor,
        h0: &RawTensor,
        reverse: bool,
    ) -> Result<(RawTensor, RawTensor), ExecError> {
        const OP: &str = "gru_sequence";
        let sz = check_seq(OP, 3, x.shape(), w)?;
        check_shape(OP, h0, &[sz.b, sz.h], "the state must be [batch, hidden]")?;
        let (x2, gi, packed, b_hh) = self.seq_prologue(OP, sz, x, w)?;
        let h0 = self.contiguous(h0)?;
        let (b, h, g) = (sz.b, sz.h, sz.g);
        let mut lease = self.seq_scratch(OP, b * (g + h))?;
        let [gh, hc] = pieces(&mut lease, [b * g, b * h]);
        hc.copy_from_slice(h0.contiguous_slice());
        let (mut saved, mut done) = (None, Ok(()));
        let (bh, s5) = (b * h, 5 * h + sz.i);
        let gis = gi.contiguous_slice();
        let bias = b_hh.as_ref().map(|t| t.contiguous_slice());
        let out = self.new_tensor(OP, &[sz.t, b, h], |out| {
            saved = Some(self.new_tensor(OP, &[sz.t, b, s5], |sv| {
                keep_input(sv, 5 * h, x2.contiguous_slice(), sz.i);
                done = (|| {
                    for s in 0..sz.t {
                        let tt = time(s, sz.t, reverse);
                        self.state_gates(OP, hc, &packed, bias, gh)?;
                        let (gi_t, gh_t, h_prev) = (&gis[tt * b * g..][..b * g], &*gh, &*hc);
                        let none: &mut [f32] = &mut [];
                        self.par_rows3(
                            (&mut out[tt * bh..][..bh], h),
                            (&mut sv[tt * b * s5..][..b * s5], s5),
                            (none, 0),
                            h * CELL_WORK,
                            |rows, ho, so, _| {
                                vectorized!({
                                    let rows = rows.zip(ho.chunks_exact_mut(h));
                                    for ((r, hr), sr) in rows.zip(so.chunks_exact_mut(s5)) {
                                        let (act, keep) = sr.split_at_mut(4 * h);
                                        let hp = &h_prev[r * h..][..h];
                                        keep[..h].copy_from_slice(hp);
                                        let (gi, gh) = (&gi_t[r * g..][..g], &gh_t[r * g..][..g]);
                                        kern::gru_cell(gi, gh, hp, hr, act);
                                    }
                                })
                            },
                        );
                        hc.copy_from_slice(&out[tt * bh..][..bh]);
                    }
                    Ok(())
                })();
            }));
        })?;
        done?;
        Ok((out, saved.expect("the output's fill ran")?))
    }

    /// The backward of [`gru_sequence`](Self::gru_sequence): from its flat
    /// weight `w`, its `saved` tensor (`[T, B, 5H + I]`) and the gradient of
    /// its output `grad` (`[T, B, H]`), returns `(grad_x, grad_w, grad_h0)`
    /// (`[T, B, I]`, `w`'s shape, `[B, H]`), as
    /// [`lstm_sequence_backward`](Self::lstm_sequence_backward).
    ///
    /// # Errors
    /// As [`gru_sequence`](Self::gru_sequence) for `w`;
    /// [`ExecError::ShapeMismatch`] if `saved` is not `[T, B, 5H + I]` or `grad`
    /// not `[T, B, H]`; [`ExecError::OutOfMemory`].
    pub fn gru_sequence_backward(
        &self,
        w: &RawTensor,
        saved: &RawTensor,
        grad: &RawTensor,
        reverse: bool,
    ) -> Result<(RawTensor, RawTensor, RawTensor), ExecError> {
        const OP: &str = "gru_sequence_backward";
        let (sz, sc, gc, packed) = self.backward_prologue(OP, 3, [5, 0], [w, saved, grad])?;
        let (t, b, h, g) = (sz.t, sz.b, sz.h, sz.g);
        let (ss, dy) = (sc.contiguous_slice(), gc.contiguous_slice());
        let mut lease = self.seq_scratch(OP, 2 * b * h)?;
        let [mut dh, mut dhn] = pieces(&mut lease, [b * h, b * h]);
        dh.fill(0.0);
        let (mut done, mut dgh, bh, s5) = (Ok(()), None, b * h, 5 * h + sz.i);
        let dgi = self.new_tensor(OP, &[t * b, g], |dgi| {
            dgh = Some(self.new_tensor(OP, &[t * b, g], |dgh| {
                done = (|| {
                    for s in 0..t {
                        let tt = time(s, t, !reverse);
                        for (d, &y) in dh.iter_mut().zip(&dy[tt * bh..][..bh]) {
                            *d += y;
                        }
                        let (dh_in, sv_t) = (&*dh, &ss[tt * b * s5..][..b * s5]);
                        self.par_rows3(
                            (&mut dgi[tt * b * g..][..b * g], g),
                            (&mut dgh[tt * b * g..][..b * g], g),
                            (&mut *dhn, h),
                            h * CELL_WORK,
                            |rows, io, ho, po| {
                                vectorized!({
                                    let rows = rows.zip(io.chunks_exact_mut(g));
                                    for ((r, ir), (hr, pr)) in
                                        rows.zip(ho.chunks_exact_mut(g).zip(po.chunks_exact_mut(h)))
                                    {
                                        let sr = &sv_t[r * s5..][..s5];
                                        let (act, hp) = (&sr[..4 * h], &sr[4 * h..5 * h]);
                                        let d = &dh_in[r * h..][..h];
                                        kern::gru_cell_backward(act, hp, d, ir, hr, pr);
                                    }
                                })
                            },
                        );
                        let dgh_t = &dgh[tt * b * g..][..b * g];
                        self.gemm_packed(OP, dgh_t, &packed, dhn, true)?;
                        std::mem::swap(&mut dh, &mut dhn);
                    }
                    Ok(())
                })();
            }));
        })?;
        done?;
        let dgh = dgh.expect("the gradient's fill ran")?;
        let grad_h0 = self.new_tensor(OP, &[b, h], |o| o.copy_from_slice(dh))?;
        let rows = sc.reshape(&[t * b, s5])?;
        let (hprev, x2) = (rows.narrow(1, 4 * h, h)?, rows.narrow(1, 5 * h, sz.i)?);
        let (gx, gw) = self.seq_weight_grads(OP, sz, &x2, w, [&dgi, &dgh], &hprev)?;
        Ok((gx, gw, grad_h0))
    }
}
