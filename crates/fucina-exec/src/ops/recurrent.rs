//! The fused recurrent cells: `lstm_cell` and `gru_cell` and their backward
//! kernels, PyTorch's cells (`torch._VF.lstm_cell` / `nn.LSTMCell`,
//! `nn.GRUCell`) from the gate pre-activations.
//!
//! The products (`x W_ihᵀ + b_ih`, `h W_hhᵀ + b_hh`) are the caller's GEMMs;
//! a cell does the gate arithmetic of a step in one pass over its `[B, k H]`
//! pre-activations and keeps, in one `[B, 5H]` (LSTM) or `[B, 4H]` (GRU)
//! tensor, what its backward reads (the activated gates and `tanh(c')`, or
//! `r, z, n` and the state's `n` block), so that the backward is one pass
//! too.
//!
//! **Order and determinism.** Every element is computed from its own row's
//! values by the kernels of `kernels/recurrent.rs` (the same operations in the
//! same order at every vector level); the batch rows are split by `par_rows3`
//! into chunks that depend only on the row count and the team size, and a
//! row's result depends on that row alone. So the bits are the same for
//! every team size, vector level and batch composition.

use crate::context::ExecContext;
use crate::error::ExecError;
use crate::kernels::recurrent as kern;
use crate::kernels::simd::vectorized;
use crate::tensor::RawTensor;
use crate::tensor::layout::Dims;

/// Per-element work weight of a cell row (a few `exp`s per element).
pub(crate) const CELL_WORK: usize = 64;

/// Checks the gate pre-activations `gi` and `gh` (equal `[B, gates * H]`
/// shapes) and the state `s` (`[B, H]`); returns `(B, H)`.
fn check_cell(
    op: &'static str,
    gates: usize,
    gi: &RawTensor,
    gh: &RawTensor,
    s: &RawTensor,
    state: &'static str,
) -> Result<(usize, usize), ExecError> {
    let g = gi.shape();
    if g.len() != 2 || !g[1].is_multiple_of(gates) {
        return Err(ExecError::InvalidShape {
            op,
            shape: gi.dims(),
            reason: if gates == 4 {
                "the input gates must be [batch, 4 * hidden] (blocks i, f, g, o)"
            } else {
                "the input gates must be [batch, 3 * hidden] (blocks r, z, n)"
            },
        });
    }
    if gh.shape() != g {
        return Err(ExecError::ShapeMismatch {
            op,
            lhs: gi.dims(),
            rhs: gh.dims(),
            reason: "the input and hidden gates must have the same shape",
        });
    }
    let (b, h) = (g[0], g[1] / gates);
    if s.shape() != [b, h] {
        return Err(ExecError::ShapeMismatch {
            op,
            lhs: gi.dims(),
            rhs: s.dims(),
            reason: state,
        });
    }
    Ok((b, h))
}

/// Checks a saved tensor (`[B, k H]`) against the state `s` (`[B, H]`) and
/// an output gradient against `want`; returns `(B, H)`.
fn check_backward(
    op: &'static str,
    k: usize,
    saved: &RawTensor,
    s: &RawTensor,
    grad: &RawTensor,
    want: &[usize],
) -> Result<(usize, usize), ExecError> {
    let (b, h) = match s.shape() {
        &[b, h] => (b, h),
        _ => {
            return Err(ExecError::InvalidShape {
                op,
                shape: s.dims(),
                reason: "the state must be [batch, hidden]",
            });
        }
    };
    if saved.shape() != [b, k * h] {
        return Err(ExecError::ShapeMismatch {
            op,
            lhs: saved.dims(),
            rhs: s.dims(),
            reason: "the saved tensor must be the forward's for this state",
        });
    }
    if grad.shape() != want {
        return Err(ExecError::ShapeMismatch {
            op,
            lhs: grad.dims(),
            rhs: Dims::new(want),
            reason: "the output gradient must have the output's shape",
        });
    }
    Ok((b, h))
}

