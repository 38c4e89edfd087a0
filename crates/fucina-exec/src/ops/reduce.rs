//! Reductions: along one axis (`sum`, `mean`, `max`, `min`, `argmax`, `argmin`,
//! `variance`, `logsumexp`, with `keepdim`), over everything (`sum_all`,
//! `mean_all`), `sum_to` (the broadcast-gradient reduction), and the backward
//! helpers autograd calls for them.
//!
//! # Order and determinism
//! Every sum uses a fixed grouping that depends only on the reduced length (blocked
//! and pairwise along the last axis, blocked by rows along other axes; see the
//! kernel docs), so results are bitwise identical for every team size, and a row's
//! result never depends on the other rows of the batch.
//!
//! # Shapes
//! An axis reduction removes `axis` from the shape, or keeps it as size 1 with
//! `keepdim`. Tensors have rank 1 to 8, so reducing a rank-1 tensor without
//! `keepdim` gives shape `[1]`.

use std::ops::Range;

use crate::axis::Axis;
use crate::context::ExecContext;
use crate::error::ExecError;
use crate::kernels::reduce;
use crate::kernels::rowwise;
use crate::kernels::simd::vectorized;
use crate::tensor::RawTensor;
use crate::tensor::element::Element;
use crate::tensor::layout::{Dims, MAX_RANK, check_axis, check_shape};

/// `(outer, n, inner)`: the products of the dims before `axis`, of `axis`, and after.
pub(crate) fn axis_split(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product();
    (outer, shape[axis], inner)
}

/// The shape of a reduction of `shape` along `axis` (see the module docs).
pub(crate) fn reduced_shape(shape: &[usize], axis: usize, keepdim: bool) -> Dims {
    let mut d = Dims::default();
    for (i, &s) in shape.iter().enumerate() {
        if i != axis {
            d.push(s);
        } else if keepdim {
            d.push(1);
        }
    }
    if d.is_empty() {
        d.push(1);
    }
    d
}

/// The output shape of a reduction of `input` along `axis`: the axis checked
/// (errors name `op`), then [`reduced_shape`].
fn axis_reduced_shape(
    op: &'static str,
    input: &[usize],
    axis: impl Axis,
    keepdim: bool,
) -> Result<Dims, ExecError> {
    let axis = check_axis(op, axis, input.len())?;
    Ok(reduced_shape(input, axis, keepdim))
}

/// Checks that `g` (a gradient of a reduction's output) has the reduction's
/// output shape `want` (from the op descriptor's `out_shape`).
pub(crate) fn check_reduced_grad(
    op: &'static str,
    g: &[usize],
    want: &[usize],
) -> Result<(), ExecError> {
    if g != want {
        return Err(ExecError::ShapeMismatch {
            op,
            lhs: Dims::new(g),
            rhs: Dims::new(want),
            reason: "the output gradient must have the reduction's output shape",
        });
    }
    Ok(())
}

impl ExecContext {
    /// Reduces each row along `axis` with `f` (rows gathered contiguously first)
    /// into a tensor of `out_shape` (the op's output shape, which the caller
    /// obtains from its descriptor, so the axis is already checked).
    fn row_reduce<T: Element>(
        &self,
        op: &'static str,
        x: &RawTensor,
        axis: impl Axis,
        out_shape: Dims,
        work: usize,
        f: impl Fn(&[f32]) -> T + Sync,
    ) -> Result<RawTensor<T>, ExecError> {
        let axis = check_axis(op, axis, x.rank())?;
        let n = x.shape()[axis];
        let src = self.contiguous_axis_last(x, axis)?;
        let xs = src.contiguous_slice();
        self.new_tensor(op, &out_shape, |out: &mut [T]| {
            self.par_rows(out, 1, n * work, |rows, o| {
                for (r, v) in rows.zip(o.iter_mut()) {
                    *v = f(&xs[r * n..][..n]);
                }
            });
        })
    }

    /// Sums along `axis` of the contiguous `xs` (shape split `outer, n, inner`) into
    /// `out` (`outer * inner` elements), then applies `finish` to each result.
    pub(crate) fn axis_sum_into(
        &self,
        xs: &[f32],
        (outer, n, inner): (usize, usize, usize),
        out: &mut [f32],
        finish: impl Fn(f32) -> f32 + Sync,
    ) {
        debug_assert_eq!(out.len(), outer * inner);
        self.par_rows(out, 1, n, |range, o| {
            if inner == 1 {
                for (r, v) in range.zip(o.iter_mut()) {
                    *v = finish(vectorized!(reduce::sum(&xs[r * n..][..n])));
                }
            } else {
                vectorized!(reduce::for_each_col_tile(
                    range,
                    inner,
                    o,
                    |row, i0, tile| {
                        reduce::col_sum(&xs[row * n * inner..][..n * inner], inner, i0, tile);
                        for v in tile.iter_mut() {
                            *v = finish(*v);
                        }
                    }
                ))
            }
        });
    }

