//! The vector kernels of the super-block ("K") formats Q4_K, Q5_K, Q6_K,
//! Q3_K, Q2_K and IQ4_XS (their layouts and block coding are in
//! `quant_block`), read in place. `quant_matmul` runs Q4_K, Q5_K and Q6_K on
//! the super-block activations of [`q8k`] (one scale per 256, the sub-block
//! scales as integers); Q3_K, Q2_K and IQ4_XS on activations quantized to
//! int8 blocks of 32 (see `quant_dot`), in the order below (which the
//! `BlockFormat` dot of Q4_K, Q5_K and Q6_K also keeps).
//!
//! | file | what it holds |
//! |---|---|
//! | `q8k.rs` | the super-block activations, their order, the portable product and its dispatch |
//! | `q8k_x86.rs` | the AVX2 tile of that product (also compiled for AVX-512 VNNI) |
//! | `q8k_gemm.rs` | the AVX-512 VNNI GEMM of that product for many activation rows (unpacked tiles of 16 weight rows, `vpdpbusd` with broadcast activations) |
//! | `q8k_gemm_avx2.rs` | the AVX2 twin of that GEMM (`vpmaddubsw` summed in 16 bits over spans that cannot overflow, `vpmaddwd` by the scale pairs; tiles of 16 weight rows as two halves of 8, three activation rows per micro-kernel) |
//! | `mod.rs` | these docs, [`KVector`] (a format's kernel traits and min term), the dispatch [`simd_rows`], [`quantize_acts`] |
//! | `x86.rs` | what both x86 kernels share: the tile driver, bounds checks, the lane fold, the group sums |
//! | `x86_avx2.rs` | the AVX2 tile (`vpmaddubsw`/`vpmaddwd`) and each format's sub-block decoding for it |
//! | `x86_avx512.rs` | the AVX-512 VNNI tile (`vpdpbusd`) and each format's decoding of a pair of sub-blocks |
//!
//! # The order of a dot product (the same bits on every path)
//! An activation block of 32 (scale `dx`, int8 values) meets one sub-block of
//! 32 weights. Its eight lanes of four give exact integer sums
//! `p[l] = Σ q · x` (Q4_K: the nibbles `0..=15`; Q5_K: `0..=31`; Q6_K:
//! `q − 32`; Q3_K: `−4..=3`; Q2_K: `0..=3`; IQ4_XS: the table values
//! `−127..=113`). Each lane has an exact f32 weight scale: per sub-block `j`
//! for Q4_K and Q5_K (`d · sc[j]`) and IQ4_XS (`d · (ls[j] − 32)`), per group
//! of 16 for Q6_K (`d · scales[g]`), Q3_K (`d · (ls[g] − 32)`) and Q2_K
//! (`d · sc[g]`), lanes 0..4 the sub-block's first group and lanes 4..8 its
//! second. With `s = (weight scale) · dx` (one rounding), sixteen lane
//! accumulators take `acc[8 · (j mod 2) + l] = fma(s, p[l], acc[8 · (j mod 2) + l])`:
//! the even sub-blocks `j` in lanes 0..8, the odd ones in lanes 8..16 (so that
//! a 512-bit vector holds a pair of sub-blocks), sub-block after sub-block in
//! increasing order. A format with mins then closes each super-block with its
//! [`MinTerm`]: Q4_K and Q5_K lane `l < 8` taking sub-block `l`'s
//! (`acc[l] = fma(−t, S, acc[l])` with `t = (dmin · mn[l]) · dx` and `S = Σ x`
//! over that activation block, exact), Q2_K lane `g < 16` taking group `g`'s
//! (`t = (dmin · mn[g]) · dx` of the group's activation block, `S = Σ x` over
//! the group of 16). At the end `acc[l] += acc[l + 8]` for `l < 8`, and the
//! eight lanes fold in halves as in `quant_dot`. Every path (portable, AVX2
//! `vpmaddubsw`/`vpmaddwd`, AVX-512 VNNI `vpdpbusd`) performs exactly these
//! IEEE operations in this order.
//!
//! # Unsigned × signed bytes
//! `vpmaddubsw` and `vpdpbusd` multiply unsigned weight bytes by the signed
//! activations. Formats whose values are signed read them as
//! `q + BlockFormat::ACT_OFFSET` (Q6_K `+ 32`, Q3_K `+ 4`, IQ4_XS `+ 128`)
//! and start each lane's sum from the activation lane bias
//! `−ACT_OFFSET · Σ x`. On AVX2, IQ4_XS instead uses the sign trick
//! (`|q| · (x · sign q)`): `241 · 127` pairs would saturate `vpmaddubsw`'s
//! 16-bit sums, `127 · 127` pairs do not. Either way the integer lane sums are
//! exact, so they equal the portable ones.

use std::ops::Range;

