//! The super-block ("K") formats Q4_K and Q6_K in llama.cpp's layouts: block
//! coding (quantize, dequantize) and their integer dot products with
//! activations quantized to int8 blocks of 32 (see `quant_dot`), read in place.
//!
//! # The layouts (256 weights per super-block, little-endian)
//! - **Q4_K** (144 bytes): f16 `d`, f16 `dmin`, 12 bytes holding eight 6-bit
//!   scales `sc[j]` and eight 6-bit mins `mn[j]` (one pair per sub-block of 32),
//!   then 128 bytes of nibbles. Bytes `0..4` carry `sc[0..4]` in their low six
//!   bits, bytes `4..8` `mn[0..4]`; sub-blocks 4..8 take their low four bits from
//!   bytes `8..12` (scale in the low nibble, min in the high one) and their top
//!   two bits from the spare top bits of bytes `0..4` (scales) and `4..8` (mins).
//!   The nibbles run in four 32-byte groups: group `c` holds sub-block `2c` in
//!   its low nibbles and sub-block `2c + 1` in its high nibbles, element `k` of
//!   the sub-block in byte `k`. Weight `k` of sub-block `j` is
//!   `(d · sc[j]) · q − dmin · mn[j]`.
//! - **Q6_K** (210 bytes): 128 bytes `ql` (low four bits), 64 bytes `qh` (high
//!   two bits), 16 signed scales (one per 16 weights), f16 `d`. Each half of 128
//!   weights uses 64 bytes of `ql` and 32 of `qh`; its four groups of 32 weights
//!   `g = 0..4` take the low (`g < 2`) or high (`g ≥ 2`) nibbles of
//!   `ql[32 · (g % 2)..][..32]` and bits `2g..2g + 2` of `qh[..32]`. Weight `e`
//!   is `(d · scales[e / 16]) · (q − 32)`.
//!
//! # The order of a dot product (the same bits on every path)
//! An activation block of 32 (scale `dx`, int8 values) meets one sub-block of
//! 32 weights. Its eight lanes of four give exact integer sums
//! `p[l] = Σ q · x` (Q4_K: the nibbles `0..=15`; Q6_K: `q − 32`). With the
//! f32 weight scale of the lane (`d · sc[j]` for Q4_K, `d · scales[i]` for the
//! lane's 16-weight group for Q6_K: both exact products) and
//! `s = (weight scale) · dx` (one rounding), sixteen lane accumulators take
//! `acc[8 · (j mod 2) + l] = fma(s, p[l], acc[8 · (j mod 2) + l])`: the even
//! sub-blocks `j` in lanes 0..8, the odd ones in lanes 8..16 (so that a 512-bit
//! vector holds a pair of sub-blocks), sub-block after sub-block in increasing
//! order. Q4_K then closes each super-block with its min term, lane `l < 8`
//! taking sub-block `l`'s: `acc[l] = fma(−t, S, acc[l])` with
//! `t = (dmin · mn[l]) · dx` and `S = Σ x` over that activation block (exact).
//! At the end `acc[l] += acc[l + 8]` for `l < 8`, and the eight lanes fold in
//! halves as in `quant_dot`. Every path (portable, AVX2
//! `vpmaddubsw`/`vpmaddwd`, AVX-512 VNNI `vpdpbusd`) performs exactly these
//! IEEE operations in this order.

use std::ops::Range;

use super::quant_dot::{self, Acts, LANES, QK, f16_to_f32};
use crate::kernels::reduce::fold_lanes as fold;

/// Weights per super-block.
pub(crate) const QK_K: usize = 256;
/// Bytes of a Q4_K super-block.
pub(crate) const Q4K_BYTES: usize = 144;
/// Bytes of a Q6_K super-block.
pub(crate) const Q6K_BYTES: usize = 210;
/// Sub-blocks of 32 per super-block.
const SUB: usize = QK_K / QK;

/// The eight 6-bit scales and eight 6-bit mins of a Q4_K super-block's
/// 12 packed bytes (see the module docs).
#[inline(always)]
pub(crate) fn q4k_scales(p: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (sc, mn) = q4k_scales_u64(p);
    (sc.to_le_bytes(), mn.to_le_bytes())
}

/// [`q4k_scales`] as two little-endian words of eight bytes, computed four
/// bytes at a time: a byte's top two bits (`>> 6`, masked to `0b11`, then
/// `<< 4`) never cross into its neighbour.
#[inline(always)]
pub(crate) fn q4k_scales_u64(p: &[u8]) -> (u64, u64) {
    let word = |i: usize| u32::from_le_bytes([p[i], p[i + 1], p[i + 2], p[i + 3]]);
    let (w0, w1, w2) = (word(0), word(4), word(8));
    let sc_lo = w0 & 0x3f3f_3f3f;
    let mn_lo = w1 & 0x3f3f_3f3f;
    let sc_hi = (w2 & 0x0f0f_0f0f) | (((w0 >> 6) & 0x0303_0303) << 4);
    let mn_hi = ((w2 >> 4) & 0x0f0f_0f0f) | (((w1 >> 6) & 0x0303_0303) << 4);
    (
        u64::from(sc_lo) | (u64::from(sc_hi) << 32),
        u64::from(mn_lo) | (u64::from(mn_hi) << 32),
    )
}

