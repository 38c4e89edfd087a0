//! # fucina-fpenv: the IEEE floating-point environment, observable and scoped
//!
//! Every numeric contract of fucina (the RNG's seed-to-values mapping,
//! scalar-vs-native parity, thread-count-invariant kernels) is stated under
//! the **default IEEE environment**: round to nearest-even, gradual
//! underflow, no trapping. Nothing in the language checks it. The rounding
//! mode and the flush-to-zero bits live in a per-thread control register
//! (MXCSR on x86_64, FPCR on aarch64) shared with everything else on the
//! thread, including a linked BLAS or a GPU driver. Foreign code that turns
//! flush-to-zero on and does not turn it off changes the results of every
//! later operation on that thread, silently: they stay plausible and stop
//! matching the references.
//!
//! The same register holds the exception masks: foreign code that unmasks an
//! exception (enables its trap) makes the next operation that raises it kill
//! the process with SIGFPE.
//!
//! This crate makes that state **observable** ([`get`], [`rounding_mode`],
//! [`underflow_mode`], [`enabled_traps`], [`assert_default`]), **scoped** ([`Guard`]),
//! **repairable** ([`reset_to_default`]) and lets you **measure** which IEEE
//! exceptions a region raised ([`Probe`], [`test_exceptions`]). It is
//! inquiry-first, in the sense of Fortran's `ieee_arithmetic`: [`SUPPORTED`]
//! says whether the target exposes the registers, the getters return `None`
//! where it does not, and the setters are no-ops there, so calling code never
//! branches on the architecture. It never returns a wrong answer in place of
//! "cannot observe". Nothing here is on a hot path.
//!
//! ```
//! use std::hint::black_box;
//! use fucina_fpenv::{Environment, Guard, Probe, RoundingMode, UnderflowMode};
//!
//! # fn main() -> Result<(), fucina_fpenv::FpEnvError> {
//! // The contract every pinned numeric result assumes (Ok where unsupported).
//! fucina_fpenv::assert_default()?;
//!
//! // A scoped change: the guard puts the environment back, even on panic.
//! {
//!     let _guard = Guard::begin();
//!     // SAFETY: no compiler-generated floating-point code runs on this
//!     // thread before the guard restores the default.
//!     unsafe {
//!         fucina_fpenv::set(Environment {
//!             rounding: RoundingMode::TowardZero,
//!             underflow: UnderflowMode::Gradual,
//!         })
//!     };
//!     if fucina_fpenv::SUPPORTED {
//!         assert_eq!(fucina_fpenv::rounding_mode(), Some(RoundingMode::TowardZero));
//!     }
//! }
//! fucina_fpenv::assert_default()?;
//!
//! // Which exceptions did this region raise?
//! let probe = Probe::begin();
//! let huge = black_box(3.0e38_f32);
//! black_box(huge * huge);
//! let raised = probe.end();
//! if fucina_fpenv::SUPPORTED {
//!     assert!(raised.overflow);
//!     assert_eq!(raised.to_string(), "overflow|inexact");
//! }
//! fucina_fpenv::clear_exceptions();
//! # Ok(())
//! # }
//! ```
//!
//! ## Soundness: why [`set`] is `unsafe`
//!
//! LLVM, and so rustc, compiles floating-point code assuming the default
//! environment (see the float-semantics RFC 3514): it constant-folds with
//! nearest-even, and it may move, duplicate or fold operations freely. Rust
//! code that runs while the rounding or flush mode is changed can therefore
//! compute results that match neither mode; that is undefined behaviour. The
//! only sound way to *compute* under another mode is to change it, do the
//! arithmetic and restore it inside a single `asm!` block (or to use
//! per-instruction rounding such as AVX-512's embedded rounding).
//!
//! Hence:
//!
//! * [`set`] is an `unsafe fn`. Its contract: until the default environment is
//!   back on this thread, no compiler-generated floating-point code whose
//!   result matters runs on it. Its legitimate uses are preparing the state for
//!   foreign code called immediately afterwards (and restored right after), or
//!   restoring a state in a [`Guard`]-like pattern of your own.
//! * [`reset_to_default`] is safe: it only moves the thread to the state the
//!   compiler assumes. Use it to repair what foreign code left behind.
//! * [`Guard`] is safe: it only puts back a state the thread already had. A
//!   non-default snapshot can only be taken while some unsafe code (a
//!   [`set`] call, or foreign code that left the state behind) answers for
//!   that state, and [`set`]'s contract extends that obligation over the
//!   guard's restore and drop; so a guard never creates a non-default state
//!   that no unsafe code answers for.
//! * Everything that only reads ([`get`], [`rounding_mode`],
//!   [`underflow_mode`], [`enabled_traps`], [`assert_default`]) or only touches the sticky
//!   exception flags ([`test_exceptions`], [`clear_exceptions`],
//!   [`raise_exceptions`], [`Probe`]) is safe: the compiler does not model the
//!   flags at all.
//!
//! ## Exception flags are diagnostic
//!
//! Because the compiler does not model the status register, the flags read
//! after ordinary Rust code are a *diagnostic*, never a correctness signal: an
//! operation may have been folded at compile time (no flag), or moved across
//! the read. [`std::hint::black_box`] on inputs and outputs makes the
//! operations of a region execute inside it in practice, as in the example
//! above. Exact accounting needs the arithmetic and the flag reads in one
//! `asm!` block.
//!
//! ## Threads
//!
//! The environment is per thread. On Linux (x86_64, glibc; observed by this
//! crate's `tests/threads.rs`) a thread created with [`std::thread::spawn`]
//! **inherits** its creator's control register at the moment of creation,
//! rounding, flush-to-zero *and* sticky flags alike (C11 `<fenv.h>` requires
//! the same of `thrd_create`). A worker therefore starts with whatever
//! environment the thread that spawned it had, possibly one a foreign library
//! left behind. Never let a worker's numerics depend on that: a team worker
//! should call [`assert_default`] when it starts (and report, or call
//! [`reset_to_default`]).
//!
//! ## Targets
//!
//! | target | control | traps | flags | [`SUPPORTED`] |
//! |---|---|---|---|---|
//! | x86_64 | MXCSR RC (bits 13-14), FTZ (15) + DAZ (6) | MXCSR masks IM DM ZM OM UM PM (bits 7-12, clear = trap) | MXCSR IE DE ZE OE UE PE (bits 0-5) | `true` |
//! | aarch64 (LE and BE) | FPCR RMode (bits 22-23), FZ (24) + FZ16 (19), FIZ (0, FEAT_AFP) | FPCR IOE DZE OFE UFE IXE IDE (bits 8-12, 15, set = trap) | FPSR IOC DZC OFC UFC IXC IDC | `true` |
//! | anything else (incl. 32-bit x86) | - | - | - | `false`: getters `None`, flags all false, writes no-ops |
//!
//! On x86_64, flush-to-zero means FTZ and DAZ together: reading reports
//! [`UnderflowMode::FlushToZero`] when either is set, setting it sets both,
//! setting [`UnderflowMode::Gradual`] clears both. On aarch64 reading reports
//! it when FZ or FEAT_AFP's FIZ is set, setting it sets FZ (and FZ16 with
//! FEAT_FP16), gradual clears all three. [`set`] never touches the
//! exception masks; [`reset_to_default`] masks every exception and a
//! [`Guard`] restores the masks it saw. The x87 control word is never
//! touched; every write is a read-modify-write of the bits it owns.
//!
//! See `docs/FPENV.md` in the repository for a guide.

