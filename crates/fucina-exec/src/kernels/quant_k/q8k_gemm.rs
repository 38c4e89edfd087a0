//! The AVX-512 VNNI product of many activation rows with K-format (Q2_K,
//! Q3_K, Q4_K, Q5_K, Q6_K) and IQ4_XS weights on the super-block activations
//! of `q8k` (a prefill, a batch of 8 or more): a GEMM in the layout of int8
//! GEMMs.
//!
//! The weight rows are taken 16 at a time (a *tile*). A few super-blocks of
//! the tile are unpacked once into a buffer on the stack (`CHUNK` of them):
//! the codes as unsigned bytes (Q3_K's `q + 4`, Q6_K's `q + 32` and IQ4_XS's
//! table values `+ 128`, each offset taken back out with the group sums),
//! transposed so that one 512-bit vector holds the four codes `4 g .. 4 g + 4`
//! of each of the 16 rows; the integer sub-block (Q2_K, Q3_K, Q6_K: group)
//! scales as i32, one vector per sub-block; the coefficients of the
//! activation group sums as 16-bit pairs; `d` and `dmin` as f32. Then every
//! activation row meets the unpacked chunk, eight rows at a time: `vpdpbusd`
//! of a code vector with four activations broadcast (16 weight rows × 4
//! columns per instruction), one i32 accumulator per activation row and
//! sub-block, multiplied by the sub-block scales (`vpmulld`) into the
//! super-block's `I`; `vpdpwssd` of the group sums with the mins (Q3_K, Q6_K,
//! IQ4_XS: with the scales, for their code offset) into `N`; then the float
//! part of `q8k`'s order, lane `r` the output of weight row `r`, the same IEEE
//! operations as the portable loop. The integers are exact, so the outputs
//! are the same bits as every other path's.
//!
//! The outputs of a tile are `[m][16]` (activation row major, 16 weight rows
//! side by side: one vector per activation row); they hold the running
//! accumulators between chunks. `quant_matmul` writes them to its output
//! with `q8k::untranspose_tiles`.
//!
//! The walk over tiles, chunks and activation rows ([`drive`]) is shared
//! with the AVX2 GEMM (`q8k_gemm_avx2`): each level gives its micro-kernel
//! ([`GemmMicro`]: the chunk size, the activation rows per call, its
//! unpacking and its inner product).

use std::arch::x86_64::*;
use std::ops::Range;

use super::QK_K;
use super::q8k::{GROUPS, KActs, Q8kDot};
use super::q8k_x86::{fifth_bit, iq4xs_table, iq4xs_value, low2, q3k_code};
use crate::kernels::quant_block::q4_k::q4k_scales_u64;
use crate::kernels::quant_block::{IQ4_XS, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K};
use crate::kernels::quant_block::{iq4_xs, q3_k};

/// Weight rows per tile (the lanes of a 512-bit vector of i32).
const TILE: usize = super::q8k::GEMM_TILE;

/// Super-blocks unpacked at a time (`CHUNK · SB_VECS · 64` bytes of stack).
pub(super) const CHUNK: usize = 4;

/// Activation rows per micro-kernel call.
const MR: usize = 8;

/// 64 bytes, aligned to a cache line (one 512-bit vector).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct Z([u32; 16]);

/// Vectors per unpacked super-block: 64 of codes, then 32 of the format's
/// meta dwords (scales, group sum coefficients, `d`, `dmin`; see
/// [`Q8kGemm::meta`]).
pub(super) const SB_VECS: usize = 64 + 32;

/// The first meta vector of an unpacked super-block.
pub(super) const META: usize = 64;

/// A format the GEMM unpacks.
pub(crate) trait Q8kGemm: Q8kDot {
    /// Scale groups per super-block: 8 (sub-blocks of 32) or 16 (groups of
    /// 16).
    const NS: usize;

    /// The 256 codes of the super-block at `blk` as unsigned bytes, element
    /// order, 32 per vector.
    ///
    /// # Safety
    /// The CPU must have AVX2; `blk` valid for reading `Self::BYTES` bytes.
    unsafe fn codes(blk: *const u8) -> [__m256i; 8];

    /// The offset of the unsigned codes of a format without a min: the
    /// value is `code − OFFSET`, and `I` is `Σ sc · Σ code · x − OFFSET · N`
    /// with `N = Σ_g c[g] · bs[g]` (the coefficients `c` the group scales);
    /// 0 for a format with a min.
    const OFFSET: i32;

