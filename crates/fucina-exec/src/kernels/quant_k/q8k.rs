//! The super-block activations of the K formats Q2_K, Q3_K, Q4_K, Q5_K,
//! Q6_K and of IQ4_XS (llama.cpp's Q8_K: one f32 scale per 256 values, int8
//! values, the sums of each group of 16) and their dot products with the
//! weights, whose integer sub-block (or group) scales and mins are applied as
//! integer multiplies.
//!
//! # The activations
//! Each activation row is cut into blocks of 256 and quantized once per call
//! ([`quantize_row`]), as llama.cpp's `quantize_row_q8_K`: `max` the signed
//! value of largest magnitude (the first on a tie), `is = −127 / max`,
//! `q = round(is · x)` (ties to even, clamped to `−127..=127`), `d = 1 / is`
//! (f32), and `bs[g] = Σ q` over each group of 16. A block of zeros gets
//! `d = 0`, a block holding a non-finite value `d = NaN` (so every output of
//! the row is NaN).
//!
//! # The order (the same bits on every path)
//! For one output, super-block `b` of the weight row (f16 `d`, `dmin` widened
//! to f32; integer scales `sc`, mins `mn`) and of the activation row (scale
//! `dx`) give two exact integers:
//! - Q4_K, Q5_K: `I = Σ_j sc[j] · Σ_{k ∈ j} q · x` (sub-blocks `j` of 32,
//!   `q` the 4- or 5-bit code) and `N = Σ_j mn[j] · (bs[2j] + bs[2j + 1])`;
//! - Q6_K: `I = Σ_g sc[g] · Σ_{k ∈ g} (q − 32) · x` (groups `g` of 16), no
//!   `N`;
//! - Q3_K: `I = Σ_g (ls[g] − 32) · Σ_{k ∈ g} q · x` (groups of 16, `q` in
//!   `−4..=3`), no `N`;
//! - Q2_K: `I = Σ_g sc[g] · Σ_{k ∈ g} q · x` (groups of 16, the 4-bit
//!   scales, `q` in `0..=3`) and `N = Σ_g mn[g] · bs[g]` (the 4-bit mins);
//! - IQ4_XS: `I = Σ_j (ls[j] − 32) · Σ_{k ∈ j} KVALUES[n] · x` (sub-blocks of
//!   32), no `N`.
//!
//! (`|I| < 2^28`, exact in i32.) One f32 accumulator per output takes, block
//! after block in increasing order, `acc = fma(d · dx, I, acc)` and, for
//! Q2_K, Q4_K and Q5_K, `acc = fma(−(dmin · dx), N, acc)` (each product of scales
//! one rounding, each integer converted to f32 with one rounding); the
//! output is `acc`. The integers are exact whatever order a path sums them
//! in, and every path (portable, AVX2, AVX-512 VNNI) performs exactly these
//! float operations, so a result is the same bits on every path, for every
//! split of the rows among threads and for every batch size.

use std::ops::Range;

use super::QK_K;
use crate::kernels::quant_block::iq4_nl::KVALUES;
use crate::kernels::quant_block::q4_k::{q4k_scales, unpack_q4k};
use crate::kernels::quant_block::{BlockFormat, IQ4_XS, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, f16_at};
use crate::kernels::quant_dot;

/// Groups of 16 per super-block (the activation group sums).
pub(crate) const GROUPS: usize = QK_K / 16;

/// The activations of one call after [`quantize_row`]: row `i`'s block `b` is
/// `q[i * cols + 256 b..][..256]`, its scale `d[i * nb + b]`, its group sums
/// `bsums[(i * nb + b) * 16..][..16]` (`nb = cols / 256`).
#[derive(Clone, Copy)]
pub(crate) struct KActs<'a> {
    /// Quantized values, `[m, cols]`.
    pub q: &'a [i8],
    /// Block scales, `[m, nb]`.
    pub d: &'a [f32],
    /// Group sums, `[m, nb, 16]`.
    pub bsums: &'a [i16],
    /// Elements per row (a multiple of 256).
    pub cols: usize,
}

/// Quantizes one activation row `x` (a multiple of 256 long) into `q`, `d`
/// and `bsums` (see the module docs). Every step is exact or one IEEE
/// rounding (the quotient `−127 / max`, the product `is · x`, the quotient
/// `1 / is`), so every vector level gives the same values.
pub(crate) fn quantize_row(x: &[f32], q: &mut [i8], d: &mut [f32], bsums: &mut [i16]) {
    crate::kernels::simd::vectorized!(quantize_row_body(x, q, d, bsums))
}

