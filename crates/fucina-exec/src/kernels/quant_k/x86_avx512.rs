//! The AVX-512 VNNI K kernel: 512-bit `vpdpbusd` over a pair of sub-blocks
//! (`2c`, `2c + 1`) per instruction, the even one in lanes 0..8 and the odd one
//! in lanes 8..16 of one 16-lane accumulator per output, each lane's sum
//! starting from its activation bias (zero where `ACT_OFFSET` is 0); and each
//! format's decoding of a pair of sub-blocks ([`VnniPair`]), its values
//! unsigned (`q + ACT_OFFSET`).

use std::arch::x86_64::*;
use std::ops::Range;

use super::x86::{KVALUES_U8, check_tile, drive, fold, group_sums, super_blocks};
use super::x86_avx2::{Avx2Sub, Head};
use super::{Acts, IQ4_XS, KVector, LANES, MinTerm, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, QK, QK_K, SUB};

/// [`Head`] in 16 lanes: sub-block `j`'s scale (and min) in lane `j`, or
/// group `g`'s in lane `g`.
#[derive(Clone, Copy)]
pub(crate) struct Head512 {
    ds: __m512,
    dm: __m512,
}

/// A K format's decoding for the AVX-512 VNNI tile.
pub(crate) trait VnniPair: Avx2Sub {
    /// Sub-blocks `2c` (in the lower 256 bits) and `2c + 1` (in the upper
    /// 256), their values unsigned (`q + ACT_OFFSET`), and each of the 16
    /// lanes' weight scale, `h` the super-block's head.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; `blk` must
    /// be valid for reading `Self::BYTES` bytes; `c < 4`.
    unsafe fn pair(blk: *const u8, c: usize, h: &Head512) -> (__m512i, __m512);
}

/// `lo` in the lower 256 bits, `hi` in the upper.
#[inline]
#[target_feature(enable = "avx512f")]
fn join(lo: __m256, hi: __m256) -> __m512 {
    let v = _mm512_castpd256_pd512(_mm256_castps_pd(lo));
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(v, _mm256_castps_pd(hi)))
}

/// The head of the super-block at `blk` (the AVX2 one, in 16 lanes).
///
/// # Safety
/// As [`VnniPair::pair`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn head<F: KVector>(blk: *const u8) -> Head512 {
    // SAFETY: the caller's contract is Avx2Sub::head's.
    let h: Head = unsafe { F::head(blk) };
    // the upper halves are zero for a format with per sub-block scales (and
    // mins), which `join` makes sure of anyway
    let dm = match F::MIN {
        MinTerm::None => _mm512_setzero_ps(),
        MinTerm::Sub => _mm512_zextps256_ps512(h.dm[0]),
        MinTerm::Group => join(h.dm[0], h.dm[1]),
    };
    Head512 {
        ds: join(h.ds[0], h.ds[1]),
        dm,
    }
}

/// Lanes 0..8 take lane `2c` of `ds`, lanes 8..16 lane `2c + 1` (per
/// sub-block scales).
#[inline]
#[target_feature(enable = "avx512f")]
fn sub_scales(ds: __m512, c: usize) -> __m512 {
    let (a, b) = (2 * c as i32, 2 * c as i32 + 1);
    let idx = _mm512_setr_epi32(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b);
    _mm512_permutexvar_ps(idx, ds)
}

/// Lanes `4k..4k + 4` take lane `4c + k` of `ds` (per group scales).
#[inline]
#[target_feature(enable = "avx512f")]
fn group_scales(ds: __m512, c: usize) -> __m512 {
    let g = 4 * c as i32;
    let idx = _mm512_setr_epi32(
        g,
        g,
        g,
        g,
        g + 1,
        g + 1,
        g + 1,
        g + 1,
        g + 2,
        g + 2,
        g + 2,
        g + 2,
        g + 3,
        g + 3,
        g + 3,
        g + 3,
    );
    _mm512_permutexvar_ps(idx, ds)
}

/// The 32 bytes at `p` in both halves.
///
/// # Safety
/// `p` must be valid for reading 32 bytes.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn both(p: *const u8) -> __m512i {
    // SAFETY: 32 readable bytes (the caller's contract).
    _mm512_broadcast_i64x4(unsafe { _mm256_loadu_si256(p.cast()) })
}

/// `(v >> a) & mask` in the lower half and `(v >> b) & mask` in the upper, per
/// 64-bit word (a shift by at most 7 moves no bit the byte mask keeps across
/// bytes).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn shr_mask(v: __m512i, a: usize, b: usize, mask: i8) -> __m512i {
    let (a, b) = (a as i64, b as i64);
    let s = _mm512_setr_epi64(a, a, a, a, b, b, b, b);
    _mm512_and_si512(_mm512_srlv_epi64(v, s), _mm512_set1_epi8(mask))
}

/// The nibbles of sub-blocks `2c`, `2c + 1` in Q4_K's layout (`qs` the 128
/// value bytes).
///
/// # Safety
/// `qs` must be valid for reading 128 bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn q4k_pair(qs: *const u8, c: usize) -> __m512i {
    // SAFETY: bytes 32 c .. +32 of the 128 (the caller's contract, c < 4).
    let v = unsafe { both(qs.add(32 * c)) };
    shr_mask(v, 0, 4, 0x0f)
}

