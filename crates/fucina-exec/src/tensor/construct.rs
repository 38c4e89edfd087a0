//! Constructors on the context: all pool-backed and caller-owned,
//! except the zero-copy wraps of caller memory, which never enter the pool.

use std::sync::Arc;

use fucina_storage::Buffer;

use crate::context::ExecContext;
use crate::error::ExecError;
use crate::tensor::layout::{Layout, check_shape};
use crate::tensor::{Element, RawTensor};

impl ExecContext {
    /// A fresh pooled tensor of `shape` whose elements are set by `fill` (given
    /// exactly `numel` elements, whose prior contents are unspecified: zeros or
    /// values of a recycled buffer). The building block of every op.
    pub(crate) fn new_tensor<T: Element>(
        &self,
        op: &'static str,
        shape: &[usize],
        fill: impl FnOnce(&mut [T]),
    ) -> Result<RawTensor<T>, ExecError> {
        let layout = Layout::contiguous(op, shape)?;
        let n = layout.numel();
        let mut buf = self
            .pool()
            .acquire_typed::<T>(n)
            .map_err(|e| ExecError::storage(op, e))?;
        fill(&mut buf.get_mut().expect("a freshly acquired buffer is unique")[..n]);
        Ok(RawTensor::from_parts(buf, layout))
    }

