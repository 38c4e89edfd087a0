//! Q4_0: blocks of 32 4-bit values under an f16 scale (18 bytes: `d`, then 16
//! bytes of nibbles, the low nibble of byte `k` holding element `k` and its
//! high nibble element `k + 16`); value `k` is `(n[k] − 8) · d`.

use std::ops::Range;

use super::{BlockFormat, LaneAcc, block32_rows, f16_at, f16_bytes, signed_amax};
use crate::kernels::quant_dot::{Acts, Block32, LANES, Shape};

/// llama.cpp's Q4_0 (ggml type 2).
#[allow(non_camel_case_types)]
pub(crate) struct Q4_0;

/// The nibble of element `k` (`qs` the 16 value bytes).
#[inline(always)]
fn nibble(qs: &[u8], k: usize) -> u8 {
    let byte = qs[k % 16];
    if k < 16 { byte & 0x0f } else { byte >> 4 }
}

impl BlockFormat for Q4_0 {
    const ELEMS: usize = 32;
    const BYTES: usize = 18;
    // the nibbles `n = w + 8` are unsigned already
    const ACT_OFFSET: i32 = 8;
    const NEEDS_SUMS: bool = false;
    const PAIRED_LANES: bool = false;

    /// `max` the signed value of largest magnitude, `d = max / −8` (f32,
    /// stored rounded to f16), `n = min(15, trunc(x / d + 8.5))` with the f32
    /// `d`: llama.cpp's reference quantizer.
    fn quantize(x: &[f32], blk: &mut [u8]) {
        let (d, qs) = blk.split_at_mut(2);
        let scale = signed_amax(x) / -8.0;
        let id = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        let nib = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
        for (k, q) in qs.iter_mut().enumerate() {
            *q = nib(x[k]) | (nib(x[k + 16]) << 4);
        }
        d.copy_from_slice(&f16_bytes(scale));
    }

    /// `(n − 8) · d`, one f32 product.
    fn dequantize(blk: &[u8], out: &mut [f32]) {
        let d = f16_at(blk);
        for (k, &q) in blk[2..18].iter().enumerate() {
            out[k] = f32::from((q & 0x0f) as i8 - 8) * d;
            out[k + 16] = f32::from((q >> 4) as i8 - 8) * d;
        }
    }

    /// `acc[l] = fma(d · dx, Σ_{4 l..4 l + 4} (n − 8) · x̂, acc[l])` for the
    /// eight lanes.
    #[inline(always)]
    fn dot_block(blk: &[u8], xq: &[i8], xs: &[f32], _sums: &[f32], acc: &mut LaneAcc) {
        let s = f16_at(blk) * xs[0];
        let qs = &blk[2..18];
        for (l, a) in acc[..LANES].iter_mut().enumerate() {
            let p: i32 = (4 * l..4 * l + 4)
                .map(|k| (i32::from(nibble(qs, k)) - 8) * i32::from(xq[k]))
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

impl Block32 for Q4_0 {
    // 16 bytes of nibbles after the scale
    const SHAPE: Shape = Shape {
        values: 2,
        high: None,
        signed: false,
        table: false,
    };
}
