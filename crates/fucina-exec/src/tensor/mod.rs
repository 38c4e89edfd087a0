//! [`RawTensor`]: refcounted storage plus an inline layout.

pub(crate) mod construct;
pub(crate) mod element;
pub(crate) mod layout;
pub(crate) mod view;

use std::fmt;

use fucina_storage::Buffer;

use crate::error::ExecError;
pub use element::Element;
use layout::{Dims, Layout, LayoutClass};

/// A tensor without autograd state: refcounted storage ([`Buffer<T>`]) plus a shape,
/// strides (in elements) and an element offset, rank 1 to 8, stored inline.
///
/// `RawTensor` (no type argument) is the `f32` tensor every op works on;
/// `RawTensor<i64>`, `RawTensor<half::f16>`... are the typed tensors (indices,
/// labels, masks, half-precision storage).
///
/// A handle is an immutable value: cloning it is one atomic increment and shares the
/// storage, views ([`reshape`](RawTensor::reshape), [`narrow`](RawTensor::narrow),
/// [`transpose`](RawTensor::transpose), ...) are new handles over the same storage,
/// and a view may outlive the tensor it was taken from. Mutation goes through
/// `&mut self` and is copy-on-write ([`data_mut`](RawTensor::data_mut)). Handles are
/// `Send + Sync`: they may cross threads even though the context that made them is
/// driven from one thread at a time.
///
/// ```
/// use fucina_exec::ExecContext;
///
/// let ctx = ExecContext::new();
/// let x = ctx.from_slice(&[2, 3], &[1., 2., 3., 4., 5., 6.])?;
/// let t = x.transpose(0, 1)?; // a view: no copy
/// assert_eq!(t.shape(), [3, 2]);
/// assert_eq!(t.to_vec(), [1., 4., 2., 5., 3., 6.]);
/// assert!(t.data().is_err()); // not contiguous
/// assert_eq!(ctx.materialize(&t)?.data()?, [1., 4., 2., 5., 3., 6.]);
/// # Ok::<(), fucina_exec::ExecError>(())
/// ```
#[derive(Clone)]
pub struct RawTensor<T: Element = f32> {
    buf: Buffer<T>,
    layout: Layout,
    /// The storage elements `0..extent` that hold this tensor family's values:
    /// the element count of the tensor the storage was made for, shared by its
    /// views. A pooled buffer may be longer (a size class); the rest holds
    /// values of earlier tensors and no view may reach it.
    extent: usize,
}

impl<T: Element> RawTensor<T> {
    /// A tensor over fresh storage `buf` with `layout`, whose values are the
    /// storage elements the layout reaches; the caller has checked that the
    /// layout fits.
    pub(crate) fn from_parts(buf: Buffer<T>, layout: Layout) -> Self {
        debug_assert!(layout.end_index() <= buf.len());
        let extent = layout.end_index();
        RawTensor {
            buf,
            layout,
            extent,
        }
    }

    /// A view: `layout` over this tensor's storage (checked to fit its extent
    /// by the caller). The one constructor of the zero-copy views in `view.rs`.
    fn view(&self, layout: Layout) -> Self {
        debug_assert!(layout.end_index() <= self.extent);
        RawTensor {
            buf: self.buf.clone(),
            layout,
            extent: self.extent,
        }
    }

    /// Wraps a whole buffer (zero-copy) as a contiguous tensor of `shape`. The buffer
    /// may be larger than needed (a pooled size class); the tensor uses its first
    /// `numel` elements, and no view of it reaches past them.
    ///
    /// # Errors
    /// The shape errors of the constructors; [`ExecError::InvalidDataLength`] if the
    /// buffer holds fewer elements than the shape needs.
    pub fn from_buffer(buf: Buffer<T>, shape: &[usize]) -> Result<Self, ExecError> {
        let layout = Layout::contiguous("from_buffer", shape)?;
        let need = layout.numel();
        if buf.len() < need {
            return Err(ExecError::InvalidDataLength {
                op: "from_buffer",
                shape: layout.dims(),
                expected: need,
                got: buf.len(),
            });
        }
        Ok(RawTensor {
            buf,
            layout,
            extent: need,
        })
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        self.layout.shape()
    }

    /// The shape as an inline value.
    pub fn dims(&self) -> Dims {
        self.layout.dims()
    }

    /// The strides, in elements (0 on broadcast axes).
    pub fn strides(&self) -> &[usize] {
        self.layout.strides()
    }

    /// Offset of the first element in the storage, in elements.
    pub fn offset(&self) -> usize {
        self.layout.offset()
    }

    /// Number of dimensions (1 to 8).
    pub fn rank(&self) -> usize {
        self.layout.rank()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.layout.numel()
    }

    /// The layout (shape, strides, offset).
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The storage handle.
    pub fn buffer(&self) -> &Buffer<T> {
        &self.buf
    }

