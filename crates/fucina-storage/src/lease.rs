//! Scratch leases: pooled slabs viewed as `[T]` for any plain-old-data `T`.

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use crate::buffer::{Header, release_header};
use crate::sync::Ordering;

/// Exactly `len` items of `T` over a pooled, 64-aligned, 4096-byte-rounded slab,
/// from [`crate::BufferPool::acquire_scratch`].
///
/// The lease owns its slab exclusively: it derefs to `[T]` and `[T]` mutably. The slab
/// goes back to the pool when the lease is dropped or [`ScratchLease::release`]d —
/// exactly once, enforced by ownership — on whichever thread that happens (the lease is
/// `Send` when `T` is).
///
/// ```
/// use fucina_storage::BufferPool;
///
/// let pool = BufferPool::new();
/// let mut lease = pool.acquire_scratch::<[u8; 18]>(10)?; // e.g. ten packed q4_0 blocks
/// assert_eq!(lease.len(), 10);
/// lease[3] = [7; 18];
/// std::thread::spawn(move || lease.release()).join().unwrap();
/// assert_eq!((pool.outstanding_buffers(), pool.cached_slabs()), (0, 1));
/// # Ok::<(), fucina_storage::StorageError>(())
/// ```
pub struct ScratchLease<T: bytemuck::Pod> {
    /// The slab's header (home = the pool's slab arm), owned exclusively.
    hdr: NonNull<Header>,
    len: usize,
    _marker: PhantomData<T>,
}

// SAFETY: the lease exclusively owns its slab (like a `Box<[T]>`), and releasing it from
// another thread is part of the pool's contract (the pool state is behind a mutex).
unsafe impl<T: bytemuck::Pod + Send> Send for ScratchLease<T> {}
// SAFETY: `&ScratchLease` only gives `&[T]`.
unsafe impl<T: bytemuck::Pod + Sync> Sync for ScratchLease<T> {}

impl<T: bytemuck::Pod> ScratchLease<T> {
    /// Wraps a checked-out slab header of at least `len * size_of::<T>()` bytes.
    pub(crate) fn new(hdr: Box<Header>, len: usize) -> Self {
        assert!(len * size_of::<T>() <= hdr.bytes, "scratch slab too small");
        // A lease is not refcounted: the count stays 0, as for every cached header.
        hdr.refs.store(0, Ordering::Relaxed);
        Self {
            hdr: NonNull::from(Box::leak(hdr)),
            len,
            _marker: PhantomData,
        }
    }

    fn header(&self) -> &Header {
        // SAFETY: the lease owns the header until drop.
        unsafe { self.hdr.as_ref() }
    }

    /// The number of items (exactly the request, not the rounded slab size).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the lease has no items (never, since zero-length requests are refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of the underlying slab (a multiple of 4096).
    pub fn slab_bytes(&self) -> usize {
        self.header().bytes
    }

    /// The items.
    pub fn as_slice(&self) -> &[T] {
        self.header().cell.read();
        // SAFETY: the slab is 64-aligned (T's alignment is <= 64), holds at least `len`
        // items' worth of initialized bytes (zeroed when fresh, written with Pod values
        // since), any bit pattern is a valid `T` (Pod), and the lease owns it.
        unsafe { std::slice::from_raw_parts(self.header().data.as_ptr().cast::<T>(), self.len) }
    }

    /// The items, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        self.header().cell.write();
        // SAFETY: as `as_slice`, and `&mut self` gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.header().data.as_ptr().cast::<T>(), self.len) }
    }

    /// Returns the slab to the pool now (same as dropping the lease).
    pub fn release(self) {
        drop(self);
    }
}

impl<T: bytemuck::Pod> Drop for ScratchLease<T> {
    fn drop(&mut self) {
        // SAFETY: the header came from `Box::leak` in `new` and the lease owns it; this
        // runs once.
        let hdr = unsafe { Box::from_raw(self.hdr.as_ptr()) };
        release_header(hdr);
    }
}

impl<T: bytemuck::Pod> Deref for ScratchLease<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        self.as_slice()
    }
}

impl<T: bytemuck::Pod> DerefMut for ScratchLease<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.as_mut_slice()
    }
}

impl<T: bytemuck::Pod> fmt::Debug for ScratchLease<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScratchLease")
            .field("len", &self.len)
            .field("slab_bytes", &self.slab_bytes())
            .field("ptr", &self.header().data)
            .finish()
    }
}
