//! The AVX2 K kernel: `vpmaddubsw` + `vpmaddwd` over each sub-block (pair
//! sums at most `2 · 63 · 127` for the unsigned values, `2 · 127 · 127` for
//! IQ4_XS's sign trick: never saturating), the even and odd sub-blocks' lanes
//! in two 8-lane accumulators per output; and each format's decoding of a
//! sub-block ([`Avx2Sub`]).

use std::arch::x86_64::*;
use std::ops::Range;

use super::x86::{
    check_tile, drive, f16_pair, fold, group_sums, i8x8_to_f32, iq4xs_scales, q3k_scales,
    super_blocks, u8x8_to_f32,
};
use super::{Acts, IQ4_XS, KVector, LANES, MinTerm, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, QK, QK_K, SUB};
use crate::kernels::quant_block::BlockFormat;
use crate::kernels::quant_block::iq4_nl::KVALUES;
use crate::kernels::quant_block::q4_k::q4k_scales_u64;

/// A super-block's f32 weight scales and mins, for one weight row. Per
/// sub-block formats hold sub-block `j`'s scale in lane `j` of `ds[0]` (and
/// Q4_K/Q5_K its min in lane `j` of `dm[0]`); per group formats hold group
/// `g`'s scale in lane `g mod 8` of `ds[g / 8]` (and Q2_K its min likewise in
/// `dm`).
#[derive(Clone, Copy)]
pub(crate) struct Head {
    /// The weight scales.
    pub(super) ds: [__m256; 2],
    /// The mins (Q4_K, Q5_K, Q2_K).
    pub(super) dm: [__m256; 2],
}

/// A K format's decoding for the AVX2 tile.
pub(crate) trait Avx2Sub: BlockFormat {
    /// Whether [`sub`](Self::sub) gives signed values (the tile then uses the
    /// sign trick); otherwise they are unsigned (`q + ACT_OFFSET`), and the
    /// tile adds the activation lane biases where `ACT_OFFSET` is not 0.
    const SIGNED: bool = false;

    /// The scales and mins of the super-block at `blk`.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; `blk` must be valid for reading
    /// `Self::BYTES` bytes.
    unsafe fn head(blk: *const u8) -> Head;

    /// Sub-block `j`'s 32 values (element `k` in byte `k`) and each lane's
    /// weight scale, `h` the super-block's [`head`](Self::head).
    ///
    /// # Safety
    /// As [`head`](Self::head); `j < 8`.
    unsafe fn sub(blk: *const u8, j: usize, h: &Head) -> (__m256i, __m256);
}

/// Lane `j` of `ds` in all eight lanes (a per sub-block scale).
#[inline]
#[target_feature(enable = "avx2")]
fn sub_scale(ds: __m256, j: usize) -> __m256 {
    _mm256_permutevar8x32_ps(ds, _mm256_set1_epi32(j as i32))
}

/// The lane scales of sub-block `j` of a per group format: lanes 0..4 group
/// `2j`, lanes 4..8 group `2j + 1`.
#[inline]
#[target_feature(enable = "avx2")]
fn group_scale(ds: &[__m256; 2], j: usize) -> __m256 {
    let k = (2 * j % 8) as i32;
    let idx = _mm256_setr_epi32(k, k, k, k, k + 1, k + 1, k + 1, k + 1);
    _mm256_permutevar8x32_ps(ds[j / 4], idx)
}

/// Bits `2 r, 2 r + 1` of each byte of `v`, in bits 0 and 1.
#[inline]
#[target_feature(enable = "avx2")]
fn crumb(v: __m256i, r: usize) -> __m256i {
    // a 16-bit shift by at most 6 moves no bit that the mask keeps across bytes
    let s = _mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * r as i32));
    _mm256_and_si256(s, _mm256_set1_epi8(3))
}

/// Bit `j` of each byte of `v`, in bit `to`.
#[inline]
#[target_feature(enable = "avx2")]
fn bit_to(v: __m256i, j: usize, to: i32) -> __m256i {
    // a 16-bit shift by at most 7 moves no bit that the mask keeps across bytes
    let b = _mm256_and_si256(
        _mm256_srl_epi16(v, _mm_cvtsi32_si128(j as i32)),
        _mm256_set1_epi8(1),
    );
    _mm256_sll_epi16(b, _mm_cvtsi32_si128(to))
}

/// The nibbles of sub-block `j` in Q4_K's layout (`qs` the 128 value bytes).
///
/// # Safety
/// `qs` must be valid for reading 128 bytes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn q4k_nibbles(qs: *const u8, j: usize) -> __m256i {
    // SAFETY: bytes 32 (j / 2) .. +32 of the 128 (the caller's contract, j < 8).
    let v = unsafe { _mm256_loadu_si256(qs.add(32 * (j / 2)).cast()) };
    let v = if j.is_multiple_of(2) {
        v
    } else {
        _mm256_srli_epi16::<4>(v)
    };
    _mm256_and_si256(v, _mm256_set1_epi8(0x0f))
}

