//! Refcounted, typed storage buffers.
//!
//! A [`Buffer<T>`] is a pointer to a heap [`Header`] holding the atomic refcount, the
//! data pointer and what to do when the count reaches zero. The header is not generic
//! (its data pointer is a byte pointer), so the pool can recycle headers across dtypes
//! together with the memory they describe.

use std::any::Any;
use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;
use std::ptr::NonNull;

use crate::aligned::AlignedBlock;
use crate::dtype::Scalar;
use crate::pool::PoolShared;
use crate::sync::{Arc, AtomicUsize, DataCell, Ordering, fence};
use crate::{DType, StorageError};

/// Which free list of a pool a header returns to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arm {
    /// Whole f32 buffer objects.
    F32,
    /// Untyped 4096-byte-rounded slabs (typed buffers and scratch leases).
    Slab,
}

impl Arm {
    /// The other arm.
    pub(crate) fn other(self) -> Arm {
        match self {
            Arm::F32 => Arm::Slab,
            Arm::Slab => Arm::F32,
        }
    }
}

/// Where a pooled header goes when its last reference drops. Set when a pool creates the
/// header and kept for the header's whole life, also while it sits in a free list, so a
/// hit and a release never touch the pool's `Arc` count. The resulting cycle (the free
/// lists hold headers that hold the pool state) is broken by the last
/// [`crate::BufferPool`] handle, whose drop empties the free lists and closes the pool
/// (see `PoolHandle` in `pool.rs`).
pub(crate) struct Home {
    pub(crate) shared: Arc<PoolShared>,
    pub(crate) arm: Arm,
}

/// What keeps the data alive. Never read: each variant is held for its `Drop`.
#[allow(dead_code)]
pub(crate) enum Storage {
    /// An owned aligned block (plain and pooled buffers).
    Block(AlignedBlock),
    /// Zero-copy: memory owned by something else (a `Vec`, an `Arc<[T]>`, an mmap),
    /// dropped with the header.
    Owner(Box<dyn Any + Send + Sync>),
    /// Zero-copy over memory inside the owner itself ([`Buffer::from_owner`]).
    Pinned(PinnedOwner),
    /// Zero-copy over `'static` memory: nothing to free.
    Static,
}

/// An owner moved to the heap and held by raw pointer until it drops. Unlike a `Box`,
/// which asserts unique access to its contents whenever it moves, this keeps
/// references into the owner (the buffer's data, for an owner that stores its elements
/// inline) valid while the header moves around.
pub(crate) struct PinnedOwner(NonNull<dyn Any + Send + Sync>);

impl PinnedOwner {
    /// Moves `owner` to the heap; the pointer stays valid until this drops.
    fn new<O: Any + Send + Sync>(owner: O) -> (Self, NonNull<O>) {
        let raw = NonNull::from(Box::leak(Box::new(owner)));
        (Self(raw), raw)
    }
}

// SAFETY: it owns an `O: Send + Sync` (like the `Box` it came from).
unsafe impl Send for PinnedOwner {}
// SAFETY: as above; nothing is reachable through `&PinnedOwner`.
unsafe impl Sync for PinnedOwner {}