    /// A full fixed-order sum of `len` elements where `chunk_sum(range)` sums the
    /// elements `range` (at most `SUPER` of them) with the kernels' block order:
    /// super-chunks in parallel, combined pairwise (bitwise the serial sum).
    pub(crate) fn full_sum(
        &self,
        op: &'static str,
        len: usize,
        chunk_sum: impl Fn(Range<usize>) -> f32 + Sync,
    ) -> Result<f32, ExecError> {
        if len <= reduce::SUPER {
            return Ok(chunk_sum(0..len));
        }
        let chunks = len.div_ceil(reduce::SUPER);
        let partials = self.new_tensor(op, &[chunks], |p: &mut [f32]| {
            self.par_rows(p, 1, reduce::SUPER, |range, o| {
                for (c, v) in range.zip(o.iter_mut()) {
                    *v = chunk_sum(c * reduce::SUPER..((c + 1) * reduce::SUPER).min(len));
                }
            });
        })?;
        Ok(reduce::pairwise(partials.contiguous_slice()))
    }

    /// The sum along `axis` (of the shape `op.out_shape` gives), each result
    /// passed through `finish(sum, n)` (`n` the axis length, as `f32`).
    fn sum_impl(
        &self,
        op: AxisReduction,
        x: &RawTensor,
        axis: impl Axis,
        keepdim: bool,
        finish: impl Fn(f32, f32) -> f32 + Sync,
    ) -> Result<RawTensor, ExecError> {
        let out_shape = op.out_shape(x.shape(), axis, keepdim)?;
        let op = op.name();
        let axis = check_axis(op, axis, x.rank())?;
        let split = axis_split(x.shape(), axis);
        let n = split.1 as f32;
        let src = self.contiguous(x)?;
        let xs = src.contiguous_slice();
        self.new_tensor(op, &out_shape, |out| {
            self.axis_sum_into(xs, split, out, |v| finish(v, n))
        })
    }

    /// The sum along `axis` (removed, or kept as size 1 with `keepdim`).
    ///
    /// Along the last axis each row is summed in blocks of 1024 elements (64
    /// interleaved accumulators each) combined pairwise; along another axis each
    /// column is summed sequentially within blocks of 256 rows and the blocks are
    /// added in order. Both orders depend only on the reduced length.
    ///
    /// ```
    /// use fucina_exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = ctx.from_slice(&[2, 3], &[1., 2., 3., 4., 5., 6.])?;
    /// assert_eq!(ctx.sum(&x, 1, false)?.to_vec(), [6., 15.]);
    /// let s = ctx.sum(&x, 0, true)?;
    /// assert_eq!((s.shape(), s.to_vec()), (&[1, 3][..], vec![5., 7., 9.]));
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`] if `axis` is outside `-rank..rank` (negative axes
    /// count from the end, see [`Axis`]); [`ExecError::OutOfMemory`].
    pub fn sum(
        &self,
        x: &RawTensor,
        axis: impl Axis,
        keepdim: bool,
    ) -> Result<RawTensor, ExecError> {
        self.sum_impl(AxisReduction::Sum, x, axis, keepdim, |v, _| v)
    }

    /// The mean along `axis`: the [`sum`](ExecContext::sum) divided by the axis
    /// length.
    ///
    /// # Errors
    /// As [`sum`](ExecContext::sum).
    pub fn mean(
        &self,
        x: &RawTensor,
        axis: impl Axis,
        keepdim: bool,
    ) -> Result<RawTensor, ExecError> {
        self.sum_impl(AxisReduction::Mean, x, axis, keepdim, |v, n| v / n)
    }

    /// The largest element along `axis`; NaN where the reduced elements hold a NaN
    /// (PyTorch's NaN propagation).
    ///
    /// # Errors
    /// As [`sum`](ExecContext::sum).
    pub fn max(
        &self,
        x: &RawTensor,
        axis: impl Axis,
        keepdim: bool,
    ) -> Result<RawTensor, ExecError> {
        let out_shape = AxisReduction::Max.out_shape(x.shape(), axis, keepdim)?;
        self.row_reduce("max", x, axis, out_shape, 1, |r| {
            vectorized!(reduce::max(r))
        })
    }

    /// The smallest element along `axis`; NaN where the reduced elements hold a NaN.
    ///
    /// # Errors
    /// As [`sum`](ExecContext::sum).
    pub fn min(
        &self,
        x: &RawTensor,
        axis: impl Axis,
        keepdim: bool,
    ) -> Result<RawTensor, ExecError> {
        let out_shape = AxisReduction::Min.out_shape(x.shape(), axis, keepdim)?;
        self.row_reduce("min", x, axis, out_shape, 1, |r| {
            vectorized!(reduce::min(r))
        })
    }

    /// The index along `axis` of the largest element: the first one on ties, and
    /// the first NaN where there is one (NaN counts as the largest value, as in
    /// PyTorch).
    ///
    /// ```
    /// use fucina_exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = ctx.from_slice(&[2, 3], &[1., 7., 7., 4., 0., 9.])?;
    /// assert_eq!(ctx.argmax(&x, 1, false)?.to_vec(), [1, 2]);
    /// assert_eq!(ctx.argmin(&x, 0, false)?.to_vec(), [0, 1, 0]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// As [`sum`](ExecContext::sum).
    pub fn argmax(
        &self,
        x: &RawTensor,
        axis: impl Axis,
        keepdim: bool,
    ) -> Result<RawTensor<i64>, ExecError> {
        let out_shape = axis_reduced_shape("argmax", x.shape(), axis, keepdim)?;
        self.row_reduce("argmax", x, axis, out_shape, 1, |r| {
            reduce::argmax(r) as i64
        })
    }

