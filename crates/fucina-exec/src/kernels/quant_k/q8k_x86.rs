//! The x86-64 kernels of the super-block activation product (see `q8k`):
//! tiles of `R` weight rows × `M` activation rows (`quant_dot`'s tile
//! driver). Per super-block and output, `vpmaddubsw` multiplies each weight
//! sub-block's unsigned codes by the activations (pair sums at most
//! `2 · 63 · 127`: never saturating) and `vpmaddwd` multiplies the pair sums
//! by the 16-bit sub-block (Q2_K, Q3_K, Q6_K: group) scale, into eight i32
//! lanes; the mins (Q2_K, Q4_K, Q5_K) and the code offsets (Q3_K's 4, Q6_K's
//! 32) take `vpmaddwd` of the group sums with the mins or scales. IQ4_XS,
//! whose table values `+ 128` would saturate the pair sums, multiplies
//! `|v|` by `x · sign v` instead (pairs of at most `2 · 127 · 127`). The lanes of four
//! outputs are summed together (`vphaddd`), and the float part of the module
//! order runs on the four outputs at once, lane by lane the same IEEE
//! operations as the portable loop. The AVX-512 VNNI level runs the same
//! tile compiled with its features (the compiler may fuse `vpmaddwd` and the
//! add into `vpdpwssd`; the integers are the same either way).

use std::arch::x86_64::*;
use std::ops::Range;

use super::QK_K;
use super::q8k::{GROUPS, KActs, Q8kVector};
use super::x86::{drive, f16_pair, super_blocks};
use crate::kernels::quant_block::BlockFormat;
use crate::kernels::quant_block::iq4_nl::KVALUES;
use crate::kernels::quant_block::q4_k::q4k_scales_u64;
use crate::kernels::quant_block::{IQ4_XS, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K};

/// A format's integer lanes for the AVX2 tile.
pub(crate) trait Q8kAvx2: BlockFormat {
    /// The f32 `d` and `dmin` (0 without a min) of the super-block at `blk`.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; `blk` must be valid for reading
    /// `Self::BYTES` bytes.
    unsafe fn head(blk: *const u8) -> (f32, f32);

    /// For each of the `M` activation rows (`x[i]` its 256 values, `bs[i]`
    /// its 16 group sums): eight i32 lanes summing to `I`, and eight summing
    /// to `N` (zeros without a min).
    ///
    /// # Safety
    /// As [`head`](Self::head); each `x[i]` valid for reading 256 bytes, each
    /// `bs[i]` 16 `i16`.
    unsafe fn lanes<const M: usize>(
        blk: *const u8,
        x: &[*const i8; M],
        bs: &[*const i16; M],
    ) -> ([__m256i; M], [__m256i; M]);
}

/// The 32 activations at `p`.
///
/// # Safety
/// `p` must be valid for reading 32 bytes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load32(p: *const i8) -> __m256i {
    // SAFETY: 32 readable bytes (the caller's contract).
    unsafe { _mm256_loadu_si256(p.cast()) }
}

/// `acc[i] += vpmaddwd(vpmaddubsw(v, x[i] + off), s)` for every row.
///
/// # Safety
/// Each `x[i]` valid for reading 32 bytes from `off`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn scaled<const M: usize>(
    acc: &mut [__m256i; M],
    v: __m256i,
    s: __m256i,
    x: &[*const i8; M],
    off: usize,
) {
    for (a, &xp) in acc.iter_mut().zip(x) {
        // SAFETY: the caller's contract.
        let xv = unsafe { load32(xp.add(off)) };
        *a = _mm256_add_epi32(*a, _mm256_madd_epi16(_mm256_maddubs_epi16(v, xv), s));
    }
}

/// The min lanes of Q4_K and Q5_K: `vpmaddwd` of the 16 group sums with
/// `mn[g / 2]`.
///
/// # Safety
/// Each `bs[i]` valid for reading 16 `i16`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn min_lanes<const M: usize>(mn: u64, bs: &[*const i16; M]) -> [__m256i; M] {
    let m = _mm_cvtsi64_si128(mn as i64);
    let mv = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m));
    let mut out = [_mm256_setzero_si256(); M];
    for (o, &p) in out.iter_mut().zip(bs) {
        // SAFETY: 16 i16 (the caller's contract).
        *o = _mm256_madd_epi16(unsafe { _mm256_loadu_si256(p.cast()) }, mv);
    }
    out
}

