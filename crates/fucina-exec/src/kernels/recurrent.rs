//! The row kernels of the fused recurrent cells (`lstm_cell`, `gru_cell` of
//! `ops/recurrent.rs`): one batch row's gate arithmetic and its backward, in
//! PyTorch's gate order (LSTM `i, f, g, o`; GRU `r, z, n`).
//!
//! Each element is computed on its own from the same inputs in the same
//! order (plain products and sums, no fused multiply-add, the libm-free
//! [`super::math`] `sigmoid` and `tanh`), so the loops vectorize and give the
//! same bits at every vector level.

use super::math::{sigmoid, tanh};

/// Splits a row of `k * h` items into its `k` gate blocks of `h` (each
/// resliced to exactly `h`, so that the loops over `0..h` carry no bounds
/// checks and vectorize).
#[inline(always)]
fn blocks<const K: usize>(row: &[f32], h: usize) -> [&[f32]; K] {
    let row = &row[..K * h];
    std::array::from_fn(|j| &row[j * h..][..h])
}

/// Splits a mutable row of `k * h` items into its `k` gate blocks of `h`.
#[inline(always)]
fn blocks_mut<const K: usize>(row: &mut [f32], h: usize) -> [&mut [f32]; K] {
    let mut rest = &mut row[..K * h];
    std::array::from_fn(|_| {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(h);
        rest = tail;
        &mut head[..h]
    })
}

/// One row of the LSTM cell: the gate pre-activations `gi + gh` (`4h` each,
/// blocks `i, f, g, o`) and the cell state `c` (`h`) give `i, f, o = σ(·)`,
/// `g = tanh(·)`, `c' = f * c + i * g` and `h' = o * tanh(c')`, written to
/// `h_out` and `c_out`; `act` (`5h`) keeps `i, f, g, o, tanh(c')` for the
/// backward.
#[inline(always)]
pub(crate) fn lstm_cell(
    gi: &[f32],
    gh: &[f32],
    c: &[f32],
    h_out: &mut [f32],
    c_out: &mut [f32],
    act: &mut [f32],
) {
    let h = c.len();
    let [xi, xf, xg, xo] = blocks::<4>(gi, h);
    let [hi, hf, hg, ho] = blocks::<4>(gh, h);
    let [ai, af, ag, ao, at] = blocks_mut::<5>(act, h);
    let (c, h_out, c_out) = (&c[..h], &mut h_out[..h], &mut c_out[..h]);
    for j in 0..h {
        let i = sigmoid(xi[j] + hi[j]);
        let f = sigmoid(xf[j] + hf[j]);
        let g = tanh(xg[j] + hg[j]);
        let o = sigmoid(xo[j] + ho[j]);
        let cn = f * c[j] + i * g;
        let t = tanh(cn);
        h_out[j] = o * t;
        c_out[j] = cn;
        (ai[j], af[j], ag[j], ao[j], at[j]) = (i, f, g, o, t);
    }
}

/// The backward of one row of [`lstm_cell`]: from its saved `act` (`5h`),
/// the cell state `c` it read and the gradients `dh`, `dc_out` of `h'` and
/// `c'`, the gradient of the gate pre-activations `dgates` (`4h`, the same
/// for `gi` and `gh`) and of `c` (`dc`). With `dc' = dc_out + dh * o * (1 -
/// tanh²(c'))`: `di = dc' g i (1 - i)`, `df = dc' c f (1 - f)`, `dg = dc' i
/// (1 - g²)`, `do = dh tanh(c') o (1 - o)`, `dc = dc' f`.
#[inline(always)]
pub(crate) fn lstm_cell_backward(
    act: &[f32],
    c: &[f32],
    dh: &[f32],
    dc_out: &[f32],
    dgates: &mut [f32],
    dc: &mut [f32],
) {
    let h = c.len();
    let [ai, af, ag, ao, at] = blocks::<5>(act, h);
    let [di, df, dg, d_o] = blocks_mut::<4>(dgates, h);
    let (c, dh, dc_out, dc) = (&c[..h], &dh[..h], &dc_out[..h], &mut dc[..h]);
    for j in 0..h {
        let (i, f, g, o, t) = (ai[j], af[j], ag[j], ao[j], at[j]);
        let dct = dc_out[j] + dh[j] * o * (1.0 - t * t);
        di[j] = dct * g * (i * (1.0 - i));
        df[j] = dct * c[j] * (f * (1.0 - f));
        dg[j] = dct * i * (1.0 - g * g);
        d_o[j] = dh[j] * t * (o * (1.0 - o));
        dc[j] = dct * f;
    }
}

/// One row of the GRU cell: the input's gate pre-activations `gi` (`3h`,
/// blocks `r, z, n`, with `b_ih`), the state's `gh` (`3h`, with `b_hh`) and
/// the state `hp` (`h`) give `r = σ(gi_r + gh_r)`, `z = σ(gi_z + gh_z)`, `n
/// = tanh(gi_n + r * gh_n)` and `h' = n + z * (hp - n)` (PyTorch's `(1 - z)
/// n + z h`), written to `h_out`; `act` (`4h`) keeps `r, z, n, gh_n` for the
/// backward.
#[inline(always)]
pub(crate) fn gru_cell(gi: &[f32], gh: &[f32], hp: &[f32], h_out: &mut [f32], act: &mut [f32]) {
    let h = hp.len();
    let [xr, xz, xn] = blocks::<3>(gi, h);
    let [hr, hz, hn] = blocks::<3>(gh, h);
    let [ar, az, an, ahn] = blocks_mut::<4>(act, h);
    let (hp, h_out) = (&hp[..h], &mut h_out[..h]);
    for j in 0..h {
        let r = sigmoid(xr[j] + hr[j]);
        let z = sigmoid(xz[j] + hz[j]);
        let n = tanh(xn[j] + r * hn[j]);
        h_out[j] = n + z * (hp[j] - n);
        (ar[j], az[j], an[j], ahn[j]) = (r, z, n, hn[j]);
    }
}

/// The backward of one row of [`gru_cell`]: from its saved `act` (`4h`), the
/// state `hp` it read and the gradient `dh` of `h'`, the gradients of `gi`
/// (`3h`), `gh` (`3h`) and `hp` (`h`). With `dn = dh (1 - z) (1 - n²)`: `dz
/// = dh (hp - n) z (1 - z)`, `dr = dn gh_n r (1 - r)`; `dgi = [dr, dz, dn]`,
/// `dgh = [dr, dz, dn r]`, `dhp = dh z`.
#[inline(always)]
pub(crate) fn gru_cell_backward(
    act: &[f32],
    hp: &[f32],
    dh: &[f32],
    dgi: &mut [f32],
    dgh: &mut [f32],
    dhp: &mut [f32],
) {
    let h = hp.len();
    let [ar, az, an, ahn] = blocks::<4>(act, h);
    let [ir, iz, inn] = blocks_mut::<3>(dgi, h);
    let [hr, hz, hn] = blocks_mut::<3>(dgh, h);
    let (hp, dh, dhp) = (&hp[..h], &dh[..h], &mut dhp[..h]);
    for j in 0..h {
        let (r, z, n, ghn) = (ar[j], az[j], an[j], ahn[j]);
        let dn = dh[j] * (1.0 - z) * (1.0 - n * n);
        let dz = dh[j] * (hp[j] - n) * (z * (1.0 - z));
        let dr = dn * ghn * (r * (1.0 - r));
        (ir[j], iz[j], inn[j]) = (dr, dz, dn);
        (hr[j], hz[j], hn[j]) = (dr, dz, dn * r);
        dhp[j] = dh[j] * z;
    }
}
