//! The vector kernels of the super-block ("K") formats Q2_K, Q3_K, Q4_K,
//! Q5_K, Q6_K and of IQ4_XS (their layouts and block coding are in
//! `quant_block`), read in place. `quant_matmul` runs them on the
//! super-block activations of [`q8k`] (llama.cpp's Q8_K: one scale per 256,
//! the sub-block scales and mins applied as integers), in the order of its
//! docs; their `BlockFormat` dot with activations in blocks of 32 is the
//! trait's portable loop (`quant_block::portable_rows`), which no product of
//! these formats takes.
//!
//! | file | what it holds |
//! |---|---|
//! | `q8k.rs` | the super-block activations, their order, the portable product and its dispatch |
//! | `q8k_x86.rs` | the AVX2 tile of that product (also compiled for AVX-512 VNNI) |
//! | `q8k_zmm.rs` | the AVX-512 VNNI tile of that product for one activation row (batch-1 decode: two sub-blocks per 512-bit `vpmaddubsw` / `vpdpwssd`; Q4_K, Q5_K, Q6_K, the others on the AVX2 tile's lanes) |
//! | `q8k_gemm.rs` | the AVX-512 VNNI GEMM of that product for many activation rows (unpacked tiles of 16 weight rows, `vpdpbusd` with broadcast activations), and the driver both GEMMs share (generic over their micro-kernel) |
//! | `q8k_gemm_avx2.rs` | the AVX2 twin of that GEMM (`vpmaddubsw` summed in 16 bits over spans that cannot overflow, `vpmaddwd` by the scale pairs; tiles of 16 weight rows as two halves of 8, three activation rows per micro-kernel; every K format and IQ4_XS, whose values it reads signed) |
//! | `q4k_packed.rs` (`q4k_packed/x86.rs`) | Q4_K repacked in strips of eight rows (`PackedQuantMatrix`): the layout, its repacking, the strip tiles (AVX-512 VNNI up to four activation rows, AVX2 up to two; one 64-byte load feeds eight rows), the portable path and the GEMMs over it |
//! | `mod.rs` | these docs, [`quantize_acts`] (blocks of 32 with their sums, for the formats of blocks of 32 with a min) |
//! | `x86.rs` | what the x86 tiles share: the tile driver, the weights' addresses and prefetch, the f16 scale pair |

use super::quant_dot::{self, LANES, QK};

pub(crate) mod q4k_packed;
pub(crate) mod q8k;
#[cfg(target_arch = "x86_64")]
mod q8k_gemm;
#[cfg(target_arch = "x86_64")]
mod q8k_gemm_avx2;
#[cfg(target_arch = "x86_64")]
mod q8k_x86;
#[cfg(target_arch = "x86_64")]
mod q8k_zmm;
#[cfg(target_arch = "x86_64")]
mod x86;

/// Weights per super-block.
pub(crate) const QK_K: usize = 256;

/// Quantizes the `m` activation rows of `x` for a product whose dot needs
/// the activation block sums (`BlockFormat::NEEDS_SUMS`): as
/// `quant_dot::quantize_row` (blocks of 32, f32 scale), with the format's
/// `offset` (its `BlockFormat::ACT_OFFSET`), plus `sums[i * nb + b] = Σ x̂`
/// over each block (exact, for the min term of Q4_1 and Q5_1).
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
