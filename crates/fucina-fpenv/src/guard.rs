//! [`Guard`]: put the control state back at the end of a scope.

use core::fmt;
use core::marker::PhantomData;

use crate::backend::{Backend, Imp};
use crate::{Environment, Exceptions};

/// Snapshots the calling thread's rounding and underflow control and its
/// exception masks, and puts them back when restored or dropped: Fortran's rule that a procedure changing
/// the environment restores it before returning, made explicit.
///
/// * [`Guard::begin`] takes the snapshot (nothing on unsupported targets).
/// * [`Guard::restore`] re-installs it; it is idempotent and may be called any
///   number of times. Dropping the guard restores once more, so on every exit
///   from the guard's scope, including a panic unwinding through it, the
///   control state equals the snapshot.
/// * Rounding and underflow are restored bit for bit as they were read (on
///   x86_64 FTZ and DAZ separately), and so are the exception masks (which
///   traps are enabled); the sticky exception flags are never touched.
/// * Nested guards are independent snapshots; restore them in reverse order
///   (which scopes do by themselves).
///
/// `Guard` is safe: it only puts back a state this thread already had. If
/// that state was not the default (say, foreign code left flush-to-zero on
/// before the guard began), restoring it re-creates that situation, even
/// after a [`reset_to_default`](crate::reset_to_default) inside the guard's
/// scope: the drop undoes such a repair. Repair with `reset_to_default` once
/// the guard is gone, or begin the guard after the repair. Whoever installed
/// the non-default state stays answerable for it until then (see the safety
/// section of [`set`](crate::set)).
///
/// The control register is per thread, so a guard is neither `Send` nor
/// `Sync`: it restores the thread that created it.
///
/// ```
/// use fucina_fpenv::{Environment, Guard, RoundingMode, UnderflowMode};
///
/// {
///     let _guard = Guard::begin();
///     // SAFETY: no compiler-generated floating-point code runs before the
///     // guard's drop restores the snapshot.
///     unsafe {
///         fucina_fpenv::set(Environment {
///             rounding: RoundingMode::Upward,
///             underflow: UnderflowMode::FlushToZero,
///         })
///     };
///     if fucina_fpenv::SUPPORTED {
///         assert_eq!(fucina_fpenv::rounding_mode(), Some(RoundingMode::Upward));
///     }
/// }
/// assert!(fucina_fpenv::assert_default().is_ok());
/// ```
#[must_use = "a guard restores the environment when dropped; bind it to a variable \
              (`let _guard = ...`, not `let _ = ...`)"]
pub struct Guard {
    saved: Option<<Imp as Backend>::Control>,
    saved_traps: Option<Exceptions>,
    _per_thread: PhantomData<*const ()>,
}

impl Guard {
    /// Snapshots the calling thread's rounding and underflow control and
    /// its exception masks.
    pub fn begin() -> Guard {
        Guard {
            saved: Imp::read_control(),
            saved_traps: Imp::read_traps(),
            _per_thread: PhantomData,
        }
    }

    /// The environment this guard restores; `None` on unsupported targets.
    pub fn saved(&self) -> Option<Environment> {
        self.saved.map(Imp::decode)
    }

    /// The exceptions whose trap this guard re-enables on restore (none in
    /// the default environment); `None` on unsupported targets.
    pub fn saved_traps(&self) -> Option<Exceptions> {
        self.saved_traps
    }

    /// Re-installs the snapshot (rounding, underflow and the exception
    /// masks; not the sticky flags). Idempotent; a no-op on unsupported
    /// targets.
    pub fn restore(&mut self) {
        if let Some(control) = self.saved {
            // SAFETY: `control` was read from this thread's register by
            // `begin` (a guard cannot leave its thread: it is !Send), so this
            // only returns the thread to a state it was already in; it adds
            // no change of its own for compiler-generated code to run under.
            unsafe { Imp::write_control(control) }
        }
        if let Some(traps) = self.saved_traps {
            // SAFETY: as above: these masks were read from this thread's
            // register by `begin`; restoring them re-creates a state the
            // thread already had.
            unsafe { Imp::write_traps(traps) }
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.restore();
    }
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("saved", &self.saved())
            .field("saved_traps", &self.saved_traps)
            .finish()
    }
}
