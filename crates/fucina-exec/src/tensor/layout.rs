//! Shapes, strides and the layout classes the elementwise kernels dispatch on.
//!
//! A [`Layout`] is stored inline (rank at most [`MAX_RANK`]), so a tensor header never
//! allocates. Strides are in elements and may be zero (broadcast axes); they are never
//! negative.

use std::fmt;

use crate::axis::Axis;
use crate::error::ExecError;

/// The largest rank a tensor may have.
pub const MAX_RANK: usize = 8;

/// A shape (or stride list) stored inline: up to [`MAX_RANK`] values, no heap.
///
/// Used in error messages and wherever a shape is computed (broadcast results,
/// reduced shapes) without allocating.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Dims {
    vals: [usize; MAX_RANK],
    len: u8,
    /// The length of the input `new` was given (saturating at 255): above `len`
    /// when it was truncated, so that error messages show the real rank.
    given: u8,
}

impl Dims {
    /// Copies `dims`, keeping at most [`MAX_RANK`] values. A longer input (a
    /// shape the rank check refuses) keeps its first [`MAX_RANK`] values and
    /// remembers its length: it prints as `[v0, ..., v7, … (rank 9)]`.
    pub fn new(dims: &[usize]) -> Dims {
        let mut d = Dims::default();
        let n = dims.len().min(MAX_RANK);
        d.vals[..n].copy_from_slice(&dims[..n]);
        d.len = n as u8;
        d.given = u8::try_from(dims.len()).unwrap_or(u8::MAX);
        d
    }

    /// The length of the input this was made from, which is above
    /// [`len`](Dims::len) when values past [`MAX_RANK`] were dropped.
    pub fn given_len(&self) -> usize {
        usize::from(self.given.max(self.len))
    }

    /// The values as a slice.
    pub fn as_slice(&self) -> &[usize] {
        &self.vals[..usize::from(self.len)]
    }

    /// The values as a mutable slice.
    pub fn as_mut_slice(&mut self) -> &mut [usize] {
        &mut self.vals[..usize::from(self.len)]
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `v`.
    ///
    /// # Panics
    /// If [`MAX_RANK`] values are already stored (a contract of the callers, which
    /// validate ranks first).
    pub fn push(&mut self, v: usize) {
        assert!(
            self.len() < MAX_RANK,
            "Dims::push: more than {MAX_RANK} values"
        );
        self.vals[self.len()] = v;
        self.len += 1;
        self.given = self.len;
    }

    /// Product of the values (`None` on overflow). The empty product is 1.
    pub fn checked_product(&self) -> Option<usize> {
        self.as_slice()
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
    }
}

impl std::ops::Deref for Dims {
    type Target = [usize];
    fn deref(&self) -> &[usize] {
        self.as_slice()
    }
}

impl fmt::Debug for Dims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.given_len() == self.len() {
            return fmt::Debug::fmt(self.as_slice(), f);
        }
        // A truncated input: the values kept, then the real rank.
        f.write_str("[")?;
        for v in self.as_slice() {
            write!(f, "{v}, ")?;
        }
        if self.given == u8::MAX {
            write!(f, "… (rank 255 or more)]")
        } else {
            write!(f, "… (rank {})]", self.given)
        }
    }
}

impl fmt::Display for Dims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// How an operand is laid out, the dispatch key of the elementwise kernels.
/// Decided in this order: scalar, contiguous, tail broadcast,
/// arbitrary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayoutClass {
    /// Strictly row-major contiguous (including every size-1 axis).
    Contiguous,
    /// Exactly one element, whatever the strides.
    Scalar,
    /// A contiguous inner block repeated over leading stride-0 axes (a broadcast
    /// row, or a broadcast single value).
    TailBroadcast,
    /// Anything else (transposes, middle-axis broadcasts, stepped views).
    Arbitrary,
}

/// Shape, strides (in elements) and element offset of a tensor, stored inline.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Layout {
    dims: Dims,
    strides: Dims,
    offset: usize,
}