    /// The index along `axis` of the smallest element (first on ties, first NaN
    /// where there is one).
    ///
    /// # Errors
    /// As [`sum`](ExecContext::sum).
    pub fn argmin(
        &self,
        x: &RawTensor,
        axis: impl Axis,
        keepdim: bool,
    ) -> Result<RawTensor<i64>, ExecError> {
        let out_shape = axis_reduced_shape("argmin", x.shape(), axis, keepdim)?;
        self.row_reduce("argmin", x, axis, out_shape, 1, |r| {
            reduce::argmin(r) as i64
        })
    }

    /// The variance along `axis`, two-pass: `sum((x - mean)^2) / (n - c)` with
    /// `c = 1` when `unbiased` (Bessel's correction, PyTorch's default for
    /// `torch.var`) and `c = 0` otherwise (the biased variance). An unbiased
    /// variance over a length-1 axis divides by zero: NaN, as in PyTorch.
    ///
    /// # Errors
    /// As [`sum`](ExecContext::sum).
    pub fn variance(
        &self,
        x: &RawTensor,
        axis: impl Axis,
        keepdim: bool,
        unbiased: bool,
    ) -> Result<RawTensor, ExecError> {
        let c = usize::from(unbiased);
        let out_shape = AxisStatistic::Variance { unbiased }.out_shape(x.shape(), axis, keepdim)?;
        self.row_reduce("variance", x, axis, out_shape, 3, |r| {
            vectorized!(rowwise::variance(r, c))
        })
    }

    /// `log(sum(exp(x)))` along `axis`, stable: the max along the axis is subtracted
    /// before `exp` and added back (`+inf` where the axis holds `+inf`, `-inf` where
    /// it is all `-inf`, NaN where it holds a NaN).
    ///
    /// # Errors
    /// As [`sum`](ExecContext::sum).
    pub fn logsumexp(
        &self,
        x: &RawTensor,
        axis: impl Axis,
        keepdim: bool,
    ) -> Result<RawTensor, ExecError> {
        let out_shape = AxisStatistic::LogSumExp.out_shape(x.shape(), axis, keepdim)?;
        self.row_reduce("logsumexp", x, axis, out_shape, 8, |r| {
            vectorized!(rowwise::logsumexp(r))
        })
    }

    /// The sum of every element, shape `[1]`. Super-chunks of 65536 elements are
    /// summed in parallel and combined pairwise: the bits equal the serial sum for
    /// every team size.
    ///
    /// # Errors
    /// [`ExecError::OutOfMemory`].
    pub fn sum_all(&self, x: &RawTensor) -> Result<RawTensor, ExecError> {
        let s = self.sum_all_value("sum_all", x)?;
        let out_shape = FullReduction::Sum.out_shape(x.shape());
        self.new_tensor("sum_all", &out_shape, |o| o[0] = s)
    }

    /// The mean of every element (the [`sum_all`](ExecContext::sum_all) divided by
    /// the element count), shape `[1]`.
    ///
    /// # Errors
    /// [`ExecError::OutOfMemory`].
    pub fn mean_all(&self, x: &RawTensor) -> Result<RawTensor, ExecError> {
        let s = self.sum_all_value("mean_all", x)? / x.numel() as f32;
        let out_shape = FullReduction::Mean.out_shape(x.shape());
        self.new_tensor("mean_all", &out_shape, |o| o[0] = s)
    }

    fn sum_all_value(&self, op: &'static str, x: &RawTensor) -> Result<f32, ExecError> {
        let src = self.contiguous(x)?;
        let xs = src.contiguous_slice();
        self.full_sum(op, xs.len(), |r| vectorized!(reduce::sum(&xs[r.clone()])))
    }

