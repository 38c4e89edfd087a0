//! The AVX2 product of many activation rows with K-format (Q2_K, Q3_K,
//! Q4_K, Q5_K, Q6_K) and IQ4_XS weights on the super-block activations of
//! `q8k` (a prefill, a batch): the twin of the AVX-512 VNNI GEMM
//! (`q8k_gemm`, whose driver it shares) for 16 YMM registers and no
//! `vpdpbusd`.
//!
//! The weight rows are taken 16 at a time (a *tile*, two halves of 8). A
//! few super-blocks of the tile are unpacked once into a buffer on the stack
//! (`CHUNK` of them): the codes as unsigned bytes (IQ4_XS: its table values
//! as signed bytes), transposed so that one 256-bit vector holds the four
//! codes `4 g .. 4 g + 4` of each of 8 rows; the meta dwords of `q8k_gemm`
//! (the integer sub-block, or Q2_K/Q3_K/Q6_K group, scales; the coefficients
//! of the activation group sums as 16-bit pairs; `d`, `dmin`), transposed
//! the same way, each scale as a 16-bit pair `(sc, sc)`. Then every
//! activation row meets the unpacked chunk, three rows at a time:
//! `vpmaddubsw` of a code vector with four activations broadcast (8 weight
//! rows × 4 columns: 16-bit sums of pairs, at most `2 · 63 · 127 = 16002`),
//! summed in 16 bits over a *span* of consecutive code vectors that cannot
//! overflow (Q4_K: 8, `8 · 2 · 15 · 127 = 30480`; Q5_K: 4, `4 · 2 · 31 ·
//! 127 = 31496`; Q6_K: 2, `2 · 16002 = 32004`; Q3_K's `q + 4` and Q2_K: 4,
//! at most `4 · 2 · 7 · 127 = 7112`; the activations are never −128), then
//! `vpmaddwd` with the `(sc, sc)` pairs into the i32 sum `I` of the
//! super-block; `vpmaddwd` of the group sums with the coefficient pairs into
//! `N` (the mins; Q3_K, Q6_K: their offsets of 4 and 32). IQ4_XS's values
//! `+ 128` would saturate the pair sums, so its codes stay signed and
//! `vpmaddubsw` multiplies `|v|` by `x · sign v` (`vpsignb`; pairs of at
//! most `2 · 127 · 127 = 32258`, a span of 1, no offset). Then the float
//! part of `q8k`'s order, lane `r` the output of weight row `r`, the same
//! IEEE operations as the portable loop. The integers are exact, so the
//! outputs are the same bits as every other path's.
//!
//! The outputs of a tile are `[m][16]`, as `q8k_gemm`'s; the float
//! accumulators live there between super-blocks.

use std::arch::x86_64::*;
use std::ops::Range;

use super::QK_K;
use super::q8k::{GROUPS, KActs};
use super::q8k_gemm::{GemmMicro, Q8kGemm, drive, iq4xs_head, q2k_head, q3k_head, q6k_head};
use crate::kernels::quant_block::q4_k::q4k_scales_u64;
use crate::kernels::quant_block::{IQ4_XS, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K};

/// Weight rows per tile.
const TILE: usize = super::q8k::GEMM_TILE;

/// Weight rows per vector of i32 (a tile's half).
const HALF: usize = 8;

/// Super-blocks unpacked at a time (`CHUNK · SB_VECS · 32` bytes of stack).
const CHUNK: usize = 2;

/// Activation rows per micro-kernel call (with both halves: 6 accumulators
/// of 16-bit sums, 6 of `I`, 2 code vectors and a broadcast: 15 registers).
const MR: usize = 3;

/// 32 bytes, aligned (one 256-bit vector).
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub(super) struct Y([u32; 8]);

/// Code vectors per unpacked super-block: 64 groups of four codes × 2
/// halves (vector `2 g + h`: codes `4 g .. 4 g + 4` of rows `8 h .. 8 h + 8`).
const CODE_VECS: usize = 128;