impl Drop for PinnedOwner {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `Box::leak` in `new` and is freed only here.
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

/// The shared part of a buffer: refcount, data and release rule.
pub(crate) struct Header {
    /// Number of live handles. Zero while the header sits in a pool's free list.
    pub(crate) refs: AtomicUsize,
    /// Start of the data (64-aligned for blocks; aligned for the element type otherwise).
    pub(crate) data: NonNull<u8>,
    /// Usable bytes behind `data` (the slab or block size for pooled headers). A
    /// `Buffer<T>`'s length is `bytes / size_of::<T>()`, so a recycled header needs no
    /// per-dtype bookkeeping.
    pub(crate) bytes: usize,
    /// Whether a unique handle may write (false for shared or `'static` memory).
    pub(crate) writable: bool,
    #[allow(dead_code)]
    pub(crate) storage: Storage,
    /// `Some` for every header a pool made (handed out or cached): the release hook
    /// returns the header there.
    pub(crate) home: Option<Home>,
    /// The next header in a free list (pool-internal link, `None` while handed out).
    pub(crate) next: Option<NonNull<Header>>,
    /// Touched on every access to the data (a loom-tracked cell under `--cfg loom`).
    pub(crate) cell: DataCell,
}

/// Freeing the storage is a write as far as the loom models are concerned.
#[cfg(loom)]
impl Drop for Header {
    fn drop(&mut self) {
        self.cell.write();
    }
}

// SAFETY: the header owns (or keeps alive through a `Send + Sync` owner) the memory
// `data` points to; `refs` is atomic, and every other field is written only by whoever
// holds the header exclusively (its creator, the last releaser, or the pool under its
// lock), so it may move between threads and be shared.
unsafe impl Send for Header {}
// SAFETY: see `Send`; shared access only reads the immutable fields and the atomic.
unsafe impl Sync for Header {}

impl Header {
    /// A fresh header owning `block`, with one reference.
    pub(crate) fn with_block(block: AlignedBlock) -> Box<Header> {
        Box::new(Header {
            refs: AtomicUsize::new(1),
            data: block.non_null(),
            bytes: block.len(),
            writable: true,
            storage: Storage::Block(block),
            home: None,
            next: None,
            cell: DataCell::new(),
        })
    }
}

impl fmt::Debug for Header {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Header")
            .field("data", &self.data)
            .field("bytes", &self.bytes)
            .finish()
    }
}

/// Runs the release rule of a header whose last reference just went away: pooled
/// headers go back to their pool (this thread's local tier of it, else the shared
/// tier), everything else is freed (the block, or the owner of
/// borrowed memory, drops with the header).
pub(crate) fn release_header(hdr: Box<Header>) {
    match &hdr.home {
        Some(home) => {
            let (shared, arm) = (NonNull::from(&*home.shared), home.arm);
            // This thread's local tier of the same pool first (no lock), if any.
            if let Some(hdr) = crate::local::try_release(shared, arm, hdr) {
                // SAFETY: `shared` is the pool state `hdr.home` holds an `Arc` to, and
                // `hdr` (with that `Arc`) is moved into `reclaim`.
                unsafe { PoolShared::reclaim(shared, arm, hdr) }
            }
        }
        None => drop(hdr),
    }
}

/// A refcounted handle to typed tensor storage.
///
/// `Buffer<T>` (default `T = f32`) is one pointer wide. [`Clone`] is one atomic
/// increment and never allocates; dropping the last handle runs the buffer's release
/// rule exactly once:
///
/// | made by | data | when the last handle drops |
/// |---|---|---|
/// | [`crate::BufferPool`] acquires | pooled block (64-aligned) | back to its pool (header and data) |
/// | [`Buffer::zeroed`], [`Buffer::from_slice`] | owned block (64-aligned) | block and header freed |
/// | [`Buffer::from_vec`], [`Buffer::from_arc`], [`Buffer::from_owner`], [`Buffer::from_raw_parts_with_owner`], the `From` impls | borrowed (zero-copy) | header freed, owner dropped |
/// | [`Buffer::from_static`] | borrowed `'static` | header freed |
///
/// [`Buffer::len`] is the **capacity** in elements, which for pooled buffers may exceed
/// the request (a tensor uses the prefix its shape covers).
///
/// Reading is always safe ([`Deref`] to `[T]`): every buffer's memory is initialized
/// (fresh blocks are zeroed, recycled ones hold earlier values, `bool` memory is zeroed
/// on reuse). Writing needs proof that nobody else can read: [`Buffer::get_mut`]
/// succeeds only for a unique handle over writable memory, and [`Buffer::make_mut`]
/// copies first when it would not (copy-on-write). Kernels that fill a fresh
/// output from several threads use [`Buffer::as_mut_ptr`] under its documented contract.
///
/// ```
/// use fucina_storage::Buffer;
///
/// let mut a = Buffer::<f32>::from_slice(&[1.0, 2.0, 3.0])?;
/// a.get_mut().unwrap()[0] = 10.0; // unique: writable in place
/// let view = a.clone(); // an alias: +1 reference, no copy
/// assert!(a.get_mut().is_none()); // shared now: copy-on-write is the caller's move
/// drop(a); // the alias keeps the storage alive
/// assert_eq!(&view[..], &[10.0, 2.0, 3.0]);
/// assert!(view.is_unique());
/// # Ok::<(), fucina_storage::StorageError>(())
/// ```
#[repr(transparent)]
pub struct Buffer<T: Scalar = f32> {
    hdr: NonNull<Header>,
    _marker: PhantomData<T>,
}

