//! The repacked ("strip") layout of block-quantized weights and its kernels:
//! the same integer block dot products and the same fixed f32 order as
//! [`super::quant_dot`], over a copy of the weights laid out for the vector
//! units.
//!
//! # The layout
//! The weight rows are taken in strips of [`G`] = 8 (the last strip padded with
//! rows of scale 0). A strip is 64-byte aligned and holds
//! - the scales: for each block `b`, the eight rows' f16 scales side by side
//!   (16 bytes), the region padded to a multiple of 64 bytes;
//! - for Q4_1 and Q5_1, the mins: laid out as the scales;
//! - for Q5_0 and Q5_1, the fifth bits: for each block `b`, the eight rows' bits of
//!   elements 0..16 (a u16 each), then of elements 16..32 (32 bytes), the
//!   region padded to a multiple of 64 bytes;
//! - the values: for each block `b`, the eight rows' values one after the
//!   other, each exactly as in llama.cpp's block (Q8_0: 32 signed bytes; the
//!   others: 16 bytes of nibbles, element `k` in the low nibble of byte
//!   `k`, element `k + 16` in its high nibble) — 256 (Q8_0) or 128 bytes per
//!   block, aligned to 64.
//!
//! A strip is therefore one sequential stream of the same bytes as the eight
//! rows (the f16 scales are kept, so the copy is no larger), and per block one
//! conversion gives the eight rows' scales, a 64-byte load feeds two (Q8_0) or
//! four (the nibble formats) rows.
//!
//! # The same bits
//! For each output, block `b` gives the same eight exact integer lane sums
//! `p[l]` and the same scale product `s = dw · dx` as the in-place kernels, and
//! each (row, lane) accumulator takes `acc = fma(s, p, acc)` for `b` in
//! increasing order, then [`fold_lanes`]: the operations of the in-place order,
//! so a result is the same bits as `quant_matmul` on the original blocks, on
//! every path, for every split and batch.

use std::ops::Range;

use super::quant_block::LaneAcc;
use super::quant_dot::{Acts, Block32, LANES, Path, QK, Shape, path};
use crate::kernels::reduce::fold_lanes;

/// Weight rows per strip.
pub(crate) const G: usize = 8;

/// The sizes of the strip layout of a matrix with `nb` blocks per row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StripLayout {
    /// Where the format's fields sit.
    shape: Shape,
    /// Bytes of one llama.cpp block.
    block_bytes: usize,
    /// Whether the format has a min (Q4_1, Q5_1).
    min: bool,
    /// Blocks per row.
    pub nb: usize,
    /// Bytes of a strip's scale region (a multiple of 64).
    pub scale_bytes: usize,
    /// Bytes of a strip's min region (Q4_1, Q5_1: laid out as the scales; a
    /// multiple of 64, else 0).
    pub min_bytes: usize,
    /// Bytes of a strip's high-bit region (Q5_0; a multiple of 64, else 0).
    pub high_bytes: usize,
    /// Bytes of a strip (a multiple of 64).
    pub strip_bytes: usize,
}

impl StripLayout {
    /// The layout of format `F` for `nb` blocks per row, `None` on a size
    /// overflow.
    pub(crate) fn new<F: Block32>(nb: usize) -> Option<StripLayout> {
        let shape = F::SHAPE;
        let scale_bytes = nb.checked_mul(2 * G)?.checked_next_multiple_of(64)?;
        let min_bytes = if F::NEEDS_SUMS { scale_bytes } else { 0 };
        let high_bytes = match shape.high {
            Some(_) => nb.checked_mul(4 * G)?.checked_next_multiple_of(64)?,
            None => 0,
        };
        let strip_bytes = nb
            .checked_mul(G * row_values(shape))?
            .checked_add(scale_bytes)?
            .checked_add(min_bytes)?
            .checked_add(high_bytes)?;
        Some(StripLayout {
            shape,
            block_bytes: F::BYTES,
            min: F::NEEDS_SUMS,
            nb,
            scale_bytes,
            min_bytes,
            high_bytes,
            strip_bytes,
        })
    }

    /// Bytes of one row's values in a block (32 for Q8_0, 16 for the nibbles).
    fn row_values(&self) -> usize {
        row_values(self.shape)
    }

    /// Bytes of one llama.cpp block (34 for Q8_0, 18 for Q4_0, 22 for Q5_0).
    pub(crate) fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// Where the high bits start in a strip.
    fn high_offset(&self) -> usize {
        self.scale_bytes + self.min_bytes
    }

    /// Where the values start in a strip.
    fn values_offset(&self) -> usize {
        self.scale_bytes + self.min_bytes + self.high_bytes
    }
}

/// Bytes of one row's values in a block of a format of shape `shape`.
fn row_values(shape: Shape) -> usize {
    if shape.nibbles() { 16 } else { 32 }
}

/// The offsets in a strip's high-bit region of row `r`'s low and high halves
/// of block `b`'s 32 fifth bits: per block 32 bytes, the eight rows' bits of
/// elements 0..16 (a u16 each, row after row), then of elements 16..32; so
/// four rows' halves are one little-endian u64 (a 64-bit mask over four rows'
/// 16 nibbles) and two rows' one u32.
fn high_offsets(b: usize, r: usize) -> (usize, usize) {
    (b * 4 * G + 2 * r, b * 4 * G + 2 * G + 2 * r)
}

/// Writes strip `s` of the matrix `src` (`rows` rows of `nb` llama.cpp blocks)
/// into `dst` (`lay.strip_bytes` long): rows past `rows` get scale 0 and
/// values 0.
pub(crate) fn repack_strip(lay: &StripLayout, src: &[u8], rows: usize, s: usize, dst: &mut [u8]) {
    let sh = lay.shape;
    let bb = lay.block_bytes;
    let rv = lay.row_values();
    let row_bytes = lay.nb * bb;
    dst.fill(0);
    let (scales, rest) = dst.split_at_mut(lay.scale_bytes);
    let (mins, rest) = rest.split_at_mut(lay.min_bytes);
    let (high, values) = rest.split_at_mut(lay.high_bytes);
    for r in 0..G {
        let row = s * G + r;
        if row >= rows {
            break;
        }
        let src_row = &src[row * row_bytes..(row + 1) * row_bytes];
        for (b, blk) in src_row.chunks_exact(bb).enumerate() {
            scales[b * 2 * G + 2 * r..][..2].copy_from_slice(&blk[..2]);
            if lay.min {
                mins[b * 2 * G + 2 * r..][..2].copy_from_slice(&blk[2..4]);
            }
            values[b * G * rv + r * rv..][..rv].copy_from_slice(&blk[sh.values..][..rv]);
            if let Some(h) = sh.high {
                let (lo, hi) = high_offsets(b, r);
                high[lo..lo + 2].copy_from_slice(&blk[h..h + 2]);
                high[hi..hi + 2].copy_from_slice(&blk[h + 2..h + 4]);
            }
        }
    }
}

