//! `interpolate` of `[N, C, H, W]` planes to a new size (PyTorch's
//! `torch.nn.functional.interpolate` with `nearest` and `bilinear` modes) and
//! its backward.
//!
//! Source coordinates follow PyTorch's CPU kernels, in f32: the scale of an
//! axis is `in / out` (or `1 / scale_factor` when a scale factor gave the
//! size), `(in - 1) / (out - 1)` for bilinear with `align_corners`. Nearest
//! reads `min(floor(dst * scale), in - 1)`; bilinear reads the two neighbours
//! of `scale * (dst + 0.5) - 0.5` (clamped at 0; `scale * dst` with
//! `align_corners`) with weights `1 - l` and `l`.
//!
//! Each output plane is written by one task; the backward adds each output
//! gradient (times its weights) into the input in row-major output order, one
//! plane per task. The bits never depend on the team size or the vector level,
//! and a plane's result depends on that plane alone.

use crate::context::ExecContext;
use crate::error::ExecError;
use crate::tensor::RawTensor;
use crate::tensor::layout::{Dims, check_shape};

/// How [`ExecContext::interpolate`] computes an output element.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InterpolateMode {
    /// The input element at `floor(dst * scale)` (PyTorch's `"nearest"`).
    Nearest,
    /// The weighted mean of the four nearest input elements (PyTorch's
    /// `"bilinear"`); `align_corners` maps the corner elements of input and
    /// output onto each other.
    Bilinear {
        /// PyTorch's `align_corners` (its default is `false`).
        align_corners: bool,
    },
}

/// The output size (given, or from scale factors) and the mode of
/// [`ExecContext::interpolate`]: exactly one of `size` and `scale_factor`, as
/// in PyTorch.
///
/// ```
/// use fucina_exec::{InterpolateMode, InterpolateOptions};
///
/// let o = InterpolateOptions::scale([2.0, 2.0], InterpolateMode::Nearest);
/// assert_eq!(o.out_shape(&[1, 3, 4, 5])?.as_slice(), [1, 3, 8, 10]);
/// let s = InterpolateOptions::size([7, 3], InterpolateMode::Bilinear { align_corners: true });
/// assert_eq!(s.out_shape(&[2, 1, 4, 5])?.as_slice(), [2, 1, 7, 3]);
/// # Ok::<(), fucina_exec::ExecError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct InterpolateOptions {
    /// The output's `[H, W]`.
    pub size: Option<[usize; 2]>,
    /// The factors `[sh, sw]` (finite, positive): the output is
    /// `floor(H * sh) × floor(W * sw)` and the coordinates scale by
    /// `1 / factor` (PyTorch with `recompute_scale_factor` unset).
    pub scale_factor: Option<[f64; 2]>,
    /// How an output element is computed.
    pub mode: InterpolateMode,
}

impl InterpolateOptions {
    /// Resize to `size = [H, W]`.
    pub fn size(size: [usize; 2], mode: InterpolateMode) -> InterpolateOptions {
        InterpolateOptions {
            size: Some(size),
            scale_factor: None,
            mode,
        }
    }

    /// Resize by `factor = [sh, sw]`.
    pub fn scale(factor: [f64; 2], mode: InterpolateMode) -> InterpolateOptions {
        InterpolateOptions {
            size: None,
            scale_factor: Some(factor),
            mode,
        }
    }

