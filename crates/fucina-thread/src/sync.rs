//! The one shim every atomic, lock, park, cell, thread-local and thread spawn of
//! this crate goes through (the shape of crossbeam-utils' `primitive` module).
//!
//! Normally these are `std` items (and the futex-style [`WaitWord`] of
//! `team/park.rs`); under `cfg(loom)` they are loom's model-checked
//! counterparts, so `tests/loom_*.rs` explore the real protocol code.
//!
//! Loom-only adjustments, documented where they are used:
//! - the team's no-lost-wake-up handshake uses only acquire/release RMWs on one
//!   word (`parked`; team/README.md, P1), which loom models exactly, so it needs
//!   no `SeqCst` (loom weakens `SeqCst` accesses to `AcqRel`, its issue #180);
//! - spin budgets are capped by [`model_spin_cap`];
//! - a futex cannot be modelled directly, so under loom [`WaitWord`] is a
//!   "sleep only while the word still equals the expected value" primitive built
//!   from a loom `Mutex` + `Condvar`, and a timed wait is a yield (a timeout that
//!   fires at once, which the protocol must tolerate anyway).

#![allow(unused_imports)]

#[cfg(not(loom))]
pub(crate) use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
    },
    thread::JoinHandle,
    thread_local,
};

#[cfg(loom)]
pub(crate) use loom::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
    },
    thread::JoinHandle,
    thread_local,
};

#[cfg(not(loom))]
pub(crate) use crate::team::park::WaitWord;

/// A spin-wait hint (`PAUSE`/`YIELD`); a yield under loom.
#[inline(always)]
pub(crate) fn spin_loop() {
    #[cfg(not(loom))]
    std::hint::spin_loop();
    #[cfg(loom)]
    loom::hint::spin_loop();
}

/// Gives up the rest of the time slice.
pub(crate) fn yield_now() {
    #[cfg(not(loom))]
    std::thread::yield_now();
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// Spawns a named thread; the error is the OS refusal.
pub(crate) fn spawn<F>(name: String, f: F) -> std::io::Result<JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
{
    #[cfg(not(loom))]
    {
        std::thread::Builder::new().name(name).spawn(f)
    }
    #[cfg(loom)]
    {
        loom::thread::Builder::new().name(name).spawn(f)
    }
}

/// Caps a spin budget under loom (every spin hint is a scheduling point there,
/// so a budget of 32768 would explode the state space); the identity otherwise.
#[inline(always)]
pub(crate) fn model_spin_cap(budget: u32) -> u32 {
    #[cfg(loom)]
    {
        budget.min(1)
    }
    #[cfg(not(loom))]
    {
        budget
    }
}

/// An `UnsafeCell` with loom's closure API (`with`/`with_mut`), so loom can
/// check that the dispatcher never writes a job descriptor a worker still reads.
#[cfg(not(loom))]
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    pub(crate) const fn new(v: T) -> Self {
        Self(std::cell::UnsafeCell::new(v))
    }
    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }
    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;

/// The loom model of a futex word: `wait(expected)` sleeps only while the word
/// still equals `expected`, re-checked under the lock that `wake_all` takes,
/// which is exactly the atomicity the kernel's futex hash-bucket lock gives.
/// The compare is a relaxed load: the team's proofs (team/README.md, P1) do
/// not rely on the barriers the kernel puts around it.
#[cfg(loom)]
#[derive(Debug)]
pub(crate) struct WaitWord {
    word: AtomicU32,
    lock: loom::sync::Mutex<()>,
    cv: loom::sync::Condvar,
}

#[cfg(loom)]
impl WaitWord {
    pub(crate) fn new(v: u32) -> Self {
        Self {
            word: AtomicU32::new(v),
            lock: loom::sync::Mutex::new(()),
            cv: loom::sync::Condvar::new(),
        }
    }
    pub(crate) fn word(&self) -> &AtomicU32 {
        &self.word
    }
    pub(crate) fn wait(&self, expected: u32) {
        let guard = self.lock.lock().unwrap();
        if self.word.load(Ordering::Relaxed) == expected {
            drop(self.cv.wait(guard).unwrap());
        }
    }
    /// A timed wait that "times out" at once: a yield.
    pub(crate) fn wait_timeout(&self, _expected: u32, _timeout: std::time::Duration) {
        loom::thread::yield_now();
    }
    pub(crate) fn wake_all(&self) {
        drop(self.lock.lock().unwrap());
        self.cv.notify_all();
    }
}