#[inline(always)]
fn quantize_row_body(x: &[f32], q: &mut [i8], d: &mut [f32], bsums: &mut [i16]) {
    let blocks = x
        .chunks_exact(QK_K)
        .zip(q.chunks_exact_mut(QK_K))
        .zip(d.iter_mut())
        .zip(bsums.chunks_exact_mut(GROUPS));
    for (((xb, qb), d), bs) in blocks {
        let xb: &[f32; QK_K] = xb.try_into().expect("a block of 256");
        let bad = xb.iter().fold(0u32, |b, v| {
            b | u32::from(v.to_bits() & 0x7f80_0000 == 0x7f80_0000)
        });
        // the first value of largest magnitude (a strict comparison, as
        // llama.cpp's)
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if bad != 0 || amax == 0.0 {
            *d = if bad != 0 { f32::NAN } else { 0.0 };
            qb.fill(0);
            bs.fill(0);
            continue;
        }
        let is = -127.0 / max;
        let mut qi = [0i32; QK_K];
        for (o, &v) in qi.iter_mut().zip(xb) {
            // |is · x| <= 127 up to one rounding; adding and taking away
            // 1.5 · 2^23 rounds it to an integer, ties to even (as
            // llama.cpp's `nearest_int`), with two exact IEEE additions
            let r = (is * v + 12_582_912.0) - 12_582_912.0;
            *o = (r as i32).clamp(-127, 127);
        }
        for (o, &v) in qb.iter_mut().zip(&qi) {
            *o = v as i8;
        }
        for (s, g) in bs.iter_mut().zip(qi.chunks_exact(16)) {
            *s = g.iter().sum::<i32>() as i16;
        }
        *d = 1.0 / is;
    }
}

/// A K format whose products take the super-block activations of this module.
pub(crate) trait Q8kDot: BlockFormat {
    /// Whether it has a min term `N` (Q2_K, Q4_K, Q5_K).
    const MIN: bool;

    /// The f32 super-block scale `d` and min scale `dmin` (0 without a min).
    fn scales(blk: &[u8]) -> (f32, f32);

    /// The exact integers `(I, N)` of one super-block `blk` with the
    /// activations `xq` (256) and their group sums `bs` (16); `N` is 0
    /// without a min.
    fn int_dot(blk: &[u8], xq: &[i8], bs: &[i16]) -> (i32, i32);
}

/// `Σ v · x` over a sub-block of 32 (exact).
#[inline(always)]
fn dot32(v: &[i8; 32], x: &[i8]) -> i32 {
    let x: &[i8; 32] = x[..32].try_into().expect("32 activations");
    let mut s = 0i32;
    for (&a, &b) in v.iter().zip(x) {
        s += i32::from(a) * i32::from(b);
    }
    s
}

/// `N = Σ_j mn[j] · (bs[2j] + bs[2j + 1])`.
#[inline(always)]
fn min_sum(mn: &[u8; 8], bs: &[i16]) -> i32 {
    mn.iter()
        .enumerate()
        .map(|(j, &m)| i32::from(m) * (i32::from(bs[2 * j]) + i32::from(bs[2 * j + 1])))
        .sum()
}

impl Q8kDot for Q4_K {
    const MIN: bool = true;

    fn scales(blk: &[u8]) -> (f32, f32) {
        (f16_at(&blk[0..]), f16_at(&blk[2..]))
    }

    #[inline(always)]
    fn int_dot(blk: &[u8], xq: &[i8], bs: &[i16]) -> (i32, i32) {
        let (sc, mn) = q4k_scales(&blk[4..16]);
        let mut v = [0i8; 32];
        let mut i = 0i32;
        for (j, &s) in sc.iter().enumerate() {
            unpack_q4k(&blk[16..144], j, &mut v);
            i += i32::from(s) * dot32(&v, &xq[32 * j..]);
        }
        (i, min_sum(&mn, bs))
    }
}

impl Q8kDot for Q5_K {
    const MIN: bool = true;

    fn scales(blk: &[u8]) -> (f32, f32) {
        (f16_at(&blk[0..]), f16_at(&blk[2..]))
    }

