//! The x86-64 kernels of repacked Q4_K (see `q4k_packed`): a strip of eight
//! weight rows against up to four (AVX-512 VNNI) or two (AVX2) activation
//! rows at a time, and the GEMM's unpacking over the strips.
//!
//! Per super-block, each 64-byte code vector (eight bytes of each of the
//! eight rows) splits into its low nibbles (sub-block `2 c`) and high nibbles
//! (`2 c + 1`); `vpmaddubsw` multiplies them by the eight activations of
//! those positions, broadcast (pair sums at most `2 · 15 · 127`, never
//! saturating), and `vpdpwssd` (AVX2: `vpmaddwd` and `vpaddd`) by the
//! sub-block scale of each row, as 16-bit lanes, into i32 lanes two per row.
//! The mins take `vpmaddwd` of their 16-bit values with the activation group
//! sums summed in pairs (`bs[2j] + bs[2j + 1]`, at most `2 · 16 · 127`). One
//! `vphaddd` and one `vpermq` leave each super-block's `I` and `N` of the
//! eight rows in row order, then the float part of `q8k`'s order runs on the
//! eight rows at once, lane by lane the same IEEE operations as the portable
//! loop.

use std::arch::x86_64::*;
use std::marker::PhantomData;
use std::ops::Range;

use super::super::QK_K;
use super::super::q8k::{GROUPS, KActs};
use super::super::q8k_gemm::{self, GemmMicro, META, SB_VECS, Vnni, Z};
use super::{BLOCK, CODES, G, TILE_BYTES, block_of};
use crate::kernels::quant_block::Q4_K;

/// How far ahead of the tile being read the weights are prefetched.
const PREFETCH_BYTES: usize = 2 * TILE_BYTES;

/// A tile's `d`, `dmin` (eight rows each) and decoded scales and mins.
struct Head {
    d: __m256,
    dmin: __m256,
    /// The scales of sub-blocks 0..4, word `r` of row `r`.
    sc_lo: __m256i,
    /// The scales of sub-blocks 4..8.
    sc_hi: __m256i,
    /// The scales, rows 0, 1 (lower 128 bits) and 4, 5 (upper), eight bytes
    /// each (`vpunpckldq` of the scale words).
    sc_u: __m256i,
    /// The scales of rows 2, 3 and 6, 7.
    sc_v: __m256i,
    /// The mins of sub-blocks 0..4, word `r` of row `r`.
    mn_lo: __m256i,
    /// The mins of sub-blocks 4..8.
    mn_hi: __m256i,
}

/// Decodes the header of the tile at `t` (see the layout in `q4k_packed`).
///
/// # Safety
/// AVX2 and F16C; `t` valid for reading 128 bytes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn head(t: *const u8) -> Head {
    // SAFETY: bytes 0..128 of the tile (the caller's contract).
    let (d, dmin, a, b, c) = unsafe {
        (
            _mm_loadu_si128(t.cast()),
            _mm_loadu_si128(t.add(16).cast()),
            _mm256_loadu_si256(t.add(32).cast()),
            _mm256_loadu_si256(t.add(64).cast()),
            _mm256_loadu_si256(t.add(96).cast()),
        )
    };
    let m6 = _mm256_set1_epi8(0x3f);
    let m4 = _mm256_set1_epi8(0x0f);
    let top = _mm256_set1_epi8(0xc0u8 as i8);
    // byte-wise: the 16-bit shifts move no bit the masks keep across bytes
    let sc_lo = _mm256_and_si256(a, m6);
    let mn_lo = _mm256_and_si256(b, m6);
    let sc_hi = _mm256_or_si256(
        _mm256_and_si256(c, m4),
        _mm256_srli_epi16::<2>(_mm256_and_si256(a, top)),
    );
    let mn_hi = _mm256_or_si256(
        _mm256_and_si256(_mm256_srli_epi16::<4>(c), m4),
        _mm256_srli_epi16::<2>(_mm256_and_si256(b, top)),
    );
    Head {
        d: _mm256_cvtph_ps(d),
        dmin: _mm256_cvtph_ps(dmin),
        sc_lo,
        sc_hi,
        sc_u: _mm256_unpacklo_epi32(sc_lo, sc_hi),
        sc_v: _mm256_unpackhi_epi32(sc_lo, sc_hi),
        mn_lo,
        mn_hi,
    }
}

