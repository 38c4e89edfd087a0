//! `pad` over the last one, two or three axes (PyTorch's
//! `torch.nn.functional.pad` with `constant`, `reflect` and `replicate`
//! modes; negative widths crop) and its backward.
//!
//! The tensor is seen as volumes of its last three axes (`[outer, D, H, W]`;
//! a pad of fewer axes has `D = 1`, and `H = 1` for one axis, with no padding
//! there). Each output volume is written by one task from its input volume.
//! The backward adds each output gradient into the input position it was
//! read from, in row-major output order, one volume per task: the bits never
//! depend on the team size or the vector level, and a volume's result
//! depends on that volume alone.

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
/// pads the last axis, `[left, right, top, bottom]` the last two, `[left,
/// right, top, bottom, front, back]` the last three. A negative width crops
/// that many elements from its side (PyTorch's negative padding), in every
/// mode; the border of the other side is still filled from the whole axis.
///
/// ```
/// use fucina_exec::{PadMode, PadOptions};
///
/// let o = PadOptions::new(&[1, 2], PadMode::Reflect)?;
/// assert_eq!((o.pads, o.axes), ([1, 2, 0, 0, 0, 0], 1));
/// assert_eq!(PadOptions::new(&[0, 0, -1, 1, 2, 2], PadMode::Constant(0.))?.axes, 3);
/// assert!(PadOptions::new(&[1, 2, 3], PadMode::Replicate).is_err());
/// # Ok::<(), fucina_exec::ExecError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PadOptions {
    /// `[left, right, top, bottom, front, back]`: before and after the last
    /// axis, the one before it and the one before that (0 past `2 * axes`);
    /// negative widths crop.
    pub pads: [isize; 6],
    /// How many trailing axes are padded: 1, 2 or 3.
    pub axes: usize,
    /// How the border is filled.
    pub mode: PadMode,
}

const NAMES: [&str; 6] = [
    "pads[0]", "pads[1]", "pads[2]", "pads[3]", "pads[4]", "pads[5]",
];

