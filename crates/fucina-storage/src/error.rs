//! The crate's one error type.

/// Everything that can go wrong in `fucina-storage`.
///
/// Every variant names the size or length that was refused. Bad sizes are errors,
/// never panics: a request whose byte size overflows, a request the system allocator
/// refuses and a zero-length pool request all come back as `Err`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// The request plus the alignment overhead does not fit in `usize`/`isize`
    /// (no allocator was asked).
    #[error("allocation of {bytes} bytes is too large: size plus alignment overhead overflows")]
    TooLarge {
        /// The requested size in bytes.
        bytes: usize,
    },
    /// The system allocator returned null for this request.
    #[error("the system allocator refused {bytes} bytes")]
    AllocationFailed {
        /// The requested size in bytes.
        bytes: usize,
    },
    /// `len * element_size` (or its rounding to the pool's size class) overflows `usize`.
    #[error("byte size of {len} elements of {element_size} bytes overflows usize")]
    SizeOverflow {
        /// The requested length in elements.
        len: usize,
        /// The size of one element in bytes.
        element_size: usize,
    },
    /// A pool request asked for zero elements.
    #[error("zero-length request: pool acquires need len >= 1")]
    ZeroLength,
}