    #[inline(always)]
    fn int_dot(blk: &[u8], xq: &[i8], bs: &[i16]) -> (i32, i32) {
        let (sc, mn) = q4k_scales(&blk[4..16]);
        let qh: &[u8; 32] = blk[16..48].try_into().expect("32 high-bit bytes");
        let mut v = [0i8; 32];
        let mut i = 0i32;
        for (j, &s) in sc.iter().enumerate() {
            unpack_q4k(&blk[48..176], j, &mut v);
            for (v, &h) in v.iter_mut().zip(qh) {
                *v |= (((h >> j) & 1) << 4) as i8;
            }
            i += i32::from(s) * dot32(&v, &xq[32 * j..]);
        }
        (i, min_sum(&mn, bs))
    }
}

impl Q8kDot for Q6_K {
    const MIN: bool = false;

    fn scales(blk: &[u8]) -> (f32, f32) {
        (f16_at(&blk[208..]), 0.0)
    }

    #[inline(always)]
    fn int_dot(blk: &[u8], xq: &[i8], _bs: &[i16]) -> (i32, i32) {
        let mut i = 0i32;
        let mut v = [0i8; 32];
        for half in 0..2 {
            let ql = &blk[64 * half..64 * half + 64];
            let qh = &blk[128 + 32 * half..128 + 32 * half + 32];
            for g in 0..4 {
                for (k, v) in v.iter_mut().enumerate() {
                    let l = ql[32 * (g % 2) + k];
                    let lo = if g < 2 { l & 0x0f } else { l >> 4 };
                    *v = (lo | (((qh[k] >> (2 * g)) & 3) << 4)) as i8 - 32;
                }
                let j = 4 * half + g;
                let x = &xq[32 * j..];
                let (a, b) = (v[..16].iter(), v[16..].iter());
                let s0: i32 = a
                    .zip(&x[..16])
                    .map(|(&q, &x)| i32::from(q) * i32::from(x))
                    .sum();
                let s1: i32 = b
                    .zip(&x[16..32])
                    .map(|(&q, &x)| i32::from(q) * i32::from(x))
                    .sum();
                let sc = |g: usize| i32::from(blk[192 + g] as i8);
                i += sc(2 * j) * s0 + sc(2 * j + 1) * s1;
            }
        }
        (i, 0)
    }
}

/// `sc0 · Σ v · x` over the first 16 of `v` plus `sc1 · Σ v · x` over the
/// last 16 (two groups of 16 with their scales; exact).
#[inline(always)]
fn dot16x2(v: &[i8; 32], x: &[i8], sc0: i32, sc1: i32) -> i32 {
    let x: &[i8; 32] = x[..32].try_into().expect("32 activations");
    let half = |r: std::ops::Range<usize>| -> i32 {
        v[r.clone()]
            .iter()
            .zip(&x[r])
            .map(|(&q, &x)| i32::from(q) * i32::from(x))
            .sum()
    };
    sc0 * half(0..16) + sc1 * half(16..32)
}

/// The 2-bit codes of sub-block `j` of Q2_K and Q3_K: run `j mod 4` (bits
/// `2 (j mod 4)`) of the 32 code bytes of half `j / 4` in `qs` (64 bytes).
#[inline(always)]
fn low2(qs: &[u8], j: usize, v: &mut [i8; 32]) {
    let codes = &qs[32 * (j / 4)..32 * (j / 4) + 32];
    for (v, &c) in v.iter_mut().zip(codes) {
        *v = ((c >> (2 * (j % 4))) & 3) as i8;
    }
}

impl Q8kDot for Q3_K {
    const MIN: bool = false;

    fn scales(blk: &[u8]) -> (f32, f32) {
        (f16_at(&blk[108..]), 0.0)
    }

    /// `I = Σ_g (ls[g] − 32) · Σ_{k ∈ g} q · x`, `q` in `−4..=3` (the high
    /// bit of sub-block `j` is bit `j` of `hmask`; clear means `− 4`).
    #[inline(always)]
    fn int_dot(blk: &[u8], xq: &[i8], _bs: &[i16]) -> (i32, i32) {
        let sc = crate::kernels::quant_block::q3_k::signed_scales(&blk[96..108]);
        let hmask = &blk[..32];
        let mut v = [0i8; 32];
        let mut i = 0i32;
        for j in 0..8 {
            low2(&blk[32..96], j, &mut v);
            for (v, &h) in v.iter_mut().zip(hmask) {
                *v -= 4 * (1 - ((h >> j) & 1) as i8);
            }
            let (s0, s1) = (i32::from(sc[2 * j]), i32::from(sc[2 * j + 1]));
            i += dot16x2(&v, &xq[32 * j..], s0, s1);
        }
        (i, 0)
    }
}

