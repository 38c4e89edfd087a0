//! AVX-512 kernels of the stride-1 depthwise convolution (any padding,
//! dilation and kernel size): the forward and the input gradient of one plane,
//! and the per-column accumulation of one tap's weight gradient.
//!
//! The plain loops of `kernels::conv` add one tap at a time over a whole row
//! of the plane, so every tap reloads and restores the row, and rows a little
//! longer than a register (28 on ResNet's and the example's planes) run most of
//! their elements in a scalar tail. Here 16 outputs of a row are the lanes of
//! one register, every tap is added to it in turn, and the row's last piece is
//! a masked load and store.
//!
//! **The bits are those of the plain loops.** Each output takes the same
//! contributions in the same order (taps in row-major order; for the weight
//! gradient, samples then output rows in increasing order), each a separate
//! multiply then add (no fused multiply-add); a contribution the plain loop
//! skips (its input lies in the padding) is skipped here too, by a masked add,
//! rather than added as a zero (which could turn a `-0.0` sum into `+0.0`).
//! `tests/conv.rs` compares every vector level bit for bit.

use std::arch::x86_64::*;

use crate::kernels::conv::ConvGeom;
use crate::kernels::simd::first_lanes as first;

/// The lanes `l < n` with `0 <= start + l < len`, as a mask.
#[inline(always)]
fn lanes(start: isize, len: usize, n: usize) -> u16 {
    let lo = (-start).clamp(0, 16) as u32;
    let hi = (len as isize - start).clamp(0, n as isize) as u32;
    if lo >= hi {
        0
    } else {
        (((1u32 << hi) - 1) & !((1u32 << lo) - 1)) as u16
    }
}

/// Asserts what every kernel here needs of the geometry.
fn check(g: &ConvGeom) {
    assert!(
        g.stride == [1, 1] && g.kh >= 1 && g.kw >= 1,
        "depthwise AVX-512 kernels: stride-1 geometry"
    );
}

/// Output rows computed together (independent sums in flight).
const ROWS: usize = 4;

/// The most taps per kernel row the kernels keep masks for on the stack;
/// wider kernels take the plain loops.
pub(crate) const MAX_KW: usize = 16;

/// The shared walk of the forward and the input gradient: `dst` (`rows x
/// cols`) from `src` (`src_rows x src_cols`), where output `(i, j)` starts at
/// `init` and takes, for each tap `(r, s)` in row-major order, `w[r, s] *
/// src[i + row_off(r), j + col_off(s)]` when that lies inside `src`. Chunks of
/// 16 outputs of a row; the column masks and offsets of a chunk are found
/// once, and [`ROWS`] rows run side by side.
///
/// # Safety
/// AVX-512 F; `src` holds `src_rows * src_cols` floats, `dst` `rows * cols`,
/// `wk` `kh * kw` with `kw <= MAX_KW`.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn taps_walk(
    src: &[f32],
    (src_rows, src_cols): (usize, usize),
    dst: &mut [f32],
    (rows, cols): (usize, usize),
    wk: &[f32],
    (kh, kw): (usize, usize),
    row_off: impl Fn(usize) -> isize,
    col_off: impl Fn(usize) -> isize,
    init: f32,
) {
    assert!(src.len() == src_rows * src_cols && dst.len() == rows * cols);
    assert!(wk.len() == kh * kw && kw <= MAX_KW);
    let (x, y) = (src.as_ptr(), dst.as_mut_ptr());
    let mut masks = [0u16; MAX_KW];
    let mut offs = [0isize; MAX_KW];
    for j0 in (0..cols).step_by(16) {
        let n = (cols - j0).min(16);
        for s in 0..kw {
            let c = j0 as isize + col_off(s);
            masks[s] = lanes(c, src_cols, n);
            offs[s] = c;
        }
        for i0 in (0..rows).step_by(ROWS) {
            let mut acc = [_mm512_set1_ps(init); ROWS];
            let live = (rows - i0).min(ROWS);
            for r in 0..kh {
                let wr = &wk[r * kw..][..kw];
                for (i, a) in acc.iter_mut().enumerate().take(live) {
                    let si = (i0 + i) as isize + row_off(r);
                    if si < 0 || si >= src_rows as isize {
                        continue;
                    }
                    let row = x.wrapping_offset(si * src_cols as isize);
                    for s in 0..kw {
                        let m = masks[s];
                        // SAFETY: the lanes `m` enables read `src[si * src_cols
                        // + offs[s] + l]` with `0 <= offs[s] + l < src_cols`,
                        // inside row `si` of `src`; the pointer is formed with
                        // `wrapping_offset`.
                        let v = unsafe { _mm512_maskz_loadu_ps(m, row.wrapping_offset(offs[s])) };
                        *a = _mm512_mask_add_ps(*a, m, *a, _mm512_mul_ps(_mm512_set1_ps(wr[s]), v));
                    }
                }
            }
            for (i, a) in acc.iter().enumerate().take(live) {
                // SAFETY: writes `dst[(i0 + i) * cols + j0..][..n]`, inside `dst`.
                unsafe { _mm512_mask_storeu_ps(y.add((i0 + i) * cols + j0), first(n), *a) };
            }
        }
    }
}