    /// An f32 tensor of `shape` with unspecified contents (a recycled buffer may hold
    /// earlier values; never uninitialized memory).
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`] for rank 0, rank above 8 or a zero dimension;
    /// [`ExecError::Overflow`] if the element count overflows;
    /// [`ExecError::OutOfMemory`] if the pool cannot provide the memory.
    pub fn empty(&self, shape: &[usize]) -> Result<RawTensor, ExecError> {
        self.empty_typed(shape)
    }

    /// [`empty`](ExecContext::empty) for any element type.
    ///
    /// # Errors
    /// As [`empty`](ExecContext::empty).
    pub fn empty_typed<T: Element>(&self, shape: &[usize]) -> Result<RawTensor<T>, ExecError> {
        self.new_tensor("empty", shape, |_| {})
    }

    /// Zeros.
    ///
    /// # Errors
    /// As [`empty`](ExecContext::empty).
    pub fn zeros(&self, shape: &[usize]) -> Result<RawTensor, ExecError> {
        self.full_typed(shape, 0.0)
    }

    /// Zeros (`false`) of any element type.
    ///
    /// # Errors
    /// As [`empty`](ExecContext::empty).
    pub fn zeros_typed<T: Element>(&self, shape: &[usize]) -> Result<RawTensor<T>, ExecError> {
        self.full_typed(shape, T::ZERO)
    }

    /// Ones.
    ///
    /// # Errors
    /// As [`empty`](ExecContext::empty).
    pub fn ones(&self, shape: &[usize]) -> Result<RawTensor, ExecError> {
        self.full_typed(shape, 1.0)
    }

    /// Ones (`true`, bf16 `0x3F80`) of any element type.
    ///
    /// # Errors
    /// As [`empty`](ExecContext::empty).
    pub fn ones_typed<T: Element>(&self, shape: &[usize]) -> Result<RawTensor<T>, ExecError> {
        self.full_typed(shape, T::ONE)
    }

    /// Every element `value`.
    ///
    /// # Errors
    /// As [`empty`](ExecContext::empty).
    pub fn full(&self, shape: &[usize], value: f32) -> Result<RawTensor, ExecError> {
        self.full_typed(shape, value)
    }

    /// Every element `value`, any element type.
    ///
    /// # Errors
    /// As [`empty`](ExecContext::empty).
    pub fn full_typed<T: Element>(
        &self,
        shape: &[usize],
        value: T,
    ) -> Result<RawTensor<T>, ExecError> {
        self.new_tensor("full", shape, |out| out.fill(value))
    }

    /// A one-element tensor of shape `[1]`.
    ///
    /// # Errors
    /// [`ExecError::OutOfMemory`].
    pub fn scalar(&self, value: f32) -> Result<RawTensor, ExecError> {
        self.full_typed(&[1], value)
    }

    /// A pooled copy of `values` with `shape`.
    ///
    /// # Errors
    /// The shape errors of [`empty`](ExecContext::empty);
    /// [`ExecError::InvalidDataLength`] if `values.len()` is not the element count
    /// (checked before anything is allocated).
    pub fn from_slice(&self, shape: &[usize], values: &[f32]) -> Result<RawTensor, ExecError> {
        self.from_slice_typed(shape, values)
    }

    /// [`from_slice`](ExecContext::from_slice) for any element type, e.g.
    /// `ctx.from_slice_typed::<i64>(&[3], &[0, 2, 1])` for indices or labels.
    ///
    /// # Errors
    /// As [`from_slice`](ExecContext::from_slice).
    pub fn from_slice_typed<T: Element>(
        &self,
        shape: &[usize],
        values: &[T],
    ) -> Result<RawTensor<T>, ExecError> {
        check_len("from_slice", shape, values.len())?;
        self.new_tensor("from_slice", shape, |out| out.copy_from_slice(values))
    }

    /// Takes ownership of `values` without copying (a zero-copy wrap that never
    /// enters the pool; writable through copy-on-write when unique).
    ///
    /// # Errors
    /// As [`from_slice`](ExecContext::from_slice).
    pub fn from_vec<T: Element>(
        &self,
        shape: &[usize],
        values: Vec<T>,
    ) -> Result<RawTensor<T>, ExecError> {
        check_len("from_vec", shape, values.len())?;
        RawTensor::from_buffer(Buffer::from_vec(values), shape)
    }

    /// Shares caller-owned memory without copying (an `Arc<[T]>` the caller may
    /// keep reading; it never enters the pool). Read-only unless this was the only
    /// reference to the `Arc`. Any other owner (an mmap, ...) can be wrapped through
    /// [`Buffer`] and [`RawTensor::from_buffer`].
    ///
    /// # Errors
    /// As [`from_slice`](ExecContext::from_slice).
    pub fn from_shared<T: Element>(
        &self,
        shape: &[usize],
        values: Arc<[T]>,
    ) -> Result<RawTensor<T>, ExecError> {
        check_len("from_shared", shape, values.len())?;
        RawTensor::from_buffer(Buffer::from_arc(values), shape)
    }

    /// A contiguous pooled copy of `x` in logical row-major order (of any layout:
    /// strided, transposed, broadcast).
    ///
    /// # Errors
    /// [`ExecError::OutOfMemory`] if the pool cannot provide the memory (a
    /// broadcast view may be far larger than its storage): nothing is allocated
    /// then.
    pub fn materialize<T: Element>(&self, x: &RawTensor<T>) -> Result<RawTensor<T>, ExecError> {
        // The elementwise walk: coalesced axes, parallel above the threshold.
        self.map1("materialize", x, 1, |v: T| v)
    }

    /// `x` itself (a new handle, no copy) when it is contiguous, else a
    /// materialized copy (see [`materialize`](ExecContext::materialize)).
    ///
    /// # Errors
    /// [`ExecError::OutOfMemory`] if the copy cannot be had (a broadcast view may
    /// be far larger than its storage).
    pub fn contiguous<T: Element>(&self, x: &RawTensor<T>) -> Result<RawTensor<T>, ExecError> {
        if x.is_contiguous() {
            Ok(x.clone())
        } else {
            self.materialize(x)
        }
    }

    /// A deep copy (same as [`materialize`](ExecContext::materialize)): the result
    /// owns fresh pooled storage.
    ///
    /// # Errors
    /// [`ExecError::OutOfMemory`].
    pub fn clone<T: Element>(&self, x: &RawTensor<T>) -> Result<RawTensor<T>, ExecError> {
        self.materialize(x)
    }

    /// A zero-copy broadcast of `x` to `shape` (see [`RawTensor::broadcast_to`]).
    ///
    /// # Errors
    /// As [`RawTensor::broadcast_to`].
    pub fn broadcast_to<T: Element>(
        &self,
        x: &RawTensor<T>,
        shape: &[usize],
    ) -> Result<RawTensor<T>, ExecError> {
        x.broadcast_to(shape)
    }

    /// The [`LayoutClass`](crate::LayoutClass) of `x` (the dispatch key of the
    /// elementwise kernels).
    pub fn classify<T: Element>(&self, x: &RawTensor<T>) -> crate::LayoutClass {
        x.classify()
    }

    /// Converts any element type to f32 (see [`Element`] for the rules).
    ///
    /// # Errors
    /// [`ExecError::OutOfMemory`].
    pub fn cast_to_f32<T: Element>(&self, x: &RawTensor<T>) -> Result<RawTensor, ExecError> {
        self.map1("cast_to_f32", x, 1, T::to_f32)
    }

    /// Converts f32 to another element type (see [`Element`] for the rules).
    ///
    /// # Errors
    /// [`ExecError::OutOfMemory`].
    pub fn cast_from_f32<T: Element>(&self, x: &RawTensor) -> Result<RawTensor<T>, ExecError> {
        self.map1("cast_from_f32", x, 1, T::from_f32)
    }
}

fn check_len(op: &'static str, shape: &[usize], got: usize) -> Result<(), ExecError> {
    let n = check_shape(op, shape)?;
    if n != got {
        return Err(ExecError::InvalidDataLength {
            op,
            shape: crate::tensor::layout::Dims::new(shape),
            expected: n,
            got,
        });
    }
    Ok(())
}
