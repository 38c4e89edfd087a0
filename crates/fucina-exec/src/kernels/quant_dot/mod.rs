//! The activations of the quantized products (int8 blocks of 32) and the
//! vector kernels of the block-of-32 formats Q8_0, Q4_0, Q5_0, Q4_1, Q5_1 and
//! IQ4_NL (llama.cpp's layouts, read in place; their block coding and portable
//! dot are in `quant_block`, and the formats with a min add its term to lane 0
//! after each block, as their `dot_block` does).
//!
//! # The activations
//! Each activation row is cut into blocks of 32 and quantized once per call
//! ([`quantize_row`]): `d = amax / 127` (an f32, not rounded to f16),
//! `q = round(x / d)` (half away from zero, clamped to `-127..=127`). For every
//! lane of four elements the kernels also get `-offset · Σ q` over the lane
//! (`offset` the weight format's `BlockFormat::ACT_OFFSET`: 128 for Q8_0, 8 for Q4_0), so that an unsigned × signed
//! byte product (`vpdpbusd`, `vpmaddubsw`) gives the signed sum.
//!
//! # The order (the same bits on every path)
//! For one output, block `b` of the weight row (scale `dw`, f16 widened to f32)
//! and of the activation row (scale `dx`) gives eight exact integer lane sums
//! `p[l] = Σ_{k = 4l..4l+3} w[k] · x[k]` (|p| < 2^17, exact in f32) and the f32
//! product `s = dw · dx`. Eight f32 lane accumulators take
//! `acc[l] = fma(s, p[l], acc[l])` for `b` in increasing order; then the lanes
//! fold in halves (`l + 4` into `l`, then `l + 2`, then `l + 1`). Every path
//! (portable scalar, AVX2 `vpmaddubsw`/`vpmaddwd`, AVX-512 VNNI `vpdpbusd`)
//! computes exactly these operations, so a result is the same bits on every path,
//! for every split of the rows among threads and for every batch size.

use std::ops::Range;

use super::quant_block::BlockFormat;

/// Elements per block.
pub(crate) const QK: usize = 32;
/// Lane accumulators of the fixed order (four elements per lane).
pub(crate) const LANES: usize = 8;

/// The activations of one call after [`quantize_row`]: row `i`'s block `b` is
/// `q[i * cols + 32 b..][..32]`, its scale `scale[i * nb + b]`, its lane biases
/// `bias[(i * nb + b) * 8..][..8]` (`nb = cols / 32`).
#[derive(Clone, Copy)]
pub(crate) struct Acts<'a> {
    /// Quantized values, `[m, cols]`.
    pub q: &'a [i8],
    /// Block scales, `[m, nb]`.
    pub scale: &'a [f32],
    /// Lane biases `-offset · Σ q` over each lane, `[m, nb, 8]`.
    pub bias: &'a [i32],
    /// Elements per row (a multiple of 32).
    pub cols: usize,
}

/// Quantizes one activation row `x` (a multiple of 32 long) into `q`, `scale` and
/// `bias` (see [`Acts`]). A block holding a non-finite value gets a NaN scale,
/// so every output of the row is NaN.
///
/// Runs at the current vector level; every step is exact or one IEEE rounding
/// (the product `x · (1 / d)`), and the rounding to an integer is done exactly
/// (truncate, then compare the exact remainder with ±0.5: ties away from zero,
/// as `f32::round`), so every level gives the same values.
pub(crate) fn quantize_row(
    x: &[f32],
    offset: i32,
    q: &mut [i8],
    scale: &mut [f32],
    bias: &mut [i32],
) {
    super::simd::vectorized!(quantize_row_body(x, offset, q, scale, bias))
}

