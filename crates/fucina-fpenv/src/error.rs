//! The crate's single error type.

use crate::Environment;

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
}