    /// Sums `x` down to `shape`, the shape of an operand that was broadcast to
    /// `x`'s shape: axes that `shape` lacks (on the left, right-aligned) are summed
    /// away, and axes where `shape` has 1 and `x` does not are summed with keepdim.
    /// This is the gradient of a broadcast. When `shape` equals `x`'s shape the
    /// result is a copy.
    ///
    /// ```
    /// use fucina_exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let g = ctx.from_slice(&[2, 3], &[1., 2., 3., 4., 5., 6.])?;
    /// assert_eq!(ctx.sum_to(&g, &[3])?.to_vec(), [5., 7., 9.]);
    /// assert_eq!(ctx.sum_to(&g, &[2, 1])?.to_vec(), [6., 15.]);
    /// assert!(ctx.sum_to(&g, &[2]).is_err()); // [2] does not broadcast to [2, 3]
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// The shape errors of the constructors for `shape`; [`ExecError::ShapeMismatch`]
    /// if `shape` does not broadcast to `x`'s shape; [`ExecError::OutOfMemory`].
    pub fn sum_to(&self, x: &RawTensor, shape: &[usize]) -> Result<RawTensor, ExecError> {
        const OP: &str = "sum_to";
        check_shape(OP, shape)?;
        let xs = x.shape();
        let rank = xs.len();
        let mismatch = || ExecError::ShapeMismatch {
            op: OP,
            lhs: Dims::new(shape),
            rhs: x.dims(),
            reason: "the target shape does not broadcast to the tensor's shape",
        };
        if shape.len() > rank {
            return Err(mismatch());
        }
        let lead = rank - shape.len();
        // reduced[i]: axis i of x is summed away.
        let mut reduced = [false; MAX_RANK];
        for i in 0..rank {
            let t = if i < lead { 1 } else { shape[i - lead] };
            if t != xs[i] && t != 1 {
                return Err(mismatch());
            }
            reduced[i] = t == 1 && xs[i] != 1;
        }
        // Drop size-1 axes of x (they are neither kept nor reduced in any way that
        // matters), then look for a single run of reduced axes.
        let mut axes = Dims::default();
        for i in (0..rank).filter(|&i| xs[i] != 1) {
            axes.push(i);
        }
        let first = axes.iter().position(|&i| reduced[i]);
        let last = axes.iter().rposition(|&i| reduced[i]);
        let src = self.contiguous(x)?;
        let data = src.contiguous_slice();
        match (first, last) {
            (None, _) | (_, None) => self.new_tensor(OP, shape, |out| out.copy_from_slice(data)),
            (Some(f), Some(l)) if axes[f..=l].iter().all(|&i| reduced[i]) => {
                let prod = |s: &[usize]| s.iter().map(|&i| xs[i]).product::<usize>();
                let split = (prod(&axes[..f]), prod(&axes[f..=l]), prod(&axes[l + 1..]));
                self.new_tensor(OP, shape, |out| self.axis_sum_into(data, split, out, |v| v))
            }
            _ => {
                // Several separate runs: gather kept axes first, reduced axes last.
                let mut order = Dims::default();
                for i in (0..rank).filter(|&i| !reduced[i]) {
                    order.push(i);
                }
                for i in (0..rank).filter(|&i| reduced[i]) {
                    order.push(i);
                }
                let n: usize = (0..rank).filter(|&i| reduced[i]).map(|i| xs[i]).product();
                let moved = self.materialize(&src.permute(&order)?)?;
                let ms = moved.contiguous_slice();
                let outer = ms.len() / n;
                self.new_tensor(OP, shape, |out| {
                    self.axis_sum_into(ms, (outer, n, 1), out, |v| v)
                })
            }
        }
    }

    /// The gradient of [`sum`](ExecContext::sum) with respect to its input: `grad_y`
    /// (the reduced shape, with or without `keepdim`) broadcast along `axis` to
    /// `input_shape`, as a contiguous tensor.
    ///
    /// # Errors
    /// The shape errors of the constructors for `input_shape`;
    /// [`ExecError::InvalidAxis`]; [`ExecError::ShapeMismatch`] if `grad_y` does not
    /// have the reduced shape; [`ExecError::OutOfMemory`].
    pub fn sum_backward(
        &self,
        grad_y: &RawTensor,
        axis: impl Axis,
        keepdim: bool,
        input_shape: &[usize],
    ) -> Result<RawTensor, ExecError> {
        self.broadcast_grad(AxisReduction::Sum, grad_y, axis, keepdim, input_shape)
    }

    /// The gradient of [`mean`](ExecContext::mean): `grad_y / n` broadcast along
    /// `axis` to `input_shape` (`n` the axis length).
    ///
    /// # Errors
    /// As [`sum_backward`](ExecContext::sum_backward).
    pub fn mean_backward(
        &self,
        grad_y: &RawTensor,
        axis: impl Axis,
        keepdim: bool,
        input_shape: &[usize],
    ) -> Result<RawTensor, ExecError> {
        self.broadcast_grad(AxisReduction::Mean, grad_y, axis, keepdim, input_shape)
    }