/// Copies block `b` of row `r` (`r < G`) of `strip` back into llama.cpp's
/// block layout `blk` (`lay.block_bytes()` long): the inverse of
/// [`repack_strip`].
pub(crate) fn block_of(lay: &StripLayout, strip: &[u8], r: usize, b: usize, blk: &mut [u8]) {
    let sh = lay.shape;
    let rv = lay.row_values();
    let (scales, rest) = strip.split_at(lay.scale_bytes);
    let (mins, rest) = rest.split_at(lay.min_bytes);
    let (high, values) = rest.split_at(lay.high_bytes);
    blk[..2].copy_from_slice(&scales[b * 2 * G + 2 * r..][..2]);
    if lay.min {
        blk[2..4].copy_from_slice(&mins[b * 2 * G + 2 * r..][..2]);
    }
    blk[sh.values..sh.values + rv].copy_from_slice(&values[b * G * rv + r * rv..][..rv]);
    if let Some(h) = sh.high {
        let (lo, hi) = high_offsets(b, r);
        blk[h..h + 2].copy_from_slice(&high[lo..lo + 2]);
        blk[h + 2..h + 4].copy_from_slice(&high[hi..hi + 2]);
    }
}

/// Computes the outputs of strips `strips` of the packed matrix `data` for all
/// `m` activation rows: `out_t[((s - strips.start) * m + i) * G + r]` is the
/// dot product of row `s · G + r` with activation row `i`, in the fixed order
/// (each strip's outputs activation row by activation row, so that a row of
/// the result is gathered in runs of `G`). `sums` are the activation block
/// sums (read by the formats with a min only).
///
/// # Panics
/// If `data`, `acts`, `sums` (for a format with a min) or `out_t` are too
/// short for `strips` and `m`, or `data` is not 64-byte aligned (caller bugs).
pub(crate) fn packed_rows<F: Block32>(
    lay: &StripLayout,
    data: &[u8],
    strips: Range<usize>,
    acts: &Acts<'_>,
    sums: &[f32],
    m: usize,
    out_t: &mut [f32],
) {
    let nb = lay.nb;
    assert!(
        lay.shape == F::SHAPE && lay.block_bytes == F::BYTES,
        "packed_rows: format"
    );
    assert_eq!(acts.cols, nb * QK, "packed_rows: columns");
    assert!(
        strips.end * lay.strip_bytes <= data.len(),
        "packed_rows: strips"
    );
    assert_eq!(data.as_ptr() as usize % 64, 0, "packed_rows: alignment");
    assert!(acts.q.len() >= m * acts.cols, "packed_rows: activations");
    assert!(acts.scale.len() >= m * nb, "packed_rows: scales");
    assert!(acts.bias.len() >= m * nb * LANES, "packed_rows: biases");
    assert!(out_t.len() >= strips.len() * G * m, "packed_rows: output");
    if F::NEEDS_SUMS {
        assert!(sums.len() >= m * nb, "packed_rows: sums");
    }
    let p = path();
    for (ss, s) in strips.enumerate() {
        let strip = &data[s * lay.strip_bytes..(s + 1) * lay.strip_bytes];
        let out = &mut out_t[ss * G * m..(ss + 1) * G * m];
        match p {
            #[cfg(target_arch = "x86_64")]
            Path::Vnni => {
                let mut i = 0;
                while i < m {
                    let mm = (m - i).min(4);
                    macro_rules! run {
                        ($mm:literal) => {{
                            // SAFETY: `path` returns Vnni only when the CPU has
                            // every feature the kernel enables; the asserts
                            // above bound the strip, the activation rows
                            // i..i + mm and the alignment.
                            let res = unsafe {
                                if F::SHAPE.nibbles() {
                                    x86::strip_vnni_nibbles::<F, $mm>(lay, strip, acts, sums, i)
                                } else {
                                    x86::strip_vnni_q8::<$mm>(lay, strip, acts, i)
                                }
                            };
                            for (r, row) in res.iter().enumerate() {
                                for (k, &v) in row.iter().enumerate() {
                                    out[(i + k) * G + r] = v;
                                }
                            }
                        }};
                    }
                    match mm {
                        1 => run!(1),
                        2 => run!(2),
                        3 => run!(3),
                        _ => run!(4),
                    }
                    i += mm;
                }
            }
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => {
                for i in 0..m {
                    // SAFETY: `path` returns Avx2 only when the CPU has AVX2,
                    // FMA and F16C; the asserts above bound the strip and the
                    // activation row i, and the alignment.
                    let res = unsafe {
                        if F::SHAPE.nibbles() {
                            x86::strip_avx2_nibbles::<F>(lay, strip, acts, sums, i)
                        } else {
                            x86::strip_avx2_q8(lay, strip, acts, i)
                        }
                    };
                    out[i * G..(i + 1) * G].copy_from_slice(&res);
                }
            }
            _ => {
                for i in 0..m {
                    let res = strip_portable::<F>(lay, strip, acts, sums, i);
                    out[i * G..(i + 1) * G].copy_from_slice(&res);
                }
            }
        }
    }
}

/// Activation rows from which [`gemm_path`] takes the GEMM ([`packed_gemm`]):
/// below it the tile's unpacking costs more than it saves (measured with the
/// `q32_probe` example on the TinyLlama shapes, 2 threads: at 8 and 16 rows
/// the GEMM took 1.3–1.6× the strip kernel's CPU time, at 32 the same, at
/// 64 less, at 512 0.7×).
pub(crate) const GEMM_MIN_ROWS: usize = 32;

/// Weight rows of a GEMM tile (two strips).
const TILE_ROWS: usize = 2 * G;

/// Bytes of one block of a GEMM tile: the codes (eight lanes of 64 bytes:
/// lane `l` holds elements `4l..4l + 4` of each of the 16 rows, unsigned, row
/// after row), the 16 rows' scales widened to f32, and for a format with a
/// min (`min`) the 16 rows' mins widened to f32.
const fn tile_block_bytes(min: bool) -> usize {
    8 * 64 + 64 + if min { 64 } else { 0 }
}

impl StripLayout {
    /// Bytes of scratch [`packed_gemm`] needs (one tile of all `nb` blocks,
    /// plus room to align it to 64 bytes).
    pub(crate) fn gemm_scratch_bytes(&self) -> usize {
        self.nb * tile_block_bytes(self.min) + 64
    }
}

/// Whether a product of `m` activation rows takes [`packed_gemm`] at the
/// current vector level (AVX-512 VNNI, from [`GEMM_MIN_ROWS`] rows).
pub(crate) fn gemm_path(m: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        m >= GEMM_MIN_ROWS && path() == Path::Vnni
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = m;
        false
    }
}

/// Whether the CPU has every feature the GEMM's kernels enable (AVX-512
/// F/BW/VL/VNNI, AVX2, FMA, F16C), whatever the current level.
fn cpu_has_vnni() -> bool {
    use super::simd::CpuFeatures as C;
    let needs = C::AVX2
        .with(C::FMA)
        .with(C::F16C)
        .with(C::AVX512F)
        .with(C::AVX512BW)
        .with(C::AVX512VL)
        .with(C::AVX512VNNI);
    cfg!(target_arch = "x86_64") && C::detected().has(needs)
}

