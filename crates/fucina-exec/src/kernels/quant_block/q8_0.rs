//! Q8_0: blocks of 32 int8 values under an f16 scale (34 bytes: `d`, then
//! `q[0..32]`); value `k` is `q[k] · d`.

use std::ops::Range;

use super::{BlockFormat, LaneAcc, block32_rows, f16_at, f16_bytes};
use crate::kernels::quant_dot::{Acts, Block32, LANES, Shape};

/// llama.cpp's Q8_0 (ggml type 8).
#[allow(non_camel_case_types)]
pub(crate) struct Q8_0;

impl BlockFormat for Q8_0 {
    const ELEMS: usize = 32;
    const BYTES: usize = 34;
    // the values are read unsigned as `q + 128` (`q ^ 0x80`)
    const ACT_OFFSET: i32 = 128;
    const NEEDS_SUMS: bool = false;
    const PAIRED_LANES: bool = false;

    /// `d = amax / 127` (f32, stored rounded to f16), `q = round(x / d)` (half
    /// away from zero) with the f32 `d`: llama.cpp's reference quantizer.
    fn quantize(x: &[f32], blk: &mut [u8]) {
        let (d, qs) = blk.split_at_mut(2);
        let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let scale = amax / 127.0;
        let id = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = (v * id).round() as i8 as u8;
        }
        d.copy_from_slice(&f16_bytes(scale));
    }

    /// `q · d`, one f32 product.
    fn dequantize(blk: &[u8], out: &mut [f32]) {
        let d = f16_at(blk);
        for (o, &q) in out.iter_mut().zip(&blk[2..34]) {
            *o = f32::from(q as i8) * d;
        }
    }

    /// `acc[l] = fma(d · dx, Σ_{4 l..4 l + 4} q · x̂, acc[l])` for the eight
    /// lanes.
    #[inline(always)]
    fn dot_block(blk: &[u8], xq: &[i8], xs: &[f32], _sums: &[f32], acc: &mut LaneAcc) {
        let s = f16_at(blk) * xs[0];
        let qs = &blk[2..34];
        for (l, a) in acc[..LANES].iter_mut().enumerate() {
            let p: i32 = (4 * l..4 * l + 4)
                .map(|k| i32::from(qs[k] as i8) * i32::from(xq[k]))
                .sum();
            *a = s.mul_add(p as f32, *a);
        }
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

impl Block32 for Q8_0 {
    // 32 signed bytes after the scale
    const SHAPE: Shape = Shape {
        values: 2,
        high: None,
        signed: true,
        table: false,
    };
}