/// The `vpshufb` index that spreads the scale byte of sub-block `j` of the
/// two rows of a 128-bit lane (bytes `j`, `8 + j`) over the lane's 16-bit
/// lanes 0..4 and 4..8, zero-extended.
#[inline]
#[target_feature(enable = "avx2")]
fn sc_index(j: usize) -> __m128i {
    let (a, b) = (
        0x8000u16 as i16 | j as i16,
        0x8000u16 as i16 | (8 + j) as i16,
    );
    _mm_setr_epi16(a, a, a, a, b, b, b, b)
}

/// Two vectors of eight i32 lanes, two per row (rows 0..4, rows 4..8), summed
/// per row into eight lanes in row order.
#[inline]
#[target_feature(enable = "avx2")]
fn fold(lo: __m256i, hi: __m256i) -> __m256i {
    // rows 0, 1, 4, 5 | 2, 3, 6, 7
    _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_hadd_epi32(lo, hi))
}

/// `N` of the eight rows (row order) with the group sums at `bs`.
///
/// # Safety
/// AVX2; `bs` valid for reading 16 `i16`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn min_sums(h: &Head, bs: *const i16) -> __m256i {
    // SAFETY: 16 group sums (the caller's contract).
    let g = unsafe { _mm256_loadu_si256(bs.cast()) };
    // bs[2j] + bs[2j + 1] for j = 0..8, then as 16-bit lanes: j 0..4 in the
    // lower 64 bits of the lower half, 4..8 of the upper
    let p = _mm256_packs_epi32(
        _mm256_madd_epi16(g, _mm256_set1_epi16(1)),
        _mm256_setzero_si256(),
    );
    let (plo, phi) = (
        _mm256_permute4x64_epi64::<0b00_00_00_00>(p),
        _mm256_permute4x64_epi64::<0b10_10_10_10>(p),
    );
    let w = |v: __m256i, half: bool| {
        let x = if half {
            _mm256_extracti128_si256::<1>(v)
        } else {
            _mm256_castsi256_si128(v)
        };
        _mm256_cvtepu8_epi16(x)
    };
    let n0 = _mm256_add_epi32(
        _mm256_madd_epi16(w(h.mn_lo, false), plo),
        _mm256_madd_epi16(w(h.mn_hi, false), phi),
    );
    let n1 = _mm256_add_epi32(
        _mm256_madd_epi16(w(h.mn_lo, true), plo),
        _mm256_madd_epi16(w(h.mn_hi, true), phi),
    );
    fold(n0, n1)
}

/// `acc = fma(d · dx, I, acc)`, `acc = fma(−(dmin · dx), N, acc)` on the
/// eight rows.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn float_part(acc: __m256, h: &Head, dx: f32, i: __m256i, n: __m256i) -> __m256 {
    let dx = _mm256_set1_ps(dx);
    let acc = _mm256_fmadd_ps(_mm256_mul_ps(h.d, dx), _mm256_cvtepi32_ps(i), acc);
    _mm256_fnmadd_ps(_mm256_mul_ps(h.dmin, dx), _mm256_cvtepi32_ps(n), acc)
}

/// The eight activations at `p`, in every 64-bit lane.
///
/// # Safety
/// `p` valid for reading eight bytes.
#[inline(always)]
unsafe fn act8(p: *const i8) -> i64 {
    // SAFETY: eight readable bytes (the caller's contract).
    unsafe { p.cast::<i64>().read_unaligned() }
}

