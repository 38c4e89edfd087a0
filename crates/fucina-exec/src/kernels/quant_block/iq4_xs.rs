//! IQ4_XS: super-blocks of 256 weights (136 bytes): f16 `d`, a u16
//! `scales_h`, four bytes `scales_l`, then for each sub-block of 32 in turn 16
//! bytes of IQ4_NL's nibble indices. Sub-block `j`'s 6-bit scale is
//! `ls = (scales_l[j / 2] >> 4 (j mod 2)) & 15 | ((scales_h >> 2 j) & 3) << 4`;
//! weight `k` of sub-block `j` is `(d · (ls − 32)) · KVALUES[n]`.

use super::iq4_nl::{KVALUES, code_indices, dot_indices, index};
use super::{BlockFormat, LaneAcc, f16_at, f16_bytes, nearest, signed_amax, via_f16};
use crate::kernels::quant_dot::{LANES, QK};

/// llama.cpp's IQ4_XS (ggml type 23).
#[allow(non_camel_case_types)]
pub(crate) struct IQ4_XS;

/// Sub-blocks of 32 per super-block.
const SUB: usize = 8;

/// The 6-bit scale code `ls` (`0..=63`, the scale being `ls − 32`) of
/// sub-block `j`.
#[inline(always)]
fn scale_code(blk: &[u8], j: usize) -> i32 {
    let h = u16::from_le_bytes([blk[2], blk[3]]);
    let lo = (blk[4 + j / 2] >> (4 * (j % 2))) & 15;
    i32::from(lo) | (i32::from((h >> (2 * j)) & 3) << 4)
}

/// The eight sub-block scales `ls − 32` (`−32..=31`) of the super-block
/// `blk`.
#[inline(always)]
pub(crate) fn signed_scales(blk: &[u8]) -> [i8; 8] {
    let h = u32::from(u16::from_le_bytes([blk[2], blk[3]]));
    let l = u32::from_le_bytes([blk[4], blk[5], blk[6], blk[7]]);
    std::array::from_fn(|j| (((l >> (4 * j)) & 15) | (((h >> (2 * j)) & 3) << 4)) as i8 - 32)
}

impl BlockFormat for IQ4_XS {
    const ELEMS: usize = 256;
    const BYTES: usize = 136;
    // the table values are signed int8, read unsigned as `v + 128`
    const ACT_OFFSET: i32 = 128;
    const NEEDS_SUMS: bool = false;
    const PAIRED_LANES: bool = true;

    /// Per sub-block the scale `g = max / −127` (`max` the signed value of
    /// largest magnitude, as IQ4_NL); the scales are coded in 6 bits as
    /// `ls − 32 = round(g / d)` (clamped to `−32..=31`) against
    /// `d = G / −32` (`G` the sub-block scale of largest magnitude, stored as
    /// f16); each value the index nearest to it under its coded scale.
    fn quantize(x: &[f32], blk: &mut [u8]) {
        let mut g = [0.0f32; SUB];
        for (g, xs) in g.iter_mut().zip(x.chunks_exact(QK)) {
            *g = signed_amax(xs) / -127.0;
        }
        let big = signed_amax(&g);
        let d = via_f16(big / -32.0);
        blk.fill(0);
        blk[0..2].copy_from_slice(&f16_bytes(big / -32.0));
        let mut h = 0u16;
        for (j, xs) in x.chunks_exact(QK).enumerate().take(SUB) {
            let l = if d != 0.0 && d.is_finite() {
                nearest(g[j] / d).clamp(-32, 31)
            } else {
                0
            };
            let ls = (l + 32) as u8;
            blk[4 + j / 2] |= (ls & 15) << (4 * (j % 2));
            h |= u16::from(ls >> 4) << (2 * j);
            code_indices(xs, d * l as f32, &mut blk[8 + 16 * j..8 + 16 * (j + 1)]);
        }
        blk[2..4].copy_from_slice(&h.to_le_bytes());
    }

    /// `(d · (ls − 32)) · KVALUES[n]` (the scale product exact, one
    /// rounding), as llama.cpp computes it.
    fn dequantize(blk: &[u8], out: &mut [f32]) {
        let d = f16_at(blk);
        for (j, o) in out.chunks_exact_mut(QK).enumerate().take(SUB) {
            let dl = d * (scale_code(blk, j) - 32) as f32;
            let qs = &blk[8 + 16 * j..8 + 16 * (j + 1)];
            for (k, o) in o.iter_mut().enumerate() {
                *o = dl * f32::from(KVALUES[index(qs, k)]);
            }
        }
    }

    /// Sub-block `j`'s lanes `acc[8 · (j mod 2) + l] = fma((d · (ls − 32)) ·
    /// dx, Σ KVALUES[n] · x̂, ·)` for `j` in increasing order.
    #[inline(always)]
    fn dot_block(blk: &[u8], xq: &[i8], xs: &[f32], _sums: &[f32], acc: &mut LaneAcc) {
        let d = f16_at(blk);
        for j in 0..SUB {
            let s = (d * (scale_code(blk, j) - 32) as f32) * xs[j];
            dot_indices(
                &blk[8 + 16 * j..8 + 16 * (j + 1)],
                &xq[j * QK..(j + 1) * QK],
                s,
                &mut acc[LANES * (j % 2)..LANES * (j % 2) + LANES],
            );
        }
    }
}