// SAFETY: a `Buffer<T>` is shared ownership of `[T]` (like `Arc<[T]>`): the refcount is
// atomic, the release rule runs on exactly one thread, and `T: Scalar` is `Send + Sync`.
unsafe impl<T: Scalar> Send for Buffer<T> {}
// SAFETY: shared access gives `&[T]` (T: Sync) and atomic refcount updates only.
unsafe impl<T: Scalar> Sync for Buffer<T> {}

impl<T: Scalar> Buffer<T> {
    /// Wraps a header that carries one reference for this handle and whose data is
    /// aligned for `T` (the view is `hdr.bytes / size_of::<T>()` elements).
    pub(crate) fn from_header(hdr: Box<Header>) -> Self {
        debug_assert!(hdr.data.as_ptr().cast::<T>().is_aligned());
        Self {
            hdr: NonNull::from(Box::leak(hdr)),
            _marker: PhantomData,
        }
    }

    fn header(&self) -> &Header {
        // SAFETY: the header stays allocated while any handle (this one) holds a reference.
        unsafe { self.hdr.as_ref() }
    }

    fn bytes_for(len: usize) -> Result<usize, StorageError> {
        len.checked_mul(size_of::<T>())
            .ok_or(StorageError::SizeOverflow {
                len,
                element_size: size_of::<T>(),
            })
    }

    /// A plain buffer of `len` zeroed elements in a fresh 64-aligned block.
    ///
    /// # Errors
    /// [`StorageError::SizeOverflow`] if `len * size_of::<T>()` overflows; the errors of
    /// [`AlignedBlock::new`] otherwise.
    pub fn zeroed(len: usize) -> Result<Self, StorageError> {
        let block = AlignedBlock::new_zeroed(Self::bytes_for(len)?)?;
        Ok(Self::from_header(Header::with_block(block)))
    }

