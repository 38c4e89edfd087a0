//! 2-D pooling over `[N, C, H, W]`: `max_pool2d`, `avg_pool2d`,
//! `adaptive_avg_pool2d`, the fused `relu_max_pool2d` (descriptor [`Pool2dOp`])
//! and their backward kernels.
//!
//! Every plane (one sample, one channel) is pooled by exactly one task, in a
//! fixed order that depends only on the plane: the result is the same bits for
//! every team size and vector level, and a sample's result never depends on the
//! rest of the batch.
//!
//! - **Max.** Each window is scanned in row-major order; an element replaces the
//!   running maximum when it is greater, or when it is a NaN and the running
//!   maximum is not. So ties go to the first element in row-major window order,
//!   and a NaN propagates (the first NaN of the window is selected). Padding
//!   counts as `-inf` and is never selected. The backward recomputes each window's
//!   selected index from the input and routes the output's gradient there.
//! - **Avg.** PyTorch's default `count_include_pad = true`: the window sum (in
//!   row-major order, padding adding nothing) divided by `kernel[0] * kernel[1]`.
//! - **Adaptive avg.** Output cell `i` of an axis of input size `n` and output
//!   size `m` averages the input indices `floor(i * n / m) .. ceil((i + 1) * n / m)`
//!   (PyTorch's formula), divided by the window's element count.
//!
//! - **ReluMax.** `Max` of `relu(x)`, fused: the same bits as `relu` then
//!   `Max`, forward and backward, without the ReLU's output.
//!
//! The backward kernels add each output's contribution into the input gradient
//! in row-major output order, so overlapping windows sum in a fixed order.

mod batch_norm_pool;

use crate::context::ExecContext;
use crate::error::ExecError;
use crate::kernels::pool_2x2::Affine;
#[cfg(target_arch = "x86_64")]
use crate::kernels::pool_2x2::{relu_max_2x2_backward_avx512, relu_max_2x2_forward_avx512};
use crate::kernels::simd::vectorized;
#[cfg(target_arch = "x86_64")]
use crate::kernels::simd::{self, SimdLevel};
use crate::tensor::RawTensor;
use crate::tensor::layout::{Dims, check_shape};

/// The window of a 2-D pooling op: its size, its step and the implicit padding on
/// each side, as `[height, width]`.
///
/// [`Default`] is a 1×1 window with stride 1 and no padding;
/// [`Pool2dOptions::new`] gives PyTorch's default of a stride equal to the
/// kernel.
///
/// ```
/// use fucina_exec::Pool2dOptions;
///
/// let o = Pool2dOptions::new([2, 2]);
/// assert_eq!(o, Pool2dOptions { kernel: [2, 2], stride: [2, 2], padding: [0, 0] });
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pool2dOptions {
    /// The window size `[kh, kw]` (each at least 1).
    pub kernel: [usize; 2],
    /// The step between windows `[sh, sw]` (each at least 1).
    pub stride: [usize; 2],
    /// Implicit padding on both sides `[ph, pw]` (each at most half the kernel).
    pub padding: [usize; 2],
}

impl Default for Pool2dOptions {
    fn default() -> Self {
        Pool2dOptions {
            kernel: [1, 1],
            stride: [1, 1],
            padding: [0, 0],
        }
    }
}

impl Pool2dOptions {
    /// A `kernel` window with the stride equal to the kernel and no padding
    /// (PyTorch's default for the pooling layers).
    pub fn new(kernel: [usize; 2]) -> Self {
        Pool2dOptions {
            kernel,
            stride: kernel,
            padding: [0, 0],
        }
    }
}

/// The window of a 1-D pooling op over `[N, C, L]` (`avg_pool1d`,
/// `max_pool1d` of the autograd layer, which run the 2-D ops on `[N, C, 1,
/// L]`): its size, its step and the implicit padding on each side.
/// [`Pool1dOptions::new`] gives PyTorch's default of a stride equal to the
/// kernel.
///
/// ```
/// use fucina_exec::Pool1dOptions;
///
/// let o = Pool1dOptions::new(3);
/// assert_eq!((o.stride, o.padding), (3, 0));
/// assert_eq!(o.out_shape("max_pool1d", &[2, 4, 10])?.as_slice(), [2, 4, 3]);
/// assert!(o.out_shape("max_pool1d", &[2, 4, 2]).is_err()); // the kernel does not fit
/// # Ok::<(), fucina_exec::ExecError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pool1dOptions {
    /// The window size (at least 1).
    pub kernel: usize,
    /// The step between windows (at least 1).
    pub stride: usize,
    /// Implicit padding on both sides (at most half the kernel).
    pub padding: usize,
}

impl Pool1dOptions {
    /// A `kernel` window with the stride equal to the kernel and no padding.
    pub fn new(kernel: usize) -> Self {
        Pool1dOptions {
            kernel,
            stride: kernel,
            padding: 0,
        }
    }

    /// The 2-D window over `[N, C, 1, L]` with the same pooling.
    pub fn to_2d(self) -> Pool2dOptions {
        Pool2dOptions {
            kernel: [1, self.kernel],
            stride: [1, self.stride],
            padding: [0, self.padding],
        }
    }

