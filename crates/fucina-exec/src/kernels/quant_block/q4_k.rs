//! Q4_K: super-blocks of 256 weights (144 bytes): f16 `d`, f16 `dmin`, 12
//! bytes holding eight 6-bit scales `sc[j]` and eight 6-bit mins `mn[j]` (one
//! pair per sub-block of 32), then 128 bytes of nibbles. Bytes `0..4` carry
//! `sc[0..4]` in their low six bits, bytes `4..8` `mn[0..4]`; sub-blocks 4..8
//! take their low four bits from bytes `8..12` (scale in the low nibble, min in
//! the high one) and their top two bits from the spare top bits of bytes `0..4`
//! (scales) and `4..8` (mins). The nibbles run in four 32-byte groups: group `c`
//! holds sub-block `2c` in its low nibbles and sub-block `2c + 1` in its high
//! nibbles, element `k` of the sub-block in byte `k`. Weight `k` of sub-block
//! `j` is `(d · sc[j]) · q − dmin · mn[j]`.

use super::{BlockFormat, LaneAcc, f16_at, f16_bytes, fma_lanes, lane_sums, nearest, via_f16};
use crate::kernels::quant_dot::{LANES, QK};

/// llama.cpp's Q4_K (ggml type 12).
#[allow(non_camel_case_types)]
pub(crate) struct Q4_K;

/// Bytes of a super-block.
pub(crate) const Q4K_BYTES: usize = 144;
/// Sub-blocks of 32 per super-block.
const SUB: usize = 8;

/// The eight 6-bit scales and eight 6-bit mins of a Q4_K super-block's
/// 12 packed bytes (see the module docs).
#[inline(always)]
pub(crate) fn q4k_scales(p: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (sc, mn) = q4k_scales_u64(p);
    (sc.to_le_bytes(), mn.to_le_bytes())
}

/// [`q4k_scales`] as two little-endian words of eight bytes, computed four
/// bytes at a time: a byte's top two bits (`>> 6`, masked to `0b11`, then
/// `<< 4`) never cross into its neighbour.
#[inline(always)]
pub(crate) fn q4k_scales_u64(p: &[u8]) -> (u64, u64) {
    let word = |i: usize| u32::from_le_bytes([p[i], p[i + 1], p[i + 2], p[i + 3]]);
    let (w0, w1, w2) = (word(0), word(4), word(8));
    let sc_lo = w0 & 0x3f3f_3f3f;
    let mn_lo = w1 & 0x3f3f_3f3f;
    let sc_hi = (w2 & 0x0f0f_0f0f) | (((w0 >> 6) & 0x0303_0303) << 4);
    let mn_hi = ((w2 >> 4) & 0x0f0f_0f0f) | (((w1 >> 6) & 0x0303_0303) << 4);
    (
        u64::from(sc_lo) | (u64::from(sc_hi) << 32),
        u64::from(mn_lo) | (u64::from(mn_hi) << 32),
    )
}

