//! The portable kernel (and the tests' oracle of the blocking).

use super::{L, check_block, elem_size, format_of};

// Folds one chain: lanes `l + 8` into `l`, then `+ 4`, `+ 2`, `+ 1`.
use crate::kernels::reduce::fold_lanes as fold;

/// See [`super::block`].
pub(super) fn block<const FMT: u8, const R: usize, const MB: usize>(
    x: &[f32],
    cols: usize,
    w: &[u8],
    out: &mut [f32],
    m: usize,
) {
    let es = elem_size(FMT);
    check_block(R, MB, es, x, cols, w, out, m);
    let fmt = format_of(FMT);
    let mut acc = [[[0.0f32; L]; R]; MB];
    let mut k = 0;
    while k < cols {
        let n = (cols - k).min(L);
        // Missing terms are 0 · 0 (see the module docs).
        let mut wv = [[0.0f32; L]; R];
        for (r, wr) in wv.iter_mut().enumerate() {
            let row = &w[(r * cols + k) * es..(r * cols + k + n) * es];
            for (l, v) in wr.iter_mut().take(n).enumerate() {
                *v = fmt.element(row, l);
            }
        }
        for (i, acc_i) in acc.iter_mut().enumerate() {
            let mut xv = [0.0f32; L];
            xv[..n].copy_from_slice(&x[i * cols + k..i * cols + k + n]);
            for (acc_ir, wr) in acc_i.iter_mut().zip(&wv) {
                for l in 0..L {
                    acc_ir[l] = xv[l].mul_add(wr[l], acc_ir[l]);
                }
            }
        }
        k += L;
    }
    for (i, acc_i) in acc.iter().enumerate() {
        for (r, a) in acc_i.iter().enumerate() {
            out[r * m + i] = fold(*a);
        }
    }
}
