//! Q5_K: super-blocks of 256 weights (176 bytes): f16 `d`, f16 `dmin`, the 12
//! bytes of eight 6-bit scales and mins laid out as Q4_K's, 32 bytes `qh`, 128
//! bytes of nibbles laid out as Q4_K's. Bit `j` of `qh[k]` is the fifth bit of
//! element `k` of sub-block `j`. Weight `k` of sub-block `j` is
//! `(d · sc[j]) · q − dmin · mn[j]` with `q` in `0..=31`.

use super::q4_k::{
    code_sub_blocks, dot_scaled_min, nearest_code, q4k_scales, q4k_value, unpack_q4k,
};
use super::{BlockFormat, LaneAcc, f16_at};
use crate::kernels::quant_dot::QK;

/// llama.cpp's Q5_K (ggml type 13).
#[allow(non_camel_case_types)]
pub(crate) struct Q5_K;

/// Sub-blocks of 32 per super-block.
const SUB: usize = 8;

/// The 5-bit value of element `k` of sub-block `j` (`blk` the super-block).
#[inline(always)]
fn value(blk: &[u8], j: usize, k: usize) -> u8 {
    q4k_value(&blk[48..176], j, k) | (((blk[16 + k] >> j) & 1) << 4)
}

impl BlockFormat for Q5_K {
    const ELEMS: usize = 256;
    const BYTES: usize = 176;
    // the values are unsigned
    const ACT_OFFSET: i32 = 0;
    // the min term takes each activation block's sum
    const NEEDS_SUMS: bool = true;
    const PAIRED_LANES: bool = true;

    /// Q4_K's simple K rule with 31 steps per sub-block (see
    /// `docs/QUANTIZATION.md`): the scales and mins coded in 6 bits against
    /// the f16 `d` and `dmin`, each value the 5-bit code nearest to it under
    /// its coded scale and min.
    fn quantize(x: &[f32], blk: &mut [u8]) {
        let (d, dmin, sc, mn) = code_sub_blocks(x, 31.0, blk);
        blk[16..176].fill(0);
        for (j, xs) in x.chunks_exact(QK).enumerate().take(SUB) {
            let dq = d * f32::from(sc[j]);
            let dm = dmin * f32::from(mn[j]);
            for (k, &v) in xs.iter().enumerate() {
                let n = nearest_code(v, dq, dm, 31);
                let lo = n & 0x0f;
                blk[48 + 32 * (j / 2) + k] |= if j.is_multiple_of(2) { lo } else { lo << 4 };
                blk[16 + k] |= (n >> 4) << j;
            }
        }
    }

    /// `(d · sc[j]) · q − dmin · mn[j]` (the two products are exact, the
    /// difference is one rounding), as llama.cpp computes it.
    fn dequantize(blk: &[u8], out: &mut [f32]) {
        let (d, dmin) = (f16_at(&blk[0..]), f16_at(&blk[2..]));
        let (sc, mn) = q4k_scales(&blk[4..16]);
        for (j, o) in out.chunks_exact_mut(QK).enumerate().take(SUB) {
            let (dj, mj) = (d * f32::from(sc[j]), dmin * f32::from(mn[j]));
            for (k, o) in o.iter_mut().enumerate() {
                *o = dj * f32::from(value(blk, j, k)) - mj;
            }
        }
    }

    /// As Q4_K's (the lanes of sub-block `j`, then the min term), with the
    /// 5-bit values.
    #[inline(always)]
    fn dot_block(blk: &[u8], xq: &[i8], xs: &[f32], sums: &[f32], acc: &mut LaneAcc) {
        let unpack = |j: usize, v: &mut [i8; 32]| {
            unpack_q4k(&blk[48..176], j, v);
            let qh: &[u8; 32] = blk[16..48].try_into().expect("32 high-bit bytes");
            for (v, &h) in v.iter_mut().zip(qh) {
                *v |= (((h >> j) & 1) << 4) as i8;
            }
        };
        dot_scaled_min(blk, unpack, xq, xs, sums, acc);
    }
}