impl Q8kDot for Q2_K {
    const MIN: bool = true;

    fn scales(blk: &[u8]) -> (f32, f32) {
        (f16_at(&blk[80..]), f16_at(&blk[82..]))
    }

    /// `I = Σ_g sc[g] · Σ_{k ∈ g} q · x` (`q` in `0..=3`, `sc` the low
    /// nibble of byte `g`), `N = Σ_g mn[g] · bs[g]` (`mn` the high nibble).
    #[inline(always)]
    fn int_dot(blk: &[u8], xq: &[i8], bs: &[i16]) -> (i32, i32) {
        let mut v = [0i8; 32];
        let mut i = 0i32;
        for j in 0..8 {
            low2(&blk[16..80], j, &mut v);
            let (s0, s1) = (i32::from(blk[2 * j] & 15), i32::from(blk[2 * j + 1] & 15));
            i += dot16x2(&v, &xq[32 * j..], s0, s1);
        }
        let n = blk[..16]
            .iter()
            .zip(bs)
            .map(|(&s, &b)| i32::from(s >> 4) * i32::from(b))
            .sum();
        (i, n)
    }
}

impl Q8kDot for IQ4_XS {
    const MIN: bool = false;

    fn scales(blk: &[u8]) -> (f32, f32) {
        (f16_at(blk), 0.0)
    }

    /// `I = Σ_j (ls[j] − 32) · Σ_{k ∈ j} KVALUES[n] · x` over the sub-blocks
    /// of 32.
    #[inline(always)]
    fn int_dot(blk: &[u8], xq: &[i8], _bs: &[i16]) -> (i32, i32) {
        let sc = crate::kernels::quant_block::iq4_xs::signed_scales(blk);
        let mut v = [0i8; 32];
        let mut i = 0i32;
        for (j, &s) in sc.iter().enumerate() {
            let qs = &blk[8 + 16 * j..8 + 16 * j + 16];
            for (k, &b) in qs.iter().enumerate() {
                v[k] = KVALUES[usize::from(b & 15)];
                v[k + 16] = KVALUES[usize::from(b >> 4)];
            }
            i += i32::from(s) * dot32(&v, &xq[32 * j..]);
        }
        (i, 0)
    }
}

/// One output's float part for super-block `blk` (see the module docs).
#[inline(always)]
fn accumulate<F: Q8kDot>(blk: &[u8], dx: f32, i: i32, n: i32, acc: f32) -> f32 {
    let (d, dmin) = F::scales(blk);
    let acc = (d * dx).mul_add(i as f32, acc);
    if F::MIN {
        (-(dmin * dx)).mul_add(n as f32, acc)
    } else {
        acc
    }
}

/// The portable product: for each (weight row, activation row) pair, the
/// super-blocks in increasing order.
#[inline(always)]
fn portable_rows<F: Q8kDot>(
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &KActs<'_>,
    m: usize,
    out_t: &mut [f32],
) {
    let nb = acts.cols / QK_K;
    for (jj, j) in rows.enumerate() {
        let wrow = &w[j * row_bytes..(j + 1) * row_bytes];
        for i in 0..m {
            let mut acc = 0.0f32;
            for (b, blk) in wrow.chunks_exact(F::BYTES).enumerate() {
                let xq = &acts.q[i * acts.cols + b * QK_K..][..QK_K];
                let bs = &acts.bsums[(i * nb + b) * GROUPS..][..GROUPS];
                let (ii, n) = F::int_dot(blk, xq, bs);
                acc = accumulate::<F>(blk, acts.d[i * nb + b], ii, n, acc);
            }
            out_t[jj * m + i] = acc;
        }
    }
}

