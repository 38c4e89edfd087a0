//! The crate's error type.

/// Errors of `fucina-thread`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ThreadError {
    /// The operating system refused to start a thread.
    #[error("failed to spawn {what}: {source}")]
    Spawn {
        /// Which thread could not be started (e.g. "team worker 3").
        what: String,
        /// The error from `std::thread::Builder::spawn`.
        #[source]
        source: std::io::Error,
    },
    /// More workers were requested than the crate's ceiling allows.
    #[error("a team of {requested} workers was requested; the ceiling is {max} workers")]
    TooManyWorkers {
        /// The requested worker count.
        requested: usize,
        /// The ceiling ([`crate::MAX_THREADS`] - 1).
        max: usize,
    },
}
