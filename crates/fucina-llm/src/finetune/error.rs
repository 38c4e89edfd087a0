//! The error of a fine-tuning job.

use std::path::PathBuf;

use crate::error::LlmError;

/// What can go wrong while loading, training or saving.
#[derive(Debug, thiserror::Error)]
pub enum FinetuneError {
    /// Loading the model (files, config, weights, tokenizer).
    #[error(transparent)]
    Llm(#[from] LlmError),
    /// An op, an optimizer or a checkpoint of the runtime.
    #[error(transparent)]
    Fucina(Box<fucina::Error>),
    /// A record of a data file is malformed.
    #[error("{path}:{line}: {reason}")]
    Data {
        /// The file.
        path: PathBuf,
        /// The line (from 1).
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// An argument or a configuration is invalid.
    #[error("{op}: {reason}")]
    Invalid {
        /// The function refusing it.
        op: &'static str,
        /// What is wrong.
        reason: String,
    },
}

impl From<fucina::Error> for FinetuneError {
    fn from(e: fucina::Error) -> FinetuneError {
        FinetuneError::Fucina(Box::new(e))
    }
}

impl From<fucina::AutogradError> for FinetuneError {
    fn from(e: fucina::AutogradError) -> FinetuneError {
        FinetuneError::Fucina(Box::new(e.into()))
    }
}

impl From<fucina::ExecError> for FinetuneError {
    fn from(e: fucina::ExecError) -> FinetuneError {
        FinetuneError::Fucina(Box::new(e.into()))
    }
}

impl From<fucina::checkpoint::CheckpointError> for FinetuneError {
    fn from(e: fucina::checkpoint::CheckpointError) -> FinetuneError {
        FinetuneError::Fucina(Box::new(e.into()))
    }
}

/// An [`FinetuneError::Invalid`] of `op`.
pub(crate) fn invalid(op: &'static str, reason: impl Into<String>) -> FinetuneError {
    FinetuneError::Invalid {
        op,
        reason: reason.into(),
    }
}