/// Computes the outputs of weight rows `rows` for all `m` activation rows:
/// `out_t[(j - rows.start) * m + i] = dot(w row j, activation row i)` in the
/// fixed order of the module docs, with the vector kernels of the current
/// level (the portable loop where there are none).
///
/// # Panics
/// If `w`, `acts` or `out_t` are too short for `rows` and `m`, or
/// `row_bytes` is not a whole number of blocks of `acts.cols` columns (caller
/// bugs).
pub(crate) fn q8k_rows<F: Q8kVector>(
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &KActs<'_>,
    m: usize,
    out_t: &mut [f32],
) {
    let nb = acts.cols / QK_K;
    assert!(acts.cols.is_multiple_of(QK_K), "q8k_rows: columns");
    assert_eq!(row_bytes, nb * F::BYTES, "q8k_rows: row bytes");
    assert!(rows.end * row_bytes <= w.len(), "q8k_rows: weight rows");
    assert!(acts.q.len() >= m * acts.cols, "q8k_rows: activation values");
    assert!(acts.d.len() >= m * nb, "q8k_rows: activation scales");
    assert!(acts.bsums.len() >= m * nb * GROUPS, "q8k_rows: group sums");
    assert!(out_t.len() >= rows.len() * m, "q8k_rows: output");
    match quant_dot::path() {
        #[cfg(target_arch = "x86_64")]
        quant_dot::Path::Vnni => {
            // SAFETY: `path` returns Vnni only when the CPU has every feature
            // `rows_vnni` enables; the bounds were checked above.
            unsafe { super::q8k_x86::rows_vnni::<F>(w, row_bytes, rows, acts, m, out_t) }
        }
        #[cfg(target_arch = "x86_64")]
        quant_dot::Path::Avx2 => {
            // SAFETY: `path` returns Avx2 only when the CPU has AVX2, FMA and
            // F16C; the bounds were checked above.
            unsafe { super::q8k_x86::rows_avx2::<F>(w, row_bytes, rows, acts, m, out_t) }
        }
        _ => crate::kernels::simd::vectorized!(portable_rows::<F>(
            w, row_bytes, rows, acts, m, out_t
        )),
    }
}

/// A [`Q8kDot`] format with vector kernels (on x86-64, its AVX2 integer
/// sums).
#[cfg(target_arch = "x86_64")]
pub(crate) trait Q8kVector:
    Q8kDot + super::q8k_zmm::Q8kZmm + super::q8k_gemm_avx2::Q8kGemmAvx2
{
}
#[cfg(target_arch = "x86_64")]
impl<F: Q8kDot + super::q8k_zmm::Q8kZmm + super::q8k_gemm_avx2::Q8kGemmAvx2> Q8kVector for F {}

/// A [`Q8kDot`] format (no vector kernels on this architecture).
#[cfg(not(target_arch = "x86_64"))]
pub(crate) trait Q8kVector: Q8kDot {}
#[cfg(not(target_arch = "x86_64"))]
impl<F: Q8kDot> Q8kVector for F {}

/// The bounds both GEMMs (`q8k_gemm`, `q8k_gemm_avx2`) assert before their
/// unchecked walk: `w` holds `rows` rows of `row_bytes` (whole super-blocks
/// of `block_bytes`), the tiles end inside `rows`, and the activations and
/// the `[tiles][m][16]` output are long enough.
///
/// # Panics
/// Where one does not hold (caller bugs), naming the GEMM `who`.
#[allow(clippy::too_many_arguments)] // the weights, their shape, the tiles, the activations, the output
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn check_gemm(
    who: &str,
    w: &[u8],
    (row_bytes, block_bytes): (usize, usize),
    rows: usize,
    tiles: &Range<usize>,
    acts: &KActs<'_>,
    m: usize,
    out: &[f32],
) {
    let nb = acts.cols / QK_K;
    assert_eq!(row_bytes, nb * block_bytes, "{who}: row bytes");
    assert!(rows * row_bytes <= w.len(), "{who}: weight rows");
    assert!(tiles.end * GEMM_TILE < rows + GEMM_TILE, "{who}: tiles");
    assert!(acts.q.len() >= m * acts.cols, "{who}: activations");
    assert!(acts.d.len() >= m * nb, "{who}: scales");
    assert!(acts.bsums.len() >= m * nb * GROUPS, "{who}: sums");
    assert!(out.len() >= tiles.len() * m * GEMM_TILE, "{who}: output");
}

/// Activation rows from which `quant_matmul` takes the AVX-512 VNNI GEMM
/// ([`gemm_tiles`]).
pub(crate) const GEMM_MIN_M: usize = 8;

/// Weight rows per tile of [`gemm_tiles`].
pub(crate) const GEMM_TILE: usize = 16;

/// The GEMM a level runs ([`gemm_tiles`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Gemm {
    /// None: the rows kernel for every `m`.
    None,
    /// The AVX2 GEMM (`q8k_gemm_avx2`; AVX2, FMA, F16C).
    Avx2,
    /// The AVX-512 VNNI GEMM (`q8k_gemm`).
    Vnni,
}