// The only `unsafe` is the register access in the per-architecture files and
// the `unsafe fn set` contract; every block carries a SAFETY comment.

mod backend;
mod environment;
mod error;
mod exceptions;
mod guard;
mod probe;

use backend::{Backend, Imp};

pub use environment::{DEFAULT_ENVIRONMENT, Environment, RoundingMode, UnderflowMode};
pub use error::FpEnvError;
pub use exceptions::Exceptions;
pub use guard::Guard;
pub use probe::Probe;

/// Whether this target exposes the floating-point environment: `true` on
/// x86_64 and aarch64, `false` elsewhere (where every getter returns `None`
/// and every setter is a no-op).
pub const SUPPORTED: bool = <Imp as Backend>::SUPPORTED;

/// The calling thread's rounding and underflow mode; `None` where the target
/// cannot observe it.
pub fn get() -> Option<Environment> {
    Imp::read_control().map(Imp::decode)
}

/// Installs `env` (rounding and underflow) on the calling thread. Every other
/// bit of the control register (exception masks, the sticky flags) is left
/// as it is. A no-op on unsupported targets.
///
/// On x86_64, [`UnderflowMode::FlushToZero`] sets FTZ and DAZ (DAZ only where
/// the CPU implements it); on aarch64 it sets FZ and, with FEAT_FP16, FZ16.
///
/// # Safety
///
/// The compiler assumes the default environment (see the crate docs). If
/// `env` is not [`DEFAULT_ENVIRONMENT`], then until the default is back on
/// this thread (through [`reset_to_default`], a [`Guard`] that began in the
/// default, or `set(DEFAULT_ENVIRONMENT)`), no compiler-generated
/// floating-point operation whose result matters may run on this thread:
/// not in your code, not in the standard library, not in a panic handler.
/// Computing under a changed mode is done inside `asm!` or in foreign code
/// that expects it. Setting [`DEFAULT_ENVIRONMENT`] itself is always sound
/// (prefer the safe [`reset_to_default`]).
///
/// The obligation follows the state into guards: a [`Guard`] begun while a
/// non-default environment is installed snapshots it, and its
/// [`restore`](Guard::restore) or drop installs it again, even if the default
/// was put back in between. Until every such guard is gone and the default
/// is back after it, the obligation above still holds (restoring nested
/// guards in reverse order, as scopes do, keeps that span short).
pub unsafe fn set(env: Environment) {
    // SAFETY: the contract is forwarded to our caller.
    unsafe { Imp::set(env) }
}