/// Packs eight 6-bit scales and mins into a Q4_K super-block's 12 bytes (the
/// inverse of [`q4k_scales`]).
fn pack_q4k_scales(sc: &[u8; 8], mn: &[u8; 8], p: &mut [u8]) {
    for j in 0..4 {
        p[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        p[j + 4] = (mn[j] & 63) | ((mn[j + 4] >> 4) << 6);
        p[j + 8] = (sc[j + 4] & 0x0f) | ((mn[j + 4] & 0x0f) << 4);
    }
}

/// The f16 at `p[0..2]`, widened.
#[inline(always)]
fn f16_at(p: &[u8]) -> f32 {
    f16_to_f32(u16::from_le_bytes([p[0], p[1]]))
}

/// `v` as f16 bytes (round to nearest even).
fn f16_bytes(v: f32) -> [u8; 2] {
    fucina_storage::half::f16::from_f32(v)
        .to_bits()
        .to_le_bytes()
}

/// The f32 value of `v` after a round trip through f16 (what a reader sees).
fn via_f16(v: f32) -> f32 {
    fucina_storage::half::f16::from_f32(v).to_f32()
}

/// Rounds to the nearest integer, ties away from zero, saturating.
#[inline(always)]
fn nearest(v: f32) -> i32 {
    v.round() as i32
}

/// The nibble of element `k` of Q4_K sub-block `j` (`qs` the 128 value bytes).
#[inline(always)]
fn q4k_value(qs: &[u8], j: usize, k: usize) -> u8 {
    let b = qs[32 * (j / 2) + k];
    if j.is_multiple_of(2) {
        b & 0x0f
    } else {
        b >> 4
    }
}

/// The unsigned 6-bit value (`q`, stored as `q − 32 + 32`) of weight `e` of a
/// Q6_K super-block.
#[inline(always)]
fn q6k_value(blk: &[u8], e: usize) -> u8 {
    let (half, w) = (e / 128, e % 128);
    let (g, l) = (w / 32, w % 32);
    let ql = blk[64 * half + 32 * (g % 2) + l];
    let qh = blk[128 + 32 * half + l];
    let lo = if g < 2 { ql & 0x0f } else { ql >> 4 };
    lo | (((qh >> (2 * g)) & 3) << 4)
}

/// Dequantizes one Q4_K super-block into 256 values:
/// `(d · sc[j]) · q − dmin · mn[j]` (the two products are exact, the
/// difference is one rounding).
pub(crate) fn dequantize_q4k(blk: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(&blk[0..]), f16_at(&blk[2..]));
    let (sc, mn) = q4k_scales(&blk[4..16]);
    let qs = &blk[16..Q4K_BYTES];
    for (j, o) in out.chunks_exact_mut(QK).enumerate().take(SUB) {
        let (dj, mj) = (d * f32::from(sc[j]), dmin * f32::from(mn[j]));
        for (k, o) in o.iter_mut().enumerate() {
            *o = dj * f32::from(q4k_value(qs, j, k)) - mj;
        }
    }
}

/// Dequantizes one Q6_K super-block into 256 values:
/// `(d · scales[e / 16]) · (q − 32)` (exact: at most 23 significant bits).
pub(crate) fn dequantize_q6k(blk: &[u8], out: &mut [f32]) {
    let d = f16_at(&blk[208..]);
    for (e, o) in out.iter_mut().enumerate().take(QK_K) {
        let sc = f32::from(blk[192 + e / 16] as i8);
        *o = (d * sc) * f32::from(i16::from(q6k_value(blk, e)) - 32);
    }
}

/// Quantizes 256 values into one Q4_K super-block (see
/// `src/ops/quant.rs`'s docs for the rule): per sub-block of 32, the range
/// `[min(0, min x), max x]` is split into 15 steps; the step sizes and the
/// mins are coded with 6 bits against the super-block's f16 `d = max step / 63`
/// and `dmin = max min / 63`; each value then takes the nibble nearest to it
/// under the coded (f16-rounded) scale and min.
pub(crate) fn quantize_q4k(x: &[f32], blk: &mut [u8]) {
    let (mut step, mut mins) = ([0.0f32; SUB], [0.0f32; SUB]);
    for (j, xs) in x.chunks_exact(QK).enumerate().take(SUB) {
        let lo = xs.iter().fold(0.0f32, |a, &v| a.min(v));
        let hi = xs.iter().fold(lo, |a, &v| a.max(v));
        step[j] = (hi - lo) / 15.0;
        mins[j] = -lo;
    }
    let max_step = step.iter().fold(0.0f32, |a, &v| a.max(v));
    let max_min = mins.iter().fold(0.0f32, |a, &v| a.max(v));
    let d = via_f16(max_step / 63.0);
    let dmin = via_f16(max_min / 63.0);
    let code = |v: f32, unit: f32| -> u8 {
        if unit > 0.0 {
            nearest(v / unit).clamp(0, 63) as u8
        } else {
            0
        }
    };
    let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
    for j in 0..SUB {
        sc[j] = code(step[j], d);
        mn[j] = code(mins[j], dmin);
    }
    blk[0..2].copy_from_slice(&f16_bytes(max_step / 63.0));
    blk[2..4].copy_from_slice(&f16_bytes(max_min / 63.0));
    pack_q4k_scales(&sc, &mn, &mut blk[4..16]);
    let qs = &mut blk[16..Q4K_BYTES];
    qs.fill(0);
    for (j, xs) in x.chunks_exact(QK).enumerate().take(SUB) {
        let dq = d * f32::from(sc[j]);
        let dm = dmin * f32::from(mn[j]);
        for (k, &v) in xs.iter().enumerate() {
            let n = if dq > 0.0 {
                nearest((v + dm) / dq).clamp(0, 15) as u8
            } else {
                0
            };
            qs[32 * (j / 2) + k] |= if j.is_multiple_of(2) { n } else { n << 4 };
        }
    }
}