/// The first meta vector of an unpacked super-block: then 32 per half
/// (vector `META + 32 h + k`: meta dword `k` of rows `8 h .. 8 h + 8`).
const META: usize = CODE_VECS;

/// Vectors per unpacked super-block.
const SB_VECS: usize = CODE_VECS + 2 * 32;

/// A format the AVX2 GEMM unpacks: its codes as [`Q8kGemm::codes`], its
/// meta dwords in [`Q8kGemm`]'s places with the scales as 16-bit pairs.
pub(crate) trait Q8kGemmAvx2: Q8kGemm {
    /// Code vectors whose 16-bit pair sums add up without overflow (a
    /// divisor of the code vectors per scale group, `64 / NS`; more than 0,
    /// which `q8k::gemm_for` would read as a format without this GEMM).
    const SPAN: usize;

    /// Whether the codes are read signed (IQ4_XS: its table values, whose
    /// `+ 128` of [`Q8kGemm::codes`] would saturate the 16-bit pair sums):
    /// `vpmaddubsw` then multiplies `|v|` by `x · sign v` (pairs of at most
    /// `2 · 127 · 127`, `SPAN` 1) and no offset is taken back out.
    const SIGNED: bool = false;

    /// The 32 meta dwords of the super-block at `blk` (four vectors of
    /// eight): dwords `0 .. NS` the integer scales as pairs `(sc, sc)` of
    /// i16, `COEF .. COEF + 8` the coefficient pairs, `D` and `DMIN` the f32
    /// scales, the others zero.
    ///
    /// # Safety
    /// The CPU must have AVX2 and F16C; `blk` valid for reading `Self::BYTES`
    /// bytes.
    unsafe fn meta_avx2(blk: *const u8) -> [__m256i; 4];
}

/// Eight i32 `v` (each in `−32768..=32767`) as the 16-bit pairs `(v, v)`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn pairs16(v: __m256i) -> __m256i {
    _mm256_or_si256(
        _mm256_and_si256(v, _mm256_set1_epi32(0xffff)),
        _mm256_slli_epi32::<16>(v),
    )
}

/// Q4_K's and Q5_K's meta dwords: the eight scale pairs at 0, the pairs
/// `(mn[j], mn[j])` at 8, `d` at 16, `dmin` at 17.
///
/// # Safety
/// AVX2, F16C; `blk` valid for 16 bytes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn q45k_meta(blk: *const u8) -> [__m256i; 4] {
    // SAFETY: the 16 header bytes (the caller's contract).
    let head = unsafe { std::slice::from_raw_parts(blk, 16) };
    let (sc, mn) = q4k_scales_u64(&head[4..16]);
    let scv = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(sc as i64));
    let mnv = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(mn as i64));
    // SAFETY: bytes 0..4 (`d`, `dmin`).
    let dd = _mm_cvtph_ps(_mm_cvtsi32_si128(unsafe {
        blk.cast::<i32>().read_unaligned()
    }));
    [
        pairs16(scv),
        pairs16(mnv),
        _mm256_zextsi128_si256(_mm_castps_si128(dd)),
        _mm256_setzero_si256(),
    ]
}

impl Q8kGemmAvx2 for Q4_K {
    const SPAN: usize = 8;

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn meta_avx2(blk: *const u8) -> [__m256i; 4] {
        // SAFETY: the header is inside the super-block.
        unsafe { q45k_meta(blk) }
    }
}

impl Q8kGemmAvx2 for Q5_K {
    const SPAN: usize = 4;

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn meta_avx2(blk: *const u8) -> [__m256i; 4] {
        // SAFETY: the header is inside the super-block.
        unsafe { q45k_meta(blk) }
    }
}

impl Q8kGemmAvx2 for Q6_K {
    const SPAN: usize = 2;

