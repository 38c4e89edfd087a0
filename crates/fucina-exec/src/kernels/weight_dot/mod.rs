//! The kernels of [`ExecContext::weight_matmul`](crate::ExecContext::weight_matmul):
//! dot products of f32 activation rows with weight rows kept in their file format
//! (f32, f16, bf16), in the fixed 16-lane order that the op documents
//! (`src/ops/weight_matmul.rs`), at every vector level.
//!
//! # Blocking
//! A call computes a range of output features `j` (weight rows) for all `m`
//! activation rows. The range is walked in blocks of `R` weight rows; for each
//! block the activation rows are walked in blocks of `MB`, and one block kernel
//! keeps `R * MB` sixteen-lane accumulators (one per output) while it streams
//! the `R` weight rows and the `MB` activation rows once, 16 columns at a step:
//! each weight vector is loaded and widened once per step and used by `MB`
//! fused multiply-adds, each activation vector by `R`. After the last step every
//! accumulator is folded (lanes `l + 8` into `l`, then `+ 4`, `+ 2`, `+ 1`).
//! With `m = 1` (decode) this reads every weight byte exactly once from memory;
//! with `m > 1` the `R` weight rows of a block are re-read from the L1/L2 cache
//! for each further block of activation rows, so memory traffic stays one pass
//! over the weights.
//!
//! The blocking changes nothing in the bits: every output is its own chain of
//! sixteen lanes, each lane takes its terms in increasing `k` with one fused
//! multiply-add each, whatever `R`, `MB` and the vector width.
//!
//! # Levels
//! - AVX-512: a lane chain is one `zmm`. bf16 is widened by one `vpermw` that
//!   moves word `i` to the upper half of lane `i` and zeroes the lower halves
//!   (one shuffle in place of a zero-extension and a shift; not timed apart
//!   from the other changes), f16 by `vcvtph2ps` (exact). The last, partial step uses masked
//!   loads (masked-off lanes read as 0 and are never touched in memory).
//!   `R = 1`, `MB = 1` for `m = 1` (see "Decode" below); `R = 3`, `MB = 8` otherwise (24
//!   accumulators, 3 weight vectors, one activation vector: 28 of the 32
//!   registers); leftover activation rows in blocks of 4, 2, 1. With `m > 1`
//!   the walk is tiled (`x86_avx512::drive_tiled`): tiles of 24 weight rows, and
//!   within a tile, for each block of 8 activation rows, k-blocks of at most
//!   768 columns, each run over every weight block of the tile; a block's
//!   accumulators wait in a stack scratch between its k-blocks (each lane
//!   still takes its terms in increasing `k`, so the bits are those of one
//!   pass). The activation panel (8 rows by one k-block, at most 24 KiB) is
//!   then read from L1 by the 8 weight blocks of the tile, where the untiled
//!   walk read all `m` activation rows from L2 for each weight block
//!   (m = 64, bf16, one thread: 1.06–1.30 × as fast on the SmolLM2 shapes,
//!   see docs/BENCHMARKS-JOURNAL.md). There the bf16 zeroing mask is made opaque to
//!   the compiler, which otherwise turns the zero-masked `vpermw` into
//!   `vpermw` + `vpandq`.
//! - AVX2 + FMA: a lane chain is two `ymm` (lanes 0–7 and 8–15); the fold starts
//!   by adding the two. f16 needs F16C (`vcvtph2ps`); without it the f16 path runs
//!   the portable kernel (same bits). The partial step is copied into zeroed stack
//!   buffers. `R = 1`, `MB = 1` for `m = 1`; `R = 2`, `MB = 2` otherwise.
//! - Portable: `[f32; 16]` accumulators and `f32::mul_add` (a fused
//!   multiply-add on every target), elements widened by
//!   [`WeightFormat::element`].
//!
//! # The partial step
//! The order pads each row with `0 · 0` terms up to the next multiple of 16
//! (see `src/ops/weight_matmul.rs`), which is what masked loads (AVX-512),
//! zero-padded copies (AVX2) and zero-filled lanes (portable) compute.
//!
//! # Decode (`m = 1`)
//! With one activation row every weight byte is read once, and the speed is
//! that of the weight stream. At AVX-512 (`x86_avx512::drive_decode`) the
//! rows of a call are cut into two halves, and row `s + i` of the first half
//! is computed together with row `s + h + i` of the second: two chains, so
//! the core overlaps two fused multiply-adds where one chain alone (a fused
//! multiply-add every 4 cycles, 32 bytes of bf16) caps a core at about 8
//! bytes a cycle, and two weight streams, each walking its half's rows one
//! after another, so each is one sequential stream that a prefetch a fixed
//! distance ahead (`x86_avx512::DECODE_PREFETCH`, 512 bytes) serves across
//! row ends (TinyLlama's rows are 4 and 11 KiB, one page or more). Two
//! adjacent rows per block instead would make each stream skip every other
//! row. The previous walk (one row at a time, prefetching the same offset of
//! the next row, so a whole row ahead) read TinyLlama's bf16 shapes at 0.61
//! of the streaming read on Zen 4, 0.63 of llama.cpp's speed; the two
//! streams decode 1.26–1.61 × as fast (docs/BENCHMARKS.md, "bf16 decode in
//! two streams"). The other levels still walk one weight row at a time.
//!
//! # Prefetch
//! Apart from the AVX-512 decode walk above: with `m = 1` nothing but the
//! weights leave the caches; while a block of `R` rows is read (`R`
//! streams), each 64 bytes of each row also prefetch the same line of the
//! matching row of the next block, so that the next block's row starts are
//! in flight before they are needed (short rows, 576 bf16 columns, gained
//! most: see `prefetch_next_block`).
//!
//! # Layout
//!
//! As every kernel family: this file holds the order's driver, the blocking
//! and the dispatch; `portable.rs` the kernel every CPU runs, `x86_avx2.rs`
//! and `x86_avx512.rs` the instruction-set kernels, compiled only for x86-64.