/// The activation rows `i0..i0 + M` as the tiles read them: per row its
/// values, scales and group sums of super-block `b`.
#[inline(always)]
fn act_row(acts: &KActs<'_>, nb: usize, i: usize, b: usize) -> (*const i8, *const i16, f32) {
    (
        acts.q[i * acts.cols + b * QK_K..][..QK_K].as_ptr(),
        acts.bsums[(i * nb + b) * GROUPS..][..GROUPS].as_ptr(),
        acts.d[i * nb + b],
    )
}

/// The outputs of the strip at `strip` (`nb` tiles) with activation rows
/// `i0..i0 + M` (`M <= 4`): one vector of the eight rows per activation row.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA, F16C; `strip` valid for reading
/// `nb · TILE_BYTES` bytes; the activation rows inside `acts`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn strip_vnni<const M: usize>(
    strip: *const u8,
    nb: usize,
    acts: &KActs<'_>,
    i0: usize,
) -> [__m256; M] {
    let low4 = _mm512_set1_epi8(0x0f);
    let mut out = [_mm256_setzero_ps(); M];
    for b in 0..nb {
        // SAFETY: tile b is inside the strip (the caller's contract).
        let t = unsafe { strip.add(b * TILE_BYTES) };
        // SAFETY: the tile's 128 header bytes; the features (this function's).
        let h = unsafe { head(t) };
        let rows: [_; M] = std::array::from_fn(|i| act_row(acts, nb, i0 + i, b));
        // scales: rows 0, 1 | 2, 3 | 4, 5 | 6, 7 in the four 128-bit lanes
        let s = _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_permute2x128_si256::<0x20>(h.sc_u, h.sc_v)),
            _mm256_permute2x128_si256::<0x31>(h.sc_u, h.sc_v),
        );
        let scale = |j: usize| _mm512_shuffle_epi8(s, _mm512_broadcast_i32x4(sc_index(j)));
        let mut acc = [[_mm512_setzero_si512(); 4]; M];
        for c in 0..4 {
            let (s_lo, s_hi) = (scale(2 * c), scale(2 * c + 1));
            for q in 0..4 {
                let k = 2 * (q & 1);
                // SAFETY: code vector 4 c + q of the tile; activations
                // 64 c + 8 q .. + 8 and 64 c + 32 + 8 q .. + 8 of the 256.
                unsafe {
                    let at = t.add(CODES + 64 * (4 * c + q));
                    _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(PREFETCH_BYTES).cast());
                    let v = _mm512_loadu_si512(at.cast());
                    let lo = _mm512_and_si512(v, low4);
                    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low4);
                    for (a, &(x, _, _)) in acc.iter_mut().zip(&rows) {
                        let xl = _mm512_set1_epi64(act8(x.add(64 * c + 8 * q)));
                        let xh = _mm512_set1_epi64(act8(x.add(64 * c + 32 + 8 * q)));
                        a[k] = _mm512_dpwssd_epi32(a[k], _mm512_maddubs_epi16(lo, xl), s_lo);
                        a[k + 1] =
                            _mm512_dpwssd_epi32(a[k + 1], _mm512_maddubs_epi16(hi, xh), s_hi);
                    }
                }
            }
        }
        // the header's two lines (a prefetch never faults)
        _mm_prefetch::<_MM_HINT_T0>(t.wrapping_add(PREFETCH_BYTES).cast());
        _mm_prefetch::<_MM_HINT_T0>(t.wrapping_add(PREFETCH_BYTES + 64).cast());
        for ((o, a), &(_, bs, dx)) in out.iter_mut().zip(&acc).zip(&rows) {
            let z = _mm512_add_epi32(_mm512_add_epi32(a[0], a[1]), _mm512_add_epi32(a[2], a[3]));
            let i = fold(_mm512_castsi512_si256(z), _mm512_extracti64x4_epi64::<1>(z));
            // SAFETY: the group sums (the caller's contract).
            let n = unsafe { min_sums(&h, bs) };
            *o = float_part(*o, &h, dx, i, n);
        }
    }
    out
}

