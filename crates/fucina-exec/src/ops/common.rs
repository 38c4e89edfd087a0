//! Helpers that several op families share: parameter and index checks, the
//! axis-last order, the logical copy of a strided tensor, and batch norm's
//! statistics type and checks (`batch_norm` and the fused `batch_norm_pool2d`).
//! The family modules import these and never each other.

use crate::context::ExecContext;
use crate::error::ExecError;
use crate::kernels::strided::{Geom, seg1};
use crate::tensor::layout::{Dims, MAX_RANK};
use crate::tensor::{Element, RawTensor};

/// Checks `eps` (finite, non-negative) and that each parameter has shape `[c]`
/// (`reason` names the axis), for `layer_norm`/`rms_norm` and `batch_norm`.
pub(crate) fn check_param_shapes(
    op: &'static str,
    x: &RawTensor,
    c: usize,
    params: &[&RawTensor],
    eps: f32,
    reason: &'static str,
) -> Result<(), ExecError> {
    for p in params {
        if p.shape() != [c] {
            return Err(ExecError::ShapeMismatch {
                op,
                lhs: x.dims(),
                rhs: p.dims(),
                reason,
            });
        }
    }
    if !(eps >= 0.0 && eps.is_finite()) {
        return Err(ExecError::InvalidArgument {
            op,
            reason: "eps must be finite and non-negative",
        });
    }
    Ok(())
}

/// `order` moving `axis` to the end, and its inverse.
pub(crate) fn axis_last_order(rank: usize, axis: usize) -> (Dims, Dims) {
    let mut order = Dims::default();
    for i in (0..rank).filter(|&i| i != axis) {
        order.push(i);
    }
    order.push(axis);
    let mut inv = Dims::new(&[0; MAX_RANK][..rank]);
    for (i, &o) in order.iter().enumerate() {
        inv.as_mut_slice()[o] = i;
    }
    (order, inv)
}

impl ExecContext {
    /// `x` with `axis` moved last, contiguous (`x` itself when `axis` is already last
    /// and `x` is contiguous, else a pooled copy).
    pub(crate) fn contiguous_axis_last<T: Element>(
        &self,
        x: &RawTensor<T>,
        axis: usize,
    ) -> Result<RawTensor<T>, ExecError> {
        if axis + 1 == x.rank() {
            return self.contiguous(x);
        }
        let (order, _) = axis_last_order(x.rank(), axis);
        self.materialize(&x.permute(&order)?)
    }
}

/// The first index (in logical order) outside `0..bound`, as an error of `op`.
/// Reads through the strides: allocates nothing.
pub(crate) fn check_index_values(
    op: &'static str,
    idx: &RawTensor<i64>,
    bound: usize,
) -> Result<(), ExecError> {
    // A negative index read as `u64` is above every bound.
    let bad = |i: i64| i as u64 >= bound as u64;
    let first_bad = if idx.is_contiguous() {
        // A vectorizable maximum per block; the first offender of a failing block.
        idx.contiguous_slice()
            .chunks(256)
            .find(|block| {
                block
                    .iter()
                    .map(|&i| i as u64)
                    .max()
                    .is_some_and(|m| m >= bound as u64)
            })
            .and_then(|block| block.iter().copied().find(|&i| bad(i)))
    } else {
        let buf: &[i64] = idx.buffer();
        let mut found = None;
        idx.layout().for_each_index(|p| {
            if found.is_none() && bad(buf[p]) {
                found = Some(buf[p]);
            }
        });
        found
    };
    match first_bad {
        Some(index) => Err(ExecError::IndexOutOfBounds { op, index, bound }),
        None => Ok(()),
    }
}

/// Checks a `gather` (or `scatter_add`) index against the source shape: same
/// rank, no larger size off the axis.
pub(crate) fn check_gather_index(
    op: &'static str,
    src: &[usize],
    axis: usize,
    index: &[usize],
) -> Result<(), ExecError> {
    let fits = index.len() == src.len()
        && index
            .iter()
            .zip(src)
            .enumerate()
            .all(|(d, (&i, &s))| d == axis || i <= s);
    if fits {
        Ok(())
    } else {
        Err(ExecError::ShapeMismatch {
            op,
            lhs: Dims::new(src),
            rhs: Dims::new(index),
            reason: "the index must have the source's rank and no larger size off the axis",
        })
    }
}

/// Copies the elements `start..start + dst.len()` of `x` (in logical row-major
/// order) into `dst`, reading through the strides when `x` is not contiguous.
pub(crate) fn copy_logical<T: Element>(x: &RawTensor<T>, start: usize, dst: &mut [T]) {
    let src: &[T] = x.buffer();
    if x.is_contiguous() {
        let o = x.offset() + start;
        dst.copy_from_slice(&src[o..o + dst.len()]);
        return;
    }
    let geom = Geom::new(x.shape(), [x.layout()]);
    let [stride] = geom.inner_strides();
    geom.for_segments(start..start + dst.len(), |pos, len, [base]| {
        seg1(
            &mut dst[pos - start..pos - start + len],
            src,
            base,
            stride,
            &|v| v,
        );
    });
}

