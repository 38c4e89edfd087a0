//! The conversion from the facade's [`Error`] back to the autograd layer's, so
//! that user code running inside the autograd layer (the closures of
//! [`custom_vjp`](crate::custom_vjp), whose results are
//! [`AutogradError`]s) can apply `?` to a layer's or optimizer's result.

use fucina_autograd::{AutogradError, ExternalError};

use crate::error::Error;

/// The errors of the autograd and exec layers come back as themselves; every
/// other facade error travels whole inside [`AutogradError::External`] (same
/// message, same source chain), and converting that back to [`Error`] gives
/// [`Error::Autograd`] with the same message.
impl From<Error> for AutogradError {
    fn from(e: Error) -> AutogradError {
        match e {
            Error::Autograd(e) => *e,
            Error::Exec(e) => AutogradError::Exec(e),
            e => AutogradError::External(ExternalError::new(e)),
        }
    }
}