    /// A plain buffer holding a copy of `values` in a fresh 64-aligned block.
    ///
    /// # Errors
    /// As [`Buffer::zeroed`].
    pub fn from_slice(values: &[T]) -> Result<Self, StorageError> {
        let mut block = AlignedBlock::new(Self::bytes_for(values.len())?)?;
        // SAFETY: the block holds `values.len() * size_of::<T>()` bytes, is 64-aligned
        // (enough for any scalar) and is fresh, so it cannot overlap `values`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                values.as_ptr(),
                block.as_mut_ptr().cast::<T>(),
                values.len(),
            );
        }
        Ok(Self::from_header(Header::with_block(block)))
    }

    fn wrap(data: NonNull<T>, len: usize, writable: bool, storage: Storage) -> Self {
        Self::from_header(Box::new(Header {
            refs: AtomicUsize::new(1),
            data: data.cast(),
            bytes: len * size_of::<T>(),
            writable,
            storage,
            home: None,
            next: None,
            cell: DataCell::new(),
        }))
    }

    /// Zero-copy: takes ownership of `values` without copying (one small header
    /// allocation plus the boxed owner). The data is aligned for `T`, not to 64 bytes.
    /// The buffer is writable when unique; `len()` is `values.len()`.
    pub fn from_vec(values: Vec<T>) -> Self {
        let mut owner = Box::new(values);
        let len = owner.len();
        let data = NonNull::new(owner.as_mut_ptr()).expect("Vec pointers are non-null");
        // Moving the box moves the `Vec` header only; its heap data stays put.
        Self::wrap(data, len, true, Storage::Owner(owner))
    }

    /// Zero-copy: shares the memory of `values`. Writable (when unique) only if this was
    /// the sole reference to the `Arc` at wrap time; otherwise read-only, since others
    /// may read it through their own `Arc`.
    pub fn from_arc(mut values: std::sync::Arc<[T]>) -> Self {
        let len = values.len();
        let (data, writable) = match std::sync::Arc::get_mut(&mut values) {
            Some(unique) => (NonNull::from(unique).cast::<T>(), true),
            None => (NonNull::from(&*values).cast::<T>(), false),
        };
        Self::wrap(data, len, writable, Storage::Owner(Box::new(values)))
    }

    /// Zero-copy over `'static` memory (read-only: [`Buffer::get_mut`] returns `None`).
    pub fn from_static(values: &'static [T]) -> Self {
        Self::wrap(
            NonNull::from(values).cast::<T>(),
            values.len(),
            false,
            Storage::Static,
        )
    }

    /// Zero-copy, read-only, over the elements `owner` holds: a safe wrap for any owner
    /// that exposes its data as `[T]` (a `Vec`, a `Box<[T]>`, a memory-mapped file type,
    /// a `bytes::Bytes`-like handle...). The owner is moved to the heap first and
    /// `owner.as_ref()` is called once, there, so an owner that stores its elements
    /// inline (an array) works too; it is dropped with the last handle. The buffer is
    /// never writable ([`Buffer::get_mut`] returns `None`; [`Buffer::make_mut`] copies).
    ///
    /// ```
    /// use fucina_storage::Buffer;
    ///
    /// let b = Buffer::from_owner([1u16, 2, 3]); // the array moves into the buffer
    /// assert_eq!(&b[..], &[1, 2, 3]);
    /// assert!(!b.is_writable());
    /// ```
    pub fn from_owner<O: AsRef<[T]> + Send + Sync + 'static>(owner: O) -> Self {
        let (pinned, raw) = PinnedOwner::new(owner);
        // SAFETY: `raw` points at the owner just moved to the heap, alive until
        // `pinned` drops with the header.
        let values: &[T] = unsafe { raw.as_ref() }.as_ref();
        // The owner never moves again, and nothing else gets access to it until it
        // drops with the header, so the slice stays valid and unchanged while the buffer
        // lives.
        let (data, len) = (NonNull::from(values).cast::<T>(), values.len());
        Self::wrap(data, len, false, Storage::Pinned(pinned))
    }

    /// Zero-copy over memory kept alive by `owner` (an mmap, a foreign allocation...).
    /// The owner is dropped, on whichever thread releases the last handle, after which
    /// the memory is no longer used.
    ///
    /// # Safety
    /// - `data` is aligned for `T` and valid for reads of `len` initialized values of `T`
    ///   for as long as `owner` is alive, and `len * size_of::<T>()` fits in `isize`;
    /// - nothing writes to that memory while the buffer lives, except through this
    ///   buffer when `writable` is true;
    /// - if `writable` is true, `data` is valid for writes and nothing else reads or
    ///   writes the memory while the buffer lives.
    pub unsafe fn from_raw_parts_with_owner<O: Any + Send + Sync>(
        data: NonNull<T>,
        len: usize,
        owner: O,
        writable: bool,
    ) -> Self {
        Self::wrap(data, len, writable, Storage::Owner(Box::new(owner)))
    }

    /// The capacity in elements (may exceed what a pooled request asked for).
    pub fn len(&self) -> usize {
        // `bytes` is exact for plain buffers and wraps, a whole slab or size class for
        // pooled ones; `size_of::<T>()` is a power of two, so this is a shift.
        self.header().bytes / size_of::<T>()
    }

    /// Whether the capacity is zero.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The dtype of the elements.
    pub fn dtype(&self) -> DType {
        T::DTYPE
    }

    /// Pointer to the first element (64-aligned for pooled and plain buffers).
    pub fn as_ptr(&self) -> *const T {
        self.header().data.as_ptr().cast::<T>()
    }

    /// Pointer to the first element, for kernels that write into a fresh output.
    ///
    /// Obtaining the pointer is safe; **writing through it** is allowed only while:
    /// - the buffer [is writable](Buffer::is_writable) (plain or pooled, or a unique
    ///   zero-copy wrap that was made writable);
    /// - no other access (through this or any other handle, `&[T]` from [`Deref`], or
    ///   another thread) overlaps the elements being written for the duration of the
    ///   write — e.g. a fresh output whose handle is unique, split into disjoint chunks
    ///   between threads;
    /// - only valid values of `T` are written within `len()` elements (for `bool`: 0 or 1).
    pub fn as_mut_ptr(&self) -> *mut T {
        self.header().cell.write();
        self.header().data.as_ptr().cast::<T>()
    }

    /// The whole capacity as a slice.
    pub fn as_slice(&self) -> &[T] {
        self.header().cell.read();
        // SAFETY: `data` is aligned for `T` and points to `len` initialized values that
        // stay alive while this handle does; writes happen only through `get_mut`
        // (which needs `&mut self` of the unique handle) or the documented
        // `as_mut_ptr` contract, which excludes overlapping reads.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len()) }
    }

    /// Mutable access when this is the only handle and the memory is writable;
    /// `None` otherwise (the caller copies: copy-on-write).
    pub fn get_mut(&mut self) -> Option<&mut [T]> {
        if self.is_unique() && self.header().writable {
            // SAFETY: one reference exists and we hold it by `&mut`, so nobody can
            // clone it or read the data meanwhile; the memory is writable and holds
            // `len` initialized values.
            Some(unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), self.len()) })
        } else {
            None
        }
    }

    /// Copy-on-write mutable access (an associated function, as for `Arc::make_mut`, so
    /// it does not shadow a slice method): when `this` is the only handle of writable
    /// memory its data is returned in place; otherwise the data is first copied into a
    /// fresh buffer that replaces `this` (the other handles keep the old storage).
    ///
    /// Where the copy comes from:
    /// - a **pooled** buffer is copied into a buffer acquired from the same pool (the
    ///   same arm; a hit when that size class is cached). Its capacity is at least the
    ///   old one (first fit may hand back a larger cached buffer); elements past the old
    ///   capacity hold whatever the recycled memory held (zeroed for `bool`);
    /// - any other buffer (plain, zero-copy, `'static`) does not know a pool, so the copy
    ///   is a plain buffer over a fresh 64-aligned block ([`Buffer::from_slice`]) of the
    ///   same length.
    ///
    /// ```
    /// use fucina_storage::Buffer;
    ///
    /// static TABLE: [f32; 3] = [1.0, 2.0, 3.0];
    /// let mut b = Buffer::from_static(&TABLE); // read-only
    /// Buffer::make_mut(&mut b)?[0] = 10.0; // copied into a fresh block first
    /// assert_eq!((&b[..], TABLE[0]), (&[10.0, 2.0, 3.0][..], 1.0));
    ///
    /// let alias = b.clone();
    /// Buffer::make_mut(&mut b)?[1] = 20.0; // shared: copied again
    /// assert_eq!((alias[1], b[1]), (2.0, 20.0));
    /// let addr = b.as_ptr();
    /// Buffer::make_mut(&mut b)?[2] = 30.0; // unique and writable: in place
    /// assert_eq!(b.as_ptr(), addr);
    /// # Ok::<(), fucina_storage::StorageError>(())
    /// ```
    ///
    /// # Errors
    /// The allocation errors of the copy ([`Buffer::from_slice`], or a pool miss);
    /// `this` is unchanged then.
    pub fn make_mut(this: &mut Self) -> Result<&mut [T], StorageError> {
        if !(this.is_unique() && this.header().writable) {
            let copy = match &this.header().home {
                Some(home) => {
                    let mut fresh = PoolShared::acquire_typed::<T>(&home.shared, this.len())?;
                    let dst = fresh.get_mut().expect("a fresh pooled buffer is unique");
                    dst[..this.len()].copy_from_slice(this);
                    fresh
                }
                None => Self::from_slice(this)?,
            };
            *this = copy;
        }
        Ok(this
            .get_mut()
            .expect("unique and writable after the copy-on-write check"))
    }

    /// The whole capacity as a mutable slice, without the uniqueness check.
    ///
    /// # Safety
    /// The [`Buffer::as_mut_ptr`] contract for all `len()` elements, for the lifetime
    /// of the returned slice.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice_unchecked(&self) -> &mut [T] {
        // SAFETY: forwarded to the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), self.len()) }
    }

    /// Whether this is the only handle (an `Acquire` snapshot; meaningful when the
    /// caller controls every handle, e.g. holds this one by `&mut`).
    pub fn is_unique(&self) -> bool {
        self.header().refs.load(Ordering::Acquire) == 1
    }

    /// The number of live handles (a snapshot, for tests and diagnostics).
    pub fn ref_count(&self) -> usize {
        self.header().refs.load(Ordering::Acquire)
    }

    /// Whether a unique handle may write (false for read-only zero-copy wraps).
    pub fn is_writable(&self) -> bool {
        self.header().writable
    }

    /// Whether this buffer came from a [`crate::BufferPool`] and returns there (unless
    /// the pool's last handle is gone by then: a closed pool frees it instead).
    pub fn is_pooled(&self) -> bool {
        self.header().home.is_some()
    }

    /// Whether two handles share the same storage.
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        a.hdr == b.hdr
    }
}