/// The 16-bit lane `lo` of the lower half of `v` in every lane of the lower
/// half, lane `hi` of the upper half in every lane of the upper half
/// (`lo`, `hi` < 8; one `vpshufb`).
#[inline]
#[target_feature(enable = "avx2")]
fn lane16(v: __m256i, lo: usize, hi: usize) -> __m256i {
    // the byte pair (2 lane, 2 lane + 1) as one 16-bit word, broadcast in
    // each half: a few instructions whatever `lo` and `hi` are (sixteen
    // byte inserts per half when a loop over the lanes is not unrolled)
    let pair = |lane: usize| (2 * lane as i16) | ((2 * lane as i16 + 1) << 8);
    let idx = _mm256_inserti128_si256::<1>(
        _mm256_castsi128_si256(_mm_set1_epi16(pair(lo))),
        _mm_set1_epi16(pair(hi)),
    );
    _mm256_shuffle_epi8(v, idx)
}

/// Bit `j` of each byte of `v`, in bit 4.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn fifth_bit(v: __m256i, j: usize) -> __m256i {
    // a 16-bit shift by at most 7 moves no bit that the mask keeps across bytes
    let b = _mm256_and_si256(
        _mm256_srl_epi16(v, _mm_cvtsi32_si128(j as i32)),
        _mm256_set1_epi8(1),
    );
    _mm256_slli_epi16::<4>(b)
}

/// The Q4_K / Q5_K lanes: `qs` the 128 nibble bytes, `qh` the 32 bytes of
/// fifth bits (Q5_K).
///
/// # Safety
/// `head` valid for 16 bytes, `qs` for 128, `qh` (when given) for 32; `x`
/// and `bs` as in [`Q8kAvx2::lanes`].
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn q45k_lanes<const M: usize>(
    head: *const u8,
    qs: *const u8,
    qh: Option<*const u8>,
    x: &[*const i8; M],
    bs: &[*const i16; M],
) -> ([__m256i; M], [__m256i; M]) {
    // SAFETY: 16 header bytes (the caller's contract).
    let (sc, mn) = q4k_scales_u64(unsafe { &std::slice::from_raw_parts(head, 16)[4..16] });
    // SAFETY: 32 bytes of fifth bits (the caller's contract).
    let h = qh.map(|p| unsafe { _mm256_loadu_si256(p.cast()) });
    let low4 = _mm256_set1_epi8(0x0f);
    // the eight scales as 16-bit lanes, in both halves
    let scv = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
    let mut iv = [_mm256_setzero_si256(); M];
    for c in 0..4 {
        // SAFETY: bytes 32 c .. +32 of the 128 (the caller's contract).
        let v = unsafe { _mm256_loadu_si256(qs.add(32 * c).cast()) };
        let mut lo = _mm256_and_si256(v, low4);
        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low4);
        if let Some(h) = h {
            lo = _mm256_or_si256(lo, fifth_bit(h, 2 * c));
            hi = _mm256_or_si256(hi, fifth_bit(h, 2 * c + 1));
        }
        let (s0, s1) = (lane16(scv, 2 * c, 2 * c), lane16(scv, 2 * c + 1, 2 * c + 1));
        // SAFETY: activations 64 c .. 64 c + 64 of the 256 (the caller's
        // contract).
        unsafe {
            scaled(&mut iv, lo, s0, x, 64 * c);
            scaled(&mut iv, hi, s1, x, 64 * c + 32);
        }
    }
    // SAFETY: the caller's contract.
    (iv, unsafe { min_lanes(mn, bs) })
}

impl Q8kAvx2 for Q4_K {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn head(blk: *const u8) -> (f32, f32) {
        // SAFETY: bytes 0..4 of the super-block (the caller's contract).
        unsafe { f16_pair(blk) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn lanes<const M: usize>(
        blk: *const u8,
        x: &[*const i8; M],
        bs: &[*const i16; M],
    ) -> ([__m256i; M], [__m256i; M]) {
        // SAFETY: the header 0..16 and the nibbles 16..144 are inside the
        // super-block (the caller's contract).
        unsafe { q45k_lanes(blk, blk.add(16), None, x, bs) }
    }
}

impl Q8kAvx2 for Q5_K {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn head(blk: *const u8) -> (f32, f32) {
        // SAFETY: bytes 0..4 of the super-block (the caller's contract).
        unsafe { f16_pair(blk) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn lanes<const M: usize>(
        blk: *const u8,
        x: &[*const i8; M],
        bs: &[*const i16; M],
    ) -> ([__m256i; M], [__m256i; M]) {
        // SAFETY: the header 0..16, the fifth bits 16..48 and the nibbles
        // 48..176 are inside the super-block (the caller's contract).
        unsafe { q45k_lanes(blk, blk.add(48), Some(blk.add(16)), x, bs) }
    }
}

impl Q8kAvx2 for Q6_K {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn head(blk: *const u8) -> (f32, f32) {
        // SAFETY: bytes 206..210 of the super-block (the caller's contract).
        (unsafe { f16_pair(blk.add(206)) }.1, 0.0)
    }

