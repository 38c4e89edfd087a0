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
//!   the walk is tiled (`avx512::drive_tiled`): tiles of 24 weight rows, and
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
//! With one activation row the kernel walks one weight row at a time, so the
//! matrix is read as one sequential stream, which the hardware prefetchers
//! follow. Four rows at a time (four chains, four streams each one row long,
//! the previous blocking) computes twice as fast from the L2 cache but read
//! memory at about 0.4 of the streaming bandwidth on Zen 4 (bf16, 1024
//! columns, one thread), one row at a time at 0.6–0.76, its one chain (a
//! fused multiply-add every 4 cycles) still faster than a core's share of
//! memory (`examples/bf16_decode_probe.rs`; docs/BENCHMARKS-JOURNAL.md).
//!
//! # Prefetch
//! With `m = 1` nothing but the weights leave the caches; while a block of `R`
//! rows is read (`R` streams), each 64 bytes of each row also prefetch the
//! same line of the matching row of the next block, so that the next block's
//! row starts are in flight before they are needed (short rows, 576 bf16
//! columns, gained most: see `prefetch_next_block`).

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
    if kern == Kern::Avx512 && m > 1 {
        let tiled = match w.format {
            WeightFormat::F32 => avx512::drive_tiled::<F32>,
            WeightFormat::F16 => avx512::drive_tiled::<F16>,
            WeightFormat::BF16 => avx512::drive_tiled::<BF16>,
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
        Kern::Avx2 => unsafe { pick!(avx2::block) },
        // SAFETY: the caller guarantees the features of the AVX-512 kernels.
        #[cfg(target_arch = "x86_64")]
        Kern::Avx512 => unsafe { pick!(avx512::block) },
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

/// The portable kernel (and the tests' oracle of the blocking).
mod portable {
    use super::{L, check_block, elem_size, format_of};

    // Folds one chain: lanes `l + 8` into `l`, then `+ 4`, `+ 2`, `+ 1`.
    use crate::kernels::reduce::fold_lanes as fold;

    /// See [`super::block`].
    pub(super) fn block<const FMT: u8, const R: usize, const MB: usize>(
        x: &[f32],
        cols: usize,
        w: &[u8],
        out: &mut [f32],
        m: usize,
    ) {
        let es = elem_size(FMT);
        check_block(R, MB, es, x, cols, w, out, m);
        let fmt = format_of(FMT);
        let mut acc = [[[0.0f32; L]; R]; MB];
        let mut k = 0;
        while k < cols {
            let n = (cols - k).min(L);
            // Missing terms are 0 · 0 (see the module docs).
            let mut wv = [[0.0f32; L]; R];
            for (r, wr) in wv.iter_mut().enumerate() {
                let row = &w[(r * cols + k) * es..(r * cols + k + n) * es];
                for (l, v) in wr.iter_mut().take(n).enumerate() {
                    *v = fmt.element(row, l);
                }
            }
            for (i, acc_i) in acc.iter_mut().enumerate() {
                let mut xv = [0.0f32; L];
                xv[..n].copy_from_slice(&x[i * cols + k..i * cols + k + n]);
                for (acc_ir, wr) in acc_i.iter_mut().zip(&wv) {
                    for l in 0..L {
                        acc_ir[l] = xv[l].mul_add(wr[l], acc_ir[l]);
                    }
                }
            }
            k += L;
        }
        for (i, acc_i) in acc.iter().enumerate() {
            for (r, a) in acc_i.iter().enumerate() {
                out[r * m + i] = fold(*a);
            }
        }
    }
}

/// The AVX2 + FMA (+ F16C for f16) kernel.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{F16, F32, L, check_block, elem_size, prefetch_next_block};

    /// Eight elements at `p` widened to f32.
    ///
    /// # Safety
    /// AVX2 (and F16C for `F16`) is available; `p` is valid for reading eight
    /// elements of `FMT`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8<const FMT: u8>(p: *const u8) -> __m256 {
        // SAFETY: the caller guarantees the features and the eight elements;
        // every load is unaligned.
        unsafe {
            match FMT {
                F32 => _mm256_loadu_ps(p.cast()),
                F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
                _ => _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
                    _mm_loadu_si128(p.cast()),
                ))),
            }
        }
    }

    /// Folds one chain (`lo` = lanes 0–7, `hi` = lanes 8–15).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn fold(lo: __m256, hi: __m256) -> f32 {
        let s8 = _mm256_add_ps(lo, hi);
        let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        let s1 = _mm_add_ss(s2, _mm_shuffle_ps::<0b01>(s2, s2));
        _mm_cvtss_f32(s1)
    }

    /// One 16-column step over `R` weight rows and `MB` activation rows:
    /// `w + r * rb` and `x + i * xs` point at the step's first element.
    ///
    /// # Safety
    /// The features of [`load8`]; 16 elements readable at each of those.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn step<const FMT: u8, const R: usize, const MB: usize>(
        acc: &mut [[[__m256; 2]; R]; MB],
        x: *const f32,
        xs: usize,
        w: *const u8,
        rb: usize,
    ) {
        let es = elem_size(FMT);
        for h in 0..2 {
            let mut wv = [_mm256_setzero_ps(); R];
            for (r, v) in wv.iter_mut().enumerate() {
                // SAFETY: the caller guarantees 16 elements at `w + r * rb`.
                *v = unsafe { load8::<FMT>(w.add(r * rb + 8 * h * es)) };
            }
            for (i, acc_i) in acc.iter_mut().enumerate() {
                // SAFETY: the caller guarantees 16 floats at `x + i * xs`.
                let xv = unsafe { _mm256_loadu_ps(x.add(i * xs + 8 * h)) };
                for (a, v) in acc_i.iter_mut().zip(&wv) {
                    a[h] = _mm256_fmadd_ps(xv, *v, a[h]);
                }
            }
        }
    }

    /// See [`super::block`].
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block_impl<const FMT: u8, const R: usize, const MB: usize>(
        x: &[f32],
        cols: usize,
        w: &[u8],
        out: &mut [f32],
        m: usize,
    ) {
        let es = elem_size(FMT);
        check_block(R, MB, es, x, cols, w, out, m);
        let rb = cols * es;
        let mut acc = [[[_mm256_setzero_ps(); 2]; R]; MB];
        let full = cols / L;
        for b in 0..full {
            let k = b * L;
            if (k * es).is_multiple_of(64) {
                prefetch_next_block::<R>(w.as_ptr(), rb, k * es);
            }
            // SAFETY: features from the caller; `k + 16 <= cols`, so 16
            // elements are in bounds of every row (checked by `check_block`).
            unsafe {
                step::<FMT, R, MB>(
                    &mut acc,
                    x.as_ptr().add(k),
                    cols,
                    w.as_ptr().add(k * es),
                    rb,
                )
            };
        }
        let n = cols - full * L;
        if n > 0 {
            // The partial step, from zero-padded copies (missing terms 0 · 0).
            let k = full * L;
            let mut xt = [[0.0f32; L]; MB];
            for (i, t) in xt.iter_mut().enumerate() {
                t[..n].copy_from_slice(&x[i * cols + k..i * cols + k + n]);
            }
            let mut wt = [[0u8; 4 * L]; R];
            for (r, t) in wt.iter_mut().enumerate() {
                t[..n * es].copy_from_slice(&w[r * rb + k * es..r * rb + (k + n) * es]);
            }
            // SAFETY: features from the caller; each copy holds 16 elements.
            unsafe {
                step::<FMT, R, MB>(&mut acc, xt.as_ptr().cast(), L, wt.as_ptr().cast(), 4 * L)
            };
        }
        for (i, acc_i) in acc.iter().enumerate() {
            for (r, a) in acc_i.iter().enumerate() {
                out[r * m + i] = fold(a[0], a[1]);
            }
        }
    }

    /// See [`super::block`].
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    pub(super) unsafe fn block<const FMT: u8, const R: usize, const MB: usize>(
        x: &[f32],
        cols: usize,
        w: &[u8],
        out: &mut [f32],
        m: usize,
    ) {
        // SAFETY: the caller guarantees the features.
        unsafe { block_impl::<FMT, R, MB>(x, cols, w, out, m) }
    }
}