#[cfg(test)]
/// The unsigned codes `w + F::ACT_OFFSET` of row `r`'s block `b` in `strip`
/// (the operand of `vpdpbusd`, whose lane bias takes the offset back): Q8_0's
/// value `+ 128`, a Q4 nibble, a Q5 code, IQ4_NL's table value `+ 128`.
fn unsigned_codes(lay: &StripLayout, strip: &[u8], r: usize, b: usize) -> [u8; QK] {
    let sh = lay.shape;
    let rv = lay.row_values();
    let v = &strip[lay.values_offset() + b * G * rv + r * rv..][..rv];
    let mut u = [0u8; QK];
    if !sh.nibbles() {
        for (u, &v) in u.iter_mut().zip(v) {
            *u = v ^ 0x80;
        }
        return u;
    }
    let qh = match sh.high {
        Some(_) => {
            let (lo, hi) = high_offsets(b, r);
            let h = &strip[lay.high_offset()..];
            u32::from(u16::from_le_bytes([h[lo], h[lo + 1]]))
                | u32::from(u16::from_le_bytes([h[hi], h[hi + 1]])) << 16
        }
        None => 0,
    };
    for (k, u) in u.iter_mut().enumerate() {
        let n = (v[k % 16] >> (4 * (k / 16))) & 0x0f;
        let n = n | (((qh >> k) & 1) as u8) << 4;
        *u = if sh.table {
            (super::quant_block::iq4_nl::KVALUES[usize::from(n)] as u8) ^ 0x80
        } else {
            n
        };
    }
    u
}

/// Unpacks strips `s..s + count` (`count` 1 or 2) of `data` into the GEMM
/// tile `tile` (`nb` blocks of [`tile_block_bytes`]); the rows of a missing
/// second strip get codes 0 and scale 0 (their outputs are not written). The
/// plain reference of the vector fill (`x86::fill_tile_vnni`), for the tests.
#[cfg(test)]
fn fill_tile(lay: &StripLayout, data: &[u8], s: usize, count: usize, tile: &mut [u8]) {
    let tb = tile_block_bytes(lay.min);
    let sb = lay.strip_bytes;
    for (b, blk) in tile.chunks_exact_mut(tb).take(lay.nb).enumerate() {
        for h in 0..2 {
            let strip = (h < count).then(|| &data[(s + h) * sb..(s + h + 1) * sb]);
            for r in 0..G {
                let t = h * G + r;
                let (codes, d, mn) = match strip {
                    Some(strip) => {
                        let f16 = |region: usize| {
                            let o = region + b * 2 * G + 2 * r;
                            super::quant_dot::f16_to_f32(u16::from_le_bytes([
                                strip[o],
                                strip[o + 1],
                            ]))
                        };
                        let mn = if lay.min { f16(lay.scale_bytes) } else { 0.0 };
                        (unsigned_codes(lay, strip, r, b), f16(0), mn)
                    }
                    None => ([0; QK], 0.0, 0.0),
                };
                for l in 0..LANES {
                    blk[64 * l + 4 * t..][..4].copy_from_slice(&codes[4 * l..4 * l + 4]);
                }
                blk[512 + 4 * t..][..4].copy_from_slice(&d.to_le_bytes());
                if lay.min {
                    blk[576 + 4 * t..][..4].copy_from_slice(&mn.to_le_bytes());
                }
            }
        }
    }
}

