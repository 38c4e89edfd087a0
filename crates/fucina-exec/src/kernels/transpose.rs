//! The tiled transpose of a row-major matrix, a range of the result's rows at a
//! time: `gather_backward` and `topk`/`argsort` write results computed line by
//! line back in the output's axis order with it.

/// Side of the square tiles of [`transpose_rows`].
const TILE: usize = 32;

/// `dst[jj * inner + i] = src[i * k + j0 + jj]` for every row `jj` of `dst` (rows
/// of `inner` elements) and every `i < inner`: rows `j0..` of the transpose of the
/// `[inner, k]` matrix `src`, walked in square tiles so that both sides stay in
/// cache.
pub(crate) fn transpose_rows<T: Copy>(dst: &mut [T], src: &[T], inner: usize, k: usize, j0: usize) {
    let run = dst.len() / inner;
    for i0 in (0..inner).step_by(TILE) {
        let i1 = (i0 + TILE).min(inner);
        for jt in (0..run).step_by(TILE) {
            for jj in jt..(jt + TILE).min(run) {
                let drow = &mut dst[jj * inner + i0..jj * inner + i1];
                for (t, d) in drow.iter_mut().enumerate() {
                    *d = src[(i0 + t) * k + j0 + jj];
                }
            }
        }
    }
}
