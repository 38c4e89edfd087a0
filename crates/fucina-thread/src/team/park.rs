//! Futex-style waiting on a 32-bit word: sleep only while the word still equals
//! an expected value; wake every sleeper after changing it.
//!
//! Two backends implement the same contract:
//! - [`futex`] (Linux): `FUTEX_WAIT_PRIVATE` / `FUTEX_WAKE_PRIVATE` through
//!   `libc::syscall(SYS_futex)`. The kernel compares the word with the expected
//!   value under its hash-bucket lock, so a change + wake can never fall between
//!   the compare and the sleep.
//! - [`keyed`] (everywhere): `parking_lot_core::park`/`unpark_all` keyed on the
//!   word's address; the validation closure re-reads the word under the bucket lock.
//!
//! Linux uses the raw futex. The `park_wake` group of `benches/dispatch.rs`
//! measures the wake round trip of both; on the 2-core development VM they were
//! equal within noise (about 2.1 us median each), so the choice rests on
//! simplicity: the raw futex is one syscall per wait/wake with no user-space
//! queue, bucket table or per-thread parker state. Other targets use the keyed
//! backend. Under `cfg(loom)` neither is used (see `sync.rs`).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// The raw Linux futex backend.
#[cfg(target_os = "linux")]
pub mod futex {
    use super::{AtomicU32, Duration};

    /// Sleeps while `*word == expected`, at most `timeout` when given.
    /// Returns on a wake, a timeout, a signal or a value mismatch (callers loop).
    #[inline]
    pub fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
        let ts = timeout.map(|d| libc::timespec {
            tv_sec: d.as_secs().try_into().unwrap_or(libc::time_t::MAX),
            tv_nsec: d.subsec_nanos().into(),
        });
        let ts_ptr = ts
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: `word.as_ptr()` is a valid, aligned u32 for the duration of the
        // call (the reference keeps it alive); FUTEX_WAIT only reads it. `ts_ptr`
        // is null or points to a live timespec (relative timeout, as FUTEX_WAIT
        // expects). The unused uaddr2/val3 arguments are ignored by FUTEX_WAIT.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                expected,
                ts_ptr,
            );
        }
    }

    /// Wakes every thread sleeping on `word`.
    #[inline]
    pub fn wake_all(word: &AtomicU32) {
        // SAFETY: FUTEX_WAKE only uses the address as a key; it is a live,
        // aligned u32. No memory is read or written through it.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                i32::MAX,
            );
        }
    }
}

/// The portable `parking_lot_core` backend (address-keyed parking).
pub mod keyed {
    use super::{AtomicU32, Duration, Ordering};

    /// Sleeps while `*word == expected`, at most `timeout` when given.
    #[inline]
    pub fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
        let key = word.as_ptr() as usize;
        let deadline = timeout.map(|d| std::time::Instant::now() + d);
        // SAFETY: parking_lot_core requires that the callbacks do not panic and do
        // not call park/unpark themselves: `validate` is one atomic load, the
        // others are empty. The key is the word's address, unique while it lives.
        unsafe {
            parking_lot_core::park(
                key,
                || word.load(Ordering::SeqCst) == expected,
                || {},
                |_, _| {},
                parking_lot_core::DEFAULT_PARK_TOKEN,
                deadline,
            );
        }
    }

    /// Wakes every thread sleeping on `word`.
    #[inline]
    pub fn wake_all(word: &AtomicU32) {
        // SAFETY: the key is a live word's address; no callback is involved.
        unsafe {
            parking_lot_core::unpark_all(
                word.as_ptr() as usize,
                parking_lot_core::DEFAULT_UNPARK_TOKEN,
            );
        }
    }
}

#[cfg(target_os = "linux")]
use futex as backend;
#[cfg(not(target_os = "linux"))]
use keyed as backend;

/// A 32-bit atomic word that threads can sleep on (the generation and `done`
/// words of the team protocol).
#[derive(Debug)]
pub(crate) struct WaitWord {
    word: AtomicU32,
}

impl WaitWord {
    pub(crate) const fn new(v: u32) -> Self {
        Self {
            word: AtomicU32::new(v),
        }
    }

    /// The word itself.
    #[inline(always)]
    pub(crate) fn word(&self) -> &AtomicU32 {
        &self.word
    }

    /// Sleeps while the word equals `expected` (may return spuriously).
    #[inline]
    pub(crate) fn wait(&self, expected: u32) {
        backend::wait(&self.word, expected, None);
    }

    /// Sleeps while the word equals `expected`, at most `timeout`.
    #[inline]
    pub(crate) fn wait_timeout(&self, expected: u32, timeout: Duration) {
        backend::wait(&self.word, expected, Some(timeout));
    }

    /// Wakes every sleeper.
    #[inline]
    pub(crate) fn wake_all(&self) {
        backend::wake_all(&self.word);
    }
}
