//! The pieces the x86-64 kernels of the block-of-32 formats share: the tile
//! driver (tiles of `R` weight rows × `M` activation rows, each weight block
//! loaded and unpacked once for the `M` rows, each activation block once for
//! the `R` rows, one 8-lane f32 accumulator per output), the prefetch, the
//! unpacking of a weight block into bytes, the activation block loads and the
//! folds, in the fixed order of the module documentation (plus, for the
//! formats with a min, the min term on lane 0 after each block, as their
//! `dot_block`). The kernels are in `x86_avx2` and `x86_avx512`.

use std::arch::x86_64::*;

use super::{Acts, Block32, LANES, QK};
use crate::kernels::quant_block::iq4_nl::KVALUES;

/// Weight rows per tile.
pub(crate) const R_TILE: usize = 4;

/// Runs `$tile::<$k, R, M>` over `rows` × `0..m` in tiles of up to `$mt`
/// activation rows and [`R_TILE`] weight rows (single rows at the end),
/// writing `out_t[(j - rows.start) * m + i]`: weight rows outermost, so a
/// tile's weight rows stay in cache across the activation rows, and the
/// activation rows of a prefill-sized call in chunks of [`act_chunk`] that
/// stay in L2 while the range's weight rows pass over them. `$k` is the
/// format type parameter of `$tile` (a [`Block32`] here, a `KVector` in
/// `quant_k`): the driver of every in-place quantized tile.
macro_rules! drive {
    ($tile:ident, $mt:expr, $k:ident, $w:ident, $row_bytes:ident, $rows:ident, $acts:ident, $sums:ident, $m:ident, $out_t:ident) => {{
        use $crate::kernels::quant_dot::x86::{R_TILE, act_chunk};
        let start = $rows.start;
        let chunk = act_chunk($acts.cols);
        let mut c0 = 0;
        while c0 < $m {
            let c1 = ($m - c0).min(chunk) + c0;
            let mut j = $rows.start;
            while j < $rows.end {
                let r = if $rows.end - j >= R_TILE { R_TILE } else { 1 };
                let mut i = c0;
                while i < c1 {
                    let mm = (c1 - i).min($mt);
                    macro_rules! run {
                        ($r:literal, $mm:literal) => {{
                            let res = $tile::<$k, $r, $mm>($w, $row_bytes, j, $acts, $sums, i);
                            for (rr, row) in res.iter().enumerate() {
                                let o = (j - start + rr) * $m + i;
                                $out_t[o..o + $mm].copy_from_slice(row);
                            }
                        }};
                    }
                    match (r, mm) {
                        (R_TILE, 1) => run!(4, 1),
                        (R_TILE, 2) => run!(4, 2),
                        (R_TILE, 3) => run!(4, 3),
                        (R_TILE, _) => run!(4, 4),
                        (_, 1) => run!(1, 1),
                        (_, 2) => run!(1, 2),
                        (_, 3) => run!(1, 3),
                        (_, _) => run!(1, 4),
                    }
                    i += mm;
                }
                j += r;
            }
            c0 = c1;
        }
    }};
}
pub(crate) use drive;

/// How far ahead of the block being read the weights are prefetched.
pub(super) const PREFETCH_BYTES: usize = 640;

/// Activation rows per chunk of a prefill-sized call: about 192 KiB of
/// their values, lane biases and scales (`2.125 · cols` bytes a row), so
/// that a chunk stays in L2 while the range's weight rows pass over it; a
/// multiple of 4 (the widest tile), at least 4.
pub(crate) fn act_chunk(cols: usize) -> usize {
    let per_row = cols * 2 + cols / 8;
    ((192 << 10) / per_row.max(1)).max(4) / 4 * 4
}

/// A hint to bring the weight line [`PREFETCH_BYTES`] past `blk` into L1
/// (the rows are read in streams; the hint keeps several misses in flight).
/// With it, a hint to bring the same place `ahead` bytes on (the next
/// tile's row) into L2: a tile's rows are short streams that the hardware
/// prefetcher does not run ahead of.
#[inline(always)]
pub(super) fn prefetch(blk: *const u8, ahead: usize) {
    // SAFETY: a prefetch never faults and reads nothing observable; the
    // addresses are computed with wrapping arithmetic, never dereferenced.
    unsafe {
        _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(PREFETCH_BYTES).cast());
        _mm_prefetch::<_MM_HINT_T1>(blk.wrapping_add(ahead).cast());
    }
}