/// Installs [`DEFAULT_ENVIRONMENT`] on the calling thread and masks every
/// exception (disables every trap); the sticky flags are left as they are.
/// A no-op on unsupported targets.
///
/// Safe, unlike [`set`]: it only moves the thread to the state the compiler
/// assumes. This is the repair for an environment foreign code left behind.
pub fn reset_to_default() {
    // SAFETY: the default rounding and underflow mode with every exception
    // masked is exactly the state compiler-generated floating-point code
    // assumes, so no obligation remains for the caller.
    unsafe {
        Imp::set(DEFAULT_ENVIRONMENT);
        Imp::write_traps(Exceptions::NONE);
    }
}

/// The calling thread's rounding mode; `None` where unsupported.
pub fn rounding_mode() -> Option<RoundingMode> {
    get().map(|env| env.rounding)
}

/// The calling thread's underflow mode; `None` where unsupported.
pub fn underflow_mode() -> Option<UnderflowMode> {
    get().map(|env| env.underflow)
}

/// Checks that the calling thread runs under [`DEFAULT_ENVIRONMENT`] with
/// every exception masked (no trap enabled).
///
/// Succeeds on unsupported targets (nothing can be observed there).
///
/// # Errors
///
/// * [`FpEnvError::ExceptionTrapsEnabled`], carrying the enabled traps and
///   the rounding and underflow mode, if any exception is unmasked (checked
///   first: the next operation that raises it kills the process).
/// * [`FpEnvError::NonDefaultFloatEnvironment`], carrying the environment
///   that was found, if the rounding or the underflow mode is not the
///   default.
///
/// ```
/// fucina_fpenv::assert_default()?;
/// # Ok::<(), fucina_fpenv::FpEnvError>(())
/// ```
pub fn assert_default() -> Result<(), FpEnvError> {
    let Some(found) = get() else {
        return Ok(());
    };
    match enabled_traps() {
        Some(traps) if traps != Exceptions::NONE => {
            Err(FpEnvError::ExceptionTrapsEnabled { traps, found })
        }
        _ if !found.is_default() => Err(FpEnvError::NonDefaultFloatEnvironment { found }),
        _ => Ok(()),
    }
}

/// The exceptions whose trap is enabled on the calling thread (x86_64: the
/// MXCSR mask bit is clear; aarch64: the FPCR trap-enable bit is set);
/// `Some(Exceptions::NONE)` in the default environment, `None` where the
/// target cannot observe it.
///
/// This crate never enables a trap; foreign code can. With one enabled, the
/// next floating-point operation that raises that exception delivers
/// SIGFPE. [`reset_to_default`] masks every exception again.
pub fn enabled_traps() -> Option<Exceptions> {
    Imp::read_traps()
}

/// The calling thread's accrued (sticky) exception flags; all false where
/// unsupported. A diagnostic, see the crate docs.
pub fn test_exceptions() -> Exceptions {
    Imp::read_exceptions()
}

/// Clears the six exception flags of the calling thread (nothing else).
/// A no-op where unsupported.
pub fn clear_exceptions() {
    Imp::write_exceptions(Exceptions::NONE);
}

/// **Replaces** the six exception flags of the calling thread with exactly
/// `flags` (flags not in `flags` are cleared). Control bits and exception
/// masks are left as they are; setting a flag never traps. A no-op where
/// unsupported.
///
/// To add flags to the accrued ones, pass
/// `test_exceptions().union_with(extra)`.
pub fn raise_exceptions(flags: Exceptions) {
    Imp::write_exceptions(flags);
}
