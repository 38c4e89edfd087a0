//! Q2_K: super-blocks of 256 weights (84 bytes): 16 bytes of scales (one per
//! group of 16: the low nibble a 4-bit scale `sc`, the high nibble a 4-bit min
//! `mn`), 64 bytes of 2-bit codes, f16 `d`, f16 `dmin`. Each half of 128
//! weights uses 32 code bytes; its four runs of 32 weights `j = 0..4` take
//! bits `2j, 2j + 1` of those bytes (weight `l` of the run in byte `l`).
//! Weight `e` is `(d · sc[e / 16]) · q − dmin · mn[e / 16]`, `q` in `0..=3`.

use super::{BlockFormat, LaneAcc, f16_at, f16_bytes, lane_sums, nearest, via_f16};
use crate::kernels::quant_dot::{LANES, QK};

/// llama.cpp's Q2_K (ggml type 10).
#[allow(non_camel_case_types)]
pub(crate) struct Q2_K;

/// Groups of 16 per super-block.
const GROUPS: usize = 16;

/// The 2-bit code of weight `e`.
#[inline(always)]
fn code(blk: &[u8], e: usize) -> u8 {
    let (half, w) = (e / 128, e % 128);
    (blk[16 + 32 * half + w % 32] >> (2 * (w / 32))) & 3
}

impl BlockFormat for Q2_K {
    const ELEMS: usize = 256;
    const BYTES: usize = 84;
    const ACT_OFFSET: i32 = 0;
    // the min terms take sums over groups of 16, computed in `dot_block`
    const NEEDS_SUMS: bool = false;
    const PAIRED_LANES: bool = true;

    /// Per group of 16, the range `[min(0, min x), max x]` in 3 steps; the
    /// steps and the mins coded in 4 bits against `d = max step / 15` and
    /// `dmin = max min / 15` (stored as f16), each rounded to the nearest
    /// code; each value the code `clamp(round((x + dmin · mn) / (d · sc)),
    /// 0, 3)` (0 where the scale is 0).
    fn quantize(x: &[f32], blk: &mut [u8]) {
        let (mut step, mut mins) = ([0.0f32; GROUPS], [0.0f32; GROUPS]);
        for (g, xs) in x.chunks_exact(16).enumerate().take(GROUPS) {
            let lo = xs.iter().fold(0.0f32, |a, &v| a.min(v));
            let hi = xs.iter().fold(lo, |a, &v| a.max(v));
            step[g] = (hi - lo) / 3.0;
            mins[g] = -lo;
        }
        let max_step = step.iter().fold(0.0f32, |a, &v| a.max(v));
        let max_min = mins.iter().fold(0.0f32, |a, &v| a.max(v));
        let (d, dmin) = (via_f16(max_step / 15.0), via_f16(max_min / 15.0));
        let code4 = |v: f32, unit: f32| -> u8 {
            if unit > 0.0 {
                nearest(v / unit).clamp(0, 15) as u8
            } else {
                0
            }
        };
        blk.fill(0);
        blk[80..82].copy_from_slice(&f16_bytes(max_step / 15.0));
        blk[82..84].copy_from_slice(&f16_bytes(max_min / 15.0));
        for (g, xs) in x.chunks_exact(16).enumerate().take(GROUPS) {
            let (sc, mn) = (code4(step[g], d), code4(mins[g], dmin));
            blk[g] = sc | (mn << 4);
            let (dq, dm) = (d * f32::from(sc), dmin * f32::from(mn));
            for (i, &v) in xs.iter().enumerate() {
                let q = if dq > 0.0 {
                    nearest((v + dm) / dq).clamp(0, 3) as u8
                } else {
                    0
                };
                let e = 16 * g + i;
                let (half, w) = (e / 128, e % 128);
                blk[16 + 32 * half + w % 32] |= q << (2 * (w / 32));
            }
        }
    }

    /// `(d · sc) · q − dmin · mn` (the two products exact, the difference one
    /// rounding), as llama.cpp computes it.
    fn dequantize(blk: &[u8], out: &mut [f32]) {
        let (d, dmin) = (f16_at(&blk[80..]), f16_at(&blk[82..]));
        for (e, o) in out.iter_mut().enumerate().take(256) {
            let s = blk[e / 16];
            let (dl, ml) = (d * f32::from(s & 15), dmin * f32::from(s >> 4));
            *o = dl * f32::from(code(blk, e)) - ml;
        }
    }

    /// Sub-block `j`'s lanes `acc[8 · (j mod 2) + l] = fma((d · sc[g]) · dx,
    /// Σ q · x̂, ·)` (`g` the lane's group of 16) for `j` in increasing order;
    /// then for each group `g` in increasing order its min term
    /// `acc[g] = fma(−((dmin · mn[g]) · dx), S, acc[g])`, `S = Σ x̂` over the
    /// group (exact).
    #[inline(always)]
    fn dot_block(blk: &[u8], xq: &[i8], xs: &[f32], _sums: &[f32], acc: &mut LaneAcc) {
        let (d, dmin) = (f16_at(&blk[80..]), f16_at(&blk[82..]));
        let mut v = [0i8; 32];
        for j in 0..8 {
            // sub-block j is run j % 4 of half j / 4
            let codes: &[u8; 32] = blk[16 + 32 * (j / 4)..48 + 32 * (j / 4)]
                .try_into()
                .expect("32 code bytes");
            for (v, &c) in v.iter_mut().zip(codes) {
                *v = ((c >> (2 * (j % 4))) & 3) as i8;
            }
            let p = lane_sums(&v, &xq[QK * j..QK * (j + 1)]);
            for (l, &p) in p.iter().enumerate() {
                let s = (d * f32::from(blk[2 * j + l / 4] & 15)) * xs[j];
                let a = &mut acc[LANES * (j % 2) + l];
                *a = s.mul_add(p as f32, *a);
            }
        }
        for (g, a) in acc.iter_mut().enumerate() {
            let t = (dmin * f32::from(blk[g] >> 4)) * xs[g / 2];
            let sum: i32 = xq[16 * g..16 * g + 16].iter().map(|&v| i32::from(v)).sum();
            *a = (-t).mul_add(sum as f32, *a);
        }
    }
}