/// [`packed_rows`] for many activation rows (a prefill): the same outputs,
/// bit for bit, into the same places of `out_t`, computed as a GEMM at the
/// AVX-512 VNNI level. Each pair of strips is unpacked once into `scratch`
/// (at least [`StripLayout::gemm_scratch_bytes`] long) as a tile of 16 rows
/// whose code vectors hold one lane (four consecutive codes) of each of the
/// 16 rows; then two activation rows at a time meet it: per block, one
/// product `dw · dx` for the 16 rows of each activation row, and per lane
/// `vpdpbusd` of the lane's code vector with the lane's four activations
/// broadcast (the lane bias its start) gives the 16 rows' exact lane sums,
/// which the lane's accumulator takes by `fma(s, p, acc)`; the lanes fold in
/// halves at the end, vector by vector. The integers and the f32 operations
/// are those of the fixed order, in the same order per output.
///
/// # Panics
/// As [`packed_rows`], and if the CPU lacks AVX-512 VNNI (see
/// [`gemm_path`]) or `scratch` is too short (caller bugs).
#[allow(clippy::too_many_arguments)] // packed_rows' operands and the scratch
pub(crate) fn packed_gemm<F: Block32>(
    lay: &StripLayout,
    data: &[u8],
    strips: Range<usize>,
    acts: &Acts<'_>,
    sums: &[f32],
    m: usize,
    out_t: &mut [f32],
    scratch: &mut [u8],
) {
    let nb = lay.nb;
    assert!(
        lay.shape == F::SHAPE && lay.block_bytes == F::BYTES,
        "packed_gemm: format"
    );
    assert_eq!(acts.cols, nb * QK, "packed_gemm: columns");
    assert!(
        strips.end * lay.strip_bytes <= data.len(),
        "packed_gemm: strips"
    );
    assert!(acts.q.len() >= m * acts.cols, "packed_gemm: activations");
    assert!(acts.scale.len() >= m * nb, "packed_gemm: scales");
    assert!(acts.bias.len() >= m * nb * LANES, "packed_gemm: biases");
    assert!(out_t.len() >= strips.len() * G * m, "packed_gemm: output");
    if F::NEEDS_SUMS {
        assert!(sums.len() >= m * nb, "packed_gemm: sums");
    }
    // The caller chose the GEMM by `gemm_path` (at the level of that moment;
    // a level forced since by another thread changes no bit): the CPU must
    // have the features, whatever the level is now.
    assert!(cpu_has_vnni(), "packed_gemm: CPU features");
    let tile_bytes = nb * tile_block_bytes(lay.min);
    let skip = scratch.as_ptr().align_offset(64);
    assert!(
        skip <= 64 && scratch.len() >= skip + tile_bytes,
        "packed_gemm: scratch"
    );
    let tile = &mut scratch[skip..skip + tile_bytes];
    #[cfg(target_arch = "x86_64")]
    {
        let mut s = strips.start;
        while s < strips.end {
            let count = (strips.end - s).min(2);
            // SAFETY: cpu_has_vnni (asserted above): the CPU has every
            // feature the fill and the micro-kernel enable; both check their
            // bounds.
            unsafe { x86::fill_tile_vnni(lay, data, s, count, tile) };
            let base = (s - strips.start) * m * G;
            let mut i = 0;
            while i < m {
                let mm = (m - i).min(2);
                macro_rules! run {
                    ($mm:literal) => {{
                        // SAFETY: as above.
                        let res = unsafe {
                            if F::NEEDS_SUMS {
                                x86::tile_vnni::<true, $mm>(tile, nb, acts, sums, i)
                            } else {
                                x86::tile_vnni::<false, $mm>(tile, nb, acts, sums, i)
                            }
                        };
                        for (k, row) in res.iter().enumerate() {
                            for h in 0..count {
                                let o = base + (h * m + i + k) * G;
                                out_t[o..o + G].copy_from_slice(&row[h * G..(h + 1) * G]);
                            }
                        }
                    }};
                }
                match mm {
                    1 => run!(1),
                    _ => run!(2),
                }
                i += mm;
            }
            s += count;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (tile, data, strips, acts, sums, out_t);
}

/// One strip times activation row `i`, plainly: the portable path (each row's
/// blocks rebuilt and taken through the format's `dot_block`).
fn strip_portable<F: Block32>(
    lay: &StripLayout,
    strip: &[u8],
    acts: &Acts<'_>,
    sums: &[f32],
    i: usize,
) -> [f32; G] {
    let nb = lay.nb;
    let bb = lay.block_bytes();
    let mut acc: [LaneAcc; G] = [[0.0; 2 * LANES]; G];
    let mut blk = [0u8; 34];
    for b in 0..nb {
        let xs = &acts.scale[i * nb + b..][..1];
        let xq = &acts.q[i * acts.cols + b * QK..][..QK];
        for (r, acc_r) in acc.iter_mut().enumerate() {
            block_of(lay, strip, r, b, &mut blk[..bb]);
            let sum = if F::NEEDS_SUMS {
                &sums[i * nb + b..][..1]
            } else {
                &[][..]
            };
            F::dot_block(&blk[..bb], xq, xs, sum, acc_r);
        }
    }
    acc.map(|a| {
        let mut lo = [0.0f32; LANES];
        lo.copy_from_slice(&a[..LANES]);
        fold_lanes(lo)
    })
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The x86-64 strip kernels (see the module documentation of the parent).

    use std::arch::x86_64::*;

    use super::{
        Acts, Block32, G, LANES, QK, StripLayout, TILE_ROWS, fold_lanes, tile_block_bytes,
    };
    use crate::kernels::quant_block::iq4_nl::KVALUES;
    use crate::kernels::quant_dot::x86::high_bits;

    /// IQ4_NL's table as 16 bytes, `+ 128` (`unsigned`: the unsigned operand
    /// of `vpdpbusd`) or as the signed values.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn iq4_table(unsigned: bool) -> __m128i {
        let mut t = [0u8; 16];
        for (t, &v) in t.iter_mut().zip(&KVALUES) {
            *t = if unsigned { (v as u8) ^ 0x80 } else { v as u8 };
        }
        // SAFETY: `t` is 16 bytes.
        unsafe { _mm_loadu_si128(t.as_ptr().cast()) }
    }

    /// How far ahead of the block being read the values are prefetched (a
    /// strip is one sequential stream; measured on the AVX-512 machine of
    /// `docs/BENCHMARKS-JOURNAL.md`: 0, 768, 1536 and 3072 bytes gave 0.76–0.85,
    /// 0.88–1.06, 0.91–1.10 and 0.94–0.99 of the streaming read for Q4_0 at
    /// `m = 1` on one thread; 1536 was best or within the spread everywhere).
    const PREFETCH_BYTES: usize = 1536;

    /// Hints the `LINES` 64-byte lines from `p + PREFETCH_BYTES` into L1 (a prefetch
    /// never faults; the address is computed with wrapping arithmetic and
    /// never dereferenced).
    #[inline(always)]
    fn prefetch_lines<const LINES: usize>(p: *const u8) {
        for l in 0..LINES {
            // SAFETY: see above.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_BYTES + 64 * l).cast()) };
        }
    }

    /// Hints the `LINES` 64-byte lines at `p` into L2: the same place in one
    /// of the next two strips, which this thread usually reads next (more
    /// streams in flight beside the one being read; a prefetch never faults,
    /// and the address is never dereferenced). Measured at batch-1 decode
    /// (TinyLlama-shape Q4_0, 2 threads, `docs/BENCHMARKS-JOURNAL.md`): no look-ahead
    /// 28–31 tokens/s, the next strip 38–39 in one window and 28–35 in a
    /// noisier one, the next two strips 29–38 against 30–31 in that window.
    #[inline(always)]
    fn prefetch_next_strip<const LINES: usize>(p: *const u8) {
        for l in 0..LINES {
            // SAFETY: see above.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(64 * l).cast()) };
        }
    }

    /// Checks the activation rows `i0..i0 + M` against `acts` (once per strip).
    #[inline(always)]
    fn check_acts<const M: usize>(lay: &StripLayout, acts: &Acts<'_>, i0: usize, strip: &[u8]) {
        let nb = lay.nb;
        assert_eq!(strip.len(), lay.strip_bytes, "quant strip: bytes");
        assert_eq!(strip.as_ptr() as usize % 64, 0, "quant strip: alignment");
        assert_eq!(acts.cols, nb * QK, "quant strip: columns");
        assert!(
            (i0 + M) * acts.cols <= acts.q.len(),
            "quant strip: activations"
        );
        assert!((i0 + M) * nb <= acts.scale.len(), "quant strip: scales");
        assert!(
            (i0 + M) * nb * LANES <= acts.bias.len(),
            "quant strip: biases"
        );
    }

    /// The eight rows' scales of block `b`, widened.
    ///
    /// # Safety
    /// `scales + 16 b` must be valid for 16 bytes and 16-byte aligned.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn widen_scales(scales: *const u8, b: usize) -> __m256 {
        // SAFETY: the caller's contract.
        _mm256_cvtph_ps(unsafe { _mm_load_si128(scales.add(b * 2 * G).cast()) })
    }

    /// The eight rows' scales of block `b`, widened, times `dx`.
    ///
    /// # Safety
    /// `scales + 16 b` must be valid for 16 bytes and 16-byte aligned.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn scales8(scales: *const u8, b: usize, dx: f32) -> __m256 {
        // SAFETY: the caller's contract.
        let h = unsafe { _mm_load_si128(scales.add(b * 2 * G).cast()) };
        _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(dx))
    }

    /// Q8_0 strip × activation rows `i0..i0 + M` with `vpdpbusd` on 512-bit
    /// vectors: a vector holds two rows' blocks (the unsigned operand is the
    /// value `+ 128`, the lane bias `-128 · Σ x` the accumulator's start), its
    /// accumulator the two rows' eight lanes.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn strip_vnni_q8<const M: usize>(
        lay: &StripLayout,
        strip: &[u8],
        acts: &Acts<'_>,
        i0: usize,
    ) -> [[f32; M]; G] {
        check_acts::<M>(lay, acts, i0, strip);
        let nb = lay.nb;
        let sp = strip.as_ptr();
        // SAFETY: the values start scale_bytes (< strip_bytes) into the strip.
        let vp = unsafe { sp.add(lay.scale_bytes) };
        let flip = _mm512_set1_epi8(-128);
        let pair = |h: i32| {
            _mm512_setr_epi32(
                2 * h,
                2 * h,
                2 * h,
                2 * h,
                2 * h,
                2 * h,
                2 * h,
                2 * h,
                2 * h + 1,
                2 * h + 1,
                2 * h + 1,
                2 * h + 1,
                2 * h + 1,
                2 * h + 1,
                2 * h + 1,
                2 * h + 1,
            )
        };
        let idx = [pair(0), pair(1), pair(2), pair(3)];
        let mut acc = [[_mm512_setzero_ps(); 4]; M];
        for b in 0..nb {
            prefetch_lines::<4>(vp.wrapping_add(b * 256));
            if M == 1 {
                prefetch_next_strip::<4>(vp.wrapping_add(lay.strip_bytes + b * 256));
                prefetch_next_strip::<4>(vp.wrapping_add(2 * lay.strip_bytes + b * 256));
            }
            // The eight rows' scales of block b, widened and spread to the
            // lanes of each value vector once per block; each activation row
            // multiplies them by its own scale (the same products as
            // permuting `dw · dx`).
            // SAFETY: the scales are 16-byte aligned in the strip (check_acts).
            let dw = _mm512_castps256_ps512(unsafe { widen_scales(sp, b) });
            let dwh = [
                _mm512_permutexvar_ps(idx[0], dw),
                _mm512_permutexvar_ps(idx[1], dw),
                _mm512_permutexvar_ps(idx[2], dw),
                _mm512_permutexvar_ps(idx[3], dw),
            ];
            // SAFETY: check_acts: the strip holds nb blocks of 256 value bytes
            // after its scales, 64-byte aligned (scale_bytes and 256 are
            // multiples of 64).
            let w = unsafe {
                let q = vp.add(b * 256);
                [
                    _mm512_xor_si512(_mm512_load_si512(q.cast()), flip),
                    _mm512_xor_si512(_mm512_load_si512(q.add(64).cast()), flip),
                    _mm512_xor_si512(_mm512_load_si512(q.add(128).cast()), flip),
                    _mm512_xor_si512(_mm512_load_si512(q.add(192).cast()), flip),
                ]
            };
            for (i, acc_i) in acc.iter_mut().enumerate() {
                let row = i0 + i;
                // SAFETY: check_acts bounds row's block b (32 values, 8
                // biases); the scales are 16-byte aligned in the strip.
                let (dx, xv, xb) = unsafe {
                    (
                        _mm512_set1_ps(*acts.scale.get_unchecked(row * nb + b)),
                        _mm512_broadcast_i64x4(_mm256_loadu_si256(
                            acts.q.as_ptr().add(row * acts.cols + b * QK).cast(),
                        )),
                        _mm512_broadcast_i64x4(_mm256_loadu_si256(
                            acts.bias.as_ptr().add((row * nb + b) * LANES).cast(),
                        )),
                    )
                };
                for h in 0..4 {
                    let p = _mm512_dpbusd_epi32(xb, w[h], xv);
                    let s = _mm512_mul_ps(dwh[h], dx);
                    acc_i[h] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(p), acc_i[h]);
                }
            }
        }
        let mut out = [[0.0f32; M]; G];
        for (i, acc_i) in acc.iter().enumerate() {
            for (h, &a) in acc_i.iter().enumerate() {
                let mut lanes = [0.0f32; 16];
                // SAFETY: 16 f32 of room.
                unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), a) };
                for e in 0..2 {
                    let l: [f32; LANES] = lanes[e * 8..e * 8 + 8].try_into().expect("8 lanes");
                    out[2 * h + e][i] = fold_lanes(l);
                }
            }
        }
        out
    }

    /// Nibble strip (Q4_0, Q5_0, Q4_1, Q5_1, IQ4_NL: `F`) × activation rows `i0..i0 + M`
    /// with `vpdpbusd` on 512-bit vectors: a vector holds four rows' low
    /// (elements 0..15) or high (16..31) nibbles, 16 per 128-bit part; its
    /// accumulator the four rows' lanes 0..3 (low) or 4..7 (high). Q5_0's
    /// fifth bits are four rows' 64-bit mask adding 16 to their bytes;
    /// IQ4_NL's nibbles index its table `+ 128` (`vpshufb`), the lane bias
    /// `-128 · Σ x` taking the offset back.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn strip_vnni_nibbles<F: Block32, const M: usize>(
        lay: &StripLayout,
        strip: &[u8],
        acts: &Acts<'_>,
        sums: &[f32],
        i0: usize,
    ) -> [[f32; M]; G] {
        check_acts::<M>(lay, acts, i0, strip);
        let min = F::NEEDS_SUMS;
        assert!(!min || (i0 + M) * lay.nb <= sums.len(), "quant strip: sums");
        // SAFETY: the mins (Q4_1, Q5_1) start scale_bytes into the strip.
        let mp = unsafe { strip.as_ptr().add(lay.scale_bytes) };
        let nb = lay.nb;
        let sp = strip.as_ptr();
        // SAFETY: the values start values_offset (< strip_bytes) into the
        // strip, the high bits (Q5_0) scale_bytes into it.
        let (vp, hp) = unsafe { (sp.add(lay.values_offset()), sp.add(lay.high_offset())) };
        let m4 = _mm512_set1_epi8(0x0f);
        let sixteen = _mm512_set1_epi8(16);
        let table = _mm512_broadcast_i32x4(iq4_table(true));
        let quad = |g: i32| {
            let r = 4 * g;
            _mm512_setr_epi32(
                r,
                r,
                r,
                r,
                r + 1,
                r + 1,
                r + 1,
                r + 1,
                r + 2,
                r + 2,
                r + 2,
                r + 2,
                r + 3,
                r + 3,
                r + 3,
                r + 3,
            )
        };
        let idx = [quad(0), quad(1)];
        let mut lo_acc = [[_mm512_setzero_ps(); 2]; M];
        let mut hi_acc = [[_mm512_setzero_ps(); 2]; M];
        for b in 0..nb {
            prefetch_lines::<2>(vp.wrapping_add(b * 128));
            if M == 1 {
                prefetch_next_strip::<2>(vp.wrapping_add(lay.strip_bytes + b * 128));
                prefetch_next_strip::<2>(vp.wrapping_add(2 * lay.strip_bytes + b * 128));
            }
            // SAFETY: check_acts: the strip holds nb blocks of 128 value bytes
            // after its scales, 64-byte aligned.
            let (v0, v1) = unsafe {
                let q = vp.add(b * 128);
                (
                    _mm512_load_si512(q.cast()),
                    _mm512_load_si512(q.add(64).cast()),
                )
            };
            // SAFETY: as in strip_vnni_q8.
            let dw = _mm512_castps256_ps512(unsafe { widen_scales(sp, b) });
            let dwg = [
                _mm512_permutexvar_ps(idx[0], dw),
                _mm512_permutexvar_ps(idx[1], dw),
            ];
            let mwg = if min {
                // SAFETY: as the scales (the min region has their layout).
                let mw = _mm512_castps256_ps512(unsafe { widen_scales(mp, b) });
                [
                    _mm512_permutexvar_ps(idx[0], mw),
                    _mm512_permutexvar_ps(idx[1], mw),
                ]
            } else {
                [_mm512_setzero_ps(); 2]
            };
            let mut lo = [_mm512_and_si512(v0, m4), _mm512_and_si512(v1, m4)];
            let mut hi = [
                _mm512_and_si512(_mm512_srli_epi16::<4>(v0), m4),
                _mm512_and_si512(_mm512_srli_epi16::<4>(v1), m4),
            ];
            if F::SHAPE.high.is_some() {
                for g in 0..2 {
                    // SAFETY: check_acts: block b's 32 high-bit bytes are in
                    // the strip's high region (high_offsets).
                    let (kl, kh) = unsafe {
                        let q = hp.add(b * 4 * G + 8 * g);
                        (
                            q.cast::<u64>().read_unaligned(),
                            q.add(2 * G).cast::<u64>().read_unaligned(),
                        )
                    };
                    lo[g] = _mm512_mask_add_epi8(lo[g], kl, lo[g], sixteen);
                    hi[g] = _mm512_mask_add_epi8(hi[g], kh, hi[g], sixteen);
                }
            } else if F::SHAPE.table {
                for g in 0..2 {
                    lo[g] = _mm512_shuffle_epi8(table, lo[g]);
                    hi[g] = _mm512_shuffle_epi8(table, hi[g]);
                }
            }
            for i in 0..M {
                let row = i0 + i;
                // SAFETY: as in strip_vnni_q8.
                let (dx, xlo, xhi, blo, bhi) = unsafe {
                    let xq = acts.q.as_ptr().add(row * acts.cols + b * QK);
                    let bp = acts.bias.as_ptr().add((row * nb + b) * LANES);
                    (
                        _mm512_set1_ps(*acts.scale.get_unchecked(row * nb + b)),
                        _mm512_broadcast_i32x4(_mm_loadu_si128(xq.cast())),
                        _mm512_broadcast_i32x4(_mm_loadu_si128(xq.add(16).cast())),
                        _mm512_broadcast_i32x4(_mm_loadu_si128(bp.cast())),
                        _mm512_broadcast_i32x4(_mm_loadu_si128(bp.add(4).cast())),
                    )
                };
                for g in 0..2 {
                    let s = _mm512_mul_ps(dwg[g], dx);
                    let pl = _mm512_dpbusd_epi32(blo, lo[g], xlo);
                    let ph = _mm512_dpbusd_epi32(bhi, hi[g], xhi);
                    lo_acc[i][g] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(pl), lo_acc[i][g]);
                    hi_acc[i][g] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(ph), hi_acc[i][g]);
                    if min {
                        // each row's lane 0: acc[0] = fma(m · dx, S, acc[0])
                        let sum = _mm512_set1_ps(sums[row * nb + b]);
                        let t = _mm512_mul_ps(mwg[g], dx);
                        lo_acc[i][g] = _mm512_mask3_fmadd_ps(t, sum, lo_acc[i][g], 0x1111);
                    }
                }
            }
        }
        let mut out = [[0.0f32; M]; G];
        for i in 0..M {
            for g in 0..2 {
                let (mut lo, mut hi) = ([0.0f32; 16], [0.0f32; 16]);
                // SAFETY: 16 f32 of room each.
                unsafe {
                    _mm512_storeu_ps(lo.as_mut_ptr(), lo_acc[i][g]);
                    _mm512_storeu_ps(hi.as_mut_ptr(), hi_acc[i][g]);
                }
                for j in 0..4 {
                    let mut l = [0.0f32; LANES];
                    l[..4].copy_from_slice(&lo[4 * j..4 * j + 4]);
                    l[4..].copy_from_slice(&hi[4 * j..4 * j + 4]);
                    out[4 * g + j][i] = fold_lanes(l);
                }
            }
        }
        out
    }

    /// The GEMM's micro-kernel: the tile `tile` (`nb` blocks, see
    /// `packed_gemm`) times activation rows `i0..i0 + R`, the 16 rows'
    /// folded outputs per activation row.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn tile_vnni<const MIN: bool, const R: usize>(
        tile: &[u8],
        nb: usize,
        acts: &Acts<'_>,
        sums: &[f32],
        i0: usize,
    ) -> [[f32; TILE_ROWS]; R] {
        let min = MIN;
        let tb = tile_block_bytes(min);
        assert!(tile.len() >= nb * tb, "gemm tile: bytes");
        assert_eq!(tile.as_ptr() as usize % 64, 0, "gemm tile: alignment");
        assert_eq!(acts.cols, nb * QK, "gemm tile: columns");
        assert!(
            (i0 + R) * acts.cols <= acts.q.len(),
            "gemm tile: activations"
        );
        assert!((i0 + R) * nb <= acts.scale.len(), "gemm tile: scales");
        assert!(
            (i0 + R) * nb * LANES <= acts.bias.len(),
            "gemm tile: biases"
        );
        assert!(!min || (i0 + R) * nb <= sums.len(), "gemm tile: sums");
        let tp = tile.as_ptr();
        let cols = acts.cols;
        let mut acc = [[_mm512_setzero_ps(); LANES]; R];
        for b in 0..nb {
            // SAFETY: the asserts above: block b of the tile is tb bytes at
            // b · tb (64-byte aligned: tb is a multiple of 64), and each
            // activation row i0 + r < i0 + R has block b's 32 values, scale,
            // eight biases (and sum).
            unsafe {
                let blk = tp.add(b * tb);
                let dw = _mm512_load_ps(blk.add(512).cast());
                let mut s = [_mm512_setzero_ps(); R];
                for (r, s) in s.iter_mut().enumerate() {
                    let dx = *acts.scale.get_unchecked((i0 + r) * nb + b);
                    *s = _mm512_mul_ps(dw, _mm512_set1_ps(dx));
                }
                for l in 0..LANES {
                    let w = _mm512_load_si512(blk.add(64 * l).cast());
                    for (r, acc_r) in acc.iter_mut().enumerate() {
                        let row = i0 + r;
                        let x = acts
                            .q
                            .as_ptr()
                            .add(row * cols + b * QK + 4 * l)
                            .cast::<i32>()
                            .read_unaligned();
                        let bias = *acts.bias.get_unchecked((row * nb + b) * LANES + l);
                        let p =
                            _mm512_dpbusd_epi32(_mm512_set1_epi32(bias), w, _mm512_set1_epi32(x));
                        acc_r[l] = _mm512_fmadd_ps(s[r], _mm512_cvtepi32_ps(p), acc_r[l]);
                    }
                }
                if min {
                    // each row's lane 0: acc[0] = fma(m · dx, S, acc[0])
                    let mw = _mm512_load_ps(blk.add(576).cast());
                    for (r, acc_r) in acc.iter_mut().enumerate() {
                        let k = (i0 + r) * nb + b;
                        let t = _mm512_mul_ps(mw, _mm512_set1_ps(*acts.scale.get_unchecked(k)));
                        acc_r[0] =
                            _mm512_fmadd_ps(t, _mm512_set1_ps(*sums.get_unchecked(k)), acc_r[0]);
                    }
                }
            }
        }
        let mut out = [[0.0f32; TILE_ROWS]; R];
        for (o, a) in out.iter_mut().zip(&acc) {
            // fold_lanes, lane vector by lane vector: l + 4, l + 2, l + 1
            let a0 = _mm512_add_ps(a[0], a[4]);
            let a1 = _mm512_add_ps(a[1], a[5]);
            let a2 = _mm512_add_ps(a[2], a[6]);
            let a3 = _mm512_add_ps(a[3], a[7]);
            let a0 = _mm512_add_ps(a0, a2);
            let a1 = _mm512_add_ps(a1, a3);
            // SAFETY: 16 f32 of room.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr(), _mm512_add_ps(a0, a1)) };
        }
        out
    }

    /// `fill_tile` with AVX-512: per block, the 16 rows' four-byte lanes
    /// gathered from the two strips' value regions (a nibble lane's dword
    /// gives lanes `l` and `l + 4`), the Q5 fifth bits spread to bytes by a
    /// multiply, IQ4_NL's table looked up by `vpshufb`; the same bytes as the
    /// portable `fill_tile`.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn fill_tile_vnni(
        lay: &StripLayout,
        data: &[u8],
        s: usize,
        count: usize,
        tile: &mut [u8],
    ) {
        let nb = lay.nb;
        let sb = lay.strip_bytes;
        let tb = tile_block_bytes(lay.min);
        assert!((1..=2).contains(&count), "gemm fill: strips");
        assert!((s + count) * sb <= data.len(), "gemm fill: strips");
        assert!(tile.len() >= nb * tb, "gemm fill: tile");
        assert_eq!(tile.as_ptr() as usize % 64, 0, "gemm fill: alignment");
        // The second strip's offset from the first (0 when it is missing:
        // its rows then read the first strip's and are masked to zero).
        let far = i32::try_from(if count == 2 { sb } else { 0 }).expect("gemm fill: strip size");
        let keep: __mmask16 = if count == 2 { 0xffff } else { 0x00ff };
        let sh = lay.shape;
        let rv = lay.row_values() as i32;
        let s0 = data.as_ptr().wrapping_add(s * sb);
        let s1 = s0.wrapping_add(far as usize);
        let rows = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
        let halves =
            _mm512_mask_blend_epi32(0xff00, _mm512_setzero_si512(), _mm512_set1_epi32(far));
        // offset of row t's first value byte of block 0 from the first strip
        let row_off = _mm512_add_epi32(_mm512_mullo_epi32(rows, _mm512_set1_epi32(rv)), halves);
        let m4 = _mm512_set1_epi8(0x0f);
        let flip = _mm512_set1_epi8(-128);
        let table = _mm512_broadcast_i32x4(iq4_table(true));
        let spread = _mm512_set1_epi32(0x0020_4081);
        let ones = _mm512_set1_epi32(0x0101_0101);
        let tp = tile.as_mut_ptr();
        let vo = lay.values_offset();
        let ho = lay.high_offset();
        let widen = |p: *const u8, o: usize| {
            // SAFETY: o + 16 <= the region's bytes within each strip (16
            // bytes per block in the scale and min regions).
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.add(o).cast())) }
        };
        for b in 0..nb {
            // SAFETY: the asserts above: block b of the tile is tb bytes at b · tb
            // (64-aligned); every read below is inside strip s or s + 1 (the
            // scales, mins and fifth bits of block b, its values).
            unsafe {
                let blk = tp.add(b * tb);
                for (region, at) in [(0usize, 512usize), (lay.scale_bytes, 576)] {
                    if region != 0 && !lay.min {
                        continue;
                    }
                    let lo = widen(s0, region + b * 2 * G);
                    let hi = widen(s1, region + b * 2 * G);
                    let v = _mm512_insertf32x8::<1>(_mm512_castps256_ps512(lo), hi);
                    _mm512_store_ps(blk.add(at).cast(), _mm512_maskz_mov_ps(keep, v));
                }
                let base = _mm512_add_epi32(
                    row_off,
                    _mm512_set1_epi32((vo + b * G * rv as usize) as i32),
                );
                if !sh.nibbles() {
                    for l in 0..8 {
                        let idx = _mm512_add_epi32(base, _mm512_set1_epi32(4 * l));
                        let g = _mm512_mask_i32gather_epi32::<1>(
                            _mm512_setzero_si512(),
                            keep,
                            idx,
                            s0.cast(),
                        );
                        let g = _mm512_maskz_mov_epi32(keep, _mm512_xor_si512(g, flip));
                        _mm512_store_si512(blk.add(64 * l as usize).cast(), g);
                    }
                    continue;
                }
                let (qlo, qhi) = match sh.high {
                    Some(_) => {
                        let q = |o: usize| {
                            let a = _mm256_cvtepu16_epi32(_mm_loadu_si128(
                                s0.add(ho + b * 4 * G + o).cast(),
                            ));
                            let c = _mm256_cvtepu16_epi32(_mm_loadu_si128(
                                s1.add(ho + b * 4 * G + o).cast(),
                            ));
                            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), c)
                        };
                        (q(0), q(2 * G))
                    }
                    None => (_mm512_setzero_si512(), _mm512_setzero_si512()),
                };
                for l in 0..4 {
                    let idx = _mm512_add_epi32(base, _mm512_set1_epi32(4 * l));
                    let g = _mm512_mask_i32gather_epi32::<1>(
                        _mm512_setzero_si512(),
                        keep,
                        idx,
                        s0.cast(),
                    );
                    let mut lo = _mm512_and_si512(g, m4);
                    let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(g), m4);
                    if sh.high.is_some() {
                        // bits 4l..4l + 4 of each row's mask to bit 4 of the
                        // lane's four bytes: (t · 0x204081) & 0x01010101 puts
                        // bit j at bit 8j (no two partial products meet)
                        let bits = |q: __m512i| {
                            let t = _mm512_and_si512(
                                _mm512_srlv_epi32(q, _mm512_set1_epi32(4 * l)),
                                _mm512_set1_epi32(0xf),
                            );
                            let t = _mm512_and_si512(_mm512_mullo_epi32(t, spread), ones);
                            _mm512_slli_epi32::<4>(t)
                        };
                        lo = _mm512_or_si512(lo, bits(qlo));
                        hi = _mm512_or_si512(hi, bits(qhi));
                    } else if sh.table {
                        lo = _mm512_shuffle_epi8(table, lo);
                        hi = _mm512_shuffle_epi8(table, hi);
                    }
                    _mm512_store_si512(
                        blk.add(64 * l as usize).cast(),
                        _mm512_maskz_mov_epi32(keep, lo),
                    );
                    _mm512_store_si512(
                        blk.add(64 * (l as usize + 4)).cast(),
                        _mm512_maskz_mov_epi32(keep, hi),
                    );
                }
            }
        }
    }

    /// Q8_0 strip × activation row `i` with `vpmaddubsw` + `vpmaddwd` on
    /// 256-bit vectors (`|w| · (x · sign w)`, as the in-place AVX2 kernel), one
    /// row per vector.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn strip_avx2_q8(
        lay: &StripLayout,
        strip: &[u8],
        acts: &Acts<'_>,
        i: usize,
    ) -> [f32; G] {
        check_acts::<1>(lay, acts, i, strip);
        let nb = lay.nb;
        let sp = strip.as_ptr();
        // SAFETY: the values start scale_bytes (< strip_bytes) into the strip.
        let vp = unsafe { sp.add(lay.scale_bytes) };
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); G];
        for b in 0..nb {
            prefetch_lines::<4>(vp.wrapping_add(b * 256));
            // SAFETY: check_acts bounds block b of row i and of the strip; the
            // scales are 16-byte aligned, each row's 32 values 32-byte aligned.
            let (sv, xv) = unsafe {
                (
                    scales8(sp, b, acts.scale[i * nb + b]),
                    _mm256_loadu_si256(acts.q.as_ptr().add(i * acts.cols + b * QK).cast()),
                )
            };
            for (r, a) in acc.iter_mut().enumerate() {
                // SAFETY: as above.
                let wv = unsafe { _mm256_load_si256(vp.add(b * 256 + r * 32).cast()) };
                let pairs =
                    _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
                let p = _mm256_madd_epi16(pairs, ones);
                let s = _mm256_permutevar8x32_ps(sv, _mm256_set1_epi32(r as i32));
                *a = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(p), *a);
            }
        }
        let mut out = [0.0f32; G];
        for (o, &a) in out.iter_mut().zip(&acc) {
            let mut l = [0.0f32; LANES];
            // SAFETY: 8 f32 of room.
            unsafe { _mm256_storeu_ps(l.as_mut_ptr(), a) };
            *o = fold_lanes(l);
        }
        out
    }

    /// Nibble strip (Q4_0, Q5_0, Q4_1, Q5_1, IQ4_NL: `F`) × activation row `i` with
    /// `vpmaddubsw` + `vpmaddwd` on 256-bit vectors, two rows' low or high
    /// nibbles per vector: the unsigned codes (Q5_0's fifth bits spread from
    /// two rows' 32-bit mask) plus the lane bias, IQ4_NL's signed table values
    /// through the sign trick as Q8_0's.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn strip_avx2_nibbles<F: Block32>(
        lay: &StripLayout,
        strip: &[u8],
        acts: &Acts<'_>,
        sums: &[f32],
        i: usize,
    ) -> [f32; G] {
        check_acts::<1>(lay, acts, i, strip);
        let min = F::NEEDS_SUMS;
        assert!(!min || (i + 1) * lay.nb <= sums.len(), "quant strip: sums");
        // SAFETY: the mins (Q4_1, Q5_1) start scale_bytes into the strip.
        let mp = unsafe { strip.as_ptr().add(lay.scale_bytes) };
        let nb = lay.nb;
        let sp = strip.as_ptr();
        // SAFETY: the values start values_offset (< strip_bytes) into the
        // strip, the high bits (Q5_0) scale_bytes into it.
        let (vp, hp) = unsafe { (sp.add(lay.values_offset()), sp.add(lay.high_offset())) };
        let ones = _mm256_set1_epi16(1);
        let m4 = _mm256_set1_epi8(0x0f);
        let table = _mm256_broadcastsi128_si256(iq4_table(false));
        let mut lo_acc = [_mm256_setzero_ps(); 4];
        let mut hi_acc = [_mm256_setzero_ps(); 4];
        for b in 0..nb {
            prefetch_lines::<2>(vp.wrapping_add(b * 128));
            // SAFETY: as in strip_avx2_q8.
            let (sv, xlo, xhi, blo, bhi) = unsafe {
                let xq = acts.q.as_ptr().add(i * acts.cols + b * QK);
                let bp = acts.bias.as_ptr().add((i * nb + b) * LANES);
                (
                    scales8(sp, b, acts.scale[i * nb + b]),
                    _mm256_broadcastsi128_si256(_mm_loadu_si128(xq.cast())),
                    _mm256_broadcastsi128_si256(_mm_loadu_si128(xq.add(16).cast())),
                    _mm256_broadcastsi128_si256(_mm_loadu_si128(bp.cast())),
                    _mm256_broadcastsi128_si256(_mm_loadu_si128(bp.add(4).cast())),
                )
            };
            let (mv, sum) = if min {
                // SAFETY: as the scales (the min region has their layout).
                let mv = unsafe { scales8(mp, b, acts.scale[i * nb + b]) };
                (mv, _mm256_set1_ps(sums[i * nb + b]))
            } else {
                (_mm256_setzero_ps(), _mm256_setzero_ps())
            };
            for g in 0..4 {
                // SAFETY: as above (128 value bytes per block, 32-aligned).
                let v = unsafe { _mm256_load_si256(vp.add(b * 128 + g * 32).cast()) };
                let mut lo = _mm256_and_si256(v, m4);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                let (pl, ph) = if F::SHAPE.table {
                    lo = _mm256_shuffle_epi8(table, lo);
                    hi = _mm256_shuffle_epi8(table, hi);
                    let dot = |w: __m256i, x: __m256i| {
                        let pairs =
                            _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
                        _mm256_madd_epi16(pairs, ones)
                    };
                    (dot(lo, xlo), dot(hi, xhi))
                } else {
                    if F::SHAPE.high.is_some() {
                        // SAFETY: check_acts: block b's 32 high-bit bytes are
                        // in the strip's high region (high_offsets).
                        let (ml, mh) = unsafe {
                            let q = hp.add(b * 4 * G + 4 * g);
                            (
                                q.cast::<u32>().read_unaligned(),
                                q.add(2 * G).cast::<u32>().read_unaligned(),
                            )
                        };
                        lo = _mm256_or_si256(lo, high_bits(ml));
                        hi = _mm256_or_si256(hi, high_bits(mh));
                    }
                    let dot = |w: __m256i, x: __m256i, bias: __m256i| {
                        _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones), bias)
                    };
                    (dot(lo, xlo, blo), dot(hi, xhi, bhi))
                };
                let r = 2 * g as i32;
                let spread = _mm256_setr_epi32(r, r, r, r, r + 1, r + 1, r + 1, r + 1);
                let s = _mm256_permutevar8x32_ps(sv, spread);
                lo_acc[g] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(pl), lo_acc[g]);
                hi_acc[g] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(ph), hi_acc[g]);
                if min {
                    // the two rows' lane 0: acc[0] = fma(m · dx, S, acc[0])
                    let t = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(mv, spread), sum, lo_acc[g]);
                    lo_acc[g] = _mm256_blend_ps::<0x11>(lo_acc[g], t);
                }
            }
        }
        let mut out = [0.0f32; G];
        for g in 0..4 {
            let (mut lo, mut hi) = ([0.0f32; 8], [0.0f32; 8]);
            // SAFETY: 8 f32 of room each.
            unsafe {
                _mm256_storeu_ps(lo.as_mut_ptr(), lo_acc[g]);
                _mm256_storeu_ps(hi.as_mut_ptr(), hi_acc[g]);
            }
            for e in 0..2 {
                let mut l = [0.0f32; LANES];
                l[..4].copy_from_slice(&lo[4 * e..4 * e + 4]);
                l[4..].copy_from_slice(&hi[4 * e..4 * e + 4]);
                out[2 * g + e] = fold_lanes(l);
            }
        }
        out
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::kernels::quant_block::{IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};

    /// Arbitrary block bytes (finite f16 scales and mins), `rows` rows of
    /// `nb` blocks of `F`.
    fn blocks<F: Block32>(rows: usize, nb: usize, seed: u64) -> Vec<u8> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut v: Vec<u8> = (0..rows * nb * F::BYTES)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 32) as u8
            })
            .collect();
        for blk in v.chunks_exact_mut(F::BYTES) {
            blk[1] &= 0xbf; // exponent below 31: finite
            if F::NEEDS_SUMS {
                blk[3] &= 0xbf;
            }
        }
        v
    }

    fn fill_matches<F: Block32>() {
        if path() != Path::Vnni {
            return;
        }
        for (rows, nb) in [(8usize, 1usize), (16, 3), (11, 5), (24, 2)] {
            let lay = StripLayout::new::<F>(nb).expect("layout");
            let src = blocks::<F>(rows, nb, rows as u64 * 31 + nb as u64);
            let strips = rows.div_ceil(G);
            // 64-byte aligned strips, as a PackedQuantMatrix holds them
            let mut lines = vec![[0u64; 8]; strips * lay.strip_bytes / 64];
            // SAFETY: [u64; 8] is 64 plain bytes.
            let data: &mut [u8] = unsafe {
                std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast(), lines.len() * 64)
            };
            for s in 0..strips {
                let sb = lay.strip_bytes;
                repack_strip(&lay, &src, rows, s, &mut data[s * sb..(s + 1) * sb]);
            }
            let tb = tile_block_bytes(lay.min);
            for s in 0..strips {
                for count in 1..=(strips - s).min(2) {
                    let mut want = vec![0xa5u8; nb * tb];
                    fill_tile(&lay, data, s, count, &mut want);
                    let mut room = vec![0x5au8; nb * tb + 64];
                    let skip = room.as_ptr().align_offset(64);
                    let got = &mut room[skip..skip + nb * tb];
                    // SAFETY: path() is Vnni.
                    unsafe { x86::fill_tile_vnni(&lay, data, s, count, got) };
                    assert_eq!(want, got, "rows {rows}, nb {nb}, strip {s}, count {count}");
                }
            }
        }
    }

    #[test]
    fn the_vector_tile_fill_gives_the_plain_bytes() {
        fill_matches::<Q8_0>();
        fill_matches::<Q4_0>();
        fill_matches::<Q4_1>();
        fill_matches::<Q5_0>();
        fill_matches::<Q5_1>();
        fill_matches::<IQ4_NL>();
    }
}