/// Quantizes 256 values into one Q6_K super-block (see `src/ops/quant.rs`'s docs):
/// per group of 16, the scale `g = max / −32` (`max` the signed value of largest
/// magnitude); the group scales are coded as int8 against the super-block's f16
/// `d = G / −128` (`G` the group scale of largest magnitude); each value then
/// takes the 6-bit code nearest to it under its coded (f16-rounded) scale,
/// clamped to `−32..=31`.
pub(crate) fn quantize_q6k(x: &[f32], blk: &mut [u8]) {
    let mut gs = [0.0f32; 16];
    for (i, xs) in x.chunks_exact(16).enumerate().take(16) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in xs {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        gs[i] = max / -32.0;
    }
    let (mut gmax, mut gbig) = (0.0f32, 0.0f32);
    for &g in &gs {
        if gmax < g.abs() {
            gmax = g.abs();
            gbig = g;
        }
    }
    let d = via_f16(gbig / -128.0);
    blk.fill(0);
    blk[208..210].copy_from_slice(&f16_bytes(gbig / -128.0));
    let mut l = [32u8; QK_K];
    if d != 0.0 && d.is_finite() {
        for (i, xs) in x.chunks_exact(16).enumerate().take(16) {
            let sc = nearest(gs[i] / d).clamp(-128, 127);
            blk[192 + i] = sc as i8 as u8;
            let dq = d * sc as f32;
            if dq == 0.0 {
                continue;
            }
            for (k, &v) in xs.iter().enumerate() {
                l[16 * i + k] = (nearest(v / dq).clamp(-32, 31) + 32) as u8;
            }
        }
    }
    for half in 0..2 {
        for k in 0..32 {
            let e = |g: usize| l[128 * half + 32 * g + k];
            blk[64 * half + k] = (e(0) & 0x0f) | ((e(2) & 0x0f) << 4);
            blk[64 * half + 32 + k] = (e(1) & 0x0f) | ((e(3) & 0x0f) << 4);
            blk[128 + 32 * half + k] =
                (e(0) >> 4) | ((e(1) >> 4) << 2) | ((e(2) >> 4) << 4) | ((e(3) >> 4) << 6);
        }
    }
}

/// The activation offset a K format's kernels need in [`Acts::bias`]: Q6_K
/// values are read unsigned (`q`, not `q − 32`), so each lane starts from
/// `−32 · Σ x`; Q4_K nibbles are unsigned values already (no bias).
pub(crate) fn bias_offset(q6: bool) -> i32 {
    if q6 { 32 } else { 0 }
}

/// Quantizes the `m` activation rows of `x` for a K-format product: as
/// `quant_dot::quantize_row` (blocks of 32, f32 scale), with
/// [`bias_offset`], plus `sums[i * nb + b] = Σ x̂` over each block (exact, for
/// Q4_K's min term).
#[allow(clippy::too_many_arguments)]
pub(crate) fn quantize_acts(
    x: &[f32],
    m: usize,
    cols: usize,
    q6: bool,
    xq: &mut [i8],
    xs: &mut [f32],
    xb: &mut [i32],
    sums: &mut [f32],
) {
    let nb = cols / QK;
    for i in 0..m {
        let q = &mut xq[i * cols..(i + 1) * cols];
        quant_dot::quantize_row(
            &x[i * cols..(i + 1) * cols],
            bias_offset(q6),
            q,
            &mut xs[i * nb..(i + 1) * nb],
            &mut xb[i * nb * LANES..(i + 1) * nb * LANES],
        );
        for (s, qb) in sums[i * nb..(i + 1) * nb]
            .iter_mut()
            .zip(q.chunks_exact(QK))
        {
            *s = qb.iter().map(|&v| i32::from(v)).sum::<i32>() as f32;
        }
    }
}