    /// The op's name as errors and graph nodes spell it.
    pub fn name(&self) -> &'static str {
        match self.mode {
            InterpolateMode::Nearest => "upsample_nearest2d",
            InterpolateMode::Bilinear { .. } => "upsample_bilinear2d",
        }
    }

    /// The output shape for an input of shape `x`.
    ///
    /// # Errors
    /// As [`ExecContext::interpolate`] for the shape and the options.
    pub fn out_shape(&self, x: &[usize]) -> Result<Dims, ExecError> {
        Ok(self.geometry(self.name(), x)?.out)
    }

    fn geometry(&self, op: &'static str, x: &[usize]) -> Result<Geometry, ExecError> {
        if x.len() != 4 {
            return Err(ExecError::InvalidShape {
                op,
                shape: Dims::new(x),
                reason: "the input must be [N, C, H, W] (rank 4)",
            });
        }
        check_shape(op, x)?;
        let (h, w) = (x[2], x[3]);
        let [oh, ow] = match (self.size, self.scale_factor) {
            (Some(s), None) => s,
            (None, Some(f)) => {
                let mut s = [0; 2];
                for (i, (&n, &k)) in [h, w].iter().zip(&f).enumerate() {
                    if !(k.is_finite() && k > 0.0) {
                        return Err(ExecError::InvalidArgument {
                            op,
                            reason: "scale_factor must be finite and positive",
                        });
                    }
                    let o = (n as f64 * k).floor();
                    if o > usize::MAX as f64 / 2.0 {
                        return Err(ExecError::Overflow {
                            op,
                            shape: Dims::new(x),
                        });
                    }
                    s[i] = o as usize;
                }
                s
            }
            _ => {
                return Err(ExecError::InvalidArgument {
                    op,
                    reason: "exactly one of size and scale_factor must be given",
                });
            }
        };
        for (name, v) in [("size[0]", oh), ("size[1]", ow)] {
            if v == 0 {
                return Err(ExecError::InvalidOption {
                    op,
                    name,
                    value: 0,
                    reason: "the output size must be at least 1 (a scale factor too small gives 0)",
                });
            }
        }
        let out = Dims::new(&[x[0], x[1], oh, ow]);
        check_shape(op, &out)?;
        let scale = |i: usize, n: usize, o: usize| -> f32 {
            match self.mode {
                InterpolateMode::Bilinear {
                    align_corners: true,
                } => {
                    if o > 1 {
                        (n - 1) as f32 / (o - 1) as f32
                    } else {
                        0.0
                    }
                }
                _ => match self.scale_factor {
                    Some(f) => (1.0 / f[i]) as f32,
                    None => n as f32 / o as f32,
                },
            }
        };
        Ok(Geometry {
            h,
            w,
            oh,
            ow,
            sh: scale(0, h, oh),
            sw: scale(1, w, ow),
            out,
        })
    }
}

/// The plane sizes, the coordinate scales and the output shape.
struct Geometry {
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    sh: f32,
    sw: f32,
    out: Dims,
}

impl Geometry {
    /// `(h, w, oh, ow, sh, sw)`.
    fn sizes(&self) -> (usize, usize, usize, usize, f32, f32) {
        (self.h, self.w, self.oh, self.ow, self.sh, self.sw)
    }
}

/// Where output index `o` of an axis (input size `n`, output size `out`,
/// coordinate scale `scale`) reads: `(i0, i1, w0, w1)`, the two input indices
/// and their weights (nearest: `i0 == i1`, weights 1 and 0).
#[inline(always)]
fn source(
    o: usize,
    n: usize,
    out: usize,
    scale: f32,
    mode: InterpolateMode,
) -> (usize, usize, f32, f32) {
    if out == n {
        return (o, o, 1.0, 0.0);
    }
    match mode {
        InterpolateMode::Nearest => {
            let i = if out == 2 * n {
                o >> 1
            } else {
                ((o as f32 * scale).floor() as usize).min(n - 1)
            };
            (i, i, 1.0, 0.0)
        }
        InterpolateMode::Bilinear { align_corners } => {
            let real = if align_corners {
                scale * o as f32
            } else {
                (scale * (o as f32 + 0.5) - 0.5).max(0.0)
            };
            let i0 = (real.floor() as usize).min(n - 1);
            let l1 = (real - i0 as f32).clamp(0.0, 1.0);
            let i1 = i0 + usize::from(i0 < n - 1);
            (i0, i1, 1.0 - l1, l1)
        }
    }
}