/// The AVX-512 kernel.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{F16, F32, L, check_block, elem_size, prefetch_next_block};

    /// `vpermw` indices spreading 16 words to the odd word positions.
    static BF16_SPREAD: [u16; 32] = {
        let mut a = [0u16; 32];
        let mut p = 0;
        while p < 32 {
            a[p] = (p / 2) as u16;
            p += 1;
        }
        a
    };

    /// The `vpermw` zeroing mask of the bf16 widening (the even words).
    const SPREAD: __mmask32 = 0xAAAA_AAAA;

    /// Sixteen elements at `p` widened to f32 (`spread` is [`SPREAD`]); lanes not in `mask` read as 0
    /// and are not accessed.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL is available; `p` is valid for reading the elements of
    /// `FMT` that `mask` selects.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn load16<const FMT: u8, const MASKED: bool>(
        p: *const u8,
        mask: __mmask16,
        spread: __mmask32,
    ) -> __m512 {
        // SAFETY: the caller guarantees the features and the selected elements
        // (an unmasked load reads all 16); every load is unaligned.
        unsafe {
            if FMT == F32 {
                return if MASKED {
                    _mm512_maskz_loadu_ps(mask, p.cast())
                } else {
                    _mm512_loadu_ps(p.cast())
                };
            }
            let half = if MASKED {
                _mm256_maskz_loadu_epi16(mask, p.cast())
            } else {
                _mm256_loadu_si256(p.cast())
            };
            if FMT == F16 {
                _mm512_cvtph_ps(half)
            } else {
                // One `vpermw`: word `i` of `half` to the upper half of lane
                // `i`, zeros below (the mask clears the even words).
                let idx = _mm512_loadu_si512(BF16_SPREAD.as_ptr().cast());
                _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(
                    spread,
                    idx,
                    _mm512_castsi256_si512(half),
                ))
            }
        }
    }

    // Folds one chain: lanes `l + 8` into `l`, then `+ 4`, `+ 2`, `+ 1`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq")]
    fn fold(v: __m512) -> f32 {
        let s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps::<1>(v));
        let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        let s1 = _mm_add_ss(s2, _mm_shuffle_ps::<0b01>(s2, s2));
        _mm_cvtss_f32(s1)
    }

    /// One 16-column step at column `k` (`mask` selects the columns that exist).
    ///
    /// # Safety
    /// The features of [`load16`]; for every `r < R` and `i < MB`, the selected
    /// elements at `w + r * rb + k * es` and `x + i * cols + k` are readable.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
    unsafe fn step<const FMT: u8, const R: usize, const MB: usize, const MASKED: bool>(
        acc: &mut [[__m512; R]; MB],
        x: *const f32,
        cols: usize,
        w: *const u8,
        rb: usize,
        mask: __mmask16,
        spread: __mmask32,
    ) {
        let mut wv = [_mm512_setzero_ps(); R];
        for (r, v) in wv.iter_mut().enumerate() {
            // SAFETY: guaranteed by the caller.
            *v = unsafe { load16::<FMT, MASKED>(w.add(r * rb), mask, spread) };
        }
        for (i, acc_i) in acc.iter_mut().enumerate() {
            // SAFETY: guaranteed by the caller (masked-off lanes not accessed).
            let xv = unsafe {
                if MASKED {
                    _mm512_maskz_loadu_ps(mask, x.add(i * cols))
                } else {
                    _mm512_loadu_ps(x.add(i * cols))
                }
            };
            for (a, v) in acc_i.iter_mut().zip(&wv) {
                *a = _mm512_fmadd_ps(xv, *v, *a);
            }
        }
    }

    /// See [`super::block`].
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/DQ/VL and FMA.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
    unsafe fn block_impl<const FMT: u8, const R: usize, const MB: usize>(
        x: &[f32],
        cols: usize,
        w: &[u8],
        out: &mut [f32],
        m: usize,
    ) {
        let es = elem_size(FMT);
        check_block(R, MB, es, x, cols, w, out, m);
        let rb = cols * es;
        let mut acc = [[_mm512_setzero_ps(); R]; MB];
        let full = cols / L;
        let (xp, wp) = (x.as_ptr(), w.as_ptr());
        for b in 0..full {
            let k = b * L;
            if (k * es).is_multiple_of(64) {
                prefetch_next_block::<R>(wp, rb, k * es);
            }
            // SAFETY: features from the caller; `k + 16 <= cols`, so the 16
            // elements are within every row (bounds checked by `check_block`).
            unsafe {
                step::<FMT, R, MB, false>(&mut acc, xp.add(k), cols, wp.add(k * es), rb, !0, SPREAD)
            };
        }
        let n = cols - full * L;
        if n > 0 {
            let k = full * L;
            let mask: __mmask16 = (1u16 << n) - 1;
            // SAFETY: features from the caller; the mask selects the `n < 16`
            // columns `k..cols`, within every row.
            unsafe {
                step::<FMT, R, MB, true>(
                    &mut acc,
                    xp.add(k),
                    cols,
                    wp.add(k * es),
                    rb,
                    mask,
                    SPREAD,
                )
            };
        }
        for (i, acc_i) in acc.iter().enumerate() {
            for (r, a) in acc_i.iter().enumerate() {
                out[r * m + i] = fold(*a);
            }
        }
    }

    /// Weight blocks (of `TILE_R` rows) per tile of [`drive_tiled`].
    const TILE_BLOCKS: usize = 8;
    /// Weight rows per block of [`drive_tiled`].
    const TILE_R: usize = 3;
    /// The most columns per k-block of [`drive_tiled`] (a multiple of 16).
    const KB_MAX: usize = 768;
    /// Accumulators per block (`R * MB` at most).
    const ACC: usize = 24;

    /// The `m > 1` driver: walks `rows` in tiles of `TILE_BLOCKS` blocks of
    /// `TILE_R` weight rows (the leftover rows of the last tile in blocks of
    /// one); within a tile, the activation rows in blocks of 8 (then 4, 2,
    /// 1); for each activation block, the columns in k-blocks of at most
    /// `KB_MAX`; for each k-block, every weight block of the tile. The
    /// accumulators of a (weight block, activation block) pair are kept in a
    /// stack scratch between k-blocks, so each lane still takes its terms in
    /// increasing `k` (same bits as one pass). The activation panel (8 rows
    /// by one k-block, at most 24 KiB) is then read from L1 by every weight
    /// block of the tile, and the tile's weights (24 rows) from L2 by every
    /// activation block, in place of streaming all `m` activation rows from
    /// L2 for each weight block.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/DQ/VL and FMA.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
    pub(super) unsafe fn drive_tiled<const FMT: u8>(
        x: &[f32],
        m: usize,
        bytes: &[u8],
        cols: usize,
        rows: std::ops::Range<usize>,
        out: &mut [f32],
    ) {
        let rb = cols * elem_size(FMT);
        // Equal k-blocks of at most KB_MAX columns, rounded up to 16.
        let nkb = cols.div_ceil(KB_MAX).max(1);
        let kb = cols.div_ceil(nkb).div_ceil(L) * L;
        let mut scratch = [[_mm512_setzero_ps(); ACC]; TILE_BLOCKS + TILE_R - 1];
        let mut t = rows.start;
        while t < rows.end {
            let t_end = rows.end.min(t + TILE_BLOCKS * TILE_R);
            let mut i = 0;
            while i < m {
                let mb = [8, 4, 2, 1].into_iter().find(|&b| b <= m - i).unwrap_or(1);
                let xb = &x[i * cols..(i + mb) * cols];
                let mut k0 = 0;
                loop {
                    let k1 = cols.min(k0 + kb);
                    let mut j = t;
                    let mut slot = 0;
                    while j < t_end {
                        let r = if t_end - j >= TILE_R { TILE_R } else { 1 };
                        let wb = &bytes[j * rb..(j + r) * rb];
                        let o0 = (j - rows.start) * m;
                        let ob = &mut out[o0 + i..o0 + r * m];
                        let acc = &mut scratch[slot];
                        macro_rules! pick {
                            ($($rr:literal, $mm:literal);*) => {
                                match (r, mb) {
                                    $(($rr, $mm) => block_k::<FMT, $rr, $mm>(
                                        xb, cols, wb, ob, m, k0..k1, acc
                                    ),)*
                                    _ => unreachable!("weight_rows: no block for {r} x {mb}"),
                                }
                            };
                        }
                        // SAFETY: the caller guarantees the features.
                        unsafe { pick!(3, 8; 3, 4; 3, 2; 3, 1; 1, 8; 1, 4; 1, 2; 1, 1) };
                        j += r;
                        slot += 1;
                    }
                    if k1 >= cols {
                        break;
                    }
                    k0 = k1;
                }
                i += mb;
            }
            t = t_end;
        }
    }

    /// One k-block `ks` of a block: starts from zeros (`ks.start == 0`) or
    /// from `acc_mem[i * R + r]`, runs the steps of `ks`, then folds into
    /// `out[r * m + i]` (`ks.end == cols`) or stores back to `acc_mem`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/DQ/VL and FMA.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
    unsafe fn block_k<const FMT: u8, const R: usize, const MB: usize>(
        x: &[f32],
        cols: usize,
        w: &[u8],
        out: &mut [f32],
        m: usize,
        ks: std::ops::Range<usize>,
        acc_mem: &mut [__m512; ACC],
    ) {
        let es = elem_size(FMT);
        check_block(R, MB, es, x, cols, w, out, m);
        assert!(
            R * MB <= ACC
                && ks.start.is_multiple_of(L)
                && ks.start <= ks.end
                && ks.end <= cols
                && (ks.end == cols || ks.end.is_multiple_of(L)),
            "weight_rows: k-block"
        );
        let rb = cols * es;
        // Opaque to the compiler, so that the bf16 widening stays one
        // zero-masked `vpermw` (with the constant mask LLVM emits `vpermw` and
        // a `vpandq`: one more vector uop per weight vector, on the ports the
        // fused multiply-adds use).
        let spread = std::hint::black_box(SPREAD);
        let mut acc = [[_mm512_setzero_ps(); R]; MB];
        if ks.start > 0 {
            for (i, acc_i) in acc.iter_mut().enumerate() {
                for (r, a) in acc_i.iter_mut().enumerate() {
                    *a = acc_mem[i * R + r];
                }
            }
        }
        let (xp, wp) = (x.as_ptr(), w.as_ptr());
        let mut k = ks.start;
        while k + L <= ks.end {
            if (k * es).is_multiple_of(64) {
                prefetch_next_block::<R>(wp, rb, k * es);
            }
            // SAFETY: features from the caller; `k + 16 <= cols`, so the 16
            // elements are within every row (bounds checked by `check_block`).
            unsafe {
                step::<FMT, R, MB, false>(&mut acc, xp.add(k), cols, wp.add(k * es), rb, !0, spread)
            };
            k += L;
        }
        if k < ks.end {
            let mask: __mmask16 = (1u16 << (ks.end - k)) - 1;
            // SAFETY: features from the caller; the mask selects the columns
            // `k..ks.end` (fewer than 16), within every row.
            unsafe {
                step::<FMT, R, MB, true>(
                    &mut acc,
                    xp.add(k),
                    cols,
                    wp.add(k * es),
                    rb,
                    mask,
                    spread,
                )
            };
        }
        if ks.end == cols {
            for (i, acc_i) in acc.iter().enumerate() {
                for (r, a) in acc_i.iter().enumerate() {
                    out[r * m + i] = fold(*a);
                }
            }
        } else {
            for (i, acc_i) in acc.iter().enumerate() {
                for (r, a) in acc_i.iter().enumerate() {
                    acc_mem[i * R + r] = *a;
                }
            }
        }
    }

    /// See [`super::block`].
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/DQ/VL and FMA.
    pub(super) unsafe fn block<const FMT: u8, const R: usize, const MB: usize>(
        x: &[f32],
        cols: usize,
        w: &[u8],
        out: &mut [f32],
        m: usize,
    ) {
        // SAFETY: the caller guarantees the features.
        unsafe { block_impl::<FMT, R, MB>(x, cols, w, out, m) }
    }
}

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