/// The AVX2 twin of [`strip_vnni`] (`M <= 2`): the code vectors in halves
/// of four rows.
///
/// # Safety
/// AVX2, FMA, F16C; as [`strip_vnni`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn strip_avx2<const M: usize>(
    strip: *const u8,
    nb: usize,
    acts: &KActs<'_>,
    i0: usize,
) -> [__m256; M] {
    let low4 = _mm256_set1_epi8(0x0f);
    let mut out = [_mm256_setzero_ps(); M];
    for b in 0..nb {
        // SAFETY: tile b is inside the strip (the caller's contract).
        let t = unsafe { strip.add(b * TILE_BYTES) };
        // SAFETY: the tile's 128 header bytes; the features (this function's).
        let h = unsafe { head(t) };
        let rows: [_; M] = std::array::from_fn(|i| act_row(acts, nb, i0 + i, b));
        // scales: rows 0, 1 | 2, 3 and rows 4, 5 | 6, 7
        let sh = [
            _mm256_permute2x128_si256::<0x20>(h.sc_u, h.sc_v),
            _mm256_permute2x128_si256::<0x31>(h.sc_u, h.sc_v),
        ];
        let mut acc = [[_mm256_setzero_si256(); 2]; M];
        for c in 0..4 {
            let (ilo, ihi) = (
                _mm256_broadcastsi128_si256(sc_index(2 * c)),
                _mm256_broadcastsi128_si256(sc_index(2 * c + 1)),
            );
            let sc: [(__m256i, __m256i); 2] = std::array::from_fn(|hh| {
                (
                    _mm256_shuffle_epi8(sh[hh], ilo),
                    _mm256_shuffle_epi8(sh[hh], ihi),
                )
            });
            for q in 0..4 {
                // SAFETY: code vector 4 c + q of the tile; the activations
                // as in `strip_vnni`.
                unsafe {
                    let at = t.add(CODES + 64 * (4 * c + q));
                    _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(PREFETCH_BYTES).cast());
                    for (hh, &(s_lo, s_hi)) in sc.iter().enumerate() {
                        let v = _mm256_loadu_si256(at.add(32 * hh).cast());
                        let lo = _mm256_and_si256(v, low4);
                        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low4);
                        for (a, &(x, _, _)) in acc.iter_mut().zip(&rows) {
                            let xl = _mm256_set1_epi64x(act8(x.add(64 * c + 8 * q)));
                            let xh = _mm256_set1_epi64x(act8(x.add(64 * c + 32 + 8 * q)));
                            let p = _mm256_add_epi32(
                                _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), s_lo),
                                _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), s_hi),
                            );
                            a[hh] = _mm256_add_epi32(a[hh], p);
                        }
                    }
                }
            }
        }
        // the header's two lines (a prefetch never faults)
        _mm_prefetch::<_MM_HINT_T0>(t.wrapping_add(PREFETCH_BYTES).cast());
        _mm_prefetch::<_MM_HINT_T0>(t.wrapping_add(PREFETCH_BYTES + 64).cast());
        for ((o, a), &(_, bs, dx)) in out.iter_mut().zip(&acc).zip(&rows) {
            // SAFETY: the group sums (the caller's contract).
            let n = unsafe { min_sums(&h, bs) };
            *o = float_part(*o, &h, dx, fold(a[0], a[1]), n);
        }
    }
    out
}

