//! Axis arguments: a position from the front (`0..rank`) or, negative, counted
//! from the end (`-1` is the last axis), as in PyTorch and numpy.

use crate::error::ExecError;

mod sealed {
    pub trait Sealed {}
    impl Sealed for usize {}
    impl Sealed for isize {}
    impl Sealed for i32 {}
    impl Sealed for i64 {}
}

/// An axis argument accepted by every op that takes one axis: `usize`, `isize`,
/// `i32` or `i64`.
///
/// For a tensor of rank `r`, `0..r` names an axis from the front and `-r..0`
/// counts from the end (`-1` is the last axis, `-r` the first). Anything else is
/// [`ExecError::InvalidAxis`], which reports the axis as given (negative ones
/// included), the op and the rank, and nothing is computed. An unsuffixed integer
/// literal is an `i32`, so `ctx.sum(&x, 1, false)` and `ctx.softmax(&x, -1)` both
/// compile. Ops that insert an axis (`unsqueeze`, `stack`) resolve it against
/// `rank + 1`, so `-1` puts the new axis last.
///
/// ```
/// use fucina_exec::{Axis, ExecContext, ExecError};
///
/// let ctx = ExecContext::new();
/// let x = ctx.from_slice(&[2, 3], &[1., 2., 3., 4., 5., 6.])?;
/// assert_eq!(ctx.sum(&x, -1, false)?.to_vec(), ctx.sum(&x, 1, false)?.to_vec());
/// assert_eq!(ctx.sum(&x, -2, false)?.to_vec(), [5., 7., 9.]);
/// assert_eq!((-1).resolve("sum", 2)?, 1);
/// assert!(matches!(
///     ctx.softmax(&x, -3),
///     Err(ExecError::InvalidAxis { op: "softmax", axis: -3, rank: 2 })
/// ));
/// # Ok::<(), fucina_exec::ExecError>(())
/// ```
pub trait Axis: Copy + sealed::Sealed {
    /// The axis as a position in `0..rank`.
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`] naming `op` if the axis is outside `-rank..rank`.
    fn resolve(self, op: &'static str, rank: usize) -> Result<usize, ExecError>;
}

/// Resolves a signed axis (see [`Axis`]).
fn resolve_signed(op: &'static str, axis: i64, rank: usize) -> Result<usize, ExecError> {
    let r = i64::try_from(rank).unwrap_or(i64::MAX);
    let pos = if axis < 0 { axis + r } else { axis };
    if (0..r).contains(&pos) {
        // `pos` is in `0..rank`, so it fits a `usize`.
        Ok(pos as usize)
    } else {
        Err(ExecError::InvalidAxis { op, axis, rank })
    }
}

impl Axis for usize {
    fn resolve(self, op: &'static str, rank: usize) -> Result<usize, ExecError> {
        if self < rank {
            Ok(self)
        } else {
            Err(ExecError::InvalidAxis {
                op,
                axis: i64::try_from(self).unwrap_or(i64::MAX),
                rank,
            })
        }
    }
}

impl Axis for isize {
    fn resolve(self, op: &'static str, rank: usize) -> Result<usize, ExecError> {
        resolve_signed(op, self as i64, rank)
    }
}

impl Axis for i32 {
    fn resolve(self, op: &'static str, rank: usize) -> Result<usize, ExecError> {
        resolve_signed(op, i64::from(self), rank)
    }
}

impl Axis for i64 {
    fn resolve(self, op: &'static str, rank: usize) -> Result<usize, ExecError> {
        resolve_signed(op, self, rank)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_both_ends_and_rejects_the_rest() {
        assert_eq!(0usize.resolve("t", 3).unwrap(), 0);
        assert_eq!(2usize.resolve("t", 3).unwrap(), 2);
        assert_eq!((-1i32).resolve("t", 3).unwrap(), 2);
        assert_eq!((-3i64).resolve("t", 3).unwrap(), 0);
        assert_eq!((-2isize).resolve("t", 3).unwrap(), 1);
        for (axis, got) in [
            (3i64, 3usize.resolve("t", 3)),
            (3, 3i32.resolve("t", 3)),
            (-4, (-4i64).resolve("t", 3)),
            (i64::MIN, i64::MIN.resolve("t", 3)),
            (i64::MAX, usize::MAX.resolve("t", 3)),
        ] {
            match got {
                Err(ExecError::InvalidAxis {
                    op: "t",
                    axis: a,
                    rank: 3,
                }) => assert_eq!(a, axis),
                other => panic!("axis {axis}: {other:?}"),
            }
        }
    }
}