    /// The output shape `[N, C, (L + 2 * padding - kernel) / stride + 1]` of
    /// the 1-D op `op` for an input of shape `x`.
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`] naming `op` if `x` is not of rank 3 or has
    /// a zero dimension, the kernel or the stride is 0, the padding is above
    /// half the kernel or the kernel is larger than the padded input.
    pub fn out_shape(&self, op: &'static str, x: &[usize]) -> Result<Dims, ExecError> {
        if x.len() != 3 {
            return Err(ExecError::InvalidShape {
                op,
                shape: Dims::new(x),
                reason: "the input must be [N, C, L] (rank 3)",
            });
        }
        check_shape(op, x)?;
        let bad = |v: usize, reason| {
            Err(ExecError::InvalidShape {
                op,
                shape: Dims::new(&[v]),
                reason,
            })
        };
        if self.kernel == 0 {
            return bad(0, "the kernel size must be at least 1");
        }
        if self.stride == 0 {
            return bad(0, "the stride must be at least 1");
        }
        if self.kernel.max(self.stride) > MAX_WINDOW {
            return bad(
                self.kernel.max(self.stride),
                "a kernel or stride size is above 2^40",
            );
        }
        if self.padding > self.kernel / 2 {
            return bad(
                self.padding,
                "the padding must be at most half the kernel size",
            );
        }
        let Some(room) = (x[2] + 2 * self.padding).checked_sub(self.kernel) else {
            return Err(ExecError::InvalidShape {
                op,
                shape: Dims::new(x),
                reason: "the kernel is larger than the padded input",
            });
        };
        Ok(Dims::new(&[x[0], x[1], room / self.stride + 1]))
    }
}

/// A 2-D pooling op and its parameters: the descriptor of the pooling family
/// (see [`ExecContext::pool2d`] and [`ExecContext::pool2d_backward`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pool2dOp {
    /// Maximum over each window (ties to the first index in row-major window
    /// order, padding is `-inf`).
    Max(Pool2dOptions),
    /// Mean over each window, padding counted as zeros in the divisor.
    Avg(Pool2dOptions),
    /// Mean over adaptive windows giving the output size `[oh, ow]`.
    AdaptiveAvg([usize; 2]),
    /// `Max` of `relu(x)`: the max pool of the ReLU of the input, fused (one
    /// pass, no ReLU output in memory). The same bits as `relu` then `Max`,
    /// forward and backward (the backward routes each output's gradient to the
    /// element `Max` selects among the ReLU values, times the ReLU's derivative
    /// there).
    ReluMax(Pool2dOptions),
}

impl Pool2dOp {
    /// The op's name as errors and graph nodes spell it.
    pub fn name(self) -> &'static str {
        match self {
            Pool2dOp::Max(_) => "max_pool2d",
            Pool2dOp::Avg(_) => "avg_pool2d",
            Pool2dOp::AdaptiveAvg(_) => "adaptive_avg_pool2d",
            Pool2dOp::ReluMax(_) => "relu_max_pool2d",
        }
    }

    /// Whether the backward reads the forward input (`Max` and `ReluMax`, which
    /// recompute the selected indices); the others need only its shape.
    pub fn keeps_input(self) -> bool {
        matches!(self, Pool2dOp::Max(_) | Pool2dOp::ReluMax(_))
    }

    /// The output shape for an input of shape `x`.
    ///
    /// `x` may come straight from a caller (the backward takes the input's
    /// shape as a slice), so every size the kernels derive from it is checked
    /// here: the element counts of the input and the output, the area of an
    /// average window (its divisor) and the products of the adaptive windows'
    /// bounds. Past this point the kernels' plain arithmetic cannot overflow.
    ///
    /// # Errors
    /// As [`ExecContext::pool2d`] for the shape and the options.
    #[warn(clippy::arithmetic_side_effects)]
    pub fn output_shape(self, x: &[usize]) -> Result<Dims, ExecError> {
        let op = self.name();
        if x.len() != 4 {
            return Err(ExecError::InvalidShape {
                op,
                shape: Dims::new(x),
                reason: "the input must be [N, C, H, W] (rank 4)",
            });
        }
        // No zero dimension, an element count that fits.
        check_shape(op, x)?;
        let (h, w) = (x[2], x[3]);
        let (oh, ow) = match self {
            Pool2dOp::Max(o) | Pool2dOp::Avg(o) | Pool2dOp::ReluMax(o) => {
                let bad = |v: [usize; 2], reason| {
                    Err(ExecError::InvalidShape {
                        op,
                        shape: Dims::new(&v),
                        reason,
                    })
                };
                if o.kernel.contains(&0) {
                    return bad(o.kernel, "the kernel size must be at least 1");
                }
                if o.stride.contains(&0) {
                    return bad(o.stride, "the stride must be at least 1");
                }
                if o.kernel.iter().chain(&o.stride).any(|&v| v > MAX_WINDOW) {
                    let v = if o.kernel.iter().any(|&v| v > MAX_WINDOW) {
                        o.kernel
                    } else {
                        o.stride
                    };
                    return bad(v, "a kernel or stride size is above 2^40");
                }
                if let Pool2dOp::Avg(_) = self {
                    // The divisor `kernel[0] * kernel[1]`.
                    check_shape(op, &o.kernel)?;
                }
                if o.padding[0] > o.kernel[0] / 2 || o.padding[1] > o.kernel[1] / 2 {
                    return bad(
                        o.padding,
                        "the padding must be at most half the kernel size",
                    );
                }
                // `(size - (kernel - 2 * padding)) / stride + 1` per axis
                // (the kernel less both paddings, which the check above keeps
                // from underflowing); `None` when the kernel does not fit.
                let axis = |a: usize, size: usize| {
                    o.padding[a]
                        .checked_mul(2)
                        .and_then(|p| o.kernel[a].checked_sub(p))
                        .and_then(|k| size.checked_sub(k))
                        .and_then(|room| room.checked_div(o.stride[a]))
                        .and_then(|steps| steps.checked_add(1))
                };
                let (Some(oh), Some(ow)) = (axis(0, h), axis(1, w)) else {
                    return Err(ExecError::InvalidShape {
                        op,
                        shape: Dims::new(x),
                        reason: "the kernel is larger than the padded input",
                    });
                };
                (oh, ow)
            }
            Pool2dOp::AdaptiveAvg(size) => {
                if size.contains(&0) {
                    return Err(ExecError::InvalidShape {
                        op,
                        shape: Dims::new(&size),
                        reason: "the output size must be at least 1 on each axis",
                    });
                }
                // The windows' bounds `i * n / m` and `(i + 1) * n / m`, for
                // `i < m`: at most `m * n`.
                if size[0].checked_mul(h).is_none() || size[1].checked_mul(w).is_none() {
                    return Err(ExecError::InvalidShape {
                        op,
                        shape: Dims::new(&size),
                        reason: "an output size times its input size overflows usize",
                    });
                }
                (size[0], size[1])
            }
        };
        let out = Dims::new(&[x[0], x[1], oh, ow]);
        check_shape(op, &out)?;
        Ok(out)
    }
}

/// The largest kernel or stride size accepted (window arithmetic stays far from
/// overflow).
const MAX_WINDOW: usize = 1 << 40;

/// Per-output-element work weight of a pooling plane (the window size).
fn plane_work(op: Pool2dOp, in_plane: usize, out_plane: usize) -> usize {
    match op {
        Pool2dOp::Max(o) | Pool2dOp::Avg(o) | Pool2dOp::ReluMax(o) => out_plane
            .saturating_mul(o.kernel[0])
            .saturating_mul(o.kernel[1]),
        Pool2dOp::AdaptiveAvg(_) => in_plane.max(out_plane),
    }
}

/// The geometry of one pooled plane.
#[derive(Clone, Copy)]
struct Geo {
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
}

impl Geo {
    /// The geometry of pooling an input of shape `x` (`[N, C, H, W]`) into an
    /// output of shape `out` (`[N, C, OH, OW]`).
    fn new(x: &[usize], out: &[usize]) -> Geo {
        Geo {
            h: x[2],
            w: x[3],
            oh: out[2],
            ow: out[3],
        }
    }

    /// Elements of an input plane and of an output plane.
    fn planes(self) -> (usize, usize) {
        (self.h * self.w, self.oh * self.ow)
    }
}

/// The forward of one plane: `out` (`OH * OW`) from `x` (`H * W`).
#[inline(always)]
fn forward_plane(op: Pool2dOp, x: &[f32], out: &mut [f32], g: Geo) {
    match op {
        Pool2dOp::Max(opts) if is_2x2(&opts) => plane_2x2(x, out, g, false),
        Pool2dOp::Avg(opts) if is_2x2(&opts) => plane_2x2(x, out, g, true),
        Pool2dOp::ReluMax(opts) if is_2x2(&opts) => match ReluMax2x2Avx512::new(op) {
            Some(k) => k.forward(x, out, g, None),
            None => plane_2x2_relu(x, out, g),
        },
        Pool2dOp::Max(opts) => max_plane::<false>(x, out, &opts, g),
        Pool2dOp::ReluMax(opts) => max_plane::<true>(x, out, &opts, g),
        Pool2dOp::Avg(opts) => avg_plane(x, out, &opts, g),
        Pool2dOp::AdaptiveAvg(_) => adaptive_plane(x, out, g),
    }
}

/// The input window `[start, end)` of output index `i` along an axis of input
/// size `n` (clipped to the input), and the unclipped start.
#[inline(always)]
fn window(i: usize, k: usize, s: usize, p: usize, n: usize) -> (usize, usize) {
    let start = (i * s) as isize - p as isize;
    let end = (start + k as isize).min(n as isize) as usize;
    (start.max(0) as usize, end)
}

/// The adaptive window of output index `i` of `m` over an input axis of `n`.
#[inline(always)]
fn adaptive_window(i: usize, m: usize, n: usize) -> (usize, usize) {
    (i * n / m, ((i + 1) * n).div_ceil(m))
}

/// The running-maximum rule of the max pool: take `v` when it is greater, or a
/// NaN over a non-NaN.
#[inline(always)]
fn takes(v: f32, best: f32) -> bool {
    // Non-short-circuit operators: a select, not a branch (random data would
    // mispredict it).
    (v > best) | (v.is_nan() & !best.is_nan())
}

/// The running maximum after `v`.
#[inline(always)]
fn pick(best: f32, v: f32) -> f32 {
    if takes(v, best) { v } else { best }
}

/// Whether the window is 2x2 with stride 2 and no padding (the fast paths).
fn is_2x2(o: &Pool2dOptions) -> bool {
    *o == Pool2dOptions::new([2, 2])
}

/// The 2x2, stride-2 forward of one plane (max, or the mean when `avg`): the
/// general paths' operations in the same order, without their window bounds.
#[inline(always)]
fn plane_2x2(x: &[f32], out: &mut [f32], g: Geo, avg: bool) {
    for (oi, orow) in out.chunks_exact_mut(g.ow).enumerate() {
        let t = &x[2 * oi * g.w..][..2 * g.ow];
        let b = &x[(2 * oi + 1) * g.w..][..2 * g.ow];
        let quads = orow
            .iter_mut()
            .zip(t.chunks_exact(2))
            .zip(b.chunks_exact(2));
        if avg {
            for ((d, t), b) in quads {
                *d = (0.0 + t[0] + t[1] + b[0] + b[1]) / 4.0;
            }
        } else {
            for ((d, t), b) in quads {
                *d = pick(pick(pick(t[0], t[1]), b[0]), b[1]);
            }
        }
    }
}

/// The value the max pool scans: `x`, or `relu(x)` (`ReluMax`, the same
/// expression as the `relu` kernel) when `R`.
#[inline(always)]
fn act<const R: bool>(v: f32) -> f32 {
    if R { if v > 0.0 { v } else { 0.0 } } else { v }
}

/// The derivative of the ReLU at `v`, as the `relu` backward kernel takes it.
#[inline(always)]
fn relu_slope(v: f32) -> f32 {
    if v > 0.0 { 1.0 } else { 0.0 }
}

/// The 2x2, stride-2 `ReluMax` forward of one plane: the max pool of the ReLU
/// values, the same operations in the same order as `plane_2x2` over the output
/// of `relu`.
#[inline(always)]
fn plane_2x2_relu(x: &[f32], out: &mut [f32], g: Geo) {
    let r = act::<true>;
    for (oi, orow) in out.chunks_exact_mut(g.ow).enumerate() {
        let t = &x[2 * oi * g.w..][..2 * g.ow];
        let b = &x[(2 * oi + 1) * g.w..][..2 * g.ow];
        let quads = orow
            .iter_mut()
            .zip(t.chunks_exact(2))
            .zip(b.chunks_exact(2));
        for ((d, t), b) in quads {
            *d = pick(pick(pick(r(t[0]), r(t[1])), r(b[0])), r(b[1]));
        }
    }
}

/// The output columns whose windows lie wholly inside the input width:
/// `lo..hi` (possibly empty).
fn interior_cols(o: &Pool2dOptions, g: Geo) -> (usize, usize) {
    let (k, s, p) = (o.kernel[1], o.stride[1], o.padding[1]);
    let lo = p.div_ceil(s).min(g.ow);
    // Largest ow with ow * s - p + k <= w.
    let hi = if g.w + p >= k {
        ((g.w + p - k) / s + 1).min(g.ow)
    } else {
        0
    };
    (lo, hi.max(lo))
}

/// Max-pools one plane `x` (`h * w`) into `out` (`oh * ow`); of `relu(x)` when `R`.
#[inline(always)]
fn max_plane<const R: bool>(x: &[f32], out: &mut [f32], o: &Pool2dOptions, g: Geo) {
    let a = act::<R>;
    let (kw, sw, pw) = (o.kernel[1], o.stride[1], o.padding[1]);
    let (lo, hi) = interior_cols(o, g);
    for (oi, orow) in out.chunks_exact_mut(g.ow).enumerate() {
        let (h0, h1) = window(oi, o.kernel[0], o.stride[0], o.padding[0], g.h);
        // Edge columns: the clipped window, scanned element by element.
        let edge = |oj: usize| {
            let (w0, w1) = window(oj, kw, sw, pw, g.w);
            let mut best = a(x[h0 * g.w + w0]);
            for hh in h0..h1 {
                for &v in &x[hh * g.w + w0..hh * g.w + w1] {
                    let v = a(v);
                    if takes(v, best) {
                        best = v;
                    }
                }
            }
            best
        };
        for oj in (0..lo).chain(hi..g.ow) {
            orow[oj] = edge(oj);
        }
        // Interior columns: one pass per window element in row-major order,
        // vectorized across the outputs (each output's own order is the scan's).
        let inner = &mut orow[lo..hi];
        if inner.is_empty() {
            continue;
        }
        let base = lo * sw - pw;
        let n = inner.len();
        if kw == 2 && sw == 2 {
            // The common 2-wide, stride-2 window: both columns of a row in one
            // pass (an interleaved pair of loads), the same order per output.
            let pick = |d: f32, v: f32| if takes(v, d) { v } else { d };
            let first = &x[h0 * g.w + base..][..2 * n];
            for (d, p) in inner.iter_mut().zip(first.chunks_exact(2)) {
                *d = pick(a(p[0]), a(p[1]));
            }
            for hh in h0 + 1..h1 {
                let row = &x[hh * g.w + base..][..2 * n];
                for (d, p) in inner.iter_mut().zip(row.chunks_exact(2)) {
                    *d = pick(pick(*d, a(p[0])), a(p[1]));
                }
            }
            continue;
        }
        let first = &x[h0 * g.w + base..];
        if sw == 1 {
            for (d, &v) in inner.iter_mut().zip(&first[..n]) {
                *d = a(v);
            }
        } else {
            for (j, d) in inner.iter_mut().enumerate() {
                *d = a(first[j * sw]);
            }
        }
        for hh in h0..h1 {
            let row = &x[hh * g.w + base..];
            for kj in usize::from(hh == h0)..kw {
                let src = &row[kj..];
                if sw == 2 {
                    for (j, d) in inner.iter_mut().enumerate() {
                        let v = a(src[2 * j]);
                        *d = if takes(v, *d) { v } else { *d };
                    }
                } else {
                    for (j, d) in inner.iter_mut().enumerate() {
                        let v = a(src[j * sw]);
                        *d = if takes(v, *d) { v } else { *d };
                    }
                }
            }
        }
    }
}

/// The flat index (in the plane) that the max pool (of `relu(x)` when `R`)
/// selects for output `(oi, oj)`.
#[inline(always)]
fn max_index<const R: bool>(x: &[f32], oi: usize, oj: usize, o: &Pool2dOptions, g: Geo) -> usize {
    let (h0, h1) = window(oi, o.kernel[0], o.stride[0], o.padding[0], g.h);
    let (w0, w1) = window(oj, o.kernel[1], o.stride[1], o.padding[1], g.w);
    let mut at = h0 * g.w + w0;
    let mut best = act::<R>(x[at]);
    for hh in h0..h1 {
        let start = hh * g.w + w0;
        for (i, &v) in x[start..hh * g.w + w1].iter().enumerate() {
            let v = act::<R>(v);
            let t = takes(v, best);
            best = if t { v } else { best };
            at = if t { start + i } else { at };
        }
    }
    at
}

/// Average-pools one plane (`count_include_pad`: the divisor is the kernel area).
#[inline(always)]
fn avg_plane(x: &[f32], out: &mut [f32], o: &Pool2dOptions, g: Geo) {
    let (kw, sw, pw) = (o.kernel[1], o.stride[1], o.padding[1]);
    let div = (o.kernel[0] * o.kernel[1]) as f32;
    let (lo, hi) = interior_cols(o, g);
    for (oi, orow) in out.chunks_exact_mut(g.ow).enumerate() {
        let (h0, h1) = window(oi, o.kernel[0], o.stride[0], o.padding[0], g.h);
        for oj in (0..lo).chain(hi..g.ow) {
            let (w0, w1) = window(oj, kw, sw, pw, g.w);
            let mut s = 0.0f32;
            for hh in h0..h1 {
                for &v in &x[hh * g.w + w0..hh * g.w + w1] {
                    s += v;
                }
            }
            orow[oj] = s / div;
        }
        let inner = &mut orow[lo..hi];
        if inner.is_empty() {
            continue;
        }
        let base = lo * sw - pw;
        inner.fill(0.0);
        if kw == 2 && sw == 2 {
            let n = inner.len();
            for hh in h0..h1 {
                let row = &x[hh * g.w + base..][..2 * n];
                for (d, p) in inner.iter_mut().zip(row.chunks_exact(2)) {
                    *d = *d + p[0] + p[1];
                }
            }
            for d in inner.iter_mut() {
                *d /= div;
            }
            continue;
        }
        for hh in h0..h1 {
            let row = &x[hh * g.w + base..];
            for kj in 0..kw {
                let src = &row[kj..];
                if sw == 2 {
                    for (j, d) in inner.iter_mut().enumerate() {
                        *d += src[2 * j];
                    }
                } else {
                    for (j, d) in inner.iter_mut().enumerate() {
                        *d += src[j * sw];
                    }
                }
            }
        }
        for d in inner.iter_mut() {
            *d /= div;
        }
    }
}

/// Adaptive-average-pools one plane.
#[inline(always)]
fn adaptive_plane(x: &[f32], out: &mut [f32], g: Geo) {
    for (oi, orow) in out.chunks_exact_mut(g.ow).enumerate() {
        let (h0, h1) = adaptive_window(oi, g.oh, g.h);
        for (oj, d) in orow.iter_mut().enumerate() {
            let (w0, w1) = adaptive_window(oj, g.ow, g.w);
            let mut s = 0.0f32;
            for hh in h0..h1 {
                for &v in &x[hh * g.w + w0..hh * g.w + w1] {
                    s += v;
                }
            }
            *d = s / ((h1 - h0) * (w1 - w0)) as f32;
        }
    }
}

/// Zeroes the inputs of a plane that no 2x2, stride-2 window covers (an odd
/// last row or column); the fast backward paths write every other input.
#[inline(always)]
fn zero_uncovered_2x2(gx: &mut [f32], g: Geo) {
    let (rows, cols) = (2 * g.oh, 2 * g.ow);
    if cols < g.w {
        for r in gx[..rows * g.w].chunks_exact_mut(g.w) {
            r[cols..].fill(0.0);
        }
    }
    gx[rows * g.w..].fill(0.0);
}

/// The AVX-512 kernels of the 2x2, stride-2 `ReluMax` pool; a value exists
/// only when they can run (the op is that pool and the process runs at the
/// AVX-512 level, so the CPU has AVX-512 F). Taken once per op, so every plane
/// of the op, and both passes of a backward, use the same kernels. The same
/// bits as the plain per-plane loops (over the normalized plane when a
/// normalization is given).
#[derive(Clone, Copy)]
struct ReluMax2x2Avx512(());

impl ReluMax2x2Avx512 {
    /// The kernels for `op`, if they can run.
    #[inline(always)]
    fn new(op: Pool2dOp) -> Option<ReluMax2x2Avx512> {
        #[cfg(target_arch = "x86_64")]
        if let Pool2dOp::ReluMax(o) = op
            && is_2x2(&o)
            && simd::level() == SimdLevel::Avx512
        {
            return Some(ReluMax2x2Avx512(()));
        }
        let _ = op;
        None
    }

    /// The forward of one plane (over `norm`'s normalization of `x` when
    /// given).
    #[inline(always)]
    fn forward(self, x: &[f32], out: &mut [f32], g: Geo, norm: Option<Affine>) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `self` exists only at the AVX-512 level, selected only on
        // CPUs that have AVX-512 F.
        unsafe {
            relu_max_2x2_forward_avx512(x, out, g.w, (g.oh, g.ow), norm)
        };
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!(
            "ReluMax2x2Avx512 is never made off x86_64 {:?}",
            (x, out, g, norm)
        );
    }

    /// The backward of one plane: every input of `gx` a window covers written
    /// (the others are not: see [`zero_uncovered_2x2`]).
    #[inline(always)]
    fn backward(self, x: &[f32], gy: &[f32], gx: &mut [f32], g: Geo, norm: Option<Affine>) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `forward`.
        unsafe {
            relu_max_2x2_backward_avx512(x, gy, gx, g.w, (g.oh, g.ow), norm)
        };
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!(
            "ReluMax2x2Avx512 is never made off x86_64 {:?}",
            (x, gy, gx, g, norm)
        );
    }
}

/// Outputs per step of the 2x2 backward.
const STEP: usize = 16;

/// The 2x2, stride-2 backward of one plane for `Max` (or `ReluMax` when `R`):
/// every covered input is written once, `0 + g` where selected (as the general
/// path's `+=` into zeros; times the ReLU's slope for `ReluMax`, as
/// `relu_backward` of the max pool's gradient), `0` elsewhere. In steps of
/// [`STEP`] windows of one output row, copied into fixed-size arrays (zero
/// padded) so that [`window_grads_2x2`] is one fixed-length loop.
#[inline(always)]
fn backward_2x2<const R: bool>(x: &[f32], gy: &[f32], gx: &mut [f32], g: Geo) {
    let w = g.w;
    for oi in 0..g.oh {
        let (top, rest) = gx[2 * oi * w..].split_at_mut(w);
        let xt = &x[2 * oi * w..][..w];
        let xb = &x[(2 * oi + 1) * w..][..w];
        let gr = &gy[oi * g.ow..][..g.ow];
        for j0 in (0..g.ow).step_by(STEP) {
            let n = STEP.min(g.ow - j0);
            let (c0, c1) = (2 * j0, 2 * (j0 + n));
            let (mut t, mut b, mut gv) = ([0f32; 2 * STEP], [0f32; 2 * STEP], [0f32; STEP]);
            t[..2 * n].copy_from_slice(&xt[c0..c1]);
            b[..2 * n].copy_from_slice(&xb[c0..c1]);
            gv[..n].copy_from_slice(&gr[j0..j0 + n]);
            let (mut dt, mut db) = ([0f32; 2 * STEP], [0f32; 2 * STEP]);
            window_grads_2x2::<R>(&t, &b, &gv, &mut dt, &mut db);
            top[c0..c1].copy_from_slice(&dt[..2 * n]);
            rest[c0..c1].copy_from_slice(&db[..2 * n]);
        }
    }
}

/// The input gradients of [`STEP`] 2x2 windows: window `j` covers `t[2j]`,
/// `t[2j + 1]` (top row) and `b[2j]`, `b[2j + 1]` (bottom row) and gets `gv[j]`.
/// The selected element is the first (row-major) equal to the window's
/// maximum: by bits for `Max` (so a NaN maximum finds its NaN), by value over
/// the ReLU values for `ReluMax` (never NaN, never -0.0). Compares and selects
/// only, no index to carry.
#[inline(always)]
fn window_grads_2x2<const R: bool>(
    t: &[f32; 2 * STEP],
    b: &[f32; 2 * STEP],
    gv: &[f32; STEP],
    dt: &mut [f32; 2 * STEP],
    db: &mut [f32; 2 * STEP],
) {
    for j in 0..STEP {
        let (x0, x1, x2, x3) = (t[2 * j], t[2 * j + 1], b[2 * j], b[2 * j + 1]);
        let (s0, s1, s2) = if R {
            let r = act::<true>;
            let (a0, a1, a2, a3) = (r(x0), r(x1), r(x2), r(x3));
            let m = pick(pick(pick(a0, a1), a2), a3);
            let s0 = a0 == m;
            let s1 = !s0 & (a1 == m);
            (s0, s1, !(s0 | s1) & (a2 == m))
        } else {
            let m = pick(pick(pick(x0, x1), x2), x3).to_bits();
            let s0 = x0.to_bits() == m;
            let s1 = !s0 & (x1.to_bits() == m);
            (s0, s1, !(s0 | s1) & (x2.to_bits() == m))
        };
        let s3 = !(s0 | s1 | s2);
        let v = 0.0 + gv[j];
        let grad = |s: bool, x: f32| match (s, R) {
            (false, _) => 0.0,
            (true, true) => v * relu_slope(x),
            (true, false) => v,
        };
        dt[2 * j] = grad(s0, x0);
        dt[2 * j + 1] = grad(s1, x1);
        db[2 * j] = grad(s2, x2);
        db[2 * j + 1] = grad(s3, x3);
    }
}

/// The input gradient of one plane (`gx`, zeroed here where no fast path
/// writes) from the output gradient `gy`, adding in row-major output order.
#[inline(always)]
fn backward_plane(op: Pool2dOp, x: &[f32], gy: &[f32], gx: &mut [f32], g: Geo) {
    match op {
        Pool2dOp::Max(o) | Pool2dOp::Avg(o) | Pool2dOp::ReluMax(o) if is_2x2(&o) => {
            zero_uncovered_2x2(gx, g);
        }
        _ => gx.fill(0.0),
    }
    match op {
        Pool2dOp::Max(o) if is_2x2(&o) => backward_2x2::<false>(x, gy, gx, g),
        Pool2dOp::Max(o) => {
            for oi in 0..g.oh {
                for oj in 0..g.ow {
                    gx[max_index::<false>(x, oi, oj, &o, g)] += gy[oi * g.ow + oj];
                }
            }
        }
        Pool2dOp::ReluMax(o) if is_2x2(&o) => match ReluMax2x2Avx512::new(op) {
            Some(k) => k.backward(x, gy, gx, g, None),
            None => backward_2x2::<true>(x, gy, gx, g),
        },
        Pool2dOp::ReluMax(o) => {
            // `max_pool2d`'s backward over the ReLU values, then the ReLU's.
            for oi in 0..g.oh {
                for oj in 0..g.ow {
                    gx[max_index::<true>(x, oi, oj, &o, g)] += gy[oi * g.ow + oj];
                }
            }
            for (d, &v) in gx.iter_mut().zip(x) {
                *d *= relu_slope(v);
            }
        }
        Pool2dOp::Avg(o) if is_2x2(&o) => {
            // Each covered input gets `0 + g / 4`, as the general path's `+=`.
            let w = g.w;
            for oi in 0..g.oh {
                let (top, rest) = gx[2 * oi * w..].split_at_mut(w);
                let (t, b) = (&mut top[..2 * g.ow], &mut rest[..2 * g.ow]);
                let gr = &gy[oi * g.ow..][..g.ow];
                for ((t, b), &gv) in t.chunks_exact_mut(2).zip(b.chunks_exact_mut(2)).zip(gr) {
                    let v = 0.0 + gv / 4.0;
                    t[0] = v;
                    t[1] = v;
                    b[0] = v;
                    b[1] = v;
                }
            }
        }
        Pool2dOp::Avg(o) => {
            let div = (o.kernel[0] * o.kernel[1]) as f32;
            for oi in 0..g.oh {
                let (h0, h1) = window(oi, o.kernel[0], o.stride[0], o.padding[0], g.h);
                for oj in 0..g.ow {
                    let (w0, w1) = window(oj, o.kernel[1], o.stride[1], o.padding[1], g.w);
                    let v = gy[oi * g.ow + oj] / div;
                    for hh in h0..h1 {
                        for d in &mut gx[hh * g.w + w0..hh * g.w + w1] {
                            *d += v;
                        }
                    }
                }
            }
        }
        Pool2dOp::AdaptiveAvg(_) => {
            for oi in 0..g.oh {
                let (h0, h1) = adaptive_window(oi, g.oh, g.h);
                for oj in 0..g.ow {
                    let (w0, w1) = adaptive_window(oj, g.ow, g.w);
                    let v = gy[oi * g.ow + oj] / ((h1 - h0) * (w1 - w0)) as f32;
                    for hh in h0..h1 {
                        for d in &mut gx[hh * g.w + w0..hh * g.w + w1] {
                            *d += v;
                        }
                    }
                }
            }
        }
    }
}

impl ExecContext {
    /// Runs the pooling op `op` over `x` (`[N, C, H, W]`): the output is
    /// `[N, C, OH, OW]` with `OH = (H + 2 * ph - kh) / sh + 1` (likewise `OW`) for
    /// `Max`/`Avg`, and the requested size for `AdaptiveAvg`. See the module docs
    /// for the tie rule, the padding and the divisors.
    ///
    /// Every plane is pooled by one task in a fixed order: the same bits for every
    /// team size and vector level, and a sample's result does not depend on the
    /// other samples of the batch.
    ///
    /// ```
    /// use fucina_exec::{ExecContext, Pool2dOp, Pool2dOptions};
    ///
    /// let ctx = ExecContext::new();
    /// let x = ctx.from_slice(&[1, 1, 2, 4], &[1., 5., 2., 0., 3., 4., 8., 1.])?;
    /// let m = ctx.pool2d(Pool2dOp::Max(Pool2dOptions::new([2, 2])), &x)?;
    /// assert_eq!((m.shape(), m.to_vec()), (&[1, 1, 1, 2][..], vec![5., 8.]));
    /// let a = ctx.avg_pool2d(&x, Pool2dOptions::new([2, 2]))?;
    /// assert_eq!(a.to_vec(), [3.25, 2.75]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`] naming the offending value when `x` is not of
    /// rank 4, a kernel or stride size is 0, a padding exceeds half its kernel
    /// size, the kernel is larger than the padded input, or an adaptive output
    /// size is 0; [`ExecError::OutOfMemory`]. Nothing is allocated before the
    /// checks pass.
    pub fn pool2d(&self, op: Pool2dOp, x: &RawTensor) -> Result<RawTensor, ExecError> {
        let out_dims = op.output_shape(x.shape())?;
        let os = out_dims.as_slice();
        let g = Geo::new(x.shape(), os);
        let (ip, opl) = g.planes();
        let xc = self.contiguous(x)?;
        let xs = xc.contiguous_slice();
        self.new_tensor(op.name(), os, |out| {
            self.par_rows(out, opl, plane_work(op, ip, opl), |planes, o| {
                vectorized!(for (p, op_) in planes.zip(o.chunks_exact_mut(opl)) {
                    forward_plane(op, &xs[p * ip..][..ip], op_, g);
                })
            });
        })
    }