    /// The sixteen int8 group scale pairs at 0, the scales as the
    /// coefficients of the group sums at 16 (the offset: `I = Σ sc · Σ q · x
    /// − 32 · Σ sc · bs`), `d` at 24.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn meta_avx2(blk: *const u8) -> [__m256i; 4] {
        // SAFETY: the super-block (the caller's contract).
        let (s8, d) = unsafe { q6k_head(blk) };
        meta16(s8, s8, true, d)
    }
}

/// The meta dwords of a format with sixteen group scales: the scales `sc`
/// (int8 or unsigned bytes, `signed` saying which) as pairs at 0, the group
/// sum coefficients `co` (the same kind) at 16, the f32 `d` and `dmin` of
/// `dd` at 24, 25.
#[inline]
#[target_feature(enable = "avx2")]
fn meta16(sc: __m128i, co: __m128i, signed: bool, dd: __m128) -> [__m256i; 4] {
    let hi = _mm_srli_si128::<8>(sc);
    let (s0, s1, c16) = if signed {
        (
            _mm256_cvtepi8_epi32(sc),
            _mm256_cvtepi8_epi32(hi),
            _mm256_cvtepi8_epi16(co),
        )
    } else {
        (
            _mm256_cvtepu8_epi32(sc),
            _mm256_cvtepu8_epi32(hi),
            _mm256_cvtepu8_epi16(co),
        )
    };
    [
        pairs16(s0),
        pairs16(s1),
        c16,
        _mm256_zextsi128_si256(_mm_castps_si128(dd)),
    ]
}

impl Q8kGemmAvx2 for Q3_K {
    /// The codes `q + 4` (`0..=7`): four code vectors (a group of 16) sum to
    /// at most `4 · 2 · 7 · 127 = 7112`.
    const SPAN: usize = 4;

    /// The sixteen group scales `ls − 32` as pairs at 0 and as the
    /// coefficients at 16 (the offset: `I = Σ sc · Σ (q + 4) · x − 4 · Σ sc
    /// · bs`), `d` at 24.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn meta_avx2(blk: *const u8) -> [__m256i; 4] {
        // SAFETY: the super-block (the caller's contract).
        let (s8, d) = unsafe { q3k_head(blk) };
        meta16(s8, s8, true, d)
    }
}

impl Q8kGemmAvx2 for Q2_K {
    /// The codes `0..=3`: four code vectors sum to at most `4 · 2 · 3 · 127
    /// = 3048`.
    const SPAN: usize = 4;

    /// The sixteen 4-bit scales as pairs at 0, the sixteen 4-bit mins as the
    /// coefficients at 16, `d` at 24, `dmin` at 25.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn meta_avx2(blk: *const u8) -> [__m256i; 4] {
        // SAFETY: the super-block (the caller's contract).
        let (sc, mn, dd) = unsafe { q2k_head(blk) };
        meta16(sc, mn, false, dd)
    }
}

impl Q8kGemmAvx2 for IQ4_XS {
    /// One code vector: `|v| · x` pairs of at most `2 · 127 · 127 = 32258`.
    const SPAN: usize = 1;
    const SIGNED: bool = true;

    /// The eight sub-block scales `ls − 32` as pairs at 0, no coefficients
    /// (the codes read signed: no offset), `d` at 16.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn meta_avx2(blk: *const u8) -> [__m256i; 4] {
        // SAFETY: the super-block (the caller's contract).
        let (s8, d) = unsafe { iq4xs_head(blk) };
        [
            pairs16(_mm256_cvtepi8_epi32(s8)),
            _mm256_setzero_si256(),
            _mm256_zextsi128_si256(_mm_castps_si128(d)),
            _mm256_setzero_si256(),
        ]
    }
}