#[inline(always)]
fn quantize_row_body(x: &[f32], offset: i32, q: &mut [i8], scale: &mut [f32], bias: &mut [i32]) {
    let blocks = x
        .chunks_exact(QK)
        .zip(q.chunks_exact_mut(QK))
        .zip(scale.iter_mut())
        .zip(bias.chunks_exact_mut(LANES));
    for (((xb, qb), sc), bl) in blocks {
        let xb: &[f32; QK] = xb.try_into().expect("a block of 32");
        // The largest magnitude, in eight lanes (max is exact and
        // associative over non-NaN values; a NaN or infinity is flagged).
        let mut lanes = [0.0f32; LANES];
        let mut bad = 0u32;
        for c in xb.chunks_exact(LANES) {
            for (m, &v) in lanes.iter_mut().zip(c) {
                bad |= u32::from(v.to_bits() & 0x7f80_0000 == 0x7f80_0000);
                let a = v.abs();
                *m = if a > *m { a } else { *m };
            }
        }
        let amax = lanes.iter().fold(0.0f32, |m, &a| if a > m { a } else { m });
        let (d, id) = if bad != 0 {
            (f32::NAN, 0.0)
        } else {
            let d = amax / 127.0;
            (d, if d != 0.0 { 1.0 / d } else { 0.0 })
        };
        *sc = d;
        let mut qi = [0i32; QK];
        for (o, &v) in qi.iter_mut().zip(xb) {
            // |y| <= 127 (plus rounding) for a finite block; the clamp also
            // maps the NaN of a non-finite one to a number
            // (not `clamp`, which passes a NaN through)
            #[allow(clippy::manual_clamp)]
            let y = (v * id).max(-128.0).min(128.0);
            // SAFETY: y is finite and within ±128, so it fits an i32.
            let t = unsafe { y.to_int_unchecked::<i32>() };
            let r = y - t as f32;
            let t = t + i32::from(r >= 0.5) - i32::from(r <= -0.5);
            *o = t.clamp(-127, 127);
        }
        for (o, &v) in qb.iter_mut().zip(&qi) {
            *o = v as i8;
        }
        for (l, b) in bl.iter_mut().enumerate() {
            *b = -offset * (qi[4 * l] + qi[4 * l + 1] + qi[4 * l + 2] + qi[4 * l + 3]);
        }
    }
}

/// An IEEE binary16 bit pattern widened to f32 (exact).
#[inline]
pub(crate) fn f16_to_f32(bits: u16) -> f32 {
    fucina_storage::half::f16::from_bits(bits).to_f32()
}

/// Which kernel a call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    /// Plain Rust, any CPU.
    Portable,
    /// AVX2 `vpmaddubsw` + `vpmaddwd` (needs AVX2, FMA, F16C).
    Avx2,
    /// AVX-512 VNNI `vpdpbusd` on 256-bit vectors (needs AVX-512 F/BW/VL/VNNI, FMA, F16C).
    Vnni,
}

/// The path for the features the current vector level enables
/// ([`super::simd::CpuFeatures::enabled`]): VNNI where AVX-512 F/BW/VL/VNNI,
/// AVX2, FMA and F16C are all enabled, AVX2 where AVX2, FMA and F16C are,
/// portable otherwise.
pub(crate) fn path() -> Path {
    use super::simd::CpuFeatures as F;
    let avx2 = F::AVX2.with(F::FMA).with(F::F16C);
    let vnni = avx2
        .with(F::AVX512F)
        .with(F::AVX512BW)
        .with(F::AVX512VL)
        .with(F::AVX512VNNI);
    super::simd::choose(&[(Path::Vnni, vnni), (Path::Avx2, avx2)], Path::Portable)
}

/// Where a block-of-32 format's fields sit, for the vector kernels (its
/// bytes, activation offset and min are its `BlockFormat` constants).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    /// Offset of the values (Q8_0's bytes or the nibbles).
    pub values: usize,
    /// Offset of the 32 high bits (the Q5 formats).
    pub high: Option<usize>,
    /// Whether the values are signed bytes (Q8_0, the table values of
    /// IQ4_NL), else unsigned codes with the activations' lane bias.
    pub signed: bool,
    /// Whether the nibbles index the non-linear table (IQ4_NL).
    pub table: bool,
}