/// Writes the eight rows' outputs `v` of activation row `i` for the strip
/// whose first row is `j0 - start` into `out_t` (`[rows][m]`).
#[inline]
#[target_feature(enable = "avx")]
fn put(out_t: &mut [f32], j0: usize, m: usize, i: usize, v: __m256) {
    let mut o = [0.0f32; G];
    // SAFETY: eight floats.
    unsafe { _mm256_storeu_ps(o.as_mut_ptr(), v) };
    if m == 1 {
        out_t[j0..j0 + G].copy_from_slice(&o);
    } else {
        for (r, o) in o.into_iter().enumerate() {
            out_t[(j0 + r) * m + i] = o;
        }
    }
}

/// The strips of `rows` (whole strips, checked) with all `m` activation
/// rows, four at a time, on [`strip_vnni`].
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA, F16C; the bounds `packed_rows` checks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn rows_vnni(
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &KActs<'_>,
    m: usize,
    out_t: &mut [f32],
) {
    let nb = acts.cols / QK_K;
    for s in rows.start / G..rows.end / G {
        let strip = w[s * G * row_bytes..(s + 1) * G * row_bytes].as_ptr();
        let j0 = s * G - rows.start;
        let mut i0 = 0;
        while i0 < m {
            let a = (m - i0).min(4);
            // SAFETY: the features (this function's); the strip is `nb`
            // tiles (sliced above), activation rows i0 .. i0 + a < m.
            unsafe {
                match a {
                    4 => {
                        for (i, v) in strip_vnni::<4>(strip, nb, acts, i0).into_iter().enumerate() {
                            put(out_t, j0, m, i0 + i, v);
                        }
                    }
                    3 => {
                        for (i, v) in strip_vnni::<3>(strip, nb, acts, i0).into_iter().enumerate() {
                            put(out_t, j0, m, i0 + i, v);
                        }
                    }
                    2 => {
                        for (i, v) in strip_vnni::<2>(strip, nb, acts, i0).into_iter().enumerate() {
                            put(out_t, j0, m, i0 + i, v);
                        }
                    }
                    _ => {
                        let [v] = strip_vnni::<1>(strip, nb, acts, i0);
                        put(out_t, j0, m, i0, v);
                    }
                }
            }
            i0 += a;
        }
    }
}

/// The AVX2 twin of [`rows_vnni`] (two activation rows at a time).
///
/// # Safety
/// AVX2, FMA, F16C; the bounds `packed_rows` checks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_avx2(
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &KActs<'_>,
    m: usize,
    out_t: &mut [f32],
) {
    let nb = acts.cols / QK_K;
    for s in rows.start / G..rows.end / G {
        let strip = w[s * G * row_bytes..(s + 1) * G * row_bytes].as_ptr();
        let j0 = s * G - rows.start;
        let mut i0 = 0;
        while i0 < m {
            let a = (m - i0).min(2);
            // SAFETY: as in `rows_vnni`.
            unsafe {
                if a == 2 {
                    for (i, v) in strip_avx2::<2>(strip, nb, acts, i0).into_iter().enumerate() {
                        put(out_t, j0, m, i0 + i, v);
                    }
                } else {
                    let [v] = strip_avx2::<1>(strip, nb, acts, i0);
                    put(out_t, j0, m, i0, v);
                }
            }
            i0 += a;
        }
    }
}

/// Most super-blocks a GEMM micro-kernel unpacks at a time (asserted).
const MAX_CHUNK: usize = 4;

/// A GEMM micro-kernel `K` of the original blocks over the repacked ones:
/// its unpacking reads the chunk's blocks back out of the tiles
/// ([`block_of`]) into llama.cpp's layout on the stack, then unpacks those
/// as `K` does; its inner product is `K`'s.
pub(crate) struct Repacked<K>(PhantomData<K>);

impl<K: GemmMicro<Q4_K>> GemmMicro<Q4_K> for Repacked<K> {
    const NAME: &'static str = K::NAME;
    const CHUNK: usize = K::CHUNK;
    const MR: usize = K::MR;
    type Buf = K::Buf;

    #[inline(always)]
    fn buf() -> Self::Buf {
        K::buf()
    }