/// Transposes 8 vectors of 8 dwords: `out[k]` lane `r` = `v[r]` lane `k`.
#[inline]
#[target_feature(enable = "avx2")]
fn transpose8(v: &[__m256i; 8]) -> [__m256i; 8] {
    let mut t = [_mm256_setzero_si256(); 8];
    for i in 0..4 {
        t[2 * i] = _mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
    }
    // u[4 i + q], 128-bit half L: column 4 L + q of rows 4 i .. 4 i + 4
    let mut u = [_mm256_setzero_si256(); 8];
    for i in 0..2 {
        u[4 * i] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    let mut out = [_mm256_setzero_si256(); 8];
    for q in 0..4 {
        out[q] = _mm256_permute2x128_si256::<0x20>(u[q], u[4 + q]);
        out[4 + q] = _mm256_permute2x128_si256::<0x31>(u[q], u[4 + q]);
    }
    out
}

/// Unpacks super-blocks `b0 .. b0 + nsb` of weight rows `j0 .. j0 + nr`
/// (`nr ≤ 16`; the missing rows as zeros) into `buf`: each row's codes and
/// meta dwords staged, then transposed 8 rows at a time.
///
/// # Safety
/// AVX2, F16C; the rows and super-blocks inside `w` (checked by the
/// caller).
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn unpack<F: Q8kGemmAvx2>(
    w: &[u8],
    row_bytes: usize,
    (j0, nr): (usize, usize),
    (b0, nsb): (usize, usize),
    buf: &mut [Y; CHUNK * SB_VECS],
) {
    // row r's codes in vectors 8 r .. 8 r + 8, its meta in 128 + 4 r ..
    // 128 + 4 r + 4
    let mut stage = [Y([0; 8]); 12 * TILE];
    for s in 0..nsb {
        for r in 0..nr {
            let at = (j0 + r) * row_bytes + (b0 + s) * F::BYTES;
            let blk = w[at..at + F::BYTES].as_ptr();
            // SAFETY: `blk` holds the super-block (sliced above); the stores
            // are inside `stage`.
            unsafe {
                let st = stage[8 * r..8 * r + 8].as_mut_ptr().cast::<__m256i>();
                // (IQ4_XS: `v + 128` as an unsigned byte is `v` with its top
                // bit flipped)
                let flip = _mm256_set1_epi8(if F::SIGNED { -128 } else { 0 });
                for (k, c) in F::codes(blk).iter().enumerate() {
                    _mm256_store_si256(st.add(k), _mm256_xor_si256(*c, flip));
                }
                let mt = stage[128 + 4 * r..132 + 4 * r]
                    .as_mut_ptr()
                    .cast::<__m256i>();
                for (k, m) in F::meta_avx2(blk).iter().enumerate() {
                    _mm256_store_si256(mt.add(k), *m);
                }
            }
        }
        // (rows past `nr` keep the zeros they were made with)
        let base = &mut buf[s * SB_VECS..(s + 1) * SB_VECS];
        for h in 0..2 {
            // codes: row vector c holds code groups 8 c .. 8 c + 8
            for c in 0..8 {
                // SAFETY: `stage` holds 12 · 16 aligned vectors.
                let rows: [__m256i; 8] = std::array::from_fn(|r| unsafe {
                    _mm256_load_si256(stage[8 * (HALF * h + r) + c].0.as_ptr().cast())
                });
                for (q, v) in transpose8(&rows).into_iter().enumerate() {
                    let at = 2 * (8 * c + q) + h;
                    // SAFETY: vector `at` of this super-block's SB_VECS.
                    unsafe { _mm256_store_si256(base[at].0.as_mut_ptr().cast(), v) };
                }
            }
            for q in 0..4 {
                // SAFETY: as above.
                let rows: [__m256i; 8] = std::array::from_fn(|r| unsafe {
                    _mm256_load_si256(stage[128 + 4 * (HALF * h + r) + q].0.as_ptr().cast())
                });
                for (k, v) in transpose8(&rows).into_iter().enumerate() {
                    let at = META + 32 * h + 8 * q + k;
                    // SAFETY: as above.
                    unsafe { _mm256_store_si256(base[at].0.as_mut_ptr().cast(), v) };
                }
            }
        }
    }
}

/// The `A` activation rows at `x` (their values at the chunk's first
/// super-block; rows `x_stride` apart), group sums at `bs` (rows `bs_stride`
/// apart), scales at `dx` (rows `nb` apart) meet the `nsb` unpacked
/// super-blocks in `buf`: the accumulators at `acc` (`A` runs of 16, zeros
/// when `first`) take the float part of every super-block in turn.
///
/// # Safety
/// AVX2, FMA; every read inside the activations (checked by the caller),
/// `acc` valid for `16 · A` floats.
#[inline]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)] // the activation rows' three arrays and their strides
#[allow(clippy::needless_range_loop)] // (half, row) indices into the register arrays
unsafe fn micro<F: Q8kGemmAvx2, const A: usize>(
    buf: &[Y; CHUNK * SB_VECS],
    nsb: usize,
    (x, x_stride): (*const i8, usize),
    (bs, bs_stride): (*const i16, usize),
    (dx, nb): (*const f32, usize),
    acc: *mut f32,
    first: bool,
) {
    let kg_per = 64 / F::NS;
    // the code offset taken back out (none for codes read signed)
    let offset = if F::SIGNED { 0 } else { F::OFFSET };
    let bp = buf.as_ptr().cast::<__m256i>();
    // SAFETY: the caller's contract (every read and write below).
    unsafe {
        for s in 0..nsb {
            let base = bp.add(s * SB_VECS);
            let bcast = |p: *const i8| _mm256_set1_epi32(p.cast::<i32>().read_unaligned());
            let mut ii = [[_mm256_setzero_si256(); A]; 2];
            for g in 0..F::NS {
                for sp in 0..kg_per / F::SPAN {
                    let mut p = [[_mm256_setzero_si256(); A]; 2];
                    for kk in 0..F::SPAN {
                        let kg = g * kg_per + sp * F::SPAN + kk;
                        let w0 = _mm256_load_si256(base.add(2 * kg));
                        let w1 = _mm256_load_si256(base.add(2 * kg + 1));
                        if F::SIGNED {
                            // |v| · (x · sign v): the activations are never
                            // −128, so the negated ones fit
                            let (u0, u1) = (_mm256_abs_epi8(w0), _mm256_abs_epi8(w1));
                            for a in 0..A {
                                let xv = bcast(x.add(a * x_stride + s * QK_K + 4 * kg));
                                let (x0, x1) = (_mm256_sign_epi8(xv, w0), _mm256_sign_epi8(xv, w1));
                                p[0][a] = _mm256_add_epi16(p[0][a], _mm256_maddubs_epi16(u0, x0));
                                p[1][a] = _mm256_add_epi16(p[1][a], _mm256_maddubs_epi16(u1, x1));
                            }
                        } else {
                            for a in 0..A {
                                let xv = bcast(x.add(a * x_stride + s * QK_K + 4 * kg));
                                p[0][a] = _mm256_add_epi16(p[0][a], _mm256_maddubs_epi16(w0, xv));
                                p[1][a] = _mm256_add_epi16(p[1][a], _mm256_maddubs_epi16(w1, xv));
                            }
                        }
                    }
                    for h in 0..2 {
                        let sc = _mm256_load_si256(base.add(META + 32 * h + g));
                        for a in 0..A {
                            ii[h][a] = _mm256_add_epi32(ii[h][a], _mm256_madd_epi16(p[h][a], sc));
                        }
                    }
                }
            }
            for h in 0..2 {
                let mut t = [_mm256_setzero_si256(); A];
                for pr in 0..if F::MIN || offset != 0 { 8 } else { 0 } {
                    let cv = _mm256_load_si256(base.add(META + 32 * h + F::COEF + pr));
                    for (a, ta) in t.iter_mut().enumerate() {
                        let b2 = bs
                            .add(a * bs_stride + s * GROUPS + 2 * pr)
                            .cast::<i32>()
                            .read_unaligned();
                        *ta = _mm256_add_epi32(*ta, _mm256_madd_epi16(cv, _mm256_set1_epi32(b2)));
                    }
                }
                let d = _mm256_castsi256_ps(_mm256_load_si256(base.add(META + 32 * h + F::D)));
                let dmin =
                    _mm256_castsi256_ps(_mm256_load_si256(base.add(META + 32 * h + F::DMIN)));
                for a in 0..A {
                    let o = acc.add(16 * a + HALF * h);
                    let av = if first && s == 0 {
                        _mm256_setzero_ps()
                    } else {
                        _mm256_loadu_ps(o)
                    };
                    let dxv = _mm256_set1_ps(*dx.add(a * nb + s));
                    let v = if F::MIN {
                        let v = _mm256_fmadd_ps(
                            _mm256_mul_ps(d, dxv),
                            _mm256_cvtepi32_ps(ii[h][a]),
                            av,
                        );
                        _mm256_fnmadd_ps(_mm256_mul_ps(dmin, dxv), _mm256_cvtepi32_ps(t[a]), v)
                    } else {
                        let off = _mm256_mullo_epi32(t[a], _mm256_set1_epi32(offset));
                        let i = _mm256_sub_epi32(ii[h][a], off);
                        _mm256_fmadd_ps(_mm256_mul_ps(d, dxv), _mm256_cvtepi32_ps(i), av)
                    };
                    _mm256_storeu_ps(o, v);
                }
            }
        }
    }
}

/// The AVX2 micro-kernel (`q8k_gemm::GemmMicro`).
pub(super) struct Avx2;

impl<F: Q8kGemmAvx2> GemmMicro<F> for Avx2 {
    const NAME: &'static str = "q8k avx2 gemm";
    const CHUNK: usize = CHUNK;
    const MR: usize = MR;
    type Buf = [Y; CHUNK * SB_VECS];

    #[inline(always)]
    fn buf() -> Self::Buf {
        [Y([0; 8]); CHUNK * SB_VECS]
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
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
    #[target_feature(enable = "avx2,fma")]
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
                3 => micro::<F, 3>(buf, nsb, x, bs, dx, acc, first),
                2 => micro::<F, 2>(buf, nsb, x, bs, dx, acc, first),
                _ => micro::<F, 1>(buf, nsb, x, bs, dx, acc, first),
            }
        }
    }
}