/// The forward of one plane, as `conv::depthwise_plane`: `out` (`OH x OW`)
/// starts at `b`, then gets `w[r, s] * x[ih, iw]` added for every tap `(r, s)`
/// in row-major order whose input lies inside the image.
///
/// Panics unless the geometry is stride 1 with `KW <= MAX_KW`, `img` holds
/// `H x W`, `wk` `KH x KW` and `out` `OH x OW` floats.
#[target_feature(enable = "avx512f")]
pub(crate) fn depthwise_plane_avx512(
    g: &ConvGeom,
    img: &[f32],
    wk: &[f32],
    b: f32,
    out: &mut [f32],
) {
    check(g);
    let row_off = |r: usize| (r * g.dil[0]) as isize - g.pad[0] as isize;
    let col_off = |s: usize| (s * g.dil[1]) as isize - g.pad[1] as isize;
    // SAFETY: AVX-512 F (this function's feature); `taps_walk` checks the
    // lengths.
    unsafe {
        taps_walk(
            img,
            (g.h, g.w),
            out,
            (g.oh, g.ow),
            wk,
            (g.kh, g.kw),
            row_off,
            col_off,
            b,
        )
    };
}

/// The input gradient of one plane, as `conv::depthwise_input_grad_plane`:
/// `dx` (`H x W`) starts at zero, then every input gets `w[r, s] * dy[oh, ow]`
/// added for every tap `(r, s)` in row-major order that read it.
///
/// Panics unless the geometry is stride 1 with `KW <= MAX_KW`, `dy` holds
/// `OH x OW`, `wk` `KH x KW` and `dx` `H x W` floats.
#[target_feature(enable = "avx512f")]
pub(crate) fn depthwise_input_grad_plane_avx512(
    g: &ConvGeom,
    dy: &[f32],
    wk: &[f32],
    dx: &mut [f32],
) {
    check(g);
    let row_off = |r: usize| g.pad[0] as isize - (r * g.dil[0]) as isize;
    let col_off = |s: usize| g.pad[1] as isize - (s * g.dil[1]) as isize;
    // SAFETY: as in the forward.
    unsafe {
        taps_walk(
            dy,
            (g.oh, g.ow),
            dx,
            (g.h, g.w),
            wk,
            (g.kh, g.kw),
            row_off,
            col_off,
            0.0,
        )
    };
}

/// The most (tap, 16-column chunk) accumulators
/// [`depthwise_weight_grad_avx512`] keeps.
const MAX_TAP_CHUNKS: usize = 32;