/// Packs eight 6-bit scales and mins into a Q4_K super-block's 12 bytes (the
/// inverse of [`q4k_scales`]).
fn pack_q4k_scales(sc: &[u8; 8], mn: &[u8; 8], p: &mut [u8]) {
    for j in 0..4 {
        p[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        p[j + 4] = (mn[j] & 63) | ((mn[j + 4] >> 4) << 6);
        p[j + 8] = (sc[j + 4] & 0x0f) | ((mn[j + 4] & 0x0f) << 4);
    }
}

/// The K rule's sub-block coding, shared by Q4_K and Q5_K (`levels` 15 or
/// 31): per sub-block of 32, the range `[min(0, min x), max x]` in `levels`
/// steps; the steps and the mins are coded in 6 bits against
/// `d = max step / 63` and `dmin = max min / 63` (stored as f16), each rounded
/// to the nearest code. Writes `d`, `dmin` and the 12 scale bytes into
/// `blk[0..16]`; returns `d` and `dmin` as a reader sees them, and the codes.
pub(crate) fn code_sub_blocks(
    x: &[f32],
    levels: f32,
    blk: &mut [u8],
) -> (f32, f32, [u8; 8], [u8; 8]) {
    let (mut step, mut mins) = ([0.0f32; SUB], [0.0f32; SUB]);
    for (j, xs) in x.chunks_exact(QK).enumerate().take(SUB) {
        let lo = xs.iter().fold(0.0f32, |a, &v| a.min(v));
        let hi = xs.iter().fold(lo, |a, &v| a.max(v));
        step[j] = (hi - lo) / levels;
        mins[j] = -lo;
    }
    let max_step = step.iter().fold(0.0f32, |a, &v| a.max(v));
    let max_min = mins.iter().fold(0.0f32, |a, &v| a.max(v));
    let d = via_f16(max_step / 63.0);
    let dmin = via_f16(max_min / 63.0);
    let code = |v: f32, unit: f32| -> u8 {
        if unit > 0.0 {
            nearest(v / unit).clamp(0, 63) as u8
        } else {
            0
        }
    };
    let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
    for j in 0..SUB {
        sc[j] = code(step[j], d);
        mn[j] = code(mins[j], dmin);
    }
    blk[0..2].copy_from_slice(&f16_bytes(max_step / 63.0));
    blk[2..4].copy_from_slice(&f16_bytes(max_min / 63.0));
    pack_q4k_scales(&sc, &mn, &mut blk[4..16]);
    (d, dmin, sc, mn)
}

/// The code `0..=top` nearest to `v` under the coded scale `dq` and min `dm`
/// (0 where the scale is 0).
#[inline]
pub(crate) fn nearest_code(v: f32, dq: f32, dm: f32, top: i32) -> u8 {
    if dq > 0.0 {
        nearest((v + dm) / dq).clamp(0, top) as u8
    } else {
        0
    }
}

/// The fixed-order dot product part of one super-block with 6-bit scales and
/// mins in Q4_K's header (`blk[0..16]`) and the unsigned values that
/// `unpack(j, v)` writes for sub-block `j`, shared by Q4_K and Q5_K:
/// sub-block `j`'s lanes `acc[8 · (j mod 2) + l] = fma((d · sc[j]) · dx,
/// Σ q · x̂, ·)` for `j` in increasing order, then the min term
/// `acc[l] = fma(−((dmin · mn[l]) · dx), S, acc[l])` (`S = Σ x̂` over
/// activation block `l`) for `l < 8`.
#[inline(always)]
pub(crate) fn dot_scaled_min(
    blk: &[u8],
    unpack: impl Fn(usize, &mut [i8; 32]),
    xq: &[i8],
    xs: &[f32],
    sums: &[f32],
    acc: &mut LaneAcc,
) {
    let (d, dmin) = (f16_at(&blk[0..]), f16_at(&blk[2..]));
    let (sc, mn) = q4k_scales(&blk[4..16]);
    let mut v = [0i8; 32];
    for j in 0..SUB {
        let s = (d * f32::from(sc[j])) * xs[j];
        unpack(j, &mut v);
        let p = lane_sums(&v, &xq[j * QK..(j + 1) * QK]);
        fma_lanes(s, &p, &mut acc[LANES * (j % 2)..LANES * (j % 2) + LANES]);
    }
    for (l, a) in acc[..LANES].iter_mut().enumerate() {
        let t = (dmin * f32::from(mn[l])) * xs[l];
        *a = (-t).mul_add(sums[l], *a);
    }
}

/// Sub-block `j`'s 32 nibbles (`qs` the 128 value bytes) into `v`.
#[inline(always)]
pub(crate) fn unpack_q4k(qs: &[u8], j: usize, v: &mut [i8; 32]) {
    let run: &[u8; 32] = qs[32 * (j / 2)..32 * (j / 2) + 32]
        .try_into()
        .expect("a run of 32");
    let shift = 4 * (j % 2);
    for (v, &b) in v.iter_mut().zip(run) {
        *v = ((b >> shift) & 0x0f) as i8;
    }
}

/// The nibble of element `k` of Q4_K sub-block `j` (`qs` the 128 value bytes).
#[inline(always)]
pub(crate) fn q4k_value(qs: &[u8], j: usize, k: usize) -> u8 {
    let b = qs[32 * (j / 2) + k];
    if j.is_multiple_of(2) {
        b & 0x0f
    } else {
        b >> 4
    }
}

impl BlockFormat for Q4_K {
    const ELEMS: usize = 256;
    const BYTES: usize = Q4K_BYTES;
    // the nibbles are unsigned values already
    const ACT_OFFSET: i32 = 0;
    // the min term takes each activation block's sum
    const NEEDS_SUMS: bool = true;
    const PAIRED_LANES: bool = true;

    /// Quantizes 256 values into one Q4_K super-block (see
    /// `docs/QUANTIZATION.md` for the rule): per sub-block of 32, the range
    /// `[min(0, min x), max x]` is split into 15 steps; the step sizes and the
    /// mins are coded with 6 bits against the super-block's f16 `d = max step / 63`
    /// and `dmin = max min / 63`; each value then takes the nibble nearest to it
    /// under the coded (f16-rounded) scale and min.
    fn quantize(x: &[f32], blk: &mut [u8]) {
        let (d, dmin, sc, mn) = code_sub_blocks(x, 15.0, blk);
        let qs = &mut blk[16..Q4K_BYTES];
        qs.fill(0);
        for (j, xs) in x.chunks_exact(QK).enumerate().take(SUB) {
            let dq = d * f32::from(sc[j]);
            let dm = dmin * f32::from(mn[j]);
            for (k, &v) in xs.iter().enumerate() {
                let n = nearest_code(v, dq, dm, 15);
                qs[32 * (j / 2) + k] |= if j.is_multiple_of(2) { n } else { n << 4 };
            }
        }
    }

    /// Dequantizes one Q4_K super-block into 256 values:
    /// `(d · sc[j]) · q − dmin · mn[j]` (the two products are exact, the
    /// difference is one rounding).
    fn dequantize(blk: &[u8], out: &mut [f32]) {
        let (d, dmin) = (f16_at(&blk[0..]), f16_at(&blk[2..]));
        let (sc, mn) = q4k_scales(&blk[4..16]);
        let qs = &blk[16..Q4K_BYTES];
        for (j, o) in out.chunks_exact_mut(QK).enumerate().take(SUB) {
            let (dj, mj) = (d * f32::from(sc[j]), dmin * f32::from(mn[j]));
            for (k, o) in o.iter_mut().enumerate() {
                *o = dj * f32::from(q4k_value(qs, j, k)) - mj;
            }
        }
    }

    /// Sub-block `j`'s lanes `acc[8 · (j mod 2) + l] = fma((d · sc[j]) · dx,
    /// Σ q · x̂, ·)` for `j` in increasing order, then the min term
    /// `acc[l] = fma(−((dmin · mn[l]) · dx), S, acc[l])` (`S = Σ x̂` over
    /// activation block `l`) for `l < 8`.
    #[inline(always)]
    fn dot_block(blk: &[u8], xq: &[i8], xs: &[f32], sums: &[f32], acc: &mut LaneAcc) {
        let qs = &blk[16..];
        dot_scaled_min(blk, |j, v| unpack_q4k(qs, j, v), xq, xs, sums, acc);
    }
}
