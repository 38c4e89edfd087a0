//! The per-architecture interface and its selection.
//!
//! One file per architecture implements [`Backend`]; `cfg_if!` with `#[path]`
//! picks exactly one of them as `imp` (the shape of `parking_lot_core`'s
//! `thread_parker/mod.rs`). `generic.rs` is the fallback that answers
//! "cannot observe" for every query and ignores every write.

use core::fmt::Debug;

use crate::{Environment, Exceptions};

/// What an architecture must provide. Every function acts on the calling
/// thread's control/status register(s) only, and every write is a
/// read-modify-write that preserves the bits it does not own.
pub(crate) trait Backend {
    /// Whether this target exposes the environment at all.
    const SUPPORTED: bool;

    /// The raw control bits that decide rounding and underflow, exactly as
    /// the hardware reported them (so a [`Guard`](crate::Guard) restores the
    /// register bit for bit, e.g. FTZ without DAZ on x86_64).
    type Control: Copy + Eq + Debug;

    /// Reads the control bits; `None` where the target cannot observe them.
    fn read_control() -> Option<Self::Control>;

    /// Writes control bits previously returned by [`Backend::read_control`] on
    /// this thread or by [`Backend::encode`], leaving every other bit of the
    /// register as it is.
    ///
    /// # Safety
    ///
    /// The contract of [`crate::set`]: if the value is not the default
    /// environment, the caller must not let compiler-generated floating-point
    /// code run on this thread until the default is back.
    unsafe fn write_control(control: Self::Control);

    /// Decodes control bits into the portable description.
    fn decode(control: Self::Control) -> Environment;

    /// The control bits that install `env` on this CPU; `None` where the
    /// target cannot observe the environment.
    fn encode(env: Environment) -> Option<Self::Control>;

    /// Installs `env` (rounding and underflow only): [`Backend::encode`] then
    /// [`Backend::write_control`]. A no-op where unsupported.
    ///
    /// # Safety
    ///
    /// The contract of [`crate::set`].
    unsafe fn set(env: Environment) {
        if let Some(control) = Self::encode(env) {
            // SAFETY: the contract of `crate::set` is forwarded to our caller;
            // `encode` only produces bits this CPU accepts.
            unsafe { Self::write_control(control) }
        }
    }

    /// Reads the six sticky exception flags (all false where unsupported).
    fn read_exceptions() -> Exceptions;

    /// Replaces the six sticky exception flags with exactly `flags`, leaving
    /// every control bit as it is. A no-op where unsupported.
    fn write_exceptions(flags: Exceptions);

    /// The exceptions whose trap is enabled (x86_64: mask bit clear;
    /// aarch64: trap-enable bit set); `None` where unsupported. The default
    /// environment has none.
    fn read_traps() -> Option<Exceptions>;

    /// Enables the traps of exactly `traps` and masks every other exception,
    /// leaving every other bit of the register as it is. A no-op where
    /// unsupported.
    ///
    /// # Safety
    ///
    /// The compiler assumes every exception is masked: it may evaluate a
    /// floating-point operation the source does not (speculated, hoisted or
    /// duplicated), and with a trap enabled that delivers a signal the
    /// program never asked for. If `traps` is not [`Exceptions::NONE`], the
    /// caller upholds the contract of [`crate::set`] (no compiler-generated
    /// floating-point code runs on this thread until every exception is
    /// masked again), unless it only re-installs a state this thread already
    /// had (a guard's snapshot).
    unsafe fn write_traps(traps: Exceptions);
}

cfg_if::cfg_if! {
    if #[cfg(target_arch = "x86_64")] {
        #[path = "x86_64.rs"]
        mod imp;
    } else if #[cfg(target_arch = "aarch64")] {
        #[path = "aarch64.rs"]
        mod imp;
    } else {
        #[path = "generic.rs"]
        mod imp;
    }
}

/// The backend selected for this target.
pub(crate) type Imp = imp::Imp;
