//! The AVX-512 VNNI tile of the super-block activation product (see `q8k`)
//! for one activation row (`m = 1`, a batch-1 decode step): four weight rows
//! at a time, each super-block's activations loaded once for the four rows as
//! 64-byte vectors in the order the format's codes come out of its bytes
//! (Q4_K, Q5_K: sub-blocks `(0, 2)`, `(1, 3)`, `(4, 6)`, `(5, 7)` side by
//! side, the low and high nibbles of 64 code bytes; Q6_K: in order), two
//! sub-blocks per `vpmaddubsw` and per `vpdpwssd` (the pair sums times their
//! 16-bit scales added into i32 lanes, exact). The other formats take their
//! 256-bit lanes (`q8k_x86`). The float part is `q8k_x86`'s one-row tile's:
//! the four outputs' integers summed (`vphaddd`), then the module order's
//! IEEE operations lane by lane, so the bits are those of every other path.

use std::arch::x86_64::*;
use std::ops::Range;

use super::QK_K;
use super::q8k::{GROUPS, KActs, Q8kVector};
use super::q8k_x86::{Q8kAvx2, check_tile, float_four, min_lanes, offset_fix, tile_vnni};
use super::x86::super_blocks;
use crate::kernels::quant_block::q4_k::q4k_scales_u64;
use crate::kernels::quant_block::{IQ4_XS, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K};

/// A format's integer lanes for the one-row AVX-512 tile.
pub(crate) trait Q8kZmm: Q8kAvx2 {
    /// The 256 activations at `x` as [`lanes1`](Self::lanes1) reads them
    /// (unused by the formats that keep their 256-bit lanes).
    ///
    /// # Safety
    /// The CPU must have AVX-512 F/BW; `x` valid for reading 256 bytes.
    #[inline(always)]
    unsafe fn acts(x: *const i8) -> [__m512i; 4] {
        let _ = x;
        // SAFETY: AVX-512 F (the caller's contract).
        [unsafe { _mm512_setzero_si512() }; 4]
    }

    /// Eight i32 lanes summing to `I` and eight summing to `N` (zeros
    /// without a min) of the super-block at `blk` with the activations `x`
    /// (`xz` their [`acts`](Self::acts)) and their group sums `bs`: by
    /// default the 256-bit lanes of `q8k_x86`.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; `blk`
    /// valid for reading `Self::BYTES` bytes, `x` 256, `bs` 16 `i16`.
    #[inline(always)]
    unsafe fn lanes1(
        blk: *const u8,
        x: *const i8,
        xz: &[__m512i; 4],
        bs: *const i16,
    ) -> (__m256i, __m256i) {
        let _ = xz;
        // SAFETY: the caller's contract.
        let (i, n) = unsafe { Self::lanes::<1>(blk, &[x], &[bs]) };
        (i[0], n[0])
    }
}

impl Q8kZmm for Q3_K {}
impl Q8kZmm for Q2_K {}
impl Q8kZmm for IQ4_XS {}

/// `v`'s 16 i32 lanes summed pairwise into eight (exact).
#[inline]
#[target_feature(enable = "avx512f")]
fn fold(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))
}

/// A vector whose lower 256 bits are `lo` in every 16-bit lane and upper
/// 256 bits `hi`.
#[inline]
#[target_feature(enable = "avx512f")]
fn halves16(lo: i16, hi: i16) -> __m512i {
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_set1_epi16(lo)),
        _mm256_set1_epi16(hi),
    )
}

/// Q4_K's and Q5_K's activations: sub-blocks `(0, 2)`, `(1, 3)`, `(4, 6)`,
/// `(5, 7)` (lower, upper 256 bits).
///
/// # Safety
/// AVX-512 F; `x` valid for reading 256 bytes.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn q45k_acts(x: *const i8) -> [__m512i; 4] {
    // SAFETY: sub-block j's 32 bytes at 32 j < 256 (the caller's contract).
    let s = |j: usize| unsafe { _mm256_loadu_si256(x.add(32 * j).cast()) };
    let pair = |a: usize, b: usize| _mm512_inserti64x4::<1>(_mm512_castsi256_si512(s(a)), s(b));
    [pair(0, 2), pair(1, 3), pair(4, 6), pair(5, 7)]
}

