//! The AVX-512 kernel.

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
            step::<FMT, R, MB, true>(&mut acc, xp.add(k), cols, wp.add(k * es), rb, mask, SPREAD)
        };
    }
    for (i, acc_i) in acc.iter().enumerate() {
        for (r, a) in acc_i.iter().enumerate() {
            out[r * m + i] = fold(*a);
        }
    }
}

/// How far ahead (bytes) [`drive_decode`] prefetches within each of its two
/// streams (512, 1024 and 2048 measured alike on a loaded machine; see
/// docs/BENCHMARKS.md, "bf16 decode in two streams").
pub(super) const DECODE_PREFETCH: usize = 512;

/// The `m = 1` driver: the rows are cut into two halves, and row `s + i`
/// of the first half is computed together with row `s + h + i` of the
/// second (two chains, so the fused multiply-adds of one wait for the
/// other's less; two weight streams, each reading its half's rows one after
/// another as one sequential stream and prefetching a fixed distance ahead
/// in it, across row ends). A row left over (an odd count) runs alone.
/// Each output is still its own chain in the fixed order.
///
/// # Safety
/// The CPU has AVX-512 F/BW/DQ/VL and FMA.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
pub(super) unsafe fn drive_decode<const FMT: u8>(
    x: &[f32],
    bytes: &[u8],
    cols: usize,
    rows: std::ops::Range<usize>,
    out: &mut [f32],
) {
    let es = elem_size(FMT);
    let rb = cols * es;
    let n = rows.len();
    assert!(
        x.len() >= cols && out.len() >= n && bytes.len() >= rows.end * rb,
        "weight_rows: decode operands"
    );
    let h = n.div_ceil(2);
    let pf = DECODE_PREFETCH;
    let spread = std::hint::black_box(SPREAD);
    let full = cols / L;
    let tail = cols - full * L;
    let xp = x.as_ptr();
    for i in 0..n - h {
        let (j0, j1) = (rows.start + i, rows.start + h + i);
        // SAFETY: rows `j0` and `j1` lie inside `bytes` (asserted); the
        // prefetched addresses are hints, never dereferenced.
        let (w0, w1) = unsafe { (bytes.as_ptr().add(j0 * rb), bytes.as_ptr().add(j1 * rb)) };
        let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        for b in 0..full {
            let k = b * L;
            if (k * es).is_multiple_of(64) {
                _mm_prefetch::<_MM_HINT_T0>(w0.wrapping_add(k * es + pf).cast());
                _mm_prefetch::<_MM_HINT_T0>(w1.wrapping_add(k * es + pf).cast());
            }
            // SAFETY: features from the caller; `k + 16 <= cols`: the 16
            // elements lie within both rows and `x`.
            unsafe {
                let xv = _mm512_loadu_ps(xp.add(k));
                let v0 = load16::<FMT, false>(w0.add(k * es), !0, spread);
                let v1 = load16::<FMT, false>(w1.add(k * es), !0, spread);
                a0 = _mm512_fmadd_ps(xv, v0, a0);
                a1 = _mm512_fmadd_ps(xv, v1, a1);
            }
        }
        if tail > 0 {
            let k = full * L;
            let mask: __mmask16 = (1u16 << tail) - 1;
            // SAFETY: features from the caller; the mask selects the
            // `tail < 16` columns `k..cols`, within both rows and `x`.
            unsafe {
                let xv = _mm512_maskz_loadu_ps(mask, xp.add(k));
                let v0 = load16::<FMT, true>(w0.add(k * es), mask, spread);
                let v1 = load16::<FMT, true>(w1.add(k * es), mask, spread);
                a0 = _mm512_fmadd_ps(xv, v0, a0);
                a1 = _mm512_fmadd_ps(xv, v1, a1);
            }
        }
        out[i] = fold(a0);
        out[h + i] = fold(a1);
    }
    if n % 2 == 1 {
        let j = rows.start + h - 1;
        // SAFETY: the caller guarantees the features.
        unsafe {
            block_impl::<FMT, 1, 1>(
                &x[..cols],
                cols,
                &bytes[j * rb..(j + 1) * rb],
                &mut out[h - 1..h],
                1,
            )
        };
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
            step::<FMT, R, MB, true>(&mut acc, xp.add(k), cols, wp.add(k * es), rb, mask, spread)
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
