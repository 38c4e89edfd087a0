//! What the x86-64 kernels of the super-block activation product share
//! (`q8k_x86`): the tile driver (`quant_dot`'s: tiles of `R` weight rows ×
//! `M` activation rows, each super-block's weights decoded once for the `M`
//! rows), the weights' addresses with their prefetch, and the f16 scale pair.

use std::arch::x86_64::*;

use crate::kernels::quant_block::BlockFormat;

/// How far ahead of the super-block being read the weights are prefetched.
pub(super) const PREFETCH_BYTES: usize = 768;

/// The tile driver of every in-place quantized kernel (`quant_dot`'s): tiles
/// of up to `$mt` activation rows and four weight rows, prefill-sized calls
/// in L2-sized chunks of activation rows.
pub(super) use crate::kernels::quant_dot::x86::drive;

/// The addresses of super-block `sb` of weight rows `j0..j0 + R`, the weights
/// [`PREFETCH_BYTES`] ahead of each prefetched. Each address is valid for
/// reading `F::BYTES` bytes when the tile's bounds check passed.
#[inline(always)]
pub(super) fn super_blocks<F: BlockFormat, const R: usize>(
    w: &[u8],
    row_bytes: usize,
    j0: usize,
    sb: usize,
) -> [*const u8; R] {
    let mut blks = [std::ptr::null::<u8>(); R];
    for (r, b) in blks.iter_mut().enumerate() {
        // wrapping arithmetic: computing the address reads nothing (the tile's
        // bounds check covers every read through it)
        let blk = w
            .as_ptr()
            .wrapping_add((j0 + r) * row_bytes + sb * F::BYTES);
        *b = blk;
        for l in 0..F::BYTES.div_ceil(64) {
            // SAFETY: SSE is part of the x86-64 baseline, and a prefetch never
            // faults, whatever the address.
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(PREFETCH_BYTES + 64 * l).cast());
                // the same super-block of the next tile's row into L2: the
                // tile's rows are short streams the hardware prefetcher
                // does not run ahead of
                _mm_prefetch::<_MM_HINT_T1>(blk.wrapping_add(R * row_bytes + 64 * l).cast());
            };
        }
    }
    blks
}

/// The two f16 values at `p`, widened.
///
/// # Safety
/// `p` must be valid for reading four bytes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn f16_pair(p: *const u8) -> (f32, f32) {
    // SAFETY: four readable bytes (the caller's contract).
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(unsafe {
        p.cast::<i32>().read_unaligned()
    }));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}