/// The head of Q4_K and Q5_K: `d · sc[j]` and `dmin · mn[j]` in lane `j`.
///
/// # Safety
/// `blk` must be valid for reading 16 bytes; the CPU must have AVX2 and F16C.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn q4k_head(blk: *const u8) -> Head {
    // SAFETY: bytes 0..16 of the super-block (the caller's contract).
    let (head, (d, dmin)) = unsafe { (std::slice::from_raw_parts(blk, 16), f16_pair(blk)) };
    let (sc, mn) = q4k_scales_u64(&head[4..16]);
    let z = _mm256_setzero_ps();
    Head {
        ds: [_mm256_mul_ps(_mm256_set1_ps(d), u8x8_to_f32(sc)), z],
        dm: [_mm256_mul_ps(_mm256_set1_ps(dmin), u8x8_to_f32(mn)), z],
    }
}

/// Sixteen signed scale codes at `p` times `d`, group `g` in lane `g mod 8`
/// of vector `g / 8`.
///
/// # Safety
/// `p` must be valid for reading 16 bytes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn group_scales(d: f32, p: *const u8) -> [__m256; 2] {
    // SAFETY: 16 readable bytes (the caller's contract).
    let sc = unsafe { _mm_loadu_si128(p.cast()) };
    let dv = _mm256_set1_ps(d);
    [
        _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))),
        _mm256_mul_ps(
            dv,
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(sc))),
        ),
    ]
}

