//! AVX-512 kernels of the 2x2, stride-2 ReLU-max pool of a plane, optionally
//! over the plane's batch normalization `z = (x - mu) * a + b` computed in
//! registers (the fused `batch_norm_pool2d` of a `conv -> batch norm -> relu ->
//! max pool` block).
//!
//! The plain per-plane loops of the pool op (`src/ops/pool.rs`) handle one
//! window at a time and, for the backward, copy short row pieces in and out of
//! fixed-size arrays.
//! Here a 512-bit register holds 8 windows' top (or bottom) row: the two values
//! of a window sit in adjacent lanes, so the window's maximum is two lane-pair
//! maxima and one vertical one, and the backward's "first row-major element
//! equal to the maximum" is mask arithmetic on the compare results.
//!
//! **The bits are those of the plain loops.** The normalization is the same
//! sub, mul and add (no fused multiply-add); the ReLU `v > 0 ? v : 0` is
//! `vmaxps(v, 0)` (which also maps a NaN and `-0.0` to `+0.0`, as the ReLU
//! does); the ReLU values are never NaN and never `-0.0`, so the maximum of a
//! window is the same value in whatever order it is taken; the selected input
//! gets `(0 + g) * slope` with `slope` the ReLU's derivative at its pre-ReLU
//! value (1 or 0, a multiply, so a negative `g` times 0 is `-0.0` as in the
//! plain loop) and every other covered input `+0.0`. `tests/batch_norm_pool.rs`
//! and `tests/pool.rs` compare them with the plain loops.

/// The batch normalization applied to each input before the ReLU:
/// `z = (x - mu) * a + b`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Affine {
    /// Subtracted first (the channel mean).
    pub(crate) mu: f32,
    /// The scale (`gamma * inv_std`).
    pub(crate) a: f32,
    /// Added last (`beta`).
    pub(crate) b: f32,
}

#[cfg(target_arch = "x86_64")]
use crate::kernels::simd::first_lanes;

/// Lanes of the even (left) elements of the windows.
#[cfg(target_arch = "x86_64")]
const EVEN: u16 = 0x5555;
/// Lanes of the odd (right) elements.
#[cfg(target_arch = "x86_64")]
const ODD: u16 = 0xAAAA;

/// Loads up to 8 windows' row (`2 * n` floats at `p`), normalized by `norm`
/// when given; returns `(z, relu(z))`.
///
/// # Safety
/// `p[..2 * n]` must be readable (`n <= 8`); the CPU must have AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn load_row(
    p: *const f32,
    mask: u16,
    norm: Option<Affine>,
) -> (std::arch::x86_64::__m512, std::arch::x86_64::__m512) {
    use std::arch::x86_64::*;
    // SAFETY: the caller guarantees the lanes `mask` enables are readable.
    let v = unsafe { _mm512_maskz_loadu_ps(mask, p) };
    let z = match norm {
        Some(n) => _mm512_add_ps(
            _mm512_mul_ps(_mm512_sub_ps(v, _mm512_set1_ps(n.mu)), _mm512_set1_ps(n.a)),
            _mm512_set1_ps(n.b),
        ),
        None => v,
    };
    (z, _mm512_max_ps(z, _mm512_setzero_ps()))
}

/// The window maxima of a step (in both lanes of each window's pair) from the
/// ReLU values of its top and bottom rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn window_max(
    rt: std::arch::x86_64::__m512,
    rb: std::arch::x86_64::__m512,
) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // Lanes [1, 0, 3, 2] of every 128-bit quarter: each lane's pair partner.
    let mt = _mm512_max_ps(rt, _mm512_permute_ps::<0b10_11_00_01>(rt));
    let mb = _mm512_max_ps(rb, _mm512_permute_ps::<0b10_11_00_01>(rb));
    _mm512_max_ps(mt, mb)
}

/// The ReLU's derivative at each lane of `z`: 1 where `z > 0`, else 0 (a
/// NaN gets 0, as the plain `relu_slope`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn relu_slope(z: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let pos = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(z, _mm512_setzero_ps());
    _mm512_maskz_mov_ps(pos, _mm512_set1_ps(1.0))
}

