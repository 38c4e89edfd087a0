//! The AVX2 kernel of the block-of-32 formats: `vpmaddubsw` + `vpmaddwd`
//! tiles on the shared driver of `x86`.

use std::arch::x86_64::*;
use std::ops::Range;

use super::x86::*;
use super::{Acts, Block32, QK};

/// The AVX2 kernel over `rows` (see [`super::simd_rows`]).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; the slices must satisfy
/// `quant_rows`'s asserted bounds.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_avx2<F: Block32>(
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &Acts<'_>,
    sums: &[f32],
    m: usize,
    out_t: &mut [f32],
) {
    // Two activation rows per tile: 8 accumulators, the weights, the
    // activations and temporaries fit the 16 registers.
    drive!(tile_avx2, 2, F, w, row_bytes, rows, acts, sums, m, out_t)
}

/// Outputs of weight rows `j0..j0 + R` × activation rows `i0..i0 + M`
/// with `vpmaddubsw` + `vpmaddwd`: signed values (Q8_0, IQ4_NL) through
/// the sign trick (`|w| · (x · sign w)`, at most 128 · 127 per product so
/// the 16-bit pair sums never saturate), unsigned codes (at most 31)
/// directly plus the lane bias where the format has an offset.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
// `i` indexes the accumulators and the activation block alike
#[allow(clippy::needless_range_loop)]
fn tile_avx2<F: Block32, const R: usize, const M: usize>(
    w: &[u8],
    row_bytes: usize,
    j0: usize,
    acts: &Acts<'_>,
    sums: &[f32],
    i0: usize,
) -> [[f32; M]; R] {
    check_tile::<F, R, M>(w, row_bytes, j0, acts, sums, i0);
    let sh = F::SHAPE;
    let nb = acts.cols / QK;
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); M]; R];
    for b in 0..nb {
        let x = act_block::<F, M>(acts, sums, i0, b, !sh.signed && F::ACT_OFFSET != 0);
        for (r, acc_r) in acc.iter_mut().enumerate() {
            // SAFETY: check_tile: row j0 + r is inside `w`; block b of it
            // spans `F::BYTES` bytes from `blk`.
            let blk = unsafe { w.as_ptr().add((j0 + r) * row_bytes + b * F::BYTES) };
            // SAFETY: as above (a whole block is readable).
            let ((dw, mw), wv) = unsafe { (scale_min_at(blk), block_values::<F>(blk)) };
            prefetch(blk, R * row_bytes);
            let aw = if sh.signed {
                _mm256_sign_epi8(wv, wv)
            } else {
                wv
            };
            for i in 0..M {
                let p = if sh.signed {
                    let pairs = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x.values[i], wv));
                    _mm256_madd_epi16(pairs, ones)
                } else {
                    let pairs = _mm256_maddubs_epi16(wv, x.values[i]);
                    let p = _mm256_madd_epi16(pairs, ones);
                    if F::ACT_OFFSET != 0 {
                        _mm256_add_epi32(p, x.bias[i])
                    } else {
                        p
                    }
                };
                acc_r[i] = accumulate::<F>(acc_r[i], p, dw, mw, x.scale[i], x.sum[i]);
            }
        }
    }
    fold_tile(&acc)
}
