//! Q5_0: blocks of 32 5-bit values under an f16 scale (22 bytes: `d`, then
//! `qh`, four bytes read as a little-endian u32 whose bit `k` is the fifth bit
//! of element `k`, then 16 bytes of nibbles, the low nibble of byte `k`
//! holding the low four bits of element `k` and its high nibble those of
//! element `k + 16`); value `k` is `(q[k] − 16) · d`.

use std::ops::Range;

use super::{
    BlockFormat, LaneAcc, block32_rows, f16_at, f16_bytes, fma_lanes, lane_sums, signed_amax,
    unpack_nibbles,
};
use crate::kernels::quant_dot::{Acts, Block32, LANES, Shape};

/// llama.cpp's Q5_0 (ggml type 6).
#[allow(non_camel_case_types)]
pub(crate) struct Q5_0;

/// The 5-bit value `0..=31` of element `k` of a block whose high bits are `qh`
/// and whose nibbles are `qs` (16 bytes): the layout Q5_0 and Q5_1 share.
#[inline(always)]
pub(crate) fn q5_value(qh: u32, qs: &[u8], k: usize) -> u8 {
    let byte = qs[k % 16];
    let lo = if k < 16 { byte & 0x0f } else { byte >> 4 };
    lo | ((((qh >> k) & 1) as u8) << 4)
}

/// Unpacks the 32 values `0..=31` of high bits `qh` and nibbles `qs` into `v`,
/// minus `offset` (16 for Q5_0's signed values, 0 for Q5_1).
#[inline(always)]
pub(crate) fn unpack_q5(qh: u32, qs: &[u8], offset: i8, v: &mut [i8; 32]) {
    unpack_nibbles(qs, v);
    for (k, v) in v.iter_mut().enumerate() {
        *v = (*v | ((((qh >> k) & 1) as i8) << 4)) - offset;
    }
}

/// Packs 32 values `0..=31` into `qh` (returned) and the 16 nibble bytes `qs`.
pub(crate) fn pack_q5(q: &[u8; 32], qs: &mut [u8]) -> u32 {
    let mut qh = 0u32;
    for k in 0..16 {
        qs[k] = (q[k] & 0x0f) | ((q[k + 16] & 0x0f) << 4);
        qh |= u32::from(q[k] >> 4) << k;
        qh |= u32::from(q[k + 16] >> 4) << (k + 16);
    }
    qh
}

impl BlockFormat for Q5_0 {
    const ELEMS: usize = 32;
    const BYTES: usize = 22;
    // the values `q = w + 16` are unsigned
    const ACT_OFFSET: i32 = 16;
    const NEEDS_SUMS: bool = false;
    const PAIRED_LANES: bool = false;

    /// llama.cpp's reference quantizer: `max` the signed value of largest
    /// magnitude, `d = max / −16` (f32, stored rounded to f16),
    /// `q = min(31, trunc(x / d + 16.5))` with the f32 `d`.
    fn quantize(x: &[f32], blk: &mut [u8]) {
        let scale = signed_amax(x) / -16.0;
        let id = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        let mut q = [0u8; 32];
        for (q, &v) in q.iter_mut().zip(x) {
            *q = ((v * id + 16.5) as i8).min(31) as u8;
        }
        blk[0..2].copy_from_slice(&f16_bytes(scale));
        let qh = pack_q5(&q, &mut blk[6..22]);
        blk[2..6].copy_from_slice(&qh.to_le_bytes());
    }

    /// `(q − 16) · d`, one f32 product.
    fn dequantize(blk: &[u8], out: &mut [f32]) {
        let d = f16_at(blk);
        let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
        for (k, o) in out.iter_mut().enumerate().take(32) {
            *o = f32::from(q5_value(qh, &blk[6..22], k) as i8 - 16) * d;
        }
    }

    /// `acc[l] = fma(d · dx, Σ_{4 l..4 l + 4} (q − 16) · x̂, acc[l])` for the
    /// eight lanes.
    #[inline(always)]
    fn dot_block(blk: &[u8], xq: &[i8], xs: &[f32], _sums: &[f32], acc: &mut LaneAcc) {
        let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
        let mut v = [0i8; 32];
        unpack_q5(qh, &blk[6..22], 16, &mut v);
        fma_lanes(f16_at(blk) * xs[0], &lane_sums(&v, xq), &mut acc[..LANES]);
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

impl Block32 for Q5_0 {
    // the fifth bits after the scale, then the nibbles
    const SHAPE: Shape = Shape {
        values: 6,
        high: Some(2),
        signed: false,
        table: false,
    };
}