#[cfg(not(target_arch = "x86_64"))]
use super::quant_block::BlockFormat;
use super::quant_block::{IQ4_XS, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K};
use super::quant_dot::{self, Acts, LANES, QK};

pub(crate) mod q8k;
#[cfg(target_arch = "x86_64")]
mod q8k_gemm;
#[cfg(target_arch = "x86_64")]
mod q8k_gemm_avx2;
#[cfg(target_arch = "x86_64")]
mod q8k_x86;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_avx2;
#[cfg(target_arch = "x86_64")]
mod x86_avx512;

/// Weights per super-block.
pub(crate) const QK_K: usize = 256;
/// Sub-blocks of 32 per super-block.
const SUB: usize = QK_K / QK;

/// The term a K format adds at the end of each super-block (see the module
/// docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MinTerm {
    /// No min term (Q6_K, Q3_K, IQ4_XS).
    None,
    /// Lane `l < 8` takes sub-block `l`'s min, with the activation block sums
    /// of [`quantize_acts`] (Q4_K, Q5_K).
    Sub,
    /// Lane `g < 16` takes group `g`'s min, with the sum of the group's 16
    /// activations (Q2_K).
    Group,
}

/// A K format with vector kernels: its min term, and on x86-64 its decoding
/// for the AVX2 and AVX-512 VNNI tiles.
#[cfg(target_arch = "x86_64")]
pub(crate) trait KVector: x86_avx2::Avx2Sub + x86_avx512::VnniPair {
    /// The super-block's closing term.
    const MIN: MinTerm;
}

/// A K format with vector kernels: its min term (no kernels on this
/// architecture).
#[cfg(not(target_arch = "x86_64"))]
pub(crate) trait KVector: BlockFormat {
    /// The super-block's closing term.
    const MIN: MinTerm;
}

impl KVector for Q4_K {
    const MIN: MinTerm = MinTerm::Sub;
}
impl KVector for Q5_K {
    const MIN: MinTerm = MinTerm::Sub;
}
impl KVector for Q6_K {
    const MIN: MinTerm = MinTerm::None;
}
impl KVector for Q3_K {
    const MIN: MinTerm = MinTerm::None;
}
impl KVector for Q2_K {
    const MIN: MinTerm = MinTerm::Group;
}
impl KVector for IQ4_XS {
    const MIN: MinTerm = MinTerm::None;
}

/// Quantizes the `m` activation rows of `x` for a K-format product: as
/// `quant_dot::quantize_row` (blocks of 32, f32 scale), with the format's
/// `offset` (its `BlockFormat::ACT_OFFSET`), plus `sums[i * nb + b] = Σ x̂` over each block (exact, for
/// Q4_K's min term).
#[allow(clippy::too_many_arguments)]
pub(crate) fn quantize_acts(
    x: &[f32],
    m: usize,
    cols: usize,
    offset: i32,
    xq: &mut [i8],
    xs: &mut [f32],
    xb: &mut [i32],
    sums: &mut [f32],
) {
    let nb = cols / QK;
    for i in 0..m {
        let q = &mut xq[i * cols..(i + 1) * cols];
        quant_dot::quantize_row(
            &x[i * cols..(i + 1) * cols],
            offset,
            q,
            &mut xs[i * nb..(i + 1) * nb],
            &mut xb[i * nb * LANES..(i + 1) * nb * LANES],
        );
        for (s, qb) in sums[i * nb..(i + 1) * nb]
            .iter_mut()
            .zip(q.chunks_exact(QK))
        {
            *s = qb.iter().map(|&v| i32::from(v)).sum::<i32>() as f32;
        }
    }
}

/// Computes the outputs of weight rows `rows` for all `m` activation rows
/// with the vector kernels of the current level for the K format `F`, as
/// [`BlockFormat::rows`](super::quant_block::BlockFormat::rows) does; `false` (nothing written) at the portable
/// level. `acts` and `sums` come from [`quantize_acts`] (or the plain
/// activation quantization, for a format without [`MinTerm::Sub`]) with the
/// format's offset.
///
/// The operands must pass `quant_block::quant_rows`'s bounds checks (its
/// callers' contract).
#[allow(clippy::too_many_arguments)]
pub(crate) fn simd_rows<F: KVector>(
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &Acts<'_>,
    sums: &[f32],
    m: usize,
    out_t: &mut [f32],
) -> bool {
    match quant_dot::path() {
        #[cfg(target_arch = "x86_64")]
        quant_dot::Path::Vnni => {
            // SAFETY: `path` returns Vnni only when the CPU has every feature
            // `rows_vnni` enables; `quant_block::quant_rows` checked the
            // bounds contract.
            unsafe { x86_avx512::rows_vnni::<F>(w, row_bytes, rows, acts, sums, m, out_t) };
            true
        }
        #[cfg(target_arch = "x86_64")]
        quant_dot::Path::Avx2 => {
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