    /// `Σ sc[g] · q · x` over the unsigned codes `q` (`0..=63`), less
    /// `32 · Σ sc[g] · bs[g]`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn lanes<const M: usize>(
        blk: *const u8,
        x: &[*const i8; M],
        bs: &[*const i16; M],
    ) -> ([__m256i; M], [__m256i; M]) {
        // SAFETY: the 16 scales at 192..208 are inside the super-block.
        let sc8 = unsafe { _mm_loadu_si128(blk.add(192).cast()) };
        // scales 0..8 and 8..16 as 16-bit lanes, each in both halves
        let sch = [
            _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(sc8)),
            _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_srli_si128::<8>(sc8))),
        ];
        let low4 = _mm256_set1_epi8(0x0f);
        let mut iv = [_mm256_setzero_si256(); M];
        for (half, &sc_half) in sch.iter().enumerate() {
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
                // bits 2g, 2g + 1 of each qh byte to bits 4, 5 (a 16-bit shift
                // by at most 6 moves no bit the mask keeps across bytes)
                let hb = _mm256_and_si256(
                    _mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * g as i32)),
                    _mm256_set1_epi8(3),
                );
                let q = _mm256_or_si256(lo, _mm256_slli_epi16::<4>(hb));
                let j = 4 * half + g;
                // groups 2j, 2j + 1 (both in scales 8 half .. 8 half + 8)
                let s = lane16(sc_half, 2 * g, 2 * g + 1);
                // SAFETY: activations 32 j .. +32 of the 256 (the caller's
                // contract).
                unsafe { scaled(&mut iv, q, s, x, 32 * j) };
            }
        }
        // SAFETY: as above; the group sums are the caller's contract.
        unsafe {
            let s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(192).cast()));
            offset_fix(&mut iv, s16, bs, 5);
        }
        (iv, [_mm256_setzero_si256(); M])
    }
}

/// `iv[i] −= 2^shift · Σ_g s16[g] · bs[i][g]`: the correction of codes read
/// unsigned as `q + 2^shift` under the group scales `s16` (16-bit lanes).
///
/// # Safety
/// Each `bs[i]` valid for reading 16 `i16`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn offset_fix<const M: usize>(
    iv: &mut [__m256i; M],
    s16: __m256i,
    bs: &[*const i16; M],
    shift: i32,
) {
    let sh = _mm_cvtsi32_si128(shift);
    for (a, &p) in iv.iter_mut().zip(bs) {
        // SAFETY: 16 i16 group sums (the caller's contract).
        let b = _mm256_madd_epi16(unsafe { _mm256_loadu_si256(p.cast()) }, s16);
        *a = _mm256_sub_epi32(*a, _mm256_sll_epi32(b, sh));
    }
}

/// Run `r` (`0..4`, bits `2 r`) of the 2-bit codes of Q2_K and Q3_K in the
/// 32 code bytes `v` of a half: the codes of sub-block `4 · half + r`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn low2(v: __m256i, r: usize) -> __m256i {
    // a 16-bit shift by at most 6 moves no bit the mask keeps across bytes
    _mm256_and_si256(
        _mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * r as i32)),
        _mm256_set1_epi8(3),
    )
}

/// Q3_K's codes of sub-block `j` read unsigned, `q + 4` in `0..=7`: the low
/// two bits (run `j mod 4` of the half's code bytes `v`) and, as bit 2, bit
/// `j` of `hmask` (`hm`).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn q3k_code(v: __m256i, hm: __m256i, j: usize) -> __m256i {
    // a 16-bit shift by at most 7 moves no bit the mask keeps across bytes
    let h = _mm256_and_si256(
        _mm256_srl_epi16(hm, _mm_cvtsi32_si128(j as i32)),
        _mm256_set1_epi8(1),
    );
    _mm256_or_si256(low2(v, j % 4), _mm256_slli_epi16::<2>(h))
}