use std::ops::Range;

use crate::kernels::simd::{self, SimdLevel};
use crate::weight_format::{WEIGHT_DOT_LANES, WeightFormat, WeightMatrix};

/// Lanes per chain.
const L: usize = WEIGHT_DOT_LANES;

/// Format tags for the kernels' const parameter.
const F32: u8 = 0;
const F16: u8 = 1;
const BF16: u8 = 2;

/// Bytes per element of a format tag.
const fn elem_size(fmt: u8) -> usize {
    if fmt == F32 { 4 } else { 2 }
}

/// The format of a tag (for the portable kernel's element reads).
const fn format_of(fmt: u8) -> WeightFormat {
    match fmt {
        F32 => WeightFormat::F32,
        F16 => WeightFormat::F16,
        _ => WeightFormat::BF16,
    }
}

/// The kernel family a call of `format` runs now ([`simd::choose`]): the
/// AVX-512 one where the level enables AVX-512, the AVX2 one where it enables
/// AVX2 and FMA (and F16C for f16 weights), the portable one otherwise (the
/// same bits on each).
fn kern_for(format: WeightFormat) -> Kern {
    #[cfg(target_arch = "x86_64")]
    {
        use simd::CpuFeatures as F;
        let avx2 = if format == WeightFormat::F16 {
            AVX2_F16C
        } else {
            F::LEVEL_AVX2
        };
        simd::choose(
            &[(Kern::Avx512, F::LEVEL_AVX512), (Kern::Avx2, avx2)],
            Kern::Portable,
        )
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = format;
        Kern::Portable
    }
}

/// The features of the AVX2 kernels: AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
const AVX2_F16C: simd::CpuFeatures = simd::CpuFeatures::LEVEL_AVX2.with(simd::CpuFeatures::F16C);

/// The kernel family a call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kern {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Kern {
    /// Whether the CPU has every feature the family's kernels use.
    fn available(self) -> bool {
        match self {
            Kern::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Kern::Avx2 => simd::CpuFeatures::detected().has(AVX2_F16C),
            #[cfg(target_arch = "x86_64")]
            Kern::Avx512 => simd::detected() == SimdLevel::Avx512,
        }
    }

    /// `(R, MB)`: weight rows and activation rows per block kernel.
    fn blocking(self, m: usize) -> (usize, usize) {
        match (self, m) {
            // One weight row at a time: the matrix read as one sequential
            // stream (see "Decode" in the module docs).
            (_, 1) => (1, 1),
            #[cfg(target_arch = "x86_64")]
            (Kern::Avx512, _) => (3, 8),
            #[cfg(target_arch = "x86_64")]
            (Kern::Avx2, _) => (2, 2),
            (Kern::Portable, _) => (2, 2),
        }
    }
}