impl Shape {
    /// Whether the values are 16 bytes of nibbles (every format but Q8_0).
    pub(crate) const fn nibbles(self) -> bool {
        !self.signed || self.table
    }
}

/// A block-of-32 format the vector kernels of this module and the strip
/// layout (`quant_packed`) take: an f16 scale first, then (for Q4_1, Q5_1,
/// `NEEDS_SUMS`) an f16 min, and the fields its [`Shape`] places.
pub(crate) trait Block32: BlockFormat {
    /// Where its fields sit.
    const SHAPE: Shape;
}

/// Computes the outputs of weight rows `rows` for all `m` activation rows
/// with the vector kernels of the current level, for the block-of-32 format
/// `F`: `out_t[(j - rows.start) * m + i] = dot(w row j,
/// activation row i)` in the format's fixed order (its `dot_block`); `false`
/// (nothing written) at the portable level. `sums` are the activation block
/// sums (read only by the formats with a min).
///
/// The operands must pass `quant_block::quant_rows`'s bounds checks (its
/// callers' contract).
pub(crate) fn simd_rows<F: Block32>(
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &Acts<'_>,
    sums: &[f32],
    m: usize,
    out_t: &mut [f32],
) -> bool {
    match path() {
        #[cfg(target_arch = "x86_64")]
        Path::Vnni => {
            // SAFETY: `path` returns Vnni only when the CPU has every feature
            // `x86_avx512::rows_vnni` enables; `quant_block::quant_rows` checked the
            // bounds contract.
            unsafe { x86_avx512::rows_vnni::<F>(w, row_bytes, rows, acts, sums, m, out_t) };
            true
        }
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => {
            // SAFETY: `path` returns Avx2 only when the CPU has AVX2, FMA and
            // F16C; `quant_block::quant_rows` checked the bounds contract.
            unsafe { x86_avx2::rows_avx2::<F>(w, row_bytes, rows, acts, sums, m, out_t) };
            true
        }
        _ => {
            let _ = (w, row_bytes, rows, acts, sums, m, out_t);
            false
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_avx2;
#[cfg(target_arch = "x86_64")]
mod x86_avx512;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::simd::{self, SimdLevel};

    /// The exact integer rounding equals `f32::round` (ties away from zero),
    /// at every level, on ties, near-ties and the ends of the range.
    #[test]
    fn activation_rounding_is_round_half_away_from_zero() {
        // amax 127 makes d = 1 and 1 / d = 1: q = round(x) directly
        let mut x = [
            127.0,
            -127.0,
            0.5,
            -0.5,
            1.5,
            -1.5,
            2.5,
            -2.5,
            0.499_999_97,
            -0.499_999_97,
            126.5,
            -126.5,
            3.0,
            0.0,
            -0.0,
            1e-30,
            63.5,
            -63.5,
            2.499_999_8,
            7.5,
            -7.5,
            100.5,
            0.75,
            -0.25,
            5.5,
            -5.5,
            9.499_999,
            11.5,
            -11.5,
            13.5,
            -13.5,
            15.5,
        ];
        let best = simd::detected();
        for level in SimdLevel::available() {
            simd::force(level);
            for sign in [1.0f32, -1.0] {
                for v in &mut x {
                    *v *= sign;
                }
                let (mut q, mut s, mut b) = ([0i8; 32], [0.0f32; 1], [0i32; 8]);
                quantize_row(&x, 128, &mut q, &mut s, &mut b);
                assert_eq!(s[0], 1.0);
                for (k, (&qv, &xv)) in q.iter().zip(&x).enumerate() {
                    assert_eq!(f32::from(qv), xv.round(), "elem {k} = {xv} at {level:?}");
                }
                for l in 0..8 {
                    let sum: i32 = q[4 * l..4 * l + 4].iter().map(|&v| i32::from(v)).sum();
                    assert_eq!(b[l], -128 * sum);
                }
            }
        }
        simd::force(best);
    }
}