/// IQ4_XS's values `KVALUES[n]` (signed bytes) of sub-block `j` of the
/// super-block at `blk`, `table` the 16 values in both halves.
///
/// # Safety
/// `blk` valid for reading 136 bytes; `j < 8`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn iq4xs_value(blk: *const u8, j: usize, table: __m256i) -> __m256i {
    // SAFETY: sub-block j's 16 bytes at 8 + 16 j are inside the super-block.
    let b = unsafe { _mm_loadu_si128(blk.add(8 + 16 * j).cast()) };
    // elements 0..16 the low nibbles, 16..32 the high ones
    let n = _mm256_and_si256(
        _mm256_set_m128i(_mm_srli_epi16::<4>(b), b),
        _mm256_set1_epi8(0x0f),
    );
    _mm256_shuffle_epi8(table, n)
}

/// IQ4_XS's table of values in both halves of a vector.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn iq4xs_table() -> __m256i {
    // SAFETY: the 16-byte table.
    _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(KVALUES.as_ptr().cast()) })
}

/// Q3_K's sixteen signed 6-bit group scales (`q3_k::signed_scales`, the same
/// values) from the 12 scale bytes at `p`, in registers: the low nibbles of
/// bytes 0..8 (groups 0..8) and their high nibbles (8..16), each with its two
/// top bits from bytes 8..12 (word `k` of the groups `4 k ..` shifted by
/// `2 k`), less 32.
///
/// # Safety
/// `p` valid for reading 12 bytes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn q3k_scales(p: *const u8) -> __m128i {
    // SAFETY: bytes 0..8 and 8..12 (the caller's contract).
    let (lo, top) = unsafe {
        (
            p.cast::<u64>().read_unaligned(),
            p.add(8).cast::<u32>().read_unaligned(),
        )
    };
    // per byte, bits 4..8 of `lo >> 4`'s byte k are the high nibble of byte k
    let nib = _mm_and_si128(
        _mm_set_epi64x((lo >> 4) as i64, lo as i64),
        _mm_set1_epi8(0x0f),
    );
    let two = _mm_and_si128(
        _mm_srlv_epi32(_mm_set1_epi32(top as i32), _mm_setr_epi32(0, 2, 4, 6)),
        _mm_set1_epi8(3),
    );
    _mm_sub_epi8(
        _mm_or_si128(nib, _mm_slli_epi32::<4>(two)),
        _mm_set1_epi8(32),
    )
}

impl Q8kAvx2 for Q3_K {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn head(blk: *const u8) -> (f32, f32) {
        // SAFETY: bytes 106..110 of the super-block (the caller's contract).
        (unsafe { f16_pair(blk.add(106)) }.1, 0.0)
    }

    /// `Σ sc[g] · (q + 4) · x` over the groups of 16, less
    /// `4 · Σ sc[g] · bs[g]`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn lanes<const M: usize>(
        blk: *const u8,
        x: &[*const i8; M],
        bs: &[*const i16; M],
    ) -> ([__m256i; M], [__m256i; M]) {
        // SAFETY: the scale bytes 96..108 are inside the super-block.
        let sc8 = unsafe { q3k_scales(blk.add(96)) };
        let sch = [
            _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(sc8)),
            _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_srli_si128::<8>(sc8))),
        ];
        let mut iv = [_mm256_setzero_si256(); M];
        // SAFETY: hmask 0..32 and the codes 32..96 are inside the
        // super-block; activations 32 j .. +32 and the group sums (the
        // caller's contract).
        unsafe {
            let hm = _mm256_loadu_si256(blk.cast());
            for (half, &sc_half) in sch.iter().enumerate() {
                let v = _mm256_loadu_si256(blk.add(32 + 32 * half).cast());
                for r in 0..4 {
                    let j = 4 * half + r;
                    let s = lane16(sc_half, 2 * r, 2 * r + 1);
                    scaled(&mut iv, q3k_code(v, hm, j), s, x, 32 * j);
                }
            }
            offset_fix(&mut iv, _mm256_cvtepi8_epi16(sc8), bs, 2);
        }
        (iv, [_mm256_setzero_si256(); M])
    }
}