/// Computes `out[(j - rows.start) * m + i] = Σ_k x[i, k] · w[j, k]` for `j` in
/// `rows` and `i < m`, in the fixed order (the output is `[rows.len(), m]`, the
/// transpose of the op's `[m, rows]` layout, so that a range of weight rows owns
/// one contiguous piece of it).
///
/// # Panics
/// If `x.len() != m * w.cols`, `rows` is not within `w.rows`, `out.len() !=
/// rows.len() * m`, or `w.bytes` does not hold `w.rows * w.cols` elements (the
/// op checks all of these first).
pub(crate) fn weight_rows(
    x: &[f32],
    m: usize,
    w: &WeightMatrix<'_>,
    rows: Range<usize>,
    out: &mut [f32],
) {
    weight_rows_with(kern_for(w.format), x, m, w, rows, out);
}

/// [`weight_rows`] with the kernel family given (tests run every family).
fn weight_rows_with(
    kern: Kern,
    x: &[f32],
    m: usize,
    w: &WeightMatrix<'_>,
    rows: Range<usize>,
    out: &mut [f32],
) {
    let cols = w.cols;
    let es = w.format.size_bytes();
    assert_eq!(x.len(), m * cols, "weight_rows: activation length");
    assert!(
        rows.start <= rows.end && rows.end <= w.rows,
        "weight_rows: rows"
    );
    assert_eq!(out.len(), rows.len() * m, "weight_rows: output length");
    assert_eq!(
        w.bytes.len(),
        w.rows * cols * es,
        "weight_rows: weight bytes"
    );
    assert!(
        kern.available(),
        "weight_rows: {kern:?} kernels on this CPU"
    );
    let run = match w.format {
        WeightFormat::F32 => drive::<F32>,
        WeightFormat::F16 => drive::<F16>,
        WeightFormat::BF16 => drive::<BF16>,
    };
    #[cfg(target_arch = "x86_64")]
    if kern == Kern::Avx512 && m == 1 && rows.len() >= 2 {
        let two = match w.format {
            WeightFormat::F32 => x86_avx512::drive_decode::<F32>,
            WeightFormat::F16 => x86_avx512::drive_decode::<F16>,
            WeightFormat::BF16 => x86_avx512::drive_decode::<BF16>,
        };
        // SAFETY: `kern`'s features were just checked.
        unsafe { two(x, w.bytes, cols, rows, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if kern == Kern::Avx512 && m > 1 {
        let tiled = match w.format {
            WeightFormat::F32 => x86_avx512::drive_tiled::<F32>,
            WeightFormat::F16 => x86_avx512::drive_tiled::<F16>,
            WeightFormat::BF16 => x86_avx512::drive_tiled::<BF16>,
        };
        // SAFETY: `kern`'s features were just checked.
        unsafe { tiled(x, m, w.bytes, cols, rows, out) };
        return;
    }
    // SAFETY: `kern`'s features were just checked.
    unsafe { run(kern, x, m, w.bytes, cols, rows, out) }
}

/// Walks `rows` in blocks of `R` weight rows and `m` in blocks of `MB`
/// activation rows (see the module docs), calling the block kernel of `kern`.
///
/// # Safety
/// The CPU has `kern`'s features ([`Kern::available`]).
unsafe fn drive<const FMT: u8>(
    kern: Kern,
    x: &[f32],
    m: usize,
    bytes: &[u8],
    cols: usize,
    rows: Range<usize>,
    out: &mut [f32],
) {
    let rb = cols * elem_size(FMT);
    let (r_main, mb_max) = kern.blocking(m);
    let mut j = rows.start;
    while j < rows.end {
        let r = if rows.end - j >= r_main { r_main } else { 1 };
        let wb = &bytes[j * rb..(j + r) * rb];
        let o0 = (j - rows.start) * m;
        let ob = &mut out[o0..o0 + r * m];
        let mut i = 0;
        while i < m {
            let mb = [8, 4, 2, 1]
                .into_iter()
                .find(|&b| b <= mb_max && b <= m - i)
                .unwrap_or(1);
            let xb = &x[i * cols..(i + mb) * cols];
            // SAFETY: the caller guarantees `kern`'s features.
            unsafe { block::<FMT>(kern, r, mb, xb, cols, wb, &mut ob[i..], m) };
            i += mb;
        }
        j += r;
    }
}

/// One block kernel call: `r` weight rows (`w`, `r * cols` elements) times `mb`
/// activation rows (`x`, `mb * cols` floats) into `out[rr * m + i]`.
///
/// # Safety
/// The CPU has `kern`'s features ([`Kern::available`]).
#[allow(clippy::too_many_arguments)]
#[inline]
unsafe fn block<const FMT: u8>(
    kern: Kern,
    r: usize,
    mb: usize,
    x: &[f32],
    cols: usize,
    w: &[u8],
    out: &mut [f32],
    m: usize,
) {
    macro_rules! pick {
        ($($f:ident)::+) => {
            match (r, mb) {
                (4, 1) => $($f)::+::<FMT, 4, 1>(x, cols, w, out, m),
                (3, 8) => $($f)::+::<FMT, 3, 8>(x, cols, w, out, m),
                (3, 4) => $($f)::+::<FMT, 3, 4>(x, cols, w, out, m),
                (3, 2) => $($f)::+::<FMT, 3, 2>(x, cols, w, out, m),
                (3, 1) => $($f)::+::<FMT, 3, 1>(x, cols, w, out, m),
                (2, 8) => $($f)::+::<FMT, 2, 8>(x, cols, w, out, m),
                (2, 4) => $($f)::+::<FMT, 2, 4>(x, cols, w, out, m),
                (2, 2) => $($f)::+::<FMT, 2, 2>(x, cols, w, out, m),
                (2, 1) => $($f)::+::<FMT, 2, 1>(x, cols, w, out, m),
                (1, 8) => $($f)::+::<FMT, 1, 8>(x, cols, w, out, m),
                (1, 4) => $($f)::+::<FMT, 1, 4>(x, cols, w, out, m),
                (1, 2) => $($f)::+::<FMT, 1, 2>(x, cols, w, out, m),
                (1, 1) => $($f)::+::<FMT, 1, 1>(x, cols, w, out, m),
                _ => unreachable!("weight_rows: no block kernel for {r} x {mb}"),
            }
        };
    }
    match kern {
        Kern::Portable => pick!(portable::block),
        // SAFETY: the caller guarantees the features of the AVX2 kernels.
        #[cfg(target_arch = "x86_64")]
        Kern::Avx2 => unsafe { pick!(x86_avx2::block) },
        // SAFETY: the caller guarantees the features of the AVX-512 kernels.
        #[cfg(target_arch = "x86_64")]
        Kern::Avx512 => unsafe { pick!(x86_avx512::block) },
    }
}

/// Checks a block kernel's operands (the vector kernels read through raw
/// pointers within these bounds).
#[allow(clippy::too_many_arguments)]
#[inline]
fn check_block(
    r: usize,
    mb: usize,
    es: usize,
    x: &[f32],
    cols: usize,
    w: &[u8],
    out: &[f32],
    m: usize,
) {
    assert!(
        x.len() >= mb * cols
            && w.len() >= r * cols * es
            && mb <= m
            && out.len() >= (r - 1) * m + mb,
        "weight_rows: block operands"
    );
}

/// Prefetches, for each of the `R` rows of a block, the cache line at byte
/// `off` of the same row in the next block (`R * rb` bytes further on): the
/// rows of a block are contiguous, so while a block is read the whole next
/// block is requested, including the starts of its rows, which a prefetch a
/// fixed distance ahead within each row would miss (bf16, 576 columns, one
/// thread: 0.53–0.73 of the streaming bandwidth 1024 bytes ahead within the
/// row, 0.69–0.85 512 bytes ahead, 0.71–0.87 with this scheme; see
/// docs/BENCHMARKS-JOURNAL.md).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "sse")]
fn prefetch_next_block<const R: usize>(w: *const u8, rb: usize, off: usize) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    for r in 0..R {
        // A prefetch never faults; the address is computed with wrapping
        // arithmetic (past the last block it may lie outside the matrix).
        _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add((R + r) * rb + off).cast());
    }
}

mod portable;
#[cfg(target_arch = "x86_64")]
mod x86_avx2;
#[cfg(target_arch = "x86_64")]
mod x86_avx512;

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference dot product of `x` with row `r` of `w`, in the fixed summation
    /// order. Every fast kernel must return these bits (the tests below compare
    /// them with it).
    fn reference_dot(x: &[f32], w: &WeightMatrix<'_>, r: usize) -> f32 {
        let row = &w.bytes[r * w.cols * w.format.size_bytes()..];
        let mut acc = [0.0f32; WEIGHT_DOT_LANES];
        // Up to the next multiple of 16: the missing terms are `0 · 0`.
        for k in 0..w.cols.next_multiple_of(WEIGHT_DOT_LANES) {
            let l = k % WEIGHT_DOT_LANES;
            let (xk, wk) = match x.get(k).filter(|_| k < w.cols) {
                Some(&xk) => (xk, w.format.element(row, k)),
                None => (0.0, 0.0),
            };
            acc[l] = xk.mul_add(wk, acc[l]);
        }
        crate::kernels::reduce::fold_lanes(acc)
    }

    /// Pseudo-random floats with varied exponents, some exact zeros.
    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(12345);
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                if i % 29 == 7 {
                    return 0.0;
                }
                let mant = (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
                mant * [1.0, 3.0, 0.01, 100.0][(s & 3) as usize]
            })
            .collect()
    }

    fn bytes_of(format: WeightFormat, v: &[f32]) -> Vec<u8> {
        use fucina_storage::half::{bf16, f16};
        let mut b = Vec::new();
        for &x in v {
            match format {
                WeightFormat::F32 => b.extend_from_slice(&x.to_le_bytes()),
                WeightFormat::F16 => b.extend_from_slice(&f16::from_f32(x).to_bits().to_le_bytes()),
                WeightFormat::BF16 => {
                    b.extend_from_slice(&bf16::from_f32(x).to_bits().to_le_bytes())
                }
            }
        }
        b
    }

    fn kerns() -> Vec<Kern> {
        let mut k = vec![Kern::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if simd::CpuFeatures::detected().has(super::AVX2_F16C) {
                k.push(Kern::Avx2);
            }
            if simd::detected() == SimdLevel::Avx512 {
                k.push(Kern::Avx512);
            }
        }
        k
    }

    /// Every kernel family, every block shape the driver picks, unaligned
    /// weight bytes and sub-ranges of rows: the reference's bits.
    #[test]
    fn every_kernel_matches_the_reference() {
        for format in [WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16] {
            // (29, 1553): several k-blocks (one partial) and row tiles of the
            // `m > 1` AVX-512 driver; (50, 96): tiles with no leftover columns.
            for (rows, cols) in [
                (1, 1),
                (5, 15),
                (9, 16),
                (7, 17),
                (6, 33),
                (11, 100),
                (29, 1553),
                (50, 96),
            ] {
                let wv = values(rows * cols, (rows * 31 + cols) as u32);
                // One byte of offset: the kernels take unaligned rows.
                let mut raw = vec![0u8; 1];
                raw.extend(bytes_of(format, &wv));
                let w = WeightMatrix::new(format, rows, cols, &raw[1..]).unwrap();
                for m in [1, 2, 3, 5, 8, 13, 64, 67] {
                    let x = values(m * cols, (m + 7) as u32);
                    let want: Vec<f32> = (1..rows)
                        .flat_map(|j| {
                            let x = &x;
                            (0..m).map(move |i| reference_dot(&x[i * cols..(i + 1) * cols], &w, j))
                        })
                        .collect();
                    for kern in kerns() {
                        let mut out = vec![f32::NAN; (rows - 1) * m];
                        weight_rows_with(kern, &x, m, &w, 1..rows, &mut out);
                        let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
                        let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
                        assert_eq!(got, want, "{format:?} {rows}x{cols} m={m} {kern:?}");
                    }
                }
            }
        }
    }
}