    /// The gradient of [`pool2d`](ExecContext::pool2d) with respect to its input
    /// of shape `x_shape`, from the output's gradient `grad`. `x` is the forward
    /// input, needed by `Max` only (see [`Pool2dOp::keeps_input`]; `None` is fine
    /// for the others). Contributions of overlapping windows are added in
    /// row-major output order, plane by plane: the same bits for every team size.
    ///
    /// # Errors
    /// As [`pool2d`](ExecContext::pool2d) for `x_shape` and the options;
    /// [`ExecError::ShapeMismatch`] if `grad` is not of the output's shape or `x`
    /// is not of shape `x_shape`; [`ExecError::InvalidArgument`] if `op` is `Max`
    /// and `x` is `None`; [`ExecError::OutOfMemory`].
    pub fn pool2d_backward(
        &self,
        op: Pool2dOp,
        x_shape: &[usize],
        x: Option<&RawTensor>,
        grad: &RawTensor,
    ) -> Result<RawTensor, ExecError> {
        let out_dims = op.output_shape(x_shape)?;
        let os = out_dims.as_slice();
        if grad.shape() != os {
            return Err(ExecError::ShapeMismatch {
                op: op.name(),
                lhs: out_dims,
                rhs: grad.dims(),
                reason: "the gradient must have the pooled output's shape",
            });
        }
        if let Some(x) = x
            && x.shape() != x_shape
        {
            return Err(ExecError::ShapeMismatch {
                op: op.name(),
                lhs: Dims::new(x_shape),
                rhs: x.dims(),
                reason: "the saved input must have the input shape",
            });
        }
        let xc = match (op.keeps_input(), x) {
            (true, Some(x)) => Some(self.contiguous(x)?),
            (true, None) => {
                return Err(ExecError::InvalidArgument {
                    op: op.name(),
                    reason: "the max pool backward needs the forward input",
                });
            }
            (false, _) => None,
        };
        let xs: &[f32] = xc.as_ref().map_or(&[], |t| t.contiguous_slice());
        let g = Geo::new(x_shape, os);
        let (ip, opl) = g.planes();
        let gc = self.contiguous(grad)?;
        let gs = gc.contiguous_slice();
        self.new_tensor(op.name(), x_shape, |out| {
            self.par_rows(
                out,
                ip,
                plane_work(op, ip, opl).saturating_add(ip),
                |planes, o| {
                    vectorized!(for (p, gx) in planes.zip(o.chunks_exact_mut(ip)) {
                        let xp = if xs.is_empty() {
                            xs
                        } else {
                            &xs[p * ip..][..ip]
                        };
                        backward_plane(op, xp, &gs[p * opl..][..opl], gx, g);
                    })
                },
            );
        })
    }