    unsafe fn unpack(
        w: &[u8],
        row_bytes: usize,
        (j0, nr): (usize, usize),
        (b0, nsb): (usize, usize),
        buf: &mut Self::Buf,
    ) {
        assert!(nsb <= MAX_CHUNK && nr <= 16, "q4k packed gemm: chunk");
        assert!(j0.is_multiple_of(G), "q4k packed gemm: whole strips");
        let mut tmp = [0u8; 16 * MAX_CHUNK * BLOCK];
        let rb = nsb * BLOCK;
        for r in 0..nr {
            let s = (j0 + r) / G;
            let strip = &w[s * G * row_bytes..(s + 1) * G * row_bytes];
            for k in 0..nsb {
                let blk: &mut [u8; BLOCK] = (&mut tmp[r * rb + k * BLOCK..][..BLOCK])
                    .try_into()
                    .expect("one block");
                block_of(strip, (j0 + r) % G, b0 + k, blk);
            }
        }
        // SAFETY: the caller's contract (the features); `tmp` holds `nr`
        // rows of `nsb` blocks.
        unsafe { K::unpack(&tmp[..nr * rb], rb, (0, nr), (0, nsb), buf) }
    }

    #[allow(clippy::too_many_arguments)] // as GemmMicro::micro
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
        unsafe { K::micro(buf, a, nsb, x, bs, dx, acc, first) }
    }
}

/// A tile of zeros: the second strip of a GEMM tile of eight rows.
static ZERO_TILE: [u8; TILE_BYTES] = [0; TILE_BYTES];

/// Byte `k` of each 32-bit word of `v`, as i32.
#[inline]
#[target_feature(enable = "avx2")]
fn word_byte(v: __m256i, k: usize) -> __m256i {
    _mm256_and_si256(
        _mm256_srl_epi32(v, _mm_cvtsi32_si128(8 * k as i32)),
        _mm256_set1_epi32(0xff),
    )
}

/// Rows 0..8 from `a`, rows 8..16 from `b`.
#[inline]
#[target_feature(enable = "avx512f")]
fn join(a: __m256i, b: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b)
}

/// The AVX-512 VNNI GEMM's micro-kernel (`q8k_gemm::Vnni`) with an
/// unpacking that reads the tiles directly: its buffer of a super-block is
/// 64 code vectors (vector `g` the codes `4 g .. 4 g + 4` of the 16 rows,
/// one row per 32-bit lane) then the meta vectors (the eight scales as i32,
/// the eight mins as 16-bit pairs `(mn, mn)`, `d`, `dmin`), as
/// `q8k_gemm`'s unpacking leaves them for the original blocks: the same
/// vectors, so the same integers and bits. A code vector is one
/// `vpermt2d` of two strips' nibbles (the 32-bit words `2 r + h` of each
/// row's eight bytes).
pub(crate) struct DirectVnni;

impl GemmMicro<Q4_K> for DirectVnni {
    const NAME: &'static str = "q4k packed gemm";
    const CHUNK: usize = q8k_gemm::CHUNK;
    const MR: usize = <Vnni as GemmMicro<Q4_K>>::MR;
    type Buf = [Z; q8k_gemm::CHUNK * SB_VECS];