impl<T: Scalar> Clone for Buffer<T> {
    /// One relaxed atomic increment; never allocates.
    fn clone(&self) -> Self {
        let old = self.header().refs.fetch_add(1, Ordering::Relaxed);
        // Like `Arc`: an absurd count means leaked clones; abort rather than wrap.
        if old > isize::MAX as usize {
            std::process::abort();
        }
        Self {
            hdr: self.hdr,
            _marker: PhantomData,
        }
    }
}

impl<T: Scalar> Drop for Buffer<T> {
    fn drop(&mut self) {
        let refs = &self.header().refs;
        // Fast path for the common unique handle (a pool hit dropped unshared): no
        // read-modify-write. Sound as `Arc::get_mut` is: we hold a handle by `&mut`, so
        // every clone made from it or its aliases happens-before this point (their
        // borrows have ended) and a count of 1 means ours is the only handle left (there
        // are no weak references), which nobody can clone any more. The `Acquire`
        // load reads from the `Release` decrement of the last other handle (or the
        // release sequence it ends), so all their data accesses happen before the
        // release rule, as with the fence below.
        if refs.load(Ordering::Acquire) == 1 {
            // Keep the "cached or freed headers have no references" invariant.
            refs.store(0, Ordering::Relaxed);
        } else {
            let prev = refs.fetch_sub(1, Ordering::Release);
            debug_assert!(prev > 0, "Buffer refcount underflow");
            if prev != 1 {
                return;
            }
            // Pairs with the `Release` decrements of the other handles: their accesses
            // to the data happen before the release rule runs.
            fence(Ordering::Acquire);
        }
        // SAFETY: the count went (or was seen at) 1 -> 0, so this was the last handle;
        // the header came from `Box::leak` in `from_header` and nobody else will touch it.
        let hdr = unsafe { Box::from_raw(self.hdr.as_ptr()) };
        release_header(hdr);
    }
}

