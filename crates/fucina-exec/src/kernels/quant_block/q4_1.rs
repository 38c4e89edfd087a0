//! Q4_1: blocks of 32 4-bit values under an f16 scale and an f16 min (20
//! bytes: `d`, `m`, then 16 bytes of nibbles laid out as Q4_0's); value `k` is
//! `n[k] · d + m`.

use std::ops::Range;

use super::{
    BlockFormat, LaneAcc, block32_rows, code_with_min, f16_at, fma_lanes, lane_sums, min_term,
    unpack_nibbles,
};
use crate::kernels::quant_dot::{Acts, Block32, LANES, Shape};

/// llama.cpp's Q4_1 (ggml type 3).
#[allow(non_camel_case_types)]
pub(crate) struct Q4_1;

/// The nibble of element `k` (`qs` the 16 value bytes).
#[inline(always)]
fn nibble(qs: &[u8], k: usize) -> u8 {
    let byte = qs[k % 16];
    if k < 16 { byte & 0x0f } else { byte >> 4 }
}

impl BlockFormat for Q4_1 {
    const ELEMS: usize = 32;
    const BYTES: usize = 20;
    const ACT_OFFSET: i32 = 0;
    // the min term takes the activation block's sum
    const NEEDS_SUMS: bool = true;
    const PAIRED_LANES: bool = false;

    /// llama.cpp's reference quantizer: `d = (max − min) / 15` and `m = min`
    /// (f32, stored rounded to f16), `n = min(15, trunc((x − min) / d + 0.5))`
    /// with the f32 `d` and `min`.
    fn quantize(x: &[f32], blk: &mut [u8]) {
        let mut q = [0u8; 32];
        code_with_min(x, 15, &mut blk[0..4], &mut q);
        for k in 0..16 {
            blk[4 + k] = q[k] | (q[k + 16] << 4);
        }
    }

    /// `n · d + m` (one rounding each for the product and the sum).
    fn dequantize(blk: &[u8], out: &mut [f32]) {
        let (d, m) = (f16_at(blk), f16_at(&blk[2..]));
        for (k, o) in out.iter_mut().enumerate().take(32) {
            *o = f32::from(nibble(&blk[4..20], k)) * d + m;
        }
    }

    /// `acc[l] = fma(d · dx, Σ_{4 l..4 l + 4} n · x̂, acc[l])` for the eight
    /// lanes, then the min term `acc[0] = fma(m · dx, S, acc[0])` (`S = Σ x̂`
    /// over the block).
    #[inline(always)]
    fn dot_block(blk: &[u8], xq: &[i8], xs: &[f32], sums: &[f32], acc: &mut LaneAcc) {
        let mut v = [0i8; 32];
        unpack_nibbles(&blk[4..20], &mut v);
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

impl Block32 for Q4_1 {
    // the nibbles after the scale and the min
    const SHAPE: Shape = Shape {
        values: 4,
        high: None,
        signed: false,
        table: false,
    };
}
