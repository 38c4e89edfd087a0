//! The AVX-512 VNNI kernel of the block-of-32 formats: `vpdpbusd` tiles, pairs
//! of activation rows on 512-bit vectors, on the shared driver of `x86`.

use std::arch::x86_64::*;
use std::ops::Range;

use super::x86::*;
use super::{Acts, Block32, QK};

/// The AVX-512 VNNI kernel over `rows` (see [`super::simd_rows`]).
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; the slices must
/// satisfy `quant_rows`'s asserted bounds.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn rows_vnni<F: Block32>(
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &Acts<'_>,
    sums: &[f32],
    m: usize,
    out_t: &mut [f32],
) {
    drive!(tile_vnni, 4, F, w, row_bytes, rows, acts, sums, m, out_t)
}

/// [`tile_vnni`] for an even `M`: the pairs of activation rows on 512-bit
/// vectors (its [`tile_vnni_pairs`]); an odd `M` on 256-bit ones.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn tile_vnni<F: Block32, const R: usize, const M: usize>(
    w: &[u8],
    row_bytes: usize,
    j0: usize,
    acts: &Acts<'_>,
    sums: &[f32],
    i0: usize,
) -> [[f32; M]; R] {
    let mut out = [[0.0f32; M]; R];
    match M {
        4 => {
            let t = tile_vnni_pairs::<F, R, 2>(w, row_bytes, j0, acts, sums, i0);
            for (o, t) in out.iter_mut().zip(&t) {
                o.copy_from_slice(&t[..M]);
            }
        }
        2 => {
            let t = tile_vnni_pairs::<F, R, 1>(w, row_bytes, j0, acts, sums, i0);
            for (o, t) in out.iter_mut().zip(&t) {
                o.copy_from_slice(&t[..M]);
            }
        }
        _ => out = tile_vnni_256::<F, R, M>(w, row_bytes, j0, acts, sums, i0),
    }
    out
}

/// [`tile_avx2`] with `vpdpbusd` on 256-bit vectors: the lane bias (`-offset · Σ x` per lane)
/// is the accumulator's start, and the unsigned operand is the code or
/// the signed value `+ 128` (`^ 0x80`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
// `i` indexes the accumulators and the activation block alike
#[allow(clippy::needless_range_loop)]
fn tile_vnni_256<F: Block32, const R: usize, const M: usize>(
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
    let flip = _mm256_set1_epi8(-128);
    let mut acc = [[_mm256_setzero_ps(); M]; R];
    for b in 0..nb {
        let x = act_block::<F, M>(acts, sums, i0, b, F::ACT_OFFSET != 0);
        for (r, acc_r) in acc.iter_mut().enumerate() {
            // SAFETY: as in tile_avx2.
            let blk = unsafe { w.as_ptr().add((j0 + r) * row_bytes + b * F::BYTES) };
            // SAFETY: as in tile_avx2.
            let ((dw, mw), wv) = unsafe { (scale_min_at(blk), block_values::<F>(blk)) };
            prefetch(blk, R * row_bytes);
            let wu = if sh.signed {
                _mm256_xor_si256(wv, flip)
            } else {
                wv
            };
            for i in 0..M {
                let p = _mm256_dpbusd_epi32(x.bias[i], wu, x.values[i]);
                acc_r[i] = accumulate::<F>(acc_r[i], p, dw, mw, x.scale[i], x.sum[i]);
            }
        }
    }
    fold_tile(&acc)
}

/// The `2 P` activation rows from `i0` as `P` pairs on 512-bit vectors:
/// [`tile_vnni_256`]'s operations, two outputs' eight lanes per vector
/// (the lower half row `i0 + 2 p`, the upper `i0 + 2 p + 1`), so that one
/// `vpdpbusd`, conversion, scale product and multiply-add serve two
/// outputs; the scale products `dw · dx` are the same IEEE products,
/// taken lane by lane. Returns `[[f32; 4]; R]` with the first `2 P` of
/// each row used.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn tile_vnni_pairs<F: Block32, const R: usize, const P: usize>(
    w: &[u8],
    row_bytes: usize,
    j0: usize,
    acts: &Acts<'_>,
    sums: &[f32],
    i0: usize,
) -> [[f32; 4]; R] {
    // 2 P rows from i0 (P is 1 or 2)
    if P == 2 {
        check_tile::<F, R, 4>(w, row_bytes, j0, acts, sums, i0);
    } else {
        check_tile::<F, R, 2>(w, row_bytes, j0, acts, sums, i0);
    }
    let sh = F::SHAPE;
    let nb = acts.cols / QK;
    let flip = _mm256_set1_epi8(-128);
    let join = |a: __m256i, b: __m256i| _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b);
    let halves =
        |a: f32, b: f32| _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(a), _mm512_set1_ps(b));
    let mut acc = [[_mm512_setzero_ps(); P]; R];
    for b in 0..nb {
        let mut xv = [_mm512_setzero_si512(); P];
        let mut xb = [_mm512_setzero_si512(); P];
        let mut dx = [_mm512_setzero_ps(); P];
        let mut sum = [_mm512_setzero_ps(); P];
        for p in 0..P {
            let x = act_block::<F, 2>(acts, sums, i0 + 2 * p, b, F::ACT_OFFSET != 0);
            xv[p] = join(x.values[0], x.values[1]);
            xb[p] = join(x.bias[0], x.bias[1]);
            dx[p] = halves(x.scale[0], x.scale[1]);
            sum[p] = halves(x.sum[0], x.sum[1]);
        }
        for (r, acc_r) in acc.iter_mut().enumerate() {
            // SAFETY: as in tile_avx2.
            let blk = unsafe { w.as_ptr().add((j0 + r) * row_bytes + b * F::BYTES) };
            // SAFETY: as in tile_avx2.
            let ((dw, mw), wv) = unsafe { (scale_min_at(blk), block_values::<F>(blk)) };
            prefetch(blk, R * row_bytes);
            let wu = if sh.signed {
                _mm256_xor_si256(wv, flip)
            } else {
                wv
            };
            let wu = _mm512_broadcast_i64x4(wu);
            let (dw, mw) = (_mm512_set1_ps(dw), _mm512_set1_ps(mw));
            for (a, ((xv, xb), (dx, sum))) in acc_r
                .iter_mut()
                .zip(xv.iter().zip(&xb).zip(dx.iter().zip(&sum)))
            {
                let p = _mm512_dpbusd_epi32(*xb, wu, *xv);
                let s = _mm512_mul_ps(dw, *dx);
                let t = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(p), *a);
                *a = if F::NEEDS_SUMS {
                    // each half's lane 0: acc[0] = fma(mw · dx, S, acc[0])
                    let u = _mm512_fmadd_ps(_mm512_mul_ps(mw, *dx), *sum, t);
                    _mm512_mask_blend_ps(0x0101, t, u)
                } else {
                    t
                };
            }
        }
    }
    let mut out = [[0.0f32; 4]; R];
    for (o, a) in out.iter_mut().zip(&acc) {
        for (p, &a) in a.iter().enumerate() {
            o[2 * p] = fold(_mm512_castps512_ps256(a));
            o[2 * p + 1] = fold(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
                _mm512_castps_pd(a),
            )));
        }
    }
    out
}