/// The whole weight gradient of one channel, as `conv::depthwise_weight_grad`
/// (every tap's per-column sums over the samples then the output rows, each
/// in increasing order, then the tap's sum over the `OW` columns in order,
/// zero outside the tap's columns), with every tap's accumulators updated in
/// the same sweep over the rows: independent sums side by side instead of one
/// long chain per tap. `acc` is scratch of at least `OW` floats. Returns
/// `false`, writing nothing, when the taps' 16-column chunks are more than
/// the kernel keeps (the caller then runs the plain loops).
///
/// Panics unless the geometry is stride 1 and `dw` holds `KH x KW` floats.
#[target_feature(enable = "avx512f")]
pub(crate) fn depthwise_weight_grad_avx512<'a>(
    g: &ConvGeom,
    planes: &impl Fn(usize) -> (&'a [f32], &'a [f32]),
    acc: &mut [f32],
    dw: &mut [f32],
) -> bool {
    check(g);
    let taps = g.kh * g.kw;
    let chunks = g.ow.div_ceil(16);
    if taps * chunks > MAX_TAP_CHUNKS {
        return false;
    }
    assert!(dw.len() == taps && acc.len() >= g.ow);
    // Per tap: the output rows and columns that read the image, the input row
    // offset and the input column of the first such output column.
    let mut spans = [(0usize, 0usize, 0usize, 0usize, 0isize, 0usize); MAX_TAP_CHUNKS];
    for r in 0..g.kh {
        for s in 0..g.kw {
            let t = super::conv::tap(g, r, s);
            let x0 = if t.is_empty() {
                0
            } else {
                (t.cols.start as isize + t.iw0) as usize
            };
            let (rows, cols) = if t.is_empty() {
                (0..0, 0..0)
            } else {
                (t.rows, t.cols)
            };
            spans[r * g.kw + s] = (rows.start, rows.end, cols.start, cols.end, t.ih0, x0);
        }
    }
    let spans = &spans[..taps];
    let mut sums = [_mm512_setzero_ps(); MAX_TAP_CHUNKS];
    for n in 0..g.n {
        let (img, dy) = planes(n);
        assert!(img.len() >= g.h * g.w && dy.len() >= g.oh * g.ow);
        for oh in 0..g.oh {
            for (t, &(r0, r1, c0, c1, ih0, x0)) in spans.iter().enumerate() {
                if oh < r0 || oh >= r1 {
                    continue;
                }
                let ih = (oh as isize + ih0) as usize;
                for c in 0..(c1 - c0).div_ceil(16) {
                    let m = first((c1 - c0 - 16 * c).min(16));
                    // SAFETY: `oh` is one of the tap's rows, so `ih < H`; the
                    // enabled lanes read `dy[oh * OW + c0 + 16c + l]` with
                    // `c0 + 16c + l < c1 <= OW` and `img[ih * W + x0 + 16c +
                    // l]`, the inputs those output columns read (inside the
                    // row by the tap's column range).
                    let (yv, xv) = unsafe {
                        (
                            _mm512_maskz_loadu_ps(m, dy.as_ptr().add(oh * g.ow + c0 + 16 * c)),
                            _mm512_maskz_loadu_ps(m, img.as_ptr().add(ih * g.w + x0 + 16 * c)),
                        )
                    };
                    let a = &mut sums[t * chunks + c];
                    *a = _mm512_add_ps(*a, _mm512_mul_ps(yv, xv));
                }
            }
        }
    }
    for (t, &(_, _, c0, c1, _, _)) in spans.iter().enumerate() {
        let acc = &mut acc[..g.ow];
        acc.fill(0.0);
        for c in 0..(c1 - c0).div_ceil(16) {
            let m = first((c1 - c0 - 16 * c).min(16));
            // SAFETY: writes `acc[c0 + 16c + l]` for `c0 + 16c + l < c1 <= OW`.
            unsafe {
                _mm512_mask_storeu_ps(acc.as_mut_ptr().add(c0 + 16 * c), m, sums[t * chunks + c])
            };
        }
        dw[t] = super::conv::tap_sum(acc);
    }
    true
}