    /// `grad_y` broadcast along `axis` to `input_shape`, divided by the axis
    /// length for [`AxisReduction::Mean`] (the backward of `mean`), else copied
    /// (of `sum`).
    fn broadcast_grad(
        &self,
        reduction: AxisReduction,
        grad_y: &RawTensor,
        axis: impl Axis,
        keepdim: bool,
        input_shape: &[usize],
    ) -> Result<RawTensor, ExecError> {
        let op = reduction.backward_name();
        check_shape(op, input_shape)?;
        let axis = check_axis(op, axis, input_shape.len())?;
        let want = reduction.out_shape(input_shape, axis, keepdim)?;
        check_reduced_grad(op, grad_y.shape(), &want)?;
        let mean = reduction == AxisReduction::Mean;
        let (_, n, inner) = axis_split(input_shape, axis);
        // `check_shape` refuses zero dimensions, so `n >= 1`.
        let divide_by = mean.then_some(n as f32);
        let g = self.contiguous(grad_y)?;
        let gs = g.contiguous_slice();
        self.new_tensor(op, input_shape, |out| {
            self.par_rows(out, n * inner, n * inner, |rows, o| {
                vectorized!(for (r, slab) in rows.zip(o.chunks_exact_mut(n * inner)) {
                    let gr = &gs[r * inner..][..inner];
                    for row in slab.chunks_exact_mut(inner) {
                        match divide_by {
                            None => row.copy_from_slice(gr),
                            Some(d) => {
                                for (v, &gv) in row.iter_mut().zip(gr) {
                                    *v = gv / d;
                                }
                            }
                        }
                    }
                })
            });
        })
    }