impl fmt::Debug for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Layout")
            .field("shape", &self.dims)
            .field("strides", &self.strides)
            .field("offset", &self.offset)
            .finish()
    }
}

/// Validates a shape: rank 1..=8, no zero dimension, element count
/// fits `usize`. Returns the element count.
pub(crate) fn check_shape(op: &'static str, shape: &[usize]) -> Result<usize, ExecError> {
    if shape.is_empty() || shape.len() > MAX_RANK {
        return Err(ExecError::InvalidShape {
            op,
            shape: Dims::new(shape),
            reason: if shape.is_empty() {
                "rank 0 (a tensor has 1 to 8 dimensions)"
            } else {
                "rank above 8"
            },
        });
    }
    if shape.contains(&0) {
        return Err(ExecError::InvalidShape {
            op,
            shape: Dims::new(shape),
            reason: "a dimension is zero",
        });
    }
    Dims::new(shape)
        .checked_product()
        .ok_or(ExecError::Overflow {
            op,
            shape: Dims::new(shape),
        })
}

impl Layout {
    /// The row-major contiguous layout of `shape` at offset 0, after the shape
    /// checks of the constructors (rank 1 to 8, no zero dimension, no overflow).
    pub fn contiguous(op: &'static str, shape: &[usize]) -> Result<Layout, ExecError> {
        check_shape(op, shape)?;
        Ok(Layout::contiguous_unchecked(shape))
    }

    /// The row-major layout of an already validated shape.
    pub(crate) fn contiguous_unchecked(shape: &[usize]) -> Layout {
        let dims = Dims::new(shape);
        let mut strides = dims;
        let mut acc = 1;
        for (s, &d) in strides.as_mut_slice().iter_mut().zip(shape).rev() {
            *s = acc;
            acc *= d;
        }
        Layout {
            dims,
            strides,
            offset: 0,
        }
    }

    /// A layout from parts; the caller has validated shape, strides and bounds.
    pub(crate) fn from_parts(dims: Dims, strides: Dims, offset: usize) -> Layout {
        debug_assert_eq!(dims.len(), strides.len());
        Layout {
            dims,
            strides,
            offset,
        }
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        self.dims.as_slice()
    }

    /// The shape as an inline value.
    pub fn dims(&self) -> Dims {
        self.dims
    }

    /// The strides, in elements.
    pub fn strides(&self) -> &[usize] {
        self.strides.as_slice()
    }

    /// The strides as an inline value.
    pub fn stride_dims(&self) -> Dims {
        self.strides
    }

    /// Element offset of the first element in the storage.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// Number of elements (validated shapes never overflow).
    pub fn numel(&self) -> usize {
        self.shape().iter().product()
    }

    /// The strict contiguity test: walking from the last axis,
    /// every stride equals the running product, size-1 axes included.
    pub fn is_contiguous(&self) -> bool {
        is_row_major(self.shape(), self.strides())
    }

    /// The largest storage index this layout touches, plus one.
    pub fn end_index(&self) -> usize {
        self.offset
            + self
                .shape()
                .iter()
                .zip(self.strides())
                .map(|(&d, &s)| (d - 1) * s)
                .sum::<usize>()
            + 1
    }

    /// The [`LayoutClass`] of this layout (scalar, contiguous, tail broadcast or
    /// arbitrary, tested in that order).
    pub fn classify(&self) -> LayoutClass {
        if self.numel() == 1 {
            return LayoutClass::Scalar;
        }
        if self.is_contiguous() {
            return LayoutClass::Contiguous;
        }
        let strides = self.strides();
        match strides.iter().position(|&s| s != 0) {
            None => LayoutClass::TailBroadcast,
            Some(s) if is_row_major(&self.shape()[s..], &strides[s..]) => {
                LayoutClass::TailBroadcast
            }
            Some(_) => LayoutClass::Arbitrary,
        }
    }

    /// For a [`LayoutClass::TailBroadcast`] or contiguous layout: the length of the
    /// contiguous inner block that repeats (`numel` when contiguous, 1 when every
    /// stride is 0).
    pub fn tail_len(&self) -> usize {
        match self.strides().iter().position(|&s| s != 0) {
            None => 1,
            Some(s) => self.shape()[s..].iter().product(),
        }
    }