impl Avx2Sub for Q4_K {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn head(blk: *const u8) -> Head {
        // SAFETY: a whole super-block (the caller's contract).
        unsafe { q4k_head(blk) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sub(blk: *const u8, j: usize, h: &Head) -> (__m256i, __m256) {
        // SAFETY: the value bytes 16..144 are inside the super-block.
        (
            unsafe { q4k_nibbles(blk.add(16), j) },
            sub_scale(h.ds[0], j),
        )
    }
}

impl Avx2Sub for Q5_K {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn head(blk: *const u8) -> Head {
        // SAFETY: a whole super-block (the caller's contract).
        unsafe { q4k_head(blk) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sub(blk: *const u8, j: usize, h: &Head) -> (__m256i, __m256) {
        // SAFETY: qh (bytes 16..48) and the value bytes 48..176 are inside
        // the super-block.
        let (lo, qh) = unsafe {
            (
                q4k_nibbles(blk.add(48), j),
                _mm256_loadu_si256(blk.add(16).cast()),
            )
        };
        (_mm256_or_si256(lo, bit_to(qh, j, 4)), sub_scale(h.ds[0], j))
    }
}

impl Avx2Sub for Q6_K {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn head(blk: *const u8) -> Head {
        // SAFETY: bytes 192..210 of the super-block (the caller's contract).
        let ds = unsafe { group_scales(f16_pair(blk.add(206)).1, blk.add(192)) };
        Head {
            ds,
            dm: [_mm256_setzero_ps(); 2],
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sub(blk: *const u8, j: usize, h: &Head) -> (__m256i, __m256) {
        let (half, g) = (j / 4, j % 4);
        // SAFETY: ql bytes 64 half + 32 (g % 2) .. +32 and qh bytes
        // 128 + 32 half .. +32 are inside the super-block.
        let (ql, qh) = unsafe {
            (
                _mm256_loadu_si256(blk.add(64 * half + 32 * (g % 2)).cast()),
                _mm256_loadu_si256(blk.add(128 + 32 * half).cast()),
            )
        };
        let low4 = _mm256_set1_epi8(0x0f);
        let lo = if g < 2 {
            _mm256_and_si256(ql, low4)
        } else {
            _mm256_and_si256(_mm256_srli_epi16::<4>(ql), low4)
        };
        // bits 2g, 2g + 1 of each qh byte to bits 4, 5
        let hi = _mm256_slli_epi16::<4>(crumb(qh, g));
        (_mm256_or_si256(lo, hi), group_scale(&h.ds, j))
    }
}

impl Avx2Sub for Q3_K {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn head(blk: *const u8) -> Head {
        // SAFETY: bytes 96..110 of the super-block (the caller's contract).
        let (s, d) = unsafe {
            (
                std::slice::from_raw_parts(blk.add(96), 12),
                f16_pair(blk.add(106)).1,
            )
        };
        let codes = q3k_scales(s);
        // SAFETY: `codes` is 16 bytes.
        let ds = unsafe { group_scales(d, codes.as_ptr()) };
        Head {
            ds,
            dm: [_mm256_setzero_ps(); 2],
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sub(blk: *const u8, j: usize, h: &Head) -> (__m256i, __m256) {
        // SAFETY: hmask (bytes 0..32) and the code bytes 32 + 32 (j / 4) ..
        // +32 are inside the super-block.
        let (hm, qs) = unsafe {
            (
                _mm256_loadu_si256(blk.cast()),
                _mm256_loadu_si256(blk.add(32 + 32 * (j / 4)).cast()),
            )
        };
        // q + 4 = low + 4 · high
        let v = _mm256_or_si256(crumb(qs, j % 4), bit_to(hm, j, 2));
        (v, group_scale(&h.ds, j))
    }
}

impl Avx2Sub for Q2_K {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn head(blk: *const u8) -> Head {
        // SAFETY: the scale bytes 0..16 and d, dmin at 80..84 are inside the
        // super-block (the caller's contract).
        let (v, (d, dmin)) = unsafe { (_mm_loadu_si128(blk.cast()), f16_pair(blk.add(80))) };
        let low4 = _mm_set1_epi8(0x0f);
        let widen = |v: __m128i| {
            [
                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)),
                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128::<8>(v))),
            ]
        };
        let sc = widen(_mm_and_si128(v, low4));
        let mn = widen(_mm_and_si128(_mm_srli_epi16::<4>(v), low4));
        let (dv, mv) = (_mm256_set1_ps(d), _mm256_set1_ps(dmin));
        Head {
            ds: [_mm256_mul_ps(dv, sc[0]), _mm256_mul_ps(dv, sc[1])],
            dm: [_mm256_mul_ps(mv, mn[0]), _mm256_mul_ps(mv, mn[1])],
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sub(blk: *const u8, j: usize, h: &Head) -> (__m256i, __m256) {
        // SAFETY: the code bytes 16 + 32 (j / 4) .. +32 are inside the
        // super-block.
        let qs = unsafe { _mm256_loadu_si256(blk.add(16 + 32 * (j / 4)).cast()) };
        (crumb(qs, j % 4), group_scale(&h.ds, j))
    }
}

impl Avx2Sub for IQ4_XS {
    const SIGNED: bool = true;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn head(blk: *const u8) -> Head {
        // SAFETY: bytes 0..8 of the super-block (the caller's contract).
        let (head, (d, _)) = unsafe { (std::slice::from_raw_parts(blk, 8), f16_pair(blk)) };
        let z = _mm256_setzero_ps();
        let ds = _mm256_mul_ps(_mm256_set1_ps(d), i8x8_to_f32(iq4xs_scales(head)));
        Head {
            ds: [ds, z],
            dm: [z, z],
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sub(blk: *const u8, j: usize, h: &Head) -> (__m256i, __m256) {
        // SAFETY: the index bytes 8 + 16 j .. +16 are inside the super-block,
        // and KVALUES is 16 bytes.
        let (q, table) = unsafe {
            (
                _mm_loadu_si128(blk.add(8 + 16 * j).cast()),
                _mm_loadu_si128(KVALUES.as_ptr().cast()),
            )
        };
        let low4 = _mm_set1_epi8(0x0f);
        let idx = _mm256_set_m128i(
            _mm_and_si128(_mm_srli_epi16::<4>(q), low4),
            _mm_and_si128(q, low4),
        );
        let v = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(table), idx);
        (v, sub_scale(h.ds[0], j))
    }
}

/// The AVX2 kernel over `rows` (see `quant_block::quant_rows`).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; the slices must satisfy
/// `quant_rows`'s asserted bounds.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_avx2<F: KVector>(
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &Acts<'_>,
    sums: &[f32],
    m: usize,
    out_t: &mut [f32],
) {
    // One activation row per tile: 2 · 4 accumulators fit the 16 registers.
    drive!(tile, 1, F, w, row_bytes, rows, acts, sums, m, out_t)
}

/// The activations of sub-block `j` of super-block `sb` for rows
/// `i0..i0 + M`: values, lane biases (when `bias`), scale.
#[inline]
#[target_feature(enable = "avx2")]
fn load_acts<const M: usize>(
    acts: &Acts<'_>,
    i0: usize,
    b: usize,
    bias: bool,
) -> ([__m256i; M], [__m256i; M], [__m256; M]) {
    let nb = acts.cols / QK;
    let mut xv = [_mm256_setzero_si256(); M];
    let mut xb = [_mm256_setzero_si256(); M];
    let mut dx = [_mm256_setzero_ps(); M];
    for i in 0..M {
        let row = i0 + i;
        // SAFETY: check_tile (the caller's): row < i0 + M, so the 32 values
        // at row * cols + 32 b and the 8 biases at (row * nb + b) * 8 are in
        // bounds.
        unsafe {
            xv[i] = _mm256_loadu_si256(acts.q.as_ptr().add(row * acts.cols + b * QK).cast());
            if bias {
                xb[i] = _mm256_loadu_si256(acts.bias.as_ptr().add((row * nb + b) * LANES).cast());
            }
        }
        dx[i] = _mm256_set1_ps(acts.scale[row * nb + b]);
    }
    (xv, xb, dx)
}

/// The super-block's min term (see [`MinTerm`]) for rows `i0..i0 + M`.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn min_term<F: KVector, const R: usize, const M: usize>(
    acc: &mut [[[__m256; 2]; M]; R],
    heads: &[Head; R],
    acts: &Acts<'_>,
    sums: &[f32],
    i0: usize,
    sb: usize,
) {
    let nb = acts.cols / QK;
    for i in 0..M {
        let o = (i0 + i) * nb + sb * SUB;
        // SAFETY: check_tile: the 8 scales (and for Sub the 8 sums) of
        // super-block sb of row i0 + i are in bounds.
        let dxv = unsafe { _mm256_loadu_ps(acts.scale.as_ptr().add(o)) };
        match F::MIN {
            MinTerm::None => {}
            MinTerm::Sub => {
                // lane l of the even accumulator takes sub-block l's
                // SAFETY: as above.
                let sv = unsafe { _mm256_loadu_ps(sums.as_ptr().add(o)) };
                for r in 0..R {
                    let t = _mm256_mul_ps(heads[r].dm[0], dxv);
                    acc[r][i][0] = _mm256_fnmadd_ps(t, sv, acc[r][i][0]);
                }
            }
            MinTerm::Group => {
                // group g in lane g mod 8 of accumulator g / 8, with the
                // scale of its activation block g / 2
                // SAFETY: check_tile: the 256 values of super-block sb of row
                // i0 + i are in bounds.
                let gs =
                    unsafe { group_sums(acts.q.as_ptr().add((i0 + i) * acts.cols + sb * QK_K)) };
                let lo = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
                let hi = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
                let dxg = [
                    _mm256_permutevar8x32_ps(dxv, lo),
                    _mm256_permutevar8x32_ps(dxv, hi),
                ];
                for r in 0..R {
                    for h in 0..2 {
                        let t = _mm256_mul_ps(heads[r].dm[h], dxg[h]);
                        acc[r][i][h] = _mm256_fnmadd_ps(t, gs[h], acc[r][i][h]);
                    }
                }
            }
        }
    }
}

/// Outputs of weight rows `j0..j0 + R` × activation rows `i0..i0 + M`, the
/// even and odd sub-blocks in two accumulators.
// The tile's parallel arrays (accumulators, activations, weights) are
// indexed by row numbers.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn tile<F: KVector, const R: usize, const M: usize>(
    w: &[u8],
    row_bytes: usize,
    j0: usize,
    acts: &Acts<'_>,
    sums: &[f32],
    i0: usize,
) -> [[f32; M]; R] {
    check_tile::<F, R, M>(w, row_bytes, j0, acts, sums, i0);
    let nsb = acts.cols / QK_K;
    let bias = F::ACT_OFFSET != 0 && !F::SIGNED;
    let ones = _mm256_set1_epi16(1);
    let z = _mm256_setzero_ps();
    let mut acc = [[[z; 2]; M]; R];
    for sb in 0..nsb {
        let mut heads = [Head {
            ds: [z; 2],
            dm: [z; 2],
        }; R];
        let blks = super_blocks::<F, R>(w, row_bytes, j0, sb);
        for r in 0..R {
            // SAFETY: super_blocks: F::BYTES readable bytes at blks[r]; the CPU
            // has the features this function enables.
            heads[r] = unsafe { F::head(blks[r]) };
        }
        for j in 0..SUB {
            let (xv, xb, dx) = load_acts::<M>(acts, i0, sb * SUB + j, bias);
            for r in 0..R {
                // SAFETY: as above, j < 8.
                let (wv, wsc) = unsafe { F::sub(blks[r], j, &heads[r]) };
                let aw = if F::SIGNED {
                    _mm256_sign_epi8(wv, wv)
                } else {
                    wv
                };
                for i in 0..M {
                    let xi = if F::SIGNED {
                        _mm256_sign_epi8(xv[i], wv)
                    } else {
                        xv[i]
                    };
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xi), ones);
                    let p = if bias { _mm256_add_epi32(p, xb[i]) } else { p };
                    let s = _mm256_mul_ps(wsc, dx[i]);
                    let a = &mut acc[r][i][j % 2];
                    *a = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(p), *a);
                }
            }
        }
        min_term::<F, R, M>(&mut acc, &heads, acts, sums, i0, sb);
    }
    let mut out = [[0.0f32; M]; R];
    for (o, a) in out.iter_mut().zip(&acc) {
        for (o, a) in o.iter_mut().zip(a) {
            *o = fold(_mm256_add_ps(a[0], a[1]));
        }
    }
    out
}
