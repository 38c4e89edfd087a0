//! A block-quantized weight format as a type: [`BlockFormat`], one
//! implementation per format (one file each: `q8_0.rs`, `q4_0.rs`, `q4_1.rs`,
//! `q5_0.rs`, `q5_1.rs`, `q2_k.rs`, `q3_k.rs`, `q4_k.rs`, `q5_k.rs`, `q6_k.rs`,
//! `iq4_nl.rs`, `iq4_xs.rs`), and the format-generic pieces built on it (row quantize and
//! dequantize, the portable fixed-order dot product, the bounds checks of the
//! tiled drivers).
//!
//! A format states its block (elements, bytes), codes and decodes a block, and
//! adds one block's part of a dot product with an activation row quantized to
//! int8 blocks of 32 (`quant_dot::quantize_row`) to sixteen f32 lane
//! accumulators in its fixed order. Its [`rows`](BlockFormat::rows) computes a
//! tile of outputs at the current vector level: the default is the portable
//! loop over `dot_block`; a format with vector kernels (`quant_dot`,
//! `quant_k`) overrides it, and those kernels perform exactly the operations of
//! its `dot_block` in the same order, so every path gives the same bits.

use std::ops::Range;

use super::quant_dot::{Acts, LANES, QK, f16_to_f32};
use crate::kernels::reduce::fold_lanes;

pub(crate) mod iq4_nl;
pub(crate) mod iq4_xs;
pub(crate) mod q2_k;
pub(crate) mod q3_k;
pub(crate) mod q4_0;
pub(crate) mod q4_1;
pub(crate) mod q4_k;
pub(crate) mod q5_0;
pub(crate) mod q5_1;
pub(crate) mod q5_k;
pub(crate) mod q6_k;
pub(crate) mod q8_0;

pub(crate) use iq4_nl::IQ4_NL;
pub(crate) use iq4_xs::IQ4_XS;
pub(crate) use q2_k::Q2_K;
pub(crate) use q3_k::Q3_K;
pub(crate) use q4_0::Q4_0;
pub(crate) use q4_1::Q4_1;
pub(crate) use q4_k::Q4_K;
pub(crate) use q5_0::Q5_0;
pub(crate) use q5_1::Q5_1;
pub(crate) use q5_k::Q5_K;
pub(crate) use q6_k::Q6_K;
pub(crate) use q8_0::Q8_0;

/// Lane accumulators of a dot product: eight lanes of four elements, twice
/// (formats with [`PAIRED_LANES`](BlockFormat::PAIRED_LANES) put their even
/// and odd sub-blocks of 32 in the two sets).
pub(crate) type LaneAcc = [f32; 2 * LANES];

/// A block-quantized weight format in llama.cpp's layout.
pub(crate) trait BlockFormat: Sized {
    /// Weights per block (a multiple of 32).
    const ELEMS: usize;
    /// Bytes per block.
    const BYTES: usize;
    /// The offset its vector kernels need in [`Acts::bias`]: each lane's bias
    /// is `-ACT_OFFSET · Σ x` over the lane (the weight read unsigned as
    /// `w + ACT_OFFSET`).
    const ACT_OFFSET: i32;
    /// Whether the dot product needs each activation block's sum `Σ x̂` (a
    /// format whose values carry a min or an offset term).
    const NEEDS_SUMS: bool;
    /// Whether the lanes run in two sets of eight (even and odd sub-blocks),
    /// added together before the final fold; otherwise one set of eight.
    const PAIRED_LANES: bool;

    /// Codes the `ELEMS` values `x` into one block `blk` (`BYTES` long).
    fn quantize(x: &[f32], blk: &mut [u8]);

    /// Decodes one block `blk` into `ELEMS` values `out`.
    fn dequantize(blk: &[u8], out: &mut [f32]);

    /// Adds block `blk`'s part of the fixed-order dot product to `acc`:
    /// `xq` the block's `ELEMS` quantized activations, `xs` their `ELEMS / 32`
    /// scales, `sums` their block sums (empty unless
    /// [`NEEDS_SUMS`](Self::NEEDS_SUMS)).
    fn dot_block(blk: &[u8], xq: &[i8], xs: &[f32], sums: &[f32], acc: &mut LaneAcc);

    /// The outputs of weight rows `rows` for all `m` activation rows
    /// (`out_t[(j - rows.start) * m + i]`), at the current vector level. The
    /// default is [`portable_rows`] compiled for the current level
    /// (`vectorized!`: the same operations, integer sums and fused
    /// multiply-adds, so the same bits). Called only after [`check_rows`]
    /// passed for the same arguments.
    #[allow(clippy::too_many_arguments)]
    fn rows(
        w: &[u8],
        row_bytes: usize,
        rows: Range<usize>,
        acts: &Acts<'_>,
        sums: &[f32],
        m: usize,
        out_t: &mut [f32],
    ) {
        super::simd::vectorized!(portable_rows::<Self>(
            w, row_bytes, rows, acts, sums, m, out_t
        ));
    }
}