    /// The first of the 8 meta dwords holding the group sum coefficients as
    /// 16-bit pairs `(c[2p], c[2p + 1])`, where `N = Σ_g c[g] · bs[g]`.
    const COEF: usize;
    /// The meta dword of `d` (f32 bits).
    const D: usize;
    /// The meta dword of `dmin` (f32 bits; a zero dword without a min).
    const DMIN: usize;

    /// The 32 meta dwords of the super-block at `blk`: dwords `0 .. NS` the
    /// integer scales (i32), `COEF .. COEF + 8` the coefficient pairs, `D`
    /// and `DMIN` the f32 scales, the others zero.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F/BW, AVX2 and F16C; `blk` valid for
    /// reading `Self::BYTES` bytes.
    unsafe fn meta(blk: *const u8) -> [__m512i; 2];
}

/// The Q4_K / Q5_K codes (`qs` the 128 nibble bytes, `qh` the fifth bits).
///
/// # Safety
/// AVX2; `qs` valid for 128 bytes, `qh` (when given) for 32.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn q45k_codes(qs: *const u8, qh: Option<*const u8>) -> [__m256i; 8] {
    let low4 = _mm256_set1_epi8(0x0f);
    // SAFETY: 32 bytes of fifth bits (the caller's contract).
    let h = qh.map(|p| unsafe { _mm256_loadu_si256(p.cast()) });
    let mut out = [_mm256_setzero_si256(); 8];
    for c in 0..4 {
        // SAFETY: bytes 32 c .. +32 of the 128 (the caller's contract).
        let v = unsafe { _mm256_loadu_si256(qs.add(32 * c).cast()) };
        let mut lo = _mm256_and_si256(v, low4);
        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low4);
        if let Some(h) = h {
            lo = _mm256_or_si256(lo, fifth_bit(h, 2 * c));
            hi = _mm256_or_si256(hi, fifth_bit(h, 2 * c + 1));
        }
        out[2 * c] = lo;
        out[2 * c + 1] = hi;
    }
    out
}

/// Q4_K's and Q5_K's meta dwords: the eight scales at 0, the pairs
/// `(mn[j], mn[j])` at 8 (group sums `2j` and `2j + 1` share sub-block `j`'s
/// min), `d` at 16, `dmin` at 17.
///
/// # Safety
/// AVX-512 F/BW, AVX2, F16C; `blk` valid for 16 bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
unsafe fn q45k_meta(blk: *const u8) -> [__m512i; 2] {
    // SAFETY: the 16 header bytes (the caller's contract).
    let head = unsafe { std::slice::from_raw_parts(blk, 16) };
    let (sc, mn) = q4k_scales_u64(&head[4..16]);
    let scv = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(sc as i64));
    let mn16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mn as i64));
    let co = _mm256_set_m128i(
        _mm_unpackhi_epi16(mn16, mn16),
        _mm_unpacklo_epi16(mn16, mn16),
    );
    // SAFETY: bytes 0..4 (`d`, `dmin`).
    let dd = _mm_cvtph_ps(_mm_cvtsi32_si128(unsafe {
        blk.cast::<i32>().read_unaligned()
    }));
    [
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(scv), co),
        _mm512_zextsi128_si512(_mm_castps_si128(dd)),
    ]
}

