//! The one place this crate gets its concurrency primitives from.
//!
//! Normally these are `std` atomics, `std::sync::Arc` and `parking_lot::Mutex`. Under
//! `--cfg loom` they are loom's model-checked counterparts, so the refcount release
//! protocol of [`crate::Buffer`] and the pool's arms can be explored by
//! `tests/loom_refcount.rs` (the pattern of crossbeam-utils' `primitive` module).
//!
//! One deliberate exception: the four process-wide allocation counters of
//! [`crate::allocation_stats`] are `static`s, which need `const` constructors that
//! loom's atomics do not have. They are independent relaxed statistics (no protocol
//! hangs on them), so they use [`counter::AtomicUsize`], which is always `std`'s.

#[cfg(not(loom))]
pub(crate) use std::sync::Arc;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering, fence};

#[cfg(loom)]
pub(crate) use loom::sync::Arc;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering, fence};

/// Atomics for the process-wide counters (always `std`, see the module docs).
pub(crate) mod counter {
    pub(crate) use std::sync::atomic::{AtomicUsize, Ordering};
}

/// `parking_lot::Mutex` (no poisoning, `lock()` returns the guard directly).
#[cfg(not(loom))]
pub(crate) use parking_lot::Mutex;

/// A loom mutex with `parking_lot`'s signature (`lock()` returns the guard).
#[cfg(loom)]
#[derive(Debug)]
pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

/// The guard of the loom [`Mutex`].
#[cfg(loom)]
pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

#[cfg(loom)]
impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(loom::sync::Mutex::new(value))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        // A loom mutex is only poisoned when a model thread panicked, which already
        // fails the model.
        self.0.lock().expect("loom mutex poisoned")
    }
}

/// A marker for the data behind one buffer header, touched on every access to that
/// data: a read on every shared view (`&[T]`), a write on every mutable view, on
/// in-pool zeroing and when the storage is freed.
///
/// Normally a zero-sized no-op. Under `--cfg loom` it is a `loom::cell::UnsafeCell`,
/// so the models see the data accesses and report any read and write (or free) of a
/// buffer that the refcount and pool protocol leaves unordered: a weakened release
/// ordering fails a model instead of passing unnoticed.
#[cfg(not(loom))]
#[derive(Debug)]
pub(crate) struct DataCell;

#[cfg(not(loom))]
impl DataCell {
    pub(crate) fn new() -> Self {
        Self
    }

    #[inline(always)]
    pub(crate) fn read(&self) {}

    #[inline(always)]
    pub(crate) fn write(&self) {}
}

/// See the non-loom `DataCell`.
#[cfg(loom)]
#[derive(Debug)]
pub(crate) struct DataCell(loom::cell::UnsafeCell<()>);

#[cfg(loom)]
impl DataCell {
    pub(crate) fn new() -> Self {
        Self(loom::cell::UnsafeCell::new(()))
    }

    pub(crate) fn read(&self) {
        self.0.with(|_| ());
    }

    pub(crate) fn write(&self) {
        self.0.with_mut(|_| ());
    }
}

/// An `UnsafeCell` for state that one thread owns (a local pool tier), tracked by loom
/// under `--cfg loom`.
#[derive(Debug)]
pub(crate) struct LocalCell<T>(
    #[cfg(not(loom))] std::cell::UnsafeCell<T>,
    #[cfg(loom)] loom::cell::UnsafeCell<T>,
);

impl<T> LocalCell<T> {
    pub(crate) fn new(value: T) -> Self {
        #[cfg(not(loom))]
        return Self(std::cell::UnsafeCell::new(value));
        #[cfg(loom)]
        return Self(loom::cell::UnsafeCell::new(value));
    }

    /// Runs `f` on the value.
    ///
    /// # Safety
    /// No other access to the value happens meanwhile (no other thread, and `f` does not
    /// reach this cell again).
    pub(crate) unsafe fn with_mut<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        #[cfg(not(loom))]
        // SAFETY: exclusive access, forwarded to the caller.
        return f(unsafe { &mut *self.0.get() });
        #[cfg(loom)]
        // SAFETY: exclusive access, forwarded to the caller (and checked by loom).
        return self.0.with_mut(|p| f(unsafe { &mut *p }));
    }
}