    /// Calls `f(storage_index)` for every element in logical row-major order.
    ///
    /// The running index steps one stride past the end of each axis before it is
    /// rewound; a size-1 axis may carry any stride (even near `usize::MAX`), so
    /// those steps wrap. Every index passed to `f` is exact: it is in range and
    /// equal to its value modulo 2^64.
    pub fn for_each_index(&self, mut f: impl FnMut(usize)) {
        let rank = self.rank();
        let shape = self.shape();
        let strides = self.strides();
        let inner = shape[rank - 1];
        let inner_stride = strides[rank - 1];
        let outer: usize = shape[..rank - 1].iter().product();
        let mut idx = [0usize; MAX_RANK];
        let mut base = self.offset;
        for _ in 0..outer {
            let mut p = base;
            for _ in 0..inner {
                f(p);
                p = p.wrapping_add(inner_stride);
            }
            // Advance the multi-index over the outer axes (odometer).
            let mut ax = rank - 1;
            while ax > 0 {
                ax -= 1;
                idx[ax] += 1;
                base = base.wrapping_add(strides[ax]);
                if idx[ax] < shape[ax] {
                    break;
                }
                base = base.wrapping_sub(strides[ax].wrapping_mul(shape[ax]));
                idx[ax] = 0;
            }
        }
    }
}

/// Whether `strides` are the strict row-major strides of `shape`.
pub(crate) fn is_row_major(shape: &[usize], strides: &[usize]) -> bool {
    let mut expected = 1usize;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if s != expected {
            return false;
        }
        expected = expected.saturating_mul(d);
    }
    true
}

/// Normalizes an axis for a tensor of rank `rank` (negative counts from the end).
pub(crate) fn check_axis(
    op: &'static str,
    axis: impl Axis,
    rank: usize,
) -> Result<usize, ExecError> {
    axis.resolve(op, rank)
}

/// The numpy broadcast of two shapes (right-aligned; equal dims or a 1).
pub fn broadcast_shapes(op: &'static str, a: &[usize], b: &[usize]) -> Result<Dims, ExecError> {
    let rank = a.len().max(b.len());
    let mut out = Dims::default();
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        let d = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(ExecError::ShapeMismatch {
                op,
                lhs: Dims::new(a),
                rhs: Dims::new(b),
                reason: "shapes do not broadcast (dims must be equal or 1, right-aligned)",
            });
        };
        out.push(d);
    }
    Ok(out)
}