impl Q8kGemm for Q4_K {
    const OFFSET: i32 = 0;
    const NS: usize = 8;
    const COEF: usize = 8;
    const D: usize = 16;
    const DMIN: usize = 17;

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn codes(blk: *const u8) -> [__m256i; 8] {
        // SAFETY: the nibbles 16..144 are inside the super-block.
        unsafe { q45k_codes(blk.add(16), None) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
    unsafe fn meta(blk: *const u8) -> [__m512i; 2] {
        // SAFETY: the header is inside the super-block.
        unsafe { q45k_meta(blk) }
    }
}

impl Q8kGemm for Q5_K {
    const OFFSET: i32 = 0;
    const NS: usize = 8;
    const COEF: usize = 8;
    const D: usize = 16;
    const DMIN: usize = 17;

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn codes(blk: *const u8) -> [__m256i; 8] {
        // SAFETY: the fifth bits 16..48 and the nibbles 48..176 are inside
        // the super-block.
        unsafe { q45k_codes(blk.add(48), Some(blk.add(16))) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
    unsafe fn meta(blk: *const u8) -> [__m512i; 2] {
        // SAFETY: the header is inside the super-block.
        unsafe { q45k_meta(blk) }
    }
}

impl Q8kGemm for Q6_K {
    const OFFSET: i32 = 32;
    const NS: usize = 16;
    const COEF: usize = 16;
    const D: usize = 24;
    const DMIN: usize = 25;

    /// The unsigned 6-bit codes `q` (`0..=63`; the value is `q − 32`).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn codes(blk: *const u8) -> [__m256i; 8] {
        let low4 = _mm256_set1_epi8(0x0f);
        let mut out = [_mm256_setzero_si256(); 8];
        for half in 0..2 {
            // SAFETY: ql bytes 64 half .. +64 and qh bytes 128 + 32 half ..
            // +32 are inside the super-block.
            let (a, b, h) = unsafe {
                (
                    _mm256_loadu_si256(blk.add(64 * half).cast()),
                    _mm256_loadu_si256(blk.add(64 * half + 32).cast()),
                    _mm256_loadu_si256(blk.add(128 + 32 * half).cast()),
                )
            };
            for g in 0..4 {
                let src = if g % 2 == 0 { a } else { b };
                let lo = if g < 2 {
                    _mm256_and_si256(src, low4)
                } else {
                    _mm256_and_si256(_mm256_srli_epi16::<4>(src), low4)
                };
                // bits 2g, 2g + 1 of each qh byte to bits 4, 5 (a 16-bit
                // shift by at most 6 moves no bit the mask keeps across bytes)
                let hb = _mm256_and_si256(
                    _mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * g as i32)),
                    _mm256_set1_epi8(3),
                );
                out[4 * half + g] = _mm256_or_si256(lo, _mm256_slli_epi16::<4>(hb));
            }
        }
        out
    }

    /// The sixteen int8 group scales at 0, the same as the coefficients of
    /// the group sums at 16 (the offset: `I = Σ sc · Σ q · x − 32 · Σ sc ·
    /// bs`), `d` at 24.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
    unsafe fn meta(blk: *const u8) -> [__m512i; 2] {
        // SAFETY: the super-block (the caller's contract).
        let (s8, d) = unsafe { q6k_head(blk) };
        meta16(s8, s8, true, d)
    }
}

/// The meta of a format with sixteen group scales: the scales `sc` (int8 or
/// unsigned bytes, `signed` saying which) at 0, the group sum coefficients
/// `co` (the same kind) at 16, the f32 `d` and `dmin` of `dd` at 24, 25.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
fn meta16(sc: __m128i, co: __m128i, signed: bool, dd: __m128) -> [__m512i; 2] {
    let (s32, c16) = if signed {
        (_mm512_cvtepi8_epi32(sc), _mm256_cvtepi8_epi16(co))
    } else {
        (_mm512_cvtepu8_epi32(sc), _mm256_cvtepu8_epi16(co))
    };
    let lo2 = _mm_castps_si128(_mm_movelh_ps(dd, _mm_setzero_ps()));
    [
        s32,
        _mm512_inserti32x4::<2>(_mm512_zextsi256_si512(c16), lo2),
    ]
}

impl Q8kGemm for Q3_K {
    const OFFSET: i32 = 4;
    const NS: usize = 16;
    const COEF: usize = 16;
    const D: usize = 24;
    const DMIN: usize = 25;

    /// The unsigned codes `q + 4` (`0..=7`).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn codes(blk: *const u8) -> [__m256i; 8] {
        // SAFETY: hmask 0..32 and the codes 32..96 are inside the
        // super-block.
        let (hm, v) = unsafe {
            (
                _mm256_loadu_si256(blk.cast()),
                [
                    _mm256_loadu_si256(blk.add(32).cast()),
                    _mm256_loadu_si256(blk.add(64).cast()),
                ],
            )
        };
        std::array::from_fn(|j| q3k_code(v[j / 4], hm, j))
    }

    /// The sixteen group scales `ls − 32` at 0 and as the coefficients at
    /// 16 (the offset: `I = Σ sc · Σ (q + 4) · x − 4 · Σ sc · bs`), `d` at
    /// 24.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
    unsafe fn meta(blk: *const u8) -> [__m512i; 2] {
        // SAFETY: the super-block (the caller's contract).
        let (s8, d) = unsafe { q3k_head(blk) };
        meta16(s8, s8, true, d)
    }
}