impl VnniPair for Q4_K {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn pair(blk: *const u8, c: usize, h: &Head512) -> (__m512i, __m512) {
        // SAFETY: the value bytes 16..144 are inside the super-block.
        (unsafe { q4k_pair(blk.add(16), c) }, sub_scales(h.ds, c))
    }
}

impl VnniPair for Q5_K {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn pair(blk: *const u8, c: usize, h: &Head512) -> (__m512i, __m512) {
        // SAFETY: qh (bytes 16..48) and the value bytes 48..176 are inside
        // the super-block.
        let (lo, qh) = unsafe { (q4k_pair(blk.add(48), c), both(blk.add(16))) };
        // bit j of qh to bit 4
        let hi = _mm512_slli_epi64::<4>(shr_mask(qh, 2 * c, 2 * c + 1, 1));
        (_mm512_or_si512(lo, hi), sub_scales(h.ds, c))
    }
}

impl VnniPair for Q6_K {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn pair(blk: *const u8, c: usize, h: &Head512) -> (__m512i, __m512) {
        let (half, p) = (c / 2, c % 2);
        // SAFETY: ql bytes 64 half .. +64 and qh bytes 128 + 32 half .. +32
        // are inside the super-block.
        let (ql, qh) = unsafe {
            (
                _mm512_loadu_si512(blk.add(64 * half).cast()),
                both(blk.add(128 + 32 * half)),
            )
        };
        // sub-blocks 2c, 2c + 1 are groups 2p, 2p + 1 of the half: the low
        // (p = 0) or high nibbles of ql, bits 2g, 2g + 1 of qh
        // (in the fewest instructions: each shift moves no bit that the
        // masks keep across bytes)
        let low4 = _mm512_set1_epi8(0x0f);
        let (lo, hi) = if p == 0 {
            let to_4 = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2);
            (_mm512_and_si512(ql, low4), _mm512_sllv_epi64(qh, to_4))
        } else {
            let to_4 = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
            (
                _mm512_and_si512(_mm512_srli_epi16::<4>(ql), low4),
                _mm512_srlv_epi64(qh, to_4),
            )
        };
        let hi = _mm512_and_si512(hi, _mm512_set1_epi8(0x30));
        (_mm512_or_si512(lo, hi), group_scales(h.ds, c))
    }
}

impl VnniPair for Q3_K {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn pair(blk: *const u8, c: usize, h: &Head512) -> (__m512i, __m512) {
        // SAFETY: hmask (bytes 0..32) and the code bytes 32 + 32 (c / 2) ..
        // +32 are inside the super-block.
        let (hm, qs) = unsafe { (both(blk), both(blk.add(32 + 32 * (c / 2)))) };
        // runs 2 (c mod 2) and 2 (c mod 2) + 1 of the half; q + 4 = low + 4 · high
        let r = 2 * (c % 2);
        let lo = shr_mask(qs, 2 * r, 2 * r + 2, 3);
        let hi = _mm512_slli_epi64::<2>(shr_mask(hm, 2 * c, 2 * c + 1, 1));
        (_mm512_or_si512(lo, hi), group_scales(h.ds, c))
    }
}

impl VnniPair for Q2_K {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn pair(blk: *const u8, c: usize, h: &Head512) -> (__m512i, __m512) {
        // SAFETY: the code bytes 16 + 32 (c / 2) .. +32 are inside the
        // super-block.
        let qs = unsafe { both(blk.add(16 + 32 * (c / 2))) };
        let r = 2 * (c % 2);
        (shr_mask(qs, 2 * r, 2 * r + 2, 3), group_scales(h.ds, c))
    }
}

impl VnniPair for IQ4_XS {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn pair(blk: *const u8, c: usize, h: &Head512) -> (__m512i, __m512) {
        // SAFETY: the index bytes 8 + 32 c .. +32 (sub-block 2c's 16, then
        // 2c + 1's) are inside the super-block; KVALUES_U8 is 16 bytes.
        let (v, table) = unsafe {
            (
                _mm256_loadu_si256(blk.add(8 + 32 * c).cast()),
                _mm_loadu_si128(KVALUES_U8.as_ptr().cast()),
            )
        };
        // 128-bit lanes: bytes 0..16 twice, then bytes 16..32 twice; the
        // second of each pair takes the high nibbles
        let v = _mm512_castsi256_si512(v);
        let v = _mm512_shuffle_i64x2::<0b01_01_00_00>(v, v);
        let s = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
        let idx = _mm512_and_si512(_mm512_srlv_epi64(v, s), _mm512_set1_epi8(0x0f));
        let u = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(table), idx);
        (u, sub_scales(h.ds, c))
    }
}

