//! `pad` over the last one or two axes (PyTorch's `torch.nn.functional.pad`
//! with `constant`, `reflect` and `replicate` modes) and its backward.
//!
//! The tensor is seen as planes of its last two axes (`[outer, H, W]`; a
//! one-axis pad has `H = 1` and no vertical padding). Each output plane is
//! written by one task from its input plane. The backward adds each output
//! gradient into the input position it was read from, in row-major output
//! order, one plane per task: the bits never depend on the team size or the
//! vector level, and a plane's result depends on that plane alone.

use crate::context::ExecContext;
use crate::error::ExecError;
use crate::tensor::RawTensor;
use crate::tensor::layout::{Dims, check_shape};

/// How [`ExecContext::pad`] fills the border.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PadMode {
    /// Every border element is the value (PyTorch's `mode="constant"`).
    Constant(f32),
    /// The input mirrored at its edge, the edge element not repeated
    /// (`[a, b, c]` padded by 2 on each side is `[c, b, a, b, c, b, a]`):
    /// each pad must be smaller than its axis.
    Reflect,
    /// The edge element repeated (`[a, b, c]` → `[a, a, a, b, c, c, c]`).
    Replicate,
}

/// The widths and the mode of [`ExecContext::pad`].
///
/// `pads` is PyTorch's order, from the last axis backwards: `[left, right]`
/// pads the last axis, `[left, right, top, bottom]` the last two.
///
/// ```
/// use fucina_exec::{PadMode, PadOptions};
///
/// let o = PadOptions::new(&[1, 2], PadMode::Reflect)?;
/// assert_eq!((o.pads, o.axes), ([1, 2, 0, 0], 1));
/// assert!(PadOptions::new(&[1, 2, 3], PadMode::Replicate).is_err());
/// # Ok::<(), fucina_exec::ExecError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PadOptions {
    /// `[left, right, top, bottom]`: before and after the last axis, then
    /// before and after the one before it (the last two are 0 when `axes` is
    /// 1).
    pub pads: [usize; 4],
    /// How many trailing axes are padded: 1 or 2.
    pub axes: usize,
    /// How the border is filled.
    pub mode: PadMode,
}

impl PadOptions {
    /// The options for PyTorch's `pad` list: `[left, right]` (the last axis)
    /// or `[left, right, top, bottom]` (the last two).
    ///
    /// # Errors
    /// [`ExecError::InvalidArgument`] naming `pad` if `pads` has another
    /// length than 2 or 4.
    pub fn new(pads: &[usize], mode: PadMode) -> Result<PadOptions, ExecError> {
        let axes = match pads.len() {
            2 => 1,
            4 => 2,
            _ => {
                return Err(ExecError::InvalidArgument {
                    op: "pad",
                    reason: "pads must hold 2 widths (the last axis) or 4 (the last two axes)",
                });
            }
        };
        let mut p = [0; 4];
        p[..pads.len()].copy_from_slice(pads);
        Ok(PadOptions {
            pads: p,
            axes,
            mode,
        })
    }

    /// The output shape for an input of shape `x`.
    ///
    /// # Errors
    /// As [`ExecContext::pad`] for the shape and the options.
    pub fn out_shape(&self, x: &[usize]) -> Result<Dims, ExecError> {
        Ok(self.geometry("pad", x)?.out)
    }

    /// Checks `x` against the options; the plane sizes and the output shape.
    fn geometry(&self, op: &'static str, x: &[usize]) -> Result<Geometry, ExecError> {
        if !(1..=2).contains(&self.axes) {
            return Err(ExecError::InvalidOption {
                op,
                name: "axes",
                value: self.axes,
                reason: "must be 1 or 2",
            });
        }
        if self.axes == 1 && self.pads[2..] != [0, 0] {
            return Err(ExecError::InvalidArgument {
                op,
                reason: "pads[2] and pads[3] must be 0 when one axis is padded",
            });
        }
        if x.len() < self.axes {
            return Err(ExecError::InvalidShape {
                op,
                shape: Dims::new(x),
                reason: "the input has fewer axes than the padding pads",
            });
        }
        check_shape(op, x)?;
        let r = x.len();
        let w = x[r - 1];
        let h = if self.axes == 2 { x[r - 2] } else { 1 };
        const NAMES: [&str; 4] = ["pads[0]", "pads[1]", "pads[2]", "pads[3]"];
        for (i, &p) in self.pads.iter().enumerate() {
            let n = if i < 2 { w } else { h };
            if self.mode == PadMode::Reflect && p >= n {
                return Err(ExecError::InvalidOption {
                    op,
                    name: NAMES[i],
                    value: p,
                    reason: "reflect padding must be smaller than the padded axis",
                });
            }
        }
        let overflow = || ExecError::Overflow {
            op,
            shape: Dims::new(x),
        };
        let [l, rt, t, b] = self.pads;
        let ow = w
            .checked_add(l)
            .and_then(|v| v.checked_add(rt))
            .ok_or_else(overflow)?;
        let oh = h
            .checked_add(t)
            .and_then(|v| v.checked_add(b))
            .ok_or_else(overflow)?;
        let mut out = Dims::new(x);
        out.as_mut_slice()[r - 1] = ow;
        if self.axes == 2 {
            out.as_mut_slice()[r - 2] = oh;
        }
        check_shape(op, &out)?;
        Ok(Geometry { h, w, oh, ow, out })
    }
}

/// The plane sizes of a pad and its output shape.
struct Geometry {
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    out: Dims,
}