/// Calls `f(q, s)` for every element of the row-major block `sub` (`q` its linear
/// position in `sub`, `s` its linear position in the enclosing block `full`, where
/// `sub[d] <= full[d]` for every axis).
pub(crate) fn for_each_sub_offset(sub: &[usize], full: &[usize], mut f: impl FnMut(usize, usize)) {
    let n: usize = sub.iter().product();
    if sub == full {
        for q in 0..n {
            f(q, q);
        }
        return;
    }
    let rank = sub.len();
    // Strides of `full`.
    let mut fstr = [0usize; MAX_RANK];
    let mut acc = 1;
    for ax in (0..rank).rev() {
        fstr[ax] = acc;
        acc *= full[ax];
    }
    let mut idx = [0usize; MAX_RANK];
    let mut s = 0;
    for q in 0..n {
        f(q, s);
        let mut ax = rank;
        while ax > 0 {
            ax -= 1;
            idx[ax] += 1;
            s += fstr[ax];
            if idx[ax] < sub[ax] {
                break;
            }
            s -= fstr[ax] * sub[ax];
            idx[ax] = 0;
        }
    }
}

/// Position `r` of the row-major block `from`, re-expressed as a position of the
/// row-major block `to` (same rank): `None` when one of its coordinates is not
/// below `to`'s size on that axis.
pub(crate) fn remap_position(r: usize, from: &[usize], to: &[usize]) -> Option<usize> {
    let mut rem = r;
    let mut pos = 0;
    let mut mul = 1;
    for ax in (0..from.len()).rev() {
        let c = rem % from[ax];
        rem /= from[ax];
        if c >= to[ax] {
            return None;
        }
        pos += c * mul;
        mul *= to[ax];
    }
    Some(pos)
}

/// The per-channel statistics of a training-mode batch norm, each of shape `[C]`
/// (views of one pooled `[3, C]` tensor).
///
/// `mean` and `unbiased_var` (the variance with Bessel's correction, `M / (M - 1)`
/// times the biased one) are what a running estimate is updated with, PyTorch's
/// way: `running = (1 - momentum) * running + momentum * batch`. `inv_std` is
/// `1 / sqrt(biased_var + eps)`, the factor the output was normalized with
/// (what [`ExecContext::batch_norm_backward`] reads).
#[derive(Clone, Debug)]
pub struct BatchNormStats {
    /// The batch mean per channel.
    pub mean: RawTensor,
    /// The unbiased batch variance per channel.
    pub unbiased_var: RawTensor,
    /// `1 / sqrt(biased variance + eps)` per channel.
    pub inv_std: RawTensor,
}

impl BatchNormStats {
    /// The three rows of a packed `[3, C]` statistics tensor, as views.
    pub(crate) fn unpack(packed: &RawTensor) -> Result<BatchNormStats, ExecError> {
        let ch = packed.shape()[1];
        let row =
            |i: usize| -> Result<RawTensor, ExecError> { packed.narrow(0, i, 1)?.reshape(&[ch]) };
        Ok(BatchNormStats {
            mean: row(0)?,
            unbiased_var: row(1)?,
            inv_std: row(2)?,
        })
    }
}

/// `(N, C, plane)` of a channels-first input `[N, C, ...]` (the batch and
/// group norms), or an error naming `op` when its rank is below 2.
pub(crate) fn channels_first(
    op: &'static str,
    x: &RawTensor,
) -> Result<(usize, usize, usize), ExecError> {
    if x.rank() < 2 {
        return Err(ExecError::InvalidShape {
            op,
            shape: x.dims(),
            reason: "the input must be [N, C, ...] (rank at least 2)",
        });
    }
    let s = x.shape();
    Ok((s[0], s[1], s[2..].iter().product()))
}

/// Checks that an output gradient `g` has the input `x`'s shape (the norms'
/// backward kernels).
pub(crate) fn check_grad_shape(
    op: &'static str,
    x: &RawTensor,
    g: &RawTensor,
) -> Result<(), ExecError> {
    if x.shape() != g.shape() {
        return Err(ExecError::ShapeMismatch {
            op,
            lhs: x.dims(),
            rhs: g.dims(),
            reason: "the output gradient must have the input's shape",
        });
    }
    Ok(())
}

/// Checks rank, `eps` and that every parameter has shape `[C]`; returns
/// `(N, C, plane)`.
pub(crate) fn check_batch_norm(
    op: &'static str,
    x: &RawTensor,
    params: &[&RawTensor],
    eps: f32,
) -> Result<(usize, usize, usize), ExecError> {
    let dims @ (_, c, _) = channels_first(op, x)?;
    let reason = "each per-channel parameter must have shape [C] (axis 1 of the input)";
    check_param_shapes(op, x, c, params, eps, reason)?;
    Ok(dims)
}

/// [`check_batch_norm`] for training mode, which also needs more than one value per
/// channel.
pub(crate) fn check_batch_norm_training(
    op: &'static str,
    x: &RawTensor,
    params: &[&RawTensor],
    eps: f32,
) -> Result<(usize, usize, usize), ExecError> {
    let dims @ (n, _, plane) = check_batch_norm(op, x, params, eps)?;
    if n * plane < 2 {
        return Err(ExecError::InvalidShape {
            op,
            shape: x.dims(),
            reason: "training mode needs more than one value per channel",
        });
    }
    Ok(dims)
}
