//! Q5_1: blocks of 32 5-bit values under an f16 scale and an f16 min (24
//! bytes: `d`, `m`, then `qh` and 16 bytes of nibbles laid out as Q5_0's);
//! value `k` is `q[k] · d + m`.

use std::ops::Range;

use super::q5_0::{pack_q5, q5_value, unpack_q5};
use super::{
    BlockFormat, LaneAcc, block32_rows, code_with_min, f16_at, fma_lanes, lane_sums, min_term,
};
use crate::kernels::quant_dot::{Acts, Block32, LANES, Shape};

/// llama.cpp's Q5_1 (ggml type 7).
#[allow(non_camel_case_types)]
pub(crate) struct Q5_1;

impl BlockFormat for Q5_1 {
    const ELEMS: usize = 32;
    const BYTES: usize = 24;
    const ACT_OFFSET: i32 = 0;
    // the min term takes the activation block's sum
    const NEEDS_SUMS: bool = true;
    const PAIRED_LANES: bool = false;

    /// llama.cpp's reference quantizer: `d = (max − min) / 31` and `m = min`
    /// (f32, stored rounded to f16), `q = trunc((x − min) / d + 0.5)` with the
    /// f32 `d` and `min`.
    fn quantize(x: &[f32], blk: &mut [u8]) {
        let mut q = [0u8; 32];
        code_with_min(x, 31, &mut blk[0..4], &mut q);
        let qh = pack_q5(&q, &mut blk[8..24]);
        blk[4..8].copy_from_slice(&qh.to_le_bytes());
    }

    /// `q · d + m` (one rounding each for the product and the sum).
    fn dequantize(blk: &[u8], out: &mut [f32]) {
        let (d, m) = (f16_at(blk), f16_at(&blk[2..]));
        let qh = u32::from_le_bytes([blk[4], blk[5], blk[6], blk[7]]);
        for (k, o) in out.iter_mut().enumerate().take(32) {
            *o = f32::from(q5_value(qh, &blk[8..24], k)) * d + m;
        }
    }

    /// `acc[l] = fma(d · dx, Σ_{4 l..4 l + 4} q · x̂, acc[l])` for the eight
    /// lanes, then the min term `acc[0] = fma(m · dx, S, acc[0])` (`S = Σ x̂`
    /// over the block).
    #[inline(always)]
    fn dot_block(blk: &[u8], xq: &[i8], xs: &[f32], sums: &[f32], acc: &mut LaneAcc) {
        let qh = u32::from_le_bytes([blk[4], blk[5], blk[6], blk[7]]);
        let mut v = [0i8; 32];
        unpack_q5(qh, &blk[8..24], 0, &mut v);
        fma_lanes(f16_at(blk) * xs[0], &lane_sums(&v, xq), &mut acc[..LANES]);
        min_term(f16_at(&blk[2..]), xs[0], sums[0], acc);
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

impl Block32 for Q5_1 {
    // the fifth bits after the scale and the min, then the nibbles
    const SHAPE: Shape = Shape {
        values: 8,
        high: Some(4),
        signed: false,
        table: false,
    };
}