impl Q8kGemm for Q2_K {
    const OFFSET: i32 = 0;
    const NS: usize = 16;
    const COEF: usize = 16;
    const D: usize = 24;
    const DMIN: usize = 25;

    /// The 2-bit codes (`0..=3`).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn codes(blk: *const u8) -> [__m256i; 8] {
        // SAFETY: the codes 16..80 are inside the super-block.
        let v = unsafe {
            [
                _mm256_loadu_si256(blk.add(16).cast()),
                _mm256_loadu_si256(blk.add(48).cast()),
            ]
        };
        std::array::from_fn(|j| low2(v[j / 4], j % 4))
    }

    /// The sixteen 4-bit scales at 0, the sixteen 4-bit mins as the
    /// coefficients at 16, `d` at 24, `dmin` at 25.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
    unsafe fn meta(blk: *const u8) -> [__m512i; 2] {
        // SAFETY: the super-block (the caller's contract).
        let (sc, mn, dd) = unsafe { q2k_head(blk) };
        meta16(sc, mn, false, dd)
    }
}

impl Q8kGemm for IQ4_XS {
    const OFFSET: i32 = 128;
    const NS: usize = 8;
    const COEF: usize = 8;
    const D: usize = 16;
    const DMIN: usize = 17;

    /// The unsigned codes `KVALUES[n] + 128` (`1..=241`).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn codes(blk: *const u8) -> [__m256i; 8] {
        let (table, bias) = (iq4xs_table(), _mm256_set1_epi8(-128));
        // SAFETY: the super-block (the caller's contract); j < 8. v + 128 as
        // an unsigned byte is v with its top bit flipped.
        std::array::from_fn(|j| _mm256_xor_si256(unsafe { iq4xs_value(blk, j, table) }, bias))
    }

    /// The eight sub-block scales `ls − 32` at 0, the pairs `(sc[j], sc[j])`
    /// at 8 (groups `2j`, `2j + 1` share sub-block `j`'s scale; the offset:
    /// `I = Σ sc · Σ (v + 128) · x − 128 · Σ sc · bs`), `d` at 16.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
    unsafe fn meta(blk: *const u8) -> [__m512i; 2] {
        // SAFETY: the super-block (the caller's contract).
        let (s8, d) = unsafe { iq4xs_head(blk) };
        let scv = _mm256_cvtepi8_epi32(s8);
        let s16 = _mm_cvtepi8_epi16(s8);
        let co = _mm256_set_m128i(_mm_unpackhi_epi16(s16, s16), _mm_unpacklo_epi16(s16, s16));
        [
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(scv), co),
            _mm512_zextsi128_si512(_mm_castps_si128(d)),
        ]
    }
}

/// Q6_K's sixteen int8 group scales and its f32 `d` (lane 0; the others
/// zero).
///
/// # Safety
/// F16C; `blk` valid for reading a Q6_K super-block.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn q6k_head(blk: *const u8) -> (__m128i, __m128) {
    // SAFETY: the scales 192..208 and `d` 208..210 are inside the
    // super-block.
    let (s8, d) = unsafe {
        (
            _mm_loadu_si128(blk.add(192).cast()),
            blk.add(208).cast::<u16>().read_unaligned(),
        )
    };
    (s8, _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(d))))
}

/// Q3_K's sixteen group scales `ls − 32` (int8) and its f32 `d` (lane 0;
/// the others zero).
///
/// # Safety
/// F16C; `blk` valid for reading a Q3_K super-block.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn q3k_head(blk: *const u8) -> (__m128i, __m128) {
    // SAFETY: the scale bytes 96..108 and `d` 108..110 are inside the
    // super-block.
    let (sc, d) = unsafe {
        (
            q3_k::signed_scales(std::slice::from_raw_parts(blk.add(96), 12)),
            blk.add(108).cast::<u16>().read_unaligned(),
        )
    };
    // SAFETY: 16 bytes.
    let s8 = unsafe { _mm_loadu_si128(sc.as_ptr().cast()) };
    (s8, _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(d))))
}