/// The outputs of tiles `tiles` (weight rows `16 t .. 16 t + 16`, the last
/// one cut at `rows`) for all `m` activation rows, into `out`
/// (`[tiles.len()][m][16]`): `q8k_gemm::drive` with the AVX2 micro-kernel.
///
/// # Panics
/// If the slices are too short, or `F` has no AVX2 GEMM (caller bugs).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)] // the weights, their shape, the tiles, the activations, the output
pub(super) unsafe fn gemm<F: Q8kGemmAvx2>(
    w: &[u8],
    row_bytes: usize,
    rows: usize,
    tiles: Range<usize>,
    acts: &KActs<'_>,
    m: usize,
    out: &mut [f32],
) {
    assert!(F::SPAN > 0, "q8k avx2 gemm: a format without the AVX2 GEMM");
    // SAFETY: the features (the caller's contract).
    unsafe { drive::<F, Avx2>(w, row_bytes, rows, tiles, acts, m, out) }
}

/// [`gemm`] with the micro-kernel `K` (an [`Avx2`] over another weight
/// layout).
///
/// # Safety
/// As [`gemm`].
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)] // the weights, their shape, the tiles, the activations, the output
pub(super) unsafe fn gemm_with<F: Q8kGemmAvx2, K: GemmMicro<F>>(
    w: &[u8],
    row_bytes: usize,
    rows: usize,
    tiles: Range<usize>,
    acts: &KActs<'_>,
    m: usize,
    out: &mut [f32],
) {
    assert!(F::SPAN > 0, "q8k avx2 gemm: a format without the AVX2 GEMM");
    // SAFETY: the features (the caller's contract).
    unsafe { drive::<F, K>(w, row_bytes, rows, tiles, acts, m, out) }
}
