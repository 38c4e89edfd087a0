//! What the x86-64 K kernels share: the tile driver (`quant_dot`'s: tiles of
//! `R` weight rows × `M` activation rows; each sub-block's weights are decoded
//! once for the `M` rows and each activation block loaded once for the `R`
//! rows, in the fixed order of the module docs), the tile's bounds checks, the
//! final lane fold, and the group sums of Q2_K's min term.

use std::arch::x86_64::*;

use super::{Acts, KVector, LANES, MinTerm, QK};
use crate::kernels::quant_block::BlockFormat;
use crate::kernels::quant_block::iq4_nl::KVALUES;

/// How far ahead of the super-block being read the weights are prefetched.
pub(super) const PREFETCH_BYTES: usize = 768;

/// The tile driver of every in-place quantized kernel (`quant_dot`'s): tiles
/// of up to `$mt` activation rows and four weight rows, prefill-sized calls
/// in L2-sized chunks of activation rows.
pub(super) use crate::kernels::quant_dot::x86::drive;

/// Checks a tile's reads against the slices (once per tile).
#[inline(always)]
pub(super) fn check_tile<F: KVector, const R: usize, const M: usize>(
    w: &[u8],
    row_bytes: usize,
    j0: usize,
    acts: &Acts<'_>,
    sums: &[f32],
    i0: usize,
) {
    let nb = acts.cols / QK;
    assert!((j0 + R) * row_bytes <= w.len(), "quant_k tile: weight rows");
    assert!(
        (i0 + M) * acts.cols <= acts.q.len(),
        "quant_k tile: activations"
    );
    assert!((i0 + M) * nb <= acts.scale.len(), "quant_k tile: scales");
    assert!(
        (i0 + M) * nb * LANES <= acts.bias.len(),
        "quant_k tile: biases"
    );
    // only the sub-block min term reads the sums
    if F::MIN == MinTerm::Sub {
        assert!((i0 + M) * nb <= sums.len(), "quant_k tile: sums");
    }
}

/// The addresses of super-block `sb` of weight rows `j0..j0 + R`, the weights
/// [`PREFETCH_BYTES`] ahead of each prefetched. Each address is valid for
/// reading `F::BYTES` bytes when [`check_tile`] passed for the tile.
#[inline(always)]
pub(super) fn super_blocks<F: BlockFormat, const R: usize>(
    w: &[u8],
    row_bytes: usize,
    j0: usize,
    sb: usize,
) -> [*const u8; R] {
    let mut blks = [std::ptr::null::<u8>(); R];
    for (r, b) in blks.iter_mut().enumerate() {
        // wrapping arithmetic: computing the address reads nothing (the tile's
        // check_tile bounds every read through it)
        let blk = w
            .as_ptr()
            .wrapping_add((j0 + r) * row_bytes + sb * F::BYTES);
        *b = blk;
        for l in 0..F::BYTES.div_ceil(64) {
            // SAFETY: SSE is part of the x86-64 baseline, and a prefetch never
            // faults, whatever the address.
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(PREFETCH_BYTES + 64 * l).cast());
                // the same super-block of the next tile's row into L2: the
                // tile's rows are short streams the hardware prefetcher
                // does not run ahead of
                _mm_prefetch::<_MM_HINT_T1>(blk.wrapping_add(R * row_bytes + 64 * l).cast());
            };
        }
    }
    blks
}

/// The eight lanes folded in halves (l + 4, l + 2, l + 1).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn fold(v: __m256) -> f32 {
    let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let q = _mm_add_ps(h, _mm_movehl_ps(h, h));
    _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps::<0b01>(q, q)))
}

/// The two f16 values at `p`, widened.
///
/// # Safety
/// `p` must be valid for reading four bytes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn f16_pair(p: *const u8) -> (f32, f32) {
    // SAFETY: four readable bytes (the caller's contract).
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(unsafe {
        p.cast::<i32>().read_unaligned()
    }));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

/// The eight bytes of `v` (unsigned) widened to eight f32.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn u8x8_to_f32(v: u64) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v as i64)))
}

/// The eight bytes of `v` (signed) widened to eight f32.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn i8x8_to_f32(v: u64) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(v as i64)))
}

/// The sixteen 6-bit scale codes of a Q3_K super-block minus 32 (`−32..=31`),
/// from its 12 scale bytes `s` (llama.cpp's unpacking, four codes per word).
#[inline(always)]
pub(super) fn q3k_scales(s: &[u8]) -> [u8; 16] {
    let word = |i: usize| u32::from_le_bytes([s[i], s[i + 1], s[i + 2], s[i + 3]]);
    let (a0, a1, a2) = (word(0), word(4), word(8));
    let (k1, k2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
    let r = [
        (a0 & k2) | ((a2 & k1) << 4),
        (a1 & k2) | (((a2 >> 2) & k1) << 4),
        ((a0 >> 4) & k2) | (((a2 >> 4) & k1) << 4),
        ((a1 >> 4) & k2) | (((a2 >> 6) & k1) << 4),
    ];
    let mut out = [0u8; 16];
    for (o, w) in out.chunks_exact_mut(4).zip(r) {
        // each byte is 0..=63: subtracting 32 from each never borrows across
        // bytes once 0x80 is set in each
        let v = (w | 0x8080_8080).wrapping_sub(0x2020_2020) ^ 0x8080_8080;
        o.copy_from_slice(&v.to_le_bytes());
    }
    out
}

/// The sums of the 16 groups of 16 activations of a super-block (`q` its 256
/// int8 values), as f32 (exact): groups 0..8 and 8..16.
///
/// # Safety
/// `q` must be valid for reading 256 bytes.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn group_sums(q: *const i8) -> [__m256; 2] {
    let ones8 = _mm256_set1_epi8(1);
    let ones16 = _mm256_set1_epi16(1);
    // lane l of sub-block j: the sum of its 4 values
    let lanes = |j: usize| {
        // SAFETY: 32 bytes at 32 j < 256 (the caller's contract).
        let x = unsafe { _mm256_loadu_si256(q.add(QK * j).cast()) };
        _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, x), ones16)
    };
    // [g0, g2, g4, g6 | g1, g3, g5, g7] for sub-blocks 4h..4h + 4, then in order
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let mut out = [_mm256_setzero_ps(); 2];
    for (h, o) in out.iter_mut().enumerate() {
        let a = _mm256_hadd_epi32(lanes(4 * h), lanes(4 * h + 1));
        let b = _mm256_hadd_epi32(lanes(4 * h + 2), lanes(4 * h + 3));
        let g = _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(a, b), order);
        *o = _mm256_cvtepi32_ps(g);
    }
    out
}

/// The eight 6-bit scale codes of an IQ4_XS super-block minus 32
/// (`−32..=31`, as signed bytes of a little-endian word), from its bytes
/// `blk[2..8]` (`scales_h`, then `scales_l`).
#[inline(always)]
pub(super) fn iq4xs_scales(blk: &[u8]) -> u64 {
    let h = u16::from_le_bytes([blk[2], blk[3]]);
    let mut out = [0u8; 8];
    for (j, o) in out.iter_mut().enumerate() {
        let lo = (blk[4 + j / 2] >> (4 * (j % 2))) & 15;
        let ls = lo | ((((h >> (2 * j)) & 3) as u8) << 4);
        *o = ls.wrapping_sub(32);
    }
    u64::from_le_bytes(out)
}

/// The table of IQ4_NL and IQ4_XS values plus 128 (`1..=241`, unsigned).
pub(super) const KVALUES_U8: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (KVALUES[i] as i16 + 128) as u8;
        i += 1;
    }
    t
};