impl ExecContext {
    /// `x` (`[N, C, H, W]`) resized to `opts`'s output size, each output
    /// element computed as `opts.mode` says (see the module documentation
    /// for the coordinates): PyTorch's `torch.nn.functional.interpolate(x,
    /// size | scale_factor, mode, align_corners)` for `"nearest"` and
    /// `"bilinear"`.
    ///
    /// ```
    /// use fucina_exec::{ExecContext, InterpolateMode, InterpolateOptions};
    ///
    /// let ctx = ExecContext::new();
    /// let x = ctx.from_slice(&[1, 1, 1, 2], &[1., 3.])?;
    /// let near = InterpolateOptions::scale([1.0, 2.0], InterpolateMode::Nearest);
    /// assert_eq!(ctx.interpolate(&x, near)?.to_vec(), [1., 1., 3., 3.]);
    /// let lin = InterpolateOptions::size([1, 3], InterpolateMode::Bilinear { align_corners: true });
    /// assert_eq!(ctx.interpolate(&x, lin)?.to_vec(), [1., 2., 3.]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`] if `x` is not of rank 4;
    /// [`ExecError::InvalidArgument`] if both or neither of `size` and
    /// `scale_factor` are given, or a scale factor is not finite and
    /// positive; [`ExecError::InvalidOption`] if an output size is 0;
    /// [`ExecError::Overflow`] if the output's element count does not fit;
    /// [`ExecError::OutOfMemory`].
    pub fn interpolate(
        &self,
        x: &RawTensor,
        opts: InterpolateOptions,
    ) -> Result<RawTensor, ExecError> {
        let op = opts.name();
        let g = opts.geometry(op, x.shape())?;
        let xc = self.contiguous(x)?;
        let xs = xc.contiguous_slice();
        let (h, w, oh, ow, sh, sw) = g.sizes();
        let mode = opts.mode;
        self.new_tensor(op, g.out.as_slice(), |out| {
            let plane = oh * ow;
            self.par_rows(out, plane, plane * 4, |planes, o| {
                for (p, op) in planes.zip(o.chunks_exact_mut(plane)) {
                    let xp = &xs[p * h * w..][..h * w];
                    for (oy, orow) in op.chunks_exact_mut(ow).enumerate() {
                        let (y0, y1, wy0, wy1) = source(oy, h, oh, sh, mode);
                        let (r0, r1) = (&xp[y0 * w..][..w], &xp[y1 * w..][..w]);
                        for (ox, o) in orow.iter_mut().enumerate() {
                            let (x0, x1, wx0, wx1) = source(ox, w, ow, sw, mode);
                            *o = match mode {
                                InterpolateMode::Nearest => r0[x0],
                                InterpolateMode::Bilinear { .. } => {
                                    wy0 * (wx0 * r0[x0] + wx1 * r0[x1])
                                        + wy1 * (wx0 * r1[x0] + wx1 * r1[x1])
                                }
                            };
                        }
                    }
                }
            });
        })
    }

    /// The gradient of [`interpolate`](ExecContext::interpolate) with respect
    /// to its input of shape `x_shape`, from the output's gradient `grad`:
    /// each output gradient added, times its weights, into the input elements
    /// it was read from, in row-major output order within each plane.
    ///
    /// # Errors
    /// As [`interpolate`](ExecContext::interpolate) for `x_shape` and the
    /// options; [`ExecError::ShapeMismatch`] if `grad` does not have the
    /// output's shape; [`ExecError::OutOfMemory`].
    pub fn interpolate_backward(
        &self,
        grad: &RawTensor,
        x_shape: &[usize],
        opts: InterpolateOptions,
    ) -> Result<RawTensor, ExecError> {
        let op = match opts.mode {
            InterpolateMode::Nearest => "upsample_nearest2d_backward",
            InterpolateMode::Bilinear { .. } => "upsample_bilinear2d_backward",
        };
        let g = opts.geometry(op, x_shape)?;
        if grad.shape() != g.out.as_slice() {
            return Err(ExecError::ShapeMismatch {
                op,
                lhs: g.out,
                rhs: grad.dims(),
                reason: "the gradient must have the interpolated output's shape",
            });
        }
        let gc = self.contiguous(grad)?;
        let gs = gc.contiguous_slice();
        let (h, w, oh, ow, sh, sw) = g.sizes();
        let mode = opts.mode;
        self.new_tensor(op, x_shape, |out| {
            let plane = h * w;
            self.par_rows(out, plane, oh * ow * 4, |planes, o| {
                for (p, ip) in planes.zip(o.chunks_exact_mut(plane)) {
                    ip.fill(0.0);
                    let gp = &gs[p * oh * ow..][..oh * ow];
                    for (oy, grow) in gp.chunks_exact(ow).enumerate() {
                        let (y0, y1, wy0, wy1) = source(oy, h, oh, sh, mode);
                        for (ox, &gv) in grow.iter().enumerate() {
                            let (x0, x1, wx0, wx1) = source(ox, w, ow, sw, mode);
                            match mode {
                                InterpolateMode::Nearest => ip[y0 * w + x0] += gv,
                                InterpolateMode::Bilinear { .. } => {
                                    ip[y0 * w + x0] += wy0 * wx0 * gv;
                                    ip[y0 * w + x1] += wy0 * wx1 * gv;
                                    ip[y1 * w + x0] += wy1 * wx0 * gv;
                                    ip[y1 * w + x1] += wy1 * wx1 * gv;
                                }
                            }
                        }
                    }
                }
            });
        })
    }
}
