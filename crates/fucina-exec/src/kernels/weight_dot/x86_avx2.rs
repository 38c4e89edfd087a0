//! The AVX2 + FMA (+ F16C for f16) kernel.

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
        unsafe { step::<FMT, R, MB>(&mut acc, xt.as_ptr().cast(), L, wt.as_ptr().cast(), 4 * L) };
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