/// The 2x2, stride-2 ReLU-max forward of a plane of width `w` into `out`
/// (`oh` rows of `ow`), over `norm`'s normalization of `x` when given.
///
/// Panics unless `x` holds the `2 * oh` rows of `w >= 2 * ow` floats the
/// windows cover and `out` holds `oh * ow`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) fn relu_max_2x2_forward_avx512(
    x: &[f32],
    out: &mut [f32],
    w: usize,
    (oh, ow): (usize, usize),
    norm: Option<Affine>,
) {
    use std::arch::x86_64::*;
    assert!(
        2 * ow <= w && x.len() >= 2 * oh * w && out.len() == oh * ow,
        "relu_max_2x2_forward_avx512: plane sizes"
    );
    // Lane 2j of the maxima holds window j.
    let evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0);
    for oi in 0..oh {
        let top = x[2 * oi * w..].as_ptr();
        let bottom = x[(2 * oi + 1) * w..].as_ptr();
        let orow = out[oi * ow..][..ow].as_mut_ptr();
        for j0 in (0..ow).step_by(8) {
            let n = (ow - j0).min(8);
            let (m16, m8) = (first_lanes(2 * n), first_lanes(n) as u8);
            // SAFETY: the lanes `m16` enables read `2 * j0..2 * (j0 + n)` of a
            // covered row (`2 * ow <= w`, `2 * oh` rows asserted above).
            let ((_, rt), (_, rb)) = unsafe {
                (
                    load_row(top.add(2 * j0), m16, norm),
                    load_row(bottom.add(2 * j0), m16, norm),
                )
            };
            let m = _mm512_permutexvar_ps(evens, window_max(rt, rb));
            // SAFETY: writes `orow[j0..j0 + n]`, inside the output row.
            unsafe { _mm256_mask_storeu_ps(orow.add(j0), m8, _mm512_castps512_ps256(m)) };
        }
    }
}

/// The 2x2, stride-2 ReLU-max backward of a plane of width `w`: every input
/// the `oh x ow` windows cover gets its gradient in `gx` (the rest is not
/// written), from the output gradient `gy` and the forward input `x`
/// (normalized by `norm` when given).
///
/// Panics unless `x` and `gx` hold the `2 * oh` rows of `w >= 2 * ow` floats
/// the windows cover and `gy` holds `oh * ow`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) fn relu_max_2x2_backward_avx512(
    x: &[f32],
    gy: &[f32],
    gx: &mut [f32],
    w: usize,
    (oh, ow): (usize, usize),
    norm: Option<Affine>,
) {
    use std::arch::x86_64::*;
    assert!(
        2 * ow <= w && x.len() >= 2 * oh * w && gx.len() >= 2 * oh * w && gy.len() == oh * ow,
        "relu_max_2x2_backward_avx512: plane sizes"
    );
    // Lanes 2j and 2j + 1 take window j's gradient.
    let pairs = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    let zero = _mm512_setzero_ps();
    for oi in 0..oh {
        let top = x[2 * oi * w..].as_ptr();
        let bottom = x[(2 * oi + 1) * w..].as_ptr();
        let gtop = gx[2 * oi * w..].as_mut_ptr();
        let gbottom = gx[(2 * oi + 1) * w..].as_mut_ptr();
        let grow = gy[oi * ow..][..ow].as_ptr();
        for j0 in (0..ow).step_by(8) {
            let n = (ow - j0).min(8);
            let (m16, m8) = (first_lanes(2 * n), first_lanes(n) as u8);
            // SAFETY: as in the forward: covered rows, lanes `2 * j0..2 * (j0 + n)`.
            let ((zt, rt), (zb, rb)) = unsafe {
                (
                    load_row(top.add(2 * j0), m16, norm),
                    load_row(bottom.add(2 * j0), m16, norm),
                )
            };
            let m = window_max(rt, rb);
            // The first row-major element equal to the maximum: top left, top
            // right, bottom left, else bottom right.
            let (et, eb) = (_mm512_cmpeq_ps_mask(rt, m), _mm512_cmpeq_ps_mask(rb, m));
            let s0 = et & EVEN;
            let s1 = et & ODD & !(s0 << 1);
            let top_hit = s0 | (s1 >> 1);
            let s2 = eb & EVEN & !top_hit;
            let s3 = ODD & !((top_hit | s2) << 1);
            // SAFETY: reads `grow[j0..j0 + n]`, inside the gradient row.
            let g8 = unsafe { _mm256_maskz_loadu_ps(m8, grow.add(j0)) };
            let v = _mm512_add_ps(
                zero,
                _mm512_permutexvar_ps(pairs, _mm512_castps256_ps512(g8)),
            );
            let dt = _mm512_maskz_mul_ps(s0 | s1, v, relu_slope(zt));
            let db = _mm512_maskz_mul_ps(s2 | s3, v, relu_slope(zb));
            // SAFETY: writes lanes `2 * j0..2 * (j0 + n)` of two covered rows of `gx`.
            unsafe {
                _mm512_mask_storeu_ps(gtop.add(2 * j0), m16, dt);
                _mm512_mask_storeu_ps(gbottom.add(2 * j0), m16, db);
            }
        }
    }
}