/// Q2_K's sixteen 4-bit scales and mins (unsigned bytes) and its f32 `d`,
/// `dmin` (lanes 0, 1; the others zero).
///
/// # Safety
/// F16C; `blk` valid for reading a Q2_K super-block.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn q2k_head(blk: *const u8) -> (__m128i, __m128i, __m128) {
    // SAFETY: the scales 0..16 and `d`, `dmin` 80..84 are inside the
    // super-block.
    let (sb, dd) = unsafe {
        (
            _mm_loadu_si128(blk.cast()),
            blk.add(80).cast::<i32>().read_unaligned(),
        )
    };
    let low4 = _mm_set1_epi8(0x0f);
    let sc = _mm_and_si128(sb, low4);
    let mn = _mm_and_si128(_mm_srli_epi16::<4>(sb), low4);
    (sc, mn, _mm_cvtph_ps(_mm_cvtsi32_si128(dd)))
}

/// IQ4_XS's eight sub-block scales `ls − 32` (int8, the low 8 bytes) and
/// its f32 `d` (lane 0; the others zero).
///
/// # Safety
/// F16C; `blk` valid for reading an IQ4_XS super-block.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn iq4xs_head(blk: *const u8) -> (__m128i, __m128) {
    // SAFETY: the super-block (the caller's contract).
    let (sc, d) = unsafe {
        (
            iq4_xs::signed_scales(std::slice::from_raw_parts(blk, 136)),
            blk.cast::<u16>().read_unaligned(),
        )
    };
    let s8 = _mm_cvtsi64_si128(i64::from_le_bytes(sc.map(|v| v as u8)));
    (s8, _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(d))))
}

/// Transposes 16 vectors of 16 dwords: `out[k]` lane `r` = `v[r]` lane `k`.
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose16(v: &[__m512i; 16]) -> [__m512i; 16] {
    let mut t = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
    }
    // u[4 i + q], 128-bit lane L: column 4 L + q of rows 4 i .. 4 i + 4
    let mut u = [_mm512_setzero_si512(); 16];
    for i in 0..4 {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    let mut out = [_mm512_setzero_si512(); 16];
    for q in 0..4 {
        let v0 = _mm512_shuffle_i32x4::<0x88>(u[q], u[4 + q]);
        let v1 = _mm512_shuffle_i32x4::<0xdd>(u[q], u[4 + q]);
        let w0 = _mm512_shuffle_i32x4::<0x88>(u[8 + q], u[12 + q]);
        let w1 = _mm512_shuffle_i32x4::<0xdd>(u[8 + q], u[12 + q]);
        out[q] = _mm512_shuffle_i32x4::<0x88>(v0, w0);
        out[4 + q] = _mm512_shuffle_i32x4::<0x88>(v1, w1);
        out[8 + q] = _mm512_shuffle_i32x4::<0xdd>(v0, w0);
        out[12 + q] = _mm512_shuffle_i32x4::<0xdd>(v1, w1);
    }
    out
}

/// Unpacks super-blocks `b0 .. b0 + nsb` of weight rows `j0 .. j0 + nr`
/// (`nr ≤ 16`; the missing rows as zeros) into `buf`: each row's codes and
/// meta dwords staged, then transposed 16 rows at a time.
///
/// # Safety
/// AVX-512 F/BW, AVX2, F16C; the rows and super-blocks inside `w` (checked
/// by the caller).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
unsafe fn unpack<F: Q8kGemm>(
    w: &[u8],
    row_bytes: usize,
    (j0, nr): (usize, usize),
    (b0, nsb): (usize, usize),
    buf: &mut [Z; CHUNK * SB_VECS],
) {
    // row r's codes in vectors 4 r .. 4 r + 4, its meta in 64 + 2 r, 65 + 2 r
    let mut stage = [Z([0; 16]); 6 * TILE];
    for s in 0..nsb {
        for r in 0..nr {
            let at = (j0 + r) * row_bytes + (b0 + s) * F::BYTES;
            let blk = w[at..at + F::BYTES].as_ptr();
            // SAFETY: `blk` holds the super-block (sliced above); the stores
            // are inside `stage`.
            unsafe {
                let st = stage[4 * r..4 * r + 4].as_mut_ptr().cast::<__m256i>();
                for (k, c) in F::codes(blk).iter().enumerate() {
                    _mm256_storeu_si256(st.add(k), *c);
                }
                let mt = stage[64 + 2 * r..66 + 2 * r].as_mut_ptr().cast::<__m512i>();
                let [m0, m1] = F::meta(blk);
                _mm512_store_si512(mt, m0);
                _mm512_store_si512(mt.add(1), m1);
            }
        }
        // (rows past `nr` keep the zeros they were made with)
        let base = &mut buf[s * SB_VECS..(s + 1) * SB_VECS];
        for (q, (first, stride)) in (0..4)
            .map(|q| (q, 4))
            .chain((0..2).map(|q| (64 + q, 2)))
            .enumerate()
        {
            // SAFETY: `stage` holds 6 · 16 aligned vectors.
            let rows: [__m512i; 16] = std::array::from_fn(|r| unsafe {
                _mm512_load_si512(stage[first + stride * r].0.as_ptr().cast())
            });
            for (k, v) in transpose16(&rows).into_iter().enumerate() {
                // SAFETY: vector 16 q + k of this super-block's 96.
                unsafe { _mm512_store_si512(base[16 * q + k].0.as_mut_ptr().cast(), v) };
            }
        }
    }
}