/// The fixed-order dot product of one Q4_K weight row with one activation row
/// (the portable path; see the module docs).
fn dot_q4k(wrow: &[u8], xq: &[i8], xs: &[f32], sums: &[f32]) -> f32 {
    let mut acc = [0.0f32; 2 * LANES];
    for (sb, blk) in wrow.chunks_exact(Q4K_BYTES).enumerate() {
        let (d, dmin) = (f16_at(&blk[0..]), f16_at(&blk[2..]));
        let (sc, mn) = q4k_scales(&blk[4..16]);
        let qs = &blk[16..];
        for j in 0..SUB {
            let b = sb * SUB + j;
            let s = (d * f32::from(sc[j])) * xs[b];
            let xb = &xq[b * QK..(b + 1) * QK];
            let half = &mut acc[LANES * (j % 2)..][..LANES];
            for (l, a) in half.iter_mut().enumerate() {
                let p: i32 = (4 * l..4 * l + 4)
                    .map(|k| i32::from(q4k_value(qs, j, k)) * i32::from(xb[k]))
                    .sum();
                *a = s.mul_add(p as f32, *a);
            }
        }
        for (l, a) in acc[..LANES].iter_mut().enumerate() {
            let b = sb * SUB + l;
            let t = (dmin * f32::from(mn[l])) * xs[b];
            *a = (-t).mul_add(sums[b], *a);
        }
    }
    fold(acc)
}

/// The fixed-order dot product of one Q6_K weight row with one activation row
/// (the portable path; see the module docs).
fn dot_q6k(wrow: &[u8], xq: &[i8], xs: &[f32]) -> f32 {
    let mut acc = [0.0f32; 2 * LANES];
    for (sb, blk) in wrow.chunks_exact(Q6K_BYTES).enumerate() {
        let d = f16_at(&blk[208..]);
        for j in 0..SUB {
            let b = sb * SUB + j;
            let xb = &xq[b * QK..(b + 1) * QK];
            let half = &mut acc[LANES * (j % 2)..][..LANES];
            for (l, a) in half.iter_mut().enumerate() {
                let sc = f32::from(blk[192 + 2 * j + l / 4] as i8);
                let s = (d * sc) * xs[b];
                let p: i32 = (4 * l..4 * l + 4)
                    .map(|k| (i32::from(q6k_value(blk, 32 * j + k)) - 32) * i32::from(xb[k]))
                    .sum();
                *a = s.mul_add(p as f32, *a);
            }
        }
    }
    fold(acc)
}

