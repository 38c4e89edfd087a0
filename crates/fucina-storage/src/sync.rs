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
pub(crate) use std::sync::atomic::{AtomicUsize, Ordering, fence};

#[cfg(loom)]
pub(crate) use loom::sync::Arc;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicUsize, Ordering, fence};

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