    /// The gradient of [`max`](ExecContext::max) along `axis`: `grad_y` routed to the
    /// position [`argmax`](ExecContext::argmax) picks (the first maximum, or the
    /// first NaN), zero elsewhere, as PyTorch's `max(dim)` does.
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`]; [`ExecError::ShapeMismatch`] if `grad_y` does not
    /// have the reduced shape of `x`; [`ExecError::OutOfMemory`].
    pub fn max_backward(
        &self,
        x: &RawTensor,
        grad_y: &RawTensor,
        axis: impl Axis,
        keepdim: bool,
    ) -> Result<RawTensor, ExecError> {
        self.arg_grad(AxisReduction::Max, x, grad_y, axis, keepdim)
    }

    /// The gradient of [`min`](ExecContext::min) along `axis`: `grad_y` routed to the
    /// position [`argmin`](ExecContext::argmin) picks, zero elsewhere.
    ///
    /// # Errors
    /// As [`max_backward`](ExecContext::max_backward).
    pub fn min_backward(
        &self,
        x: &RawTensor,
        grad_y: &RawTensor,
        axis: impl Axis,
        keepdim: bool,
    ) -> Result<RawTensor, ExecError> {
        self.arg_grad(AxisReduction::Min, x, grad_y, axis, keepdim)
    }

    /// The backward of `reduction` (`max` or `min`): `grad_y` routed to the
    /// position its arg-kernel picks.
    fn arg_grad(
        &self,
        reduction: AxisReduction,
        x: &RawTensor,
        grad_y: &RawTensor,
        axis: impl Axis,
        keepdim: bool,
    ) -> Result<RawTensor, ExecError> {
        let op = reduction.backward_name();
        let axis = check_axis(op, axis, x.rank())?;
        let want = reduction.out_shape(x.shape(), axis, keepdim)?;
        check_reduced_grad(op, grad_y.shape(), &want)?;
        let idx = if reduction == AxisReduction::Max {
            self.argmax(x, axis, keepdim)?
        } else {
            self.argmin(x, axis, keepdim)?
        };
        let (_, n, inner) = axis_split(x.shape(), axis);
        let g = self.contiguous(grad_y)?;
        let gs = g.contiguous_slice();
        let is = idx.contiguous_slice();
        self.new_tensor(op, x.shape(), |out| {
            self.par_rows(out, n * inner, n * inner, |rows, o| {
                for (r, slab) in rows.zip(o.chunks_exact_mut(n * inner)) {
                    slab.fill(0.0);
                    let gr = &gs[r * inner..][..inner];
                    let ir = &is[r * inner..][..inner];
                    for (i, (&gv, &at)) in gr.iter().zip(ir).enumerate() {
                        slab[at as usize * inner + i] = gv;
                    }
                }
            });
        })
    }

    /// The gradient of [`variance`](ExecContext::variance) along `axis`:
    /// `grad_x = grad_y * 2 * (x - mean) / (n - c)` (`c = 1` when `unbiased`), with
    /// `mean` the mean along the axis and `grad_y` broadcast along it.
    ///
    /// # Errors
    /// As [`max_backward`](ExecContext::max_backward).
    pub fn variance_backward(
        &self,
        x: &RawTensor,
        grad_y: &RawTensor,
        axis: impl Axis,
        keepdim: bool,
        unbiased: bool,
    ) -> Result<RawTensor, ExecError> {
        const OP: &str = "variance_backward";
        let axis = check_axis(OP, axis, x.rank())?;
        let want = AxisStatistic::Variance { unbiased }.out_shape(x.shape(), axis, keepdim)?;
        check_reduced_grad(OP, grad_y.shape(), &want)?;
        let mean = self.mean(x, axis, keepdim)?;
        let d = x.shape()[axis].saturating_sub(usize::from(unbiased)) as f32;
        self.map_axis_bcast(OP, x, &mean, grad_y, axis, move |v, m, g| {
            g * (2.0 * (v - m) / d)
        })
    }

    /// The gradient of [`logsumexp`](ExecContext::logsumexp) along `axis`, given its
    /// output `y`: `grad_x = grad_y * exp(x - y)` (the softmax of `x` along the axis
    /// times the broadcast `grad_y`).
    ///
    /// # Errors
    /// As [`max_backward`](ExecContext::max_backward), for `y` as well as `grad_y`.
    pub fn logsumexp_backward(
        &self,
        x: &RawTensor,
        y: &RawTensor,
        grad_y: &RawTensor,
        axis: impl Axis,
        keepdim: bool,
    ) -> Result<RawTensor, ExecError> {
        const OP: &str = "logsumexp_backward";
        let axis = check_axis(OP, axis, x.rank())?;
        let want = AxisStatistic::LogSumExp.out_shape(x.shape(), axis, keepdim)?;
        check_reduced_grad(OP, y.shape(), &want)?;
        check_reduced_grad(OP, grad_y.shape(), &want)?;
        self.map_axis_bcast(OP, x, y, grad_y, axis, |v, l, g| {
            g * crate::kernels::math::exp(v - l)
        })
    }

    /// `out[o, k, i] = f(x[o, k, i], a[o, i], b[o, i])`: `a` and `b` (reduced
    /// shapes, checked by the caller) broadcast along `axis`.
    pub(crate) fn map_axis_bcast(
        &self,
        op: &'static str,
        x: &RawTensor,
        a: &RawTensor,
        b: &RawTensor,
        axis: usize,
        f: impl Fn(f32, f32, f32) -> f32 + Sync,
    ) -> Result<RawTensor, ExecError> {
        let (_, n, inner) = axis_split(x.shape(), axis);
        let (xc, ac, bc) = (
            self.contiguous(x)?,
            self.contiguous(a)?,
            self.contiguous(b)?,
        );
        let (xs, as_, bs) = (
            xc.contiguous_slice(),
            ac.contiguous_slice(),
            bc.contiguous_slice(),
        );
        let slab = n * inner;
        self.new_tensor(op, x.shape(), |out| {
            self.par_rows(out, slab, slab * 2, |rows, o| {
                vectorized!(for (r, os) in rows.zip(o.chunks_exact_mut(slab)) {
                    let xr = &xs[r * slab..][..slab];
                    let ar = &as_[r * inner..][..inner];
                    let br = &bs[r * inner..][..inner];
                    for (orow, xrow) in os.chunks_exact_mut(inner).zip(xr.chunks_exact(inner)) {
                        for (((v, &xv), &av), &bv) in orow.iter_mut().zip(xrow).zip(ar).zip(br) {
                            *v = f(xv, av, bv);
                        }
                    }
                })
            });
        })
    }
}

/// The descriptor of the reductions along one axis that have a gradient kernel
/// of their own (`sum`, `mean`, `max`, `min`): one variant per op, naming its
/// forward kernel ([`ExecContext::reduce`]) and its backward kernel
/// ([`ExecContext::reduce_backward`]). The named methods (`ctx.sum(&x, 1,
/// false)`) run the same kernels; the autograd layer records one variant per
/// node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AxisReduction {
    /// The sum ([`ExecContext::sum`]).
    Sum,
    /// The mean ([`ExecContext::mean`]).
    Mean,
    /// The maximum ([`ExecContext::max`]).
    Max,
    /// The minimum ([`ExecContext::min`]).
    Min,
}

impl AxisReduction {
    /// Every axis reduction, in declaration order.
    pub const ALL: &'static [AxisReduction] = &[
        AxisReduction::Sum,
        AxisReduction::Mean,
        AxisReduction::Max,
        AxisReduction::Min,
    ];