/// The `A` activation rows at `x` (their values at the chunk's first
/// super-block; rows `x_stride` apart), group sums at `bs` (rows `bs_stride`
/// apart), scales at `dx` (rows `nb` apart) meet the `nsb` unpacked
/// super-blocks in `buf`: the accumulators at `acc` (`A` vectors of 16,
/// zeros when `first`) take the float part of every super-block in turn.
///
/// # Safety
/// AVX-512 F/BW/VNNI; every read inside the activations (checked by the
/// caller), `acc` valid for `16 · A` floats.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
#[allow(clippy::too_many_arguments)] // the activation rows' three arrays and their strides
unsafe fn micro<F: Q8kGemm, const A: usize>(
    buf: &[Z; CHUNK * SB_VECS],
    nsb: usize,
    (x, x_stride): (*const i8, usize),
    (bs, bs_stride): (*const i16, usize),
    (dx, nb): (*const f32, usize),
    acc: *mut f32,
    first: bool,
) {
    let kg_per = 64 / F::NS;
    let bp = buf.as_ptr().cast::<__m512i>();
    // SAFETY: the caller's contract (every read and write below).
    unsafe {
        let mut av: [__m512; A] = std::array::from_fn(|a| {
            if first {
                _mm512_setzero_ps()
            } else {
                _mm512_loadu_ps(acc.add(16 * a))
            }
        });
        for s in 0..nsb {
            let base = bp.add(s * SB_VECS);
            let mut ii = [_mm512_setzero_si512(); A];
            for g in 0..F::NS {
                let mut p = [_mm512_setzero_si512(); A];
                for kk in 0..kg_per {
                    let kg = g * kg_per + kk;
                    let wv = _mm512_load_si512(base.add(kg).cast());
                    for (a, pa) in p.iter_mut().enumerate() {
                        let xv = x
                            .add(a * x_stride + s * QK_K + 4 * kg)
                            .cast::<i32>()
                            .read_unaligned();
                        *pa = _mm512_dpbusd_epi32(*pa, wv, _mm512_set1_epi32(xv));
                    }
                }
                let sc = _mm512_load_si512(base.add(META + g).cast());
                for (ia, pa) in ii.iter_mut().zip(&p) {
                    *ia = _mm512_add_epi32(*ia, _mm512_mullo_epi32(*pa, sc));
                }
            }
            let mut t = [_mm512_setzero_si512(); A];
            for pr in 0..8 {
                let cv = _mm512_load_si512(base.add(META + F::COEF + pr).cast());
                for (a, ta) in t.iter_mut().enumerate() {
                    let b2 = bs
                        .add(a * bs_stride + s * GROUPS + 2 * pr)
                        .cast::<i32>()
                        .read_unaligned();
                    *ta = _mm512_dpwssd_epi32(*ta, cv, _mm512_set1_epi32(b2));
                }
            }
            let d = _mm512_castsi512_ps(_mm512_load_si512(base.add(META + F::D).cast()));
            let dmin = _mm512_castsi512_ps(_mm512_load_si512(base.add(META + F::DMIN).cast()));
            for a in 0..A {
                let dxv = _mm512_set1_ps(*dx.add(a * nb + s));
                if F::MIN {
                    let v =
                        _mm512_fmadd_ps(_mm512_mul_ps(d, dxv), _mm512_cvtepi32_ps(ii[a]), av[a]);
                    av[a] = _mm512_fnmadd_ps(_mm512_mul_ps(dmin, dxv), _mm512_cvtepi32_ps(t[a]), v);
                } else {
                    let off = _mm512_mullo_epi32(t[a], _mm512_set1_epi32(F::OFFSET));
                    let i = _mm512_sub_epi32(ii[a], off);
                    av[a] = _mm512_fmadd_ps(_mm512_mul_ps(d, dxv), _mm512_cvtepi32_ps(i), av[a]);
                }
            }
        }
        for (a, v) in av.iter().enumerate() {
            _mm512_storeu_ps(acc.add(16 * a), *v);
        }
    }
}