impl PadOptions {
    /// The options for PyTorch's `pad` list: `[left, right]` (the last axis),
    /// `[left, right, top, bottom]` (the last two) or `[left, right, top,
    /// bottom, front, back]` (the last three).
    ///
    /// # Errors
    /// [`ExecError::InvalidArgument`] naming `pad` if `pads` has another
    /// length than 2, 4 or 6.
    pub fn new(pads: &[isize], mode: PadMode) -> Result<PadOptions, ExecError> {
        let axes = match pads.len() {
            2 => 1,
            4 => 2,
            6 => 3,
            _ => {
                return Err(ExecError::InvalidArgument {
                    op: "pad",
                    reason: "pads must hold 2 widths (the last axis), 4 (the last two axes) or 6 (the last three)",
                });
            }
        };
        let mut p = [0; 6];
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

    /// Checks `x` against the options; the volume sizes and the output shape.
    fn geometry(&self, op: &'static str, x: &[usize]) -> Result<Geometry, ExecError> {
        if !(1..=3).contains(&self.axes) {
            return Err(ExecError::InvalidOption {
                op,
                name: "axes",
                value: self.axes,
                reason: "must be 1, 2 or 3",
            });
        }
        if self.pads[2 * self.axes..].iter().any(|&p| p != 0) {
            return Err(ExecError::InvalidArgument {
                op,
                reason: "the pads past 2 * axes (pads[2..] for one axis, pads[4..] for two) must be 0",
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
        // The input and output sizes of the last three axes, W first.
        let mut sizes = [1usize; 3];
        let mut outs = [1usize; 3];
        for a in 0..self.axes {
            let n = x[r - 1 - a];
            let (before, after) = (self.pads[2 * a], self.pads[2 * a + 1]);
            sizes[a] = n;
            outs[a] = padded_size(op, self.mode, n, 2 * a, before, after, x)?;
        }
        let mut out = Dims::new(x);
        for (a, &o) in outs[..self.axes].iter().enumerate() {
            out.as_mut_slice()[r - 1 - a] = o;
        }
        check_shape(op, &out)?;
        Ok(Geometry {
            d: sizes[2],
            h: sizes[1],
            w: sizes[0],
            od: outs[2],
            oh: outs[1],
            ow: outs[0],
            out,
        })
    }
}

/// The size of an axis of `n` padded by `before` and `after` (`pads[i]` and
/// `pads[i + 1]`), or the error naming the pad that does not fit.
fn padded_size(
    op: &'static str,
    mode: PadMode,
    n: usize,
    i: usize,
    before: isize,
    after: isize,
    x: &[usize],
) -> Result<usize, ExecError> {
    for (k, p) in [(i, before), (i + 1, after)] {
        if mode == PadMode::Reflect && p >= 0 && p.unsigned_abs() >= n {
            return Err(ExecError::InvalidSignedOption {
                op,
                name: NAMES[k],
                value: p,
                reason: "reflect padding must be smaller than the padded axis",
            });
        }
        if p < 0 && p.unsigned_abs() > n {
            return Err(ExecError::InvalidSignedOption {
                op,
                name: NAMES[k],
                value: p,
                reason: "the crop is larger than the axis",
            });
        }
    }
    // `n` and each crop fit in `isize` (a crop is at most `n`, and `n` is an
    // axis of a tensor); a pad's growth is checked.
    let size = (n as isize)
        .checked_add(before)
        .and_then(|v| v.checked_add(after))
        .ok_or(ExecError::Overflow {
            op,
            shape: Dims::new(x),
        })?;
    if size <= 0 {
        let (k, p) = if before < 0 {
            (i, before)
        } else {
            (i + 1, after)
        };
        return Err(ExecError::InvalidSignedOption {
            op,
            name: NAMES[k],
            value: p,
            reason: "the crops leave the axis with no elements",
        });
    }
    Ok(size as usize)
}

/// The volume sizes of a pad and its output shape.
struct Geometry {
    d: usize,
    h: usize,
    w: usize,
    od: usize,
    oh: usize,
    ow: usize,
    out: Dims,
}

/// The input index that output index `o` of an axis of size `n` padded by
/// `before` (negative: cropped) reads, or `None` for a constant border.
#[inline(always)]
fn source(o: usize, n: usize, before: isize, mode: PadMode) -> Option<usize> {
    // `i` as a signed position in the input; `n`, `o` and the pads fit in
    // `isize` because the element counts do, and the checks of `padded_size`
    // keep a reflected index inside the axis.
    let i = o as isize - before;
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

/// The output positions `[lo, hi)` of an axis that read the input directly
/// (`o - before` inside `[0, n)`), clamped to the output's `[0, on)`.
fn interior(n: usize, on: usize, before: isize) -> (usize, usize) {
    let lo = before.clamp(0, on as isize) as usize;
    let hi = (before + n as isize).clamp(0, on as isize) as usize;
    (lo, hi.max(lo))
}

/// One output row from its input row `xrow`: the interior copied, the
/// border filled as `mode` says.
#[inline(always)]
fn fill_row(orow: &mut [f32], xrow: &[f32], left: isize, mode: PadMode, fill: f32) {
    let (w, ow) = (xrow.len(), orow.len());
    let (lo, hi) = interior(w, ow, left);
    if lo < hi {
        let s = (lo as isize - left) as usize;
        orow[lo..hi].copy_from_slice(&xrow[s..s + (hi - lo)]);
    }
    for ox in (0..lo).chain(hi..ow) {
        orow[ox] = source(ox, w, left, mode).map_or(fill, |sx| xrow[sx]);
    }
}

impl ExecContext {
    /// `x` padded on its last `opts.axes` axes (1, 2 or 3) by `opts.pads`
    /// (`[left, right, top, bottom, front, back]`; negative widths crop),
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
    /// // A negative width crops.
    /// let k = ctx.pad(&x, PadOptions::new(&[-1, 1], PadMode::Constant(0.))?)?;
    /// assert_eq!(k.to_vec(), [2., 3., 0.]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidOption`] if `axes` is not 1, 2 or 3;
    /// [`ExecError::InvalidSignedOption`] naming the pad and its value for a
    /// reflect pad not smaller than its axis, a crop larger than its axis or
    /// crops that leave an axis empty; [`ExecError::InvalidArgument`] if a
    /// pad past `2 * axes` is not zero; [`ExecError::InvalidShape`] if `x`
    /// has fewer than `axes` axes; [`ExecError::Overflow`] if the output's
    /// element count does not fit; [`ExecError::OutOfMemory`].
    pub fn pad(&self, x: &RawTensor, opts: PadOptions) -> Result<RawTensor, ExecError> {
        const OP: &str = "pad";
        let g = opts.geometry(OP, x.shape())?;
        let xc = self.contiguous(x)?;
        let xs = xc.contiguous_slice();
        let (d, h, w, od, oh, ow) = (g.d, g.h, g.w, g.od, g.oh, g.ow);
        let [left, _, top, _, front, _] = opts.pads;
        let fill = match opts.mode {
            PadMode::Constant(v) => v,
            _ => 0.0,
        };
        self.new_tensor(OP, g.out.as_slice(), |out| {
            let vol = od * oh * ow;
            self.par_rows(out, vol, vol, |vols, o| {
                for (p, ov) in vols.zip(o.chunks_exact_mut(vol)) {
                    let xv = &xs[p * d * h * w..][..d * h * w];
                    for (oz, oplane) in ov.chunks_exact_mut(oh * ow).enumerate() {
                        let Some(sz) = source(oz, d, front, opts.mode) else {
                            oplane.fill(fill);
                            continue;
                        };
                        let xp = &xv[sz * h * w..][..h * w];
                        for (oy, orow) in oplane.chunks_exact_mut(ow).enumerate() {
                            match source(oy, h, top, opts.mode) {
                                Some(sy) => {
                                    fill_row(orow, &xp[sy * w..][..w], left, opts.mode, fill)
                                }
                                None => orow.fill(fill),
                            }
                        }
                    }
                }
            });
        })
    }

    /// The gradient of [`pad`](ExecContext::pad) with respect to its input
    /// of shape `x_shape`, from the output's gradient `grad`: each output
    /// gradient added into the input element it was read from (a constant
    /// border adds nothing), in row-major output order within each volume.
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
        let (d, h, w, od, oh, ow) = (g.d, g.h, g.w, g.od, g.oh, g.ow);
        let [left, _, top, _, front, _] = opts.pads;
        self.new_tensor(OP, x_shape, |out| {
            let vol = d * h * w;
            self.par_rows(out, vol, od * oh * ow, |vols, o| {
                for (p, iv) in vols.zip(o.chunks_exact_mut(vol)) {
                    iv.fill(0.0);
                    let gv = &gs[p * od * oh * ow..][..od * oh * ow];
                    for (oz, gplane) in gv.chunks_exact(oh * ow).enumerate() {
                        let Some(sz) = source(oz, d, front, opts.mode) else {
                            continue;
                        };
                        let ip = &mut iv[sz * h * w..][..h * w];
                        for (oy, grow) in gplane.chunks_exact(ow).enumerate() {
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
                }
            });
        })
    }
}
