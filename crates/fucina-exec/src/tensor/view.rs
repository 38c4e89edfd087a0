//! Zero-copy views: new handles over the same storage (one refcount increment,
//! no data movement, no pool traffic).

use crate::axis::Axis;
use crate::error::ExecError;
use crate::tensor::layout::{Dims, Layout, MAX_RANK, broadcast_layout, check_axis, check_shape};
use crate::tensor::{Element, RawTensor};

impl Layout {
    /// The layout of [`RawTensor::reshape`] applied to this one (its checks, its errors).
    pub(crate) fn reshape(&self, shape: &[usize]) -> Result<Layout, ExecError> {
        let n = check_shape("reshape", shape)?;
        if n != self.numel() {
            return Err(ExecError::InvalidShape {
                op: "reshape",
                shape: Dims::new(shape),
                reason: "the element count differs from the tensor's",
            });
        }
        if !self.is_contiguous() {
            return Err(ExecError::UnsupportedView {
                op: "reshape",
                reason: "reshape needs a contiguous tensor; materialize it first",
            });
        }
        let l = Layout::contiguous_unchecked(shape);
        Ok(Layout::from_parts(l.dims(), l.stride_dims(), self.offset()))
    }

    /// The layout of [`RawTensor::permute`] applied to this one (its checks, its errors).
    pub(crate) fn permute(&self, order: &[usize]) -> Result<Layout, ExecError> {
        let rank = self.rank();
        let mut seen = [false; MAX_RANK];
        if order.len() != rank
            || order
                .iter()
                .any(|&a| a >= rank || std::mem::replace(&mut seen[a], true))
        {
            return Err(ExecError::InvalidShape {
                op: "permute",
                shape: Dims::new(order),
                reason: "the order is not a permutation of the tensor's axes",
            });
        }
        let (mut dims, mut strides) = (Dims::default(), Dims::default());
        for &a in order {
            dims.push(self.shape()[a]);
            strides.push(self.strides()[a]);
        }
        Ok(Layout::from_parts(dims, strides, self.offset()))
    }

    /// The layout of [`RawTensor::transpose`] applied to this one (its checks, its errors).
    pub(crate) fn transpose(&self, a: impl Axis, b: impl Axis) -> Result<Layout, ExecError> {
        let a = check_axis("transpose", a, self.rank())?;
        let b = check_axis("transpose", b, self.rank())?;
        let (mut dims, mut strides) = (self.dims(), self.stride_dims());
        dims.as_mut_slice().swap(a, b);
        strides.as_mut_slice().swap(a, b);
        Ok(Layout::from_parts(dims, strides, self.offset()))
    }

    /// The layout of [`RawTensor::narrow`] applied to this one (its checks, its errors).
    pub(crate) fn narrow(
        &self,
        axis: impl Axis,
        start: usize,
        len: usize,
    ) -> Result<Layout, ExecError> {
        let axis = check_axis("narrow", axis, self.rank())?;
        let size = self.shape()[axis];
        if len == 0 {
            return Err(ExecError::InvalidShape {
                op: "narrow",
                shape: self.dims(),
                reason: "narrow to length 0 (tensors have no zero dimensions)",
            });
        }
        match start.checked_add(len) {
            Some(end) if end <= size => {}
            _ => {
                // The first index of the window past the axis: `start` itself, or
                // the window's last index.
                let past = if start >= size {
                    start
                } else {
                    start.saturating_add(len - 1)
                };
                return Err(ExecError::IndexOutOfBounds {
                    op: "narrow",
                    index: i64::try_from(past).unwrap_or(i64::MAX),
                    bound: size,
                });
            }
        }
        let mut dims = self.dims();
        dims.as_mut_slice()[axis] = len;
        let offset = self.offset() + start * self.strides()[axis];
        Ok(Layout::from_parts(dims, self.stride_dims(), offset))
    }

    /// The layout of [`RawTensor::squeeze`] applied to this one (its checks, its errors).
    pub(crate) fn squeeze(&self, axis: impl Axis) -> Result<Layout, ExecError> {
        let axis = check_axis("squeeze", axis, self.rank())?;
        if self.shape()[axis] != 1 || self.rank() == 1 {
            return Err(ExecError::InvalidShape {
                op: "squeeze",
                shape: self.dims(),
                reason: "squeeze needs a size-1 axis and a result of rank >= 1",
            });
        }
        let (mut dims, mut strides) = (Dims::default(), Dims::default());
        for i in (0..self.rank()).filter(|&i| i != axis) {
            dims.push(self.shape()[i]);
            strides.push(self.strides()[i]);
        }
        Ok(Layout::from_parts(dims, strides, self.offset()))
    }

    /// The layout of [`RawTensor::unsqueeze`] applied to this one (its checks, its errors).
    pub(crate) fn unsqueeze(&self, axis: impl Axis) -> Result<Layout, ExecError> {
        let rank = self.rank();
        let axis = check_axis("unsqueeze", axis, rank + 1)?;
        if rank == MAX_RANK {
            return Err(ExecError::InvalidShape {
                op: "unsqueeze",
                shape: self.dims(),
                reason: "the result would have rank above 8",
            });
        }
        let (mut dims, mut strides) = (Dims::default(), Dims::default());
        for i in 0..=rank {
            if i == axis {
                dims.push(1);
                let inner = if i < rank {
                    self.strides()[i] * self.shape()[i]
                } else {
                    1
                };
                strides.push(inner);
            }
            if i < rank {
                dims.push(self.shape()[i]);
                strides.push(self.strides()[i]);
            }
        }
        Ok(Layout::from_parts(dims, strides, self.offset()))
    }