/// The micro-kernel of a super-block GEMM for format `F` (one per vector
/// level: `Vnni` here, `q8k_gemm_avx2::Avx2`): how a chunk of a tile's
/// super-blocks is unpacked and how activation rows meet it. [`drive`] walks
/// the tiles, chunks and activation rows the same way for every level.
pub(super) trait GemmMicro<F: Q8kDot> {
    /// The GEMM's name in its panics.
    const NAME: &'static str;
    /// Super-blocks unpacked at a time.
    const CHUNK: usize;
    /// Activation rows per micro-kernel call.
    const MR: usize;
    /// The unpacked super-blocks of a tile (`CHUNK` of them, on the stack).
    type Buf;

    /// A zeroed buffer.
    fn buf() -> Self::Buf;

    /// Unpacks super-blocks `b0 .. b0 + nsb` (`nsb ≤ CHUNK`) of weight rows
    /// `j0 .. j0 + nr` (`nr ≤ 16`; the missing rows as zeros) into `buf`.
    ///
    /// # Safety
    /// The CPU features of the level; the rows and super-blocks inside `w`.
    unsafe fn unpack(
        w: &[u8],
        row_bytes: usize,
        rows: (usize, usize),
        sbs: (usize, usize),
        buf: &mut Self::Buf,
    );

    /// The `a` (`1 ..= MR`) activation rows at `x` (their values at the
    /// chunk's first super-block; rows `x_stride` apart), group sums at `bs`
    /// (rows `bs_stride` apart), scales at `dx` (rows `nb` apart) meet the
    /// `nsb` unpacked super-blocks in `buf`: the accumulators at `acc` (`a`
    /// runs of 16, zeros when `first`) take the float part of every
    /// super-block in turn.
    ///
    /// # Safety
    /// The CPU features of the level; every read inside the activations,
    /// `acc` valid for `16 · a` floats.
    #[allow(clippy::too_many_arguments)] // the activation rows' three arrays and their strides
    unsafe fn micro(
        buf: &Self::Buf,
        a: usize,
        nsb: usize,
        x: (*const i8, usize),
        bs: (*const i16, usize),
        dx: (*const f32, usize),
        acc: *mut f32,
        first: bool,
    );
}

/// The outputs of tiles `tiles` (weight rows `16 t .. 16 t + 16`, the last
/// one cut at `rows`) for all `m` activation rows, into `out`
/// (`[tiles.len()][m][16]`), with micro-kernel `K`: each tile's
/// super-blocks `K::CHUNK` at a time unpacked once, then met by the
/// activation rows `K::MR` at a time.
///
/// # Panics
/// If the slices are too short (caller bugs).
///
/// # Safety
/// The CPU must have the features of `K`'s level.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // the weights, their shape, the tiles, the activations, the output
pub(super) unsafe fn drive<F: Q8kDot, K: GemmMicro<F>>(
    w: &[u8],
    row_bytes: usize,
    rows: usize,
    tiles: Range<usize>,
    acts: &KActs<'_>,
    m: usize,
    out: &mut [f32],
) {
    let nb = acts.cols / QK_K;
    super::q8k::check_gemm(
        K::NAME,
        w,
        (row_bytes, F::BYTES),
        rows,
        &tiles,
        acts,
        m,
        out,
    );
    let mut buf = K::buf();
    for (ti, t) in tiles.enumerate() {
        let j0 = t * TILE;
        let nr = (rows - j0).min(TILE);
        let o = &mut out[ti * m * TILE..(ti + 1) * m * TILE];
        for b0 in (0..nb).step_by(K::CHUNK) {
            let nsb = (nb - b0).min(K::CHUNK);
            // SAFETY: the features (the caller's contract); the rows and
            // super-blocks are inside `w` (asserted).
            unsafe { K::unpack(w, row_bytes, (j0, nr), (b0, nsb), &mut buf) };
            let mut i0 = 0;
            while i0 < m {
                let a = (m - i0).min(K::MR);
                let x = (acts.q[i0 * acts.cols + b0 * QK_K..].as_ptr(), acts.cols);
                let bs = (acts.bsums[(i0 * nb + b0) * GROUPS..].as_ptr(), nb * GROUPS);
                let dx = (acts.d[i0 * nb + b0..].as_ptr(), nb);
                let acc = o[i0 * TILE..(i0 + a) * TILE].as_mut_ptr();
                // SAFETY: rows i0 .. i0 + a and super-blocks b0 .. b0 + nsb
                // of the activations are inside their slices (asserted);
                // `acc` holds a · 16 floats.
                unsafe { K::micro(&buf, a, nsb, x, bs, dx, acc, b0 == 0) };
                i0 += a;
            }
        }
    }
}