/// Quantizes one row `x` (a multiple of `F::ELEMS` long) into its blocks `out`.
pub(crate) fn quantize_row<F: BlockFormat>(x: &[f32], out: &mut [u8]) {
    for (xb, blk) in x.chunks_exact(F::ELEMS).zip(out.chunks_exact_mut(F::BYTES)) {
        F::quantize(xb, blk);
    }
}

/// Dequantizes one row of blocks `blocks` into `out`.
pub(crate) fn dequantize_row<F: BlockFormat>(blocks: &[u8], out: &mut [f32]) {
    for (blk, ob) in blocks
        .chunks_exact(F::BYTES)
        .zip(out.chunks_exact_mut(F::ELEMS))
    {
        F::dequantize(blk, ob);
    }
}

/// The end of the fixed order: the lanes folded in halves (the two sets of
/// eight added first for paired lanes).
#[inline(always)]
fn finish<F: BlockFormat>(acc: LaneAcc) -> f32 {
    if F::PAIRED_LANES {
        fold_lanes(acc)
    } else {
        let mut lo = [0.0f32; LANES];
        lo.copy_from_slice(&acc[..LANES]);
        fold_lanes(lo)
    }
}

/// The portable [`BlockFormat::rows`]: for every (weight row, activation row)
/// pair, [`BlockFormat::dot_block`] block after block, then the lanes folded
/// (the two sets added first for paired lanes).
#[inline(always)]
pub(crate) fn portable_rows<F: BlockFormat>(
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &Acts<'_>,
    sums: &[f32],
    m: usize,
    out_t: &mut [f32],
) {
    // Up to four activation rows at a time, block by block, so that each
    // weight block is read (and its codes decoded) while it is in L1 for all
    // of them; each output keeps its own accumulators in the fixed order.
    const T: usize = 4;
    let nb = acts.cols / QK;
    let sub = F::ELEMS / QK;
    for (jj, j) in rows.enumerate() {
        let wrow = &w[j * row_bytes..(j + 1) * row_bytes];
        for i0 in (0..m).step_by(T) {
            let tt = T.min(m - i0);
            let mut acc = [[0.0f32; 2 * LANES]; T];
            for (b, blk) in wrow.chunks_exact(F::BYTES).enumerate() {
                for (t, acc) in acc.iter_mut().enumerate().take(tt) {
                    let i = i0 + t;
                    let bs = i * nb + b * sub;
                    let s = if F::NEEDS_SUMS {
                        &sums[bs..bs + sub]
                    } else {
                        &[][..]
                    };
                    let xq = &acts.q[i * acts.cols + b * F::ELEMS..][..F::ELEMS];
                    F::dot_block(blk, xq, &acts.scale[bs..bs + sub], s, acc);
                }
            }
            for (t, acc) in acc.into_iter().enumerate().take(tt) {
                out_t[jj * m + i0 + t] = finish::<F>(acc);
            }
        }
    }
}

/// [`BlockFormat::rows`] of a block-of-32 format with vector kernels in
/// `quant_dot`: those kernels at a vector level, or where it has none
/// [`portable_rows`] compiled for it (the same bits either way).
#[inline(always)]
pub(crate) fn block32_rows<F: super::quant_dot::Block32>(
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &Acts<'_>,
    sums: &[f32],
    m: usize,
    out_t: &mut [f32],
) {
    if !super::quant_dot::simd_rows::<F>(w, row_bytes, rows.clone(), acts, sums, m, out_t) {
        super::simd::vectorized!(portable_rows::<F>(w, row_bytes, rows, acts, sums, m, out_t));
    }
}

/// Checks the operands of [`BlockFormat::rows`] (the bounds contract of every
/// path), then runs it.
///
/// # Panics
/// If `w`, `acts`, `sums` or `out_t` are too short for `rows` and `m`, or
/// `row_bytes` is not a whole number of blocks of `acts.cols` columns (caller
/// bugs).
#[allow(clippy::too_many_arguments)]
pub(crate) fn quant_rows<F: BlockFormat>(
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &Acts<'_>,
    sums: &[f32],
    m: usize,
    out_t: &mut [f32],
) {
    check_rows::<F>(w, row_bytes, &rows, acts, sums, m, out_t);
    F::rows(w, row_bytes, rows, acts, sums, m, out_t);
}