/// The block's f16 scale and (lane 1) the f16 that follows it (the min
/// of the formats with one), widened to f32.
///
/// # Safety
/// `p` must be valid for reading eight bytes (a block is at least 18).
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn scale_min_at(p: *const u8) -> (f32, f32) {
    // SAFETY: the caller guarantees eight readable bytes; lanes 2 and 3
    // (the block's next bytes) are unused.
    let v = _mm_cvtph_ps(unsafe { _mm_loadl_epi64(p.cast()) });
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

/// A block's 32 weight values in element order as bytes: Q8_0 values as
/// they are (signed); nibbles unpacked (low nibbles = elements 0..15, high
/// nibbles = 16..31), with the fifth bits of the Q5 formats (unsigned
/// `0..=31`), or looked up in IQ4_NL's table (signed).
///
/// # Safety
/// `blk` must be valid for reading one block of format `K`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn block_values<F: Block32>(blk: *const u8) -> __m256i {
    let sh = F::SHAPE;
    if sh.signed && !sh.table {
        // SAFETY: 32 readable value bytes (the caller's contract).
        return unsafe { _mm256_loadu_si256(blk.add(sh.values).cast()) };
    }
    // SAFETY: 16 readable nibble bytes (the caller's contract).
    let raw = _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(blk.add(sh.values).cast()) });
    // the upper copy shifted by 4 within each 32-bit lane: after the
    // mask, byte k of it holds byte k's high nibble
    let both = _mm256_srlv_epi32(raw, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    let nib = _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
    if sh.table {
        let mut t = [0u8; 16];
        for (t, &v) in t.iter_mut().zip(&KVALUES) {
            *t = v as u8;
        }
        // SAFETY: `t` is 16 bytes.
        let table = _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(t.as_ptr().cast()) });
        return _mm256_shuffle_epi8(table, nib);
    }
    match sh.high {
        Some(off) => {
            // SAFETY: the four bytes of high bits are inside the block.
            let qh = unsafe { blk.add(off).cast::<u32>().read_unaligned() };
            _mm256_or_si256(nib, high_bits(qh))
        }
        None => nib,
    }
}

/// Byte `k` = 16 where bit `k` of `qh` is set, else 0 (the Q5 formats'
/// fifth bits, ready to be or-ed into their nibbles).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn high_bits(qh: u32) -> __m256i {
    let v = _mm256_set1_epi32(qh as i32);
    // byte k takes byte k / 8 of qh
    let spread = _mm256_shuffle_epi8(
        v,
        _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        ),
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// The eight lanes folded in halves (l + 4, l + 2, l + 1), as in the
/// portable order.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn fold(v: __m256) -> f32 {
    let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let q = _mm_add_ps(h, _mm_movehl_ps(h, h));
    _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps::<0b01>(q, q)))
}

/// Checks a tile's reads against the slices (once per tile, not per block).
#[inline(always)]
pub(super) fn check_tile<F: Block32, const R: usize, const M: usize>(
    w: &[u8],
    row_bytes: usize,
    j0: usize,
    acts: &Acts<'_>,
    sums: &[f32],
    i0: usize,
) {
    let nb = acts.cols / QK;
    assert!(row_bytes == nb * F::BYTES, "quant tile: row bytes");
    assert!((j0 + R) * row_bytes <= w.len(), "quant tile: weight rows");
    assert!(
        (i0 + M) * acts.cols <= acts.q.len(),
        "quant tile: activations"
    );
    assert!((i0 + M) * nb <= acts.scale.len(), "quant tile: scales");
    assert!(
        (i0 + M) * nb * LANES <= acts.bias.len(),
        "quant tile: biases"
    );
    if F::NEEDS_SUMS {
        assert!((i0 + M) * nb <= sums.len(), "quant tile: sums");
    }
}

/// One activation block for the tile's `M` rows: the values, the lane
/// biases (when `bias`), the scales and (for a min) the block sums.
pub(super) struct ActBlock<const M: usize> {
    pub(super) values: [__m256i; M],
    pub(super) bias: [__m256i; M],
    pub(super) scale: [f32; M],
    pub(super) sum: [f32; M],
}

/// Loads block `b` of activation rows `i0..i0 + M`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn act_block<F: Block32, const M: usize>(
    acts: &Acts<'_>,
    sums: &[f32],
    i0: usize,
    b: usize,
    bias: bool,
) -> ActBlock<M> {
    let nb = acts.cols / QK;
    let mut a = ActBlock {
        values: [_mm256_setzero_si256(); M],
        bias: [_mm256_setzero_si256(); M],
        scale: [0.0; M],
        sum: [0.0; M],
    };
    for i in 0..M {
        let row = i0 + i;
        // SAFETY: check_tile: row < i0 + M, so the 32 values at
        // row * cols + 32 b and the 8 biases at (row * nb + b) * 8 are in bounds.
        unsafe {
            a.values[i] = _mm256_loadu_si256(acts.q.as_ptr().add(row * acts.cols + b * QK).cast());
            if bias {
                a.bias[i] =
                    _mm256_loadu_si256(acts.bias.as_ptr().add((row * nb + b) * LANES).cast());
            }
        }
        a.scale[i] = acts.scale[row * nb + b];
        if F::NEEDS_SUMS {
            a.sum[i] = sums[row * nb + b];
        }
    }
    a
}

/// `acc = fma(dw · dx, p, acc)`, then for a format with a min its term on
/// lane 0: `acc[0] = fma(mw · dx, S, acc[0])`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn accumulate<F: Block32>(
    acc: __m256,
    p: __m256i,
    dw: f32,
    mw: f32,
    dx: f32,
    sum: f32,
) -> __m256 {
    let acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx), _mm256_cvtepi32_ps(p), acc);
    if F::NEEDS_SUMS {
        let t = _mm256_fmadd_ps(_mm256_set1_ps(mw * dx), _mm256_set1_ps(sum), acc);
        _mm256_blend_ps::<0b1>(acc, t)
    } else {
        acc
    }
}

/// The tile's outputs: each accumulator folded.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn fold_tile<const R: usize, const M: usize>(acc: &[[__m256; M]; R]) -> [[f32; M]; R] {
    let mut out = [[0.0f32; M]; R];
    for (o, a) in out.iter_mut().zip(acc) {
        for (o, &a) in o.iter_mut().zip(a) {
            *o = fold(a);
        }
    }
    out
}