    /// Strict row-major contiguity (every axis of size above 1 has the row-major
    /// stride).
    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }

    /// The [`LayoutClass`] of this tensor.
    pub fn classify(&self) -> LayoutClass {
        self.layout.classify()
    }

    /// Whether two tensors share the same storage.
    pub fn same_storage(&self, other: &RawTensor<T>) -> bool {
        Buffer::ptr_eq(&self.buf, &other.buf)
    }

    /// The elements in row-major order, borrowed from the storage.
    ///
    /// # Errors
    /// [`ExecError::UnsupportedView`] if the tensor is not contiguous (materialize it
    /// first, or use [`to_vec`](RawTensor::to_vec)).
    pub fn data(&self) -> Result<&[T], ExecError> {
        if !self.is_contiguous() {
            return Err(ExecError::UnsupportedView {
                op: "data",
                reason: "the tensor is not contiguous; materialize it first",
            });
        }
        Ok(self.contiguous_slice())
    }

    /// The storage range of a contiguous tensor.
    pub(crate) fn contiguous_slice(&self) -> &[T] {
        let o = self.layout.offset();
        &self.buf[o..o + self.numel()]
    }

    /// The number of storage elements this tensor and its views may reach (the
    /// element count of the tensor the storage was made for; a pooled buffer may
    /// be longer).
    pub fn storage_extent(&self) -> usize {
        self.extent
    }

    /// The elements in logical row-major order, copied into a `Vec`.
    ///
    /// # Panics
    /// If the memory for [`numel`](RawTensor::numel) elements cannot be had. A
    /// zero-copy view (a broadcast) may have far more elements than its storage:
    /// use [`try_to_vec`](RawTensor::try_to_vec) where that can happen.
    pub fn to_vec(&self) -> Vec<T> {
        match self.try_to_vec() {
            Ok(v) => v,
            Err(e) => panic!(
                "RawTensor::to_vec needs memory for all {} elements of the tensor ({e}); \
                 use try_to_vec to get this as an Err",
                self.numel()
            ),
        }
    }

    /// [`to_vec`](RawTensor::to_vec), taking its memory fallibly.
    ///
    /// # Errors
    /// [`ExecError::OutOfMemory`] (op `to_vec`) if the `Vec` cannot be allocated.
    pub fn try_to_vec(&self) -> Result<Vec<T>, ExecError> {
        let n = self.numel();
        let mut out = Vec::new();
        out.try_reserve_exact(n).map_err(|_| {
            let size = std::mem::size_of::<T>();
            let source = match n.checked_mul(size) {
                Some(bytes) if isize::try_from(bytes).is_ok() => {
                    fucina_storage::StorageError::AllocationFailed { bytes }
                }
                Some(bytes) => fucina_storage::StorageError::TooLarge { bytes },
                None => fucina_storage::StorageError::SizeOverflow {
                    len: n,
                    element_size: size,
                },
            };
            ExecError::OutOfMemory {
                op: "to_vec",
                source,
            }
        })?;
        out.resize(n, T::ZERO);
        self.copy_into(&mut out)?;
        Ok(out)
    }

    /// Copies the elements in logical row-major order into `dst` (any layout:
    /// strided, transposed, broadcast). Allocates nothing.
    ///
    /// # Errors
    /// [`ExecError::InvalidDataLength`] if `dst.len()` is not the element count
    /// (`dst` is left untouched).
    pub fn copy_into(&self, dst: &mut [T]) -> Result<(), ExecError> {
        if dst.len() != self.numel() {
            return Err(ExecError::InvalidDataLength {
                op: "copy_into",
                shape: self.dims(),
                expected: self.numel(),
                got: dst.len(),
            });
        }
        if self.is_contiguous() {
            dst.copy_from_slice(self.contiguous_slice());
            return Ok(());
        }
        let src: &[T] = &self.buf;
        let mut k = 0;
        self.layout.for_each_index(|i| {
            dst[k] = src[i];
            k += 1;
        });
        Ok(())
    }

    /// The value of a one-element tensor.
    ///
    /// # Errors
    /// [`ExecError::InvalidShape`] if the tensor has more than one element.
    pub fn item(&self) -> Result<T, ExecError> {
        if self.numel() != 1 {
            return Err(ExecError::InvalidShape {
                op: "item",
                shape: self.dims(),
                reason: "item() needs exactly one element",
            });
        }
        Ok(self.buf[self.layout.offset()])
    }

    /// Whether this handle can write its elements in place: contiguous, the only
    /// handle to its storage, and the storage is writable.
    pub fn is_unique(&self) -> bool {
        self.buf.is_unique() && self.buf.is_writable()
    }

    /// Mutable access to the elements, copy-on-write.
    ///
    /// If the storage is shared (another handle or view exists), read-only, or this
    /// tensor is not contiguous, the elements are first copied into fresh storage
    /// owned by this handle alone (a plain 64-byte-aligned block, or from the same
    /// pool when the storage is pooled); other handles keep seeing the old values.
    ///
    /// # Errors
    /// [`ExecError::OutOfMemory`] if the copy cannot be allocated.
    pub fn data_mut(&mut self) -> Result<&mut [T], ExecError> {
        if !(self.is_contiguous() && self.is_unique()) {
            let n = self.numel();
            let mut fresh =
                Buffer::<T>::zeroed(n).map_err(|e| ExecError::storage("data_mut", e))?;
            self.copy_into(&mut fresh.get_mut().expect("a fresh buffer is unique")[..n])?;
            self.layout = Layout::contiguous_unchecked(self.shape());
            self.buf = fresh;
            self.extent = n;
        }
        let o = self.layout.offset();
        let n = self.numel();
        Ok(&mut self.buf.get_mut().expect("checked: unique and writable")[o..o + n])
    }
}

impl<T: Element> fmt::Debug for RawTensor<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("RawTensor");
        d.field("dtype", &T::DTYPE)
            .field("shape", &self.shape())
            .field("strides", &self.strides())
            .field("offset", &self.offset());
        if self.numel() <= 16 {
            d.field("values", &self.to_vec());
        }
        d.finish()
    }
}