impl Q8kAvx2 for Q2_K {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn head(blk: *const u8) -> (f32, f32) {
        // SAFETY: bytes 80..84 of the super-block (the caller's contract).
        unsafe { f16_pair(blk.add(80)) }
    }

    /// `Σ sc[g] · q · x` over the groups of 16; the mins `Σ mn[g] · bs[g]`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn lanes<const M: usize>(
        blk: *const u8,
        x: &[*const i8; M],
        bs: &[*const i16; M],
    ) -> ([__m256i; M], [__m256i; M]) {
        // SAFETY: the 16 scale bytes 0..16 are inside the super-block.
        let sb = unsafe { _mm_loadu_si128(blk.cast()) };
        let low4 = _mm_set1_epi8(0x0f);
        let sc = _mm_and_si128(sb, low4);
        let mn = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(sb), low4));
        let sch = [
            _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sc)),
            _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_srli_si128::<8>(sc))),
        ];
        let mut iv = [_mm256_setzero_si256(); M];
        let mut nv = [_mm256_setzero_si256(); M];
        // SAFETY: the codes 16..80 are inside the super-block; the
        // activations and group sums (the caller's contract).
        unsafe {
            for (half, &sc_half) in sch.iter().enumerate() {
                let v = _mm256_loadu_si256(blk.add(16 + 32 * half).cast());
                for r in 0..4 {
                    let s = lane16(sc_half, 2 * r, 2 * r + 1);
                    scaled(&mut iv, low2(v, r), s, x, 32 * (4 * half + r));
                }
            }
            for (n, &p) in nv.iter_mut().zip(bs) {
                *n = _mm256_madd_epi16(_mm256_loadu_si256(p.cast()), mn);
            }
        }
        (iv, nv)
    }
}

/// IQ4_XS's eight signed 6-bit sub-block scales (`iq4_xs::signed_scales`,
/// the same values), lane `j` the scale of sub-block `j` as the 16-bit pair
/// `(s, s)` (the second factor of `vpmaddwd`): the nibble `j` of bytes 4..8
/// with bits `2 j ..` of bytes 2..4 as its top two bits, less 32.
///
/// # Safety
/// `blk` valid for reading 8 bytes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn iq4xs_scale_pairs(blk: *const u8) -> __m256i {
    // SAFETY: bytes 2..4 and 4..8 (the caller's contract).
    let (h, l) = unsafe {
        (
            blk.add(2).cast::<u16>().read_unaligned(),
            blk.add(4).cast::<u32>().read_unaligned(),
        )
    };
    let lo = _mm256_and_si256(
        _mm256_srlv_epi32(
            _mm256_set1_epi32(l as i32),
            _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28),
        ),
        _mm256_set1_epi32(15),
    );
    let hi = _mm256_and_si256(
        _mm256_srlv_epi32(
            _mm256_set1_epi32(i32::from(h)),
            _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14),
        ),
        _mm256_set1_epi32(3),
    );
    let v = _mm256_sub_epi32(
        _mm256_or_si256(lo, _mm256_slli_epi32::<4>(hi)),
        _mm256_set1_epi32(32),
    );
    super::q8k_gemm_avx2::pairs16(v)
}

impl Q8kAvx2 for IQ4_XS {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn head(blk: *const u8) -> (f32, f32) {
        // SAFETY: bytes 0..4 of the super-block (the caller's contract).
        (unsafe { f16_pair(blk) }.0, 0.0)
    }

    /// `Σ sc[j] · v · x` over the sub-blocks of 32 with the sign trick
    /// (`|v| · (x · sign v)`: pairs of at most `2 · 127 · 127`, never
    /// saturating `vpmaddubsw`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn lanes<const M: usize>(
        blk: *const u8,
        x: &[*const i8; M],
        _bs: &[*const i16; M],
    ) -> ([__m256i; M], [__m256i; M]) {
        // SAFETY: the super-block (the caller's contract).
        let sc = unsafe { iq4xs_scale_pairs(blk) };
        let mut iv = [_mm256_setzero_si256(); M];
        let table = iq4xs_table();
        for j in 0..8 {
            // SAFETY: the super-block (the caller's contract).
            let v = unsafe { iq4xs_value(blk, j, table) };
            let a = _mm256_abs_epi8(v);
            let s = _mm256_permutevar8x32_epi32(sc, _mm256_set1_epi32(j as i32));
            for (acc, &xp) in iv.iter_mut().zip(x) {
                // SAFETY: activations 32 j .. +32 (the caller's contract).
                let xv = unsafe { load32(xp.add(32 * j)) };
                let p = _mm256_maddubs_epi16(a, _mm256_sign_epi8(xv, v));
                *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(p, s));
            }
        }
        (iv, [_mm256_setzero_si256(); M])
    }
}