    #[inline(always)]
    fn buf() -> Self::Buf {
        <Vnni as GemmMicro<Q4_K>>::buf()
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
    unsafe fn unpack(
        w: &[u8],
        row_bytes: usize,
        (j0, nr): (usize, usize),
        (b0, nsb): (usize, usize),
        buf: &mut Self::Buf,
    ) {
        assert!(nsb <= q8k_gemm::CHUNK, "q4k packed gemm: chunk");
        assert!(
            j0.is_multiple_of(G) && (nr == G || nr == 2 * G),
            "q4k packed gemm: whole strips"
        );
        let sb = G * row_bytes;
        let s0 = j0 / G;
        let a = &w[s0 * sb..(s0 + 1) * sb];
        let b = if nr == 2 * G {
            &w[(s0 + 1) * sb..(s0 + 2) * sb]
        } else {
            &[][..]
        };
        let low4 = _mm512_set1_epi8(0x0f);
        // the words 2 r + h of the first strip's vector, then of the second's
        let idx: [__m512i; 2] = std::array::from_fn(|h| {
            let h = h as i32;
            _mm512_setr_epi32(
                h,
                2 + h,
                4 + h,
                6 + h,
                8 + h,
                10 + h,
                12 + h,
                14 + h,
                16 + h,
                18 + h,
                20 + h,
                22 + h,
                24 + h,
                26 + h,
                28 + h,
                30 + h,
            )
        });
        for k in 0..nsb {
            let ta = a[(b0 + k) * TILE_BYTES..][..TILE_BYTES].as_ptr();
            let tb = if b.is_empty() {
                ZERO_TILE.as_ptr()
            } else {
                b[(b0 + k) * TILE_BYTES..][..TILE_BYTES].as_ptr()
            };
            let base = buf[k * SB_VECS..(k + 1) * SB_VECS]
                .as_mut_ptr()
                .cast::<__m512i>();
            // SAFETY: both tiles are TILE_BYTES long (sliced above); the
            // stores are vectors 0..META + 18 of this super-block's SB_VECS
            // aligned vectors.
            unsafe {
                for c in 0..4 {
                    for q in 0..4 {
                        let off = CODES + 64 * (4 * c + q);
                        let (va, vb) = (
                            _mm512_loadu_si512(ta.add(off).cast()),
                            _mm512_loadu_si512(tb.add(off).cast()),
                        );
                        let nib = |v: __m512i, hi: bool| {
                            let v = if hi { _mm512_srli_epi16::<4>(v) } else { v };
                            _mm512_and_si512(v, low4)
                        };
                        for (j, hi) in [(2 * c, false), (2 * c + 1, true)] {
                            let (na, nb) = (nib(va, hi), nib(vb, hi));
                            for (h, ix) in idx.iter().enumerate() {
                                let g = 8 * j + 2 * q + h;
                                _mm512_store_si512(
                                    base.add(g),
                                    _mm512_permutex2var_epi32(na, *ix, nb),
                                );
                            }
                        }
                    }
                }
                let (ha, hb) = (head(ta), head(tb));
                for j in 0..8 {
                    let (va, vb) = if j < 4 {
                        (word_byte(ha.sc_lo, j), word_byte(hb.sc_lo, j))
                    } else {
                        (word_byte(ha.sc_hi, j - 4), word_byte(hb.sc_hi, j - 4))
                    };
                    _mm512_store_si512(base.add(META + j), join(va, vb));
                    let (ma, mb) = if j < 4 {
                        (word_byte(ha.mn_lo, j), word_byte(hb.mn_lo, j))
                    } else {
                        (word_byte(ha.mn_hi, j - 4), word_byte(hb.mn_hi, j - 4))
                    };
                    let mv = join(ma, mb);
                    _mm512_store_si512(
                        base.add(META + 8 + j),
                        _mm512_or_si512(mv, _mm512_slli_epi32::<16>(mv)),
                    );
                }
                let f = |x: __m256, y: __m256| join(_mm256_castps_si256(x), _mm256_castps_si256(y));
                _mm512_store_si512(base.add(META + 16), f(ha.d, hb.d));
                _mm512_store_si512(base.add(META + 17), f(ha.dmin, hb.dmin));
            }
        }
    }

    #[inline]
    #[allow(clippy::too_many_arguments)] // as GemmMicro::micro
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
        // SAFETY: the caller's contract (the buffer is laid out as Vnni's).
        unsafe { <Vnni as GemmMicro<Q4_K>>::micro(buf, a, nsb, x, bs, dx, acc, first) }
    }
}