    /// The op's name (the name of its `ExecContext` method).
    pub fn name(self) -> &'static str {
        match self {
            AxisReduction::Sum => "sum",
            AxisReduction::Mean => "mean",
            AxisReduction::Max => "max",
            AxisReduction::Min => "min",
        }
    }

    /// The name of the op's backward kernel.
    pub fn backward_name(self) -> &'static str {
        match self {
            AxisReduction::Sum => "sum_backward",
            AxisReduction::Mean => "mean_backward",
            AxisReduction::Max => "max_backward",
            AxisReduction::Min => "min_backward",
        }
    }

    /// Whether the op selects elements of its input, so that its backward reads
    /// the input again (`max`, `min`); `sum` and `mean` need only the input's
    /// shape.
    pub fn keeps_input(self) -> bool {
        matches!(self, AxisReduction::Max | AxisReduction::Min)
    }

    /// The op's output shape for an input of shape `input` reduced along
    /// `axis`: the axis removed, or kept as size 1 with `keepdim` (`[1]` when
    /// nothing is left, as tensors have rank 1 to 8). The forward kernels take
    /// their output shape from here.
    ///
    /// ```
    /// use fucina_exec::AxisReduction;
    ///
    /// assert_eq!(AxisReduction::Sum.out_shape(&[2, 3, 4], -1, false)?.as_slice(), [2, 3]);
    /// assert_eq!(AxisReduction::Max.out_shape(&[2, 3], 0, true)?.as_slice(), [1, 3]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`] naming the op if `axis` is outside
    /// `-rank..rank`.
    pub fn out_shape(
        self,
        input: &[usize],
        axis: impl Axis,
        keepdim: bool,
    ) -> Result<Dims, ExecError> {
        axis_reduced_shape(self.name(), input, axis, keepdim)
    }
}

impl ExecContext {
    /// Runs the forward kernel of the axis reduction `op` (the same kernel, and
    /// the same bits, as the op's named method).
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`]; [`ExecError::OutOfMemory`].
    pub fn reduce(
        &self,
        op: AxisReduction,
        x: &RawTensor,
        axis: impl Axis,
        keepdim: bool,
    ) -> Result<RawTensor, ExecError> {
        match op {
            AxisReduction::Sum => self.sum(x, axis, keepdim),
            AxisReduction::Mean => self.mean(x, axis, keepdim),
            AxisReduction::Max => self.max(x, axis, keepdim),
            AxisReduction::Min => self.min(x, axis, keepdim),
        }
    }

    /// Runs the backward kernel of the axis reduction `op`: the input's gradient
    /// from the output's gradient `grad_y`. `x` is the forward input, read only
    /// by ops whose [`keeps_input`](AxisReduction::keeps_input) is true (`sum`
    /// and `mean` take the shape from `input_shape` instead; the others take
    /// it from `x`).
    ///
    /// # Errors
    /// [`ExecError::InvalidArgument`] if `op` reads its input and `x` is `None`;
    /// as the named backward kernel otherwise.
    pub fn reduce_backward(
        &self,
        op: AxisReduction,
        x: Option<&RawTensor>,
        input_shape: &[usize],
        grad_y: &RawTensor,
        axis: impl Axis,
        keepdim: bool,
    ) -> Result<RawTensor, ExecError> {
        let input = || {
            x.ok_or(ExecError::InvalidArgument {
                op: "reduce_backward",
                reason: "this reduction's backward reads the forward input; pass it",
            })
        };
        match op {
            AxisReduction::Sum => self.sum_backward(grad_y, axis, keepdim, input_shape),
            AxisReduction::Mean => self.mean_backward(grad_y, axis, keepdim, input_shape),
            AxisReduction::Max => self.max_backward(input()?, grad_y, axis, keepdim),
            AxisReduction::Min => self.min_backward(input()?, grad_y, axis, keepdim),
        }
    }
}

/// The descriptor of the statistics along one axis (`variance`, `logsumexp`):
/// reductions whose backward reads the input again, and for `logsumexp` the
/// output too. One variant per op, holding its parameters and naming its
/// forward kernel ([`ExecContext::statistic`]) and its backward kernel
/// ([`ExecContext::statistic_backward`]). The named methods run the same
/// kernels; the autograd layer records one variant per node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AxisStatistic {
    /// The variance ([`ExecContext::variance`]).
    Variance {
        /// Divide by `n - 1` (Bessel's correction) instead of `n`.
        unbiased: bool,
    },
    /// `log(sum(exp(x)))` ([`ExecContext::logsumexp`]).
    LogSumExp,
}

impl AxisStatistic {
    /// The op's name (the name of its `ExecContext` method).
    pub fn name(self) -> &'static str {
        match self {
            AxisStatistic::Variance { .. } => "variance",
            AxisStatistic::LogSumExp => "logsumexp",
        }
    }

    /// The name of the op's backward kernel.
    pub fn backward_name(self) -> &'static str {
        match self {
            AxisStatistic::Variance { .. } => "variance_backward",
            AxisStatistic::LogSumExp => "logsumexp_backward",
        }
    }

    /// Whether the op's backward reads the forward output (`logsumexp`); a
    /// caller may drop it otherwise and pass `None` to
    /// [`ExecContext::statistic_backward`].
    pub fn keeps_output(self) -> bool {
        matches!(self, AxisStatistic::LogSumExp)
    }

    /// The op's output shape for an input of shape `input` reduced along
    /// `axis`, as [`AxisReduction::out_shape`]. The forward kernels take their
    /// output shape from here.
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`] naming the op if `axis` is outside
    /// `-rank..rank`.
    pub fn out_shape(
        self,
        input: &[usize],
        axis: impl Axis,
        keepdim: bool,
    ) -> Result<Dims, ExecError> {
        axis_reduced_shape(self.name(), input, axis, keepdim)
    }
}