/// The AVX-512 VNNI kernel over `rows` (see `quant_block::quant_rows`).
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; the slices
/// must satisfy `quant_rows`'s asserted bounds.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn rows_vnni<F: KVector>(
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &Acts<'_>,
    sums: &[f32],
    m: usize,
    out_t: &mut [f32],
) {
    drive!(tile, 4, F, w, row_bytes, rows, acts, sums, m, out_t)
}

/// The activations of sub-blocks `b`, `b + 1` for rows `i0..i0 + M`: values,
/// lane biases (when `bias`), scales (lanes 0..8 the first, 8..16 the second).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn load_acts<const M: usize>(
    acts: &Acts<'_>,
    i0: usize,
    b: usize,
    bias: bool,
) -> ([__m512i; M], [__m512i; M], [__m512; M]) {
    let nb = acts.cols / QK;
    let pair_dx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    let mut xv = [_mm512_setzero_si512(); M];
    let mut xb = [_mm512_setzero_si512(); M];
    let mut dx = [_mm512_setzero_ps(); M];
    for i in 0..M {
        let row = i0 + i;
        // SAFETY: check_tile (the caller's): row < i0 + M, so the 64 values at
        // row * cols + 32 b, the 16 biases at (row * nb + b) * 8 and the two
        // scales at row * nb + b are in bounds (b + 1 < nb).
        unsafe {
            xv[i] = _mm512_loadu_si512(acts.q.as_ptr().add(row * acts.cols + b * QK).cast());
            if bias {
                xb[i] = _mm512_loadu_si512(acts.bias.as_ptr().add((row * nb + b) * LANES).cast());
            }
            let two = _mm_castpd_ps(_mm_load_sd(acts.scale.as_ptr().add(row * nb + b).cast()));
            dx[i] = _mm512_permutexvar_ps(pair_dx, _mm512_castps128_ps512(two));
        }
    }
    (xv, xb, dx)
}

/// The super-block's min term (see [`MinTerm`]) for rows `i0..i0 + M`.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn min_term<F: KVector, const R: usize, const M: usize>(
    acc: &mut [[__m512; M]; R],
    heads: &[Head512; R],
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
        let dxv = unsafe { _mm512_zextps256_ps512(_mm256_loadu_ps(acts.scale.as_ptr().add(o))) };
        match F::MIN {
            MinTerm::None => {}
            MinTerm::Sub => {
                // lane l < 8 takes sub-block l's
                // SAFETY: as above.
                let sv = unsafe { _mm512_zextps256_ps512(_mm256_loadu_ps(sums.as_ptr().add(o))) };
                for r in 0..R {
                    let t = _mm512_mul_ps(heads[r].dm, dxv);
                    acc[r][i] = _mm512_mask3_fnmadd_ps(t, sv, acc[r][i], 0x00ff);
                }
            }
            MinTerm::Group => {
                // lane g takes group g's, with the scale of activation block g / 2
                // SAFETY: check_tile: the 256 values of super-block sb of row
                // i0 + i are in bounds.
                let gs =
                    unsafe { group_sums(acts.q.as_ptr().add((i0 + i) * acts.cols + sb * QK_K)) };
                let gs = join(gs[0], gs[1]);
                let idx = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
                let dxg = _mm512_permutexvar_ps(idx, dxv);
                for r in 0..R {
                    let t = _mm512_mul_ps(heads[r].dm, dxg);
                    acc[r][i] = _mm512_fnmadd_ps(t, gs, acc[r][i]);
                }
            }
        }
    }
}

/// Outputs of weight rows `j0..j0 + R` × activation rows `i0..i0 + M`.
// The tile's parallel arrays (accumulators, activations, weights) are
// indexed by row numbers.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
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
    let bias = F::ACT_OFFSET != 0;
    let z = _mm512_setzero_ps();
    let mut acc = [[z; M]; R];
    for sb in 0..nsb {
        let mut heads = [Head512 { ds: z, dm: z }; R];
        let blks = super_blocks::<F, R>(w, row_bytes, j0, sb);
        for r in 0..R {
            // SAFETY: super_blocks: F::BYTES readable bytes at blks[r]; the CPU
            // has the features this function enables.
            heads[r] = unsafe { head::<F>(blks[r]) };
        }
        for c in 0..SUB / 2 {
            let (xv, xb, dx) = load_acts::<M>(acts, i0, sb * SUB + 2 * c, bias);
            for r in 0..R {
                // SAFETY: as above, c < 4.
                let (wv, wsc) = unsafe { F::pair(blks[r], c, &heads[r]) };
                for i in 0..M {
                    let p = _mm512_dpbusd_epi32(xb[i], wv, xv[i]);
                    let s = _mm512_mul_ps(wsc, dx[i]);
                    acc[r][i] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(p), acc[r][i]);
                }
            }
        }
        min_term::<F, R, M>(&mut acc, &heads, acts, sums, i0, sb);
    }
    let mut out = [[0.0f32; M]; R];
    for (o, a) in out.iter_mut().zip(&acc) {
        for (o, &a) in o.iter_mut().zip(a) {
            let lo = _mm512_castps512_ps256(a);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a)));
            *o = fold(_mm256_add_ps(lo, hi));
        }
    }
    out
}
