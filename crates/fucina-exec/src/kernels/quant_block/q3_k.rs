//! Q3_K: super-blocks of 256 weights (110 bytes): 32 bytes `hmask`, 64 bytes
//! of low 2-bit codes laid out as Q2_K's, 12 bytes of sixteen 6-bit scales
//! (one per group of 16), f16 `d`. Weight `e` (half `h = e / 128`, run
//! `j = e % 128 / 32`, position `l = e % 32`) has the low bits
//! `(qs[32 h + l] >> 2 j) & 3` and the high bit `hmask[l]` bit `4 h + j`; its
//! value is `q = low − (high ? 0 : 4)` in `−4..=3`. Group `g`'s scale code
//! `ls` takes its low four bits from byte `g mod 8` of the scale bytes (low
//! nibble for `g < 8`, high for `g ≥ 8`) and its top two from bits
//! `2 (g / 4)..` of byte `8 + g mod 4`. Weight `e` is `(d · (ls[e / 16] − 32)) · q`.

use super::{BlockFormat, LaneAcc, f16_at, f16_bytes, lane_sums, nearest, signed_amax, via_f16};
use crate::kernels::quant_dot::{LANES, QK};

/// llama.cpp's Q3_K (ggml type 11).
#[allow(non_camel_case_types)]
pub(crate) struct Q3_K;

/// Groups of 16 per super-block.
const GROUPS: usize = 16;

/// The value `−4..=3` of weight `e`.
#[inline(always)]
fn value(blk: &[u8], e: usize) -> i32 {
    let (h, w) = (e / 128, e % 128);
    let (j, l) = (w / 32, w % 32);
    let low = i32::from((blk[32 + 32 * h + l] >> (2 * j)) & 3);
    let high = (blk[l] >> (4 * h + j)) & 1;
    low - if high != 0 { 0 } else { 4 }
}

/// The 6-bit scale code `0..=63` of group `g` (the scale is `ls − 32`).
#[inline(always)]
fn scale_code(blk: &[u8], g: usize) -> i32 {
    let s = &blk[96..108];
    let low = if g < 8 { s[g] & 15 } else { s[g - 8] >> 4 };
    let high = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
    i32::from(low | (high << 4))
}

/// The sixteen group scales `ls − 32` (`−32..=31`) of the 12 scale bytes
/// `s` (bytes 96..108 of a super-block), group `g` in byte `g`: the low
/// nibbles from bytes 0..8 (low halves for groups 0..8, high halves for
/// 8..16), the top two bits from bytes 8..12, four groups per 32-bit word.
#[inline(always)]
pub(crate) fn signed_scales(s: &[u8]) -> [i8; 16] {
    let word = |i: usize| u32::from_le_bytes([s[i], s[i + 1], s[i + 2], s[i + 3]]);
    let (a, b, top) = (word(0), word(4), word(8));
    let (nib, two) = (0x0f0f_0f0fu32, 0x0303_0303u32);
    // groups 4 k .. 4 k + 4: low nibbles, then their top bits (bits 2 k..)
    let w = [
        (a & nib) | ((top & two) << 4),
        (b & nib) | (((top >> 2) & two) << 4),
        ((a >> 4) & nib) | (((top >> 4) & two) << 4),
        ((b >> 4) & nib) | (((top >> 6) & two) << 4),
    ];
    let mut out = [0i8; 16];
    for (o, w) in out.chunks_exact_mut(4).zip(w) {
        // each code 0..=63, less 32
        for (o, b) in o.iter_mut().zip(w.to_le_bytes()) {
            *o = b as i8 - 32;
        }
    }
    out
}

impl BlockFormat for Q3_K {
    const ELEMS: usize = 256;
    const BYTES: usize = 110;
    // the values `q + 4` are unsigned
    const ACT_OFFSET: i32 = 4;
    const NEEDS_SUMS: bool = false;
    const PAIRED_LANES: bool = true;

    /// Per group of 16 the scale `g = max / −4` (`max` the signed value of
    /// largest magnitude); the scales coded in 6 bits as
    /// `ls − 32 = clamp(round(g / d), −32, 31)` against `d = G / −32` (`G` the
    /// group scale of largest magnitude, stored as f16); each value the code
    /// `clamp(round(x / (d · (ls − 32))), −4, 3)` (0 where the scale is 0).
    fn quantize(x: &[f32], blk: &mut [u8]) {
        let mut gs = [0.0f32; GROUPS];
        for (g, xs) in gs.iter_mut().zip(x.chunks_exact(16)) {
            *g = signed_amax(xs) / -4.0;
        }
        let big = signed_amax(&gs);
        let d = via_f16(big / -32.0);
        blk.fill(0);
        blk[108..110].copy_from_slice(&f16_bytes(big / -32.0));
        for (g, xs) in x.chunks_exact(16).enumerate().take(GROUPS) {
            let l = if d != 0.0 && d.is_finite() {
                nearest(gs[g] / d).clamp(-32, 31)
            } else {
                0
            };
            let ls = (l + 32) as u8;
            blk[96 + g % 8] |= if g < 8 { ls & 15 } else { (ls & 15) << 4 };
            blk[104 + g % 4] |= (ls >> 4) << (2 * (g / 4));
            let dq = d * l as f32;
            for (i, &v) in xs.iter().enumerate() {
                let q = if dq != 0.0 {
                    nearest(v / dq).clamp(-4, 3)
                } else {
                    0
                };
                let u = (q + 4) as u8;
                let e = 16 * g + i;
                let (h, w) = (e / 128, e % 128);
                let (j, p) = (w / 32, w % 32);
                blk[32 + 32 * h + p] |= (u & 3) << (2 * j);
                blk[p] |= (u >> 2) << (4 * h + j);
            }
        }
    }

    /// `(d · (ls − 32)) · q` (the scale product exact, one rounding), as
    /// llama.cpp computes it.
    fn dequantize(blk: &[u8], out: &mut [f32]) {
        let d = f16_at(&blk[108..]);
        for (e, o) in out.iter_mut().enumerate().take(256) {
            let dl = d * (scale_code(blk, e / 16) - 32) as f32;
            *o = dl * value(blk, e) as f32;
        }
    }

    /// Sub-block `j`'s lanes `acc[8 · (j mod 2) + l] = fma((d · (ls[g] − 32))
    /// · dx, Σ q · x̂, ·)` (`g` the lane's group of 16) for `j` in increasing
    /// order.
    #[inline(always)]
    fn dot_block(blk: &[u8], xq: &[i8], xs: &[f32], _sums: &[f32], acc: &mut LaneAcc) {
        let d = f16_at(&blk[108..]);
        let hmask: &[u8; 32] = blk[..32].try_into().expect("32 hmask bytes");
        let mut v = [0i8; 32];
        for j in 0..8 {
            // sub-block j is run j % 4 of half j / 4; its high bits are bit j
            // of hmask
            let codes: &[u8; 32] = blk[32 + 32 * (j / 4)..64 + 32 * (j / 4)]
                .try_into()
                .expect("32 code bytes");
            for ((v, &c), &h) in v.iter_mut().zip(codes).zip(hmask) {
                let low = ((c >> (2 * (j % 4))) & 3) as i8;
                *v = low - 4 * (1 - ((h >> j) & 1) as i8);
            }
            let p = lane_sums(&v, &xq[QK * j..QK * (j + 1)]);
            for (l, &p) in p.iter().enumerate() {
                let s = (d * (scale_code(blk, 2 * j + l / 4) - 32) as f32) * xs[j];
                let a = &mut acc[LANES * (j % 2) + l];
                *a = s.mul_add(p as f32, *a);
            }
        }
    }
}