/// The bounds [`quant_rows`] checks.
#[allow(clippy::too_many_arguments)]
fn check_rows<F: BlockFormat>(
    w: &[u8],
    row_bytes: usize,
    rows: &Range<usize>,
    acts: &Acts<'_>,
    sums: &[f32],
    m: usize,
    out_t: &[f32],
) {
    let nb = acts.cols / QK;
    assert!(acts.cols.is_multiple_of(F::ELEMS), "quant_rows: columns");
    assert_eq!(
        row_bytes,
        acts.cols / F::ELEMS * F::BYTES,
        "quant_rows: row bytes"
    );
    assert!(rows.end * row_bytes <= w.len(), "quant_rows: weight rows");
    assert!(
        acts.q.len() >= m * acts.cols,
        "quant_rows: activation values"
    );
    assert!(acts.scale.len() >= m * nb, "quant_rows: activation scales");
    assert!(
        acts.bias.len() >= m * nb * LANES,
        "quant_rows: activation biases"
    );
    if F::NEEDS_SUMS {
        assert!(sums.len() >= m * nb, "quant_rows: activation sums");
    }
    assert!(out_t.len() >= rows.len() * m, "quant_rows: output");
}

/// The f16 at `p[0..2]`, widened (exact).
#[inline(always)]
pub(crate) fn f16_at(p: &[u8]) -> f32 {
    f16_to_f32(u16::from_le_bytes([p[0], p[1]]))
}

/// `v` as f16 bytes (round to nearest even).
pub(crate) fn f16_bytes(v: f32) -> [u8; 2] {
    fucina_storage::half::f16::from_f32(v)
        .to_bits()
        .to_le_bytes()
}

/// The f32 value of `v` after a round trip through f16 (what a reader sees).
pub(crate) fn via_f16(v: f32) -> f32 {
    fucina_storage::half::f16::from_f32(v).to_f32()
}

/// The eight exact integer lane sums of a block of 32 values `v` (the
/// weights' integer codes) with 32 quantized activations `x`:
/// `p[l] = Σ_{k = 4l..4l+4} v[k] · x[k]` (at most `4 · 128 · 127` in
/// magnitude, exact in i32). Fixed sizes, so the loop vectorizes.
#[inline(always)]
pub(crate) fn lane_sums(v: &[i8; 32], x: &[i8]) -> [i32; LANES] {
    let x: &[i8; 32] = x[..32].try_into().expect("a block of 32");
    let mut prod = [0i32; 32];
    for ((p, &a), &b) in prod.iter_mut().zip(v).zip(x) {
        *p = i32::from(a) * i32::from(b);
    }
    let mut out = [0i32; LANES];
    for (o, c) in out.iter_mut().zip(prod.chunks_exact(4)) {
        *o = c[0] + c[1] + c[2] + c[3];
    }
    out
}

/// `acc[l] = fma(s, p[l], acc[l])` for the eight lanes of `acc`.
#[inline(always)]
pub(crate) fn fma_lanes(s: f32, p: &[i32; LANES], acc: &mut [f32]) {
    for (a, &p) in acc.iter_mut().zip(p) {
        *a = s.mul_add(p as f32, *a);
    }
}

/// Unpacks 16 bytes of nibbles laid out as Q4_0's (element `k` in the low
/// nibble of byte `k`, element `k + 16` in its high nibble) into `v`.
#[inline(always)]
pub(crate) fn unpack_nibbles(qs: &[u8], v: &mut [i8; 32]) {
    let qs: &[u8; 16] = qs[..16].try_into().expect("16 nibble bytes");
    for k in 0..16 {
        v[k] = (qs[k] & 0x0f) as i8;
        v[k + 16] = (qs[k] >> 4) as i8;
    }
}

/// llama.cpp's reference coding of a block with a min (Q4_1, Q5_1) in codes
/// `0..=top`: `d = (max − min) / top` and `m = min` (f32; written as f16 into
/// `dm[0..4]`), each value's code `trunc((x − min) / d + 0.5)` (clamped)
/// with the f32 `d` and `min`, into `q`.
pub(crate) fn code_with_min(x: &[f32], top: u8, dm: &mut [u8], q: &mut [u8; 32]) {
    let (lo, hi) = x
        .iter()
        .fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let scale = (hi - lo) / f32::from(top);
    let id = if scale != 0.0 { 1.0 / scale } else { 0.0 };
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (((v - lo) * id + 0.5) as i8).clamp(0, top as i8) as u8;
    }
    dm[0..2].copy_from_slice(&f16_bytes(scale));
    dm[2..4].copy_from_slice(&f16_bytes(lo));
}

/// The min term of a block format with a per-block min `m` (Q4_1, Q5_1):
/// `acc[0] = fma(m · dx, S, acc[0])`, `S = Σ x̂` over the activation block.
#[inline(always)]
pub(crate) fn min_term(m: f32, dx: f32, sum: f32, acc: &mut LaneAcc) {
    acc[0] = (m * dx).mul_add(sum, acc[0]);
}

/// Rounds to the nearest integer, ties away from zero, saturating.
#[inline(always)]
pub(crate) fn nearest(v: f32) -> i32 {
    v.round() as i32
}

/// The signed value of largest magnitude in `x` (the first one on a tie; 0 for
/// an empty or all-zero `x`).
pub(crate) fn signed_amax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}