/// The zero-copy broadcast of `layout` to `shape` (numpy rules: aligned on the
/// right, stretched axes get stride 0).
pub(crate) fn broadcast_layout(
    op: &'static str,
    layout: &Layout,
    shape: &[usize],
) -> Result<Layout, ExecError> {
    check_shape(op, shape)?;
    let src = layout.shape();
    if src.len() > shape.len() {
        return Err(ExecError::ShapeMismatch {
            op,
            lhs: layout.dims(),
            rhs: Dims::new(shape),
            reason: "source rank is above the target rank",
        });
    }
    let lead = shape.len() - src.len();
    let mut strides = Dims::default();
    for (i, &d) in shape.iter().enumerate() {
        let s = if i < lead {
            0
        } else {
            let sd = src[i - lead];
            if sd == d {
                layout.strides()[i - lead]
            } else if sd == 1 {
                0
            } else {
                return Err(ExecError::ShapeMismatch {
                    op,
                    lhs: layout.dims(),
                    rhs: Dims::new(shape),
                    reason: "a source dimension is neither equal to the target nor 1",
                });
            }
        };
        strides.push(s);
    }
    Ok(Layout::from_parts(
        Dims::new(shape),
        strides,
        layout.offset(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lay(shape: &[usize], strides: &[usize]) -> Layout {
        Layout::from_parts(Dims::new(shape), Dims::new(strides), 0)
    }

    #[test]
    fn classify_examples() {
        // [3] broadcast to [2,3]
        assert_eq!(lay(&[2, 3], &[0, 1]).classify(), LayoutClass::TailBroadcast);
        // scalar [1] broadcast to [2,3]
        assert_eq!(lay(&[2, 3], &[0, 0]).classify(), LayoutClass::TailBroadcast);
        // [3] broadcast to [1,3]: not contiguous under the strict test
        assert_eq!(lay(&[1, 3], &[0, 1]).classify(), LayoutClass::TailBroadcast);
        // [1] -> [1]
        assert_eq!(lay(&[1], &[0]).classify(), LayoutClass::Scalar);
        assert_eq!(lay(&[1, 1], &[5, 9]).classify(), LayoutClass::Scalar);
        // middle-axis broadcast [2,1,3] -> [2,4,3]
        assert_eq!(
            lay(&[2, 4, 3], &[3, 0, 1]).classify(),
            LayoutClass::Arbitrary
        );
        // transpose
        assert_eq!(lay(&[3, 2], &[1, 3]).classify(), LayoutClass::Arbitrary);
        assert_eq!(lay(&[2, 3], &[3, 1]).classify(), LayoutClass::Contiguous);
        // strict: a size-1 axis with a wrong stride is not contiguous
        assert!(!lay(&[2, 1, 3], &[3, 0, 1]).is_contiguous());
        assert_eq!(
            lay(&[2, 1, 3], &[3, 0, 1]).classify(),
            LayoutClass::Arbitrary
        );
    }

    #[test]
    fn shape_errors() {
        assert!(matches!(
            check_shape("t", &[]),
            Err(ExecError::InvalidShape { .. })
        ));
        assert!(matches!(
            check_shape("t", &[1; 9]),
            Err(ExecError::InvalidShape { .. })
        ));
        assert!(matches!(
            check_shape("t", &[2, 0]),
            Err(ExecError::InvalidShape { .. })
        ));
        assert!(matches!(
            check_shape("t", &[usize::MAX, 2]),
            Err(ExecError::Overflow { .. })
        ));
        assert_eq!(check_shape("t", &[2, 3, 4]).unwrap(), 24);
    }

    #[test]
    fn for_each_index_walks_row_major() {
        let l = Layout::from_parts(Dims::new(&[2, 3]), Dims::new(&[1, 2]), 1);
        let mut v = Vec::new();
        l.for_each_index(|i| v.push(i));
        assert_eq!(v, [1, 3, 5, 2, 4, 6]);
        let l = lay(&[2, 2, 2], &[4, 2, 1]);
        let mut v = Vec::new();
        l.for_each_index(|i| v.push(i));
        assert_eq!(v, (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn broadcasting_rules() {
        assert_eq!(
            broadcast_shapes("t", &[3], &[2, 1]).unwrap().as_slice(),
            [2, 3]
        );
        assert!(broadcast_shapes("t", &[3], &[2]).is_err());
        let l = Layout::contiguous("t", &[3]).unwrap();
        let b = broadcast_layout("t", &l, &[4, 2, 3]).unwrap();
        assert_eq!(b.strides(), [0, 0, 1]);
        let l = Layout::contiguous("t", &[2, 1, 3]).unwrap();
        let b = broadcast_layout("t", &l, &[2, 4, 3]).unwrap();
        assert_eq!(b.strides(), [3, 0, 1]);
        assert!(matches!(
            broadcast_layout("t", &l, &[3]),
            Err(ExecError::ShapeMismatch { .. })
        ));
        assert!(matches!(
            broadcast_layout("t", &l, &[2, 4, 4]),
            Err(ExecError::ShapeMismatch { .. })
        ));
        // equal dims keep their stride, checked first (1 -> 1 keeps it)
        let l = Layout::from_parts(Dims::new(&[1, 3]), Dims::new(&[7, 1]), 0);
        assert_eq!(
            broadcast_layout("t", &l, &[1, 3]).unwrap().strides(),
            [7, 1]
        );
    }
}
