//! [`super::score_tiles`] and [`super::weigh_blocks`] on 16-lane AVX-512 registers, one
//! register per block of [`super::BLOCK`] = 16 positions or output elements: the same
//! fused multiply-adds in the same order, so the same bits. The
//! generic loops keep their accumulator arrays on the stack at this width;
//! here they stay in registers.

use std::arch::x86_64::*;

use super::BLOCK;

const _: () = assert!(BLOCK == 16, "one AVX-512 register per block");

/// See [`super::score_tiles`].
///
/// # Safety
/// The CPU must have AVX-512 F.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn score_tiles<const G: usize>(
    q: &[f32],
    keys: &[f32],
    tile0: usize,
    scale: f32,
    scores: &mut [f32],
) {
    let d = q.len();
    let keys = &keys[tile0 * d * BLOCK..(tile0 + G) * d * BLOCK];
    let scores = &mut scores[..G * BLOCK];
    let kp = keys.as_ptr();
    let mut acc = [_mm512_setzero_ps(); G];
    for (i, &qi) in q.iter().enumerate() {
        let x = _mm512_set1_ps(qi);
        for (g, a) in acc.iter_mut().enumerate() {
            // SAFETY: row i of tile g is inside `keys` (sliced above to
            // G tiles of d rows of BLOCK).
            let k = unsafe { _mm512_loadu_ps(kp.add((g * d + i) * BLOCK)) };
            *a = _mm512_fmadd_ps(x, k, *a);
        }
    }
    let sv = _mm512_set1_ps(scale);
    for (g, a) in acc.iter().enumerate() {
        // SAFETY: `scores` holds G blocks (sliced above).
        unsafe { _mm512_storeu_ps(scores.as_mut_ptr().add(g * BLOCK), _mm512_mul_ps(*a, sv)) };
    }
}

/// [`score_tiles`] of two query rows: each key vector loaded once.
///
/// # Safety
/// The CPU must have AVX-512 F.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn score_tiles2<const G: usize>(
    qa: &[f32],
    qb: &[f32],
    keys: &[f32],
    tile0: usize,
    scale: f32,
    out_a: &mut [f32],
    out_b: &mut [f32],
) {
    let d = qa.len();
    let (qb, keys) = (&qb[..d], &keys[tile0 * d * BLOCK..(tile0 + G) * d * BLOCK]);
    let (out_a, out_b) = (&mut out_a[..G * BLOCK], &mut out_b[..G * BLOCK]);
    let kp = keys.as_ptr();
    let mut acc_a = [_mm512_setzero_ps(); G];
    let mut acc_b = [_mm512_setzero_ps(); G];
    for (i, (&xa, &xb)) in qa.iter().zip(qb).enumerate() {
        let (xa, xb) = (_mm512_set1_ps(xa), _mm512_set1_ps(xb));
        for g in 0..G {
            // SAFETY: as in `score_tiles`.
            let k = unsafe { _mm512_loadu_ps(kp.add((g * d + i) * BLOCK)) };
            acc_a[g] = _mm512_fmadd_ps(xa, k, acc_a[g]);
            acc_b[g] = _mm512_fmadd_ps(xb, k, acc_b[g]);
        }
    }
    let sv = _mm512_set1_ps(scale);
    for g in 0..G {
        // SAFETY: both outputs hold G blocks (sliced above).
        unsafe {
            _mm512_storeu_ps(
                out_a.as_mut_ptr().add(g * BLOCK),
                _mm512_mul_ps(acc_a[g], sv),
            );
            _mm512_storeu_ps(
                out_b.as_mut_ptr().add(g * BLOCK),
                _mm512_mul_ps(acc_b[g], sv),
            );
        }
    }
}

/// [`weigh_blocks`] of two rows of probabilities, `pa` over a prefix of
/// the positions of `pb`: the common positions together, then `pb`'s
/// last ones (each output's sum still in increasing `j`).
///
/// # Safety
/// The CPU must have AVX-512 F.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn weigh_blocks2<const G: usize>(
    pa: &[f32],
    pb: &[f32],
    values: &[f32],
    d: usize,
    first: usize,
    out_a: &mut [f32],
    out_b: &mut [f32],
) {
    assert!(pa.len() <= pb.len(), "weigh_blocks2: prefix");
    assert!(first + G * BLOCK <= d && values.len() >= pb.len() * d);
    let (out_a, out_b) = (
        &mut out_a[first..first + G * BLOCK],
        &mut out_b[first..first + G * BLOCK],
    );
    let vp = values.as_ptr();
    let mut acc_a = [_mm512_setzero_ps(); G];
    let mut acc_b = [_mm512_setzero_ps(); G];
    for (j, (&xa, &xb)) in pa.iter().zip(pb).enumerate() {
        let (xa, xb) = (_mm512_set1_ps(xa), _mm512_set1_ps(xb));
        for g in 0..G {
            // SAFETY: j < pb.len(); as in `weigh_blocks`.
            let v = unsafe { _mm512_loadu_ps(vp.add(j * d + first + g * BLOCK)) };
            acc_a[g] = _mm512_fmadd_ps(xa, v, acc_a[g]);
            acc_b[g] = _mm512_fmadd_ps(xb, v, acc_b[g]);
        }
    }
    for (j, &xb) in pb.iter().enumerate().skip(pa.len()) {
        let xb = _mm512_set1_ps(xb);
        for (g, a) in acc_b.iter_mut().enumerate() {
            // SAFETY: as above.
            let v = unsafe { _mm512_loadu_ps(vp.add(j * d + first + g * BLOCK)) };
            *a = _mm512_fmadd_ps(xb, v, *a);
        }
    }
    for g in 0..G {
        // SAFETY: both outputs hold G blocks (sliced above).
        unsafe {
            _mm512_storeu_ps(out_a.as_mut_ptr().add(g * BLOCK), acc_a[g]);
            _mm512_storeu_ps(out_b.as_mut_ptr().add(g * BLOCK), acc_b[g]);
        }
    }
}

