//! [`Probe`]: which exceptions did a region raise?

use core::marker::PhantomData;

use crate::{Exceptions, raise_exceptions, test_exceptions};

/// Measures which exception flags a region of code raised on the calling
/// thread, without erasing what was raised before it.
///
/// * [`Probe::begin`] saves the accrued flags as "outer" and clears them.
/// * [`Probe::sample`] returns the flags raised since `begin`, without
///   stopping.
/// * [`Probe::end`] returns the flags raised since `begin` and then writes
///   back their union with the saved outer flags, so the enclosing region's
///   history is preserved.
/// * A probe dropped without `end` (early return, `?`, a panic unwinding
///   through it) merges back exactly as `end` would and discards the result,
///   so an outer probe or the thread's accrued flags never lose history.
///
/// Probes nest: an inner probe reports only its own region, and the outer
/// probe's `end` reports both what was raised before the inner probe and what
/// was raised inside it.
///
/// Flags are per thread: a probe around a parallel operation sees only the
/// calling thread's flags, not those of worker threads. On unsupported
/// targets every probe reports [`Exceptions::NONE`].
///
/// **The flags are diagnostic, never a correctness signal.** The compiler
/// does not model the status register: it may constant-fold, hoist, sink or
/// delete floating-point operations across `begin`/`end`, so a flag may be
/// missing (folded at compile time) or come from code just outside the
/// region. Inputs and outputs passed through [`std::hint::black_box`] make a
/// region's operations happen inside it in practice; exact accounting needs
/// the operations and the flag reads in one `asm!` block.
///
/// Like [`Guard`](crate::Guard), a probe is neither `Send` nor `Sync`.
///
/// ```
/// use std::hint::black_box;
/// use fucina_fpenv::Probe;
///
/// let probe = Probe::begin();
/// let huge = black_box(3.0e38_f32);
/// black_box(huge * huge);
/// let raised = probe.end();
/// if fucina_fpenv::SUPPORTED {
///     assert!(raised.overflow);
///     assert!(raised.any_significant());
/// }
/// ```
#[derive(Debug)]
#[must_use = "a probe measures until `end` (or its drop); bind it to a variable"]
pub struct Probe {
    outer: Exceptions,
    finished: bool,
    _per_thread: PhantomData<*const ()>,
}

impl Probe {
    /// Saves the accrued flags as the outer history and clears them.
    pub fn begin() -> Probe {
        let outer = test_exceptions();
        raise_exceptions(Exceptions::NONE);
        Probe {
            outer,
            finished: false,
            _per_thread: PhantomData,
        }
    }

    /// The flags raised since [`Probe::begin`] (by this thread), so far.
    pub fn sample(&self) -> Exceptions {
        test_exceptions()
    }

    /// The flags raised since [`Probe::begin`]; afterwards the thread's
    /// accrued flags are those plus the outer history saved by `begin`.
    pub fn end(mut self) -> Exceptions {
        self.finish()
    }

    fn finish(&mut self) -> Exceptions {
        let raised = test_exceptions();
        if !self.finished {
            self.finished = true;
            raise_exceptions(raised.union_with(self.outer));
        }
        raised
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        if !self.finished {
            self.finish();
        }
    }
}