    /// The layout of [`RawTensor::broadcast_to`] applied to this one (its checks, its errors).
    pub(crate) fn broadcast_to(&self, shape: &[usize]) -> Result<Layout, ExecError> {
        broadcast_layout("broadcast_to", self, shape)
    }
}

impl<T: Element> RawTensor<T> {
    /// The same elements under a new shape (equal element count). Keeps the offset.
    ///
    /// # Errors
    /// The shape errors of the constructors; [`ExecError::InvalidShape`] if the element
    /// count differs; [`ExecError::UnsupportedView`] if the tensor is not contiguous
    /// (materialize it first).
    pub fn reshape(&self, shape: &[usize]) -> Result<RawTensor<T>, ExecError> {
        Ok(self.view(self.layout.reshape(shape)?))
    }

    /// Axes reordered: axis `i` of the result is axis `order[i]` of `self`.
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`] if `order` is not a permutation of `0..rank`.
    pub fn permute(&self, order: &[usize]) -> Result<RawTensor<T>, ExecError> {
        Ok(self.view(self.layout.permute(order)?))
    }

    /// Axes `a` and `b` swapped.
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`] if an axis is outside `-rank..rank`.
    pub fn transpose(&self, a: impl Axis, b: impl Axis) -> Result<RawTensor<T>, ExecError> {
        Ok(self.view(self.layout.transpose(a, b)?))
    }

    /// Elements `start..start + len` along `axis`.
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`]; [`ExecError::InvalidShape`] for `len == 0`;
    /// [`ExecError::IndexOutOfBounds`] if the range does not fit the axis.
    pub fn narrow(
        &self,
        axis: impl Axis,
        start: usize,
        len: usize,
    ) -> Result<RawTensor<T>, ExecError> {
        Ok(self.view(self.layout.narrow(axis, start, len)?))
    }

    /// Removes `axis`, which must have size 1. A rank-1 tensor cannot be squeezed.
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`]; [`ExecError::InvalidShape`] if the axis is not of
    /// size 1 or the tensor has rank 1.
    pub fn squeeze(&self, axis: impl Axis) -> Result<RawTensor<T>, ExecError> {
        Ok(self.view(self.layout.squeeze(axis)?))
    }

    /// Inserts a size-1 axis at position `axis` (`0..=rank`, or `-rank - 1..0`
    /// counted from the end of the result: `-1` appends it). The new axis gets the
    /// stride that keeps a contiguous tensor contiguous.
    ///
    /// # Errors
    /// [`ExecError::InvalidAxis`] if `axis` is outside `-rank - 1..=rank`;
    /// [`ExecError::InvalidShape`] if the
    /// result would have rank above 8.
    pub fn unsqueeze(&self, axis: impl Axis) -> Result<RawTensor<T>, ExecError> {
        Ok(self.view(self.layout.unsqueeze(axis)?))
    }

    /// A zero-copy broadcast to `shape` (numpy rules: shapes aligned on the right, a size-1 axis stretches).
    ///
    /// # Errors
    /// The shape errors; [`ExecError::ShapeMismatch`] if the shapes do not broadcast.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<RawTensor<T>, ExecError> {
        Ok(self.view(self.layout.broadcast_to(shape)?))
    }

    /// An arbitrary strided view of this tensor's storage: element `idx` of the
    /// result is storage element `offset + sum(idx[i] * strides[i])`.
    ///
    /// The view may reach the storage elements `0..storage_extent()` (the elements
    /// of the tensor the storage was made for), never the rest of a pooled
    /// buffer's size class, which holds values of earlier tensors.
    ///
    /// # Errors
    /// The shape errors; [`ExecError::InvalidShape`] if `strides.len() != shape.len()`;
    /// [`ExecError::InvalidDataLength`] if the view reaches past the storage extent
    /// (`expected` is the extent the view needs, `got` the one there is).
    pub fn view_with_strides(
        &self,
        shape: &[usize],
        strides: &[usize],
        offset: usize,
    ) -> Result<RawTensor<T>, ExecError> {
        check_shape("view_with_strides", shape)?;
        if strides.len() != shape.len() {
            return Err(ExecError::InvalidShape {
                op: "view_with_strides",
                shape: Dims::new(strides),
                reason: "the stride count must equal the rank",
            });
        }
        let end = shape.iter().zip(strides).try_fold(offset, |acc, (&d, &s)| {
            (d - 1).checked_mul(s).and_then(|x| acc.checked_add(x))
        });
        let cap = self.extent;
        match end {
            Some(last) if last < cap => {}
            _ => {
                return Err(ExecError::InvalidDataLength {
                    op: "view_with_strides",
                    shape: Dims::new(shape),
                    expected: end.map_or(usize::MAX, |e| e.saturating_add(1)),
                    got: cap,
                });
            }
        }
        Ok(self.view(Layout::from_parts(
            Dims::new(shape),
            Dims::new(strides),
            offset,
        )))
    }
}