/// The input index that output index `o` of an axis of size `n` padded by
/// `before` reads, or `None` for a constant border.
#[inline(always)]
fn source(o: usize, n: usize, before: usize, mode: PadMode) -> Option<usize> {
    // `i` as a signed position in the input; `n` and the pads fit in `isize`
    // because the output's element count does.
    let i = o as isize - before as isize;
    let last = n as isize - 1;
    match mode {
        PadMode::Constant(_) => (0..=last).contains(&i).then_some(i as usize),
        PadMode::Reflect => Some(if i < 0 {
            (-i) as usize
        } else if i > last {
            (2 * last - i) as usize
        } else {
            i as usize
        }),
        PadMode::Replicate => Some(i.clamp(0, last) as usize),
    }
}

impl ExecContext {
    /// `x` padded on its last axis (`opts.axes == 1`) or its last two axes
    /// (`opts.axes == 2`) by `opts.pads` (`[left, right, top, bottom]`),
    /// the border filled as `opts.mode` says: PyTorch's
    /// `torch.nn.functional.pad(x, pads, mode, value)`. Any rank of at least
    /// `axes` is accepted, in every mode.
    ///
    /// ```
    /// use fucina_exec::{ExecContext, PadMode, PadOptions};
    ///
    /// let ctx = ExecContext::new();
    /// let x = ctx.from_slice(&[1, 3], &[1., 2., 3.])?;
    /// let r = ctx.pad(&x, PadOptions::new(&[2, 1], PadMode::Reflect)?)?;
    /// assert_eq!(r.to_vec(), [3., 2., 1., 2., 3., 2.]);
    /// let e = ctx.pad(&x, PadOptions::new(&[1, 2], PadMode::Replicate)?)?;
    /// assert_eq!(e.to_vec(), [1., 1., 2., 3., 3., 3.]);
    /// let c = ctx.pad(&x, PadOptions::new(&[0, 0, 1, 0], PadMode::Constant(9.))?)?;
    /// assert_eq!((c.shape(), c.to_vec()), (&[2, 3][..], vec![9., 9., 9., 1., 2., 3.]));
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidOption`] if `axes` is not 1 or 2, or a reflect pad
    /// is not smaller than its axis; [`ExecError::InvalidArgument`] if `axes`
    /// is 1 and `pads[2..]` is not zero; [`ExecError::InvalidShape`] if `x`
    /// has fewer than `axes` axes; [`ExecError::Overflow`] if the output's
    /// element count does not fit; [`ExecError::OutOfMemory`].
    pub fn pad(&self, x: &RawTensor, opts: PadOptions) -> Result<RawTensor, ExecError> {
        const OP: &str = "pad";
        let g = opts.geometry(OP, x.shape())?;
        let xc = self.contiguous(x)?;
        let xs = xc.contiguous_slice();
        let (h, w, oh, ow) = (g.h, g.w, g.oh, g.ow);
        let [left, _, top, _] = opts.pads;
        let fill = match opts.mode {
            PadMode::Constant(v) => v,
            _ => 0.0,
        };
        self.new_tensor(OP, g.out.as_slice(), |out| {
            let plane = oh * ow;
            self.par_rows(out, plane, plane, |planes, o| {
                for (p, op) in planes.zip(o.chunks_exact_mut(plane)) {
                    let xp = &xs[p * h * w..][..h * w];
                    for (oy, orow) in op.chunks_exact_mut(ow).enumerate() {
                        let Some(sy) = source(oy, h, top, opts.mode) else {
                            orow.fill(fill);
                            continue;
                        };
                        let xrow = &xp[sy * w..][..w];
                        orow[left..left + w].copy_from_slice(xrow);
                        for ox in (0..left).chain(left + w..ow) {
                            orow[ox] = source(ox, w, left, opts.mode).map_or(fill, |sx| xrow[sx]);
                        }
                    }
                }
            });
        })
    }

    /// The gradient of [`pad`](ExecContext::pad) with respect to its input
    /// of shape `x_shape`, from the output's gradient `grad`: each output
    /// gradient added into the input element it was read from (a constant
    /// border adds nothing), in row-major output order within each plane.
    ///
    /// # Errors
    /// As [`pad`](ExecContext::pad) for `x_shape` and the options;
    /// [`ExecError::ShapeMismatch`] if `grad` does not have the output's
    /// shape; [`ExecError::OutOfMemory`].
    pub fn pad_backward(
        &self,
        grad: &RawTensor,
        x_shape: &[usize],
        opts: PadOptions,
    ) -> Result<RawTensor, ExecError> {
        const OP: &str = "pad_backward";
        let g = opts.geometry(OP, x_shape)?;
        if grad.shape() != g.out.as_slice() {
            return Err(ExecError::ShapeMismatch {
                op: OP,
                lhs: g.out,
                rhs: grad.dims(),
                reason: "the gradient must have the padded output's shape",
            });
        }
        let gc = self.contiguous(grad)?;
        let gs = gc.contiguous_slice();
        let (h, w, oh, ow) = (g.h, g.w, g.oh, g.ow);
        let [left, _, top, _] = opts.pads;
        self.new_tensor(OP, x_shape, |out| {
            let plane = h * w;
            self.par_rows(out, plane, oh * ow, |planes, o| {
                for (p, ip) in planes.zip(o.chunks_exact_mut(plane)) {
                    ip.fill(0.0);
                    let gp = &gs[p * oh * ow..][..oh * ow];
                    for (oy, grow) in gp.chunks_exact(ow).enumerate() {
                        let Some(sy) = source(oy, h, top, opts.mode) else {
                            continue;
                        };
                        let irow = &mut ip[sy * w..][..w];
                        for (ox, &gv) in grow.iter().enumerate() {
                            if let Some(sx) = source(ox, w, left, opts.mode) {
                                irow[sx] += gv;
                            }
                        }
                    }
                }
            });
        })
    }
}
