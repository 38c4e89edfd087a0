//! The crate's single error type.

use crate::{Environment, Exceptions};

/// Errors reported by `fucina-fpenv`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FpEnvError {
    /// [`assert_default`](crate::assert_default) found the calling thread's
    /// environment changed from [`DEFAULT_ENVIRONMENT`](crate::DEFAULT_ENVIRONMENT).
    #[error(
        "non-default floating-point environment on this thread: found {found}, \
         expected {expected}",
        expected = crate::DEFAULT_ENVIRONMENT
    )]
    NonDefaultFloatEnvironment {
        /// The environment that was found instead of the default.
        found: Environment,
    },
    /// [`assert_default`](crate::assert_default) found exception traps
    /// enabled (x86_64: a cleared MXCSR mask bit; aarch64: a set FPCR
    /// trap-enable bit) on the calling thread. The default environment masks
    /// every exception; with a trap enabled, the next floating-point
    /// operation that raises that exception delivers SIGFPE. Reported before
    /// a non-default rounding or underflow mode, which `found` still shows.
    #[error(
        "floating-point exception traps enabled on this thread: {traps} \
         (expected every exception masked, or the next operation that raises \
         one delivers SIGFPE); rounding and underflow found: {found}"
    )]
    ExceptionTrapsEnabled {
        /// The exceptions whose trap is enabled.
        traps: Exceptions,
        /// The rounding and underflow mode found alongside.
        found: Environment,
    },
}