impl ExecContext {
    /// PyTorch's LSTM cell from its gate pre-activations: `gi = x W_ihᵀ +
    /// b_ih` and `gh = h W_hhᵀ + b_hh` (`[B, 4H]` each, the blocks in PyTorch's
    /// order `i, f, g, o`) and the cell state `c` (`[B, H]`). With `a = gi +
    /// gh`: `i = σ(a_i)`, `f = σ(a_f)`, `g = tanh(a_g)`, `o = σ(a_o)`,
    /// `c' = f * c + i * g`, `h' = o * tanh(c')`. Returns `(hc, saved)`: `hc` is `[2,
    /// B, H]` (`hc[0] = h'`, `hc[1] = c'`), `saved` (`[B, 5H]`: `i, f, g, o,
    /// tanh(c')`) is what [`lstm_cell_backward`](Self::lstm_cell_backward)
    /// reads. The same bits for every team size, vector level and batch.
    ///
    /// ```
    /// use fucina_exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// // One row, hidden 1: i = f = o = σ(0) = 0.5, g = tanh(0) = 0.
    /// let gi = ctx.from_slice(&[1, 4], &[0., 0., 0., 0.])?;
    /// let gh = ctx.from_slice(&[1, 4], &[0., 0., 0., 0.])?;
    /// let c = ctx.from_slice(&[1, 1], &[2.])?;
    /// let (hc, _saved) = ctx.lstm_cell(&gi, &gh, &c)?;
    /// assert_eq!(hc.shape(), [2, 1, 1]);
    /// assert_eq!(hc.to_vec()[1], 1.0); // c' = 0.5 * 2 + 0.5 * 0
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`] if `gi` is not `[B, 4H]`;
    /// [`ExecError::ShapeMismatch`] if `gh` is not of `gi`'s shape or `c` not
    /// `[B, H]`; [`ExecError::OutOfMemory`].
    pub fn lstm_cell(
        &self,
        gi: &RawTensor,
        gh: &RawTensor,
        c: &RawTensor,
    ) -> Result<(RawTensor, RawTensor), ExecError> {
        const OP: &str = "lstm_cell";
        let state = "the cell state must be [batch, hidden] for gates [batch, 4 * hidden]";
        let (b, h) = check_cell(OP, 4, gi, gh, c, state)?;
        let (gic, ghc, cc) = (
            self.contiguous(gi)?,
            self.contiguous(gh)?,
            self.contiguous(c)?,
        );
        let (gis, ghs, cs) = (
            gic.contiguous_slice(),
            ghc.contiguous_slice(),
            cc.contiguous_slice(),
        );
        let mut saved = None;
        let hc = self.new_tensor(OP, &[2, b, h], |hc| {
            let (ho, co) = hc.split_at_mut(b * h);
            saved = Some(self.new_tensor(OP, &[b, 5 * h], |act| {
                self.par_rows3(
                    (ho, h),
                    (co, h),
                    (act, 5 * h),
                    h * CELL_WORK,
                    |rows, ho, co, ao| {
                        vectorized!({
                            let rows = rows.zip(ho.chunks_exact_mut(h));
                            for ((r, hr), (cr, ar)) in
                                rows.zip(co.chunks_exact_mut(h).zip(ao.chunks_exact_mut(5 * h)))
                            {
                                let g = 4 * h;
                                kern::lstm_cell(
                                    &gis[r * g..][..g],
                                    &ghs[r * g..][..g],
                                    &cs[r * h..][..h],
                                    hr,
                                    cr,
                                    ar,
                                );
                            }
                        })
                    },
                );
            }));
        })?;
        Ok((hc, saved.expect("the cell's fill ran")?))
    }

    /// The backward of [`lstm_cell`](Self::lstm_cell): from its `saved`
    /// tensor (`[B, 5H]`), the cell state `c` it read (`[B, H]`) and the
    /// gradient of its output `grad_hc` (`[2, B, H]`: of `h'`, then of `c'`),
    /// returns `(grad_gates, grad_c)`: the gradient of the gate
    /// pre-activations (`[B, 4H]`, the same for `gi` and `gh`) and of `c`.
    /// With `dc' = grad_c' + grad_h' * o * (1 - tanh²(c'))`: `di = dc' g i (1 -
    /// i)`, `df = dc' c f (1 - f)`, `dg = dc' i (1 - g²)`, `do = grad_h'
    /// tanh(c') o (1 - o)`, `grad_c = dc' f`.
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`] if `c` is not 2-D;
    /// [`ExecError::ShapeMismatch`] if `saved` is not `[B, 5H]` or `grad_hc`
    /// not `[2, B, H]`; [`ExecError::OutOfMemory`].
    pub fn lstm_cell_backward(
        &self,
        saved: &RawTensor,
        c: &RawTensor,
        grad_hc: &RawTensor,
    ) -> Result<(RawTensor, RawTensor), ExecError> {
        const OP: &str = "lstm_cell_backward";
        let (b, h) = match c.shape() {
            &[b, h] => (b, h),
            _ => (0, 0),
        };
        check_backward(OP, 5, saved, c, grad_hc, &[2, b, h])?;
        let (sc, cc, gc) = (
            self.contiguous(saved)?,
            self.contiguous(c)?,
            self.contiguous(grad_hc)?,
        );
        let (ss, cs, gs) = (
            sc.contiguous_slice(),
            cc.contiguous_slice(),
            gc.contiguous_slice(),
        );
        let (gh, gcn) = gs.split_at(b * h);
        let mut grad_c = None;
        let grad_gates = self.new_tensor(OP, &[b, 4 * h], |dg| {
            grad_c = Some(self.new_tensor(OP, &[b, h], |dc| {
                let none: &mut [f32] = &mut [];
                self.par_rows3(
                    (dg, 4 * h),
                    (dc, h),
                    (none, 0),
                    h * CELL_WORK,
                    |rows, dg, dc, _| {
                        vectorized!({
                            let rows = rows.zip(dg.chunks_exact_mut(4 * h));
                            for ((r, dgr), dcr) in rows.zip(dc.chunks_exact_mut(h)) {
                                let (hr, sr) = (r * h, r * 5 * h);
                                let (s, cr) = (&ss[sr..][..5 * h], &cs[hr..][..h]);
                                kern::lstm_cell_backward(
                                    s,
                                    cr,
                                    &gh[hr..][..h],
                                    &gcn[hr..][..h],
                                    dgr,
                                    dcr,
                                );
                            }
                        })
                    },
                );
            }));
        })?;
        Ok((grad_gates, grad_c.expect("the backward's fill ran")?))
    }

    /// PyTorch's GRU cell from its gate pre-activations: `gi = x W_ihᵀ +
    /// b_ih` and `gh = h W_hhᵀ + b_hh` (`[B, 3H]` each, the blocks in
    /// PyTorch's order `r, z, n`) and the state `h` (`[B, H]`): `r = σ(gi_r +
    /// gh_r)`, `z = σ(gi_z + gh_z)`, `n = tanh(gi_n + r * gh_n)`,
    /// `h' = n + z * (h - n)` (that is `(1 - z) * n + z * h`). Returns `(h', saved)`:
    /// `saved` (`[B, 4H]`: `r, z, n, gh_n`) is what
    /// [`gru_cell_backward`](Self::gru_cell_backward) reads. The same bits for
    /// every team size, vector level and batch.
    ///
    /// ```
    /// use fucina_exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// // One row, hidden 1: r = z = σ(0) = 0.5, n = tanh(0) = 0, h' = 0.5 h.
    /// let gi = ctx.from_slice(&[1, 3], &[0., 0., 0.])?;
    /// let gh = ctx.from_slice(&[1, 3], &[0., 0., 0.])?;
    /// let h = ctx.from_slice(&[1, 1], &[3.])?;
    /// let (h1, _saved) = ctx.gru_cell(&gi, &gh, &h)?;
    /// assert_eq!(h1.to_vec(), [1.5]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`] if `gi` is not `[B, 3H]`;
    /// [`ExecError::ShapeMismatch`] if `gh` is not of `gi`'s shape or `h` not
    /// `[B, H]`; [`ExecError::OutOfMemory`].
    pub fn gru_cell(
        &self,
        gi: &RawTensor,
        gh: &RawTensor,
        h: &RawTensor,
    ) -> Result<(RawTensor, RawTensor), ExecError> {
        const OP: &str = "gru_cell";
        let state = "the state must be [batch, hidden] for gates [batch, 3 * hidden]";
        let (b, hid) = check_cell(OP, 3, gi, gh, h, state)?;
        let (gic, ghc, hc) = (
            self.contiguous(gi)?,
            self.contiguous(gh)?,
            self.contiguous(h)?,
        );
        let (gis, ghs, hs) = (
            gic.contiguous_slice(),
            ghc.contiguous_slice(),
            hc.contiguous_slice(),
        );
        let mut saved = None;
        let out = self.new_tensor(OP, &[b, hid], |ho| {
            saved = Some(self.new_tensor(OP, &[b, 4 * hid], |act| {
                let none: &mut [f32] = &mut [];
                self.par_rows3(
                    (ho, hid),
                    (act, 4 * hid),
                    (none, 0),
                    hid * CELL_WORK,
                    |rows, ho, ao, _| {
                        vectorized!({
                            let rows = rows.zip(ho.chunks_exact_mut(hid));
                            for ((r, hr), ar) in rows.zip(ao.chunks_exact_mut(4 * hid)) {
                                let g = 3 * hid;
                                kern::gru_cell(
                                    &gis[r * g..][..g],
                                    &ghs[r * g..][..g],
                                    &hs[r * hid..][..hid],
                                    hr,
                                    ar,
                                );
                            }
                        })
                    },
                );
            }));
        })?;
        Ok((out, saved.expect("the cell's fill ran")?))
    }

    /// The backward of [`gru_cell`](Self::gru_cell): from its `saved` tensor
    /// (`[B, 4H]`), the state `h` it read (`[B, H]`) and the gradient
    /// `grad_h` of its output (`[B, H]`), returns `(grad_gi, grad_gh,
    /// grad_h_prev)` (`[B, 3H]`, `[B, 3H]`, `[B, H]`). With `dn = grad_h (1 -
    /// z) (1 - n²)`: `dz = grad_h (h - n) z (1 - z)`, `dr = dn gh_n r (1 - r)`,
    /// `grad_gi = [dr, dz, dn]`, `grad_gh = [dr, dz, dn r]`, `grad_h_prev =
    /// grad_h z`.
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`] if `h` is not 2-D;
    /// [`ExecError::ShapeMismatch`] if `saved` is not `[B, 4H]` or `grad_h`
    /// not `[B, H]`; [`ExecError::OutOfMemory`].
    pub fn gru_cell_backward(
        &self,
        saved: &RawTensor,
        h: &RawTensor,
        grad_h: &RawTensor,
    ) -> Result<(RawTensor, RawTensor, RawTensor), ExecError> {
        const OP: &str = "gru_cell_backward";
        let (b, hid) = check_backward(OP, 4, saved, h, grad_h, h.shape())?;
        let (sc, hc, gc) = (
            self.contiguous(saved)?,
            self.contiguous(h)?,
            self.contiguous(grad_h)?,
        );
        let (ss, hs, gs) = (
            sc.contiguous_slice(),
            hc.contiguous_slice(),
            gc.contiguous_slice(),
        );
        let g = 3 * hid;
        let (mut dgh, mut dh) = (None, None);
        let dgi = self.new_tensor(OP, &[b, g], |dgi| {
            dgh = Some(self.new_tensor(OP, &[b, g], |dgh| {
                dh = Some(self.new_tensor(OP, &[b, hid], |dh| {
                    self.par_rows3(
                        (dgi, g),
                        (dgh, g),
                        (dh, hid),
                        hid * CELL_WORK,
                        |rows, a, b, c| {
                            vectorized!({
                                let rows = rows.zip(a.chunks_exact_mut(g));
                                let outs = b.chunks_exact_mut(g).zip(c.chunks_exact_mut(hid));
                                for ((r, ar), (br, cr)) in rows.zip(outs) {
                                    let (s, hr) = (&ss[r * 4 * hid..][..4 * hid], r * hid);
                                    kern::gru_cell_backward(
                                        s,
                                        &hs[hr..][..hid],
                                        &gs[hr..][..hid],
                                        ar,
                                        br,
                                        cr,
                                    );
                                }
                            })
                        },
                    );
                }));
            }));
        })?;
        let dgh = dgh.expect("the backward's fill ran")?;
        Ok((dgi, dgh, dh.expect("the backward's fill ran")?))
    }
}