    /// 2-D max pooling of `x` (`[N, C, H, W]`): [`pool2d`](ExecContext::pool2d)
    /// with [`Pool2dOp::Max`]. Ties go to the first element in row-major window
    /// order; padding counts as `-inf`.
    ///
    /// # Errors
    /// As [`pool2d`](ExecContext::pool2d).
    pub fn max_pool2d(&self, x: &RawTensor, opts: Pool2dOptions) -> Result<RawTensor, ExecError> {
        self.pool2d(Pool2dOp::Max(opts), x)
    }

    /// 2-D average pooling of `x` (`[N, C, H, W]`) with `count_include_pad =
    /// true`: [`pool2d`](ExecContext::pool2d) with [`Pool2dOp::Avg`].
    ///
    /// # Errors
    /// As [`pool2d`](ExecContext::pool2d).
    pub fn avg_pool2d(&self, x: &RawTensor, opts: Pool2dOptions) -> Result<RawTensor, ExecError> {
        self.pool2d(Pool2dOp::Avg(opts), x)
    }

    /// 2-D adaptive average pooling of `x` (`[N, C, H, W]`) to `[N, C, oh, ow]`:
    /// [`pool2d`](ExecContext::pool2d) with [`Pool2dOp::AdaptiveAvg`].
    ///
    /// # Errors
    /// As [`pool2d`](ExecContext::pool2d).
    pub fn adaptive_avg_pool2d(
        &self,
        x: &RawTensor,
        size: [usize; 2],
    ) -> Result<RawTensor, ExecError> {
        self.pool2d(Pool2dOp::AdaptiveAvg(size), x)
    }