/// The sums of the eight lanes of each of `v[0..4]` (zeros past `N`),
/// exact.
#[inline]
#[target_feature(enable = "avx2")]
fn hsum4<const N: usize>(v: &[__m256i; N]) -> __m128i {
    let g = |i: usize| {
        if i < N { v[i] } else { _mm256_setzero_si256() }
    };
    let h = _mm256_hadd_epi32(_mm256_hadd_epi32(g(0), g(1)), _mm256_hadd_epi32(g(2), g(3)));
    _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h))
}

/// Checks a tile's reads against the slices (once per tile).
#[inline(always)]
pub(super) fn check_tile<F: BlockFormat, const R: usize, const M: usize>(
    w: &[u8],
    row_bytes: usize,
    j0: usize,
    acts: &KActs<'_>,
    i0: usize,
) {
    let nb = acts.cols / QK_K;
    assert!(row_bytes == nb * F::BYTES, "q8k tile: row bytes");
    assert!((j0 + R) * row_bytes <= w.len(), "q8k tile: weight rows");
    assert!(
        (i0 + M) * acts.cols <= acts.q.len(),
        "q8k tile: activations"
    );
    assert!((i0 + M) * nb <= acts.d.len(), "q8k tile: scales");
    assert!((i0 + M) * nb * GROUPS <= acts.bsums.len(), "q8k tile: sums");
    assert!(M <= 4, "q8k tile: at most four activation rows");
}

/// `acc = fma(d · dx, I, acc)`, then with a min `acc = fma(−(dmin · dx), N,
/// acc)`, on four outputs at once.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn float_part<F: Q8kVector>(
    acc: __m128,
    d: __m128,
    dmin: __m128,
    dx: __m128,
    i: __m128i,
    n: __m128i,
) -> __m128 {
    let acc = _mm_fmadd_ps(_mm_mul_ps(d, dx), _mm_cvtepi32_ps(i), acc);
    if F::MIN {
        _mm_fnmadd_ps(_mm_mul_ps(dmin, dx), _mm_cvtepi32_ps(n), acc)
    } else {
        acc
    }
}

/// One super-block of four weight rows with one activation row (scale
/// `dx`): their `(d, dmin)` `heads` and integer lanes `iv`, `nv` summed and
/// taken through [`float_part`] side by side.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn float_four<F: Q8kVector>(
    acc: __m128,
    heads: &[(f32, f32); 4],
    iv: &[__m256i; 4],
    nv: &[__m256i; 4],
    dx: f32,
) -> __m128 {
    let d = _mm_setr_ps(heads[0].0, heads[1].0, heads[2].0, heads[3].0);
    let dmin = _mm_setr_ps(heads[0].1, heads[1].1, heads[2].1, heads[3].1);
    let n = if F::MIN {
        hsum4(nv)
    } else {
        _mm_setzero_si128()
    };
    float_part::<F>(acc, d, dmin, _mm_set1_ps(dx), hsum4(iv), n)
}