/// The Q4_K / Q5_K lanes: `qs` the 128 nibble bytes, `qh` the 32 bytes of
/// fifth bits (Q5_K), `xz` the activations of [`q45k_acts`].
///
/// # Safety
/// The tile's features; `head` valid for 16 bytes, `qs` for 128, `qh` (when
/// given) for 32, `bs` for 16 `i16`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2")]
unsafe fn q45k_lanes1(
    head: *const u8,
    qs: *const u8,
    qh: Option<*const u8>,
    xz: &[__m512i; 4],
    bs: *const i16,
) -> (__m256i, __m256i) {
    // SAFETY: 16 header bytes (the caller's contract).
    let (sc, mn) = q4k_scales_u64(unsafe { &std::slice::from_raw_parts(head, 16)[4..16] });
    // the eight scales as 16-bit lanes, in each 128-bit lane
    let scz = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
    // SAFETY: 32 bytes of fifth bits (the caller's contract).
    let h = qh.map(|p| _mm512_broadcast_i64x4(unsafe { _mm256_loadu_si256(p.cast()) }));
    let low4 = _mm512_set1_epi8(0x0f);
    // the byte pair (2 lane, 2 lane + 1) as one 16-bit word
    let pair = |lane: usize| (2 * lane as i16) | ((2 * lane as i16 + 1) << 8);
    let mut acc = _mm512_setzero_si512();
    for c in 0..2 {
        // SAFETY: bytes 64 c .. +64 of the 128 (the caller's contract).
        let v = unsafe { _mm512_loadu_si512(qs.add(64 * c).cast()) };
        // sub-blocks (4c, 4c + 2) in the low nibbles, (4c + 1, 4c + 3) in
        // the high ones
        let mut lo = _mm512_and_si512(v, low4);
        let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low4);
        if let Some(h) = h {
            // bit j of each byte for sub-block j, to bit 4 (a 16-bit shift by
            // at most 7 moves no bit the mask keeps across bytes)
            let bit = |a: usize, b: usize| {
                let s = _mm512_srlv_epi16(h, halves16(a as i16, b as i16));
                _mm512_slli_epi16::<4>(_mm512_and_si512(s, _mm512_set1_epi8(1)))
            };
            lo = _mm512_or_si512(lo, bit(4 * c, 4 * c + 2));
            hi = _mm512_or_si512(hi, bit(4 * c + 1, 4 * c + 3));
        }
        let s_lo = _mm512_shuffle_epi8(scz, halves16(pair(4 * c), pair(4 * c + 2)));
        let s_hi = _mm512_shuffle_epi8(scz, halves16(pair(4 * c + 1), pair(4 * c + 3)));
        acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(lo, xz[2 * c]), s_lo);
        acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(hi, xz[2 * c + 1]), s_hi);
    }
    // SAFETY: the group sums (the caller's contract).
    (fold(acc), unsafe { min_lanes::<1>(mn, &[bs]) }[0])
}