    /// The max pool of `relu(x)` (`x` is `[N, C, H, W]`), fused:
    /// [`pool2d`](ExecContext::pool2d) with [`Pool2dOp::ReluMax`]. The same bits
    /// as [`relu`](ExecContext::relu) then [`max_pool2d`](ExecContext::max_pool2d),
    /// in one pass and without the ReLU's output.
    ///
    /// ```
    /// use fucina_exec::{ExecContext, Pool2dOptions};
    ///
    /// let ctx = ExecContext::new();
    /// let x = ctx.from_slice(&[1, 1, 2, 4], &[-1., -5., 2., 0., -3., -4., 8., 1.])?;
    /// let o = Pool2dOptions::new([2, 2]);
    /// let fused = ctx.relu_max_pool2d(&x, o)?;
    /// assert_eq!(fused.to_vec(), [0., 8.]);
    /// assert_eq!(fused.to_vec(), ctx.max_pool2d(&ctx.relu(&x)?, o)?.to_vec());
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// As [`pool2d`](ExecContext::pool2d).
    pub fn relu_max_pool2d(
        &self,
        x: &RawTensor,
        opts: Pool2dOptions,
    ) -> Result<RawTensor, ExecError> {
        self.pool2d(Pool2dOp::ReluMax(opts), x)
    }
}