/// Computes the outputs of weight rows `rows` for all `m` activation rows, as
/// `quant_dot::quant_rows` does, for Q6_K (`q6`) or Q4_K weights. `acts` and
/// `sums` come from [`quantize_acts`] with the same `q6`.
///
/// # Panics
/// If `w`, `acts`, `sums` or `out_t` are too short for `rows` and `m` (a
/// caller bug).
#[allow(clippy::too_many_arguments)]
pub(crate) fn quant_rows(
    q6: bool,
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &Acts<'_>,
    sums: &[f32],
    m: usize,
    out_t: &mut [f32],
) {
    let nb = acts.cols / QK;
    let bb = if q6 { Q6K_BYTES } else { Q4K_BYTES };
    assert!(acts.cols.is_multiple_of(QK_K), "quant_k: columns");
    assert_eq!(row_bytes, acts.cols / QK_K * bb, "quant_k: row bytes");
    assert!(rows.end * row_bytes <= w.len(), "quant_k: weight rows");
    assert!(acts.q.len() >= m * acts.cols, "quant_k: activation values");
    assert!(acts.scale.len() >= m * nb, "quant_k: activation scales");
    assert!(
        acts.bias.len() >= m * nb * LANES,
        "quant_k: activation biases"
    );
    assert!(sums.len() >= m * nb, "quant_k: activation sums");
    assert!(out_t.len() >= rows.len() * m, "quant_k: output");
    match quant_dot::path() {
        #[cfg(target_arch = "x86_64")]
        quant_dot::Path::Vnni => {
            // SAFETY: `path` returns Vnni only when the CPU has every feature
            // `x86::rows_vnni` enables; the asserts above are its bounds contract.
            unsafe {
                if q6 {
                    x86::rows_vnni::<true>(w, row_bytes, rows, acts, sums, m, out_t)
                } else {
                    x86::rows_vnni::<false>(w, row_bytes, rows, acts, sums, m, out_t)
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        quant_dot::Path::Avx2 => {
            // SAFETY: `path` returns Avx2 only when the CPU has AVX2, FMA and
            // F16C; the asserts above are `x86::rows_avx2`'s bounds contract.
            unsafe {
                if q6 {
                    x86::rows_avx2::<true>(w, row_bytes, rows, acts, sums, m, out_t)
                } else {
                    x86::rows_avx2::<false>(w, row_bytes, rows, acts, sums, m, out_t)
                }
            }
        }
        _ => {
            for (jj, j) in rows.enumerate() {
                let wrow = &w[j * row_bytes..(j + 1) * row_bytes];
                for i in 0..m {
                    let xq = &acts.q[i * acts.cols..(i + 1) * acts.cols];
                    let xs = &acts.scale[i * nb..(i + 1) * nb];
                    out_t[jj * m + i] = if q6 {
                        dot_q6k(wrow, xq, xs)
                    } else {
                        dot_q4k(wrow, xq, xs, &sums[i * nb..(i + 1) * nb])
                    };
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The x86-64 kernels: tiles of `R` weight rows × `M` activation rows; each
    //! sub-block's weights are unpacked once for the `M` rows and each
    //! activation block loaded once for the `R` rows, in the fixed order of the
    //! module docs. AVX2 keeps the even and odd sub-blocks' lanes in two 8-lane
    //! accumulators per output; AVX-512 keeps them in the two halves of one
    //! 16-lane accumulator and takes a pair of sub-blocks per instruction.

    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::{Acts, LANES, Q4K_BYTES, Q6K_BYTES, QK, QK_K, SUB};

    /// Weight rows per tile.
    const R_TILE: usize = 4;
    /// How far ahead of the super-block being read the weights are prefetched.
    const PREFETCH_BYTES: usize = 768;

    /// Runs `$tile::<Q6, R, M>` over `rows` × `0..m` in tiles, writing `out_t`
    /// as `super::quant_rows` does.
    macro_rules! drive {
        ($tile:ident, $mt:expr, $q6:ident, $w:ident, $row_bytes:ident, $rows:ident, $acts:ident, $sums:ident, $m:ident, $out_t:ident) => {{
            let start = $rows.start;
            let mut j = $rows.start;
            while j < $rows.end {
                let r = if $rows.end - j >= R_TILE { R_TILE } else { 1 };
                let mut i = 0;
                while i < $m {
                    let mm = ($m - i).min($mt);
                    macro_rules! run {
                        ($r:literal, $mm:literal) => {{
                            let res = $tile::<$q6, $r, $mm>($w, $row_bytes, j, $acts, $sums, i);
                            for (rr, row) in res.iter().enumerate() {
                                let o = (j - start + rr) * $m + i;
                                $out_t[o..o + $mm].copy_from_slice(row);
                            }
                        }};
                    }
                    match (r, mm) {
                        (R_TILE, 1) => run!(4, 1),
                        (R_TILE, 2) => run!(4, 2),
                        (R_TILE, 3) => run!(4, 3),
                        (R_TILE, _) => run!(4, 4),
                        (_, 1) => run!(1, 1),
                        (_, 2) => run!(1, 2),
                        (_, 3) => run!(1, 3),
                        (_, _) => run!(1, 4),
                    }
                    i += mm;
                }
                j += r;
            }
        }};
    }

    /// The AVX2 kernel over `rows` (see `super::quant_rows`).
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; the slices must satisfy
    /// `quant_rows`'s asserted bounds.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn rows_avx2<const Q6: bool>(
        w: &[u8],
        row_bytes: usize,
        rows: Range<usize>,
        acts: &Acts<'_>,
        sums: &[f32],
        m: usize,
        out_t: &mut [f32],
    ) {
        // One activation row per tile: 2 · 4 accumulators fit the 16 registers.
        drive!(tile_avx2, 1, Q6, w, row_bytes, rows, acts, sums, m, out_t)
    }

    /// The AVX-512 VNNI kernel over `rows` (see `super::quant_rows`).
    ///
    /// # Safety
    /// The CPU must have AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; the slices
    /// must satisfy `quant_rows`'s asserted bounds.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn rows_vnni<const Q6: bool>(
        w: &[u8],
        row_bytes: usize,
        rows: Range<usize>,
        acts: &Acts<'_>,
        sums: &[f32],
        m: usize,
        out_t: &mut [f32],
    ) {
        drive!(tile_vnni, 4, Q6, w, row_bytes, rows, acts, sums, m, out_t)
    }

    /// Checks a tile's reads against the slices (once per tile).
    #[inline(always)]
    fn check_tile<const R: usize, const M: usize>(
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
        assert!((i0 + M) * nb <= sums.len(), "quant_k tile: sums");
    }

    /// The eight lanes folded in halves (l + 4, l + 2, l + 1).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn fold(v: __m256) -> f32 {
        let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let q = _mm_add_ps(h, _mm_movehl_ps(h, h));
        _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps::<0b01>(q, q)))
    }

    /// The two f16 values at `p` (`d`, `dmin` of a Q4_K super-block; the
    /// second is meaningless for Q6_K), widened.
    ///
    /// # Safety
    /// `p` must be valid for reading four bytes.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn f16_pair(p: *const u8) -> (f32, f32) {
        // SAFETY: four readable bytes (the caller's contract).
        let v = _mm_cvtph_ps(_mm_cvtsi32_si128(unsafe {
            p.cast::<i32>().read_unaligned()
        }));
        (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
    }

    /// The eight bytes of `v` widened to eight f32.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn u8x8_to_f32(v: u64) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v as i64)))
    }

    /// Outputs of weight rows `j0..j0 + R` × activation rows `i0..i0 + M` with
    /// `vpmaddubsw` + `vpmaddwd` (pair sums at most `2 · 63 · 127`, never
    /// saturating), the even and odd sub-blocks in two accumulators.
    // The tile's parallel arrays (accumulators, activations, weights) are
    // indexed by row numbers.
    #[allow(clippy::needless_range_loop)]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn tile_avx2<const Q6: bool, const R: usize, const M: usize>(
        w: &[u8],
        row_bytes: usize,
        j0: usize,
        acts: &Acts<'_>,
        sums: &[f32],
        i0: usize,
    ) -> [[f32; M]; R] {
        check_tile::<R, M>(w, row_bytes, j0, acts, sums, i0);
        let nb = acts.cols / QK;
        let nsb = acts.cols / QK_K;
        let bb = if Q6 { Q6K_BYTES } else { Q4K_BYTES };
        let low4 = _mm256_set1_epi8(0x0f);
        let hi2 = _mm256_set1_epi8(0x30);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[[_mm256_setzero_ps(); 2]; M]; R];
        for sb in 0..nsb {
            // Per weight row: the exact f32 scales d · sc of the super-block
            // (Q4_K: sub-block j in lane j; Q6_K: group g in lane g % 8 of
            // vector g / 8), and for Q4_K the mins dmin · mn.
            let mut ds = [[_mm256_setzero_ps(); 2]; R];
            let mut dm = [_mm256_setzero_ps(); R];
            let mut blks = [std::ptr::null::<u8>(); R];
            for r in 0..R {
                // SAFETY: check_tile: row j0 + r is inside `w`, and super-block
                // sb of it spans bb bytes from `blk`.
                let blk = unsafe { w.as_ptr().add((j0 + r) * row_bytes + sb * bb) };
                blks[r] = blk;
                // A prefetch never faults; the addresses are computed with
                // wrapping arithmetic, never dereferenced.
                for l in 0..4 {
                    _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(PREFETCH_BYTES + 64 * l).cast());
                }
                if Q6 {
                    // SAFETY: bytes 192..210 of the super-block.
                    let (d, sc) = unsafe {
                        (
                            f16_pair(blk.add(206)).1,
                            _mm_loadu_si128(blk.add(192).cast()),
                        )
                    };
                    let dv = _mm256_set1_ps(d);
                    ds[r][0] = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
                    ds[r][1] = _mm256_mul_ps(
                        dv,
                        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(sc))),
                    );
                } else {
                    // SAFETY: bytes 0..16 of the super-block.
                    let (head, (d, dmin)) =
                        unsafe { (std::slice::from_raw_parts(blk, 16), f16_pair(blk)) };
                    let (sc, mn) = super::q4k_scales_u64(&head[4..16]);
                    ds[r][0] = _mm256_mul_ps(_mm256_set1_ps(d), u8x8_to_f32(sc));
                    dm[r] = _mm256_mul_ps(_mm256_set1_ps(dmin), u8x8_to_f32(mn));
                }
            }
            for j in 0..SUB {
                let b = sb * SUB + j;
                let mut xv = [_mm256_setzero_si256(); M];
                let mut xb = [_mm256_setzero_si256(); M];
                let mut dx = [_mm256_setzero_ps(); M];
                for i in 0..M {
                    let row = i0 + i;
                    // SAFETY: check_tile: row < i0 + M, so the 32 values at
                    // row * cols + 32 b and the 8 biases at (row * nb + b) * 8
                    // are in bounds.
                    unsafe {
                        xv[i] = _mm256_loadu_si256(
                            acts.q.as_ptr().add(row * acts.cols + b * QK).cast(),
                        );
                        if Q6 {
                            xb[i] = _mm256_loadu_si256(
                                acts.bias.as_ptr().add((row * nb + b) * LANES).cast(),
                            );
                        }
                    }
                    dx[i] = _mm256_set1_ps(acts.scale[row * nb + b]);
                }
                for r in 0..R {
                    let blk = blks[r];
                    let (wv, wsc) = if Q6 {
                        let (half, g) = (j / 4, j % 4);
                        // SAFETY: ql bytes 64 half + 32 (g % 2) .. +32 and qh
                        // bytes 128 + 32 half .. +32 are inside the super-block.
                        let (ql, qh) = unsafe {
                            (
                                _mm256_loadu_si256(blk.add(64 * half + 32 * (g % 2)).cast()),
                                _mm256_loadu_si256(blk.add(128 + 32 * half).cast()),
                            )
                        };
                        let lo = if g < 2 {
                            _mm256_and_si256(ql, low4)
                        } else {
                            _mm256_and_si256(_mm256_srli_epi16::<4>(ql), low4)
                        };
                        // bits 2g, 2g + 1 of each qh byte to bits 4, 5
                        let hi = match g {
                            0 => _mm256_slli_epi16::<4>(qh),
                            1 => _mm256_slli_epi16::<2>(qh),
                            2 => qh,
                            _ => _mm256_srli_epi16::<2>(qh),
                        };
                        let wv = _mm256_or_si256(lo, _mm256_and_si256(hi, hi2));
                        // lanes 0..4: group 2j, lanes 4..8: group 2j + 1
                        let k = (2 * j % 8) as i32;
                        let idx = _mm256_setr_epi32(k, k, k, k, k + 1, k + 1, k + 1, k + 1);
                        (wv, _mm256_permutevar8x32_ps(ds[r][j / 4], idx))
                    } else {
                        // SAFETY: value bytes 16 + 32 (j / 2) .. +32 are inside
                        // the super-block.
                        let v = unsafe { _mm256_loadu_si256(blk.add(16 + 32 * (j / 2)).cast()) };
                        let wv = if j.is_multiple_of(2) {
                            _mm256_and_si256(v, low4)
                        } else {
                            _mm256_and_si256(_mm256_srli_epi16::<4>(v), low4)
                        };
                        (
                            wv,
                            _mm256_permutevar8x32_ps(ds[r][0], _mm256_set1_epi32(j as i32)),
                        )
                    };
                    for i in 0..M {
                        let pairs = _mm256_maddubs_epi16(wv, xv[i]);
                        let p = _mm256_madd_epi16(pairs, ones);
                        let p = if Q6 { _mm256_add_epi32(p, xb[i]) } else { p };
                        let s = _mm256_mul_ps(wsc, dx[i]);
                        let a = &mut acc[r][i][j % 2];
                        *a = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(p), *a);
                    }
                }
            }
            if !Q6 {
                // The min term: lane l of the even accumulator takes sub-block l's.
                for i in 0..M {
                    let o = (i0 + i) * nb + sb * SUB;
                    // SAFETY: check_tile: the 8 scales and sums of super-block
                    // sb of row i0 + i are in bounds.
                    let (dxv, sv) = unsafe {
                        (
                            _mm256_loadu_ps(acts.scale.as_ptr().add(o)),
                            _mm256_loadu_ps(sums.as_ptr().add(o)),
                        )
                    };
                    for r in 0..R {
                        let t = _mm256_mul_ps(dm[r], dxv);
                        acc[r][i][0] = _mm256_fnmadd_ps(t, sv, acc[r][i][0]);
                    }
                }
            }
        }
        let mut out = [[0.0f32; M]; R];
        for (o, a) in out.iter_mut().zip(&acc) {
            for (o, a) in o.iter_mut().zip(a) {
                *o = fold(_mm256_add_ps(a[0], a[1]));
            }
        }
        out
    }

    /// Outputs of weight rows `j0..j0 + R` × activation rows `i0..i0 + M` with
    /// 512-bit `vpdpbusd`: a pair of sub-blocks (`2c`, `2c + 1`) per
    /// instruction, the even one in lanes 0..8 and the odd one in lanes 8..16,
    /// each lane's sum starting from its bias (zero for Q4_K).
    // As in tile_avx2.
    #[allow(clippy::needless_range_loop)]
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn tile_vnni<const Q6: bool, const R: usize, const M: usize>(
        w: &[u8],
        row_bytes: usize,
        j0: usize,
        acts: &Acts<'_>,
        sums: &[f32],
        i0: usize,
    ) -> [[f32; M]; R] {
        check_tile::<R, M>(w, row_bytes, j0, acts, sums, i0);
        let nb = acts.cols / QK;
        let nsb = acts.cols / QK_K;
        let bb = if Q6 { Q6K_BYTES } else { Q4K_BYTES };
        let low4 = _mm512_set1_epi8(0x0f);
        let hi2 = _mm512_set1_epi8(0x30);
        // the upper 256 bits of a Q4_K pair are the high nibbles
        let nib_shift = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
        // Q6_K high bits to bits 4, 5: groups 0, 1 (<< 4, << 2), groups 2, 3
        // (as they are, >> 2)
        let q6_shl = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2);
        let q6_shr = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
        let pair_dx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        let mut acc = [[_mm512_setzero_ps(); M]; R];
        for sb in 0..nsb {
            // Per weight row: the exact f32 scales d · sc (Q4_K: sub-block j in
            // lane j; Q6_K: group g in lane g), and for Q4_K the mins dmin · mn.
            let mut ds = [_mm512_setzero_ps(); R];
            let mut dm = [_mm512_setzero_ps(); R];
            let mut blks = [std::ptr::null::<u8>(); R];
            for r in 0..R {
                // SAFETY: check_tile: row j0 + r is inside `w`, and super-block
                // sb of it spans bb bytes from `blk`.
                let blk = unsafe { w.as_ptr().add((j0 + r) * row_bytes + sb * bb) };
                blks[r] = blk;
                // A prefetch never faults; the addresses are computed with
                // wrapping arithmetic, never dereferenced.
                for l in 0..4 {
                    _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(PREFETCH_BYTES + 64 * l).cast());
                }
                if Q6 {
                    // SAFETY: bytes 192..210 of the super-block.
                    let (d, sc) = unsafe {
                        (
                            f16_pair(blk.add(206)).1,
                            _mm_loadu_si128(blk.add(192).cast()),
                        )
                    };
                    ds[r] = _mm512_mul_ps(
                        _mm512_set1_ps(d),
                        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)),
                    );
                } else {
                    // SAFETY: bytes 0..16 of the super-block.
                    let (head, (d, dmin)) =
                        unsafe { (std::slice::from_raw_parts(blk, 16), f16_pair(blk)) };
                    let (sc, mn) = super::q4k_scales_u64(&head[4..16]);
                    ds[r] =
                        _mm512_zextps256_ps512(_mm256_mul_ps(_mm256_set1_ps(d), u8x8_to_f32(sc)));
                    dm[r] = _mm512_zextps256_ps512(_mm256_mul_ps(
                        _mm256_set1_ps(dmin),
                        u8x8_to_f32(mn),
                    ));
                }
            }
            for c in 0..SUB / 2 {
                let b = sb * SUB + 2 * c;
                let mut xv = [_mm512_setzero_si512(); M];
                let mut xb = [_mm512_setzero_si512(); M];
                let mut dx = [_mm512_setzero_ps(); M];
                for i in 0..M {
                    let row = i0 + i;
                    // SAFETY: check_tile: row < i0 + M, so the 64 values at
                    // row * cols + 32 b, the 16 biases at (row * nb + b) * 8 and
                    // the two scales at row * nb + b are in bounds (b + 1 < nb).
                    unsafe {
                        xv[i] = _mm512_loadu_si512(
                            acts.q.as_ptr().add(row * acts.cols + b * QK).cast(),
                        );
                        if Q6 {
                            xb[i] = _mm512_loadu_si512(
                                acts.bias.as_ptr().add((row * nb + b) * LANES).cast(),
                            );
                        }
                        let two = _mm_castpd_ps(_mm_load_sd(
                            acts.scale.as_ptr().add(row * nb + b).cast(),
                        ));
                        dx[i] = _mm512_permutexvar_ps(pair_dx, _mm512_castps128_ps512(two));
                    }
                }
                for r in 0..R {
                    let blk = blks[r];
                    let (wv, wsc) = if Q6 {
                        let (half, p) = (c / 2, c % 2);
                        // SAFETY: ql bytes 64 half .. +64 and qh bytes
                        // 128 + 32 half .. +32 are inside the super-block.
                        let (ql, qh) = unsafe {
                            (
                                _mm512_loadu_si512(blk.add(64 * half).cast()),
                                _mm512_broadcast_i64x4(_mm256_loadu_si256(
                                    blk.add(128 + 32 * half).cast(),
                                )),
                            )
                        };
                        let (lo, hi) = if p == 0 {
                            (_mm512_and_si512(ql, low4), _mm512_sllv_epi64(qh, q6_shl))
                        } else {
                            (
                                _mm512_and_si512(_mm512_srli_epi16::<4>(ql), low4),
                                _mm512_srlv_epi64(qh, q6_shr),
                            )
                        };
                        let wv = _mm512_or_si512(lo, _mm512_and_si512(hi, hi2));
                        // lanes 4k..4k + 4: group 4c + k
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
                        (wv, _mm512_permutexvar_ps(idx, ds[r]))
                    } else {
                        // SAFETY: value bytes 16 + 32 c .. +32 are inside the
                        // super-block.
                        let v = unsafe { _mm256_loadu_si256(blk.add(16 + 32 * c).cast()) };
                        let both = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(v), v);
                        let wv = _mm512_and_si512(_mm512_srlv_epi64(both, nib_shift), low4);
                        let k = 2 * c as i32;
                        let idx = _mm512_setr_epi32(
                            k,
                            k,
                            k,
                            k,
                            k,
                            k,
                            k,
                            k,
                            k + 1,
                            k + 1,
                            k + 1,
                            k + 1,
                            k + 1,
                            k + 1,
                            k + 1,
                            k + 1,
                        );
                        (wv, _mm512_permutexvar_ps(idx, ds[r]))
                    };
                    for i in 0..M {
                        let p = _mm512_dpbusd_epi32(xb[i], wv, xv[i]);
                        let s = _mm512_mul_ps(wsc, dx[i]);
                        acc[r][i] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(p), acc[r][i]);
                    }
                }
            }
            if !Q6 {
                // The min term: lane l < 8 takes sub-block l's.
                for i in 0..M {
                    let o = (i0 + i) * nb + sb * SUB;
                    // SAFETY: check_tile: the 8 scales and sums of super-block
                    // sb of row i0 + i are in bounds.
                    let (dxv, sv) = unsafe {
                        (
                            _mm512_zextps256_ps512(_mm256_loadu_ps(acts.scale.as_ptr().add(o))),
                            _mm512_zextps256_ps512(_mm256_loadu_ps(sums.as_ptr().add(o))),
                        )
                    };
                    for r in 0..R {
                        let t = _mm512_mul_ps(dm[r], dxv);
                        acc[r][i] = _mm512_mask3_fnmadd_ps(t, sv, acc[r][i], 0x00ff);
                    }
                }
            }
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
}