impl<T: Scalar> Deref for Buffer<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        self.as_slice()
    }
}

/// Zero-copy, as [`Buffer::from_vec`].
impl<T: Scalar> From<Vec<T>> for Buffer<T> {
    fn from(values: Vec<T>) -> Self {
        Self::from_vec(values)
    }
}

/// Zero-copy, as [`Buffer::from_arc`].
impl<T: Scalar> From<std::sync::Arc<[T]>> for Buffer<T> {
    fn from(values: std::sync::Arc<[T]>) -> Self {
        Self::from_arc(values)
    }
}

/// Zero-copy and read-only, as [`Buffer::from_static`].
impl<T: Scalar> From<&'static [T]> for Buffer<T> {
    fn from(values: &'static [T]) -> Self {
        Self::from_static(values)
    }
}

impl<T: Scalar> AsRef<[T]> for Buffer<T> {
    fn as_ref(&self) -> &[T] {
        self.as_slice()
    }
}

impl<T: Scalar> fmt::Debug for Buffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("dtype", &T::DTYPE)
            .field("len", &self.len())
            .field("ptr", &self.as_ptr())
            .field("refs", &self.ref_count())
            .field("pooled", &self.is_pooled())
            .field("writable", &self.is_writable())
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize as StdAtomic;

    struct DropCounter(std::sync::Arc<StdAtomic>, Vec<u16>);
    impl Drop for DropCounter {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn plain_constructors() {
        let z = Buffer::<i32>::zeroed(5).unwrap();
        assert_eq!(&z[..], &[0; 5]);
        assert_eq!(z.as_ptr() as usize % 64, 0);
        assert_eq!(z.dtype(), DType::I32);
        let s = Buffer::from_slice(&[1u16, 2, 3]).unwrap();
        assert_eq!(&*s, &[1, 2, 3]);
        assert!(!s.is_pooled() && s.is_writable());
        let e = Buffer::<f64>::from_slice(&[]).unwrap();
        assert!(e.is_empty());
        assert!(matches!(
            Buffer::<f64>::zeroed(usize::MAX / 4),
            Err(StorageError::SizeOverflow { len, element_size: 8 }) if len == usize::MAX / 4
        ));
        let b = Buffer::<bool>::zeroed(3).unwrap();
        assert_eq!(&b[..], &[false; 3]);
    }

    #[test]
    fn clone_and_uniqueness() {
        let mut a = Buffer::<f32>::zeroed(4).unwrap();
        assert!(a.is_unique());
        a.get_mut().unwrap().copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
        let b = a.clone();
        assert_eq!(a.ref_count(), 2);
        assert!(Buffer::ptr_eq(&a, &b));
        assert!(a.get_mut().is_none());
        drop(b);
        assert!(a.get_mut().is_some());
        assert_eq!(&a[..], &[1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn zero_copy_wraps_drop_their_owner_once() {
        let v = vec![1.5f32, 2.5];
        let ptr = v.as_ptr();
        let mut b = Buffer::from_vec(v);
        assert_eq!(b.as_ptr(), ptr, "from_vec must not copy");
        b.get_mut().unwrap()[1] = 7.0;
        assert_eq!(&b[..], &[1.5, 7.0]);

        let arc: std::sync::Arc<[i64]> = vec![4, 5, 6].into();
        let keep = arc.clone();
        let mut shared = Buffer::from_arc(arc);
        assert_eq!(shared.as_ptr(), keep.as_ptr());
        assert!(!shared.is_writable() && shared.get_mut().is_none());
        drop(shared);
        assert_eq!(std::sync::Arc::strong_count(&keep), 1);
        let mut sole = Buffer::from_arc(keep);
        assert!(sole.get_mut().is_some());

        let mut st = Buffer::from_static(&[1u8, 2, 3]);
        assert!(st.get_mut().is_none());
        assert_eq!(&st[..], &[1, 2, 3]);

        let drops = std::sync::Arc::new(StdAtomic::new(0));
        let mut owner = DropCounter(drops.clone(), vec![9, 8, 7]);
        let data = NonNull::new(owner.1.as_mut_ptr()).unwrap();
        // SAFETY: `data` points at the owner's 3 initialized u16, which live (and are
        // not touched elsewhere) until the owner drops; read-only.
        let b = unsafe { Buffer::from_raw_parts_with_owner(data, 3, owner, false) };
        let clones: Vec<_> = (0..8).map(|_| b.clone()).collect();
        drop(b);
        let handles: Vec<_> = clones
            .into_iter()
            .map(|c| std::thread::spawn(move || assert_eq!(&c[..], &[9, 8, 7])))
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }
}