/// The outputs of weight rows `j0..j0 + R` × activation rows `i0..i0 + M`:
/// with one activation row the four weight rows' sums reduce together, else
/// each weight row's `M` outputs.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C (the body of [`tile_avx2`] and
/// [`tile_vnni`], inlined into them).
#[inline(always)]
unsafe fn tile_body<F: Q8kVector, const R: usize, const M: usize>(
    w: &[u8],
    row_bytes: usize,
    j0: usize,
    acts: &KActs<'_>,
    i0: usize,
) -> [[f32; M]; R] {
    check_tile::<F, R, M>(w, row_bytes, j0, acts, i0);
    let nb = acts.cols / QK_K;
    // SAFETY: the caller's contract (the features); every read below is
    // inside the bounds check_tile asserted.
    unsafe {
        let mut acc = [_mm_setzero_ps(); R];
        let mut acc1 = _mm_setzero_ps();
        for b in 0..nb {
            let mut xp = [std::ptr::null::<i8>(); M];
            let mut bp = [std::ptr::null::<i16>(); M];
            let mut dx = [0.0f32; 4];
            for i in 0..M {
                let row = i0 + i;
                xp[i] = acts.q.as_ptr().add(row * acts.cols + b * QK_K);
                bp[i] = acts.bsums.as_ptr().add((row * nb + b) * GROUPS);
                dx[i] = *acts.d.get_unchecked(row * nb + b);
            }
            let mut heads = [(0.0f32, 0.0f32); R];
            let mut lanes = [([_mm256_setzero_si256(); M], [_mm256_setzero_si256(); M]); R];
            // the super-blocks' addresses, the weights ahead prefetched as the
            // blocks-of-32 K kernels do
            let blks = super_blocks::<F, R>(w, row_bytes, j0, b);
            for r in 0..R {
                heads[r] = F::head(blks[r]);
                lanes[r] = F::lanes::<M>(blks[r], &xp, &bp);
            }
            if M == 1 && R == 4 {
                // one activation row: the four weight rows' outputs side by side
                let iv: [__m256i; 4] = std::array::from_fn(|r| lanes[r].0[0]);
                let nv: [__m256i; 4] = std::array::from_fn(|r| lanes[r].1[0]);
                let heads: [(f32, f32); 4] = std::array::from_fn(|r| heads[r]);
                acc1 = float_four::<F>(acc1, &heads, &iv, &nv, dx[0]);
            } else {
                let dxv = _mm_loadu_ps(dx.as_ptr());
                for r in 0..R {
                    let n = if F::MIN {
                        hsum4(&lanes[r].1)
                    } else {
                        _mm_setzero_si128()
                    };
                    let (d, dmin) = (_mm_set1_ps(heads[r].0), _mm_set1_ps(heads[r].1));
                    acc[r] = float_part::<F>(acc[r], d, dmin, dxv, hsum4(&lanes[r].0), n);
                }
            }
        }
        let mut out = [[0.0f32; M]; R];
        if M == 1 && R == 4 {
            let mut v = [0.0f32; 4];
            _mm_storeu_ps(v.as_mut_ptr(), acc1);
            for (o, v) in out.iter_mut().zip(v) {
                o[0] = v;
            }
        } else {
            for (o, a) in out.iter_mut().zip(&acc) {
                let mut v = [0.0f32; 4];
                _mm_storeu_ps(v.as_mut_ptr(), *a);
                o.copy_from_slice(&v[..M]);
            }
        }
        out
    }
}

/// The AVX2 tile.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn tile_avx2<F: Q8kVector, const R: usize, const M: usize>(
    w: &[u8],
    row_bytes: usize,
    j0: usize,
    acts: &KActs<'_>,
    _sums: (),
    i0: usize,
) -> [[f32; M]; R] {
    // SAFETY: this function enables AVX2, FMA and F16C.
    unsafe { tile_body::<F, R, M>(w, row_bytes, j0, acts, i0) }
}

/// The tile compiled for AVX-512 VNNI.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn tile_vnni<F: Q8kVector, const R: usize, const M: usize>(
    w: &[u8],
    row_bytes: usize,
    j0: usize,
    acts: &KActs<'_>,
    _sums: (),
    i0: usize,
) -> [[f32; M]; R] {
    // SAFETY: this function enables AVX2, FMA and F16C (and more).
    unsafe { tile_body::<F, R, M>(w, row_bytes, j0, acts, i0) }
}

/// The AVX2 kernel over `rows` (see `q8k::q8k_rows`).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; the slices must satisfy
/// `q8k_rows`'s asserted bounds.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_avx2<F: Q8kVector>(
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &KActs<'_>,
    m: usize,
    out_t: &mut [f32],
) {
    let sums = ();
    drive!(tile_avx2, 4, F, w, row_bytes, rows, acts, sums, m, out_t)
}

/// The AVX-512 VNNI kernel over `rows` (see `q8k::q8k_rows`): one
/// activation row on `q8k_zmm`'s tile, more on this module's.
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; the slices
/// must satisfy `q8k_rows`'s asserted bounds.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn rows_vnni<F: Q8kVector>(
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &KActs<'_>,
    m: usize,
    out_t: &mut [f32],
) {
    if m == 1 {
        // SAFETY: the caller's contract (the features and the bounds).
        return unsafe { super::q8k_zmm::rows_m1::<F>(w, row_bytes, rows, acts, out_t) };
    }
    let sums = ();
    drive!(tile_vnni, 4, F, w, row_bytes, rows, acts, sums, m, out_t)
}
