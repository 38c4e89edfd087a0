//! The crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong loading or running a model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LlmError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file's content is malformed (bad JSON, a truncated header...).
    #[error("{path}: {reason}")]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A tensor stored in a weight file is unusable: an unsupported dtype, data
    /// offsets that disagree with its shape or run past the end of the file, a
    /// tensor an index lists but its shard lacks.
    #[error("{path}: tensor {name}: {reason}")]
    BadTensorInFile {
        /// The file (the shard or the index that names the tensor).
        path: PathBuf,
        /// The tensor's name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// A tensor is missing, has the wrong shape or an unsupported dtype.
    #[error("tensor {name}: {reason}")]
    BadTensor {
        /// The tensor's name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// A request is invalid (an empty prompt, a token id past the vocabulary, a
    /// sequence longer than the cache...).
    #[error("{op}: {reason}")]
    InvalidRequest {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A runtime error from the execution layer (boxed: it carries shapes
    /// inline, and `LlmError` stays small enough that `Result<T, LlmError>`
    /// is cheap to return).
    #[error(transparent)]
    Exec(Box<fucina::ExecError>),
}

impl From<fucina::ExecError> for LlmError {
    fn from(e: fucina::ExecError) -> LlmError {
        LlmError::Exec(Box::new(e))
    }
}

impl From<fucina::exec::UnknownFormatName> for LlmError {
    /// An unknown `--dtype` name ([`LoadDtype`](crate::LoadDtype)'s parse).
    fn from(e: fucina::exec::UnknownFormatName) -> LlmError {
        LlmError::InvalidRequest {
            op: "LoadDtype::from_str",
            reason: e.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    // Small enough that clippy's `result_large_err` (128 bytes) stays quiet in
    // the code of users returning `Result<_, LlmError>`.
    #[cfg(target_pointer_width = "64")]
    const _: () = assert!(std::mem::size_of::<super::LlmError>() <= 72);
}
