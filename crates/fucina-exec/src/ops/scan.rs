//! `cumsum` along an axis and its backward (the reversed cumulative sum).
//!
//! Each line along the axis is summed sequentially from its first element
//! (`out[0] = x[0]`, `out[k] = out[k - 1] + x[k]`), by one task: the bits depend
//! only on the line, never on the team size, the vector level or the other lines.

use crate::axis::Axis;
use crate::context::ExecContext;
use crate::error::ExecError;
use crate::kernels::simd::vectorized;
use crate::tensor::RawTensor;
use crate::tensor::layout::check_axis;

/// Scans the `[d, inner]` block `x` into `out` along its first axis, forwards or
/// backwards.
#[inline(always)]
fn scan_block(x: &[f32], out: &mut [f32], d: usize, inner: usize, reverse: bool) {
    if inner == 1 {
        if reverse {
            let mut s = x[d - 1];
            out[d - 1] = s;
            for k in (0..d - 1).rev() {
                s += x[k];
                out[k] = s;
            }
        } else {
            let mut s = x[0];
            out[0] = s;
            for k in 1..d {
                s += x[k];
                out[k] = s;
            }
        }
        return;
    }
    let order = |i: usize| if reverse { d - 1 - i } else { i };
    let first = order(0);
    out[first * inner..][..inner].copy_from_slice(&x[first * inner..][..inner]);
    for i in 1..d {
        let (prev, k) = (order(i - 1), order(i));
        let (p, cur) = if reverse {
            let (lo, hi) = out.split_at_mut(prev * inner);
            (&hi[..inner], &mut lo[k * inner..][..inner])
        } else {
            let (lo, hi) = out.split_at_mut(k * inner);
            (&lo[prev * inner..][..inner], &mut hi[..inner])
        };
        for ((o, &a), &b) in cur.iter_mut().zip(p).zip(&x[k * inner..][..inner]) {
            *o = a + b;
        }
    }
}

impl ExecContext {
    fn scan(
        &self,
        op: &'static str,
        x: &RawTensor,
        axis: impl Axis,
        reverse: bool,
    ) -> Result<RawTensor, ExecError> {
        let axis = check_axis(op, axis, x.rank())?;
        let s = x.shape();
        let d = s[axis];
        let inner: usize = s[axis + 1..].iter().product();
        let block = d * inner;
        let xc = self.contiguous(x)?;
        let xs = xc.contiguous_slice();
        self.new_tensor(op, s, |out| {
            self.par_rows(out, block, block, |rows, o| {
                vectorized!(for (r, ob) in rows.zip(o.chunks_exact_mut(block)) {
                    scan_block(&xs[r * block..][..block], ob, d, inner, reverse);
                })
            });
        })
    }

    /// The inclusive cumulative sum of `x` along `axis` (like `torch.cumsum`):
    /// `out[.., k, ..] = x[.., 0, ..] + ... + x[.., k, ..]`, added left to right.
    /// Each line is summed on its own, so the result is the same bits for every
    /// team size and vector level, and a line's result does not depend on the
    /// other lines.
    ///
    /// ```
    /// use fucina_exec::ExecContext;
    ///
    /// let ctx = ExecContext::new();
    /// let x = ctx.from_slice(&[2, 3], &[1., 2., 3., 4., 5., 6.])?;
    /// assert_eq!(ctx.cumsum(&x, 1)?.to_vec(), [1., 3., 6., 4., 9., 15.]);
    /// assert_eq!(ctx.cumsum(&x, 0)?.to_vec(), [1., 2., 3., 5., 7., 9.]);
    /// # Ok::<(), fucina_exec::ExecError>(())
    /// ```
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`] if `axis` is outside `-rank..rank`;
    /// [`ExecError::OutOfMemory`].
    pub fn cumsum(&self, x: &RawTensor, axis: impl Axis) -> Result<RawTensor, ExecError> {
        self.scan("cumsum", x, axis, false)
    }

    /// The backward of [`cumsum`](ExecContext::cumsum): the reversed cumulative
    /// sum of `grad` along `axis`, `out[.., k, ..] = grad[.., k, ..] + ... +
    /// grad[.., d - 1, ..]`, added right to left.
    ///
    /// # Errors
    /// As [`cumsum`](ExecContext::cumsum).
    pub fn cumsum_backward(
        &self,
        grad: &RawTensor,
        axis: impl Axis,
    ) -> Result<RawTensor, ExecError> {
        self.scan("cumsum_backward", grad, axis, true)
    }
}