/// The AVX-512 VNNI micro-kernel ([`GemmMicro`]).
pub(super) struct Vnni;

impl<F: Q8kGemm> GemmMicro<F> for Vnni {
    const NAME: &'static str = "q8k gemm";
    const CHUNK: usize = CHUNK;
    const MR: usize = MR;
    type Buf = [Z; CHUNK * SB_VECS];

    #[inline(always)]
    fn buf() -> Self::Buf {
        [Z([0; 16]); CHUNK * SB_VECS]
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
    unsafe fn unpack(
        w: &[u8],
        row_bytes: usize,
        rows: (usize, usize),
        sbs: (usize, usize),
        buf: &mut Self::Buf,
    ) {
        // SAFETY: the caller's contract.
        unsafe { unpack::<F>(w, row_bytes, rows, sbs, buf) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
    unsafe fn micro(
        buf: &Self::Buf,
        a: usize,
        nsb: usize,
        x: (*const i8, usize),
        bs: (*const i16, usize),
        dx: (*const f32, usize),
        acc: *mut f32,
        first: bool,
    ) {
        // SAFETY: the caller's contract.
        unsafe {
            match a {
                8 => micro::<F, 8>(buf, nsb, x, bs, dx, acc, first),
                7 => micro::<F, 7>(buf, nsb, x, bs, dx, acc, first),
                6 => micro::<F, 6>(buf, nsb, x, bs, dx, acc, first),
                5 => micro::<F, 5>(buf, nsb, x, bs, dx, acc, first),
                4 => micro::<F, 4>(buf, nsb, x, bs, dx, acc, first),
                3 => micro::<F, 3>(buf, nsb, x, bs, dx, acc, first),
                2 => micro::<F, 2>(buf, nsb, x, bs, dx, acc, first),
                _ => micro::<F, 1>(buf, nsb, x, bs, dx, acc, first),
            }
        }
    }
}

/// The outputs of tiles `tiles` (weight rows `16 t .. 16 t + 16`, the last
/// one cut at `rows`) for all `m` activation rows, into `out`
/// (`[tiles.len()][m][16]`): [`drive`] with the AVX-512 VNNI micro-kernel.
///
/// # Panics
/// If the slices are too short (caller bugs).
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VNNI, AVX2 and FMA.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)] // the weights, their shape, the tiles, the activations, the output
pub(super) unsafe fn gemm<F: Q8kGemm>(
    w: &[u8],
    row_bytes: usize,
    rows: usize,
    tiles: Range<usize>,
    acts: &KActs<'_>,
    m: usize,
    out: &mut [f32],
) {
    // SAFETY: the features (the caller's contract).
    unsafe { drive::<F, Vnni>(w, row_bytes, rows, tiles, acts, m, out) }
}

/// [`gemm`] with the micro-kernel `K` (a [`Vnni`] over another weight
/// layout).
///
/// # Safety
/// As [`gemm`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)] // the weights, their shape, the tiles, the activations, the output
pub(super) unsafe fn gemm_with<F: Q8kDot, K: GemmMicro<F>>(
    w: &[u8],
    row_bytes: usize,
    rows: usize,
    tiles: Range<usize>,
    acts: &KActs<'_>,
    m: usize,
    out: &mut [f32],
) {
    // SAFETY: the features (the caller's contract).
    unsafe { drive::<F, K>(w, row_bytes, rows, tiles, acts, m, out) }
}
