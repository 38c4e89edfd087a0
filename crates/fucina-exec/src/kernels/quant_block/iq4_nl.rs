//! IQ4_NL: blocks of 32 4-bit indices into a fixed non-linear table of 16
//! int8 values, under an f16 scale (18 bytes: `d`, then 16 bytes of nibbles
//! laid out as Q4_0's); value `k` is `d · KVALUES[n[k]]`.

use std::ops::Range;

use super::{
    BlockFormat, LaneAcc, block32_rows, f16_at, f16_bytes, fma_lanes, lane_sums, signed_amax,
    unpack_nibbles, via_f16,
};
use crate::kernels::quant_dot::{Acts, Block32, LANES, Shape};

/// llama.cpp's IQ4_NL (ggml type 20).
#[allow(non_camel_case_types)]
pub(crate) struct IQ4_NL;

/// The values the 4-bit indices of IQ4_NL and IQ4_XS select (llama.cpp's
/// `kvalues_iq4nl`).
pub(crate) const KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The index of element `k` (`qs` the 16 nibble bytes).
#[inline(always)]
pub(crate) fn index(qs: &[u8], k: usize) -> usize {
    let byte = qs[k % 16];
    usize::from(if k < 16 { byte & 0x0f } else { byte >> 4 })
}

/// The index whose value under the scale `d` is nearest to `x` (the lowest
/// on a tie; index 8, the value nearest 0, where `d` is 0 or not finite).
pub(crate) fn nearest_index(x: f32, d: f32) -> u8 {
    if d == 0.0 || !d.is_finite() {
        return 8;
    }
    let mut best = (f32::INFINITY, 8u8);
    for (i, &v) in KVALUES.iter().enumerate() {
        let e = (f32::from(v) * d - x).abs();
        if e < best.0 {
            best = (e, i as u8);
        }
    }
    best.1
}

/// Codes the 32 values `x` into 16 nibble bytes `qs` under the scale `d`.
pub(crate) fn code_indices(x: &[f32], d: f32, qs: &mut [u8]) {
    for k in 0..16 {
        qs[k] = nearest_index(x[k], d) | (nearest_index(x[k + 16], d) << 4);
    }
}

/// The eight lanes of one block of 32: `acc[l] = fma(s, Σ_{4 l..4 l + 4}
/// KVALUES[n] · x̂, acc[l])` (the shared dot of IQ4_NL and IQ4_XS).
#[inline(always)]
pub(crate) fn dot_indices(qs: &[u8], xq: &[i8], s: f32, acc: &mut [f32]) {
    let mut v = [0i8; 32];
    unpack_nibbles(qs, &mut v);
    for v in v.iter_mut() {
        *v = KVALUES[*v as usize];
    }
    fma_lanes(s, &lane_sums(&v, xq), acc);
}

impl BlockFormat for IQ4_NL {
    const ELEMS: usize = 32;
    const BYTES: usize = 18;
    // the table values are signed int8, read unsigned as `v + 128`
    const ACT_OFFSET: i32 = 128;
    const NEEDS_SUMS: bool = false;
    const PAIRED_LANES: bool = false;

    /// `d = max / −127` (`max` the signed value of largest magnitude, so it
    /// takes the table's −127 exactly; stored as f16), each value the index
    /// whose value under the stored `d` is nearest to it. (llama.cpp's
    /// quantizer also searches nearby scales; its files are read as they are.)
    fn quantize(x: &[f32], blk: &mut [u8]) {
        let scale = signed_amax(x) / -127.0;
        blk[0..2].copy_from_slice(&f16_bytes(scale));
        code_indices(x, via_f16(scale), &mut blk[2..18]);
    }

    /// `d · KVALUES[n]`, one f32 product.
    fn dequantize(blk: &[u8], out: &mut [f32]) {
        let d = f16_at(blk);
        for (k, o) in out.iter_mut().enumerate().take(32) {
            *o = d * f32::from(KVALUES[index(&blk[2..18], k)]);
        }
    }

    /// `acc[l] = fma(d · dx, Σ_{4 l..4 l + 4} KVALUES[n] · x̂, acc[l])` for
    /// the eight lanes.
    #[inline(always)]
    fn dot_block(blk: &[u8], xq: &[i8], xs: &[f32], _sums: &[f32], acc: &mut LaneAcc) {
        dot_indices(&blk[2..18], xq, f16_at(blk) * xs[0], &mut acc[..LANES]);
    }

    fn rows(
        w: &[u8],
        row_bytes: usize,
        rows: Range<usize>,
        acts: &Acts<'_>,
        sums: &[f32],
        m: usize,
        out_t: &mut [f32],
    ) {
        block32_rows::<Self>(w, row_bytes, rows, acts, sums, m, out_t);
    }
}

impl Block32 for IQ4_NL {
    // the table indices after the scale
    const SHAPE: Shape = Shape {
        values: 2,
        high: None,
        signed: true,
        table: true,
    };
}