impl ExecContext {
    /// Runs the forward kernel of the statistic `op` along `axis` (the same
    /// kernel, and the same bits, as the op's named method).
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`]; [`ExecError::OutOfMemory`].
    pub fn statistic(
        &self,
        op: AxisStatistic,
        x: &RawTensor,
        axis: impl Axis,
        keepdim: bool,
    ) -> Result<RawTensor, ExecError> {
        match op {
            AxisStatistic::Variance { unbiased } => self.variance(x, axis, keepdim, unbiased),
            AxisStatistic::LogSumExp => self.logsumexp(x, axis, keepdim),
        }
    }

    /// Runs the backward kernel of the statistic `op`: the input's gradient
    /// from the output's gradient `grad_y`, at the forward input `x` and (read
    /// only by ops whose [`keeps_output`](AxisStatistic::keeps_output) is true)
    /// the forward output `y`.
    ///
    /// # Errors
    /// [`ExecError::InvalidArgument`] if `op` reads its output and `y` is
    /// `None`; as the named backward kernel otherwise.
    pub fn statistic_backward(
        &self,
        op: AxisStatistic,
        x: &RawTensor,
        y: Option<&RawTensor>,
        grad_y: &RawTensor,
        axis: impl Axis,
        keepdim: bool,
    ) -> Result<RawTensor, ExecError> {
        match op {
            AxisStatistic::Variance { unbiased } => {
                self.variance_backward(x, grad_y, axis, keepdim, unbiased)
            }
            AxisStatistic::LogSumExp => {
                let y = y.ok_or(ExecError::InvalidArgument {
                    op: "statistic_backward",
                    reason: "logsumexp's backward reads the forward output; pass it",
                })?;
                self.logsumexp_backward(x, y, grad_y, axis, keepdim)
            }
        }
    }
}

/// The descriptor of the reductions over every element (`sum_all`,
/// `mean_all`; results of shape `[1]`): one variant per op, naming its forward
/// kernel ([`ExecContext::reduce_all`]) and its backward kernel
/// ([`ExecContext::reduce_all_backward`]). The named methods run the same
/// kernels; the autograd layer records one variant per node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FullReduction {
    /// The sum ([`ExecContext::sum_all`]).
    Sum,
    /// The mean ([`ExecContext::mean_all`]).
    Mean,
}

impl FullReduction {
    /// Every full reduction, in declaration order.
    pub const ALL: &'static [FullReduction] = &[FullReduction::Sum, FullReduction::Mean];

    /// The op's name (the name of its `ExecContext` method).
    pub fn name(self) -> &'static str {
        match self {
            FullReduction::Sum => "sum_all",
            FullReduction::Mean => "mean_all",
        }
    }

    /// The op's output shape: `[1]` (one element) whatever the input's shape.
    /// The forward kernels take their output shape from here.
    pub fn out_shape(self, _input: &[usize]) -> Dims {
        Dims::new(&[1])
    }
}

impl ExecContext {
    /// Runs the forward kernel of the full reduction `op` (the same kernel, and
    /// the same bits, as the op's named method).
    ///
    /// # Errors
    /// [`ExecError::OutOfMemory`].
    pub fn reduce_all(&self, op: FullReduction, x: &RawTensor) -> Result<RawTensor, ExecError> {
        match op {
            FullReduction::Sum => self.sum_all(x),
            FullReduction::Mean => self.mean_all(x),
        }
    }

    /// Runs the backward kernel of the full reduction `op`: the one-element
    /// output gradient `grad` (scaled by `1 / numel` for the mean) broadcast to
    /// `input_shape`, as a zero-copy broadcast view.
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`] if `grad` does not hold exactly one element;
    /// the shape errors of [`RawTensor::broadcast_to`] for `input_shape`;
    /// [`ExecError::OutOfMemory`].
    pub fn reduce_all_backward(
        &self,
        op: FullReduction,
        grad: &RawTensor,
        input_shape: &[usize],
    ) -> Result<RawTensor, ExecError> {
        if grad.numel() != 1 {
            return Err(ExecError::InvalidShape {
                op: "reduce_all_backward",
                shape: grad.dims(),
                reason: "the gradient of a full reduction holds one element",
            });
        }
        let g = match op {
            FullReduction::Sum => grad.clone(),
            FullReduction::Mean => {
                let numel: usize = input_shape.iter().product();
                self.scale(grad, 1.0 / numel as f32)?
            }
        };
        // One element in any layout (shape `[1]`, `[1, 1]`, a broadcast scalar)
        // as shape `[1]`, then broadcast: no copy.
        let flat = match g.shape() {
            [1] => g,
            _ => g.broadcast_to(&[1]).or_else(|_| g.reshape(&[1]))?,
        };
        flat.broadcast_to(input_shape)
    }
}