impl Q8kZmm for Q4_K {
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn acts(x: *const i8) -> [__m512i; 4] {
        // SAFETY: the caller's contract.
        unsafe { q45k_acts(x) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn lanes1(
        blk: *const u8,
        _x: *const i8,
        xz: &[__m512i; 4],
        bs: *const i16,
    ) -> (__m256i, __m256i) {
        // SAFETY: the header 0..16 and the nibbles 16..144 are inside the
        // super-block (the caller's contract).
        unsafe { q45k_lanes1(blk, blk.add(16), None, xz, bs) }
    }
}

impl Q8kZmm for Q5_K {
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn acts(x: *const i8) -> [__m512i; 4] {
        // SAFETY: the caller's contract.
        unsafe { q45k_acts(x) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn lanes1(
        blk: *const u8,
        _x: *const i8,
        xz: &[__m512i; 4],
        bs: *const i16,
    ) -> (__m256i, __m256i) {
        // SAFETY: the header 0..16, the fifth bits 16..48 and the nibbles
        // 48..176 are inside the super-block (the caller's contract).
        unsafe { q45k_lanes1(blk, blk.add(48), Some(blk.add(16)), xz, bs) }
    }
}

impl Q8kZmm for Q6_K {
    /// In order: sub-blocks `(0, 1)`, `(2, 3)`, `(4, 5)`, `(6, 7)`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn acts(x: *const i8) -> [__m512i; 4] {
        // SAFETY: 256 bytes (the caller's contract).
        std::array::from_fn(|k| unsafe { _mm512_loadu_si512(x.add(64 * k).cast()) })
    }

    /// `Σ sc[g] · q · x` over the unsigned codes `q` (`0..=63`), less
    /// `32 · Σ sc[g] · bs[g]`; each 128-bit lane one group of 16.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn lanes1(
        blk: *const u8,
        _x: *const i8,
        xz: &[__m512i; 4],
        bs: *const i16,
    ) -> (__m256i, __m256i) {
        // SAFETY: the 16 scales at 192..208 are inside the super-block.
        let s16 = _mm256_cvtepi8_epi16(unsafe { _mm_loadu_si128(blk.add(192).cast()) });
        let s16z = _mm512_castsi256_si512(s16);
        let low4 = _mm512_set1_epi8(0x0f);
        let mut acc = _mm512_setzero_si512();
        for half in 0..2 {
            // SAFETY: ql bytes 64 half .. +64 and qh bytes 128 + 32 half ..
            // +32 are inside the super-block.
            let (a, h) = unsafe {
                (
                    _mm512_loadu_si512(blk.add(64 * half).cast()),
                    _mm512_broadcast_i64x4(_mm256_loadu_si256(blk.add(128 + 32 * half).cast())),
                )
            };
            // bits (2g, 2g + 1) of each qh byte to bits 4, 5 for sub-blocks
            // 4 half + g, lower and upper 256 bits (a 16-bit shift by at most
            // 6 moves no bit the mask keeps across bytes)
            let top = |g0: i16, g1: i16| {
                let s = _mm512_srlv_epi16(h, halves16(2 * g0, 2 * g1));
                _mm512_slli_epi16::<4>(_mm512_and_si512(s, _mm512_set1_epi8(3)))
            };
            // the low nibbles: sub-blocks 4 half (the first 32 bytes) and
            // 4 half + 1; the high ones 4 half + 2 and 4 half + 3
            let q0 = _mm512_or_si512(_mm512_and_si512(a, low4), top(0, 1));
            let q1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(a), low4), top(2, 3));
            // groups 8 half + 4 k .. + 4, one to each 128-bit lane
            let sc = |k: i16| {
                let g = 8 * half as i16 + 4 * k;
                let idx = _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm256_set_m128i(
                        _mm_set1_epi16(g + 1),
                        _mm_set1_epi16(g),
                    )),
                    _mm256_set_m128i(_mm_set1_epi16(g + 3), _mm_set1_epi16(g + 2)),
                );
                _mm512_permutexvar_epi16(idx, s16z)
            };
            acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(q0, xz[2 * half]), sc(0));
            acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(q1, xz[2 * half + 1]), sc(1));
        }
        let mut iv = [fold(acc)];
        // SAFETY: the group sums (the caller's contract).
        unsafe { offset_fix(&mut iv, s16, &[bs], 5) };
        (iv[0], _mm256_setzero_si256())
    }
}

/// The outputs of weight rows `j0..j0 + 4` with activation row `i0` (the
/// float part of `q8k_x86`'s one-row tile).
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile_m1<F: Q8kVector>(
    w: &[u8],
    row_bytes: usize,
    j0: usize,
    acts: &KActs<'_>,
    i0: usize,
) -> [f32; 4] {
    check_tile::<F, 4, 1>(w, row_bytes, j0, acts, i0);
    let nb = acts.cols / QK_K;
    // SAFETY: the caller's contract (the features); every read below is
    // inside the bounds check_tile asserted.
    unsafe {
        let mut acc = _mm_setzero_ps();
        for b in 0..nb {
            let x = acts.q.as_ptr().add(i0 * acts.cols + b * QK_K);
            let bs = acts.bsums.as_ptr().add((i0 * nb + b) * GROUPS);
            let dx = *acts.d.get_unchecked(i0 * nb + b);
            let xz = F::acts(x);
            let blks = super_blocks::<F, 4>(w, row_bytes, j0, b);
            let mut heads = [(0.0f32, 0.0f32); 4];
            let mut iv = [_mm256_setzero_si256(); 4];
            let mut nv = [_mm256_setzero_si256(); 4];
            for r in 0..4 {
                heads[r] = F::head(blks[r]);
                (iv[r], nv[r]) = F::lanes1(blks[r], x, &xz, bs);
            }
            acc = float_four::<F>(acc, &heads, &iv, &nv, dx);
        }
        let mut out = [0.0f32; 4];
        _mm_storeu_ps(out.as_mut_ptr(), acc);
        out
    }
}

/// The one-activation-row kernel over `rows` (see `q8k::q8k_rows`): tiles of
/// four weight rows, single rows at the end (`q8k_x86`'s tile).
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; the slices
/// must satisfy `q8k_rows`'s asserted bounds for `m = 1`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn rows_m1<F: Q8kVector>(
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &KActs<'_>,
    out_t: &mut [f32],
) {
    let start = rows.start;
    let mut j = start;
    while j + 4 <= rows.end {
        // SAFETY: this function enables the tile's features.
        let o = unsafe { tile_m1::<F>(w, row_bytes, j, acts, 0) };
        out_t[j - start..j - start + 4].copy_from_slice(&o);
        j += 4;
    }
    for j in j..rows.end {
        out_t[j - start] = tile_vnni::<F, 1, 1>(w, row_bytes, j, acts, (), 0)[0][0];
    }
}