/// The GEMMs with the CPU features each needs, in the order preferred.
fn gemm_kernels() -> [(Gemm, crate::kernels::simd::CpuFeatures); 2] {
    use crate::kernels::simd::CpuFeatures as F;
    let avx2 = F::AVX2.with(F::FMA).with(F::F16C);
    let vnni = avx2
        .with(F::AVX512F)
        .with(F::AVX512BW)
        .with(F::AVX512VL)
        .with(F::AVX512VNNI);
    [(Gemm::Vnni, vnni), (Gemm::Avx2, avx2)]
}

/// The GEMM of the current level, through the one kernel-selection rule
/// (`simd::choose`).
fn gemm_kernel() -> Gemm {
    if !cfg!(target_arch = "x86_64") {
        return Gemm::None;
    }
    crate::kernels::simd::choose(&gemm_kernels(), Gemm::None)
}

/// Activation rows from which `quant_matmul` takes the AVX2 GEMM (below,
/// the four-row tile: at 8 rows, a batch-8 decode step, the tile measured
/// faster end to end, the GEMM's unpacking then shared by too few rows).
pub(crate) const GEMM_MIN_M_AVX2: usize = 16;

/// Whether `quant_matmul` takes [`gemm_tiles`] for `m` activation rows at
/// the current level (AVX-512 VNNI from `GEMM_MIN_M` rows, AVX2 from
/// `GEMM_MIN_M_AVX2`). The caller decides once per call (the level may
/// change between calls, never the bits).
pub(crate) fn gemm_for<F: Q8kVector>(m: usize) -> bool {
    match gemm_kernel() {
        Gemm::Vnni => m >= GEMM_MIN_M,
        Gemm::Avx2 => m >= GEMM_MIN_M_AVX2,
        Gemm::None => false,
    }
}

/// The outputs of weight rows `16 t .. 16 t + 16` for the tiles `t` in
/// `tiles` (the last cut at `rows`) and all `m` activation rows, into
/// `out_tiles` (`[tiles.len()][m][16]`), in the fixed order of the module
/// docs; `untranspose_tiles` writes them to the product's output.
///
/// # Panics
/// Where the CPU has no GEMM (see [`gemm_for`]), or the slices are too
/// short (caller bugs).
pub(crate) fn gemm_tiles<F: Q8kVector>(
    w: &[u8],
    row_bytes: usize,
    rows: usize,
    tiles: Range<usize>,
    acts: &KActs<'_>,
    m: usize,
    out_tiles: &mut [f32],
) {
    match gemm_level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `choose` (or the detected features) gives Vnni only where the CPU has AVX-512
        // F/BW/VL/VNNI, AVX2, FMA and F16C; `gemm` checks the bounds.
        Gemm::Vnni => unsafe {
            super::q8k_gemm::gemm::<F>(w, row_bytes, rows, tiles, acts, m, out_tiles)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `choose` (or the detected features) gives Avx2 only where the CPU has AVX2, FMA and
        // F16C; `gemm` checks the bounds.
        Gemm::Avx2 => unsafe {
            super::q8k_gemm_avx2::gemm::<F>(w, row_bytes, rows, tiles, acts, m, out_tiles)
        },
        _ => panic!("gemm_tiles: no GEMM at this level (see gemm_for)"),
    }
}

/// The GEMM [`gemm_tiles`] runs: the current level's, or, where the level
/// was lowered since the caller's [`gemm_for`] (a test forcing levels on
/// another thread), any GEMM the CPU has (the same bits).
pub(super) fn gemm_level() -> Gemm {
    match gemm_kernel() {
        Gemm::None => {
            let cpu = crate::kernels::simd::CpuFeatures::detected();
            let has = gemm_kernels().into_iter().find(|&(_, f)| cpu.has(f));
            has.map_or(Gemm::None, |(k, _)| k)
        }
        k => k,
    }
}

/// Writes `t` (`[tiles][m][16]`, see [`gemm_tiles`]) into `out` (`[m, rows]`).
pub(crate) fn untranspose_tiles(t: &[f32], m: usize, rows: usize, out: &mut [f32]) {
    debug_assert!(out.len() >= m * rows);
    for (tb, tt) in t.chunks_exact(m * GEMM_TILE).enumerate() {
        let j0 = tb * GEMM_TILE;
        if j0 >= rows {
            break;
        }
        let n = (rows - j0).min(GEMM_TILE);
        for (orow, trow) in out.chunks_exact_mut(rows).zip(tt.chunks_exact(GEMM_TILE)) {
            orow[j0..j0 + n].copy_from_slice(&trow[..n]);
        }
    }
}