/// [`score_tiles`] of four query rows: each key vector loaded once for
/// the four (sixteen independent sums at `G = 4`).
///
/// # Safety
/// The CPU must have AVX-512 F.
#[allow(clippy::needless_range_loop)] // by-value accumulators, kept in registers
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn score_tiles4<const G: usize>(
    q: [&[f32]; 4],
    keys: &[f32],
    tile0: usize,
    scale: f32,
    out: [&mut [f32]; 4],
) {
    let d = q[0].len();
    let q: [&[f32]; 4] = q.map(|r| &r[..d]);
    let keys = &keys[tile0 * d * BLOCK..(tile0 + G) * d * BLOCK];
    let out: [&mut [f32]; 4] = out.map(|o| &mut o[..G * BLOCK]);
    let kp = keys.as_ptr();
    let mut acc = [[_mm512_setzero_ps(); G]; 4];
    for i in 0..d {
        let x: [__m512; 4] = std::array::from_fn(|r| _mm512_set1_ps(q[r][i]));
        for g in 0..G {
            // SAFETY: row i of tile g is inside `keys` (sliced above).
            let k = unsafe { _mm512_loadu_ps(kp.add((g * d + i) * BLOCK)) };
            for r in 0..4 {
                acc[r][g] = _mm512_fmadd_ps(x[r], k, acc[r][g]);
            }
        }
    }
    let sv = _mm512_set1_ps(scale);
    for (o, a) in out.into_iter().zip(acc) {
        for (g, a) in a.iter().enumerate() {
            // SAFETY: each output holds G blocks (sliced above).
            unsafe { _mm512_storeu_ps(o.as_mut_ptr().add(g * BLOCK), _mm512_mul_ps(*a, sv)) };
        }
    }
}

/// [`weigh_blocks`] of four rows of probabilities, each over a prefix of
/// the positions of the next: the positions of the shortest row for all
/// four together, then each longer row's last ones (each output's sum
/// still in increasing `j`).
///
/// # Safety
/// The CPU must have AVX-512 F.
#[allow(clippy::needless_range_loop)] // by-value accumulators, kept in registers
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn weigh_blocks4<const G: usize>(
    p: [&[f32]; 4],
    values: &[f32],
    d: usize,
    first: usize,
    out: [&mut [f32]; 4],
) {
    let n = p.map(|r| r.len());
    assert!(
        n[0] <= n[1] && n[1] <= n[2] && n[2] <= n[3],
        "weigh_blocks4: prefixes"
    );
    assert!(first + G * BLOCK <= d && values.len() >= n[3] * d);
    let out: [&mut [f32]; 4] = out.map(|o| &mut o[first..first + G * BLOCK]);
    let vp = values.as_ptr();
    let mut acc = [[_mm512_setzero_ps(); G]; 4];
    for j in 0..n[0] {
        let x: [__m512; 4] = std::array::from_fn(|r| _mm512_set1_ps(p[r][j]));
        for g in 0..G {
            // SAFETY: j < n[3] and first + (g + 1) · BLOCK <= d (asserted).
            let v = unsafe { _mm512_loadu_ps(vp.add(j * d + first + g * BLOCK)) };
            for r in 0..4 {
                acc[r][g] = _mm512_fmadd_ps(x[r], v, acc[r][g]);
            }
        }
    }
    for r in 1..4 {
        for j in n[0]..n[r] {
            let x = _mm512_set1_ps(p[r][j]);
            for g in 0..G {
                // SAFETY: as above.
                let v = unsafe { _mm512_loadu_ps(vp.add(j * d + first + g * BLOCK)) };
                acc[r][g] = _mm512_fmadd_ps(x, v, acc[r][g]);
            }
        }
    }
    for (o, a) in out.into_iter().zip(acc) {
        for (g, a) in a.iter().enumerate() {
            // SAFETY: each output holds G blocks (sliced above).
            unsafe { _mm512_storeu_ps(o.as_mut_ptr().add(g * BLOCK), *a) };
        }
    }
}

/// See [`super::weigh_blocks`].
///
/// # Safety
/// The CPU must have AVX-512 F.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn weigh_blocks<const G: usize>(
    p: &[f32],
    values: &[f32],
    d: usize,
    first: usize,
    out: &mut [f32],
) {
    assert!(first + G * BLOCK <= d && values.len() >= p.len() * d);
    let out = &mut out[first..first + G * BLOCK];
    let vp = values.as_ptr();
    let mut acc = [_mm512_setzero_ps(); G];
    for (j, &pj) in p.iter().enumerate() {
        let x = _mm512_set1_ps(pj);
        for (g, a) in acc.iter_mut().enumerate() {
            // SAFETY: j < p.len() and first + (g + 1) · BLOCK <= d
            // (asserted above), so the 16 values are inside row j.
            let v = unsafe { _mm512_loadu_ps(vp.add(j * d + first + g * BLOCK)) };
            *a = _mm512_fmadd_ps(x, v, *a);
        }
    }
    for (g, a) in acc.iter().enumerate() {
        // SAFETY: `out` holds G blocks (sliced above).
        unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(g * BLOCK), *a) };
    }
}
