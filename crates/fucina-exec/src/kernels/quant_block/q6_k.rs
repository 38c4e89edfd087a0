//! Q6_K: super-blocks of 256 weights (210 bytes): 128 bytes `ql` (low four
//! bits), 64 bytes `qh` (high two bits), 16 signed scales (one per 16 weights),
//! f16 `d`. Each half of 128 weights uses 64 bytes of `ql` and 32 of `qh`; its
//! four groups of 32 weights `g = 0..4` take the low (`g < 2`) or high
//! (`g ≥ 2`) nibbles of `ql[32 · (g % 2)..][..32]` and bits `2g..2g + 2` of
//! `qh[..32]`. Weight `e` is `(d · scales[e / 16]) · (q − 32)`.

use super::{BlockFormat, LaneAcc, f16_at, f16_bytes, nearest, signed_amax, via_f16};
use crate::kernels::quant_dot::{LANES, QK};

/// llama.cpp's Q6_K (ggml type 14).
#[allow(non_camel_case_types)]
pub(crate) struct Q6_K;

/// Bytes of a super-block.
pub(crate) const Q6K_BYTES: usize = 210;
/// Weights per super-block.
const QK_K: usize = 256;
/// Sub-blocks of 32 per super-block.
const SUB: usize = 8;

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

impl BlockFormat for Q6_K {
    const ELEMS: usize = QK_K;
    const BYTES: usize = Q6K_BYTES;
    // the values are read unsigned (`q`, not `q − 32`)
    const ACT_OFFSET: i32 = 32;
    const NEEDS_SUMS: bool = false;
    const PAIRED_LANES: bool = true;

    /// Quantizes 256 values into one Q6_K super-block (see `docs/QUANTIZATION.md`):
    /// per group of 16, the scale `g = max / −32` (`max` the signed value of largest
    /// magnitude); the group scales are coded as int8 against the super-block's f16
    /// `d = G / −128` (`G` the group scale of largest magnitude); each value then
    /// takes the 6-bit code nearest to it under its coded (f16-rounded) scale,
    /// clamped to `−32..=31`.
    fn quantize(x: &[f32], blk: &mut [u8]) {
        let mut gs = [0.0f32; 16];
        for (g, xs) in gs.iter_mut().zip(x.chunks_exact(16)) {
            *g = signed_amax(xs) / -32.0;
        }
        let gbig = signed_amax(&gs);
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

    /// Dequantizes one Q6_K super-block into 256 values:
    /// `(d · scales[e / 16]) · (q − 32)` (exact: at most 23 significant bits).
    fn dequantize(blk: &[u8], out: &mut [f32]) {
        let d = f16_at(&blk[208..]);
        for (e, o) in out.iter_mut().enumerate().take(QK_K) {
            let sc = f32::from(blk[192 + e / 16] as i8);
            *o = (d * sc) * f32::from(i16::from(q6k_value(blk, e)) - 32);
        }
    }

    /// Sub-block `j`'s lanes `acc[8 · (j mod 2) + l] = fma((d · scales[g]) ·
    /// dx, Σ (q − 32) · x̂, ·)` (`g` the lane's group of 16) for `j` in
    /// increasing order.
    #[inline(always)]
    fn dot_block(blk: &[u8], xq: &[i8], xs: &[f32], _sums: &[f32], acc: &mut LaneAcc) {
        let d = f16_at(&blk[208..]);
        for j in 0..SUB {
            let xb = &xq[j * QK..(j + 1) * QK];
            let half = &mut acc[LANES * (j % 2)..][..LANES];
            for (l, a) in half.iter_mut().enumerate() {
                let sc = f32::from(blk[192 + 2 * j + l / 4] as i8);
                let s = (d * sc) * xs[j];
                let p: i32 = (4 * l..4 * l + 4)
                    .map(|k| (i32::from(q6k_value(blk, 32 * j + k)) - 32) * i32::from(xb[k]))
                    .sum();
                *a = s.mul_add(p as f32, *a);
            }
        }
    }
}
