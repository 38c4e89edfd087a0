//! The facade's one error type.

use fucina_autograd::AutogradError;
use fucina_exec::ExecError;
use fucina_fpenv::FpEnvError;
use fucina_storage::StorageError;
use fucina_thread::ThreadError;

/// Everything a `fucina` operation can refuse: the errors of the layers below,
/// wrapped (`?` converts them), and the facade's own (layers, optimizers, data).
///
/// The wrapped variants are transparent: their message is the lower layer's, which
/// names the operation and the offending value. The autograd and exec errors are
/// boxed (the exec one carries inline shapes and is large): this keeps
/// `fucina::Result<T>` small (72 bytes on 64-bit targets), so a function
/// returning it stays cheap on the success path and free of clippy's
/// `result_large_err`. Match them with `Error::Exec(e)` and `*e` or
/// [`Error::as_exec`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An error of the autograd layer (it wraps the exec layer's errors of ops).
    #[error(transparent)]
    Autograd(Box<AutogradError>),
    /// An error of the exec layer.
    #[error(transparent)]
    Exec(Box<ExecError>),
    /// An error of the storage layer (an allocation that failed).
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// An error of the thread layer (a worker that could not start).
    #[error(transparent)]
    Thread(#[from] ThreadError),
    /// An error of the floating-point environment checks.
    #[error(transparent)]
    FpEnv(#[from] FpEnvError),
    /// An I/O error (reading a data set, writing a report).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A checkpoint could not be saved or loaded (I/O, a corrupt file, or a
    /// file that does not match the model); nothing was changed.
    #[error(transparent)]
    Checkpoint(Box<crate::checkpoint::CheckpointError>),
    /// A layer received an input whose shape does not fit it (for example a
    /// `Linear(in = 64)` given rows of 32 features).
    #[error("{layer}: input of shape {got:?} does not fit: {reason}")]
    ShapeMismatch {
        /// The layer (and its configuration).
        layer: String,
        /// The shape of the input that was given.
        got: Vec<usize>,
        /// What was expected.
        reason: String,
    },
    /// A constructor or configuration value is out of its range (a zero size, a
    /// negative learning rate, a dropout probability outside `[0, 1)`, ...).
    #[error("{what}: {reason}")]
    InvalidArgument {
        /// The function or configuration field.
        what: &'static str,
        /// What is wrong with the value.
        reason: String,
    },
    /// `load_state_dict` was given a state that does not fit the optimizer or
    /// model (a missing or unknown entry, a wrong shape or value); nothing was
    /// changed.
    #[error("load_state_dict: {reason}")]
    StateDict {
        /// What did not fit.
        reason: String,
    },
    /// A data set file could not be parsed.
    #[error("data set {path}: {reason}")]
    Data {
        /// The file.
        path: String,
        /// What is wrong with it (line and field where known).
        reason: String,
    },
}

impl From<AutogradError> for Error {
    fn from(e: AutogradError) -> Error {
        Error::Autograd(Box::new(e))
    }
}

impl From<ExecError> for Error {
    fn from(e: ExecError) -> Error {
        Error::Exec(Box::new(e))
    }
}

impl From<crate::checkpoint::CheckpointError> for Error {
    fn from(e: crate::checkpoint::CheckpointError) -> Error {
        Error::Checkpoint(Box::new(e))
    }
}

impl Error {
    /// The exec-layer error inside, if this is one (directly, or wrapped by the
    /// autograd layer).
    pub fn as_exec(&self) -> Option<&ExecError> {
        match self {
            Error::Exec(e) => Some(e),
            Error::Autograd(e) => e.as_exec(),
            _ => None,
        }
    }

    /// An [`Error::InvalidArgument`].
    pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> Error {
        Error::InvalidArgument {
            what,
            reason: reason.into(),
        }
    }

    /// An [`Error::StateDict`].
    pub(crate) fn state(reason: impl Into<String>) -> Error {
        Error::StateDict {
            reason: reason.into(),
        }
    }
}

/// The result type of the facade.
pub type Result<T, E = Error> = std::result::Result<T, E>;
